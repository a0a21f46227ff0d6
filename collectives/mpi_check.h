// LOOM_MPI_CHECK: every MPI call of the mpi backend goes through it. Communicators are set to
// MPI_ERRORS_RETURN (make_mpi_world), so a failing call returns a code instead of aborting the
// job; the macro turns it into loom::comm::CommError naming the call, MPI's error string and
// file:line, plus the collective it belongs to when one is given (LOOM_MPI_CHECK_IN).
// Internal to the mpi backend: include only from collectives/mpi_*.cpp.
#pragma once

// The C API only: Open MPI's mpi.h otherwise pulls in its deprecated C++ bindings, which need
// libmpi_cxx at link time.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <string>

#include "collectives/communicator.h"

namespace loom::comm {

// MPI's text for an error code: "MPI_ERR_TRUNCATE: message truncated".
std::string mpi_error_string(int code);

// Throws CommError unless code is MPI_SUCCESS. `call` is the call's source text (only the name
// before '(' is printed); `context` is Communicator::describe() of the op, or empty.
void check_mpi(int code, const char* call, const char* file, int line,
               const std::string& context = {});
// The same for an op's context, formatted only on an error.
inline void check_mpi(int code, const char* call, const char* file, int line,
                      const OpContext& context) {
  if (code != MPI_SUCCESS) check_mpi(code, call, file, line, context.str());
}

}  // namespace loom::comm

#define LOOM_MPI_CHECK(call) ::loom::comm::check_mpi((call), #call, __FILE__, __LINE__)
#define LOOM_MPI_CHECK_IN(context, call) \
  ::loom::comm::check_mpi((call), #call, __FILE__, __LINE__, (context))
