// The trivial backend: a group of one rank, no MPI, no GPU. Every loom program runs alone on it
// (world() picks it when not launched by mpirun). Collectives copy input to output; a send to
// itself is matched by a later recv with the same tag.
#pragma once

#include <memory>
#include <string>

#include "collectives/communicator.h"

namespace loom::comm {

std::shared_ptr<Communicator> make_self_communicator(const std::string& name);

}  // namespace loom::comm
