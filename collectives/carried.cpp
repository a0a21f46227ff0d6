#include "collectives/carried.h"

#include <algorithm>
#include <cstring>
#include <functional>
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

// Whether out[i] = combine(a[i], b[i]) can be written straight into `out`: each element is read
// before it is written, so `out` may be either block itself, but not a shifted part of one.
template <typename T>
bool writes_in_one_pass(const T* a, const T* b, int64_t count, const T* out) {
  const std::less<const T*> below;  // a total order, also between unrelated buffers
  auto clear = [&](const T* block) {
    return block == out || !below(out, block + count) || !below(block, out + count);
  };
  return clear(a) && clear(b);
}

// Two ranks, the element type its own accumulator (f32, i32, i64): one pass, with no tile
// copied in and out (those two copies were most of a carried 1 KiB allreduce's reduction).
// The same operations in the same order as the tiles', so the same bits.
template <typename T>
void reduce_two(const T* a, const T* b, ReduceOp op, int64_t count, T* out) {
  auto each = [&](auto&& combine) {
    for (int64_t i = 0; i < count; ++i) out[i] = combine(a[i], b[i]);
  };
  switch (op) {
    case ReduceOp::kSum:
      return each([](T x, T y) { return T(x + y); });
    case ReduceOp::kAvg:  // as reduce_blocks: the sum, then divided by the rank count
      return each([](T x, T y) { return T(T(x + y) / T(2)); });
    case ReduceOp::kMax:
      return each([](T x, T y) { return y > x ? y : x; });
    case ReduceOp::kMin:
      return each([](T x, T y) { return y < x ? y : x; });
  }
}

// Acc: the type the reduction runs in (f32 for the 16-bit floats); T: the stored type. The result
// is combined a tile at a time in an accumulator on the stack and then stored: no allocation (a
// carried collective is small, and a scratch allocation was a visible part of its time), and
// `out` may alias a block (each tile is read whole before it is written).
template <typename T, typename Acc>
void reduce_blocks(const T* const* by_rank, int n, ReduceOp op, int64_t count, T* out) {
  if constexpr (std::is_same_v<T, Acc>) {
    if (n == 2 && writes_in_one_pass(by_rank[0], by_rank[1], count, out))
      return reduce_two(by_rank[0], by_rank[1], op, count, out);
  }
  constexpr int64_t kTile = 2048;
  Acc acc[kTile];
  for (int64_t at = 0; at < count; at += kTile) {
    const int64_t m = std::min(kTile, count - at);
    const T* b0 = by_rank[0] + at;
    for (int64_t i = 0; i < m; ++i) acc[i] = kernels::cpu::convert_scalar<Acc>(b0[i]);
    for (int j = 1; j < n; ++j) combine_block(op, by_rank[j] + at, m, acc);
    if (op == ReduceOp::kAvg) {
      // As the MPI backend's divide(): f32 divides by float(n), integers truncate toward zero.
      for (int64_t i = 0; i < m; ++i)
        acc[i] = std::is_floating_point_v<Acc> ? acc[i] / Acc(n) : acc[i] / n;
    }
    for (int64_t i = 0; i < m; ++i) out[at + i] = kernels::cpu::convert_scalar<T>(acc[i]);
  }
}

template <typename T, typename Acc>
void reduce_typed(const void* const* by_rank, int n, ReduceOp op, int64_t count, void* out) {
  reduce_blocks<T, Acc>(reinterpret_cast<const T* const*>(by_rank), n, op, count,
                        static_cast<T*>(out));
}

}  // namespace

void reduce_ranks(const void* const* by_rank, int n, DType dtype, ReduceOp op, int64_t count,
                  void* out) {
  LOOM_ASSERT(n > 0 && count >= 0, "reduce_ranks: ", n, " ranks, ", count, " elements");
  if (count == 0) return;
  switch (dtype) {
    case DType::kF32:
      return reduce_typed<float, float>(by_rank, n, op, count, out);
    case DType::kBF16:
      return reduce_typed<BFloat16, float>(by_rank, n, op, count, out);
    case DType::kF16:
      return reduce_typed<Float16, float>(by_rank, n, op, count, out);
    case DType::kI32:
      return reduce_typed<int32_t, int32_t>(by_rank, n, op, count, out);
    case DType::kI64:
      return reduce_typed<int64_t, int64_t>(by_rank, n, op, count, out);
    case DType::kU8:
    case DType::kBool:
      break;
  }
  LOOM_ASSERT(false, "reduce_ranks on ", dtype_name(dtype));
}

void reduce_in_rank_order(const void* blocks, size_t block_bytes, int n, const int* position_of,
                          int first_position, DType dtype, ReduceOp op, int64_t first,
                          int64_t count, void* out) {
  LOOM_ASSERT(
      n > 0 && count >= 0 && (first + count) * int64_t(dtype_size(dtype)) <= int64_t(block_bytes),
      "reduce_in_rank_order: elements [", first, ", ", first + count, ") outside a block of ",
      block_bytes, " bytes");
  const auto* b = static_cast<const char*>(blocks);
  const int64_t offset = first * int64_t(dtype_size(dtype));
  constexpr int kOnStack = 64;
  const void* on_stack[kOnStack];
  std::vector<const void*> on_heap;
  const void** by_rank = on_stack;
  if (n > kOnStack) {
    on_heap.resize(size_t(n));
    by_rank = on_heap.data();
  }
  for (int j = 0; j < n; ++j) {
    const int at = ((position_of ? position_of[j] : j) - first_position) % n;
    by_rank[j] = b + int64_t(at < 0 ? at + n : at) * int64_t(block_bytes) + offset;
  }
  reduce_ranks(by_rank, n, dtype, op, count, out);
}

}  // namespace loom::comm
