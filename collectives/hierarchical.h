// Hierarchical collectives (BlueConnect): a group that spans nodes reduces in two levels, so
// that the slow links between nodes carry 1/L of the data (L ranks per node) instead of all of
// it.
//   allreduce      = reduce-scatter inside the node, allreduce across nodes of the 1/L chunk each
//                    rank holds, all-gather inside the node; a large one in pieces, each
//                    piece's step across nodes beside the next piece's inside the node
//   reduce_scatter = reduce-scatter inside the node of each node's slice, then across nodes
//   allgather      = all-gather across nodes, then inside the node into each node's slice
//   all_to_all     = (Tutel's 2DH) an all-to-all inside the node that gathers on each rank what
//                    its node sends to one local index, then one across nodes among the ranks
//                    of that local index: N/L messages cross the network per rank, of L chunks
//                    each, instead of N - N/L single chunks. With variable splits, the node's
//                    ranks first exchange their split sizes (one small all-to-all inside the
//                    node), since a rank forwards what its neighbours send.
// Each level is an ordinary collective on a sub-group (with deadlines), and the steps of one
// call are held in a Work: posting each step when the one it needs completes, while the caller
// polls or waits. A call routed by a Communicator is checked there whole, as the user made it,
// and its steps go unchecked; a call made here directly checks each step (Checks). Results equal
// the flat call's up to rounding (sums are associated differently: node first; bf16/f16 round at
// each level); integer sums, max and min are exact. avg is a sum at both levels divided once by the
// group size (floating dtypes).
//
// Ranks must be spread evenly: every node holds the same number of the group's ranks, and group
// rank r of node n sits at place (n, local index) in node order then rank order (what placing
// consecutive ranks on a node gives). Otherwise applies() is false and the caller stays flat.
// Knows no mesh. A Communicator routes its own collectives here once set_algorithm() gave it a
// Hierarchy (Note [Flat or hierarchical] in collectives/algorithm.cpp); parallel/ says which
// groups.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/topology.h"

namespace loom::comm {

// A two-level allreduce of more than kAllreducePieceBytes runs as pieces of about that size, at
// most kMaxAllreducePieces, each piece's step across nodes overlapping the next one's inside the
// node (Note [Pipelined two-level allreduce] in hierarchical.cpp).
constexpr size_t kAllreducePieceBytes = size_t(4) << 20;
constexpr int kMaxAllreducePieces = 4;
// How many pieces an allreduce of `bytes` runs as, with pieces of about `piece_bytes` (0: one).
int allreduce_pieces(size_t bytes, size_t piece_bytes);

class Hierarchy {
 public:
  // Collective over `group`. `nodes`: each group rank's node (default: node_map(group)); a
  // test may give another split of one host.
  // Holds only the two sub-groups it splits off, not `group`.
  explicit Hierarchy(Communicator& group, std::vector<int> node_of_rank = {});
  explicit Hierarchy(const std::shared_ptr<Communicator>& group, std::vector<int> node_of_rank = {})
      : Hierarchy(*group, std::move(node_of_rank)) {}

  // True when the group spans more than one node with the same number of ranks on each, ranks
  // of a node consecutive: the two-level forms apply.
  bool applies() const { return applies_; }
  int ranks_per_node() const { return local_; }
  int nodes() const { return nodes_; }
  Communicator& intra() const { return *intra_; }  // this rank's node
  Communicator& inter() const { return *inter_; }  // this local index on every node
  std::shared_ptr<Communicator> intra_ptr() const { return intra_; }
  std::shared_ptr<Communicator> inter_ptr() const { return inter_; }
  std::string str() const;  // "2 nodes x 4 ranks (hierarchical)" or why not

  // The size allreduce() cuts its data into (0: never cut; default kAllreducePieceBytes). Every
  // rank must set the same.
  void set_piece_bytes(size_t bytes) { piece_bytes_ = bytes; }
  size_t piece_bytes() const { return piece_bytes_; }

  // Who checks a call's signature (Note [Two-level calls checked whole] in hierarchical.cpp):
  // each step on its sub-group (a call made on the Hierarchy directly), or the group the
  // Hierarchy serves, once for the whole call and before it is made (a Communicator's routed
  // calls), its steps then posted without checks of their own. An all-to-all with splits
  // checks its steps either way: their sizes come from the splits, which no signature holds.
  enum class Checks : uint8_t { kEachStep, kByCaller };

  // The group's collectives in two levels (as Communicator's: same arguments and results).
  // Require applies().
  WorkPtr allreduce(const Tensor& input, Tensor& output, ReduceOp op = ReduceOp::kSum,
                    Checks checks = Checks::kEachStep);
  WorkPtr allreduce(Tensor& tensor, ReduceOp op = ReduceOp::kSum) {
    return allreduce(tensor, tensor, op);
  }
  WorkPtr reduce_scatter(const Tensor& input, Tensor& output, ReduceOp op = ReduceOp::kSum,
                         Checks checks = Checks::kEachStep);
  WorkPtr allgather(const Tensor& input, Tensor& output, Checks checks = Checks::kEachStep);
  WorkPtr all_to_all(const Tensor& input, Tensor& output, const AllToAllOptions& options = {},
                     Checks checks = Checks::kEachStep);

  ~Hierarchy();
  Hierarchy(const Hierarchy&) = delete;
  Hierarchy& operator=(const Hierarchy&) = delete;

  // The calls in flight, posted in call order (Note [Two-level calls in call order]).
  struct Chains;

 private:
  struct Step;  // one collective of a call, on the node's or the across-nodes group
  // A call of `op` made of `steps`, posted in turn, then `finish`.
  WorkPtr chain(const char* op, std::vector<Step> steps, std::function<void()> finish,
                Checks checks);
  WorkPtr all_to_all_equal(const Tensor& input, Tensor& output, Checks checks);
  WorkPtr all_to_all_variable(const Tensor& input, Tensor& output, const AllToAllOptions& options);

  std::shared_ptr<Chains> chains_;
  std::shared_ptr<Communicator> intra_, inter_;
  int size_ = 1;  // the group's
  bool applies_ = false;
  int nodes_ = 1, local_ = 1;
  size_t piece_bytes_ = kAllreducePieceBytes;
  std::string why_not_;
};

}  // namespace loom::comm
