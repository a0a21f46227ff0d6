#include "collectives/work.h"

#include <thread>

namespace loom::comm {

WorkPtr completed_work() { return std::make_shared<CompletedWork>(); }

PollingWork::PollingWork(std::string context, double timeout_seconds)
    : context_(std::move(context)), timeout_s_(timeout_seconds) {}

void PollingWork::complete() {
  done_ = true;
  finish();
}

bool PollingWork::test() {
  if (!done_ && poll()) complete();
  return done_;
}

void PollingWork::wait() {
  if (done_) return;
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s_);
  // Spin briefly (most collectives finish in microseconds), then yield the core: ranks are often
  // oversubscribed, and a spinning waiter would steal the time its peers need to arrive.
  for (int spins = 0; !poll(); ++spins) {
    if (Clock::now() > deadline) {
      throw CommError(detail::str_cat("[rank ", error_rank(), "] timed out after ", timeout_s_,
                                      " s waiting for ", context_,
                                      ": a rank of the group did not join it (it may have "
                                      "skipped the call, be stuck elsewhere, or have died); "
                                      "LOOM_COMM_TIMEOUT sets the limit"));
    }
    if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(spins > 100000 ? 1000 : 50));
    else if (spins > 100) std::this_thread::yield();
  }
  complete();
}

}  // namespace loom::comm
