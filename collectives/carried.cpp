#include "collectives/carried.h"

#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/copy.h"

namespace loom::comm {

namespace {

// acc[i] = combine(acc[i], x[i]) for i < count, with op's combine. The op is chosen once per
// block, not per element, so that the loops vectorise.
template <typename Acc, typename T>
void combine_block(ReduceOp op, const T* x, int64_t count, Acc* acc) {
  auto each = [&](auto&& combine) {
    for (int64_t i = 0; i < count; ++i)
      acc[i] = combine(acc[i], kernels::cpu::convert_scalar<Acc>(x[i]));
  };
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return each([](Acc a, Acc b) { return a + b; });
    case ReduceOp::kMax:
      return each([](Acc a, Acc b) { return b > a ? b : a; });
    case ReduceOp::kMin:
      return each([](Acc a, Acc b) { return b < a ? b : a; });
  }
}

// Acc: the type the reduction runs in (f32 for the 16-bit floats); T: the stored type. When they
// are the same the reduction runs in out itself (gathered is the check's own buffer, never out):
// a carried collective is small, and a scratch allocation was a visible part of its time.
template <typename T, typename Acc>
void reduce_blocks(const char* gathered, int n, int64_t block_bytes, ReduceOp op, int64_t first,
                   int64_t count, T* out) {
  if (count == 0) return;
  std::vector<Acc> scratch;
  Acc* acc = nullptr;
  if constexpr (std::is_same_v<T, Acc>) {
    acc = out;
  } else {
    scratch.resize(static_cast<size_t>(count));
    acc = scratch.data();
  }
  auto block = [&](int j) {
    return reinterpret_cast<const T*>(gathered + j * block_bytes) + first;
  };
  const T* b0 = block(0);
  for (int64_t i = 0; i < count; ++i) acc[i] = kernels::cpu::convert_scalar<Acc>(b0[i]);
  for (int j = 1; j < n; ++j) combine_block(op, block(j), count, acc);
  if (op == ReduceOp::kAvg) {
    // As the MPI backend's divide(): f32 divides by float(n), integers truncate toward zero.
    for (int64_t i = 0; i < count; ++i)
      acc[i] = std::is_floating_point_v<Acc> ? acc[i] / Acc(n) : acc[i] / n;
  }
  if constexpr (!std::is_same_v<T, Acc>)
    for (int64_t i = 0; i < count; ++i) out[i] = kernels::cpu::convert_scalar<T>(acc[i]);
}

}  // namespace

void reduce_in_rank_order(const void* gathered, size_t block_size, int n, DType dtype,
                          ReduceOp op, int64_t first, const Tensor& out) {
  LOOM_ASSERT(n > 0 && out.is_contiguous() && out.dtype() == dtype && out.device().is_cpu(),
              "reduce_in_rank_order of ", n, " blocks into ", out.str());
  const auto block_bytes = int64_t(block_size);
  LOOM_ASSERT((first + out.numel()) * int64_t(dtype_size(dtype)) <= block_bytes,
              "reduce_in_rank_order: elements [", first, ", ", first + out.numel(),
              ") outside a block of ", block_bytes, " bytes");
  const auto* g = static_cast<const char*>(gathered);
  const int64_t count = out.numel();
  switch (dtype) {
    case DType::kF32:
      return reduce_blocks<float, float>(g, n, block_bytes, op, first, count, out.data<float>());
    case DType::kBF16:
      return reduce_blocks<BFloat16, float>(g, n, block_bytes, op, first, count,
                                            out.data<BFloat16>());
    case DType::kF16:
      return reduce_blocks<Float16, float>(g, n, block_bytes, op, first, count,
                                           out.data<Float16>());
    case DType::kI32:
      return reduce_blocks<int32_t, int32_t>(g, n, block_bytes, op, first, count,
                                             out.data<int32_t>());
    case DType::kI64:
      return reduce_blocks<int64_t, int64_t>(g, n, block_bytes, op, first, count,
                                             out.data<int64_t>());
    case DType::kU8:
    case DType::kBool:
      break;
  }
  LOOM_ASSERT(false, "reduce_in_rank_order on ", dtype_name(dtype));
}

}  // namespace loom::comm
