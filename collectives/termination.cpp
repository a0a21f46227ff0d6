#include "collectives/termination.h"

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace loom::comm {

// Note [Termination by the launcher]
// When a rank dies (killed, or exits without finalising), mpirun ends the whole job: it sends
// the other ranks SIGTERM (then SIGKILL), prints which rank failed, and exits non-zero. So
// nothing hangs, but the survivors would vanish without a word while they waited in a
// collective. With this report each survivor writes one line naming the operation it was
// waiting in (group, op, sequence number, bytes) before dying by the same signal. The line is
// formatted into one of two buffers once the wait has polled a thousand times (the slow part of
// a wait, where its deadline runs; formatting it in every wait cost a small collective a tenth
// of its time), so the handler only calls write(); a wait still in its first microseconds says
// only that it was in a collective.
// SIGINT reaching one rank of a C++ program (Ctrl-C, kill -INT) gets the same treatment: the
// rank says it was interrupted (and in which wait) and dies by the signal, which makes mpirun
// end the job at once. Python installs its own SIGINT handler (KeyboardInterrupt), which is
// left alone: an uncaught KeyboardInterrupt ends the job through Note [Leaving the job].
//
// Note [Leaving the job]
// MPI_Finalize is collective, and a rank that left early never joins the collectives the others
// wait in, so before this note a rank that failed alone (a check only rank 0 makes, an
// exception, sys.exit(3), Ctrl-C caught by the script) sat in MPI_Finalize while the others
// waited out LOOM_COMM_TIMEOUT (300 s). Now, when loom initialised MPI:
// - A process that exits with a non-zero status in a multi-rank job aborts the job: the MPI
//   backend's exit handler (glibc's on_exit, which sees the status; atexit elsewhere) writes
//   "[rank r] loom: aborting the job (exit status s): ..." and calls MPI_Abort. mpirun then
//   ends the other ranks (each says which collective it was waiting in) and exits non-zero.
//   C++ programs that catch loom::Error in main and return 1 get this without a change.
// - Python: `import loom` chains sys.excepthook, so an uncaught exception (KeyboardInterrupt
//   included) prints its traceback and then aborts the job with abort_job(), before the
//   interpreter's teardown (which could block on threads or on pending works).
//   sys.exit(n != 0) takes the exit-handler path after the teardown.
// - A clean exit (status 0), or a failure every rank agreed on (agree_on_exit(): e.g. rank 0
//   checked an output path and broadcast the verdict), finalises MPI. Finalising waits for every
//   rank, so the handler first waits in a barrier with the collective deadline
//   (LOOM_COMM_TIMEOUT); a rank that exits 0 while the others still expect it in a collective
//   (sys.exit(0) on one rank) therefore waits, says so after a few seconds, and aborts the job
//   at the deadline, while the others fail at theirs naming the collective it never joined.
//   (PyTorch behaves the same way: the others hang in their next collective until its timeout.)

namespace {

constexpr size_t kMessageBytes = 640;
constexpr int kSignals = 2;  // 0: SIGTERM, 1: SIGINT
char g_messages[2][kSignals][kMessageBytes];
size_t g_lengths[2][kSignals] = {};
// Which buffer holds the message; -1: not waiting; kUndescribed: waiting, no message yet.
constexpr int kUndescribed = -2;
volatile sig_atomic_t g_current = -1;

int signal_slot(int sig) { return sig == SIGINT ? 1 : 0; }

void on_signal(int sig) {
  const int slot = g_current;
  const int s = signal_slot(sig);
  if (slot >= 0) {
    ssize_t ignored = write(STDERR_FILENO, g_messages[slot][s], g_lengths[slot][s]);
    (void)ignored;
  } else if (slot == kUndescribed) {
    char line[192];
    const int n =
        sig == SIGINT
            ? std::snprintf(line, sizeof line,
                            "[rank %d] loom: interrupted (SIGINT) while waiting in a collective; "
                            "this rank exits, which ends the job\n",
                            error_rank())
            : std::snprintf(line, sizeof line,
                            "[rank %d] loom: terminated while waiting in a collective: the "
                            "launcher is ending the job, usually because another rank died or "
                            "failed (see its message)\n",
                            error_rank());
    ssize_t ignored = write(STDERR_FILENO, line, size_t(n > 0 ? n : 0));
    (void)ignored;
  } else {
    char line[192];
    const int n =
        sig == SIGINT
            ? std::snprintf(line, sizeof line,
                            "[rank %d] loom: interrupted (SIGINT) outside any collective; this "
                            "rank exits, which ends the job\n",
                            error_rank())
            : std::snprintf(line, sizeof line,
                            "[rank %d] loom: terminated by signal %d outside any collective\n",
                            error_rank(), sig);
    ssize_t ignored = write(STDERR_FILENO, line, size_t(n > 0 ? n : 0));
    (void)ignored;
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void install_if_default(int sig) {
  struct sigaction current;
  if (sigaction(sig, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) return;
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  sigaction(sig, &action, nullptr);
}

int g_world_size = 1;
JobAbort g_abort = nullptr;
bool g_exit_agreed = false;

}  // namespace

void install_termination_report() {
  static bool installed = false;
  if (installed) return;
  installed = true;
  install_if_default(SIGTERM);
  install_if_default(SIGINT);
}

WaitingScope::WaitingScope() { g_current = kUndescribed; }

void WaitingScope::describe(const std::string& context) {
  const int slot = g_current == 0 ? 1 : 0;
  int n = std::snprintf(g_messages[slot][0], kMessageBytes,
                        "[rank %d] loom: terminated while waiting for %s: the launcher is "
                        "ending the job, usually because another rank died or failed (see "
                        "its message)\n",
                        error_rank(), context.c_str());
  g_lengths[slot][0] = std::min(size_t(n > 0 ? n : 0), kMessageBytes - 1);
  n = std::snprintf(g_messages[slot][1], kMessageBytes,
                    "[rank %d] loom: interrupted (SIGINT) while waiting for %s; this rank exits, "
                    "which ends the job\n",
                    error_rank(), context.c_str());
  g_lengths[slot][1] = std::min(size_t(n > 0 ? n : 0), kMessageBytes - 1);
  g_current = slot;
}

WaitingScope::~WaitingScope() { g_current = -1; }

// ---------------------------------------------------------------- leaving the job

void register_job(int world_size, JobAbort abort) {
  g_world_size = world_size;
  g_abort = abort;
}

bool in_multi_rank_job() { return g_abort != nullptr && g_world_size > 1; }

void abort_job(int status, const std::string& reason) {
  std::fflush(stdout);
  if (!in_multi_rank_job()) {
    std::fflush(stderr);
    std::exit(status);
  }
  std::fprintf(stderr, "[rank %d] loom: aborting the job (exit status %d): %s\n", error_rank(),
               status, reason.c_str());
  std::fflush(stderr);
  g_abort(status);
  std::_Exit(status);  // MPI_Abort does not return; if it did, do not finalise
}

void agree_on_exit() { g_exit_agreed = true; }
bool exit_agreed() { return g_exit_agreed; }

}  // namespace loom::comm
