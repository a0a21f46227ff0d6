// Which ranks of a group share a machine ("node"): tensor parallelism and the hierarchical
// collectives want their busiest groups inside one, where links are fastest (NVLink, shared
// memory) rather than across the network. Knows no mesh: parallel/mesh.cpp places its groups
// with it.
#pragma once

#include <string>
#include <vector>

#include "collectives/communicator.h"

namespace loom::comm {

struct NodeMap {
  std::vector<int> node_of_rank;   // group rank -> node index, nodes numbered by first rank
  std::vector<std::string> names;  // node index -> its host name
  int nodes() const { return int(names.size()); }
};

// Collective over `group` (every rank calls it): each rank's host name, gathered. Two ranks
// share a node when their host names are equal, which is how Open MPI itself decides that ranks
// share memory (MPI_Comm_split_type's MPI_COMM_TYPE_SHARED), and works for every backend. A
// name longer than 63 bytes is compared on its first 63.
NodeMap node_map(Communicator& group);

}  // namespace loom::comm
