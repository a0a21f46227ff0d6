#include "parallel/mesh.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include "collectives/algorithm.h"
#include "collectives/planning_backend.h"

namespace loom::parallel {
namespace {

// The groups' names, which errors print: the coordinates the group's ranks share.
std::string tp_name(const MeshCoords& c) {
  return detail::str_cat("tp[pp ", c.pp, ", dp ", c.dp, "]");
}
std::string dp_name(const MeshCoords& c) {
  return detail::str_cat("dp[pp ", c.pp, ", tp ", c.tp, "]");
}
std::string pp_name(const MeshCoords& c) {
  return detail::str_cat("pp[dp ", c.dp, ", tp ", c.tp, "]");
}

}  // namespace

DeviceMesh::DeviceMesh(std::shared_ptr<comm::Communicator> world, int pp, int dp, int tp)
    : world_(std::move(world)), pp_(pp), dp_(dp), tp_(tp) {
  LOOM_CHECK(world_ != nullptr, "DeviceMesh: the world communicator is null");
  LOOM_CHECK(pp > 0 && dp > 0 && tp > 0, "DeviceMesh: sizes must be positive, got pp ", pp, " dp ",
             dp, " tp ", tp);
  LOOM_CHECK(int64_t(pp) * dp * tp == world_->size(), "DeviceMesh: pp ", pp, " x dp ", dp, " x tp ",
             tp, " = ", int64_t(pp) * dp * tp, " ranks, but the world has ", world_->size(),
             " (launch with mpirun -np ", int64_t(pp) * dp * tp, ")");
  coords_ = coords_of(world_->rank());
  const MeshCoords& c = coords_;
  // Every rank takes part in all three splits, in the same order; within a group, ranks are
  // ordered by their index along that dimension.
  tp_group_ = world_->split(c.pp * dp_ + c.dp, c.tp, tp_name(c));
  dp_group_ = world_->split(c.pp * tp_ + c.tp, c.dp, dp_name(c));
  pp_group_ = world_->split(c.dp * tp_ + c.tp, c.pp, pp_name(c));
  nodes_ = comm::node_map(*world_);
  // Across nodes, each group picks flat or two-level collectives (Note [Flat or hierarchical]):
  // LOOM_COLL_ALGO, auto by default. On one node every group stays flat, with no measurement.
  if (nodes_.nodes() > 1) {
    const comm::Algorithm algorithm = comm::algorithm_from_env();
    // Each group's ranks' nodes, in group order (known from the world's map: no exchange).
    auto set = [&](comm::Communicator& group, auto world_rank_of_member) {
      std::vector<int> node_of_rank;
      for (int i = 0; i < group.size(); ++i)
        node_of_rank.push_back(node_of(world_rank_of_member(i)));
      if (group.size() > 1) group.set_algorithm(algorithm, node_of_rank);
    };
    set(*tp_group_, [&](int i) { return rank_of({c.pp, c.dp, i}); });
    set(*dp_group_, [&](int i) { return rank_of({c.pp, i, c.tp}); });
    set(*pp_group_, [&](int i) { return rank_of({i, c.dp, c.tp}); });
  }
  const std::vector<std::string> crossing = tp_groups_across_nodes();
  if (!crossing.empty() && world_->rank() == 0) {
    std::fprintf(stderr,
                 "loom: warning: %zu tensor-parallel group(s) span nodes, e.g. %s: their "
                 "per-layer collectives cross the network. Place consecutive ranks on one node "
                 "(mpirun --map-by slot, the default) with tp at most the ranks per node.\n",
                 crossing.size(), crossing.front().c_str());
  }
}

DeviceMesh DeviceMesh::plan(int world_rank, int pp, int dp, int tp) {
  LOOM_CHECK(pp > 0 && dp > 0 && tp > 0, "DeviceMesh::plan: sizes must be positive, got pp ", pp,
             " dp ", dp, " tp ", tp);
  DeviceMesh m(pp, dp, tp);
  m.world_ = comm::make_planning_communicator(world_rank, pp * dp * tp, "world");
  const MeshCoords c = m.coords_of(world_rank);
  m.coords_ = c;
  m.tp_group_ = comm::make_planning_communicator(c.tp, tp, tp_name(c));
  m.dp_group_ = comm::make_planning_communicator(c.dp, dp, dp_name(c));
  m.pp_group_ = comm::make_planning_communicator(c.pp, pp, pp_name(c));
  m.nodes_.node_of_rank.assign(size_t(pp) * dp * tp, 0);
  m.nodes_.names = {"planned"};
  return m;
}

int DeviceMesh::rank_of(const MeshCoords& c) const {
  LOOM_CHECK(c.pp >= 0 && c.pp < pp_ && c.dp >= 0 && c.dp < dp_ && c.tp >= 0 && c.tp < tp_,
             "DeviceMesh::rank_of: (pp ", c.pp, ", dp ", c.dp, ", tp ", c.tp, ") is outside ",
             str());
  return (c.pp * dp_ + c.dp) * tp_ + c.tp;
}

MeshCoords DeviceMesh::coords_of(int world_rank) const {
  LOOM_CHECK(world_rank >= 0 && world_rank < pp_ * dp_ * tp_, "DeviceMesh::coords_of: rank ",
             world_rank, " outside a world of ", pp_ * dp_ * tp_);
  return MeshCoords{world_rank / (dp_ * tp_), (world_rank / tp_) % dp_, world_rank % tp_};
}

std::shared_ptr<comm::Communicator> DeviceMesh::new_group(const std::vector<int>& world_ranks,
                                                          const std::string& name) const {
  LOOM_CHECK(!world_ranks.empty(), "DeviceMesh::new_group '", name, "': no ranks given");
  std::vector<int> sorted = world_ranks;
  std::sort(sorted.begin(), sorted.end());
  LOOM_CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(),
             "DeviceMesh::new_group '", name, "': a rank is listed twice");
  LOOM_CHECK(sorted.front() >= 0 && sorted.back() < world_->size(), "DeviceMesh::new_group '", name,
             "': ranks must be in [0, ", world_->size(), "), got ", sorted.front(), "..",
             sorted.back());
  auto it = std::find(world_ranks.begin(), world_ranks.end(), world_->rank());
  const bool member = it != world_ranks.end();
  const int key = member ? int(it - world_ranks.begin()) : world_->rank();
  // Every rank splits (a collective); the non-members form a group of their own and drop it.
  std::shared_ptr<comm::Communicator> group =
      world_->split(member ? 1 : 0, key, member ? name : name + ".nonmembers");
  return member ? group : nullptr;
}

int DeviceMesh::node_of(int world_rank) const {
  LOOM_CHECK(world_rank >= 0 && world_rank < int(nodes_.node_of_rank.size()),
             "DeviceMesh::node_of: rank ", world_rank, " outside a world of ",
             nodes_.node_of_rank.size());
  return nodes_.node_of_rank[size_t(world_rank)];
}

namespace {

// The nodes the ranks of one group sit on, in order.
std::set<int> nodes_of(const DeviceMesh& m, const std::vector<int>& ranks) {
  std::set<int> out;
  for (int r : ranks) out.insert(m.node_of(r));
  return out;
}

std::string list(const std::set<int>& nodes) {
  std::string s;
  for (int n : nodes) s += (s.empty() ? "" : ", ") + std::to_string(n);
  return s;
}

}  // namespace

std::vector<std::string> DeviceMesh::tp_groups_across_nodes() const {
  std::vector<std::string> out;
  for (int p = 0; p < pp_; ++p)
    for (int d = 0; d < dp_; ++d) {
      std::vector<int> ranks;
      for (int t = 0; t < tp_; ++t) ranks.push_back(rank_of({p, d, t}));
      const std::set<int> nodes = nodes_of(*this, ranks);
      if (nodes.size() > 1) out.push_back(tp_name({p, d, 0}) + " on nodes " + list(nodes));
    }
  return out;
}

std::string DeviceMesh::placement() const {
  std::string s;
  for (int n = 0; n < nodes_.nodes(); ++n) {
    std::vector<int> ranks;
    for (size_t r = 0; r < nodes_.node_of_rank.size(); ++r)
      if (nodes_.node_of_rank[r] == n) ranks.push_back(int(r));
    std::string rs;
    for (size_t i = 0; i < ranks.size(); ++i) {  // runs of consecutive ranks as a-b
      size_t j = i;
      while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
      // Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on
      // `"..." + std::string&&`.
      if (!rs.empty()) rs += ", ";
      rs += std::to_string(ranks[i]);
      if (j > i) (rs += '-') += std::to_string(ranks[j]);
      i = j;
    }
    s += detail::str_cat("node ", n, " (", nodes_.names[size_t(n)], "): ranks ", rs, "\n");
  }
  // Per group kind: how many nodes its groups span (the most of any group).
  auto span = [&](const char* kind, int count, int size, auto ranks_of_group) {
    size_t most = 0;
    for (int g = 0; g < count; ++g) {
      std::vector<int> ranks;
      for (int i = 0; i < size; ++i) ranks.push_back(ranks_of_group(g, i));
      most = std::max(most, nodes_of(*this, ranks).size());
    }
    s += detail::str_cat(kind, " groups: ", count, " of ", size, " rank(s), ",
                         most <= 1 ? std::string("each inside one node")
                                   : detail::str_cat("spanning up to ", most, " nodes"),
                         "\n");
  };
  span("tp", pp_ * dp_, tp_, [&](int g, int i) { return rank_of({g / dp_, g % dp_, i}); });
  span("dp", pp_ * tp_, dp_, [&](int g, int i) { return rank_of({g / tp_, i, g % tp_}); });
  span("pp", dp_ * tp_, pp_, [&](int g, int i) { return rank_of({i, g / tp_, g % tp_}); });
  // This rank's groups: flat, or how they pick two-level collectives.
  for (const comm::Communicator* g : {tp_group_.get(), dp_group_.get(), pp_group_.get()})
    if (g->algorithm() != comm::Algorithm::kFlat)
      s += detail::str_cat("collectives of group '", g->name(), "': ", g->algorithm_str(), "\n");
  return s;
}

std::string DeviceMesh::str() const {
  return detail::str_cat("mesh pp ", pp_, " x dp ", dp_, " x tp ", tp_, " (rank ", world_->rank(),
                         " at pp ", coords_.pp, ", dp ", coords_.dp, ", tp ", coords_.tp, ")");
}

}  // namespace loom::parallel
