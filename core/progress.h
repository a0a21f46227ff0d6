// A hook that long computations call between their operations, so that a transport which moves
// data only inside its own calls keeps moving while this thread computes. See Note [Progress
// during compute] in progress.cpp. Core knows nothing of what the hook does: the collectives
// install it.
#pragma once

#include <atomic>

namespace loom {

using ProgressHook = void (*)();

// Installs `hook` for the calling thread (the one that posts and waits for collectives); null
// removes it. Only that thread runs it, at most every kProgressIntervalSeconds, never from inside
// itself.
void set_progress_hook(ProgressHook hook);

constexpr double kProgressIntervalSeconds = 50e-6;

namespace detail {
extern std::atomic<ProgressHook> g_progress_hook;
void run_progress_hook();
}  // namespace detail

// Called between operations (autograd records and backward nodes): runs the hook when one is
// installed and it is due. Without a hook, a load and a branch.
inline void progress_during_compute() {
  if (detail::g_progress_hook.load(std::memory_order_relaxed) != nullptr)
    detail::run_progress_hook();
}

}  // namespace loom
