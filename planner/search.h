// The planner's search: every valid layout of a workload on a cluster (dp x tp x pp, virtual
// stages, micro-batch size, schedule, ZeRO stage, recomputation, sequence parallelism), ranked
// by predicted step time among those that fit in memory.
//
// Pruning keeps it fast at any scale: tp stays inside a node (at most gpus_per_node) and divides
// the heads; pp divides the layers; a layout whose training state alone overflows the GPU is out
// of memory before any simulation; the rest are simulated in order of a lower bound on their step
// (step_lower_bound: every rank always busy, no collective exposed), and the search stops once
// that bound passes the top-K's slowest.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "planner/evaluate.h"

namespace loom::planner {

struct SearchOptions {
  int top = 5;
  int max_mb = 16;  // micro-batch sizes 1, 2, 4, ... up to this
  int max_v = 8;    // virtual stages tried for interleaved
  std::vector<std::string> schedules = {"1f1b", "interleaved", "gpipe", "chimera"};
  // Why the runtime cannot run a layout ("" when it can): such layouts are skipped, counted as
  // unsupported. Empty: every valid layout.
  std::function<std::string(const Layout&)> unsupported;
};

struct SearchResult {
  std::vector<Prediction> ranked;  // the fastest fitting layouts, best first (at most top)
  Prediction fastest_oom;          // the fastest layout that did not fit (problem set if none)
  bool any_oom = false;
  long candidates = 0;   // layouts enumerated
  long invalid = 0;      // refused by layout_problem
  long unsupported = 0;  // refused by SearchOptions::unsupported
  long oom = 0;          // out of memory (by state alone, or after simulation)
  long simulated = 0;    // schedules simulated
  long pruned = 0;       // skipped: their lower bound was no better than the top-K
  double seconds = 0;    // the search's own time
};

SearchResult search(const Workload& w, const Cluster& c, const Execution& e,
                    const SearchOptions& o = {});

// Why `other` is slower than `best`, by the largest differences in the parts of a step:
// "bubble 12.3% vs 4.1% (+1.20 s)", "communication +0.80 s", "recomputation +0.95 s",
// "compute +0.40 s (smaller GEMMs)".
std::string why_slower(const Prediction& best, const Prediction& other);

}  // namespace loom::planner
