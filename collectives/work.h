// Work implementations shared by the backends: one already complete, and one completed by
// polling, which is where Note [Deadlines] (communicator.cpp) is enforced for every backend.
#pragma once

#include <chrono>
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
// See Note [Late ranks] (mpi_backend.cpp): a backend's way to answer, while this process waits,
// another rank's question "what are you waiting for?". Called in the slow part of every wait,
// with the wait's context.
using CensusAnswer = void (*)(const std::string& waiting_for);
void set_census_answer(CensusAnswer answer);

class PollingWork : public Work {
 public:
  // `context`: the op, for the timeout message.
  PollingWork(OpContext context, double timeout_seconds);
  void wait() override;
  bool test() override;
  const OpContext& context() const { return context_; }

 protected:
  virtual bool poll() = 0;
  virtual void finish() {}
  // Appended to the timeout's message: which ranks of the group had not arrived (See Note [Late
  // ranks]); empty when the backend cannot tell.
  virtual std::string late_ranks() { return ""; }
  std::string waiting_for() const { return context_.str(); }
  bool done() const { return done_; }

 private:
  void complete();
  OpContext context_;
  double timeout_s_;
  bool done_ = false;
};

}  // namespace loom::comm
