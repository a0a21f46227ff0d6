// DeviceMesh on every factorisation of the world size into pp x dp x tp: coordinates follow
// rank = (pp * dp_size + dp) * tp_size + tp, and each named group reduces over exactly its
// ranks — checked with closed-form sums of world ranks, with the three groups' reductions in
// flight at the same time.
#define OMPI_SKIP_MPICXX 1  // the C API only (libmpi_cxx is not linked)
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <set>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "parallel/mesh.h"

namespace loom::parallel {
namespace {

using comm::Communicator;

std::vector<MeshCoords> factorisations(int n) {
  std::vector<MeshCoords> out;
  for (int pp = 1; pp <= n; ++pp)
    for (int dp = 1; dp <= n; ++dp)
      if (n % (pp * dp) == 0) out.push_back(MeshCoords{pp, dp, n / (pp * dp)});
  return out;
}

// Sum over the group's ranks of their world rank, computed from the mesh formula.
int64_t expected_sum(const DeviceMesh& m, char which) {
  const MeshCoords& c = m.coords();
  int64_t total = 0;
  const int n = which == 't' ? m.tp_size() : which == 'd' ? m.dp_size() : m.pp_size();
  for (int i = 0; i < n; ++i) {
    MeshCoords o = c;
    (which == 't' ? o.tp : which == 'd' ? o.dp : o.pp) = i;
    total += m.rank_of(o);
  }
  return total;
}

TEST(DeviceMesh, EveryFactorisationGroupsTheRightRanks) {
  auto world = comm::world();
  for (const MeshCoords& shape : factorisations(world->size())) {
    DeviceMesh mesh(world, shape.pp, shape.dp, shape.tp);
    SCOPED_TRACE(mesh.str());
    const MeshCoords& c = mesh.coords();
    EXPECT_EQ(mesh.rank_of(c), world->rank());
    EXPECT_EQ(c.tp, world->rank() % shape.tp);
    EXPECT_EQ(mesh.tp().size(), shape.tp);
    EXPECT_EQ(mesh.dp().size(), shape.dp);
    EXPECT_EQ(mesh.pp().size(), shape.pp);
    EXPECT_EQ(mesh.tp().rank(), c.tp);
    EXPECT_EQ(mesh.dp().rank(), c.dp);
    EXPECT_EQ(mesh.pp().rank(), c.pp);

    // All three reductions outstanding at once, then waited in reverse order.
    Tensor t = Tensor::full({3}, world->rank(), DType::kI64);
    Tensor d = t.clone(), p = t.clone();
    auto wt = mesh.tp().allreduce(t);
    auto wd = mesh.dp().allreduce(d);
    auto wp = mesh.pp().allreduce(p);
    wp->wait();
    wd->wait();
    wt->wait();
    EXPECT_EQ(t.to_vector<int64_t>(), std::vector<int64_t>(3, expected_sum(mesh, 't')));
    EXPECT_EQ(d.to_vector<int64_t>(), std::vector<int64_t>(3, expected_sum(mesh, 'd')));
    EXPECT_EQ(p.to_vector<int64_t>(), std::vector<int64_t>(3, expected_sum(mesh, 'p')));
  }
}

// DeviceMesh::plan gives rank r of a mesh that is not running the coordinates and group ranks
// and sizes the running mesh gives it; its groups refuse to communicate, naming themselves.
TEST(DeviceMesh, PlannedMeshesAreTheRunningOnesWithoutData) {
  auto world = comm::world();
  for (const MeshCoords& shape : factorisations(world->size())) {
    DeviceMesh mesh(world, shape.pp, shape.dp, shape.tp);
    const DeviceMesh plan = DeviceMesh::plan(world->rank(), shape.pp, shape.dp, shape.tp);
    SCOPED_TRACE(mesh.str());
    EXPECT_EQ(plan.coords().pp, mesh.coords().pp);
    EXPECT_EQ(plan.coords().dp, mesh.coords().dp);
    EXPECT_EQ(plan.coords().tp, mesh.coords().tp);
    for (auto [a, b] :
         {std::pair{&plan.tp(), &mesh.tp()}, std::pair{&plan.dp(), &mesh.dp()},
          std::pair{&plan.pp(), &mesh.pp()}, std::pair{&plan.world(), &mesh.world()}}) {
      EXPECT_EQ(a->rank(), b->rank());
      EXPECT_EQ(a->size(), b->size());
      EXPECT_STREQ(a->backend(), "planning");
    }
    EXPECT_EQ(plan.tp().name(), mesh.tp().name());
    Tensor t = Tensor::zeros({2});
    try {
      plan.dp().allreduce_sync(t);
      FAIL() << "a planning group must refuse to communicate";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("carries no data"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(plan.dp().name()), std::string::npos) << e.what();
    }
  }
}

TEST(DeviceMesh, CustomGroupsForTiedEmbeddingsAndReplicaPairs) {
  auto world = comm::world();
  const int n = world->size();
  DeviceMesh mesh(world, n, 1, 1);  // a pure pipeline: stage i on rank i
  // Tied embeddings: the first and last stage (one rank when n == 1).
  std::vector<int> ends = n == 1 ? std::vector<int>{0} : std::vector<int>{0, n - 1};
  auto tied = mesh.new_group(ends, "embedding");
  const bool member = world->rank() == 0 || world->rank() == n - 1;
  ASSERT_EQ(tied != nullptr, member);
  if (tied) {
    Tensor x = Tensor::full({1}, world->rank() + 1, DType::kF32);
    tied->allreduce_sync(x);
    EXPECT_EQ(x.item(), n == 1 ? 1.0 : 1.0 + n);
    EXPECT_EQ(tied->name(), "embedding");
  }
  // Chimera replica pairs: rank i with rank n-1-i, listed in that order.
  const int r = world->rank(), partner = n - 1 - r;
  for (int i = 0; i < (n + 1) / 2; ++i) {
    std::vector<int> pair = i == n - 1 - i ? std::vector<int>{i} : std::vector<int>{i, n - 1 - i};
    auto g = mesh.new_group(pair, "replica");
    ASSERT_EQ(g != nullptr, r == i || r == n - 1 - i);
    if (g) {
      EXPECT_EQ(g->rank(), r == i ? 0 : 1);
      Tensor x = Tensor::full({1}, r, DType::kI32);
      g->allreduce_sync(x);
      EXPECT_EQ(x.item(), r == partner ? r : r + partner);
    }
  }
}

// Which ranks share a node, against MPI's own answer (MPI_Comm_split_type shared memory): two
// ranks are on one node for the mesh exactly when MPI puts them in one shared-memory group. On
// one host that is every rank; on the emulated cluster (tests/cluster/run.sh) it is each node's.
// A tp group spans nodes exactly when its ranks' MPI groups differ.
TEST(DeviceMesh, KnowsWhichRanksShareANode) {
  auto world = comm::world();
  const int n = world->size();
  MPI_Comm shared = MPI_COMM_NULL;
  ASSERT_EQ(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &shared),
            MPI_SUCCESS);
  int leader = world->rank();  // the lowest world rank of this rank's node, by MPI
  ASSERT_EQ(MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, shared), MPI_SUCCESS);
  std::vector<int> leaders(static_cast<size_t>(n));
  ASSERT_EQ(MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, MPI_COMM_WORLD),
            MPI_SUCCESS);
  MPI_Comm_free(&shared);
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  for (const MeshCoords& shape : factorisations(n)) {
    DeviceMesh mesh(world, shape.pp, shape.dp, shape.tp);
    SCOPED_TRACE(mesh.str());
    const std::set<int> distinct(leaders.begin(), leaders.end());
    EXPECT_EQ(mesh.nodes().nodes(), int(distinct.size()));
    for (int r = 0; r < n; ++r)
      for (int q = 0; q < n; ++q)
        EXPECT_EQ(mesh.node_of(r) == mesh.node_of(q), leaders[size_t(r)] == leaders[size_t(q)])
            << "ranks " << r << " and " << q;
    EXPECT_EQ(mesh.nodes().names[size_t(mesh.node_of(world->rank()))], std::string(host));
    size_t crossing = 0;
    for (int p = 0; p < shape.pp; ++p)
      for (int d = 0; d < shape.dp; ++d) {
        std::set<int> nodes;
        for (int t = 0; t < shape.tp; ++t) nodes.insert(leaders[size_t(mesh.rank_of({p, d, t}))]);
        crossing += nodes.size() > 1;
      }
    EXPECT_EQ(mesh.tp_groups_across_nodes().size(), crossing);
    const std::string placement = mesh.placement();
    EXPECT_NE(placement.find("node 0 ("), std::string::npos) << placement;
    EXPECT_NE(placement.find(crossing ? "tp groups: " : "each inside one node"), std::string::npos)
        << placement;
  }
  // A planned mesh is one node.
  EXPECT_EQ(DeviceMesh::plan(0, 1, 2, 2).nodes().nodes(), 1);
}

TEST(DeviceMesh, BadShapesAreClearErrorsOnEveryRank) {
  auto world = comm::world();
  const int n = world->size();
  try {
    DeviceMesh mesh(world, 2, n, 2);  // 4n ranks: never the world size
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ranks, but the world has"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(DeviceMesh(world, 0, n, 1), Error);
  DeviceMesh mesh(world, 1, n, 1);
  EXPECT_THROW(mesh.new_group({}, "empty"), Error);
  EXPECT_THROW(mesh.new_group({0, 0}, "twice"), Error);
  EXPECT_THROW(mesh.new_group({n}, "outside"), Error);
  EXPECT_THROW(mesh.rank_of(MeshCoords{0, n, 0}), Error);
  // Nothing above started a collective, so the world still agrees on its sequence: a barrier
  // completes.
  world->barrier_sync();
}

}  // namespace
}  // namespace loom::parallel
