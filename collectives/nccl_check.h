// LOOM_NCCL_CHECK: every NCCL call of the nccl backend goes through it. A failing call becomes
// loom::comm::CommError naming the call, NCCL's error string, NCCL's own last-error text (which
// says what went wrong, e.g. which peer), file:line, and the collective it belongs to when one is
// given (LOOM_NCCL_CHECK_IN). ncclInProgress is not a failure: nonblocking communicators return
// it while they finish the call in the background (See Note [Nonblocking NCCL] in
// nccl_backend.cpp), so the check returns the code for the caller to wait on.
// Internal to the nccl backend: include only from collectives/nccl_*.cpp.
#pragma once

#include <nccl.h>

#include <string>

#include "collectives/communicator.h"

namespace loom::comm {

// Throws CommError unless code is ncclSuccess or ncclInProgress, which it returns. `comm` (may be
// null) is asked for ncclGetLastError; `call` is the call's source text (only the name before '('
// is printed); `context` is Communicator::describe() of the op, or empty.
ncclResult_t check_nccl(ncclResult_t code, ncclComm_t comm, const char* call, const char* file,
                        int line, const std::string& context = {});

// The CommError text for a failed NCCL result, without throwing (for the waits, which abort the
// communicator before raising).
std::string nccl_failure(ncclResult_t code, ncclComm_t comm, const std::string& what,
                         const std::string& context);

}  // namespace loom::comm

// (The communicator argument is not called `comm`: the macros expand to ::loom::comm::...)
#define LOOM_NCCL_CHECK(nccl_comm, call) \
  ::loom::comm::check_nccl((call), (nccl_comm), #call, __FILE__, __LINE__)
#define LOOM_NCCL_CHECK_IN(context, nccl_comm, call) \
  ::loom::comm::check_nccl((call), (nccl_comm), #call, __FILE__, __LINE__, (context))
