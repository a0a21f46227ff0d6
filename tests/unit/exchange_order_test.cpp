// The signature exchange's order across nodes (Note [Node-interleaved exchange order] in
// collectives/topology.h): a permutation of the group's ranks, and a dissemination over it
// crosses between nodes in as few rounds as the closed form says, never in more than over the
// group-rank order. The exchange itself runs in that order across emulated nodes in the cluster
// entries (tests/cluster/run.sh runs collectives_test and debug_test there).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "collectives/topology.h"
#include "core/error.h"

namespace loom::comm {
namespace {

// The rounds of a dissemination over `order` (round k: position p sends to p - 2^k) that have a
// pair of ranks on two nodes: simulated here, apart from the implementation's own count.
int crossing_rounds(const std::vector<int>& node_of, const std::vector<int>& order) {
  const int n = int(order.size());
  int crossing = 0;
  for (int step = 1; step < n; step *= 2) {
    bool crosses = false;
    for (int p = 0; p < n; ++p)
      crosses |=
          node_of[size_t(order[size_t(p)])] != node_of[size_t(order[size_t((p - step + n) % n)])];
    crossing += crosses;
  }
  return crossing;
}

// Node of each rank for N nodes of R ranks, ranks filled node by node (mpirun's --map-by slot).
std::vector<int> by_slot(int nodes, int ranks) {
  std::vector<int> node_of;
  for (int node = 0; node < nodes; ++node) node_of.insert(node_of.end(), size_t(ranks), node);
  return node_of;
}

std::vector<int> identity(int n) {
  std::vector<int> order(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) order[size_t(r)] = r;
  return order;
}

bool is_permutation_of_ranks(std::vector<int> order) {
  std::sort(order.begin(), order.end());
  return order == identity(int(order.size()));
}

TEST(ExchangeOrder, OneNodeKeepsGroupRankOrder) {
  for (int n : {1, 2, 3, 4, 8})
    EXPECT_EQ(exchange_order(std::vector<int>(size_t(n), 0)), identity(n));
}

TEST(ExchangeOrder, PowerOfTwoNodesCrossOnlyInTheirFirstRounds) {
  // N nodes (a power of two) of R ranks: log2 N crossing rounds, against ceil(log2 (N R)) in
  // group-rank order.
  struct Case {
    int nodes, ranks, crossing, crossing_in_rank_order;
  };
  for (const Case& c : {Case{2, 2, 1, 2}, Case{2, 4, 1, 3}, Case{4, 2, 2, 3}, Case{2, 8, 1, 4},
                        Case{4, 4, 2, 4}, Case{8, 2, 3, 4}}) {
    const std::vector<int> node_of = by_slot(c.nodes, c.ranks);
    const std::vector<int> order = exchange_order(node_of);
    SCOPED_TRACE(testing::Message() << c.nodes << " nodes x " << c.ranks << " ranks");
    EXPECT_TRUE(is_permutation_of_ranks(order));
    EXPECT_EQ(crossing_rounds(node_of, order), c.crossing);
    EXPECT_EQ(crossing_rounds(node_of, identity(int(node_of.size()))), c.crossing_in_rank_order);
  }
  // 4 x 2: by index within the node, then node.
  EXPECT_EQ(exchange_order(by_slot(4, 2)), (std::vector<int>{0, 2, 4, 6, 1, 3, 5, 7}));
}

TEST(ExchangeOrder, NeverCrossesInMoreRoundsThanGroupRankOrder) {
  // Unequal nodes and ranks spread over them in any order, including the case where the
  // interleaved order alone would cross more (6 ranks on node 0, 2 on node 1, every fourth).
  const std::vector<int> uneven = {0, 0, 0, 1, 0, 0, 0, 1};
  EXPECT_EQ(exchange_order(uneven), identity(8));
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    const int n = 1 + int(rng() % 24), nodes = 1 + int(rng() % uint32_t(n));
    std::vector<int> node_of(static_cast<size_t>(n));
    for (int& node : node_of) node = int(rng() % uint32_t(nodes));
    // Numbered by first rank, as NodeMap numbers them.
    std::vector<int> first_seen, numbered;
    for (int node : node_of) {
      auto it = std::find(first_seen.begin(), first_seen.end(), node);
      numbered.push_back(int(it - first_seen.begin()));
      if (it == first_seen.end()) first_seen.push_back(node);
    }
    const std::vector<int> order = exchange_order(numbered);
    ASSERT_TRUE(is_permutation_of_ranks(order));
    ASSERT_LE(crossing_rounds(numbered, order), crossing_rounds(numbered, identity(n)));
  }
}

TEST(ExchangeOrder, RefusesANodeOutsideTheGroup) {
  try {
    exchange_order({0, 3, 1});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 is on node 3, outside [0, 3)"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace loom::comm
