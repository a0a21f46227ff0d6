#include "planner/memory_model.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "core/error.h"

namespace loom::planner {

std::string MemoryBreakdown::str() const {
  char buf[240];
  std::snprintf(buf, sizeof buf,
                "params %.2f GB, grads %.2f GB, optimizer %.2f GB, activations %.2f GB, gathered "
                "%.2f GB, reserved %.2f GB: %.2f GB",
                parameters / 1e9, gradients / 1e9, optimizer_state / 1e9, activations / 1e9,
                gathered / 1e9, reserved / 1e9, total() / 1e9);
  return buf;
}

namespace {

// The two parts of Korthikanti's count for one layer and micro-batch, for activations of E bytes
// and masks of M: `linear`, s b h (16E + 2M) (34 s b h at E = 2, M = 1: the inputs of the GEMMs,
// LayerNorms, GELU and the two dropouts), of which s b h (4E + 2M) (the LayerNorms' and the first
// GEMMs' inputs, the masks) is whole on every tp rank unless sp splits it; and `scores`,
// a s^2 b (2E + M) (5 a s^2 b: the softmax's output, its dropout's and mask), split over tp.
// Without materialised scores (Execution::materialised_scores false: loom's attention keeps, as
// FlashAttention does, its output and one f32 log-sum-exp per query row, and recomputes the
// scores in its backward) `scores` is s b h E (that output, beside the projection's own copy of
// its input) + a s b 4 (the log-sum-exps), over tp.
struct LayerBytes {
  double linear = 0;
  double scores = 0;
};

LayerBytes layer_bytes(const TransformerShape& m, int mb, int tp, bool sp, const Execution& e) {
  const double s = double(m.seq), b = double(mb), h = double(m.hidden), a = double(m.heads);
  const double t = double(tp), E = e.activation_bytes, M = e.mask_bytes;
  const double replicated = 4 * E + 2 * M, split = 12 * E;
  LayerBytes out;
  out.linear = sp ? s * b * h * (replicated + split) / t : s * b * h * (replicated + split / t);
  out.scores = e.materialised_scores ? a * s * s * b * (2 * E + M) / t
                                     : (s * b * h * E + a * s * b * 4.0) / t;
  return out;
}

// A MoE layer's MLP in place of the dense one (whole on every tp rank, as loom keeps it: the
// MoE takes the whole sequence under sp too): per token, the router's f32 logits and gates, and
// for each of its top_k experts the token's row (the experts' input), the expert's hidden
// before and after GELU, and its f32 output kept for the gated combine; the dense MLP's 8E split
// bytes (its GELU and projection inputs) are not there.
double moe_mlp_bytes(const TransformerShape& m, int mb, const Execution& e) {
  const double sb = double(m.seq) * double(mb), h = double(m.hidden);
  const double f = double(m.expert_width()), k = double(m.moe.top_k);
  return sb * (2.0 * 4.0 * double(m.moe.experts) +
               k * (h * e.activation_bytes + 2.0 * f * e.activation_bytes + 4.0 * h));
}

struct RankChunks {
  int chunks = 1;            // chunks on the rank
  int64_t chunk_layers = 0;  // layers per chunk
  bool first = false;        // holds a first stage (the embedding)
  bool last = false;         // holds a last stage (the output layer)
  int output_copies = 0;     // tied output-layer copies beside the embedding (0 when pp == 1)
  int embeddings = 0;        // embedding tables held
  std::vector<int> stages;   // each chunk's stage (its layers: stage * chunk_layers onwards)
};

RankChunks rank_chunks(const TransformerShape& m, const Layout& l, int rank) {
  RankChunks rc;
  const int p = l.pp;
  if (l.schedule == "chimera") {
    rc.chunks = 2;
    rc.chunk_layers = m.layers / p;
    // Stage r of the down pipeline and stage p-1-r of the up one: ranks 0 and p-1 hold a first
    // and a last stage, each of its own replica.
    rc.first = rc.last = rank == 0 || rank == p - 1;
    rc.embeddings = rc.first ? 1 : 0;
    rc.output_copies = rc.last ? 1 : 0;
    rc.stages = {rank, p - 1 - rank};
    return rc;
  }
  rc.chunks = l.v;
  rc.chunk_layers = m.layers / (int64_t(p) * l.v);
  for (int k = 0; k < l.v; ++k) rc.stages.push_back(k * p + rank);  // interleaved's placement
  rc.first = rank == 0;
  rc.last = rank == p - 1;
  rc.embeddings = rc.first ? 1 : 0;
  rc.output_copies = rc.last && p > 1 ? 1 : 0;  // one process ties them in one table
  return rc;
}

int64_t moe_layers_in(const TransformerShape& m, const RankChunks& rc) {
  int64_t n = 0;
  for (int stage : rc.stages) n += m.moe_layers_in(stage * rc.chunk_layers, rc.chunk_layers);
  return n;
}

}  // namespace

double layer_rank_parameters(const TransformerShape& m, int tp) {
  const double h = double(m.hidden);
  return (12.0 * h * h + 7.0 * h) / double(tp) + 6.0 * h;
}

double moe_layer_rank_parameters(const TransformerShape& m, int tp) {
  const double h = double(m.hidden);
  return (4.0 * h * h + 3.0 * h) / double(tp) + 5.0 * h + h * double(m.moe.experts);
}

int64_t rank_moe_layers(const TransformerShape& m, const Layout& l, int rank) {
  return moe_layers_in(m, rank_chunks(m, l, rank));
}

double rank_expert_parameters(const TransformerShape& m, const Layout& l, int rank) {
  if (!m.moe.enabled()) return 0;
  return double(rank_moe_layers(m, l, rank)) * double(m.moe.experts / l.ep) * m.expert_parameters();
}

double moe_layer_activation_bytes(const TransformerShape& m, int mb, int tp, bool sp, Recompute r,
                                  const Execution& e) {
  const double dense = layer_activation_bytes(m, mb, tp, sp, r, e);
  if (r == Recompute::kFull) return dense;  // the layer's input alone, as a dense layer's
  const double sbh = double(m.seq) * double(mb) * double(m.hidden);
  return dense - 8.0 * e.activation_bytes * sbh / double(tp) + moe_mlp_bytes(m, mb, e);
}

double layer_activation_bytes(const TransformerShape& m, int mb, int tp, bool sp, Recompute r,
                              const Execution& e) {
  const LayerBytes lb = layer_bytes(m, mb, tp, sp, e);
  switch (r) {
    case Recompute::kNone:
      return lb.linear + lb.scores;
    case Recompute::kSelective:
      return lb.linear;
    case Recompute::kFull: {
      const double input = e.activation_bytes * double(m.seq) * mb * double(m.hidden);
      return sp ? input / tp : input;
    }
  }
  return 0;
}

double recompute_working_bytes(const TransformerShape& m, int mb, int tp, bool sp, Recompute r,
                               const Execution& e) {
  const LayerBytes lb = layer_bytes(m, mb, tp, sp, e);
  switch (r) {
    case Recompute::kNone:
      return 0;
    case Recompute::kSelective:
      return lb.scores;
    case Recompute::kFull:  // the largest layer's whole set, a MoE one's when there is one
      return m.moe.enabled() ? moe_layer_activation_bytes(m, mb, tp, sp, Recompute::kNone, e)
                             : lb.linear + lb.scores;
  }
  return 0;
}

double rank_parameters(const TransformerShape& m, const Layout& l, int rank) {
  const RankChunks rc = rank_chunks(m, l, rank);
  const double h = double(m.hidden), t = double(l.tp);
  const double moes = double(moe_layers_in(m, rc));
  double n = (double(rc.chunks) * double(rc.chunk_layers) - moes) * layer_rank_parameters(m, l.tp) +
             moes * moe_layer_rank_parameters(m, l.tp) + rank_expert_parameters(m, l, rank);
  const double table = double(m.vocab) * h / t;  // vocab-parallel
  n += rc.embeddings * (table + double(m.seq) * h);
  n += rc.output_copies * table;
  if (rc.last) n += 2.0 * h;  // the final LayerNorm
  return n;
}

MemoryBreakdown rank_memory(const Workload& w, const Layout& l, const Cluster& c,
                            const Execution& e, int rank, int peak_in_flight) {
  LOOM_ASSERT(rank >= 0 && rank < l.pp, "rank_memory: rank ", rank, " of pp ", l.pp);
  const TransformerShape& m = w.model;
  const RankChunks rc = rank_chunks(m, l, rank);
  const double experts = rank_expert_parameters(m, l, rank);
  const double n = rank_parameters(m, l, rank) - experts;  // sharded over dp
  const double d = double(l.dp);
  // The experts' state is sharded over their dp / ep replicas (stage 3 shards the experts
  // themselves only without pipelines); their gradients stay whole, and sharded over r > 1
  // replicas each rank also keeps its reduced shard of them (ZeroOptimizer::memory).
  const double r = double(l.dp / l.ep);
  MemoryBreakdown mem;
  mem.parameters = n * e.param_bytes / (l.zero >= 3 ? d : 1.0) +
                   experts * e.param_bytes / (l.zero >= 3 && l.pp == 1 ? r : 1.0);
  // Sharded experts keep their reduced gradient shards beside the whole gradients too.
  const double expert_grads = l.zero >= 1 && r > 1 ? 1.0 + 1.0 / r : 1.0;
  mem.gradients =
      n * e.grad_bytes / (l.zero >= 2 ? d : 1.0) + experts * e.grad_bytes * expert_grads;
  mem.optimizer_state =
      (n / (l.zero >= 1 ? d : 1.0) + experts / (l.zero >= 1 ? r : 1.0)) * e.optimizer_bytes;
  if (l.zero >= 3)  // one layer gathered, and the next prefetched
    mem.gathered = 2.0 * layer_rank_parameters(m, l.tp) * e.param_bytes;
  if (l.zero >= 3 && l.pp == 1 && experts > 0 && r > 1)  // and one MoE layer's experts
    mem.gathered += double(m.moe.experts / l.ep) * m.expert_parameters() * e.param_bytes;
  const double s = double(m.seq), b = double(l.mb), h = double(m.hidden), t = double(l.tp);
  // Per micro-batch-chunk in flight, the mean of the rank's layers (dense and MoE).
  const double rank_layers = double(rc.chunks) * double(rc.chunk_layers);
  const double moes = double(moe_layers_in(m, rc));
  const double per_layer =
      ((rank_layers - moes) * layer_activation_bytes(m, l.mb, l.tp, l.sp, l.recompute, e) +
       moes * moe_layer_activation_bytes(m, l.mb, l.tp, l.sp, l.recompute, e)) /
      rank_layers;
  double act = double(peak_in_flight) * double(rc.chunk_layers) * per_layer;
  act += recompute_working_bytes(m, l.mb, l.tp, l.sp, l.recompute, e);
  if (rc.first) {  // the embedding's dropout mask, per micro-batch in flight on its chunk
    const int on_first = std::max(1, peak_in_flight / rc.chunks);
    act += on_first * e.mask_bytes * s * b * h / (l.sp ? t : 1.0);
  }
  // The final LayerNorm's and the output layer's inputs, and one micro-batch's f32 logits.
  if (rc.last) act += 2.0 * e.activation_bytes * s * b * h / t + 4.0 * s * b * double(m.vocab) / t;
  mem.activations = act;
  const double used =
      mem.parameters + mem.gradients + mem.optimizer_state + mem.activations + mem.gathered;
  mem.reserved = c.device.reserved_bytes + c.device.fragmentation * used;
  return mem;
}

}  // namespace loom::planner
