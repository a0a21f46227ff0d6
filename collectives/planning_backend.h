// A group that carries no data: rank r of n, for working out what a rank of a layout would hold
// without launching it (loom-ckpt check plans every target rank's checkpoint reads in one
// process). Modules and plans read its rank() and size(); any communication through it is an
// error naming the group, since the other ranks do not exist.
#pragma once

#include <memory>
#include <string>

#include "collectives/communicator.h"

namespace loom::comm {

std::shared_ptr<Communicator> make_planning_communicator(int rank, int size,
                                                         const std::string& name);

}  // namespace loom::comm
