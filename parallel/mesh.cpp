#include "parallel/mesh.h"

#include <algorithm>

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

std::string DeviceMesh::str() const {
  return detail::str_cat("mesh pp ", pp_, " x dp ", dp_, " x tp ", tp_, " (rank ", world_->rank(),
                         " at pp ", coords_.pp, ", dp ", coords_.dp, ", tp ", coords_.tp, ")");
}

}  // namespace loom::parallel
