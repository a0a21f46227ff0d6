// Work implementations shared by the backends: one already complete, and one completed by
// polling, which is where Note [Deadlines] (communicator.cpp) is enforced for every backend.
#pragma once

#include <chrono>
#include <exception>
#include <string>

#include "collectives/communicator.h"

namespace loom::comm {

class CompletedWork final : public Work {
 public:
  void wait() override {}
  bool test() override { return true; }
};
WorkPtr completed_work();

// Subclasses implement poll() (make progress; true once the operation is complete) and
// optionally finish() (post-processing run once, on the waiting thread, after completion: e.g.
// dividing a sum by the group size for avg, or copying a staging buffer back).
// See Note [Late ranks] (mpi_work.cpp): a backend's way to answer, while this process waits,
// another rank's question "what are you waiting for?". Called in the slow part of every wait,
// with the wait's context.
using CensusAnswer = void (*)(const std::string& waiting_for);
void set_census_answer(CensusAnswer answer);

// Note [Works that post as they go]
// A work that posts its later messages only as earlier ones complete (a reduce-scatter through a
// bounded scratch, piece by piece) must also move on while its rank waits for something else: two
// ranks waiting for two such works in different orders would each wait for a message the other
// posts only from the work it is not polling (it hung so: Note [Direct reduce-scatter] in
// mpi_direct.cpp). MPI's own nonblocking collectives progress inside any MPI call; these progress
// inside any loom wait or test: such a work registers itself (keep_stepping) and every
// PollingWork's wait and test steps all the registered ones, as progress_checks() advances the
// check queues. A step only posts what became postable and never blocks; an error in a step taken
// for another work's wait is kept and raised by this work's own wait or test. Collectives are
// posted and waited for on one thread (as the check queues assume).
void step_works();

class PollingWork : public Work {
 public:
  // `context`: the op, for the timeout message.
  PollingWork(OpContext context, double timeout_seconds);
  ~PollingWork() override;
  PollingWork(const PollingWork&) = delete;
  PollingWork& operator=(const PollingWork&) = delete;
  void wait() override;
  bool test() override;
  const OpContext& context() const { return context_; }

 protected:
  virtual bool poll() = 0;
  virtual void finish() {}
  // See Note [Works that post as they go]: step() posts what became postable; keep_stepping()
  // has every wait and test call it until stop_stepping() (a subclass calls that first thing in
  // its destructor, and once it has posted everything) or completion.
  virtual void step() {}
  void keep_stepping();
  void stop_stepping();
  // Appended to the timeout's message: which ranks of the group had not arrived (See Note [Late
  // ranks]); empty when the backend cannot tell.
  virtual std::string late_ranks() { return ""; }
  std::string waiting_for() const { return context_.str(); }
  bool done() const { return done_; }

 private:
  void complete();
  bool poll_or_raise();
  friend void step_works();
  OpContext context_;
  double timeout_s_;
  bool done_ = false;
  bool stepping_ = false;
  std::exception_ptr step_error_;  // raised by this work's wait or test
};

}  // namespace loom::comm
