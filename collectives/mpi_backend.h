// The MPI backend (Open MPI from Debian): CPU buffers directly; CUDA buffers staged through host
// memory (Open MPI from Debian is not CUDA-aware). Nonblocking MPI calls (MPI_Iallreduce, ...)
// polled to completion with a deadline (See Note [Deadlines] in communicator.cpp). bf16 and f16
// reductions are computed in f32 (converted, reduced, converted back). Built only with MPI.
#pragma once

#include <cstdint>
#include <memory>

#include "collectives/communicator.h"

namespace loom::comm {

// The MPI world (MPI_COMM_WORLD). Initialises MPI (MPI_THREAD_SERIALIZED) on the first call and
// registers its finalisation at exit.
std::shared_ptr<Communicator> make_mpi_world();

// The most elements one MPI call carries (MPI counts are int; default INT_MAX). Larger
// allreduce, reduce, broadcast and send/recv are split into pieces of at most this many;
// reduce_scatter, allgather and all_to_all beyond it raise loom::Error before anything is
// posted. Tests lower it to exercise those paths; set it to the same value on every rank.
int64_t mpi_max_count();
void set_mpi_max_count(int64_t count);

}  // namespace loom::comm
