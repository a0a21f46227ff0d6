// The reductions a carried collective makes itself (collectives/carried.h): op over every rank's
// block in rank order, against a plain loop that combines them the same way, bit for bit, for
// every op and rank count, with `out` apart from the blocks or one of them. Two ranks of a type
// that is its own accumulator take a one-pass path; the others go through tiles.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "collectives/carried.h"

namespace loom::comm {
namespace {

constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};

template <typename T>
T combine(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return T(a + b);
    case ReduceOp::kMax:
      return b > a ? b : a;
    case ReduceOp::kMin:
      return b < a ? b : a;
  }
  return a;
}

// ((b0 op b1) op b2) ..., then avg's division by n, one element at a time.
template <typename T>
std::vector<T> reference(const std::vector<std::vector<T>>& blocks, ReduceOp op) {
  std::vector<T> out = blocks[0];
  for (size_t j = 1; j < blocks.size(); ++j)
    for (size_t i = 0; i < out.size(); ++i) out[i] = combine(op, out[i], blocks[j][i]);
  if (op == ReduceOp::kAvg)
    for (T& x : out) x = T(x / T(blocks.size()));
  return out;
}

template <typename T>
std::vector<std::vector<T>> random_blocks(int n, int64_t count, std::mt19937& rng) {
  std::vector<std::vector<T>> blocks(size_t(n), std::vector<T>(static_cast<size_t>(count)));
  std::uniform_int_distribution<int> value(-1000, 1000);
  for (auto& b : blocks)
    for (T& x : b) x = std::is_floating_point_v<T> ? T(value(rng)) / T(7) : T(value(rng));
  return blocks;
}

template <typename T>
bool same_bits(const std::vector<T>& a, const T* b) {
  return std::memcmp(a.data(), b, a.size() * sizeof(T)) == 0;
}

template <typename T>
void check_type(DType dtype) {
  std::mt19937 rng(7);
  // Counts around the tiles (2048 elements) and the vector widths.
  for (int n : {1, 2, 3, 5})
    for (int64_t count : {int64_t(1), int64_t(7), int64_t(256), int64_t(2048), int64_t(3001)})
      for (ReduceOp op : kOps) {
        const auto blocks = random_blocks<T>(n, count, rng);
        const std::vector<T> expected = reference(blocks, op);
        std::vector<const void*> by_rank;
        for (const auto& b : blocks) by_rank.push_back(b.data());
        std::vector<T> out(static_cast<size_t>(count));
        reduce_ranks(by_rank.data(), n, dtype, op, count, out.data());
        EXPECT_TRUE(same_bits(expected, out.data()))
            << dtype_name(dtype) << " n " << n << " count " << count << " op " << int(op);
        // In place: `out` is the first or the last rank's block.
        for (int into : {0, n - 1}) {
          auto copies = blocks;
          std::vector<const void*> in_place;
          for (const auto& b : copies) in_place.push_back(b.data());
          reduce_ranks(in_place.data(), n, dtype, op, count, copies[size_t(into)].data());
          EXPECT_TRUE(same_bits(expected, copies[size_t(into)].data()))
              << dtype_name(dtype) << " n " << n << " count " << count << " op " << int(op)
              << " into block " << into;
        }
      }
}

TEST(Carried, ReduceRanksEqualsTheRankOrderLoopF32) { check_type<float>(DType::kF32); }
TEST(Carried, ReduceRanksEqualsTheRankOrderLoopI32) { check_type<int32_t>(DType::kI32); }
TEST(Carried, ReduceRanksEqualsTheRankOrderLoopI64) { check_type<int64_t>(DType::kI64); }

// The exchange's layout: rank j's block at ((position_of[j] - first_position) mod n), elements
// [first, first + count) of each.
TEST(Carried, ReduceInRankOrderReadsEachRanksBlockAtItsPosition) {
  std::mt19937 rng(11);
  const int n = 2;
  const int64_t block = 64, first = 5, count = 50;
  const auto blocks = random_blocks<float>(n, block, rng);
  const int position_of[] = {1, 0};  // rank 0 at position 1, rank 1 at position 0
  for (int first_position : {0, 1}) {
    // Stored by position, rotated by first_position.
    std::vector<float> stored(static_cast<size_t>(n * block));
    for (int j = 0; j < n; ++j) {
      const int at = ((position_of[j] - first_position) % n + n) % n;
      std::memcpy(stored.data() + at * block, blocks[size_t(j)].data(), block * sizeof(float));
    }
    std::vector<std::vector<float>> wanted;
    for (const auto& b : blocks) wanted.emplace_back(b.begin() + first, b.begin() + first + count);
    std::vector<float> out(static_cast<size_t>(count));
    reduce_in_rank_order(stored.data(), block * sizeof(float), n, position_of, first_position,
                         DType::kF32, ReduceOp::kSum, first, count, out.data());
    EXPECT_TRUE(same_bits(reference(wanted, ReduceOp::kSum), out.data()))
        << "first position " << first_position;
  }
}

}  // namespace
}  // namespace loom::comm
