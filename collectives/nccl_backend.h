// The NCCL backend: CUDA buffers, moved by NCCL on a communication stream of each communicator's
// own that is ordered after the compute stream with events (See Note [NCCL streams] in
// nccl_backend.cpp). bf16 and f16 reductions are computed in f32. One GPU per rank: the rank with
// index L among the ranks of its node uses GPU L. Built only with NCCL (LOOM_WITH_NCCL, which
// needs CUDA and MPI).
//
// Most programs do not call this directly: world() (backend "auto" under mpirun, or "nccl")
// returns MPI and NCCL behind one group, CPU tensors going to MPI and CUDA tensors to NCCL
// (collectives/device_router.h).
#pragma once

#include <memory>

#include "collectives/communicator.h"

namespace loom::comm {

// An NCCL communicator over the ranks of `host`, with host's name, ranks and order. Collective over
// `host` (every rank calls it): the ranks first agree that each has a GPU of its own (else
// loom::Error on every rank, naming the ranks without one), then rank 0's NCCL unique id reaches
// the others through host->broadcast. `host` is not kept: splits use ncclCommSplit. Its
// backend() is "nccl"; CPU tensors given to it are staged through the GPU.
std::shared_ptr<Communicator> make_nccl_communicator(const std::shared_ptr<Communicator>& host);

// world("auto") under mpirun, and world("nccl"), when loom has NCCL: the MPI world with NCCL for
// CUDA tensors behind a device router (backend "mpi+nccl") when every rank has a GPU of its own.
// Otherwise, `required` false: the plain MPI world, exactly as without NCCL (CUDA tensors staged
// through the host); `required` true: loom::Error on every rank, naming the ranks without a GPU.
std::shared_ptr<Communicator> make_mpi_nccl_world(bool required);

// The GPU of this rank: where its CUDA tensors must live to go through NCCL (the index of the rank
// among the ranks of its node). -1 until this process has created an NCCL communicator.
int nccl_device();

}  // namespace loom::comm
