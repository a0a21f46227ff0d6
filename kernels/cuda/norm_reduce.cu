// Sums of squares and global-norm clipping on CUDA. The tensors of a call are cut into chunks of
// kChunk elements; a launch carries up to kMaxTensorsPerLaunch tensors in its parameter block
// (as the multi-tensor optimizer kernels do, see optimizer_update.cu), each block walks chunks,
// and a block finds its chunk's tensor by binary search over the chunk prefix sums.
//
// The one decision that matters: the reduction order depends on the sizes only. Each chunk's sum
// is a fixed tree (thread j adds elements j, j + 256, ... of the chunk in order, then a
// shared-memory tree of halving strides), written to its own slot of the workspace, and one block
// adds the slots in a fixed order. No atomics, nothing that depends on the grid size or the GPU,
// so the f64 result is bit-identical from run to run (and from GPU to GPU).
#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cuda/launch.h"
#include "kernels/cuda/norm_reduce.h"
#include "kernels/cuda/optimizer_update.h"  // kMaxTensorsPerLaunch

namespace loom::kernels::cuda {

namespace {

constexpr int kBlock = kBlockThreads;
constexpr int64_t kChunk = 16 * kBlock;  // elements per chunk (and per partial sum)
constexpr int kMaxTensors = int(kMaxTensorsPerLaunch);

// The tensors of one launch, passed by value as a __grid_constant__ kernel parameter. Tensors
// with n == 0 are never listed, so chunk_begin increases strictly.
struct TensorList {
  float* ptr[kMaxTensors];
  int64_t n[kMaxTensors];
  int64_t chunk_begin[kMaxTensors + 1];  // chunks of the tensors before t; [count] = all
  int count;
};
static_assert(sizeof(TensorList) + 2 * sizeof(double) <= 4096, "launch parameters > 4 KB");

int64_t chunks_of(int64_t n) { return (n + kChunk - 1) / kChunk; }

__device__ inline int tensor_of_chunk(const TensorList& list, int64_t chunk) {
  int lo = 0, hi = list.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (list.chunk_begin[mid] <= chunk)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Sums v over the block (kBlock threads, all of which must call) in a fixed tree; every thread
// gets the total. The caller syncs before reusing buf.
__device__ double block_sum(double* buf, double v) {
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int s = kBlock / 2; s > 0; s >>= 1) {
    if (int(threadIdx.x) < s) buf[threadIdx.x] = __dadd_rn(buf[threadIdx.x], buf[threadIdx.x + s]);
    __syncthreads();
  }
  return buf[0];
}

// partial[c] = sum of squares of chunk c of this launch's tensors.
__global__ void __launch_bounds__(kBlock)
    sum_of_squares_chunks_kernel(const __grid_constant__ TensorList list, double* partial) {
  __shared__ double buf[kBlock];
  const int64_t chunks = list.chunk_begin[list.count];
  for (int64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    const int t = tensor_of_chunk(list, chunk);
    const float* x = list.ptr[t];
    const int64_t begin = (chunk - list.chunk_begin[t]) * kChunk;
    const int64_t end = min(begin + kChunk, list.n[t]);
    double acc = 0.0;
    for (int64_t i = begin + threadIdx.x; i < end; i += kBlock) {
      const double v = double(x[i]);
      acc = __dadd_rn(acc, v * v);  // the square of an f32 is exact in f64
    }
    const double total = block_sum(buf, acc);
    if (threadIdx.x == 0) partial[chunk] = total;
    __syncthreads();  // buf is reused by the next chunk
  }
}

// *out = partial[0] + ... + partial[count - 1] in a fixed tree; one block.
__global__ void __launch_bounds__(kBlock)
    sum_partials_kernel(const double* partial, int64_t count, double* out) {
  __shared__ double buf[kBlock];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += kBlock) acc = __dadd_rn(acc, partial[i]);
  const double total = block_sum(buf, acc);
  if (threadIdx.x == 0) *out = total;
}

// optim::scale_grads_to_norm (optimizer/clip_grad.cpp) with norm = sqrt(*sum_sq): the same f64
// operations (IEEE-rounded here, as on the host) and the same f32 multiply.
__global__ void __launch_bounds__(kBlock)
    clip_kernel(const __grid_constant__ TensorList list, const double* sum_sq, double max_norm) {
  const double norm = __dsqrt_rn(*sum_sq);
  const double coef = __ddiv_rn(max_norm, __dadd_rn(norm, 1e-6));
  if (!isfinite(norm) || !(coef < 1.0)) return;  // the same for every block: nothing is scaled
  const float s = __double2float_rn(coef);
  const int64_t chunks = list.chunk_begin[list.count];
  for (int64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    const int t = tensor_of_chunk(list, chunk);
    float* x = list.ptr[t];
    const int64_t begin = (chunk - list.chunk_begin[t]) * kChunk;
    const int64_t end = min(begin + kChunk, list.n[t]);
    for (int64_t i = begin + threadIdx.x; i < end; i += kBlock) x[i] = __fmul_rn(x[i], s);
  }
}

unsigned grid_for(int64_t chunks) {
  return unsigned(std::min<int64_t>(chunks, int64_t(kMaxGridBlocks)));
}

std::string arg_name(bool multi, const char* array, int64_t i, const char* single) {
  return multi ? ::loom::detail::str_cat(array, "[", i, "]") : std::string(single);
}

// Checks the host arrays and every tensor; returns the total number of chunks. P is const
// float* (sums) or float* (clipping).
template <typename P>
int64_t check_tensors(const char* op, bool multi, const P* tensors, const int64_t* sizes,
                      int64_t count) {
  LOOM_CHECK(count >= 0, "cuda ", op, ": count = ", count, " is negative");
  LOOM_CHECK(count == 0 || (tensors != nullptr && sizes != nullptr), "cuda ", op,
             ": tensors or sizes is null for count = ", count);
  int64_t chunks = 0;
  for (int64_t i = 0; i < count; ++i) {
    LOOM_CHECK(sizes[i] >= 0, "cuda ", op, ": ", arg_name(multi, "sizes", i, "n"), " = ", sizes[i],
               " is negative");
    LOOM_CHECK(sizes[i] == 0 || tensors[i] != nullptr, "cuda ", op, ": ",
               arg_name(multi, "tensors", i, "x"), " is null for ", sizes[i], " elements");
    chunks += chunks_of(sizes[i]);
  }
  return chunks;
}

// Packs the non-empty tensors into TensorLists of up to kMaxTensors and calls launch(list).
template <typename P, typename Launch>
void for_each_launch(const P* tensors, const int64_t* sizes, int64_t count, Launch launch) {
  TensorList list{};
  for (int64_t i = 0; i < count; ++i) {
    if (sizes[i] == 0) continue;
    const int t = list.count;
    list.ptr[t] = const_cast<float*>(tensors[i]);  // only clip_kernel writes
    list.n[t] = sizes[i];
    list.chunk_begin[t + 1] = list.chunk_begin[t] + chunks_of(sizes[i]);
    if (++list.count == kMaxTensors) {
      launch(list);
      list.count = 0;  // chunk_begin[0] stays 0; the rest is rewritten before it is read
    }
  }
  if (list.count > 0) launch(list);
}

void sum_of_squares_impl(const char* op, bool multi, const float* const* tensors,
                         const int64_t* sizes, int64_t count, double* out, void* workspace,
                         size_t workspace_bytes, Stream stream) {
  const int64_t chunks = check_tensors(op, multi, tensors, sizes, count);
  LOOM_CHECK(out != nullptr, "cuda ", op, ": out is null");
  const size_t needed = size_t(chunks) * sizeof(double);
  LOOM_CHECK(workspace_bytes >= needed, "cuda ", op, ": workspace of ", workspace_bytes,
             " bytes is too small, needs ", needed, " (", op, "_workspace_bytes)");
  if (chunks == 0) {  // nothing to launch: the sum of nothing is +0.0, all bits zero
    LOOM_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), stream));
    return;
  }
  LOOM_CHECK(workspace != nullptr, "cuda ", op, ": workspace is null, needs ", needed, " bytes");
  LOOM_CHECK(reinterpret_cast<uintptr_t>(workspace) % alignof(double) == 0, "cuda ", op,
             ": workspace ", workspace, " is not 8-byte aligned");
  double* partial = static_cast<double*>(workspace);
  int64_t base = 0;  // partial sums of the earlier launches
  for_each_launch(tensors, sizes, count, [&](const TensorList& list) {
    const int64_t launch_chunks = list.chunk_begin[list.count];
    LOOM_LAUNCH(sum_of_squares_chunks_kernel, grid_for(launch_chunks), kBlock, 0, stream, list,
                partial + base);
    base += launch_chunks;
  });
  LOOM_ASSERT(base == chunks);
  LOOM_LAUNCH(sum_partials_kernel, 1, kBlock, 0, stream, partial, chunks, out);
}

}  // namespace

size_t sum_of_squares_workspace_bytes(int64_t n) {
  LOOM_CHECK(n >= 0, "cuda sum_of_squares_workspace_bytes: n = ", n, " is negative");
  return size_t(chunks_of(n)) * sizeof(double);
}

void sum_of_squares(const float* x, int64_t n, double* out, void* workspace, size_t workspace_bytes,
                    Stream stream) {
  const float* const tensors[1] = {x};
  sum_of_squares_impl("sum_of_squares", false, tensors, &n, 1, out, workspace, workspace_bytes,
                      stream);
}

size_t sum_of_squares_multi_workspace_bytes(const int64_t* sizes, int64_t count) {
  LOOM_CHECK(count >= 0, "cuda sum_of_squares_multi_workspace_bytes: count = ", count,
             " is negative");
  LOOM_CHECK(count == 0 || sizes != nullptr,
             "cuda sum_of_squares_multi_workspace_bytes: sizes is null for count = ", count);
  int64_t chunks = 0;
  for (int64_t i = 0; i < count; ++i) {
    LOOM_CHECK(sizes[i] >= 0, "cuda sum_of_squares_multi_workspace_bytes: sizes[", i,
               "] = ", sizes[i], " is negative");
    chunks += chunks_of(sizes[i]);
  }
  return size_t(chunks) * sizeof(double);
}

void sum_of_squares_multi(const float* const* tensors, const int64_t* sizes, int64_t count,
                          double* out, void* workspace, size_t workspace_bytes, Stream stream) {
  sum_of_squares_impl("sum_of_squares_multi", true, tensors, sizes, count, out, workspace,
                      workspace_bytes, stream);
}

void clip_by_global_norm(float* const* tensors, const int64_t* sizes, int64_t count,
                         const double* sum_sq, double max_norm, Stream stream) {
  const char* op = "clip_by_global_norm";
  LOOM_CHECK(max_norm > 0.0, "cuda ", op, ": max_norm must be > 0, got ", max_norm);
  LOOM_CHECK(sum_sq != nullptr, "cuda ", op, ": sum_sq is null");
  check_tensors(op, true, tensors, sizes, count);
  for_each_launch(tensors, sizes, count, [&](const TensorList& list) {
    LOOM_LAUNCH(clip_kernel, grid_for(list.chunk_begin[list.count]), kBlock, 0, stream, list,
                sum_sq, max_norm);
  });
}

}  // namespace loom::kernels::cuda
