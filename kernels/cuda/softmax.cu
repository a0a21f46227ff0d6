// Row softmax on CUDA, the CPU's passes (kernels/cpu/softmax.cpp) in the same f32 formulas:
// m = max(x), e = exp(x - m), y = e * (1 / sum(e)); dx = y * (dy - sum(y * dy)). Keeping the
// CPU's formula, rather than an online (single-pass) max-and-sum, is what makes -inf entries and
// all -inf rows come out as on the CPU (0, and NaN) with no special cases.
//
// Each row belongs to one row group: a warp when cols <= kWarpRowMaxCols (8 rows per 256-thread
// block), else the whole block (a vocabulary row of 50304 is ~197 elements per thread). The group
// reads its row in 16-byte vectors when cols and every pointer allow, else one element per
// thread, and re-reads the row (from L1/L2) in each pass rather than holding it in registers, so
// one kernel is correct for every cols. exp is the accurate expf (not __expf), so GPU and CPU
// agree to f32 rounding. Partial results are combined in a fixed tree: deterministic.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/launch.h"
#include "kernels/cuda/softmax.h"

namespace loom::kernels::cuda {

namespace {

constexpr int kWarp = 32;
constexpr int kBlock = kBlockThreads;
constexpr int kWarpsPerBlock = kBlock / kWarp;
constexpr unsigned kFullMask = 0xffffffffu;
static_assert(kBlock % kWarp == 0, "a block is whole warps");
// Rows up to this many columns get a warp each; longer rows get a block.
constexpr int64_t kWarpRowMaxCols = 1024;

// ---------------------------------------------------------------- elements and vectors

// Elements per 16-byte vector: 4 f32 or 8 bf16.
template <typename T>
constexpr int kVec = 16 / int(sizeof(T));

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T e[N];
};

__device__ inline float to_f32(float v) { return v; }
__device__ inline float to_f32(BFloat16 v) { return bf16_to_float(v); }
__device__ inline void set(float& d, float v) { d = v; }
__device__ inline void set(BFloat16& d, float v) { d = float_to_bf16(v); }

// v[k] = p[k] for k < V, as f32, in one access; p is aligned to V * sizeof(T) (at most 16 bytes),
// which the launchers check before choosing V > 1.
template <int V, typename T>
__device__ inline void load(const T* p, float (&v)[V]) {
  static_assert(V * sizeof(T) <= 16, "one access of at most 16 bytes");
  const Pack<T, V> pk = *reinterpret_cast<const Pack<T, V>*>(p);
#pragma unroll
  for (int k = 0; k < V; ++k) v[k] = to_f32(pk.e[k]);
}

// p[k] = v[k] for k < V, each rounded once to T.
template <int V, typename T>
__device__ inline void store(T* p, const float (&v)[V]) {
  static_assert(V * sizeof(T) <= 16, "one access of at most 16 bytes");
  Pack<T, V> pk;
#pragma unroll
  for (int k = 0; k < V; ++k) set(pk.e[k], v[k]);
  *reinterpret_cast<Pack<T, V>*>(p) = pk;
}

// ---------------------------------------------------------------- row groups

// The threads that share one row: a warp (kThreads == kWarp, kWarpsPerBlock rows per block) or
// the whole block (kThreads == kBlock). All threads of a group visit the same rows in the same
// order, so each reaches every reduction of its group (shuffles for a warp, __syncthreads for a
// block); a warp's lanes past the row's end take part with neutral values.
template <int kThreads>
struct RowGroup {
  static_assert(kThreads == kWarp || kThreads == kBlock, "a row group is a warp or a block");
  static constexpr int kRowsPerBlock = kBlock / kThreads;
  __device__ static int rank() { return int(threadIdx.x) % kThreads; }
  __device__ static int64_t first_row() {
    return int64_t(blockIdx.x) * kRowsPerBlock + int(threadIdx.x) / kThreads;
  }
  __device__ static int64_t row_stride() { return int64_t(gridDim.x) * kRowsPerBlock; }
  static unsigned grid(int64_t rows) { return grid_stride_blocks(rows, kRowsPerBlock); }
};

struct Sum {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// op over the calling thread's row group, returned to every thread of it: a butterfly over the
// warp (each step's partners combine the same two numbers, so all lanes agree), then, for a
// block, the warps' results combined in warp order. scratch: kWarpsPerBlock floats of shared
// memory.
template <int kThreads, typename Op>
__device__ inline float group_reduce(float v, float* scratch, Op op) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) v = op(v, __shfl_xor_sync(kFullMask, v, o));
  if constexpr (kThreads == kWarp) {
    return v;
  } else {
    if (threadIdx.x % kWarp == 0) scratch[threadIdx.x / kWarp] = v;
    __syncthreads();
    float total = scratch[0];
#pragma unroll
    for (int w = 1; w < kWarpsPerBlock; ++w) total = op(total, scratch[w]);
    __syncthreads();  // scratch is written again by the group's next reduction
    return total;
  }
}

// ---------------------------------------------------------------- kernels

// Each element of y is written by the thread that read it in the last pass, after the row's max
// and sum are complete, so y == x is safe.
template <int kThreads, int V, typename T>
__global__ void softmax_forward_kernel(const T* x, T* y, int64_t rows, int64_t cols) {
  using G = RowGroup<kThreads>;
  __shared__ float scratch[kWarpsPerBlock];
  const int64_t step = int64_t(kThreads) * V;
  for (int64_t r = G::first_row(); r < rows; r += G::row_stride()) {
    const T* xr = x + r * cols;
    float acc = -INFINITY;
    for (int64_t c = int64_t(G::rank()) * V; c < cols; c += step) {
      float v[V];
      load<V>(xr + c, v);
#pragma unroll
      for (int k = 0; k < V; ++k) acc = fmaxf(acc, v[k]);
    }
    const float m = group_reduce<kThreads>(acc, scratch, Max{});
    acc = 0.0f;
    for (int64_t c = int64_t(G::rank()) * V; c < cols; c += step) {
      float v[V];
      load<V>(xr + c, v);
#pragma unroll
      for (int k = 0; k < V; ++k) acc += expf(v[k] - m);
    }
    const float inv_sum = 1.0f / group_reduce<kThreads>(acc, scratch, Sum{});
    T* yr = y + r * cols;
    for (int64_t c = int64_t(G::rank()) * V; c < cols; c += step) {
      float v[V];
      load<V>(xr + c, v);
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = expf(v[k] - m) * inv_sum;
      store<V>(yr + c, v);
    }
  }
}

template <int kThreads, int V, typename T>
__global__ void softmax_backward_kernel(const T* y, const T* dy, T* dx, int64_t rows,
                                        int64_t cols) {
  using G = RowGroup<kThreads>;
  __shared__ float scratch[kWarpsPerBlock];
  const int64_t step = int64_t(kThreads) * V;
  for (int64_t r = G::first_row(); r < rows; r += G::row_stride()) {
    const T* yr = y + r * cols;
    const T* dyr = dy + r * cols;
    float acc = 0.0f;
    for (int64_t c = int64_t(G::rank()) * V; c < cols; c += step) {
      float a[V], d[V];
      load<V>(yr + c, a);
      load<V>(dyr + c, d);
#pragma unroll
      for (int k = 0; k < V; ++k) acc += a[k] * d[k];
    }
    const float dot = group_reduce<kThreads>(acc, scratch, Sum{});
    T* dxr = dx + r * cols;
    for (int64_t c = int64_t(G::rank()) * V; c < cols; c += step) {
      float a[V], d[V];
      load<V>(yr + c, a);
      load<V>(dyr + c, d);
#pragma unroll
      for (int k = 0; k < V; ++k) d[k] = a[k] * (d[k] - dot);
      store<V>(dxr + c, d);
    }
  }
}

// ---------------------------------------------------------------- launchers

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Calls f(kThreads, V) as integral constants: the row group for cols, and 16-byte vectors when
// cols is a whole number of them and `aligned` (every row pointer on a 16-byte boundary).
template <typename T, typename F>
void dispatch_rows(int64_t cols, bool aligned, F&& f) {
  using Warp = std::integral_constant<int, kWarp>;
  using Block = std::integral_constant<int, kBlock>;
  using One = std::integral_constant<int, 1>;
  using Vec = std::integral_constant<int, kVec<T> >;
  const bool vec = aligned && cols % kVec<T> == 0;
  if (cols <= kWarpRowMaxCols) {
    if (vec) return f(Warp{}, Vec{});
    return f(Warp{}, One{});
  }
  if (vec) return f(Block{}, Vec{});
  return f(Block{}, One{});
}

template <int kThreads, int V, typename T>
void launch_forward(const T* x, T* y, int64_t rows, int64_t cols, Stream stream) {
  auto softmax_forward_rows = softmax_forward_kernel<kThreads, V, T>;
  LOOM_LAUNCH(softmax_forward_rows, RowGroup<kThreads>::grid(rows), kBlock, 0, stream, x, y, rows,
              cols);
}

template <int kThreads, int V, typename T>
void launch_backward(const T* y, const T* dy, T* dx, int64_t rows, int64_t cols, Stream stream) {
  auto softmax_backward_rows = softmax_backward_kernel<kThreads, V, T>;
  LOOM_LAUNCH(softmax_backward_rows, RowGroup<kThreads>::grid(rows), kBlock, 0, stream, y, dy, dx,
              rows, cols);
}

template <typename T>
void forward(const T* x, T* y, int64_t rows, int64_t cols, Stream stream) {
  if (rows == 0 || cols == 0) return;
  dispatch_rows<T>(cols, aligned16(x) && aligned16(y), [&](auto threads, auto vec) {
    launch_forward<decltype(threads)::value, decltype(vec)::value>(x, y, rows, cols, stream);
  });
}

template <typename T>
void backward(const T* y, const T* dy, T* dx, int64_t rows, int64_t cols, Stream stream) {
  if (rows == 0 || cols == 0) return;
  const bool aligned = aligned16(y) && aligned16(dy) && aligned16(dx);
  dispatch_rows<T>(cols, aligned, [&](auto threads, auto vec) {
    launch_backward<decltype(threads)::value, decltype(vec)::value>(y, dy, dx, rows, cols, stream);
  });
}

}  // namespace

void softmax_forward(const float* x, float* y, int64_t rows, int64_t cols, Stream stream) {
  forward(x, y, rows, cols, stream);
}
void softmax_forward(const BFloat16* x, BFloat16* y, int64_t rows, int64_t cols, Stream stream) {
  forward(x, y, rows, cols, stream);
}

void softmax_backward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols,
                      Stream stream) {
  backward(y, dy, dx, rows, cols, stream);
}
void softmax_backward(const BFloat16* y, const BFloat16* dy, BFloat16* dx, int64_t rows,
                      int64_t cols, Stream stream) {
  backward(y, dy, dx, rows, cols, stream);
}

}  // namespace loom::kernels::cuda
