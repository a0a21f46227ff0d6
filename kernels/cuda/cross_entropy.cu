// Fused softmax + cross-entropy on CUDA (the CPU twin is kernels/cpu/cross_entropy.cpp), and the
// row kernels vocab_parallel_cross_entropy.cu shares (See Note [CUDA cross-entropy rows] in
// cross_entropy_impl.cuh).
//
// The forward is two launches: a block per row writes lse, then one block sums the counted rows'
// lse - logit[target] in double, each thread over a fixed stride of rows and the threads in a
// fixed tree, so the loss is bit-identical from run to run without storing a per-row loss. (That
// second pass rereads one logit per row and the f32 lse; see cross_entropy.h for what the
// rounding of lse costs against the CPU's double.)
#include <cmath>

#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/cross_entropy_impl.cuh"
#include "kernels/cuda/launch.h"

namespace loom::kernels::cuda {

namespace detail {

namespace {

template <typename T, typename I>
__global__ void __launch_bounds__(kMaxRowThreads)
    row_stats_kernel(const T* logits, const I* targets, int64_t rows, int64_t cols, int64_t classes,
                     int64_t ignore_index, float* lse, float* row_max, double* row_sum_exp) {
  __shared__ float max_scratch[kMaxWarps];
  __shared__ double sum_scratch[kMaxWarps];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    // The same in every thread of the block, so the reductions below are reached by all or none.
    if (int64_t(targets[r]) == ignore_index) {
      if (threadIdx.x == 0) {
        if (lse) lse[r] = 0.0f;
        if (row_max) row_max[r] = -INFINITY;
        if (row_sum_exp) row_sum_exp[r] = 0.0;
      }
      continue;
    }
    const T* x = logits + r * cols;
    // This thread's columns: m their max, s the sum of exp(x - m). -inf columns add exactly 0 and
    // are skipped, so exp never sees -inf - -inf; a NaN column makes s NaN.
    float m = -INFINITY;
    double s = 0.0;
    for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
      const float v = as_f32(x[c]);
      if (v > m) {
        s = s * double(expf(m - v)) + 1.0;  // m == -inf: s is 0 and expf gives 0
        m = v;
      } else if (v != -INFINITY) {
        s += double(expf(v - m));
      }
    }
    const float block_m = block_max(m, max_scratch);
    const double part = s == 0.0 ? 0.0 : s * exp(double(m) - double(block_m));
    const double block_s = block_sum(part, sum_scratch);
    if (threadIdx.x == 0) {
      if (lse) lse[r] = float(double(block_m) + log(block_s));
      if (row_max) row_max[r] = block_m;
      if (row_sum_exp) row_sum_exp[r] = block_s;
    }
  }
}

template <typename T, typename I>
__global__ void __launch_bounds__(kMaxRowThreads)
    row_backward_kernel(const T* logits, const I* targets, const float* lse, const float* scale_ptr,
                        T* dlogits, int64_t rows, int64_t cols, int64_t classes,
                        int64_t target_offset, int64_t ignore_index) {
  const float scale = *scale_ptr;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t target = int64_t(targets[r]);
    const T* x = logits + r * cols;
    T* d = dlogits + r * cols;
    if (target == ignore_index) {
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) store_rounded(0.0f, d + c);
      continue;
    }
    const int64_t t = target - target_offset;  // a local column, or outside [0, classes)
    const float l = lse[r];
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      float g = 0.0f;
      if (c < classes) {
        // As the CPU: exp(x - lse) * scale rounded, then scale taken off (no fused multiply-add).
        g = __fmul_rn(expf(as_f32(x[c]) - l), scale);
        if (c == t) g -= scale;
      }
      store_rounded(g, d + c);
    }
  }
}

}  // namespace

template <typename T, typename I>
void launch_row_stats(const T* logits, const I* targets, int64_t rows, int64_t cols,
                      int64_t classes, int64_t ignore_index, float* lse, float* row_max,
                      double* row_sum_exp, Stream stream) {
  if (rows == 0) return;
  auto row_stats = row_stats_kernel<T, I>;
  LOOM_LAUNCH(row_stats, row_blocks(rows), row_block_threads(classes), 0, stream, logits, targets,
              rows, cols, classes, ignore_index, lse, row_max, row_sum_exp);
}

template <typename T, typename I>
void launch_row_backward(const T* logits, const I* targets, const float* lse, const float* scale,
                         T* dlogits, int64_t rows, int64_t cols, int64_t classes,
                         int64_t target_offset, int64_t ignore_index, Stream stream) {
  if (rows == 0 || cols == 0) return;
  auto row_backward = row_backward_kernel<T, I>;
  LOOM_LAUNCH(row_backward, row_blocks(rows), row_block_threads(cols), 0, stream, logits, targets,
              lse, scale, dlogits, rows, cols, classes, target_offset, ignore_index);
}

#define LOOM_CROSS_ENTROPY_ROWS(T, I)                                                          \
  template void launch_row_stats<T, I>(const T*, const I*, int64_t, int64_t, int64_t, int64_t, \
                                       float*, float*, double*, Stream);                       \
  template void launch_row_backward<T, I>(const T*, const I*, const float*, const float*, T*,  \
                                          int64_t, int64_t, int64_t, int64_t, int64_t, Stream);
LOOM_CROSS_ENTROPY_ROWS(float, int32_t)
LOOM_CROSS_ENTROPY_ROWS(float, int64_t)
LOOM_CROSS_ENTROPY_ROWS(BFloat16, int32_t)
LOOM_CROSS_ENTROPY_ROWS(BFloat16, int64_t)
#undef LOOM_CROSS_ENTROPY_ROWS

}  // namespace detail

namespace {

using detail::kMaxWarps;
using detail::kSumThreads;

// One block: *loss_sum = the sum over counted rows of lse - logit[target] in double, *count = the
// number of counted rows.
template <typename T, typename I>
__global__ void __launch_bounds__(kSumThreads)
    loss_sum_kernel(const T* logits, const I* targets, const float* lse, int64_t rows, int64_t cols,
                    int64_t ignore_index, double* loss_sum, int64_t* count) {
  __shared__ double sum_scratch[kMaxWarps];
  __shared__ long long count_scratch[kMaxWarps];
  double acc = 0.0;
  long long counted = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const int64_t target = int64_t(targets[r]);
    if (target == ignore_index) continue;
    acc += double(lse[r]) - double(detail::as_f32(logits[r * cols + target]));
    ++counted;
  }
  const double total = detail::block_sum(acc, sum_scratch);
  const long long total_count = detail::block_sum(counted, count_scratch);
  if (threadIdx.x == 0) {
    *loss_sum = total;
    *count = int64_t(total_count);
  }
}

__global__ void mean_kernel(const double* loss_sum, const int64_t* count, float* loss) {
  const int64_t n = *count;
  *loss = n > 0 ? float(*loss_sum / double(n)) : 0.0f;
}

__global__ void grad_scale_kernel(const float* grad_loss, const int64_t* count, float* scale) {
  const int64_t n = *count;
  *scale = n > 0 ? float(double(*grad_loss) / double(n)) : 0.0f;
}

void check_shape(const char* fn, const CrossEntropyShape& s) {
  LOOM_CHECK(s.rows >= 0 && s.cols >= 0 && s.num_classes >= 0 && s.num_classes <= s.cols, "cuda ",
             fn, ": shape rows ", s.rows, ", cols ", s.cols, ", num_classes ", s.num_classes,
             " (num_classes must lie in [0, cols])");
}

}  // namespace

template <typename T, typename I>
void cross_entropy_forward(const T* logits, const I* targets, float* lse,
                           const CrossEntropyShape& shape, double* loss_sum, int64_t* count,
                           Stream stream) {
  check_shape("cross_entropy_forward", shape);
  if (shape.rows == 0) {  // all-zero bits are 0.0 and 0
    LOOM_CUDA_CHECK(cudaMemsetAsync(loss_sum, 0, sizeof(double), stream));
    LOOM_CUDA_CHECK(cudaMemsetAsync(count, 0, sizeof(int64_t), stream));
    return;
  }
  detail::launch_row_stats(logits, targets, shape.rows, shape.cols, shape.num_classes,
                           shape.ignore_index, lse, nullptr, nullptr, stream);
  auto loss_sum_of_rows = loss_sum_kernel<T, I>;
  LOOM_LAUNCH(loss_sum_of_rows, 1, kSumThreads, 0, stream, logits, targets, lse, shape.rows,
              shape.cols, shape.ignore_index, loss_sum, count);
}

template <typename T, typename I>
void cross_entropy_backward(const T* logits, const I* targets, const float* lse, const float* scale,
                            T* dlogits, const CrossEntropyShape& shape, Stream stream) {
  check_shape("cross_entropy_backward", shape);
  detail::launch_row_backward(logits, targets, lse, scale, dlogits, shape.rows, shape.cols,
                              shape.num_classes, 0, shape.ignore_index, stream);
}

void cross_entropy_mean(const double* loss_sum, const int64_t* count, float* loss, Stream stream) {
  LOOM_LAUNCH(mean_kernel, 1, 1, 0, stream, loss_sum, count, loss);
}

void cross_entropy_grad_scale(const float* grad_loss, const int64_t* count, float* scale,
                              Stream stream) {
  LOOM_LAUNCH(grad_scale_kernel, 1, 1, 0, stream, grad_loss, count, scale);
}

#define LOOM_CROSS_ENTROPY(T, I)                                                                  \
  template void cross_entropy_forward<T, I>(const T*, const I*, float*, const CrossEntropyShape&, \
                                            double*, int64_t*, Stream);                           \
  template void cross_entropy_backward<T, I>(const T*, const I*, const float*, const float*, T*,  \
                                             const CrossEntropyShape&, Stream);
LOOM_CROSS_ENTROPY(float, int32_t)
LOOM_CROSS_ENTROPY(float, int64_t)
LOOM_CROSS_ENTROPY(BFloat16, int32_t)
LOOM_CROSS_ENTROPY(BFloat16, int64_t)
#undef LOOM_CROSS_ENTROPY

}  // namespace loom::kernels::cuda
