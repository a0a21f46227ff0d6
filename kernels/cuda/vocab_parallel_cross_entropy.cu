// The per-rank stages of vocab-parallel cross-entropy on CUDA (the CPU twin is
// kernels/cpu/vocab_parallel_cross_entropy.cpp). The passes over the logits (local_stats and the
// backward) are cross_entropy.cu's row kernels (See Note [CUDA cross-entropy rows] in
// cross_entropy_impl.cuh), so one rank holding every column computes what the fused kernel does.
// The per-row stages are elementwise; the loss stage is one block, which forms each row's lse in
// double as the CPU does and sums the rows in a fixed tree.
#include <cmath>

#include "kernels/cuda/cross_entropy_impl.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/vocab_parallel_cross_entropy.h"

namespace loom::kernels::cuda {

namespace {

using Shape = VocabParallelCrossEntropyShape;
using detail::kMaxWarps;
using detail::kSumThreads;

template <typename T, typename I>
__global__ void target_logit_kernel(const T* logits, const I* targets, float* target_logit,
                                    int64_t rows, int64_t cols, int64_t start,
                                    int64_t local_classes, int64_t ignore_index) {
  LOOM_GRID_STRIDE(r, rows) {
    const int64_t target = int64_t(targets[r]), t = target - start;
    const bool here = target != ignore_index && t >= 0 && t < local_classes;
    target_logit[r] = here ? detail::as_f32(logits[r * cols + t]) : 0.0f;
  }
}

__global__ void rescale_kernel(const float* local_max, const double* local_sum_exp,
                               const float* row_max, float* sum_exp, int64_t rows) {
  // Tested on the sum, not the max: where it is 0 both maxima may be -inf (difference NaN).
  LOOM_GRID_STRIDE(r, rows) {
    const double s = local_sum_exp[r];
    sum_exp[r] = s == 0.0 ? 0.0f : float(s * exp(double(local_max[r]) - double(row_max[r])));
  }
}

// One block: lse for every row, and the sum over counted rows of lse - target_logit with lse in
// double (before its rounding to f32), as the CPU forms it.
template <typename I>
__global__ void __launch_bounds__(kSumThreads)
    loss_kernel(const I* targets, const float* row_max, const float* sum_exp,
                const float* target_logit, float* lse, int64_t rows, int64_t ignore_index,
                double* loss_sum, int64_t* count) {
  __shared__ double sum_scratch[kMaxWarps];
  __shared__ long long count_scratch[kMaxWarps];
  double acc = 0.0;
  long long counted = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    if (int64_t(targets[r]) == ignore_index) {
      lse[r] = 0.0f;
      continue;
    }
    const double l = double(row_max[r]) + log(double(sum_exp[r]));
    lse[r] = float(l);
    acc += l - double(target_logit[r]);
    ++counted;
  }
  const double total = detail::block_sum(acc, sum_scratch);
  const long long total_count = detail::block_sum(counted, count_scratch);
  if (threadIdx.x == 0) {
    *loss_sum = total;
    *count = int64_t(total_count);
  }
}

void check_shape(const char* fn, const Shape& s) {
  LOOM_CHECK(s.rows >= 0 && s.cols >= 0 && s.local_classes >= 0 && s.local_classes <= s.cols,
             "cuda ", fn, ": shape rows ", s.rows, ", cols ", s.cols, ", local_classes ",
             s.local_classes, " (local_classes must lie in [0, cols])");
}

}  // namespace

template <typename T, typename I>
void vocab_parallel_cross_entropy_local_stats(const T* logits, const I* targets, float* local_max,
                                              double* local_sum_exp, const Shape& shape,
                                              Stream stream) {
  check_shape("vocab_parallel_cross_entropy_local_stats", shape);
  detail::launch_row_stats(logits, targets, shape.rows, shape.cols, shape.local_classes,
                           shape.ignore_index, nullptr, local_max, local_sum_exp, stream);
}

template <typename T, typename I>
void vocab_parallel_cross_entropy_target_logit(const T* logits, const I* targets,
                                               float* target_logit, const Shape& shape,
                                               Stream stream) {
  check_shape("vocab_parallel_cross_entropy_target_logit", shape);
  if (shape.rows == 0) return;
  auto target_logit_of_rows = target_logit_kernel<T, I>;
  LOOM_LAUNCH(target_logit_of_rows, grid_stride_blocks(shape.rows), kBlockThreads, 0, stream,
              logits, targets, target_logit, shape.rows, shape.cols, shape.start,
              shape.local_classes, shape.ignore_index);
}

void vocab_parallel_cross_entropy_rescale_sum_exp(const float* local_max,
                                                  const double* local_sum_exp, const float* row_max,
                                                  float* sum_exp, int64_t rows, Stream stream) {
  if (rows == 0) return;
  LOOM_LAUNCH(rescale_kernel, grid_stride_blocks(rows), kBlockThreads, 0, stream, local_max,
              local_sum_exp, row_max, sum_exp, rows);
}

template <typename I>
void vocab_parallel_cross_entropy_loss(const I* targets, const float* row_max, const float* sum_exp,
                                       const float* target_logit, float* lse, const Shape& shape,
                                       double* loss_sum, int64_t* count, Stream stream) {
  check_shape("vocab_parallel_cross_entropy_loss", shape);
  if (shape.rows == 0) {  // all-zero bits are 0.0 and 0
    LOOM_CUDA_CHECK(cudaMemsetAsync(loss_sum, 0, sizeof(double), stream));
    LOOM_CUDA_CHECK(cudaMemsetAsync(count, 0, sizeof(int64_t), stream));
    return;
  }
  auto loss_of_rows = loss_kernel<I>;
  LOOM_LAUNCH(loss_of_rows, 1, kSumThreads, 0, stream, targets, row_max, sum_exp, target_logit, lse,
              shape.rows, shape.ignore_index, loss_sum, count);
}

template <typename T, typename I>
void vocab_parallel_cross_entropy_backward(const T* logits, const I* targets, const float* lse,
                                           const float* scale, T* dlogits, const Shape& shape,
                                           Stream stream) {
  check_shape("vocab_parallel_cross_entropy_backward", shape);
  detail::launch_row_backward(logits, targets, lse, scale, dlogits, shape.rows, shape.cols,
                              shape.local_classes, shape.start, shape.ignore_index, stream);
}

#define LOOM_VOCAB_PARALLEL_CROSS_ENTROPY(T, I)                                                \
  template void vocab_parallel_cross_entropy_local_stats<T, I>(const T*, const I*, float*,     \
                                                               double*, const Shape&, Stream); \
  template void vocab_parallel_cross_entropy_target_logit<T, I>(const T*, const I*, float*,    \
                                                                const Shape&, Stream);         \
  template void vocab_parallel_cross_entropy_backward<T, I>(                                   \
      const T*, const I*, const float*, const float*, T*, const Shape&, Stream);
LOOM_VOCAB_PARALLEL_CROSS_ENTROPY(float, int32_t)
LOOM_VOCAB_PARALLEL_CROSS_ENTROPY(float, int64_t)
LOOM_VOCAB_PARALLEL_CROSS_ENTROPY(BFloat16, int32_t)
LOOM_VOCAB_PARALLEL_CROSS_ENTROPY(BFloat16, int64_t)
#undef LOOM_VOCAB_PARALLEL_CROSS_ENTROPY

template void vocab_parallel_cross_entropy_loss<int32_t>(const int32_t*, const float*, const float*,
                                                         const float*, float*, const Shape&,
                                                         double*, int64_t*, Stream);
template void vocab_parallel_cross_entropy_loss<int64_t>(const int64_t*, const float*, const float*,
                                                         const float*, float*, const Shape&,
                                                         double*, int64_t*, Stream);

}  // namespace loom::kernels::cuda
