// The reduction of a small collective carried by its signature check (Note [Small collectives in
// their check], communicator.cpp): the check's exchange hands each rank every rank's block of the
// elements it reduces, and the rank combines them here, in rank order, so that the result has
// the same bits whatever the message pattern was.
#pragma once

#include "collectives/communicator.h"

namespace loom::comm {

// out[0, count) = `op` over the n ranks' blocks, elements [first, first + count) of each,
// combined in rank order: ((b0 op b1) op b2) ... Rank j's block is at
// blocks + ((j - first_rank) mod n) * block_bytes (an exchange may hold them rotated). bf16/f16
// accumulate in f32 and are rounded once (after the division for avg), as the MPI backend's
// staged reductions are (Note [MPI staging]). Host memory; `out` does not overlap the blocks.
void reduce_in_rank_order(const void* blocks, size_t block_bytes, int n, int first_rank,
                          DType dtype, ReduceOp op, int64_t first, int64_t count, void* out);

}  // namespace loom::comm
