// The timeline of pipeline steps: every rank's TimedActions (See PipelineExecutor::timeline),
// gathered, turned into the measured bubble fraction, and written as a Chrome trace (the Trace
// Event Format that chrome://tracing and Perfetto open): one track per pipeline rank with its
// forward, backward, weight-gradient, receive-wait, send and gradient-sync spans.
#pragma once

#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "parallel/pipeline/executor.h"

namespace loom::parallel::pipeline {

using Timelines = std::vector<std::vector<TimedAction>>;  // [rank]

// Every rank's timeline on every rank of `group` (collective).
Timelines gather_timelines(const std::vector<TimedAction>& mine, comm::Communicator& group);

// Per rank, what the validator calls the bubble, measured: 1 - (time in F, B and W) / (the
// latest end minus the earliest start over all ranks).
std::vector<double> measured_bubbles(const Timelines& step);

// Accumulates steps and writes them as one Chrome trace (times relative to the first step).
class ChromeTrace {
 public:
  void add_step(int64_t step, const Timelines& timelines);
  // Throws loom::Error naming the file when it cannot be written.
  void write(const std::string& path) const;
  std::string json() const;

 private:
  std::vector<std::pair<int64_t, Timelines>> steps_;
};

}  // namespace loom::parallel::pipeline
