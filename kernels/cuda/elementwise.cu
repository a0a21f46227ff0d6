#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/launch.h"

#include <vector>

namespace loom::kernels::cuda {

namespace {

constexpr int kBlock = kBlockThreads;

template <int kOp>
__global__ void binary_kernel(const float* a, const float* b, float* out, int64_t n, int64_t nb) {
  LOOM_GRID_STRIDE(i, n) {
    float x = a[i], y = b[i % nb];
    out[i] = kOp == 0 ? x + y : (kOp == 1 ? x - y : x * y);
  }
}

__global__ void scale_kernel(const float* x, float s, float* out, int64_t n) {
  LOOM_GRID_STRIDE(i, n) out[i] = x[i] * s;
}

__global__ void axpy_kernel(float* x, const float* y, float alpha, int64_t n) {
  LOOM_GRID_STRIDE(i, n) x[i] += alpha * y[i];
}

// One thread per column; rows summed in order, so the result is deterministic.
__global__ void sum_rows_kernel(const float* x, float* out, int64_t rows, int64_t cols) {
  LOOM_GRID_STRIDE(c, cols) {
    float acc = 0.0f;
    for (int64_t r = 0; r < rows; ++r) acc += x[r * cols + c];
    out[c] = acc;
  }
}

// Per-block partial sums in f64, reduced in shared memory; the host adds the partials in order.
__global__ void sum_of_squares_kernel(const float* x, int64_t n, double* partial) {
  __shared__ double buf[kBlock];
  double acc = 0.0;
  LOOM_GRID_STRIDE(i, n) acc += double(x[i]) * double(x[i]);
  buf[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kBlock / 2; s > 0; s >>= 1) {
    if (int(threadIdx.x) < s) buf[threadIdx.x] += buf[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = buf[0];
}

template <int kOp>
void binary(const float* a, const float* b, float* out, int64_t n, int64_t nb, Stream stream) {
  if (n == 0) return;
  LOOM_CHECK(nb > 0 && n % nb == 0, "cuda binary op: broadcast size ", nb, " does not divide ", n);
  auto kernel = binary_kernel<kOp>;
  LOOM_LAUNCH(kernel, grid_stride_blocks(n), kBlock, 0, stream, a, b, out, n, nb);
}

}  // namespace

void add(const float* a, const float* b, float* out, int64_t n, int64_t nb, Stream stream) {
  binary<0>(a, b, out, n, nb, stream);
}
void sub(const float* a, const float* b, float* out, int64_t n, int64_t nb, Stream stream) {
  binary<1>(a, b, out, n, nb, stream);
}
void mul(const float* a, const float* b, float* out, int64_t n, int64_t nb, Stream stream) {
  binary<2>(a, b, out, n, nb, stream);
}

void scale(const float* x, float s, float* out, int64_t n, Stream stream) {
  if (n == 0) return;
  LOOM_LAUNCH(scale_kernel, grid_stride_blocks(n), kBlock, 0, stream, x, s, out, n);
}

void axpy(float* x, const float* y, float alpha, int64_t n, Stream stream) {
  if (n == 0) return;
  LOOM_LAUNCH(axpy_kernel, grid_stride_blocks(n), kBlock, 0, stream, x, y, alpha, n);
}

void sum_rows(const float* x, float* out, int64_t rows, int64_t cols, Stream stream) {
  if (cols == 0) return;
  LOOM_LAUNCH(sum_rows_kernel, grid_stride_blocks(cols), kBlock, 0, stream, x, out, rows, cols);
}

double sum_of_squares(const float* x, int64_t n, Stream stream) {
  if (n == 0) return 0.0;
  const unsigned blocks = grid_stride_blocks(n) < 1024 ? grid_stride_blocks(n) : 1024;
  double* partial = nullptr;
  LOOM_CUDA_CHECK(cudaMallocAsync(&partial, blocks * sizeof(double), stream));
  LOOM_LAUNCH(sum_of_squares_kernel, blocks, kBlock, 0, stream, x, n, partial);
  std::vector<double> host(blocks);
  LOOM_CUDA_CHECK(cudaMemcpyAsync(host.data(), partial, blocks * sizeof(double),
                                  cudaMemcpyDeviceToHost, stream));
  LOOM_CUDA_CHECK(cudaFreeAsync(partial, stream));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
  double total = 0.0;
  for (double p : host) total += p;
  return total;
}

}  // namespace loom::kernels::cuda
