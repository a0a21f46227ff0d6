// Keeping the replicas of a model identical across a data-parallel group: DDP and ZeRO call these
// when they wrap a model. All are collective over the group.
#pragma once

#include <functional>
#include <string>

#include "collectives/communicator.h"
#include "core/nn/module.h"
#include "parallel/bucket_plan.h"

namespace loom::parallel {

// What DDP and ZeRO do when they wrap `module`: check that every rank built the same model, then
// make the replicas identical (broadcast rank 0's values) or, with check_replicas, verify that
// they are. Returns the module's named parameters.
NamedParams agreed_parameters(nn::Module& module, comm::Communicator* group, bool check_replicas,
                              const char* owner);
// The same for a given list (a module's parameters less those a rank holds alone).
NamedParams agreed_parameters(NamedParams params, comm::Communicator* group, bool check_replicas,
                              const char* owner);

// The module's parameters that `own` names (own_side true) or does not (false); with no `own`,
// all of them are shared (DdpOptions / ZeroOptions::own_parameters: a rank's own parameters,
// expert parallelism's experts, are not replicas of the other ranks').
NamedParams parameters_by_owner(nn::Module& module,
                                const std::function<bool(const std::string&)>& own, bool own_side);

// Every rank must hold the same parameter list: the same names, shapes and dtypes in the same
// order. Throws on every rank, naming the first rank and parameter that differ from rank 0.
void check_same_parameters(const NamedParams& params, comm::Communicator& group, const char* owner);

// Copies rank `root`'s parameter values to every rank (one broadcast of the packed bytes).
void broadcast_parameters(const NamedParams& params, comm::Communicator& group, int root = 0);

// Throws on every rank, naming the first parameter whose bytes differ from rank 0's and the
// ranks holding a different value.
void check_replicas_identical(const NamedParams& params, comm::Communicator& group,
                              const char* owner);

}  // namespace loom::parallel
