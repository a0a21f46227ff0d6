// The last step of a small collective carried by its signature check (Note [Small collectives
// in their check], communicator.cpp): the check's exchange hands every rank all ranks' inputs,
// and each rank computes its outputs from them here, in rank order, so every rank gets the same
// bits whatever the message pattern was.
#pragma once

#include "collectives/communicator.h"

namespace loom::comm {

// out = `op` over the `n` blocks at `gathered` (rank j's input is block j, `block_bytes` bytes of
// `dtype`), elements [first, first + out.numel()) of each block, combined in rank order:
// ((b0 op b1) op b2) ... bf16/f16 accumulate in f32 and are rounded once (after the division for
// avg), as the MPI backend's staged reductions are (Note [MPI staging]). `out`: a contiguous host
// tensor of `dtype`; `gathered`: n x block_bytes of host memory, not overlapping `out`.
void reduce_in_rank_order(const void* gathered, size_t block_bytes, int n, DType dtype,
                          ReduceOp op, int64_t first, const Tensor& out);

}  // namespace loom::comm
