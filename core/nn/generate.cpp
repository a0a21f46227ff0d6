#include "core/nn/generate.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/rng.h"

namespace loom::nn {

int64_t sample_token(const float* logits, int64_t vocab, double temperature, int64_t top_k,
                     double u) {
  if (temperature == 0.0 || top_k == 1) {
    // The first index among equal largest, as torch.argmax.
    return int64_t(std::max_element(logits, logits + vocab) - logits);
  }
  // nanoGPT divides in the logits' precision (f32); the rest runs in double.
  std::vector<float> z(logits, logits + vocab);
  for (float& v : z) v = float(double(v) / temperature);
  float cutoff = -std::numeric_limits<float>::infinity();
  if (top_k > 0 && top_k < vocab) {
    std::vector<float> sorted = z;
    std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(),
                     std::greater<float>());
    cutoff = sorted[size_t(top_k - 1)];  // the k-th largest: smaller values are dropped
  }
  const float largest = *std::max_element(z.begin(), z.end());
  LOOM_CHECK(largest != -std::numeric_limits<float>::infinity(),
             "generate: every logit of a row is -inf: no token can be drawn");
  std::vector<double> weight(z.size(), 0.0);
  double total = 0.0;
  for (size_t i = 0; i < z.size(); ++i) {
    if (z[i] < cutoff) continue;
    weight[i] = std::exp(double(z[i]) - double(largest));
    total += weight[i];
  }
  // Inverse CDF: the first token whose cumulative weight passes u * total. A token of weight 0
  // (below the cut, or exp underflowing) is never chosen.
  const double target = u * total;
  double cumulative = 0.0;
  int64_t last_nonzero = 0;
  for (size_t i = 0; i < weight.size(); ++i) {
    if (weight[i] == 0.0) continue;
    cumulative += weight[i];
    last_nonzero = int64_t(i);
    if (cumulative > target) return int64_t(i);
  }
  return last_nonzero;  // rounding left u * total at the very end
}

namespace {

// Row b's last-position logits, checked: a NaN or +inf would make the draw meaningless.
void check_logits(const std::vector<float>& logits, int64_t rows, int64_t width, int64_t vocab,
                  int64_t step) {
  for (int64_t b = 0; b < rows; ++b) {
    for (int64_t i = 0; i < vocab; ++i) {
      const float v = logits[size_t(b * width + i)];
      LOOM_CHECK(!std::isnan(v) && v != std::numeric_limits<float>::infinity(),
                 "generate: the logits of row ", b, " hold ", v, " at token ", i,
                 " before new token ", step, " (the model's output is not finite)");
    }
  }
}

}  // namespace

Tensor generate(GPT& model, const Tensor& idx, const GenerateOptions& options) {
  const GptConfig& config = model.config();
  LOOM_CHECK(idx.defined() && idx.dim() == 2 && idx.size(0) >= 1 && idx.size(1) >= 1,
             "generate: idx must be token ids [B, T] with B, T >= 1, got ",
             idx.defined() ? shape_str(idx.shape()) : "undefined");
  LOOM_CHECK(idx.dtype() == DType::kI32 || idx.dtype() == DType::kI64,
             "generate: idx must be i32 or i64 token ids, got ", dtype_name(idx.dtype()));
  LOOM_CHECK(options.max_new_tokens >= 0, "generate: max_new_tokens must be >= 0, got ",
             options.max_new_tokens);
  LOOM_CHECK(std::isfinite(options.temperature) && options.temperature >= 0,
             "generate: temperature must be finite and >= 0 (0: the argmax), got ",
             options.temperature);
  LOOM_CHECK(options.top_k >= 0 && options.top_k <= config.vocab, "generate: top_k must be in [0, ",
             config.vocab, "] (0: every token), got ", options.top_k);
  NoGradGuard no_grad;
  const int64_t rows = idx.size(0), prompt = idx.size(1), window = config.max_seq_len;
  const Device device = idx.device();
  // The sequences on the host, row-major with a fixed stride: the prompt, then each new token.
  const int64_t width = prompt + options.max_new_tokens;
  std::vector<int64_t> seq(size_t(rows * width));
  {
    const std::vector<int64_t> p = idx.to(DType::kI64).to_vector<int64_t>();
    for (int64_t b = 0; b < rows; ++b)
      std::copy_n(p.begin() + b * prompt, prompt, seq.begin() + b * width);
  }
  // The last `n` tokens of every row ending at `length`, as [B, n] on the model's device.
  auto window_of = [&](int64_t length, int64_t n) {
    std::vector<int64_t> w(size_t(rows * n));
    for (int64_t b = 0; b < rows; ++b)
      std::copy_n(seq.begin() + b * width + (length - n), n, w.begin() + b * n);
    return Tensor::from_vector(w, {rows, n}, device);
  };

  KvCache cache = model.make_kv_cache();
  int64_t length = prompt;
  Tensor logits = model.forward_cached(window_of(length, std::min(length, window)), cache);
  for (int64_t s = 0; s < options.max_new_tokens; ++s) {
    const int64_t vp = logits.size(2);
    const std::vector<float> last =
        narrow(logits, 1, logits.size(1) - 1, 1).to(DType::kF32).to_vector<float>();  // [B, Vp]
    check_logits(last, rows, vp, config.vocab, s);
    Tensor u = Tensor::empty({rows});
    if (options.temperature > 0 && options.top_k != 1) {
      rng::Slice slice{{(s + 1) * rows}, 0, s * rows};  // elements s*B .. s*B + B - 1
      rng::fill_uniform(u, slice, options.seed, options.stream, 0.0, 1.0);
    } else {
      u.zero_();  // greedy: no draw
    }
    const std::vector<float> draws = u.to_vector<float>();
    for (int64_t b = 0; b < rows; ++b)
      seq[size_t(b * width + length)] =
          sample_token(last.data() + b * vp, config.vocab, options.temperature, options.top_k,
                       double(draws[size_t(b)]));
    ++length;
    if (s + 1 == options.max_new_tokens) break;
    if (cache.length() < window) {
      logits = model.forward_cached(window_of(length, 1), cache);
    } else {  // the window is full: cut, and run the cut window from an empty cache
      cache.reset();
      logits = model.forward_cached(window_of(length, window), cache);
    }
  }
  return Tensor::from_vector(seq, {rows, width}).to(idx.dtype()).to(device);
}

}  // namespace loom::nn
