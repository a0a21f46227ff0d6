// What the data-parallel equivalence tests compare against: a small GPT trained on one process
// over the whole global batch, and the pieces both runs share (the model, the data, the
// comparison). Every rank computes the reference itself, so no rank trusts another's numbers.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "core/nn/gpt.h"
#include "core/ops.h"
#include "optimizer/adamw.h"
#include "optimizer/clip_grad.h"
#include "optimizer/mixed_precision.h"

namespace loom::testing {

inline GptConfig tiny_gpt_config() {
  GptConfig c;
  c.max_seq_len = 8;
  c.vocab = 29;
  c.padded_vocab = 32;
  c.layers = 2;
  c.heads = 2;
  c.channels = 16;
  return c;
}

constexpr int64_t kGlobalBatch = 48;  // divisible by every rank count x grad-accum tested
constexpr int64_t kSeq = 8;
constexpr int kSteps = 5;
constexpr uint64_t kSeed = 1234;

// eps 1e-6 rather than PyTorch's 1e-8: the key third of attn.qkv.bias has a gradient that is
// zero in exact arithmetic (softmax ignores a constant added to every score of a query), so each
// run's gradient there is rounding noise (~1e-10) in a different order; Adam divides it by
// sqrt(v) + eps, and with eps 1e-8 that turns two different noises into updates differing by
// ~1e-5 of the tensor's scale. With eps 1e-6 the noise stays below the comparison's resolution;
// every other parameter compares the same with either eps.
inline optim::AdamWOptions test_adamw() {
  optim::AdamWOptions a;
  a.lr = 1e-3;
  a.weight_decay = 0.1;
  a.eps = 1e-6;
  return a;
}

// Step s's global batch: inputs and next-token targets [kGlobalBatch, kSeq], the same on
// every rank (a fixed-seed LCG over the vocabulary).
struct GlobalBatch {
  Tensor inputs, targets;
  Tensor rows(int64_t first, int64_t count) const {
    return inputs.narrow(0, first, count).contiguous();
  }
  Tensor target_rows(int64_t first, int64_t count) const {
    return targets.narrow(0, first, count).contiguous();
  }
};

inline GlobalBatch global_batch(int step, int64_t vocab) {
  std::vector<int64_t> tokens(size_t(kGlobalBatch * (kSeq + 1)));
  uint64_t state = 0x9E3779B97F4A7C15ull * uint64_t(step + 1);
  for (auto& t : tokens) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    t = int64_t((state >> 33) % uint64_t(vocab));
  }
  std::vector<int64_t> in, out;
  for (int64_t b = 0; b < kGlobalBatch; ++b)
    for (int64_t t = 0; t < kSeq; ++t) {
      in.push_back(tokens[size_t(b * (kSeq + 1) + t)]);
      out.push_back(tokens[size_t(b * (kSeq + 1) + t + 1)]);
    }
  return {Tensor::from_vector(in, {kGlobalBatch, kSeq}),
          Tensor::from_vector(out, {kGlobalBatch, kSeq})};
}

struct RunResult {
  std::vector<double> losses;  // per step, the loss over the whole global batch
  std::vector<std::pair<std::string, std::vector<float>>> params;  // after the last step
};

inline std::vector<std::pair<std::string, std::vector<float>>> parameter_values(
    const nn::Module& m) {
  std::vector<std::pair<std::string, std::vector<float>>> out;
  for (auto& [name, t] : m.named_parameters())
    out.emplace_back(name, t.detach().to(DType::kF32).to_vector<float>());
  return out;
}

inline std::unique_ptr<optim::Optimizer> test_adamw_over(std::vector<Tensor> params) {
  return std::make_unique<optim::AdamW>(std::move(params), test_adamw());
}

// The single-process run: kSteps AdamW steps on the whole global batch, the gradient clipped
// to global norm `clip` when it is positive. bf16 / f16: the model is initialised in f32 and
// rounded, and trains with f32 masters (f16 with dynamic loss scaling).
inline RunResult single_process_run(double clip = 0, DType dtype = DType::kF32) {
  nn::GPT model(tiny_gpt_config());
  model.init_parameters(kSeed);
  std::unique_ptr<optim::Optimizer> opt;
  optim::MixedPrecisionOptimizer* mixed = nullptr;
  if (dtype == DType::kF32) {
    opt = test_adamw_over(model.parameters());
  } else {
    model.to(dtype);
    auto mp = std::make_unique<optim::MixedPrecisionOptimizer>(
        model.parameters(), test_adamw_over,
        dtype == DType::kF16 ? optim::LossScaler() : optim::LossScaler::none());
    mixed = mp.get();
    opt = std::move(mp);
  }
  RunResult r;
  for (int s = 0; s < kSteps; ++s) {
    GlobalBatch b = global_batch(s, model.config().vocab);
    Tensor loss = model.loss(b.inputs, b.targets);
    (mixed ? mixed->scale_loss(loss) : loss).backward();
    if (clip > 0) {
      if (mixed)
        mixed->clip_grad_norm(clip);
      else
        optim::clip_grad_norm(model.parameters(), clip);
    }
    opt->step();
    opt->zero_grad();
    r.losses.push_back(loss.item());
  }
  r.params = parameter_values(model);
  return r;
}

// The data-parallel side of the comparison: kSteps steps in which rank r of the world takes its
// 1/n of the global batch in grad_accum micro-batches. `backward(loss)` runs one micro-batch
// (its loss already scaled by 1 / grad_accum) through the wrapper under test; `end_step()`
// finishes the step (reduction, optimizer). The recorded loss is the ranks' average.
inline RunResult split_batch_run(comm::Communicator& world, nn::GPT& model, int grad_accum,
                                 const std::function<void(const Tensor&)>& backward,
                                 const std::function<void()>& end_step) {
  const int64_t rows = kGlobalBatch / world.size() / grad_accum;
  RunResult result;
  for (int s = 0; s < kSteps; ++s) {
    GlobalBatch b = global_batch(s, model.config().vocab);
    double local = 0;
    for (int k = 0; k < grad_accum; ++k) {
      const int64_t first = (int64_t(world.rank()) * grad_accum + k) * rows;
      Tensor loss = model.loss(b.rows(first, rows), b.target_rows(first, rows));
      local += loss.item() / grad_accum;
      backward(scale(loss, 1.0 / grad_accum));
    }
    end_step();
    Tensor l = Tensor::full({1}, local, DType::kF32);
    world.allreduce(l, comm::AllreduceOptions{comm::ReduceOp::kAvg})->wait();
    result.losses.push_back(l.item());
  }
  result.params = parameter_values(model);
  return result;
}

// Per-step losses within `rel` relative, and every parameter tensor within `rel` of the
// reference in the max norm (|a - b|_inf <= rel * |b|_inf): elementwise relative error is
// meaningless for entries near zero, whose absolute error is set by their tensor's scale.
// Where a tensor's own scale is only a few optimizer steps (a bias that starts at zero), the
// scale of the whole model can be asked for instead: |a - b|_inf <= rel * max over the model.
enum class Scale { kTensor, kModel };
inline void expect_same_run(const RunResult& got, const RunResult& want, double rel,
                            Scale by = Scale::kTensor) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t s = 0; s < want.losses.size(); ++s)
    EXPECT_NEAR(got.losses[s], want.losses[s], rel * std::abs(want.losses[s])) << "step " << s;
  ASSERT_EQ(got.params.size(), want.params.size());
  double model_scale = 0;
  for (const auto& [name, w] : want.params)
    for (float v : w) model_scale = std::max(model_scale, double(std::abs(v)));
  for (size_t i = 0; i < want.params.size(); ++i) {
    const auto& [name, w] = want.params[i];
    const auto& g = got.params[i].second;
    ASSERT_EQ(got.params[i].first, name);
    ASSERT_EQ(g.size(), w.size()) << name;
    double scale = 0, err = 0;
    for (size_t k = 0; k < w.size(); ++k) {
      scale = std::max(scale, double(std::abs(w[k])));
      err = std::max(err, double(std::abs(g[k] - w[k])));
    }
    if (by == Scale::kModel) scale = model_scale;
    EXPECT_LE(err, rel * scale) << name << ": max difference " << err << ", max |value| " << scale;
  }
}

// A model whose second layer only rank 0 uses and whose third layer nobody uses.
class Branchy : public nn::Module {
 public:
  Branchy() {
    a = register_parameter("a", {4}, nn::Init::ones());
    b = register_parameter("b", {4}, nn::Init::ones());
    c = register_parameter("c", {4}, nn::Init::ones());
  }
  Tensor a, b, c;
};

// Rank q's input: x_q[k] = q + k + 1.
inline Tensor branchy_input(int q) {
  return Tensor::from_vector(
      std::vector<float>{float(q + 1), float(q + 2), float(q + 3), float(q + 4)}, {4});
}

}  // namespace loom::testing
