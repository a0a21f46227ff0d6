// Binary cross-entropy kernels (the CPU twin is kernels/cpu/binary_cross_entropy.cpp). The loss
// sum is two launches: a grid of at most kMaxPartials blocks, each thread adding its elements
// (grid-stride) in double and each block its threads in a shared-memory tree of halving strides,
// one partial per block in the workspace; then one block adds the partials the same way. The grid
// is a function of n alone, so the sum is bit-identical from run to run. The gradient is
// elementwise with the CPU's f32 formulas.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/binary_cross_entropy.h"
#include "kernels/cuda/launch.h"

namespace loom::kernels::cuda {

namespace {

constexpr int kBlock = kBlockThreads;
constexpr int64_t kMaxPartials = 1024;
static_assert((kBlock & (kBlock - 1)) == 0, "block_sum halves the block: a power of two");

// Blocks of the partial-sum launch for n > 0 elements: one per kBlock elements, at most
// kMaxPartials (the grid-stride loop covers the rest).
int64_t partial_blocks(int64_t n) {
  const int64_t b = (n + kBlock - 1) / kBlock;
  return b < kMaxPartials ? b : kMaxPartials;
}

// Sums v over the kBlock threads of the calling block (all must call it) in a fixed tree; the
// result is in thread 0.
__device__ double block_sum(double* buf, double v) {
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int s = kBlock / 2; s > 0; s >>= 1) {
    if (int(threadIdx.x) < s) buf[threadIdx.x] += buf[threadIdx.x + s];
    __syncthreads();
  }
  return buf[0];
}

// The CPU's per-element loss, in double: std::max(x, 0.0) is (x < 0 ? 0 : x), which keeps a NaN
// x as the CPU does. x * y is exact in double (two 24-bit significands), so whether the compiler
// fuses the subtraction into an FMA changes nothing.
__device__ inline double element_loss(float xf, float yf) {
  const double x = xf, y = yf;
  return (x < 0.0 ? 0.0 : x) - x * y + log1p(exp(-fabs(x)));
}

__global__ void __launch_bounds__(kBlock)
    bce_partials_kernel(const float* logits, const float* targets, int64_t n, double* partial) {
  __shared__ double buf[kBlock];
  double acc = 0.0;
  LOOM_GRID_STRIDE(i, n) { acc += element_loss(logits[i], targets[i]); }
  const double total = block_sum(buf, acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

__global__ void __launch_bounds__(kBlock)
    bce_finish_kernel(const double* partial, int64_t count, double* loss_sum) {
  __shared__ double buf[kBlock];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  const double total = block_sum(buf, acc);
  if (threadIdx.x == 0) *loss_sum = total;
}

__global__ void bce_mean_kernel(const double* loss_sum, int64_t n, float* loss) {
  *loss = n > 0 ? float(*loss_sum / double(n)) : 0.0f;
}

__global__ void bce_grad_scale_kernel(const float* grad_loss, int64_t n, float* scale) {
  *scale = n > 0 ? float(double(*grad_loss) / double(n)) : 0.0f;
}

__global__ void bce_backward_kernel(const float* logits, const float* targets,
                                    const float* scale_ptr, float* dlogits, float* dtargets,
                                    int64_t n) {
  const float scale = *scale_ptr;
  LOOM_GRID_STRIDE(i, n) {
    const float x = logits[i];
    const float p = 1.0f / (1.0f + expf(-x));  // the CPU's sigmoid (kernels/cpu/sigmoid.cpp)
    dlogits[i] = scale * (p - targets[i]);
    if (dtargets != nullptr) dtargets[i] = -scale * x;
  }
}

}  // namespace

size_t binary_cross_entropy_workspace_bytes(int64_t n) {
  LOOM_CHECK(n >= 0, "cuda binary_cross_entropy_workspace_bytes: n = ", n, " is negative");
  return n == 0 ? 0 : size_t(partial_blocks(n)) * sizeof(double);
}

void binary_cross_entropy_forward(const float* logits, const float* targets, int64_t n,
                                  double* loss_sum, void* workspace, size_t workspace_bytes,
                                  Stream stream) {
  LOOM_CHECK(n >= 0, "cuda binary_cross_entropy_forward: n = ", n, " is negative");
  if (n == 0) {  // all-zero bits are 0.0
    LOOM_CUDA_CHECK(cudaMemsetAsync(loss_sum, 0, sizeof(double), stream));
    return;
  }
  const size_t needed = binary_cross_entropy_workspace_bytes(n);
  LOOM_CHECK(workspace != nullptr, "cuda binary_cross_entropy_forward: workspace is null, needs ",
             needed, " bytes (binary_cross_entropy_workspace_bytes)");
  LOOM_CHECK(workspace_bytes >= needed, "cuda binary_cross_entropy_forward: workspace of ",
             workspace_bytes, " bytes is too small, needs ", needed,
             " (binary_cross_entropy_workspace_bytes)");
  LOOM_CHECK(reinterpret_cast<uintptr_t>(workspace) % alignof(double) == 0,
             "cuda binary_cross_entropy_forward: workspace ", workspace, " is not 8-byte aligned");
  double* partial = static_cast<double*>(workspace);
  const int64_t blocks = partial_blocks(n);
  LOOM_LAUNCH(bce_partials_kernel, unsigned(blocks), kBlock, 0, stream, logits, targets, n,
              partial);
  LOOM_LAUNCH(bce_finish_kernel, 1, kBlock, 0, stream, partial, blocks, loss_sum);
}

void binary_cross_entropy_mean(const double* loss_sum, int64_t n, float* loss, Stream stream) {
  LOOM_LAUNCH(bce_mean_kernel, 1, 1, 0, stream, loss_sum, n, loss);
}

void binary_cross_entropy_grad_scale(const float* grad_loss, int64_t n, float* scale,
                                     Stream stream) {
  LOOM_LAUNCH(bce_grad_scale_kernel, 1, 1, 0, stream, grad_loss, n, scale);
}

void binary_cross_entropy_backward(const float* logits, const float* targets, const float* scale,
                                   float* dlogits, float* dtargets, int64_t n, Stream stream) {
  LOOM_CHECK(n >= 0, "cuda binary_cross_entropy_backward: n = ", n, " is negative");
  if (n == 0) return;
  LOOM_LAUNCH(bce_backward_kernel, grid_stride_blocks(n), kBlockThreads, 0, stream, logits, targets,
              scale, dlogits, dtargets, n);
}

}  // namespace loom::kernels::cuda
