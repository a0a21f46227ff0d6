// Host collectives loom makes of MPI point-to-point messages where Open MPI's own are slower: the
// direct reduce-scatter in every group, the allreduce and allgather in groups inside one node
// (Note [Direct collectives inside one node] in mpi_direct.cpp). Internal to the mpi backend:
// include only from collectives/mpi_*.cpp.
#pragma once

#include <cstdint>
#include <memory>

#include "collectives/communicator.h"
#include "collectives/mpi_work.h"
#include "core/tensor.h"

namespace loom::comm::mpi_impl {

// The first tag of the direct collectives' messages on the check channel: above every tag of a
// signature exchange (< 2 x 32). Each call takes its own, counted per group (Note [Direct
// reduce-scatter]).
constexpr int kDirectTag = 64;

// Whether an allreduce of `bytes` over n ranks goes direct (Note [Direct allreduce]).
bool direct_allreduce_fits(int64_t bytes, int n);

enum class DirectReductionKind { kReduceScatter, kAllreduce };

// A direct reduce-scatter (Note [Direct reduce-scatter]), or an allreduce made of one and an
// allgather of the reduced blocks (Note [Direct allreduce]). `channel`: the communicator the
// messages travel on (the check channel's). A reduce-scatter's output is this rank's block; an
// allreduce's is the whole result. `spare` lends scratch buffers and takes them back.
WorkPtr direct_reduction(DirectReductionKind kind, std::shared_ptr<CommHandle> channel,
                         OpContext context, double timeout_s, int rank, int n, const Tensor& input,
                         const Tensor& output, ReduceOp op, int tag, SpareScratch spare);

// A direct allgather (Note [Direct allgather]) on `channel` under `tag`.
WorkPtr direct_allgather(std::shared_ptr<CommHandle> channel, OpContext context, double timeout_s,
                         int rank, int n, const Tensor& input, const Tensor& output, int tag);

}  // namespace loom::comm::mpi_impl
