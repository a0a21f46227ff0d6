#include "core/progress.h"

#include <chrono>
#include <thread>

namespace loom {

// Note [Progress during compute]
// MPI moves a message past its eager limit only inside MPI calls on both ranks: over shared
// memory without a single-copy mechanism (containers without ptrace rights, the test and benchmark
// launches) every fragment is copied in by the sender and out by the receiver, and over TCP the
// sender writes what the socket takes. A send posted before a forward or backward therefore sat
// until the sender's next wait, and its receiver waited a whole compute action for it: on 2
// ranks of the development VM, GPipe's measured bubble was 0.28-0.31 against the validator's 0.11
// (0.11-0.25 with Open MPI's single-copy transfers on). The pipeline executor already tests its
// sends between actions (Note [Progress between actions], parallel/pipeline/executor.cpp), and
// every loom wait steps the works with bytes in flight (Note [MPI requests move in every wait],
// collectives/mpi_work.h); this carries the same step into the compute itself: autograd calls
// progress_during_compute() as each op records its node (and as each op of a checkpointed block's
// first forward would, which records nothing: with full recomputation that forward is a quarter of
// the compute) and before each backward node, and the
// collectives install step_works() as the hook when a work first registers for stepping. So a
// transfer moves at the granularity of ops, not of pipeline actions, and DDP's and ZeRO's
// reductions posted from the backward move with it. The hook runs on the thread that installed it
// only (collectives are posted and waited for on one thread, and MPI runs at
// MPI_THREAD_SERIALIZED), at most every kProgressIntervalSeconds (a clock read per op when a hook
// is installed), and never inside itself (a step that ran an op would otherwise re-enter).
// A progress thread would also move data inside one long op, but needs MPI_THREAD_MULTIPLE,
// whose locks every small collective would pay for.

namespace detail {
std::atomic<ProgressHook> g_progress_hook{nullptr};
}  // namespace detail

namespace {
std::atomic<std::thread::id> g_hook_thread;
// Read and written by the hook's thread only.
bool g_running = false;
std::chrono::steady_clock::time_point g_last_run;
}  // namespace

void set_progress_hook(ProgressHook hook) {
  g_hook_thread.store(std::this_thread::get_id());
  detail::g_progress_hook.store(hook);
}

void detail::run_progress_hook() {
  if (std::this_thread::get_id() != g_hook_thread.load(std::memory_order_relaxed) || g_running)
    return;
  const auto now = std::chrono::steady_clock::now();
  if (now - g_last_run < std::chrono::duration<double>(kProgressIntervalSeconds)) return;
  g_last_run = now;
  const ProgressHook hook = g_progress_hook.load(std::memory_order_relaxed);
  if (hook == nullptr) return;
  struct Running {
    Running() { g_running = true; }
    ~Running() { g_running = false; }
  } running;
  hook();
}

}  // namespace loom
