// One candidate layout: how a workload is split over a cluster. The mesh order is loom's and
// Megatron's: tp innermost (consecutive ranks), then dp, then pp outermost, so a tp group stays
// inside a node whenever tp <= GPUs per node, and pipeline neighbours are tp * dp ranks apart.
#pragma once

#include <cstdint>
#include <string>

#include "planner/cluster.h"
#include "planner/workload.h"

namespace loom::planner {

enum class Recompute { kNone, kSelective, kFull };
const char* recompute_name(Recompute r);  // "none", "selective", "full"

struct Layout {
  int dp = 1;
  int tp = 1;
  int pp = 1;
  int v = 1;   // virtual stages (model chunks) per pipeline rank; > 1 only for "interleaved"
  int mb = 1;  // micro-batch size in sequences
  std::string schedule = "1f1b";  // gpipe | 1f1b | interleaved | chimera
  int zero = 0;                   // ZeRO stage over dp: 0 (DDP), 1, 2, 3
  Recompute recompute = Recompute::kNone;
  bool sp = false;  // sequence parallelism (tp > 1 only)
  // Expert parallelism (MoE models): the experts split over groups of ep consecutive dp ranks,
  // each holding experts / ep of every MoE layer, replicated over the dp / ep groups; the tokens
  // reach their experts by all-to-alls over the group. Experts are whole over tp (loom's layout).
  int ep = 1;

  int gpus() const { return dp * tp * pp; }
  // Micro-batches each pipeline runs per step: global batch / (dp * mb).
  int64_t microbatches(const Workload& w) const { return w.global_batch / (int64_t(dp) * mb); }
  // "dp=4,tp=8,pp=8,v=3,mb=1,schedule=interleaved,zero=1,recompute=selective,sp=1" (the form
  // parse_layout reads), with ",ep=N" when ep > 1.
  std::string str() const;
};

// The busiest rank's expert rows under `layout` (TransformerShape::rank_expert_load with the
// batch in dp x micro-batches parts); 1 for a dense model.
double expert_load(const Workload& workload, const Layout& layout);

// Reads the str() form; a field left out keeps its default, except dp, which defaults to
// gpus / (tp * pp). Throws loom::Error naming the unknown key or malformed value.
Layout parse_layout(const std::string& text, int gpus);
Recompute parse_recompute(const std::string& name);

// Why `layout` cannot train `workload` on `cluster` ("" when it can): GPU count, heads and
// hidden not divisible by tp, layers not divisible by pp * v (chimera: by pp; each of its two
// pipelines holds the whole model), the global batch not divisible by dp * mb, the schedule's own
// rules (interleaved needs micro-batches divisible by pp, chimera an even pp and micro-batch
// count), sp without tp, ep not dividing dp or the experts (or ep > 1 on a dense model).
std::string layout_problem(const Layout& layout, const Workload& workload, const Cluster& cluster);

}  // namespace loom::planner
