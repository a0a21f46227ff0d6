// Hierarchical collectives (collectives/hierarchical.h) against the flat ones on the same data:
// the nodes of one host given explicitly (consecutive ranks in pairs or fours), and the real
// nodes of the emulated cluster (tests/cluster/run.sh). Integer sums, max, min and all-gathers
// are exact; f32 sums within rounding (the sums are associated node first).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "collectives/hierarchical.h"
#include "core/ops.h"

namespace loom::comm {
namespace {

// Element i of rank r's input: distinct per rank and element, exact in f32 and i64.
Tensor input_of(int rank, int64_t n, DType dtype) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[size_t(i)] = float((rank * 7919 + i * 104729) % 2001 - 1000) / 8;
  return Tensor::from_vector(v, {n}).to(dtype);
}

void expect_close(const Tensor& got, const Tensor& want, double rtol, const char* what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<float> g = got.to(DType::kF32).to_vector<float>();
  const std::vector<float> w = want.to(DType::kF32).to_vector<float>();
  int bad = 0;
  for (size_t i = 0; i < g.size(); ++i)
    if (!(std::fabs(g[i] - w[i]) <= rtol * std::max(1.0f, std::fabs(w[i]))) && bad++ < 3)
      ADD_FAILURE() << what << "[" << i << "]: " << g[i] << " vs flat " << w[i];
}

// Every collective of `h` against the flat call on `world`.
void check_against_flat(Hierarchy& h, Communicator& world) {
  for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t(1000)}) {
    SCOPED_TRACE(::testing::Message() << n << " elements");
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kAvg}) {
      Tensor flat = input_of(world.rank(), n, DType::kF32), hier = flat.clone();
      world.allreduce(flat, {op})->wait();
      h.allreduce(hier, op)->wait();
      // f32 sums: the same terms summed node first. max and min are exact.
      expect_close(hier, flat, op == ReduceOp::kMax || op == ReduceOp::kMin ? 0 : 1e-6,
                   "allreduce f32");
    }
    Tensor flat = input_of(world.rank(), n, DType::kI64), hier = flat.clone();
    world.allreduce(flat)->wait();
    h.allreduce(hier)->wait();
    EXPECT_EQ(hier.to_vector<int64_t>(), flat.to_vector<int64_t>()) << "allreduce i64 sum";

    const int size = world.size();
    Tensor in = input_of(world.rank(), n * size, DType::kF32);
    Tensor flat_rs = Tensor::empty({n}), hier_rs = Tensor::empty({n});
    world.reduce_scatter(in, flat_rs)->wait();
    h.reduce_scatter(in, hier_rs)->wait();
    expect_close(hier_rs, flat_rs, 1e-6, "reduce_scatter");
    Tensor in_i = input_of(world.rank(), n * size, DType::kI64);
    Tensor flat_ri = Tensor::empty({n}, DType::kI64), hier_ri = Tensor::empty({n}, DType::kI64);
    world.reduce_scatter(in_i, flat_ri, {ReduceOp::kMax})->wait();
    h.reduce_scatter(in_i, hier_ri, ReduceOp::kMax)->wait();
    EXPECT_EQ(hier_ri.to_vector<int64_t>(), flat_ri.to_vector<int64_t>()) << "reduce_scatter max";

    Tensor send = input_of(world.rank(), n * size, DType::kF32);
    Tensor flat_a2a = Tensor::empty({n * size}), hier_a2a = Tensor::empty({n * size});
    world.all_to_all(send, flat_a2a)->wait();
    h.all_to_all(send, hier_a2a)->wait();
    EXPECT_EQ(hier_a2a.to_vector<float>(), flat_a2a.to_vector<float>()) << "all_to_all";

    Tensor mine = input_of(world.rank(), n, DType::kF32);
    Tensor flat_ag = Tensor::empty({n * size}), hier_ag = Tensor::empty({n * size});
    world.allgather(mine, flat_ag)->wait();
    h.allgather(mine, hier_ag)->wait();
    EXPECT_EQ(hier_ag.to_vector<float>(), flat_ag.to_vector<float>()) << "allgather";
  }
}

TEST(Hierarchy, EqualsTheFlatCollectivesOnNodesOfOneHost) {
  auto world = comm::world();
  const int n = world->size();
  for (int local : {2, 4}) {
    if (n % local != 0) continue;
    std::vector<int> nodes;
    for (int r = 0; r < n; ++r) nodes.push_back(r / local);
    Hierarchy h(world, nodes);
    SCOPED_TRACE(h.str());
    EXPECT_EQ(h.applies(), n / local > 1);
    if (!h.applies()) continue;
    EXPECT_EQ(h.ranks_per_node(), local);
    EXPECT_EQ(h.nodes(), n / local);
    EXPECT_EQ(h.intra().size(), local);
    EXPECT_EQ(h.inter().size(), n / local);
    check_against_flat(h, *world);
  }
}

TEST(Hierarchy, UnevenOrInterleavedNodesStayFlat) {
  auto world = comm::world();
  const int n = world->size();
  if (n < 3) GTEST_SKIP() << "needs 3 ranks or more";
  std::vector<int> uneven(static_cast<size_t>(n), 1);
  uneven[0] = 0;  // one rank alone on node 0, the rest on node 1
  Hierarchy a(world, uneven);
  EXPECT_FALSE(a.applies());
  EXPECT_NE(a.str().find("not spread evenly"), std::string::npos) << a.str();
  if (n % 2 == 0) {
    std::vector<int> interleaved;
    for (int r = 0; r < n; ++r) interleaved.push_back(r % 2);  // round-robin placement
    Hierarchy b(world, interleaved);
    EXPECT_FALSE(b.applies());
  }
  Tensor t = Tensor::ones({4});
  try {
    a.allreduce(t)->wait();
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Hierarchy::allreduce on"), std::string::npos);
  }
}

// The real nodes: one host is one node (flat); the emulated cluster's nodes, by host name.
TEST(Hierarchy, OnTheNodesTheRanksRunOn) {
  auto world = comm::world();
  Hierarchy h(world);
  SCOPED_TRACE(h.str());
  const NodeMap map = node_map(*world);
  EXPECT_EQ(h.nodes(), map.nodes());
  if (h.applies()) check_against_flat(h, *world);
}

}  // namespace
}  // namespace loom::comm
