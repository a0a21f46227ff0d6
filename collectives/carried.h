// The reductions loom makes itself rather than MPI: a small collective carried by its signature
// check (Note [Small collectives in their check], communicator.cpp) and the MPI backend's direct
// reduce-scatter (Note [Direct reduce-scatter], mpi_direct.cpp). The exchange hands each rank
// every rank's block of the elements it reduces, and the rank combines them here, in rank order,
// so that the result has the same bits whatever the message pattern was.
#pragma once

#include "collectives/communicator.h"

namespace loom::comm {

// out[0, count) = `op` over the n ranks' blocks, elements [first, first + count) of each,
// combined in rank order: ((b0 op b1) op b2) ... Rank j's block is at
// blocks + ((position_of[j] - first_position) mod n) * block_bytes: an exchange holds them rotated,
// by the ranks' positions in its order (Note [Node-interleaved exchange order], topology.h;
// position_of null: position j is rank j). bf16/f16 accumulate in f32 and are rounded once (after
// the division for avg), as the MPI backend's staged reductions are (Note [MPI staging]). Host
// memory; `out` does not overlap the blocks.
void reduce_in_rank_order(const void* blocks, size_t block_bytes, int n, const int* position_of,
                          int first_position, DType dtype, ReduceOp op, int64_t first,
                          int64_t count, void* out);

// The same over blocks wherever they lie: by_rank[j] is rank j's block (count elements). `out`
// may be one of the blocks (a reduce-scatter in place): each tile of the result is combined
// before any of it is written.
void reduce_ranks(const void* const* by_rank, int n, DType dtype, ReduceOp op, int64_t count,
                  void* out);

}  // namespace loom::comm
