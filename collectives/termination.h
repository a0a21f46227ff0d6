// How a rank's end ends the job: what a rank says when the launcher ends it (See Note
// [Termination by the launcher]) and how a rank that leaves early takes the job with it (See
// Note [Leaving the job]).
#pragma once

#include <string>

namespace loom::comm {

// Installs the SIGTERM and SIGINT reports (once; each only if its signal still has the default
// action, so a program's own handler, Python's SIGINT one included, is never replaced). Called
// when the MPI world is created.
void install_termination_report();

// Marks this thread as waiting in an operation, for its lifetime; describe() names the operation
// once the wait is slow (See Note [Termination by the launcher]).
class WaitingScope {
 public:
  WaitingScope();
  void describe(const std::string& context);
  ~WaitingScope();
  WaitingScope(const WaitingScope&) = delete;
  WaitingScope& operator=(const WaitingScope&) = delete;
};

// ---------------------------------------------------------------- leaving the job

// Ends every rank of the job now (MPI_Abort). Registered by the MPI backend when the world is
// created; `world_size` is the MPI world's.
using JobAbort = void (*)(int status);
void register_job(int world_size, JobAbort abort);

// True while this process is one of several ranks of an MPI job (the world has more than one
// rank and MPI is not finalised).
bool in_multi_rank_job();

// Ends the whole job now with `status` (non-zero): writes "[rank r] loom: aborting the job
// (exit status s): <reason>" to stderr and, in a multi-rank job, calls MPI_Abort, so the other
// ranks end within a second instead of waiting for this one in a collective or in
// MPI_Finalize. Outside such a job it just exits with `status`.
[[noreturn]] void abort_job(int status, const std::string& reason);

// Declares that every rank is about to exit with the same error (one they agreed on, e.g. a
// verdict rank 0 broadcast), so a non-zero exit finalises MPI like a clean one instead of
// aborting the job. See Note [Leaving the job].
void agree_on_exit();
bool exit_agreed();

}  // namespace loom::comm
