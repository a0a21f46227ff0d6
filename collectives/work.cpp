#include "collectives/work.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "collectives/termination.h"
#include "core/progress.h"

namespace loom::comm {

WorkPtr completed_work() {
  // One for all: it has no state (and a small collective's time was largely allocations).
  static const WorkPtr done = std::make_shared<CompletedWork>();
  return done;
}

namespace {
CensusAnswer g_census_answer = nullptr;
// See Note [Works that post as they go].
std::vector<PollingWork*>& stepping_works() {
  static auto* works = new std::vector<PollingWork*>();  // never freed: works may outlive statics
  return *works;
}
}  // namespace

void step_works() {
  auto& works = stepping_works();
  // Backwards: a step may take its own work off the list (it posted everything), never another.
  for (size_t i = works.size(); i-- > 0;) {
    PollingWork& w = *works[i];
    if (w.step_error_) continue;
    try {
      w.step();
    } catch (...) {
      w.step_error_ = std::current_exception();
    }
  }
}

void PollingWork::keep_stepping() {
  if (stepping_) return;
  // See Note [Progress during compute] (core/progress.cpp): the works move between ops too.
  static const bool hooked = (set_progress_hook(&step_works), true);
  (void)hooked;
  stepping_works().push_back(this);
  stepping_ = true;
}

void PollingWork::stop_stepping() {
  if (!stepping_) return;
  auto& works = stepping_works();
  works.erase(std::find(works.begin(), works.end(), this));
  stepping_ = false;
}

PollingWork::~PollingWork() { stop_stepping(); }

bool PollingWork::poll_or_raise() {
  if (step_error_) std::rethrow_exception(step_error_);
  return poll();
}

void set_census_answer(CensusAnswer answer) { g_census_answer = answer; }

PollingWork::PollingWork(OpContext context, double timeout_seconds)
    : context_(std::move(context)), timeout_s_(timeout_seconds) {}

void PollingWork::complete() {
  done_ = true;
  stop_stepping();
  finish();
}

bool PollingWork::test() {
  progress_checks();  // See Note [The check queue]
  step_works();       // See Note [Works that post as they go]
  if (!done_ && poll_or_raise()) complete();
  return done_;
}

void PollingWork::wait() {
  if (done_) return;
  using Clock = std::chrono::steady_clock;
  // MPI makes progress only inside its calls, so the waiter keeps polling: a sleep between polls
  // stalls large transfers (measured: a 64 MB allreduce 5x slower with 50 us sleeps). Yielding
  // keeps progress going and still lets oversubscribed peers run. Only after a second without
  // completion, when a peer is late rather than the transfer slow, does it sleep between polls.
  // The clock starts once the first polls have not completed it: a small operation's wait
  // never reads it (a clock read cost 24 ns on the Zen 4 VM, 2-3% of a 1 KiB ping-pong), and the
  // deadline moves by those few microseconds.
  std::chrono::time_point<Clock, std::chrono::duration<double>> deadline;  // as timeout_s_
  Clock::time_point patient_until;
  WaitingScope waiting;   // See Note [Termination by the launcher]
  std::string described;  // the op in words, once the wait is slow
  // done_ may be set meanwhile: a routed call made from the progress below tests every two-level
  // step in flight, this one among them (Note [Two-level calls checked whole]).
  for (int polls = 0; !done_ && !poll_or_raise(); ++polls) {
    progress_checks();  // See Note [The check queue]
    step_works();       // See Note [Works that post as they go]
    // Most small collectives finish within a few polls: spin before giving up the core
    // (yielding after every poll tripled an 8-byte allreduce's latency).
    if (polls < 1000) continue;
    if (described.empty()) {
      const auto start = Clock::now();
      deadline = start + std::chrono::duration<double>(timeout_s_);
      patient_until = start + std::chrono::seconds(1);
      described = context_.str();
      waiting.describe(described);
    }
    if (g_census_answer) g_census_answer(described);
    const auto now = Clock::now();
    if (now > deadline) {
      throw CommError(detail::str_cat("[rank ", error_rank(), "] timed out after ", timeout_s_,
                                      " s waiting for ", described,
                                      ": a rank of the group did not join it (it may have "
                                      "skipped the call, be stuck elsewhere, or have died)",
                                      late_ranks(), "; LOOM_COMM_TIMEOUT sets the limit"));
    }
    if (now < patient_until)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (!done_) complete();
}

}  // namespace loom::comm
