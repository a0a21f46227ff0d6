// The cost table a group picks flat or hierarchical collectives by (Algorithm::kAuto; Note [Flat
// or hierarchical] in algorithm.cpp): an alpha-beta model (time = alpha + beta x bytes) of each
// level's allreduce, reduce-scatter, all-gather and all-to-all — the whole group (flat), the ranks
// of one node, the ranks of one local index across nodes — and of a local copy, measured when the
// algorithm is set and made the same on every rank (each entry the slowest rank's), so that every
// rank picks alike.
#pragma once

#include <cstddef>
#include <string>

#include "collectives/communicator.h"
#include "collectives/hierarchical.h"

namespace loom::comm {

// The smallest size crossover() considers.
constexpr size_t kSmallestCrossover = size_t(1) << 10;

struct AlphaBeta {
  double alpha_s = 0;          // seconds per call
  double beta_s_per_byte = 0;  // seconds per byte
  double at(double bytes) const { return alpha_s + beta_s_per_byte * bytes; }
  // The line through (small, t_small) and (large, t_large), neither part negative.
  static AlphaBeta fit(double small, double t_small, double large, double t_large);
};

struct CollectiveCosts {
  int nodes = 1, ranks_per_node = 1;
  // By the bytes of an allreduce's, a reduce-scatter's or an all-to-all's input, an
  // all-gather's output.
  AlphaBeta flat_allreduce, intra_allreduce, inter_allreduce;
  AlphaBeta flat_reduce_scatter, intra_reduce_scatter, inter_reduce_scatter;
  AlphaBeta flat_allgather, intra_allgather, inter_allgather;
  AlphaBeta flat_all_to_all, intra_all_to_all, inter_all_to_all;
  AlphaBeta copy;  // a local copy of `bytes` (the two-level forms' staging)
  size_t piece_bytes = kAllreducePieceBytes;  // the two-level allreduce's (Hierarchy's)
  // An allreduce of `pieced_bytes` (kMaxAllreducePieces pieces) timed whole, flat and in two
  // levels, in seconds; 0: not measured (Note [Pieced allreduces timed whole]).
  double pieced_bytes = 0, flat_allreduce_pieced = 0, hier_allreduce_pieced = 0;

  // Predicted seconds of a call of `op` ("allreduce", "reduce_scatter", "allgather",
  // "all_to_all") moving `bytes` (an allreduce's, reduce-scatter's or all-to-all's input, an
  // all-gather's output) flat and in two levels.
  double flat(const std::string& op, double bytes) const;
  double hierarchical(const std::string& op, double bytes) const;
  // Two levels when predicted at least kHierarchicalMargin of the flat call's time faster (See
  // Note [A margin for two levels] in algorithm.cpp), or kTimedMargin where both forms were
  // timed whole at the size (Note [Pieced allreduces timed whole]).
  static constexpr double kHierarchicalMargin = 0.2;
  static constexpr double kTimedMargin = 0.05;
  bool prefers_hierarchical(const std::string& op, double bytes) const {
    const double margin = timed_whole(op, bytes) ? kTimedMargin : kHierarchicalMargin;
    return hierarchical(op, bytes) < (1.0 - margin) * flat(op, bytes);
  }
  // Whether both forms of `op` at `bytes` come from calls timed whole: a pieced allreduce
  // (more than piece_bytes) when pieced_bytes was measured.
  bool timed_whole(const std::string& op, double bytes) const;
  // The smallest power-of-two size from 1 KiB to 1 GiB at which `op` goes hierarchical (and
  // stays so up to 1 GiB), or 0 when none.
  size_t crossover(const std::string& op) const;
  // "allreduce: hierarchical from 4 MiB; ..." and each level's alpha (us) and bandwidth (GB/s).
  std::string str() const;
};

// Measures the table for `group` split as `levels` (which must apply()): collective over the
// group, every rank calls it; blocking; host buffers of 4 KiB and 1 MiB, and the pieced
// allreduce at kMaxAllreducePieces x levels.piece_bytes() (unless that is 0).
CollectiveCosts measure_costs(Communicator& group, Hierarchy& levels);

}  // namespace loom::comm
