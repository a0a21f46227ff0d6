// A group that routes every call by where its tensors live: CUDA tensors to a device
// communicator (nccl), CPU tensors to a host communicator (mpi). world() builds one when loom has
// NCCL and every rank has a GPU of its own (backend "mpi+nccl"), so a program hands CPU and CUDA
// tensors to the same group and each goes the fast way: NCCL for device memory, MPI for host
// memory, with no staging copies in either direction.
//
// The router is the group the user sees: it checks arguments, counts sequence numbers and ops,
// runs the debug check and owns the timeout; the two communicators inside only move the data
// (See Note [Routing] in device_router.cpp).
#pragma once

#include <memory>

#include "collectives/communicator.h"

namespace loom::comm {

// `host` and `device` must hold the same ranks in the same order under the same name (an NCCL
// communicator made from the MPI one, say); the router takes their rank, size and name, and its
// backend() is "<host>+<device>" ("mpi+nccl"). A batch_p2p that mixes CPU and CUDA tensors posts
// each part on its own communicator. A barrier runs on the host.
std::shared_ptr<Communicator> make_device_router(std::shared_ptr<Communicator> host,
                                                 std::shared_ptr<Communicator> device);

}  // namespace loom::comm
