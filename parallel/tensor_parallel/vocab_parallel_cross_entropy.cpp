// Vocab-parallel cross-entropy. Each rank holds the columns [start, start + V_local) of every row
// of the logits; with m the global row max, S the global sum of exp(x - m) over the class columns
// and x_t the target's logit, the row loss is m + log S - x_t. Three allreduces of [N] give m, S
// and x_t; each rank adds its local terms, so no rank ever sees another's columns.
//
// The numerics follow core's cross_entropy (core/ops/loss.cpp) so that a tensor-parallel run
// matches the single-process one (DESIGN.md, the equivalence principle): the row loss is formed in
// double, and the backward recomputes the softmax as exp(x - lse) in f32 from one f32 log-sum-exp
// per row saved by the forward, as core's does. The only difference is the order in which the
// exponentials are summed (here in double per rank, then across ranks in f32).
//
// Ranks must agree on V_local, vocab, ignore_index and the targets: a disagreement would give
// each rank a different, silently wrong loss. The first allreduce (a max) carries, after the N
// row maxima, v and -v for each of these (the targets as a fingerprint), so every rank learns
// max and min of each at no extra collective and all raise the same error.
#include "parallel/tensor_parallel/vocab_parallel_cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/autograd.h"
#include "core/dispatch.h"
#include "core/ops/checks.h"
#include "core/ops/low_precision.h"

namespace loom::parallel {

namespace {

constexpr const char* kOp = "vocab_parallel_cross_entropy";

// Values that every rank of the group must share, exchanged as exact f32 integers: reduced modulo
// a prime below 2^24 (f32 holds every integer up to 2^24 exactly).
constexpr int64_t kPrime = 16777213;  // 2^24 - 3
static_assert(kPrime < (int64_t(1) << 24), "agreement values must be exact in f32");

int64_t mod_prime(int64_t v) { return ((v % kPrime) + kPrime) % kPrime; }

enum AgreedField : int64_t { kLocalColumns, kVocab, kIgnoreIndex, kTargets, kAgreedFields };
const char* const kAgreedNames[kAgreedFields] = {"numbers of logits columns (V_local)",
                                                 "vocab sizes", "ignore_index values", "targets"};

// Everything a rank needs to know about the layout of its columns.
struct Layout {
  int64_t rows = 0;
  int64_t cols = 0;           // V_local
  int64_t start = 0;          // first full-vocabulary column held here
  int64_t local_classes = 0;  // columns [0, local_classes) here are classes; the rest padding
  int64_t ignore_index = -100;
};

template <typename I>
int64_t check_targets(const I* targets, int64_t rows, int64_t vocab, int64_t ignore_index) {
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = int64_t(targets[r]);
    if (t == ignore_index) continue;
    LOOM_CHECK(t >= 0 && t < vocab, kOp, ": target ", t, " at row ", r, " is outside [0, ", vocab,
               ") (the vocabulary, without its padding) and is not ignore_index (", ignore_index,
               ")");
    ++count;
  }
  return count;
}

// A polynomial hash of the targets modulo kPrime: equal on every rank that has the same targets.
template <typename I>
int64_t targets_fingerprint(const I* targets, int64_t rows) {
  int64_t h = mod_prime(rows);
  for (int64_t r = 0; r < rows; ++r) h = (h * 1000003 + mod_prime(int64_t(targets[r]))) % kPrime;
  return h;
}

// Row maxima over this rank's class columns (-inf for ignored rows and where there are none).
template <typename I>
void local_row_max(const float* x, const I* targets, const Layout& l, float* row_max) {
#pragma omp parallel for schedule(static) if (l.rows * l.cols > (1 << 15))
  for (int64_t r = 0; r < l.rows; ++r) {
    float m = -std::numeric_limits<float>::infinity();
    if (int64_t(targets[r]) != l.ignore_index) {
      const float* row = x + r * l.cols;
      for (int64_t c = 0; c < l.local_classes; ++c) m = std::max(m, row[c]);
    }
    row_max[r] = m;
  }
}

// Sum over this rank's class columns of exp(x - global max), accumulated in double.
template <typename I>
void local_sum_exp(const float* x, const I* targets, const float* row_max, const Layout& l,
                   float* sum_exp) {
#pragma omp parallel for schedule(static) if (l.rows * l.cols > (1 << 15))
  for (int64_t r = 0; r < l.rows; ++r) {
    double s = 0.0;
    if (int64_t(targets[r]) != l.ignore_index) {
      const float* row = x + r * l.cols;
      const float m = row_max[r];
      for (int64_t c = 0; c < l.local_classes; ++c) s += double(std::exp(row[c] - m));
    }
    sum_exp[r] = float(s);
  }
}

// The target's logit where this rank holds it, else 0 (so the sum over ranks is exact).
template <typename I>
void local_target_logit(const float* x, const I* targets, const Layout& l, float* target_logit) {
  for (int64_t r = 0; r < l.rows; ++r) {
    const int64_t t = int64_t(targets[r]) - l.start;
    const bool here = int64_t(targets[r]) != l.ignore_index && t >= 0 && t < l.local_classes;
    target_logit[r] = here ? x[r * l.cols + t] : 0.0f;
  }
}

// d x = (exp(x - lse) - onehot(target)) * scale on the class columns of counted rows, 0 elsewhere.
template <typename I>
void backward_rows(const float* x, const I* targets, const float* lse, float scale, const Layout& l,
                   float* dx) {
#pragma omp parallel for schedule(static) if (l.rows * l.cols > (1 << 15))
  for (int64_t r = 0; r < l.rows; ++r) {
    float* d = dx + r * l.cols;
    const int64_t target = int64_t(targets[r]);
    if (target == l.ignore_index) {
      std::fill(d, d + l.cols, 0.0f);
      continue;
    }
    const float* row = x + r * l.cols;
    for (int64_t c = 0; c < l.local_classes; ++c) d[c] = std::exp(row[c] - lse[r]) * scale;
    std::fill(d + l.local_classes, d + l.cols, 0.0f);
    const int64_t t = target - l.start;
    if (t >= 0 && t < l.local_classes) d[t] -= scale;
  }
}

}  // namespace

Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets,
                                    std::shared_ptr<comm::Communicator> tp, int64_t vocab,
                                    int64_t ignore_index) {
  LOOM_CHECK(tp != nullptr, kOp, ": argument 'tp' is null; pass the tensor-parallel group");
  // bf16/f16 logits: computed on an f32 copy; the loss stays f32 and the logits' gradient comes
  // back in their dtype through the upcast, as for core's cross_entropy. See Note [Low-precision
  // compute].
  const detail::LowPrecision lp(kOp, {{"logits", logits}});
  if (lp) return vocab_parallel_cross_entropy(lp.f32(logits), targets, tp, vocab, ignore_index);
  detail::check_f32(kOp, "logits", logits);
  detail::check_dim(kOp, "logits", logits, 2);
  detail::check_index(kOp, "targets", targets);
  LOOM_CHECK(targets.dim() == 1 && targets.size(0) == logits.size(0), kOp,
             ": argument 'targets' must have shape [", logits.size(0), "] (one per row of logits ",
             shape_str(logits.shape()), "), got ", shape_str(targets.shape()),
             "; flatten [B, T, V_local] logits to [B*T, V_local] first");
  detail::check_same_device(kOp, "logits", logits, "targets", targets);
  LOOM_CHECK(logits.device().is_cpu(), kOp, ": CUDA not implemented yet (CPU only for now); ",
             "logits are on ", logits.device().str());
  const int64_t rows = logits.size(0), cols = logits.size(1), ranks = tp->size();
  LOOM_CHECK(vocab >= 1, kOp, ": vocab must be at least 1, got ", vocab);
  LOOM_CHECK(vocab <= cols * ranks, kOp, ": vocab ", vocab,
             " is larger than the full logits: ", cols, " columns on each of the ", ranks,
             " ranks of group '", tp->name(), "' hold ", cols * ranks,
             "; each rank needs at least ceil(vocab / ", ranks, ") = ", (vocab + ranks - 1) / ranks,
             " columns (pad the vocabulary to a multiple of ", ranks, ")");

  Layout layout;
  layout.rows = rows;
  layout.cols = cols;
  layout.start = int64_t(tp->rank()) * cols;
  layout.local_classes = std::clamp<int64_t>(vocab - layout.start, 0, cols);
  layout.ignore_index = ignore_index;

  Tensor x = logits.detach().contiguous(), tg = targets.detach().contiguous();
  const float* xp = x.data<float>();
  int64_t count = 0, fingerprint = 0;
  visit_index_dtype(tg.dtype(), [&](auto tag) {
    using I = decltype(tag);
    count = check_targets(tg.data<I>(), rows, vocab, ignore_index);
    fingerprint = targets_fingerprint(tg.data<I>(), rows);
  });

  // 1. The global row max, with the values all ranks must agree on behind it.
  Tensor row_max = Tensor::empty({rows + 2 * kAgreedFields}, DType::kF32, x.device());
  float* mp = row_max.data<float>();
  visit_index_dtype(tg.dtype(), [&](auto tag) {
    using I = decltype(tag);
    local_row_max(xp, tg.data<I>(), layout, mp);
  });
  const int64_t shown[kAgreedFields] = {cols, vocab, ignore_index, fingerprint};  // in messages
  const int64_t agreed[kAgreedFields] = {mod_prime(cols), mod_prime(vocab), mod_prime(ignore_index),
                                         fingerprint};
  for (int64_t f = 0; f < kAgreedFields; ++f) {
    mp[rows + 2 * f] = float(agreed[f]);
    mp[rows + 2 * f + 1] = -float(agreed[f]);
  }
  tp->allreduce(row_max, comm::AllreduceOptions{comm::ReduceOp::kMax})->wait();
  for (int64_t f = 0; f < kAgreedFields; ++f)
    LOOM_CHECK(mp[rows + 2 * f] == -mp[rows + 2 * f + 1], kOp, ": the ranks of group '", tp->name(),
               "' pass different ", kAgreedNames[f],
               "; every rank of the tensor-parallel group must call it with the same targets [",
               rows, "], vocab, ignore_index and logits [", rows,
               ", V_local] (this rank: ", f == kTargets ? "targets fingerprint " : "", shown[f],
               ")");

  // 2. The target's logit, summed over ranks (one rank holds it, the others add 0), in flight
  // while the local sums of exponentials are computed.
  Tensor target_logit = Tensor::empty({rows}, DType::kF32, x.device());
  Tensor sum_exp = Tensor::empty({rows}, DType::kF32, x.device());
  visit_index_dtype(tg.dtype(), [&](auto tag) {
    using I = decltype(tag);
    local_target_logit(xp, tg.data<I>(), layout, target_logit.data<float>());
  });
  comm::WorkPtr target_work = tp->allreduce(target_logit);
  // 3. The sum of exp(x - max) over every class column of the row.
  visit_index_dtype(tg.dtype(), [&](auto tag) {
    using I = decltype(tag);
    local_sum_exp(xp, tg.data<I>(), mp, layout, sum_exp.data<float>());
  });
  comm::WorkPtr sum_work = tp->allreduce(sum_exp);
  target_work->wait();
  sum_work->wait();

  // Row losses in double and added in row order, as core does: the loss is the same on every
  // rank, which all hold the same reduced values.
  Tensor lse = Tensor::empty({rows}, DType::kF32, x.device());
  float* lse_p = lse.data<float>();
  const float* sp = sum_exp.data<float>();
  const float* tlp = target_logit.data<float>();
  double total = 0.0;
  visit_index_dtype(tg.dtype(), [&](auto tag) {
    using I = decltype(tag);
    const I* t = tg.data<I>();
    for (int64_t r = 0; r < rows; ++r) {
      if (int64_t(t[r]) == ignore_index) {
        lse_p[r] = 0.0f;
        continue;
      }
      const double l = double(mp[r]) + std::log(double(sp[r]));
      lse_p[r] = float(l);
      total += l - double(tlp[r]);
    }
  });
  // All rows ignored: loss 0 and zero gradients (core's convention, not PyTorch's NaN).
  Tensor out = Tensor::scalar(count > 0 ? total / double(count) : 0.0, DType::kF32, x.device());
  autograd::record(out, kOp, {logits}, [x, tg, lse, layout, count](const Tensor& g) {
    const float scale = count > 0 ? float(g.item() / double(count)) : 0.0f;
    Tensor dx = Tensor::empty(x.shape(), DType::kF32, x.device());
    visit_index_dtype(tg.dtype(), [&](auto tag) {
      using I = decltype(tag);
      backward_rows(x.data<float>(), tg.data<I>(), lse.data<float>(), scale, layout,
                    dx.data<float>());
    });
    return std::vector<Tensor>{dx};
  });
  return out;
}

}  // namespace loom::parallel
