// The MPI backend (Open MPI from Debian): CPU buffers directly; CUDA buffers staged through host
// memory (Open MPI from Debian is not CUDA-aware). Nonblocking MPI calls (MPI_Iallreduce, ...)
// polled to completion with a deadline (See Note [Deadlines] in communicator.cpp). bf16 and f16
// reductions are computed in f32 (converted, reduced, converted back). Built only with MPI.
#pragma once

#include <memory>

#include "collectives/communicator.h"

namespace loom::comm {

// The MPI world (MPI_COMM_WORLD). Initialises MPI (MPI_THREAD_SERIALIZED) on the first call and
// registers its finalisation at exit.
std::shared_ptr<Communicator> make_mpi_world();

}  // namespace loom::comm
