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

// Note [Node-interleaved exchange order]
// A dissemination over n ranks (the signature check's exchange, Note [Signature exchange] in
// mpi_exchange.cpp: in round k each rank sends to the one 2^k places before it, ceil(log2 n)
// rounds) waits in every round for its slowest message. In group-rank order on N nodes of R ranks
// every round has pairs on two nodes, so each costs a network latency. Laid out by (index within
// its node, node) instead, positions p and p - 2^k share a node whenever N divides 2^k: with N a
// power of two only the first log2 N rounds cross between nodes and the rest stay inside one (2
// nodes x 4 ranks: 1 crossing round of 3; 4 x 2: 2 of 3), and their larger messages (a carried
// allgather's later rounds move the most blocks) go over shared memory. Any order is correct.
// Nodes of unequal sizes can make the interleaved order cross in more rounds (6 ranks on one
// node and 2 on another, every fourth rank: 3 against 2), so the order is whichever of the two
// crosses in fewer rounds, group-rank order on a tie.
//
// The group ranks in exchange order (order[p]: the rank at position p). node_of_rank is
// NodeMap's (nodes numbered by first rank); one node gives 0..n-1.
std::vector<int> exchange_order(const std::vector<int>& node_of_rank);

}  // namespace loom::comm
