// DeviceMesh: the world's ranks arranged [pp][dp][tp], tp varying fastest, so the ranks of a
// tensor-parallel group are consecutive and sit on one node (as in Megatron):
//   world rank = (pp_index * dp + dp_index) * tp + tp_index
// It builds the named groups every parallel feature uses — tp (same pp, dp indices), dp (same
// pp, tp), pp (same dp, tp) — and custom groups (tied embeddings of the first and last stage,
// Chimera replica pairs) from explicit rank lists. Only parallel/ knows the mesh.
//
// It also learns which ranks share a node (collectives/topology.h): with ranks placed on nodes
// by slot (mpirun's default, and scripts/cluster.sh's), consecutive ranks share a node, so each
// tp group, innermost, is inside one node. When a tp group spans nodes anyway (ranks placed
// round-robin, or a tp larger than a node), world rank 0 warns, naming the group and its nodes:
// its per-layer collectives then cross the network. placement() lists rank -> node and, per
// group kind, the nodes each group spans.
//
// Across nodes, the tp, dp and pp groups each pick flat or two-level collectives
// (Communicator::set_algorithm, Note [Flat or hierarchical] in collectives/algorithm.cpp) as
// LOOM_COLL_ALGO says: auto (the default: per call, by a cost table measured here), flat or
// hier. The world communicator passed in is left as it was.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/topology.h"

namespace loom::parallel {

struct MeshCoords {
  int pp = 0;
  int dp = 0;
  int tp = 0;
};

class DeviceMesh {
 public:
  // Collective over `world`: every rank must construct it with the same sizes. Throws
  // loom::Error when pp * dp * tp differs from the world size or a size is not positive.
  DeviceMesh(std::shared_ptr<comm::Communicator> world, int pp, int dp, int tp);
  // Rank `world_rank`'s view of a mesh that is not running: every group is a planning group
  // (collectives/planning_backend.h) of the right rank and size, so modules built over it hold
  // what that rank would, and any communication is an error. new_group is refused.
  static DeviceMesh plan(int world_rank, int pp, int dp, int tp);

  int pp_size() const { return pp_; }
  int dp_size() const { return dp_; }
  int tp_size() const { return tp_; }
  const MeshCoords& coords() const { return coords_; }  // this rank's place
  int rank_of(const MeshCoords& c) const;               // world rank at a place
  MeshCoords coords_of(int world_rank) const;

  comm::Communicator& world() const { return *world_; }
  comm::Communicator& tp() const { return *tp_group_; }
  comm::Communicator& dp() const { return *dp_group_; }
  comm::Communicator& pp() const { return *pp_group_; }
  std::shared_ptr<comm::Communicator> world_ptr() const { return world_; }
  std::shared_ptr<comm::Communicator> tp_ptr() const { return tp_group_; }
  std::shared_ptr<comm::Communicator> dp_ptr() const { return dp_group_; }
  std::shared_ptr<comm::Communicator> pp_ptr() const { return pp_group_; }

  // A group of the given world ranks (in that order: position i becomes group rank i), named
  // `name`. Collective over the world: every rank calls it with the same list; ranks outside the
  // list get nullptr. Throws for an empty list, duplicates or ranks outside the world.
  std::shared_ptr<comm::Communicator> new_group(const std::vector<int>& world_ranks,
                                                const std::string& name) const;

  std::string str() const;  // "mesh pp 2 x dp 2 x tp 2 (rank 5 at pp 1, dp 0, tp 1)"

  // The node of each world rank (a planned mesh has one node), and their host names.
  const comm::NodeMap& nodes() const { return nodes_; }
  int node_of(int world_rank) const;
  // The tp groups that span more than one node, as "tp[pp 0, dp 1] on nodes 0, 1" lines.
  std::vector<std::string> tp_groups_across_nodes() const;
  // Multi-line: "node 0 (host): ranks 0-3" per node, then per group kind how many nodes each
  // group spans ("tp groups: 4, each inside one node").
  std::string placement() const;

 private:
  DeviceMesh(int pp, int dp, int tp) : pp_(pp), dp_(dp), tp_(tp) {}

  std::shared_ptr<comm::Communicator> world_;
  int pp_, dp_, tp_;
  MeshCoords coords_;
  std::shared_ptr<comm::Communicator> tp_group_, dp_group_, pp_group_;
  comm::NodeMap nodes_;
};

}  // namespace loom::parallel
