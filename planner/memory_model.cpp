#include "planner/memory_model.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "collectives/hierarchical.h"
#include "core/error.h"
#include "planner/cost_model.h"

namespace loom::planner {

std::string MemoryBreakdown::str() const {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "params %.2f GB, grads %.2f GB (%.2f GB at the peak), optimizer %.2f GB, "
                "activations %.2f GB, gathered %.2f GB, working %.2f GB, reserved %.2f GB: %.2f GB",
                parameters / 1e9, gradients / 1e9, gradients_at_peak / 1e9, optimizer_state / 1e9,
                activations / 1e9, gathered / 1e9, working / 1e9, reserved / 1e9, total() / 1e9);
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
// The split part counts the block's own widths: Q, K and V (h + 2 kv) and the projection's input
// (h); GPT's MLP its GELU's input and output (2f), a SwiGLU MLP W1's and W3's outputs, the SiLU's
// and the product (4f, as eager autograd keeps them).
struct LayerBytes {
  double linear = 0;
  double scores = 0;
  double attention_linear = 0;  // of `linear`, the attention block's: LayerNorm, QKV, projection
};

LayerBytes layer_bytes(const TransformerShape& m, int mb, int tp, bool sp, const Execution& e) {
  const double s = double(m.seq), b = double(mb), h = double(m.hidden), a = double(m.heads);
  const double t = double(tp), E = e.activation_bytes, M = e.mask_bytes;
  const double kv = m.kv_width(), f = double(m.mlp_width());
  const double mlp_kept = (m.block == BlockKind::kLlama ? 4.0 : 2.0) * f;
  const double replicated = (4 * E + 2 * M) * h, split = E * (2 * h + 2 * kv + mlp_kept);
  LayerBytes out;
  out.linear = sp ? s * b * (replicated + split) / t : s * b * (replicated + split / t);
  // The attention block's: the norm's and QKV's inputs and a mask (whole unless sp), Q, K, V and
  // the projection's input (split); the MLP holds the rest.
  const double attention_replicated = (2 * E + M) * h, attention_split = E * (2 * h + 2 * kv);
  out.attention_linear = sp ? s * b * (attention_replicated + attention_split) / t
                            : s * b * (attention_replicated + attention_split / t);
  out.scores = e.materialised_scores ? a * s * s * b * (2 * E + M) / t
                                     : (s * b * h * E + a * s * b * 4.0) / t;
  return out;
}

// Note [Recomputing every other matmul]
// torchtitan's op-level selective recomputation (Execution::SelectivePolicy::kEveryOtherMatmul)
// saves the outputs of a block's matmuls and of its attention kernel, except every second matmul
// in forward order, and recomputes everything else (norms, rotary embedding, activations,
// residual adds, the skipped matmuls) from the block's input in the backward. A layer keeps its
// input, the saved matmuls' outputs (a column-parallel one's 1/t, a row-parallel one's whole
// partial sums), the attention's output and its log-sum-exps. `attention_only` counts the
// attention block's part (its matmuls come before the MLP's).
double every_other_matmul_kept(const TransformerShape& m, int mb, int tp, bool sp,
                               const Execution& e, bool attention_only) {
  const double s = double(m.seq), b = double(mb), h = double(m.hidden), t = double(tp);
  const std::vector<Matmul> mms = m.layer_matmuls();
  const size_t attention_mms = mms.size() - size_t(m.mlp_matrices());
  double per_token = (sp ? h / t : h) + h / t;  // the input, the attention's output
  const std::vector<Matmul> mine(mms.begin(),
                                 attention_only ? mms.begin() + attention_mms : mms.end());
  for (const Matmul& mm : every_other_matmul(mine, false))
    per_token += mm.row_parallel ? mm.out : mm.out / t;
  return s * b * (per_token * e.activation_bytes + double(m.heads) * 4.0 / t);
}

// A MoE layer's MLP in place of the dense one (whole on every tp rank, as loom keeps it: the
// MoE takes the whole sequence under sp too): per token, the router's f32 logits and gates and,
// for each of its top_k experts, the expert's f32 output returned for the gated combine; on the
// rank's experts, per row they received (rank_expert_load times the balanced top_k per token),
// the row (the experts' input) and the expert's hidden before and after GELU. The dense MLP's 8E
// split bytes (its GELU and projection inputs) are not there.
double moe_mlp_bytes(const TransformerShape& m, int mb, double expert_load, const Execution& e) {
  const double sb = double(m.seq) * double(mb), h = double(m.hidden);
  const double f = double(m.expert_width()), k = double(m.moe.top_k);
  const double received = k * expert_load;
  return sb * (2.0 * 4.0 * double(m.moe.experts) + k * 4.0 * h +
               received * (h + 2.0 * f) * e.activation_bytes);
}

struct RankChunks {
  int chunks = 1;            // chunks on the rank
  int64_t chunk_layers = 0;  // layers per chunk
  bool first = false;        // holds a first stage (the embedding)
  bool last = false;         // holds a last stage (the output layer)
  int output_copies = 0;     // output-layer tables beside the embedding (tied: 0 when pp == 1)
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
  // One process ties them in one table; an untied output layer is a table of its own.
  rc.output_copies = rc.last && (p > 1 || !m.tied_output()) ? 1 : 0;
  return rc;
}

int64_t moe_layers_in(const TransformerShape& m, const RankChunks& rc) {
  int64_t n = 0;
  for (int stage : rc.stages) n += m.moe_layers_in(stage * rc.chunk_layers, rc.chunk_layers);
  return n;
}

}  // namespace

std::vector<Matmul> every_other_matmul(const std::vector<Matmul>& mms, bool recomputed) {
  std::vector<Matmul> side;
  for (size_t i = recomputed ? 1 : 0; i < mms.size(); i += 2) side.push_back(mms[i]);
  return side;
}

double layer_rank_parameters(const TransformerShape& m, int tp) {
  return (m.layer_matrix_parameters() + m.layer_split_vectors()) / double(tp) +
         m.layer_whole_vectors();
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

double moe_layer_activation_bytes(const TransformerShape& m, int mb, int tp, bool sp,
                                  double expert_load, Recompute r, const Execution& e) {
  const double dense = layer_activation_bytes(m, mb, tp, sp, r, e);
  if (r == Recompute::kFull) return dense;  // the layer's input alone, as a dense layer's
  const double sbh = double(m.seq) * double(mb) * double(m.hidden);
  return dense - 8.0 * e.activation_bytes * sbh / double(tp) + moe_mlp_bytes(m, mb, expert_load, e);
}

double layer_activation_bytes(const TransformerShape& m, int mb, int tp, bool sp, Recompute r,
                              const Execution& e) {
  const LayerBytes lb = layer_bytes(m, mb, tp, sp, e);
  switch (r) {
    case Recompute::kNone:
      return lb.linear + lb.scores;
    case Recompute::kSelective:
      switch (e.selective) {
        case SelectivePolicy::kAttention:
          return lb.linear;
        case SelectivePolicy::kEveryOtherMatmul:
          return every_other_matmul_kept(m, mb, tp, sp, e, false);
        case SelectivePolicy::kEveryOtherLayer:
          return 0.5 * (layer_activation_bytes(m, mb, tp, sp, Recompute::kNone, e) +
                        layer_activation_bytes(m, mb, tp, sp, Recompute::kFull, e));
      }
      return 0;
    case Recompute::kFull: {
      const double input = e.activation_bytes * double(m.seq) * mb * double(m.hidden);
      return sp ? input / tp : input;
    }
  }
  return 0;
}

// Of layer_activation_bytes, what the attention block keeps: all that is left of the layer while
// its attention's backward runs, after the MLP's.
double attention_activation_bytes(const TransformerShape& m, int mb, int tp, bool sp, Recompute r,
                                  const Execution& e) {
  const LayerBytes lb = layer_bytes(m, mb, tp, sp, e);
  switch (r) {
    case Recompute::kNone:
      return lb.attention_linear + lb.scores;
    case Recompute::kSelective:
      switch (e.selective) {
        case SelectivePolicy::kAttention:
          return lb.attention_linear;
        case SelectivePolicy::kEveryOtherMatmul:
          return every_other_matmul_kept(m, mb, tp, sp, e, true);
        case SelectivePolicy::kEveryOtherLayer:  // a recomputed layer's whole set, at most
          return lb.attention_linear + lb.scores;
      }
      return 0;
    case Recompute::kFull:
      return layer_activation_bytes(m, mb, tp, sp, r, e);
  }
  return 0;
}

double recompute_working_bytes(const TransformerShape& m, int mb, int tp, bool sp,
                               double expert_load, Recompute r, const Execution& e) {
  const LayerBytes lb = layer_bytes(m, mb, tp, sp, e);
  const double whole =  // the largest layer's whole set, a MoE one's when there is one
      m.moe.enabled() ? moe_layer_activation_bytes(m, mb, tp, sp, expert_load, Recompute::kNone, e)
                      : lb.linear + lb.scores;
  switch (r) {
    case Recompute::kNone:
      return 0;
    case Recompute::kSelective:
      switch (e.selective) {
        case SelectivePolicy::kAttention:
          return lb.scores;
        case SelectivePolicy::kEveryOtherMatmul:  // the rest of the layer's set, rebuilt
          return whole - every_other_matmul_kept(m, mb, tp, sp, e, false);
        case SelectivePolicy::kEveryOtherLayer:
          return whole;
      }
      return 0;
    case Recompute::kFull:
      return whole;
  }
  return 0;
}

namespace {

// What a rank holds beside its layers: the embedding tables (vocab-parallel, and the positions),
// output-layer tables and the final norm.
double rest_rank_parameters(const TransformerShape& m, int tp, const RankChunks& rc) {
  const double table = double(m.vocab) * double(m.hidden) / double(tp);  // vocab-parallel
  const double positions = m.embedding_parameters() - double(m.vocab) * double(m.hidden);
  return rc.embeddings * (table + positions) + rc.output_copies * table +
         (rc.last ? m.final_norm_parameters() : 0.0);
}

}  // namespace

double rank_parameters(const TransformerShape& m, const Layout& l, int rank) {
  const RankChunks rc = rank_chunks(m, l, rank);
  const double moes = double(moe_layers_in(m, rc));
  return (double(rc.chunks) * double(rc.chunk_layers) - moes) * layer_rank_parameters(m, l.tp) +
         moes * moe_layer_rank_parameters(m, l.tp) + rank_expert_parameters(m, l, rank) +
         rest_rank_parameters(m, l.tp, rc);
}

// Note [Where the memory peaks]
// A rank's memory peaks in a backward: each forward adds a micro-batch-chunk's activations, and a
// backward allocates its temporaries before it frees any. Two moments of a backward bound it
// (they are the peaks loom-gpt's allocator records; benchmarks/README.md, "Planner"):
// - its start. Held: every micro-batch-chunk in flight (this one included), each with its
//   output when the chunk sends it on (the executor keeps it to run the backward from the
//   gradient it receives), and the gradients if they exist yet: data parallelism keeps them in
//   its buckets or shards all along, while a rank without it allocates them in its first
//   backward of the step (zero_grad drops them after the step). The temporaries, whichever is
//   larger: on a last stage the loss's (the final LayerNorm's and the output layer's inputs, the
//   logits and their gradient, Execution::logits_bytes each), or the first layer backward's: the
//   output layer's fresh
//   weight gradients (last stage) and the last layer's second MLP linear's (fresh even when
//   accumulating: a backward makes a gradient and then adds it), the incoming gradient of the
//   residual stream and the gradient of that linear's input (4h/t per token); plus, on a stage
//   that sends, the gradient received for its output, and under ZeRO-3 one layer's whole
//   gradients before their reduce-scatter.
// - its end, in the chunk's first layer's attention: the other micro-batch-chunks, what that
//   layer's attention keeps (its MLP's are freed), every gradient, and a layer's token
//   temporaries. It is the larger where a layer's gradients outweigh its activations (small
//   micro-batches).
// ZeRO-3 adds a moment of its own, its second layer's backward: its gradients staged while the
// last layer's still reduce (one unit in flight, as ZeRO-2's buckets), the larger where the
// activations are small. (Chimera's ZeRO-1 sums its replica pairs in ZeRO-1's buckets, in place:
// Note [Summing gradients where they are] in parallel/pipeline/executor.cpp.)
// Recomputation adds one layer's whole set to both (recompute_working_bytes).

InFlight in_flight_at_backwards(const parallel::pipeline::Schedule& schedule, int rank) {
  namespace pl = parallel::pipeline;
  InFlight f;
  int held = 0;
  bool first = true;
  for (const pl::Action& a : schedule.actions.at(size_t(rank))) {
    if (a.kind == pl::ActionKind::kForward) ++held;
    if (a.kind != pl::ActionKind::kBackward) continue;
    if (first)
      f.first_backward = held;
    else
      f.later_backwards = std::max(f.later_backwards, held);
    first = false;
    --held;
  }
  return f;
}

MemoryBreakdown rank_memory(const Workload& w, const Layout& l, const Cluster& c,
                            const Execution& e, int rank, const InFlight& in_flight) {
  LOOM_ASSERT(rank >= 0 && rank < l.pp, "rank_memory: rank ", rank, " of pp ", l.pp);
  const TransformerShape& m = w.model;
  const RankChunks rc = rank_chunks(m, l, rank);
  const double experts = rank_expert_parameters(m, l, rank);
  const double n = rank_parameters(m, l, rank) - experts;  // sharded over dp
  const double rest_parameters = rest_rank_parameters(m, l.tp, rc);
  auto layer_parameters = [&](int64_t layer) {  // one of the rank's layers, its experts aside
    return m.is_moe_layer(layer) ? moe_layer_rank_parameters(m, l.tp)
                                 : layer_rank_parameters(m, l.tp);
  };
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
  if (l.zero >= 3) {
    // At the start of a backward: the rank's last block gathered and the one before it
    // prefetched. Experts sharded over their replicas are gathered apart, around their own
    // layer's forward and backward: counted at the moments inside a MoE layer's backward
    // (`layer_fresh` below), not here.
    std::vector<int64_t> mine;  // the rank's layers, in forward order
    for (int stage : rc.stages)
      for (int64_t i = 0; i < rc.chunk_layers; ++i) mine.push_back(stage * rc.chunk_layers + i);
    double gathered = 0;
    for (size_t k = mine.size() >= 2 ? mine.size() - 2 : 0; k < mine.size(); ++k)
      gathered += layer_parameters(mine[k]);
    if (l.pp == 1) gathered += rest_parameters;  // the rest's unit, from the output layer on
    // A gather in two levels holds what came across nodes (the unit over the node's ranks) until
    // the node's gathers are done: one layer's at the peak (measured on the emulated 4 x 2
    // cluster with 1 Gbit/s links: rank 0 peaked 1.58 MB higher under auto than flat, a 3.15 MB
    // layer over 2 ranks; Note [Two levels without staging] in collectives/hierarchical.cpp).
    const double layer_bytes = layer_parameters(mine.back()) * e.param_bytes;
    if (l.dp > 1 && dp_collective_in_two_levels(CollectiveOp::kAllGather, layer_bytes, l, c, e)) {
      gathered += layer_parameters(mine.back()) / dp_span(l, c).local;
      // In K pieces, up to two pieces' staging of the node's gather (Note [Two-level
      // reduce-scatters and all-gathers in pieces]).
      const int k = comm::allreduce_pieces(size_t(layer_bytes), comm::kAllreducePieceBytes);
      if (k > 1) gathered += 2.0 * layer_parameters(mine.back()) / k;
    }
    mem.gathered = gathered * e.param_bytes;
  }

  // The peak: See Note [Where the memory peaks].
  const double s = double(m.seq), b = double(l.mb), h = double(m.hidden), t = double(l.tp);
  const double table = double(m.vocab) * h / t;  // an embedding or output table (vocab-parallel)
  const double E = e.activation_bytes, G = e.grad_bytes;
  // Per micro-batch-chunk in flight, the mean of the rank's layers (dense and MoE).
  const double load = expert_load(w, l);  // the rows its experts receive
  const double rank_layers = double(rc.chunks) * double(rc.chunk_layers);
  const double moes = double(moe_layers_in(m, rc));
  const double per_layer =
      ((rank_layers - moes) * layer_activation_bytes(m, l.mb, l.tp, l.sp, l.recompute, e) +
       moes * moe_layer_activation_bytes(m, l.mb, l.tp, l.sp, load, l.recompute, e)) /
      rank_layers;
  const double stream = s * b * (l.sp ? h / t : h);  // one residual-stream tensor's elements
  const bool sends = l.pp > 1 && (!rc.last || rc.chunks > 1);
  const double held = double(rc.chunk_layers) * per_layer + (sends ? E * stream : 0.0);
  // The embedding's dropout mask, per micro-batch in flight on the first chunk.
  auto mask = [&](int in_flight) {
    return rc.first ? std::max(1, in_flight / rc.chunks) * e.mask_bytes * stream : 0.0;
  };
  const double recompute = recompute_working_bytes(m, l.mb, l.tp, l.sp, load, l.recompute, e);
  const double f = double(m.mlp_width());
  const double mlp_tokens = E * (stream + s * b * f / t);
  const double mlp_fresh = G * (f * h / t + h);
  // What a layer's MLP backward allocates for its weights: a dense MLP's second linear's fresh
  // gradient, a MoE layer's local experts' whole gradients (reduced after the backward), and
  // their parameters when ZeRO-3 gathers them apart (sharded over replicas, no pipeline).
  const double local_experts = double(m.moe.experts) / double(l.ep) * m.expert_parameters();
  const bool experts_apart = l.zero >= 3 && l.pp == 1 && r > 1;
  auto layer_fresh = [&](int64_t layer) {
    if (!m.is_moe_layer(layer)) return mlp_fresh;
    return local_experts * (G + (experts_apart ? e.param_bytes : 0.0));
  };
  const double head_fresh = rc.last ? G * (table + m.final_norm_parameters()) : 0.0;
  const double loss =
      rc.last ? E * (stream + s * b * h) + 2.0 * e.logits_bytes * s * b * double(m.vocab) / t : 0.0;
  // Sharded gradients arrive whole first: ZeRO-3 holds one block's (a layer's; the experts' wait
  // for the end of the backward) until their reduce-scatter; ZeRO-2 stages them in a bucket
  // filling and one reducing (Note [ZeRO-2 keeps one bucket in flight] in
  // parallel/grad_reducer.cpp), in a pipeline a chunk's at most (Note [ZeRO-2 in a pipeline]).
  // At a later backward of the step the last bucket an earlier one launched is still in flight,
  // with its reduce-scatter's output shard (`in_flight_bucket`), when it starts.
  double unsharded = 0, in_flight_bucket = 0;
  // ZeRO-3 at the backward of the rank's second-to-last layer: the last one's gradients still
  // reducing, with their output shard, beside its own filling; the last layer's activations
  // freed, the loss's temporaries gone. It is the larger where the activations are small.
  double second_block = 0, rest_staged = 0, rest_later = 0;
  const int64_t last = (rc.stages.back() + 1) * rc.chunk_layers - 1;
  if (l.zero >= 3) {  // the rank's last layer's, whose backward comes first
    unsharded = G * layer_parameters(last);
    if (rc.chunk_layers >= 2)
      second_block = unsharded * (1.0 + 1.0 / d) + G * layer_parameters(last - 1);
    // Without a pipeline the rest (embeddings, output layer, final norm) is one unit whose
    // tables get gradients at both ends of the backward: staged from the output layer's backward
    // on, with a tied table's fresh gradient accumulating (`head_fresh` at the backward's start),
    // until the embedding's backward completes them.
    if (l.pp == 1) {
      rest_staged = G * rest_parameters;
      rest_later = rest_staged + (m.tied_output() ? G * table : 0.0);
      second_block += rest_later;
    }
  } else if (l.zero == 2) {
    const double chunk = G * n / double(rc.chunks);
    unsharded = std::min(chunk, 2.0 * e.bucket_bytes);
    in_flight_bucket = std::min(chunk, e.bucket_bytes) / d;
  }
  const double start_working =
      std::max(loss, head_fresh + layer_fresh(last) + mlp_tokens + rest_staged) +
      (sends ? E * stream : 0.0) + unsharded + recompute;
  // Gradient bytes held at a moment: at the first backward only what data parallelism keeps
  // between steps. Its buckets or shards stay; a pipeline's ZeRO-0 accumulates in fresh gradients,
  // its ZeRO-1 in the buckets (Note [Accumulating in the buckets] in parallel/grad_reducer.cpp).
  // Experts with replicas are reduced after the backward, from fresh gradients, into the shards
  // ZeRO keeps of them.
  const bool buckets = l.dp > 1 && (l.pp == 1 || l.zero >= 1);
  const double kept_experts = r == 1 ? experts * G : l.zero >= 1 ? experts * G / r : 0.0;
  const double kept = buckets ? mem.gradients - experts * G * expert_grads + kept_experts : 0.0;
  struct Moment {
    double activations = 0, working = 0, gradients = 0;
  };
  auto bytes = [](const Moment& x) { return x.activations + x.working + x.gradients; };
  Moment peak{0, 0, mem.gradients};  // between steps: the state alone
  if (in_flight.first_backward > 0) {
    auto start = [&](int k, double gradients, double pending) {
      return Moment{k * held + mask(k), start_working + pending, gradients};
    };
    const int most = std::max(in_flight.first_backward, in_flight.later_backwards);
    const double attention = attention_activation_bytes(m, l.mb, l.tp, l.sp, l.recompute, e);
    std::vector<Moment> moments = {
        start(in_flight.first_backward, kept, 0.0),
        Moment{(most - 1) * held + attention + mask(most),
               mlp_tokens + unsharded + rest_later + recompute, mem.gradients}};
    if (in_flight.later_backwards > 0)
      moments.push_back(start(in_flight.later_backwards, mem.gradients, in_flight_bucket));
    if (second_block > 0) {
      // In a step's only backward the experts' fresh gradients are the last layer's so far.
      const double last_experts = m.is_moe_layer(last) ? G * local_experts : 0.0;
      moments.push_back(
          Moment{most * held - per_layer + mask(most),
                 layer_fresh(last - 1) + mlp_tokens + (sends ? E * stream : 0.0) + second_block +
                     recompute,
                 in_flight.later_backwards > 0 ? mem.gradients : kept + last_experts});
    }
    peak = moments.front();
    for (const Moment& x : moments)
      if (bytes(x) > bytes(peak)) peak = x;
  }
  mem.activations = peak.activations;
  mem.working = peak.working;
  mem.gradients_at_peak = peak.gradients;
  const double used = mem.parameters + mem.optimizer_state + mem.gathered + bytes(peak);
  mem.reserved = c.device.reserved_bytes + c.device.fragmentation * used;
  return mem;
}

}  // namespace loom::planner
