// Vocab-parallel cross-entropy. Each rank holds the columns [start, start + V_local) of every row
// of the logits; with m the global row max, S the global sum of exp(x - m) over the class columns
// and x_t the target's logit, the row loss is m + log S - x_t. Three allreduces of [N] give m, S
// and x_t; each rank adds its local terms, so no rank ever sees another's columns. The loops over
// the logits are the CPU kernels of kernels/cpu/vocab_parallel_cross_entropy.h, which this file
// calls in turn with the allreduces in between.
//
// The numerics follow core's cross_entropy (core/ops/loss.cpp) so that a tensor-parallel run
// matches the single-process one (DESIGN.md, the equivalence principle): the rows' sums of
// exponentials and gradients are computed by the same row helpers as core's kernel, the row loss
// is formed in double, and the backward recomputes the softmax as exp(x - lse) in f32 from one f32
// log-sum-exp per row saved by the forward, as core's does. The only difference is the order in
// which the exponentials are summed: each rank sums exp(x - its own max) and scales the sum to the
// global max, in double, and the ranks' sums are added in f32.
//
// Ranks must agree on V_local, vocab, ignore_index and the targets: a disagreement would give
// each rank a different, silently wrong loss. The first allreduce (a max) carries, after the N
// row maxima, v and -v for each of these (the targets as a fingerprint), so every rank learns
// max and min of each at no extra collective and all raise the same error. On CUDA tensors the
// same stages run as device kernels (vocab_parallel_cross_entropy_cuda below).
#include "parallel/tensor_parallel/vocab_parallel_cross_entropy.h"

#include <algorithm>
#include <vector>

#include "core/autograd.h"
#include "core/cuda_dispatch.h"
#include "core/dispatch.h"
#include "core/ops/checks.h"
#include "core/ops/low_precision.h"
#include "kernels/cpu/vocab_parallel_cross_entropy.h"
#if LOOM_WITH_CUDA
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/vocab_parallel_cross_entropy.h"
#endif

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

template <typename I>
void check_targets(const I* targets, int64_t rows, int64_t vocab, int64_t ignore_index) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = int64_t(targets[r]);
    if (t == ignore_index) continue;
    LOOM_CHECK(t >= 0 && t < vocab, kOp, ": target ", t, " at row ", r, " is outside [0, ", vocab,
               ") (the vocabulary, without its padding) and is not ignore_index (", ignore_index,
               ")");
  }
}

// A polynomial hash of the targets modulo kPrime: equal on every rank that has the same targets.
template <typename I>
int64_t targets_fingerprint(const I* targets, int64_t rows) {
  int64_t h = mod_prime(rows);
  for (int64_t r = 0; r < rows; ++r) h = (h * 1000003 + mod_prime(int64_t(targets[r]))) % kPrime;
  return h;
}

// What every rank must agree on, carried after the row maxima by the first allreduce (a max): v
// and -v per field, so every rank learns max and min of each and all raise the same error.
struct Agreement {
  int64_t cols, vocab, ignore_index, fingerprint;

  void fill(float* tail) const {
    const int64_t agreed[kAgreedFields] = {mod_prime(cols), mod_prime(vocab),
                                           mod_prime(ignore_index), fingerprint};
    for (int64_t f = 0; f < kAgreedFields; ++f) {
      tail[2 * f] = float(agreed[f]);
      tail[2 * f + 1] = -float(agreed[f]);
    }
  }
  void check(const float* tail, const comm::Communicator& tp, int64_t rows) const {
    const int64_t shown[kAgreedFields] = {cols, vocab, ignore_index, fingerprint};  // in messages
    for (int64_t f = 0; f < kAgreedFields; ++f)
      LOOM_CHECK(tail[2 * f] == -tail[2 * f + 1], kOp, ": the ranks of group '", tp.name(),
                 "' pass different ", kAgreedNames[f],
                 "; every rank of the tensor-parallel group must call it with the same targets [",
                 rows, "], vocab, ignore_index and logits [", rows,
                 ", V_local] (this rank: ", f == kTargets ? "targets fingerprint " : "", shown[f],
                 ")");
  }
};

// The CUDA path: the same stages on the device (kernels/cuda/vocab_parallel_cross_entropy.h),
// with the allreduces on device tensors (NCCL when the group has it). The loss, its row count and
// the gradient's scale stay in device slots; the host reads only the targets (range check and
// fingerprint, no device-side check yet) and the agreement fields after the first allreduce.
Tensor vocab_parallel_cross_entropy_cuda(const Tensor& logits, const Tensor& x, const Tensor& tg,
                                         const kernels::cpu::VocabParallelCrossEntropyShape& shape,
                                         comm::Communicator& tp, int64_t vocab) {
#if LOOM_WITH_CUDA
  const Device device = x.device();
  const kernels::cuda::Stream stream = cuda_stream(device);
  const int64_t rows = shape.rows;
  const Tensor host_targets = tg.to(Device::cpu());
  int64_t fingerprint = 0;
  Tensor local_max = Tensor::empty({rows}, DType::kF32, device);
  Tensor local_sum_exp = cuda_workspace(device, size_t(rows) * sizeof(double));
  Tensor target_logit = Tensor::empty({rows}, DType::kF32, device);
  visit_index_dtype(tg.dtype(), [&](auto tag) {
    using I = decltype(tag);
    check_targets(host_targets.data<I>(), rows, vocab, shape.ignore_index);
    fingerprint = targets_fingerprint(host_targets.data<I>(), rows);
    kernels::cuda::vocab_parallel_cross_entropy_local_stats(
        x.data<float>(), tg.data<I>(), local_max.data<float>(),
        static_cast<double*>(local_sum_exp.data_ptr()), shape, stream);
    kernels::cuda::vocab_parallel_cross_entropy_target_logit(
        x.data<float>(), tg.data<I>(), target_logit.data<float>(), shape, stream);
  });

  // 1. The global row max, the agreement fields behind it (filled on the host, copied over).
  const Agreement agreement{shape.cols, vocab, shape.ignore_index, fingerprint};
  Tensor tail = Tensor::empty({2 * kAgreedFields}, DType::kF32);
  agreement.fill(tail.data<float>());
  Tensor row_max = Tensor::empty({rows + 2 * kAgreedFields}, DType::kF32, device);
  row_max.narrow(0, 0, rows).copy_(local_max);
  row_max.narrow(0, rows, 2 * kAgreedFields).copy_(tail);
  tp.allreduce(row_max, comm::AllreduceOptions{comm::ReduceOp::kMax})->wait();
  const Tensor reduced_tail = row_max.narrow(0, rows, 2 * kAgreedFields).to(Device::cpu());
  agreement.check(reduced_tail.data<float>(), tp, rows);

  // 2. and 3. as on the CPU.
  comm::WorkPtr target_work = tp.allreduce(target_logit);
  Tensor sum_exp = Tensor::empty({rows}, DType::kF32, device);
  kernels::cuda::vocab_parallel_cross_entropy_rescale_sum_exp(
      local_max.data<float>(), static_cast<const double*>(local_sum_exp.data_ptr()),
      row_max.data<float>(), sum_exp.data<float>(), rows, stream);
  comm::WorkPtr sum_work = tp.allreduce(sum_exp);
  target_work->wait();
  sum_work->wait();

  Tensor lse = Tensor::empty({rows}, DType::kF32, device);
  Tensor sum = cuda_workspace(device, sizeof(double));
  Tensor count = Tensor::empty({1}, DType::kI64, device);
  visit_index_dtype(tg.dtype(), [&](auto tag) {
    using I = decltype(tag);
    kernels::cuda::vocab_parallel_cross_entropy_loss(
        tg.data<I>(), row_max.data<float>(), sum_exp.data<float>(), target_logit.data<float>(),
        lse.data<float>(), shape, static_cast<double*>(sum.data_ptr()), count.data<int64_t>(),
        stream);
  });
  Tensor out = Tensor::empty(Shape{}, DType::kF32, device);
  kernels::cuda::cross_entropy_mean(static_cast<const double*>(sum.data_ptr()),
                                    count.data<int64_t>(), out.data<float>(), stream);
  autograd::record(
      out, kOp, {logits}, {x, tg, lse, count}, [x, tg, lse, shape, count](const Tensor& g) {
        const Device device = x.device();
        Tensor gc = g.contiguous();
        Tensor scale = Tensor::empty({1}, DType::kF32, device);
        kernels::cuda::cross_entropy_grad_scale(gc.data<float>(), count.data<int64_t>(),
                                                scale.data<float>(), cuda_stream(device));
        Tensor dx = Tensor::empty(x.shape(), DType::kF32, device);
        visit_index_dtype(tg.dtype(), [&](auto tag) {
          using I = decltype(tag);
          kernels::cuda::vocab_parallel_cross_entropy_backward(
              x.data<float>(), tg.data<I>(), lse.data<float>(), scale.data<float>(),
              dx.data<float>(), shape, cuda_stream(device));
        });
        return std::vector<Tensor>{dx};
      });
  return out;
#else
  (void)logits, (void)x, (void)tg, (void)shape, (void)tp, (void)vocab;
  LOOM_FAIL(kOp, ": loom was built without CUDA");
#endif
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
  const int64_t rows = logits.size(0), cols = logits.size(1), ranks = tp->size();
  LOOM_CHECK(vocab >= 1, kOp, ": vocab must be at least 1, got ", vocab);
  LOOM_CHECK(vocab <= cols * ranks, kOp, ": vocab ", vocab,
             " is larger than the full logits: ", cols, " columns on each of the ", ranks,
             " ranks of group '", tp->name(), "' hold ", cols * ranks,
             "; each rank needs at least ceil(vocab / ", ranks, ") = ", (vocab + ranks - 1) / ranks,
             " columns (pad the vocabulary to a multiple of ", ranks, ")");

  kernels::cpu::VocabParallelCrossEntropyShape shape;
  shape.rows = rows;
  shape.cols = cols;
  shape.start = int64_t(tp->rank()) * cols;
  shape.local_classes = std::clamp<int64_t>(vocab - shape.start, 0, cols);
  shape.ignore_index = ignore_index;

  Tensor x = logits.detach().contiguous(), tg = targets.detach().contiguous();
  if (x.device().is_cuda())
    return vocab_parallel_cross_entropy_cuda(logits, x, tg, shape, *tp, vocab);
  const float* xp = x.data<float>();
  int64_t fingerprint = 0;
  // This rank's row maxima and sums of exp(x - them), in one pass over the logits, and the
  // targets' logits where held here.
  std::vector<float> local_max(static_cast<size_t>(rows));
  std::vector<double> local_sum_exp(static_cast<size_t>(rows));
  Tensor target_logit = Tensor::empty({rows}, DType::kF32, x.device());
  visit_index_dtype(tg.dtype(), [&](auto tag) {
    using I = decltype(tag);
    const I* t = tg.data<I>();
    check_targets(t, rows, vocab, ignore_index);
    fingerprint = targets_fingerprint(t, rows);
    kernels::cpu::vocab_parallel_cross_entropy_local_stats(xp, t, local_max.data(),
                                                           local_sum_exp.data(), shape);
    kernels::cpu::vocab_parallel_cross_entropy_target_logit(xp, t, target_logit.data<float>(),
                                                            shape);
  });

  // 1. The global row max, with the values all ranks must agree on behind it.
  Tensor row_max = Tensor::empty({rows + 2 * kAgreedFields}, DType::kF32, x.device());
  float* mp = row_max.data<float>();
  std::copy(local_max.begin(), local_max.end(), mp);
  const Agreement agreement{cols, vocab, ignore_index, fingerprint};
  agreement.fill(mp + rows);
  tp->allreduce(row_max, comm::AllreduceOptions{comm::ReduceOp::kMax})->wait();
  agreement.check(mp + rows, *tp, rows);

  // 2. The target's logit, summed over ranks (one rank holds it, the others add 0), and 3. the
  // sum of exp(x - max) over every class column of the row: each rank's sum scaled to the global
  // max.
  comm::WorkPtr target_work = tp->allreduce(target_logit);
  Tensor sum_exp = Tensor::empty({rows}, DType::kF32, x.device());
  kernels::cpu::vocab_parallel_cross_entropy_rescale_sum_exp(local_max.data(), local_sum_exp.data(),
                                                             mp, sum_exp.data<float>(), rows);
  comm::WorkPtr sum_work = tp->allreduce(sum_exp);
  target_work->wait();
  sum_work->wait();

  // Row losses in double and added in row order, as core does: the loss is the same on every
  // rank, which all hold the same reduced values.
  Tensor lse = Tensor::empty({rows}, DType::kF32, x.device());
  double total = 0.0;
  int64_t count = 0;
  visit_index_dtype(tg.dtype(), [&](auto tag) {
    using I = decltype(tag);
    total = kernels::cpu::vocab_parallel_cross_entropy_loss(tg.data<I>(), mp, sum_exp.data<float>(),
                                                            target_logit.data<float>(),
                                                            lse.data<float>(), shape, &count);
  });
  // All rows ignored: loss 0 and zero gradients (core's convention, not PyTorch's NaN).
  Tensor out = Tensor::scalar(count > 0 ? total / double(count) : 0.0, DType::kF32, x.device());
  autograd::record(out, kOp, {logits}, {x, tg, lse}, [x, tg, lse, shape, count](const Tensor& g) {
    const float scale = count > 0 ? float(g.item() / double(count)) : 0.0f;
    Tensor dx = Tensor::empty(x.shape(), DType::kF32, x.device());
    visit_index_dtype(tg.dtype(), [&](auto tag) {
      using I = decltype(tag);
      kernels::cpu::vocab_parallel_cross_entropy_backward(
          x.data<float>(), tg.data<I>(), lse.data<float>(), scale, dx.data<float>(), shape);
    });
    return std::vector<Tensor>{dx};
  });
  return out;
}

}  // namespace loom::parallel
