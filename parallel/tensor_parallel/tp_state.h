// Whole (single-process) parameters from and to a tensor-parallel model: every rank of the tp
// group holds its ShardSpec slice of each sharded parameter and all of each whole one.
#pragma once

#include "core/nn/module.h"
#include "parallel/tensor_parallel/tp_comm.h"

namespace loom::parallel {

// Every parameter at its full shape (ShardSpec::full_shape), the same on every rank: the shards
// are all-gathered over `tp` (collective: every rank calls it, in the same order of names).
nn::StateDict gather_full_state(const nn::Module& module, comm::Communicator& tp);

// Loads whole parameters: each sharded one takes its ShardSpec slice of the full tensor. A
// parameter whose rows from some index on are padding (Init::zero_rows_from: a vocabulary padded
// further for tp) may come with fewer rows, down to that index; the rest are zeros. Any other
// shape difference is an error naming the parameter and both shapes, as is a missing or an
// unexpected key. Local: no communication. Nothing changes when an error is raised.
void load_full_state(nn::Module& module, const nn::StateDict& full);

}  // namespace loom::parallel
