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
// are the same the reduction runs in out itself (the blocks are the exchange's own buffer, never
// out): a carried collective is small, and a scratch allocation was a visible part of its time.
template <typename T, typename Acc>
void reduce_blocks(const char* blocks, int64_t block_bytes, int n, int first_rank, ReduceOp op,
                   int64_t first, int64_t count, T* out) {
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
    const int at = ((j - first_rank) % n + n) % n;
    return reinterpret_cast<const T*>(blocks + at * block_bytes) + first;
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

void reduce_in_rank_order(const void* blocks, size_t block_bytes, int n, int first_rank,
                          DType dtype, ReduceOp op, int64_t first, int64_t count, void* out) {
  LOOM_ASSERT(
      n > 0 && count >= 0 && (first + count) * int64_t(dtype_size(dtype)) <= int64_t(block_bytes),
      "reduce_in_rank_order: elements [", first, ", ", first + count, ") outside a block of ",
      block_bytes, " bytes");
  const auto* b = static_cast<const char*>(blocks);
  const auto bb = int64_t(block_bytes);
  switch (dtype) {
    case DType::kF32:
      return reduce_blocks<float, float>(b, bb, n, first_rank, op, first, count,
                                         static_cast<float*>(out));
    case DType::kBF16:
      return reduce_blocks<BFloat16, float>(b, bb, n, first_rank, op, first, count,
                                            static_cast<BFloat16*>(out));
    case DType::kF16:
      return reduce_blocks<Float16, float>(b, bb, n, first_rank, op, first, count,
                                           static_cast<Float16*>(out));
    case DType::kI32:
      return reduce_blocks<int32_t, int32_t>(b, bb, n, first_rank, op, first, count,
                                             static_cast<int32_t*>(out));
    case DType::kI64:
      return reduce_blocks<int64_t, int64_t>(b, bb, n, first_rank, op, first, count,
                                             static_cast<int64_t*>(out));
    case DType::kU8:
    case DType::kBool:
      break;
  }
  LOOM_ASSERT(false, "reduce_in_rank_order on ", dtype_name(dtype));
}

}  // namespace loom::comm
