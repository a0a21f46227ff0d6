#include "collectives/termination.h"

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace loom::comm {

// Note [Termination by the launcher]
// When a rank dies (killed, or exits without finalising), mpirun ends the whole job: it sends
// the other ranks SIGTERM (then SIGKILL), prints which rank failed, and exits non-zero. So
// nothing hangs, but the survivors would vanish without a word while they waited in a
// collective. With this report each survivor writes one line naming the operation it was
// waiting in (group, op, sequence number, bytes) before dying by the same signal. The line is
// formatted when the wait starts, into one of two buffers, so the handler only calls write().

namespace {

constexpr size_t kMessageBytes = 640;
char g_messages[2][kMessageBytes];
size_t g_lengths[2] = {0, 0};
volatile sig_atomic_t g_current = -1;  // which buffer holds the message; -1: not waiting

void on_terminate(int sig) {
  const int slot = g_current;
  if (slot >= 0) {
    ssize_t ignored = write(STDERR_FILENO, g_messages[slot], g_lengths[slot]);
    (void)ignored;
  } else {
    char line[128];
    const int n = std::snprintf(line, sizeof line,
                                "[rank %d] loom: terminated by signal %d outside any collective\n",
                                error_rank(), sig);
    ssize_t ignored = write(STDERR_FILENO, line, size_t(n > 0 ? n : 0));
    (void)ignored;
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace

void install_termination_report() {
  static bool installed = false;
  if (installed) return;
  installed = true;
  struct sigaction current;
  if (sigaction(SIGTERM, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) return;
  struct sigaction action {};
  action.sa_handler = on_terminate;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
}

WaitingScope::WaitingScope(const std::string& context) {
  const int slot = g_current == 0 ? 1 : 0;
  const int n = std::snprintf(g_messages[slot], kMessageBytes,
                              "[rank %d] loom: terminated while waiting for %s: the launcher is "
                              "ending the job, usually because another rank died or failed (see "
                              "its message)\n",
                              error_rank(), context.c_str());
  g_lengths[slot] = std::min(size_t(n > 0 ? n : 0), kMessageBytes - 1);
  g_current = slot;
}

WaitingScope::~WaitingScope() { g_current = -1; }

}  // namespace loom::comm
