// Embedding lookup on CUDA (the CPU twin is kernels/cpu/embedding.cpp).
//
// Note [Deterministic CUDA embedding lookup backward]
// The CPU sums each vocabulary row's output gradients in increasing position, starting from the
// first one (a copy, then +=). The GPU adds the same f32 values in the same order, so dweight is
// bit-identical to the CPU's:
// 1. keys[i] = indices[i], values[i] = i.
// 2. cub::DeviceRadixSort::SortPairs sorts them by key. The sort is stable, so each row's run of
//    positions stays increasing.
// 3. Each vocabulary row finds its run [begin, end) in the sorted keys by binary search (no
//    run-length encode or scan needed, and rows without a run are found in the same pass); the
//    threads of the row each own some of its columns and add the run's dout rows in order. A row
//    belongs to one set of threads, so there are no atomics, and rows no index names are zeroed.
// A run of many lookups (one hot token) is added by one thread per column, in sequence: that
// order is what makes the result equal to the CPU's.
#include <cub/device/device_radix_sort.cuh>

#include <limits>

#include "kernels/cuda/embedding.h"
#include "kernels/cuda/launch.h"

namespace loom::kernels::cuda {

namespace {

constexpr int kBlock = kBlockThreads;
constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

__device__ inline float as_f32(float x) { return x; }
__device__ inline float as_f32(BFloat16 x) { return bf16_to_float(x); }

unsigned clamp_grid(int64_t blocks) {
  return unsigned(blocks < 1 ? 1 : blocks < int64_t(kMaxGridBlocks) ? blocks : kMaxGridBlocks);
}

// ---------------------------------------------------------------- forward

template <typename T, typename I>
__global__ void forward_kernel(const T* weight, const I* indices, T* out, int64_t total,
                               int64_t cols) {
  LOOM_GRID_STRIDE(e, total) {
    const int64_t i = e / cols, c = e - i * cols;
    out[e] = weight[int64_t(indices[i]) * cols + c];
  }
}

// ---------------------------------------------------------------- backward workspace

void check_sizes(const char* fn, int64_t n, int64_t vocab) {
  LOOM_CHECK(n >= 0 && n <= kMaxInt32 && vocab >= 0 && vocab <= kMaxInt32, "cuda ", fn, ": ", n,
             " lookups into ", vocab,
             " rows; at most 2^31-1 of each per call (32-bit sort keys and positions)");
}

// The radix sort's end bit: keys are < vocab.
int sort_end_bit(int64_t vocab) {
  int bits = 0;
  while (bits < 63 && ((vocab - 1) >> bits) > 0) ++bits;
  return bits < 1 ? 1 : bits;
}

// Offsets into the workspace, each region rounded up to 256 bytes.
struct Layout {
  size_t keys[2], pos[2];   // uint32 [n] x2, int32 [n] x2 (the sort's double buffers)
  size_t temp, temp_bytes;  // cub's scratch (cub aligns its own allocations within it)
  size_t total;
};

Layout make_layout(int64_t n, int64_t vocab) {
  Layout l{};
  size_t at_byte = 0;
  auto take = [&](size_t bytes) {
    const size_t offset = at_byte;
    at_byte += (bytes + 255) / 256 * 256;
    return offset;
  };
  const size_t un = size_t(n);
  l.keys[0] = take(un * sizeof(uint32_t));
  l.keys[1] = take(un * sizeof(uint32_t));
  l.pos[0] = take(un * sizeof(int32_t));
  l.pos[1] = take(un * sizeof(int32_t));
  cub::DoubleBuffer<uint32_t> keys(nullptr, nullptr);
  cub::DoubleBuffer<int32_t> values(nullptr, nullptr);
  LOOM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, l.temp_bytes, keys, values, int(n), 0,
                                                  sort_end_bit(vocab)));
  l.temp = take(l.temp_bytes);
  l.total = at_byte;
  return l;
}

template <typename T>
T* at(void* base, size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
}

// ---------------------------------------------------------------- backward kernels

template <typename I>
__global__ void keys_kernel(const I* indices, int64_t n, uint32_t* keys, int32_t* pos) {
  LOOM_GRID_STRIDE(i, n) {
    keys[i] = uint32_t(indices[i]);
    pos[i] = int32_t(i);
  }
}

// The first k in [0, n) with keys[k] >= value, or n.
__device__ inline int32_t lower_bound(const uint32_t* keys, int32_t n, int64_t value) {
  int32_t lo = 0, hi = n;
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo) / 2;
    if (int64_t(keys[mid]) < value)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// Block (tx, ty): ty vocabulary rows at a time (grid-stride), tx threads across each row's
// columns. See Note [Deterministic CUDA embedding lookup backward].
template <typename T>
__global__ void rows_kernel(const T* dout, const uint32_t* keys, const int32_t* pos, int32_t n,
                            int64_t vocab, int64_t cols, float* dweight) {
  const int64_t step = int64_t(gridDim.x) * blockDim.y;
  for (int64_t v = int64_t(blockIdx.x) * blockDim.y + threadIdx.y; v < vocab; v += step) {
    const int32_t begin = lower_bound(keys, n, v), end = lower_bound(keys, n, v + 1);
    float* row = dweight + v * cols;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      float acc = 0.0f;
      if (begin < end) {
        acc = as_f32(dout[int64_t(pos[begin]) * cols + c]);
        for (int32_t j = begin + 1; j < end; ++j) acc += as_f32(dout[int64_t(pos[j]) * cols + c]);
      }
      row[c] = acc;
    }
  }
}

// Threads across a row: the smallest of 32, 64, 128, 256 that covers cols (256 past that).
int row_threads(int64_t cols) {
  int tx = 32;
  while (tx < kBlock && tx < cols) tx *= 2;
  return tx;
}

}  // namespace

template <typename T, typename I>
void embedding_forward(const T* weight, const I* indices, T* out, int64_t n, int64_t cols,
                       Stream stream) {
  LOOM_CHECK(n >= 0 && cols >= 0, "cuda embedding_forward: n ", n, ", cols ", cols,
             " (must be >= 0)");
  const int64_t total = n * cols;
  if (total == 0) return;
  auto forward = forward_kernel<T, I>;
  LOOM_LAUNCH(forward, grid_stride_blocks(total), kBlock, 0, stream, weight, indices, out, total,
              cols);
}

size_t embedding_backward_workspace_bytes(int64_t n, int64_t vocab) {
  check_sizes("embedding_backward_workspace_bytes", n, vocab);
  if (n == 0) return 0;
  return make_layout(n, vocab).total;
}

template <typename T, typename I>
void embedding_backward(const T* dout, const I* indices, float* dweight, int64_t n, int64_t vocab,
                        int64_t cols, void* workspace, size_t workspace_bytes, Stream stream) {
  check_sizes("embedding_backward", n, vocab);
  LOOM_CHECK(cols >= 0, "cuda embedding_backward: cols ", cols, " (must be >= 0)");
  if (vocab == 0 || cols == 0) return;
  if (n == 0) {  // no lookups: every row is zero
    LOOM_CUDA_CHECK(
        cudaMemsetAsync(dweight, 0, size_t(vocab) * size_t(cols) * sizeof(float), stream));
    return;
  }
  const Layout l = make_layout(n, vocab);
  LOOM_CHECK(workspace != nullptr && workspace_bytes >= l.total &&
                 reinterpret_cast<uintptr_t>(workspace) % alignof(uint32_t) == 0,
             "cuda embedding_backward: workspace of ", workspace_bytes, " bytes at ", workspace,
             ", needs ", l.total, " bytes, 4-byte aligned (embedding_backward_workspace_bytes(", n,
             ", ", vocab, "))");

  // 1. Keys and positions. See Note [Deterministic CUDA embedding lookup backward].
  auto keys = keys_kernel<I>;
  LOOM_LAUNCH(keys, grid_stride_blocks(n), kBlock, 0, stream, indices, n,
              at<uint32_t>(workspace, l.keys[0]), at<int32_t>(workspace, l.pos[0]));

  // 2. Stable sort by key.
  cub::DoubleBuffer<uint32_t> sorted_keys(at<uint32_t>(workspace, l.keys[0]),
                                          at<uint32_t>(workspace, l.keys[1]));
  cub::DoubleBuffer<int32_t> sorted_pos(at<int32_t>(workspace, l.pos[0]),
                                        at<int32_t>(workspace, l.pos[1]));
  size_t temp_bytes = l.temp_bytes;
  LOOM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(at<void>(workspace, l.temp), temp_bytes,
                                                  sorted_keys, sorted_pos, int(n), 0,
                                                  sort_end_bit(vocab), stream));

  // 3. Every vocabulary row: its run's sum, or zeros.
  const int tx = row_threads(cols), ty = kBlock / tx;
  auto rows = rows_kernel<T>;
  LOOM_LAUNCH(rows, clamp_grid((vocab + ty - 1) / ty), dim3(tx, ty), 0, stream, dout,
              sorted_keys.Current(), sorted_pos.Current(), int32_t(n), vocab, cols, dweight);
}

#define LOOM_EMBEDDING(T, I)                                                                    \
  template void embedding_forward<T, I>(const T*, const I*, T*, int64_t, int64_t, Stream);      \
  template void embedding_backward<T, I>(const T*, const I*, float*, int64_t, int64_t, int64_t, \
                                         void*, size_t, Stream);
LOOM_EMBEDDING(float, int32_t)
LOOM_EMBEDDING(float, int64_t)
LOOM_EMBEDDING(BFloat16, int32_t)
LOOM_EMBEDDING(BFloat16, int64_t)
#undef LOOM_EMBEDDING

}  // namespace loom::kernels::cuda
