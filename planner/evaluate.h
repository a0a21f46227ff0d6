// A layout's predicted step: the pipeline schedule loom would run, simulated by the schedule
// validator with the cost model's per-action times (forward, backward, sends, the first and last
// stages' extras), then the step's data-parallel reduction and optimizer update; memory per
// pipeline rank from the memory model with the validator's peak of micro-batches in flight. A MoE
// model's routing pass (Execution::moe_routing_pass) comes first: every micro-batch forward,
// through the pipeline ((m + p - 1) forwards and sends on the critical path, the first and last
// stages' extras for each micro-batch).
#pragma once

#include <string>
#include <vector>

#include "planner/cluster.h"
#include "planner/cost_model.h"
#include "planner/execution.h"
#include "planner/layout.h"
#include "planner/memory_model.h"
#include "planner/workload.h"

namespace loom::planner {

struct Prediction {
  Layout layout;
  std::string problem;  // why the layout cannot run at all ("" when it can); nothing else is set
  double step_s = 0;
  double pipeline_s = 0;  // the simulated schedule's makespan
  double routing_s = 0;   // MoE: the routing pass before it (Execution::moe_routing_pass)
  double bubble = 0;      // pipeline ranks' mean idle share of the makespan
  double comm_s = 0;      // collective and send time on the critical path (tp, pp, dp exposed)
  double tokens_per_s = 0;
  double model_tflops_per_gpu = 0;     // model FLOPs (no recomputation) / step / GPU
  double hardware_tflops_per_gpu = 0;  // with recomputation's FLOPs
  double mfu = 0;                      // model FLOP/s over the peak
  ActionCosts actions;
  StepCosts step;
  MemoryBreakdown memory;  // the fullest pipeline rank's
  int memory_rank = 0;
  std::vector<MemoryBreakdown> memory_per_rank;  // [pipeline rank]
  bool oom = false;                              // memory.total() > the GPU's memory
  bool ok() const { return problem.empty() && !oom; }
  // One line: "dp=..: step 13.7 s, 152 TFLOP/s/GPU (MFU 48.7%), bubble 8.1%, comm 6.2%,
  // memory 61.2 GB".
  std::string summary() const;
};

Prediction evaluate(const Workload& w, const Layout& l, const Cluster& c, const Execution& e);

// A lower bound on evaluate's step time without simulating the schedule (the schedule's bubble
// with free sends, the reduction with the widest overlap), for pruning a search; 0 for an invalid
// layout.
double step_lower_bound(const Workload& w, const Layout& l, const Cluster& c, const Execution& e);

}  // namespace loom::planner
