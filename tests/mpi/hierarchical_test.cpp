// Hierarchical collectives (collectives/hierarchical.h) against the flat ones on the same data:
// the nodes of one host given explicitly (consecutive ranks in pairs or fours), and the real
// nodes of the emulated cluster (tests/cluster/run.sh). Integer sums, max, min and all-gathers
// are exact; f32 sums within rounding (the sums are associated node first).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "collectives/algorithm.h"
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
    // Out of place (n a multiple of the node's ranks: straight from the input into the output).
    const Tensor in_ar = input_of(world.rank(), n, DType::kI64);
    Tensor out_ar = Tensor::empty({n}, DType::kI64);
    h.allreduce(in_ar, out_ar)->wait();
    EXPECT_EQ(out_ar.to_vector<int64_t>(), flat.to_vector<int64_t>()) << "allreduce out of place";
    EXPECT_EQ(in_ar.to_vector<int64_t>(),
              input_of(world.rank(), n, DType::kI64).to_vector<int64_t>())
        << "allreduce out of place leaves its input";

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

    // Variable splits, zeros among them: rank src sends (src * 3 + dst * 5 + n) % 4 elements
    // to dst (times n / 7 + 1, so the larger sizes move more).
    auto split = [&](int src, int dst) { return ((src * 3 + dst * 5 + n) % 4) * (n / 7 + 1); };
    AllToAllOptions v;
    for (int r = 0; r < size; ++r) {
      v.input_splits.push_back(split(world.rank(), r));
      v.output_splits.push_back(split(r, world.rank()));
    }
    int64_t sent = 0, received = 0;
    for (int r = 0; r < size; ++r)
      sent += v.input_splits[size_t(r)], received += v.output_splits[size_t(r)];
    Tensor vin = input_of(world.rank(), sent, DType::kI64);
    Tensor flat_v = Tensor::empty({received}, DType::kI64),
           hier_v = Tensor::empty({received}, DType::kI64);
    world.all_to_all(vin, flat_v, v)->wait();
    h.all_to_all(vin, hier_v, v)->wait();
    EXPECT_EQ(hier_v.to_vector<int64_t>(), flat_v.to_vector<int64_t>()) << "all_to_all(v)";
  }
}

// The same calls through a Communicator set to route them (every call of each op on `routed`
// goes hierarchical when `all_hierarchical`): results as the flat ones, counted as the group's.
void check_routed(Communicator& routed, Communicator& world, bool all_hierarchical) {
  const uint64_t before = routed.op_count("allreduce");
  const uint64_t node_rs = routed.hierarchy()->intra().op_count("reduce_scatter");
  const int size = world.size();
  for (int64_t n : {int64_t(3), int64_t(5000)}) {
    SCOPED_TRACE(::testing::Message() << n << " elements");
    Tensor flat = input_of(world.rank(), n, DType::kF32), hier = flat.clone();
    world.allreduce(flat, {ReduceOp::kAvg})->wait();
    routed.allreduce(hier, {ReduceOp::kAvg})->wait();
    expect_close(hier, flat, 1e-6, "routed allreduce avg");
    Tensor in = input_of(world.rank(), n * size, DType::kF32);
    Tensor flat_rs = Tensor::empty({n}), hier_rs = Tensor::empty({n});
    world.reduce_scatter(in, flat_rs)->wait();
    routed.reduce_scatter(in, hier_rs)->wait();
    expect_close(hier_rs, flat_rs, 1e-6, "routed reduce_scatter");
    Tensor mine = input_of(world.rank(), n, DType::kI32);
    Tensor flat_ag = Tensor::empty({n * size}, DType::kI32), hier_ag = flat_ag.clone();
    world.allgather(mine, flat_ag)->wait();
    routed.allgather(mine, hier_ag)->wait();
    EXPECT_EQ(hier_ag.to_vector<int32_t>(), flat_ag.to_vector<int32_t>()) << "routed allgather";
    AllToAllOptions v;
    for (int r = 0; r < size; ++r) {
      v.input_splits.push_back((world.rank() + r) % 3 * n);
      v.output_splits.push_back((r + world.rank()) % 3 * n);
    }
    int64_t total = 0;
    for (int64_t x : v.input_splits) total += x;
    Tensor vin = input_of(world.rank(), total, DType::kF32);
    Tensor flat_v = Tensor::empty({total}), hier_v = Tensor::empty({total});
    world.all_to_all(vin, flat_v, v)->wait();
    routed.all_to_all(vin, hier_v, v)->wait();
    EXPECT_EQ(hier_v.to_vector<float>(), flat_v.to_vector<float>()) << "routed all_to_all(v)";
  }
  // Each call is the group's, whichever way it ran.
  EXPECT_EQ(routed.op_count("allreduce"), before + 2);
  if (all_hierarchical)
    EXPECT_EQ(routed.hierarchy()->intra().op_count("reduce_scatter"),
              node_rs + 2 + 2 * routed.hierarchy()->nodes())
        << "each allreduce begins with one reduce-scatter inside the node, each reduce_scatter "
           "with one per node's slice";
}

TEST(Hierarchy, EqualsTheFlatCollectivesOnNodesOfOneHost) {
  auto world = comm::world();
  const int n = world->size();
  // Allreduces whole (the sizes here are under a piece) and in pieces of 16 bytes: up to
  // kMaxAllreducePieces, the last one shorter, staged and not.
  for (auto [local, piece] : {std::pair<int, size_t>{2, kAllreducePieceBytes},
                              {2, 16},
                              {4, kAllreducePieceBytes},
                              {4, 16}}) {
    if (n % local != 0) continue;
    std::vector<int> nodes;
    for (int r = 0; r < n; ++r) nodes.push_back(r / local);
    Hierarchy h(world, nodes);
    h.set_piece_bytes(piece);
    SCOPED_TRACE(h.str() + ", pieces of " + std::to_string(piece) + " bytes");
    EXPECT_EQ(h.applies(), n / local > 1);
    if (!h.applies()) continue;
    EXPECT_EQ(h.ranks_per_node(), local);
    EXPECT_EQ(h.nodes(), n / local);
    EXPECT_EQ(h.intra().size(), local);
    EXPECT_EQ(h.inter().size(), n / local);
    check_against_flat(h, *world);
  }
}

// Note [Pipelined two-level allreduce]: a large allreduce runs as pieces, each its three steps,
// pieces in flight together on the two levels; every element as the flat call's. The same for
// reduce-scatters and all-gathers.
TEST(Hierarchy, LargeCallsRunInPieces) {
  auto world = comm::world();
  const int n = world->size();
  if (n < 4 || n % 2 != 0) GTEST_SKIP() << "needs 2 nodes of 2 ranks or more";
  std::vector<int> nodes;
  for (int r = 0; r < n; ++r) nodes.push_back(r / 2);
  Hierarchy h(world, nodes);
  EXPECT_EQ(h.piece_bytes(), kAllreducePieceBytes);
  EXPECT_EQ(allreduce_pieces(0, kAllreducePieceBytes), 1);
  EXPECT_EQ(allreduce_pieces(kAllreducePieceBytes, kAllreducePieceBytes), 1);
  EXPECT_EQ(allreduce_pieces(kAllreducePieceBytes + 1, kAllreducePieceBytes), 2);
  EXPECT_EQ(allreduce_pieces(size_t(1) << 30, kAllreducePieceBytes), kMaxAllreducePieces);
  EXPECT_EQ(allreduce_pieces(size_t(1) << 30, 0), 1);
  // 3 MiB + 8 bytes of f32 in pieces of 1 MiB: 4 pieces (a little over 3 of 1 MiB), the last 3
  // elements shorter.
  static_assert(kMaxAllreducePieces >= 4);
  h.set_piece_bytes(size_t(1) << 20);
  const int64_t count = (int64_t(3) << 18) + 2;
  const uint64_t rs = h.intra().op_count("reduce_scatter"), ag = h.intra().op_count("allgather");
  const uint64_t ar = h.inter().op_count("allreduce");
  Tensor flat = input_of(world->rank(), count, DType::kF32), hier = flat.clone();
  world->allreduce(flat)->wait();
  h.allreduce(hier)->wait();
  expect_close(hier, flat, 1e-6, "allreduce in pieces");
  EXPECT_EQ(h.intra().op_count("reduce_scatter") - rs, 4u);
  EXPECT_EQ(h.inter().op_count("allreduce") - ar, 4u);
  EXPECT_EQ(h.intra().op_count("allgather") - ag, 4u);
  // Integer sums exact, in place and out of place, with another call in flight beside it.
  Tensor big = input_of(world->rank(), count, DType::kI64), want = big.clone();
  world->allreduce(want)->wait();
  const Tensor in = big.clone();
  Tensor out = Tensor::empty({count}, DType::kI64);
  WorkPtr first = h.allreduce(big), second = h.allreduce(in, out);
  (world->rank() % 2 == 0 ? first : second)->wait();
  (world->rank() % 2 == 0 ? second : first)->wait();
  EXPECT_EQ(big.to_vector<int64_t>(), want.to_vector<int64_t>()) << "in place";
  EXPECT_EQ(out.to_vector<int64_t>(), want.to_vector<int64_t>()) << "out of place";

  // Note [Two-level reduce-scatters and all-gathers in pieces]: with pieces of 64 KiB, a
  // reduce-scatter of 20001 elements per rank and an all-gather of as many run as 4 pieces
  // (the last 3 elements shorter), one call of each level per piece.
  h.set_piece_bytes(size_t(64) << 10);
  const int64_t c = 20001;
  const uint64_t node_rs = h.intra().op_count("reduce_scatter");
  const uint64_t across_rs = h.inter().op_count("reduce_scatter");
  Tensor scatter_in = input_of(world->rank(), c * n, DType::kF32);
  Tensor flat_rs = Tensor::empty({c}), hier_rs = Tensor::empty({c});
  world->reduce_scatter(scatter_in, flat_rs)->wait();
  h.reduce_scatter(scatter_in, hier_rs)->wait();
  expect_close(hier_rs, flat_rs, 1e-6, "reduce_scatter in pieces");
  EXPECT_EQ(h.intra().op_count("reduce_scatter") - node_rs, 4u);
  EXPECT_EQ(h.inter().op_count("reduce_scatter") - across_rs, 4u);
  Tensor in_i = input_of(world->rank(), c * n, DType::kI64);
  Tensor flat_ri = Tensor::empty({c}, DType::kI64), hier_ri = Tensor::empty({c}, DType::kI64);
  world->reduce_scatter(in_i, flat_ri)->wait();
  h.reduce_scatter(in_i, hier_ri)->wait();
  EXPECT_EQ(hier_ri.to_vector<int64_t>(), flat_ri.to_vector<int64_t>()) << "i64 reduce_scatter";
  const uint64_t node_ag = h.intra().op_count("allgather");
  const uint64_t across_ag = h.inter().op_count("allgather");
  Tensor mine = input_of(world->rank() + 5, c, DType::kF32);
  Tensor flat_ag = Tensor::empty({c * n}), hier_ag = Tensor::empty({c * n});
  world->allgather(mine, flat_ag)->wait();
  h.allgather(mine, hier_ag)->wait();
  EXPECT_EQ(hier_ag.to_vector<float>(), flat_ag.to_vector<float>()) << "allgather in pieces";
  EXPECT_EQ(h.intra().op_count("allgather") - node_ag, 4u);
  EXPECT_EQ(h.inter().op_count("allgather") - across_ag, 4u);
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

// Pairs or fours of consecutive ranks as nodes, as for Hierarchy above.
std::vector<int> nodes_of_size(int size, int local) {
  std::vector<int> nodes;
  for (int r = 0; r < size; ++r) nodes.push_back(r / local);
  return nodes;
}

TEST(Algorithm, HierarchicalRoutesEveryCallInTwoLevels) {
  auto world = comm::world();
  if (world->size() < 4) GTEST_SKIP() << "needs 2 nodes of 2 ranks or more";
  auto group = world->split(0, world->rank(), "routed");
  EXPECT_EQ(group->algorithm(), Algorithm::kFlat) << "a new group is flat";
  EXPECT_EQ(group->hierarchy(), nullptr);
  group->set_algorithm(Algorithm::kHierarchical, nodes_of_size(world->size(), 2));
  ASSERT_NE(group->hierarchy(), nullptr);
  EXPECT_TRUE(group->hierarchy()->applies());
  EXPECT_EQ(group->costs(), nullptr) << "hier measures nothing";
  EXPECT_TRUE(group->goes_hierarchical("allreduce", 4));
  EXPECT_NE(group->algorithm_str().find("hier over"), std::string::npos) << group->algorithm_str();
  check_routed(*group, *world, /*all_hierarchical=*/true);
  // Back to flat: nothing goes through the levels any more.
  group->set_algorithm(Algorithm::kFlat);
  EXPECT_EQ(group->hierarchy(), nullptr);
  EXPECT_FALSE(group->goes_hierarchical("allreduce", size_t(1) << 30));
  EXPECT_EQ(group->algorithm_str(), "flat");
}

// The ops a test posts its calls with: a Hierarchy's own, or a group's that routes them.
struct Posting {
  std::function<WorkPtr(Tensor&)> allreduce;
  std::function<WorkPtr(const Tensor&, Tensor&)> reduce_scatter, allgather;
};

// An allreduce, a reduce_scatter and an allgather of n(k) elements for each k < calls, all in
// flight together (as DDP's buckets and ZeRO's prefetches are); then `settle` polls and waits
// them; every result is the flat call's on `world`.
void calls_in_flight_equal_the_flat(Communicator& world, const Posting& post, int calls,
                                    const std::function<int64_t(int)>& n_of,
                                    const std::function<void(std::vector<WorkPtr>&)>& settle) {
  const int size = world.size(), rank = world.rank();
  std::vector<Tensor> sums, flat_sums, scattered, flat_scattered, gathered, flat_gathered;
  std::vector<WorkPtr> works;
  for (int k = 0; k < calls; ++k) {
    const int64_t n = n_of(k);
    sums.push_back(input_of(rank + k, n, DType::kF32));
    flat_sums.push_back(sums.back().clone());
    works.push_back(post.allreduce(sums.back()));
    Tensor in = input_of(rank - k, n * size, DType::kF32);
    scattered.push_back(Tensor::empty({n}));
    flat_scattered.push_back(Tensor::empty({n}));
    works.push_back(post.reduce_scatter(in, scattered.back()));
    world.reduce_scatter(in, flat_scattered.back())->wait();
    gathered.push_back(Tensor::empty({n * size}));
    flat_gathered.push_back(Tensor::empty({n * size}));
    Tensor mine = input_of(rank * 3 + k, n, DType::kF32);
    works.push_back(post.allgather(mine, gathered.back()));
    world.allgather(mine, flat_gathered.back())->wait();
  }
  settle(works);
  for (size_t k = 0; k < sums.size(); ++k) {
    world.allreduce(flat_sums[k])->wait();
    expect_close(sums[k], flat_sums[k], 1e-6, "allreduce in flight");
    expect_close(scattered[k], flat_scattered[k], 1e-6, "reduce_scatter in flight");
    EXPECT_EQ(gathered[k].to_vector<float>(), flat_gathered[k].to_vector<float>());
  }
}

// Rank-dependent polling (every `stride`-th call from this rank's place), then waits from the
// last call to the first.
std::function<void(std::vector<WorkPtr>&)> polled_then_waited_backwards(int rank, size_t stride) {
  return [rank, stride](std::vector<WorkPtr>& works) {
    for (size_t i = size_t(rank) % stride; i < works.size(); i += stride) works[i]->test();
    for (size_t i = works.size(); i-- > 0;) works[i]->wait();
  };
}

// Calls in flight together, polled and waited in an order that differs per rank: each group's
// steps are still posted alike on every rank (else the signature checks raise), and every
// result is the flat call's.
TEST(Algorithm, ManyCallsInFlightCompleteInAnyOrder) {
  auto world = comm::world();
  if (world->size() < 4 || world->size() % 2 != 0)
    GTEST_SKIP() << "needs 2 nodes of 2 ranks or more";
  Hierarchy h(world, nodes_of_size(world->size(), 2));
  h.set_piece_bytes(512);  // allreduces of 2 to 8 pieces among the calls in flight
  const Posting on_hierarchy{
      [&](Tensor& t) { return h.allreduce(t); },
      [&](const Tensor& in, Tensor& out) { return h.reduce_scatter(in, out); },
      [&](const Tensor& in, Tensor& out) { return h.allgather(in, out); }};
  calls_in_flight_equal_the_flat(
      *world, on_hierarchy, 6, [](int k) { return int64_t(50 + 300 * k); },
      polled_then_waited_backwards(world->rank(), 2));
}

// Note [A failed two-level call]: node 0 calls with 64 elements, the others with 62, so every
// rank's step across nodes finds the ranks disagreeing (after the step inside the node went
// through), and nothing is left posted. That call raises, again at once when waited on again;
// the next call raises at once, naming the failed one, where it used to wait on the failed step
// again (a whole timeout, had that step timed out) and raise the step's error as its own. The
// group's flat collectives still work.
TEST(Hierarchy, AFailedCallStopsTheLaterOnesAtOnce) {
  auto world = comm::world();
  if (world->size() < 4 || world->size() % 2 != 0)
    GTEST_SKIP() << "needs 2 nodes of 2 ranks or more";
  const int rank = world->rank();
  auto group = world->split(0, rank, "failed call");
  Hierarchy h(*group, nodes_of_size(world->size(), 2));
  ASSERT_TRUE(h.applies());
  for (Communicator* g : {group.get(), &h.intra(), &h.inter()})
    g->set_timeout_seconds(30);  // a wait that does not end as it should fails, not hangs
  auto error_of = [&](const WorkPtr& work) -> std::string {
    try {
      work->wait();
    } catch (const CommError& e) {
      return e.what();
    }
    ADD_FAILURE() << "expected CommError on rank " << rank;
    return "";
  };

  Tensor uneven = input_of(rank, rank < 2 ? 64 : 62, DType::kF32);
  WorkPtr failed = h.allreduce(uneven);
  const std::string first = error_of(failed);
  EXPECT_NE(first.find("disagree"), std::string::npos) << first;
  EXPECT_EQ(error_of(failed), first) << "waited on again: the same error";

  const auto start = std::chrono::steady_clock::now();
  Tensor t = input_of(rank, 64, DType::kF32);
  std::string later;
  try {
    later = error_of(h.allreduce(t));  // raised as it is made, or by its wait
  } catch (const CommError& e) {
    later = e.what();
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (const char* part :
       {"group 'failed call'", "a two-level allreduce cannot run",
        "an earlier two-level call on the group failed (its allreduce: ", "disagree"})
    EXPECT_NE(later.find(part), std::string::npos) << "'" << part << "' in: " << later;
  EXPECT_LT(waited, 10.0) << "the later call waited instead of raising (timeout 30 s)";

  Tensor sum = t.clone(), flat = t.clone();
  group->allreduce(sum)->wait();
  world->allreduce(flat)->wait();
  expect_close(sum, flat, 1e-6, "the group's flat allreduce after the failed two-level call");
}

// Note [Two-level calls checked whole]: a routed call is checked on its group as the user made
// it. Each step used to be checked on its own, by hierarchical.cpp's lines and the pieces'
// counts: these calls then went unnoticed (the swapped ones summed into each other) or raised
// naming an internal step.
TEST(Algorithm, RoutedCallsAreCheckedAsTheUserMadeThem) {
  auto world = comm::world();
  if (world->size() < 4 || world->size() % 2 != 0)
    GTEST_SKIP() << "needs 2 nodes of 2 ranks or more";
  const int rank = world->rank();
  auto group = world->split(0, rank, "checked whole");
  group->set_timeout_seconds(30);  // a call that is not caught fails instead of hanging
  group->set_algorithm(Algorithm::kHierarchical, nodes_of_size(world->size(), 2));
  ASSERT_TRUE(group->goes_hierarchical("allreduce", 256));
  auto raises = [&](const WorkPtr& work, const std::vector<std::string>& named) {
    try {
      work->wait();
      ADD_FAILURE() << "expected CommError on rank " << rank;
    } catch (const CommError& e) {
      for (const std::string& text : named)
        EXPECT_NE(std::string(e.what()).find(text), std::string::npos)
            << text << " in " << e.what();
    }
  };
  const Tensor original = input_of(rank, 64, DType::kF32);

  // Two calls of one size from different lines, as a rank that swapped two allreduces makes.
  Tensor t = original.clone();
  const int line_a = __LINE__ + 1;
  WorkPtr swapped = rank == 1 ? group->allreduce(t) : nullptr;
  const int line_b = __LINE__ + 1;
  if (rank != 1) swapped = group->allreduce(t);
  raises(swapped, {"disagree", "hierarchical_test.cpp:" + std::to_string(line_a),
                   "hierarchical_test.cpp:" + std::to_string(line_b)});
  EXPECT_EQ(t.to_vector<float>(), original.to_vector<float>()) << "nothing of it was posted";

  // Another count on each node (64 and 62 elements: 31 or 32 across nodes per rank): named as
  // the calls' counts, not their steps'.
  Tensor shorter = original.narrow(0, 0, rank < 2 ? 64 : 62).clone();
  raises(group->allreduce(shorter), {"disagree", "count 64", "count 62"});
  Tensor gathered = Tensor::empty({(rank < 2 ? 64 : 62) * world->size()});
  raises(group->allgather(shorter, gathered), {"allgather", "count 64", "count 62"});
  const int64_t per_peer = rank < 2 ? 3 : 2;  // an equal all-to-all of another size per node
  Tensor sent = Tensor::zeros({per_peer * world->size()}), got = sent.clone();
  raises(group->all_to_all(sent, got), {"all_to_all", "count " + std::to_string(3 * world->size()),
                                        "count " + std::to_string(2 * world->size())});

  // The group is still usable: nothing of the failed calls was posted anywhere.
  Tensor sum = original.clone(), flat = original.clone();
  group->allreduce(sum)->wait();
  world->allreduce(flat)->wait();
  expect_close(sum, flat, 1e-6, "allreduce after the failed calls");
}

// Routed calls in flight together, polled and waited in different orders: a later call's group
// check agrees inside the wait for an earlier call's step, which then makes the later call and
// progresses every call, the awaited step's among them (Note [Two-level calls checked whole]);
// with checks on and off, every result is the flat call's.
TEST(Algorithm, RoutedCallsInFlightCompleteInAnyOrder) {
  auto world = comm::world();
  if (world->size() < 4 || world->size() % 2 != 0)
    GTEST_SKIP() << "needs 2 nodes of 2 ranks or more";
  auto group = world->split(0, world->rank(), "routed in flight");
  group->set_algorithm(Algorithm::kHierarchical, nodes_of_size(world->size(), 2));
  const Posting routed{
      [&](Tensor& t) { return group->allreduce(t); },
      [&](const Tensor& in, Tensor& out) { return group->reduce_scatter(in, out); },
      [&](const Tensor& in, Tensor& out) { return group->allgather(in, out); }};
  const auto in_call_order = [](std::vector<WorkPtr>& works) {
    for (const WorkPtr& work : works) work->wait();
  };
  for (bool checked : {true, false}) {
    SCOPED_TRACE(checked ? "checks on" : "checks off");
    group->set_debug(checked);
    // Up to steps past what a check carries.
    const auto n_of = [](int k) { return int64_t(7 + 9000 * k); };
    calls_in_flight_equal_the_flat(*world, routed, 5, n_of, in_call_order);
    calls_in_flight_equal_the_flat(*world, routed, 5, n_of,
                                   polled_then_waited_backwards(world->rank(), 3));
  }
  // A large call waited on first with many small ones queued behind it: their checks agree
  // while its steps are awaited, so the steps are progressed (and completed) from inside
  // their own waits, many times over (the pattern that crashed a DDP step on the emulated
  // cluster, whose slower steps were caught completing so; on one host it did not show).
  group->set_debug(true);
  Tensor large = input_of(world->rank(), 1 << 18, DType::kF32), flat_large = large.clone();
  std::vector<Tensor> small, flat_small;
  std::vector<WorkPtr> works = {group->allreduce(large)};
  for (int k = 0; k < 40; ++k) {
    small.push_back(input_of(world->rank() + k, 1000, DType::kF32));
    flat_small.push_back(small.back().clone());
    works.push_back(group->allreduce(small.back()));
  }
  for (const WorkPtr& work : works) work->wait();
  world->allreduce(flat_large)->wait();
  expect_close(large, flat_large, 1e-6, "the large allreduce");
  for (size_t k = 0; k < small.size(); ++k) {
    world->allreduce(flat_small[k])->wait();
    expect_close(small[k], flat_small[k], 1e-6, "a small allreduce behind it");
  }
}

TEST(Algorithm, AutoPicksByTheMeasuredTableAlikeOnEveryRank) {
  auto world = comm::world();
  if (world->size() < 4) GTEST_SKIP() << "needs 2 nodes of 2 ranks or more";
  auto group = world->split(0, world->rank(), "auto");
  group->set_algorithm(Algorithm::kAuto, nodes_of_size(world->size(), 2));
  const CollectiveCosts* costs = group->costs();
  ASSERT_NE(costs, nullptr);
  EXPECT_EQ(costs->ranks_per_node, 2);
  EXPECT_EQ(costs->nodes, world->size() / 2);
  for (const AlphaBeta& ab :
       {costs->flat_allreduce, costs->intra_allreduce, costs->inter_allreduce,
        costs->flat_reduce_scatter, costs->intra_reduce_scatter, costs->inter_reduce_scatter,
        costs->flat_allgather, costs->intra_allgather, costs->inter_allgather,
        costs->flat_all_to_all, costs->copy}) {
    EXPECT_GE(ab.alpha_s, 0);
    EXPECT_GE(ab.beta_s_per_byte, 0);
  }
  EXPECT_GT(costs->flat_allreduce.at(1 << 20), 0) << "a 1 MiB allreduce takes time";
  EXPECT_EQ(costs->pieced_bytes, double(kMaxAllreducePieces * kAllreducePieceBytes));
  EXPECT_GT(costs->flat_allreduce_pieced, 0);
  EXPECT_GT(costs->hier_allreduce_pieced, 0);
  // Every rank holds the same table: its entries, summed as integers of nanoseconds, agree.
  Tensor mine =
      Tensor::from_vector(std::vector<int64_t>{int64_t(costs->flat_allreduce.at(1 << 20) * 1e9),
                                               int64_t(costs->inter_all_to_all.at(4096) * 1e9)},
                          {2});
  Tensor most = mine.clone(), least = mine.clone();
  world->allreduce(most, {ReduceOp::kMax})->wait();
  world->allreduce(least, {ReduceOp::kMin})->wait();
  EXPECT_EQ(most.to_vector<int64_t>(), least.to_vector<int64_t>());
  for (const char* op : {"allreduce", "reduce_scatter", "allgather", "all_to_all"})
    for (size_t bytes : {size_t(12), size_t(20000), size_t(1) << 24, size_t(1) << 26})
      EXPECT_EQ(group->goes_hierarchical(op, bytes), costs->prefers_hierarchical(op, double(bytes)))
          << op << " " << bytes;
  // With splits each rank moves its own byte count: the choice ignores it (two levels only
  // where the table prefers them at every size), so every rank picks alike.
  const bool variable = costs->crossover("all_to_all") == kSmallestCrossover;
  for (size_t bytes : {size_t(12), size_t(20000), size_t(1) << 24})
    EXPECT_EQ(group->goes_hierarchical("all_to_all(v)", bytes), variable) << bytes;
  check_routed(*group, *world, /*all_hierarchical=*/false);
}

TEST(Algorithm, RanksThatDisagreeAreToldSo) {
  auto world = comm::world();
  if (world->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto group = world->split(0, world->rank(), "disagree");
  try {
    group->set_algorithm(world->rank() == 0 ? Algorithm::kFlat : Algorithm::kHierarchical);
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("disagree"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("LOOM_COLL_ALGO"), std::string::npos) << e.what();
  }
  EXPECT_EQ(group->algorithm(), Algorithm::kFlat);
}

TEST(Algorithm, OneNodeStaysFlat) {
  auto world = comm::world();
  auto group = world->split(0, world->rank(), "one node");
  group->set_algorithm(Algorithm::kAuto, std::vector<int>(size_t(world->size()), 0));
  EXPECT_EQ(group->costs(), nullptr) << "nothing to measure on one node";
  EXPECT_FALSE(group->goes_hierarchical("allreduce", size_t(1) << 30));
  EXPECT_NE(group->algorithm_str().find("one node"), std::string::npos) << group->algorithm_str();
}

// The model's closed form on a made-up table: a node at 10 GB/s, links across nodes at
// 0.1 GB/s, 4 ranks per node.
TEST(Algorithm, CostModelPredictsTheTwoForms) {
  CollectiveCosts c;
  c.nodes = 2;
  c.ranks_per_node = 4;
  c.flat_allreduce = {10e-6, 1e-8};
  c.intra_allreduce = {50e-6, 1e-10};
  c.inter_allreduce = {10e-6, 1e-8};
  // Reduce-scatters and all-gathers at half an allreduce's bytes' time, as a ring's are.
  c.flat_reduce_scatter = c.flat_allgather = {10e-6, 0.5e-8};
  c.intra_reduce_scatter = c.intra_allgather = {50e-6, 0.5e-10};
  c.inter_reduce_scatter = c.inter_allgather = {10e-6, 0.5e-8};
  c.copy = {0, 1e-10};
  c.flat_all_to_all = {10e-6, 1e-8};
  c.intra_all_to_all = {5e-6, 1e-10};
  c.inter_all_to_all = {10e-6, 1e-8};
  const double s = 1 << 20;
  // reduce-scatter and all-gather in the node (50 us + s/2 x 1e-10 each), allreduce of s/4
  // across, copies of 2s.
  EXPECT_DOUBLE_EQ(c.hierarchical("allreduce", s),
                   2 * (50e-6 + s / 2 * 1e-10) + (10e-6 + s / 4 * 1e-8) + 2 * s * 1e-10);
  EXPECT_DOUBLE_EQ(c.flat("allreduce", s), 10e-6 + s * 1e-8);
  EXPECT_DOUBLE_EQ(c.flat("allgather", s), 10e-6 + s / 2 * 1e-8);
  EXPECT_DOUBLE_EQ(c.hierarchical("all_to_all", s), 15e-6 + s * 1.01e-8 + 2 * s * 1e-10);
  // Two-level allreduce: 110 us + 2.8e-9 s against 10 us + 1e-8 s: faster from s > 13.9 KB,
  // and by the margin (20%: under 8 us + 8e-9 s) from s > 19.6 KB.
  EXPECT_LT(c.hierarchical("allreduce", 16 << 10), c.flat("allreduce", 16 << 10));
  EXPECT_EQ(c.crossover("allreduce"), size_t(32) << 10);
  EXPECT_FALSE(c.prefers_hierarchical("allreduce", 16 << 10));
  EXPECT_TRUE(c.prefers_hierarchical("allreduce", 32 << 10));
  // all_to_all sends the same bytes across either way: flat always.
  EXPECT_EQ(c.crossover("all_to_all"), size_t(0));
  EXPECT_NE(c.str().find("allreduce hierarchical from 32 KiB"), std::string::npos) << c.str();
  EXPECT_THROW(c.flat("broadcast", s), Error);
  // Above a piece in pieces: with pieces of 1 MiB, 4 MiB as 4 of 1 MiB, the first through both
  // levels, the other three at the pace of the slower one (here across: 10 us + 2.6 ms against
  // 205 us).
  c.piece_bytes = size_t(1) << 20;
  const double node = 2 * (50e-6 + s / 2 * 1e-10), across = 10e-6 + s / 4 * 1e-8;
  EXPECT_DOUBLE_EQ(c.hierarchical("allreduce", 4 * s), node + 4 * across + 2 * 4 * s * 1e-10);
  // Timed whole at 16 MiB (Note [Pieced allreduces timed whole]): above a piece both forms come
  // from those times, with the smaller margin; a piece and below, from the levels as before.
  CollectiveCosts timed = c;
  timed.pieced_bytes = 16 * s;
  timed.flat_allreduce_pieced = 0.200;
  timed.hier_allreduce_pieced = 0.180;  // 10% faster: past the 5% margin, not the 20%
  EXPECT_TRUE(timed.timed_whole("allreduce", 2 * s));
  EXPECT_FALSE(timed.timed_whole("allreduce", s)) << "one piece";
  EXPECT_FALSE(timed.timed_whole("reduce_scatter", 2 * s));
  EXPECT_FALSE(c.timed_whole("allreduce", 2 * s)) << "not measured";
  EXPECT_DOUBLE_EQ(timed.flat("allreduce", 8 * s), 0.100);
  EXPECT_DOUBLE_EQ(timed.hierarchical("allreduce", 8 * s), 0.090);
  EXPECT_TRUE(timed.prefers_hierarchical("allreduce", 8 * s));
  EXPECT_DOUBLE_EQ(timed.hierarchical("allreduce", s), c.hierarchical("allreduce", s));
  timed.hier_allreduce_pieced = 0.195;  // 2.5% faster: within the timings' spread
  EXPECT_FALSE(timed.prefers_hierarchical("allreduce", 8 * s));
  EXPECT_NE(timed.str().find("allreduce of 16 MiB timed whole: flat 200 ms, two levels 195 ms"),
            std::string::npos)
      << timed.str();
  c.piece_bytes = 0;  // whole: every level's time one after the other
  EXPECT_DOUBLE_EQ(c.hierarchical("allreduce", 4 * s),
                   2 * (50e-6 + 2 * s * 1e-10) + (10e-6 + s * 1e-8) + 2 * 4 * s * 1e-10);
}

// Each collective by its own measurement. The emulated 2 x 2 cluster's table with 1 Gbit/s links
// (rounded): Open MPI's flat reduce-scatter and all-gather across nodes move about 11 and 15 ns
// per byte, more than its allreduce's 8.3; as halves of that allreduce (4.2 ns) they were
// predicted faster flat than in two levels (4.4 ns: the across-nodes allreduce at 16.7 ns per
// byte over half the bytes, halved) and stayed flat, where two levels ran 2x faster.
TEST(Algorithm, ReduceScatterAndAllgatherGoByTheirOwnTimes) {
  CollectiveCosts c;
  c.nodes = 2;
  c.ranks_per_node = 2;
  c.flat_allreduce = {90e-6, 8.3e-9};
  c.intra_allreduce = {60e-6, 0.57e-9};
  c.inter_allreduce = {0, 16.7e-9};
  c.intra_reduce_scatter = c.intra_allgather = {30e-6, 0.29e-9};
  c.inter_reduce_scatter = c.inter_allgather = {0, 8.3e-9};
  c.copy = {0, 0.07e-9};
  const double s = 16 << 20;
  c.flat_reduce_scatter = c.flat_allgather = {0, 4.15e-9};  // halves of the allreduce
  EXPECT_FALSE(c.prefers_hierarchical("reduce_scatter", s));
  EXPECT_FALSE(c.prefers_hierarchical("allgather", s));
  c.flat_reduce_scatter = {100e-6, 11e-9};  // as measured
  c.flat_allgather = {100e-6, 15e-9};
  EXPECT_DOUBLE_EQ(c.flat("reduce_scatter", s), 100e-6 + s * 11e-9);
  EXPECT_TRUE(c.prefers_hierarchical("reduce_scatter", s));
  EXPECT_TRUE(c.prefers_hierarchical("allgather", s));
  // In pieces (16 MiB: 4 of 4 MiB): per piece the node's call with its staging copy (30 us +
  // s/4 x 0.36 ns) beside the across-nodes call on s/8 (8.7 ms), which sets the pace.
  const double node = 30e-6 + s / 4 * (0.29e-9 + 0.07e-9), across = s / 8 * 8.3e-9;
  EXPECT_DOUBLE_EQ(c.hierarchical("reduce_scatter", s), node + 4 * across);
  EXPECT_DOUBLE_EQ(c.hierarchical("allgather", s), node + 4 * across);
  // Whole: the node's part is one call per node (2 x 30 us), on its slice: no staging copy.
  c.piece_bytes = 0;
  EXPECT_DOUBLE_EQ(c.hierarchical("reduce_scatter", s), 60e-6 + s * 0.29e-9 + s / 2 * 8.3e-9);
  EXPECT_DOUBLE_EQ(c.hierarchical("allgather", s), s / 2 * 8.3e-9 + 60e-6 + s * 0.29e-9);
  EXPECT_TRUE(c.prefers_hierarchical("reduce_scatter", s));
  EXPECT_TRUE(c.prefers_hierarchical("allgather", s));
  EXPECT_NE(c.str().find("reduce_scatter flat 100 us + 0.09 GB/s"), std::string::npos) << c.str();
}

TEST(Algorithm, FromTheEnvironment) {
  ::unsetenv("LOOM_COLL_ALGO");
  EXPECT_EQ(algorithm_from_env(), Algorithm::kAuto);
  EXPECT_EQ(algorithm_from_env(Algorithm::kFlat), Algorithm::kFlat);
  ::setenv("LOOM_COLL_ALGO", "hier", 1);
  EXPECT_EQ(algorithm_from_env(), Algorithm::kHierarchical);
  ::setenv("LOOM_COLL_ALGO", "flat", 1);
  EXPECT_EQ(algorithm_from_env(), Algorithm::kFlat);
  ::setenv("LOOM_COLL_ALGO", "ring", 1);
  try {
    algorithm_from_env();
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("LOOM_COLL_ALGO=ring"), std::string::npos) << e.what();
  }
  ::unsetenv("LOOM_COLL_ALGO");
}

// The real nodes: one host is one node (flat); the emulated cluster's nodes, by host name.
TEST(Hierarchy, OnTheNodesTheRanksRunOn) {
  auto world = comm::world();
  Hierarchy h(world);
  SCOPED_TRACE(h.str());
  const NodeMap map = node_map(*world);
  EXPECT_EQ(h.nodes(), map.nodes());
  if (h.applies()) check_against_flat(h, *world);
  // And a group routed by what the host names say (the emulated cluster's nodes).
  auto group = world->split(0, world->rank(), "by host");
  group->set_algorithm(Algorithm::kHierarchical);
  EXPECT_EQ(group->hierarchy()->applies(), h.applies());
  if (h.applies()) check_routed(*group, *world, /*all_hierarchical=*/true);
}

}  // namespace
}  // namespace loom::comm
