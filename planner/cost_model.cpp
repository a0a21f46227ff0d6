#include "planner/cost_model.h"

#include <algorithm>

#include "collectives/algorithm.h"
#include "planner/memory_model.h"

namespace loom::planner {

double gemm_seconds(double flops, const DeviceRates& d) {
  if (flops <= 0) return 0;
  return (flops + d.gemm_half_flops) / (d.peak_flops * d.gemm_efficiency);
}

double allreduce_seconds(double bytes, int n, const LinkLevel& link) {
  if (n <= 1 || bytes <= 0) return 0;
  return 2.0 * (n - 1) * (link.latency_s + bytes / (double(n) * link.bandwidth));
}

double reduce_scatter_seconds(double bytes, int n, const LinkLevel& link) {
  return allreduce_seconds(bytes, n, link) / 2.0;
}

double all_gather_seconds(double bytes, int n, const LinkLevel& link) {
  return allreduce_seconds(bytes, n, link) / 2.0;
}

double all_to_all_seconds(double bytes, int n, const LinkLevel& link) {
  if (n <= 1) return 0;
  return double(n - 1) * (link.latency_s + bytes / (double(n) * link.bandwidth));
}

double ring_seconds(CollectiveOp op, double bytes, int n, const LinkLevel& link) {
  switch (op) {
    case CollectiveOp::kAllreduce:
      return allreduce_seconds(bytes, n, link);
    case CollectiveOp::kReduceScatter:
      return reduce_scatter_seconds(bytes, n, link);
    case CollectiveOp::kAllGather:
      return all_gather_seconds(bytes, n, link);
  }
  return 0;
}

GroupSpan dp_span(const Layout& l, const Cluster& c) {
  if (l.tp * l.dp <= c.gpus_per_node) return {l.dp, 1};
  // Consecutive dp ranks are tp ranks apart: a node holds gpus_per_node / tp of them.
  if (l.tp < c.gpus_per_node && c.gpus_per_node % l.tp == 0) {
    const int local = c.gpus_per_node / l.tp;
    if (l.dp % local == 0) return {local, l.dp / local};
  }
  return {1, l.dp};
}

namespace {

// A collective over n ranks spread as `span` over the nodes: one ring on `link` (its slowest
// hop), and across nodes as the execution runs it (SpanningCollectives); `two_levels` says
// whether that is loom's two levels.
double spanned_collective_seconds(CollectiveOp op, double bytes, int n, const GroupSpan& span,
                                  const LinkLevel& link, const Cluster& c, const Execution& e,
                                  bool* two_levels = nullptr) {
  if (two_levels != nullptr) *two_levels = false;
  const double flat = ring_seconds(op, bytes, n, link);
  if (e.spanning == SpanningCollectives::kOneRing || span.nodes < 2 || span.local < 2) return flat;
  if (e.spanning == SpanningCollectives::kNicRings) {
    const LinkLevel rings{c.inter.latency_s,
                          std::min(c.intra.bandwidth, span.local * c.inter.bandwidth)};
    return ring_seconds(op, bytes, n, rings);
  }
  // Inside the node on the whole buffer; across nodes on this rank's 1/L of it.
  const double across = bytes / span.local;
  double two_level = 0;
  switch (op) {
    case CollectiveOp::kAllreduce: {
      // In pieces, the levels side by side (Note [Pipelined two-level allreduce] in
      // collectives/hierarchical.cpp).
      const int k = comm::allreduce_pieces(size_t(bytes), comm::kAllreducePieceBytes);
      const double node = reduce_scatter_seconds(bytes / k, span.local, c.intra) +
                          all_gather_seconds(bytes / k, span.local, c.intra);
      const double cross = allreduce_seconds(across / k, span.nodes, c.inter);
      two_level = node + cross + (k - 1) * std::max(node, cross);
      break;
    }
    case CollectiveOp::kReduceScatter:
    case CollectiveOp::kAllGather: {
      // In pieces too (Note [Two-level reduce-scatters and all-gathers in pieces]).
      const int k = comm::allreduce_pieces(size_t(bytes), comm::kAllreducePieceBytes);
      const double node = ring_seconds(op, bytes / k, span.local, c.intra);
      const double cross = ring_seconds(op, across / k, span.nodes, c.inter);
      two_level = node + cross + (k - 1) * std::max(node, cross);
      break;
    }
  }
  // loom's auto takes two levels only when its table predicts them that much faster (Note [A
  // margin for two levels] in collectives/algorithm.cpp; a pieced allreduce it times whole:
  // Note [Pieced allreduces timed whole]).
  const bool pieced = op == CollectiveOp::kAllreduce &&
                      comm::allreduce_pieces(size_t(bytes), comm::kAllreducePieceBytes) > 1;
  const double margin =
      pieced ? comm::CollectiveCosts::kTimedMargin : comm::CollectiveCosts::kHierarchicalMargin;
  if (two_level >= (1.0 - margin) * flat) return flat;
  if (two_levels != nullptr) *two_levels = true;
  return two_level;
}

}  // namespace

bool dp_collective_in_two_levels(CollectiveOp op, double bytes, const Layout& l, const Cluster& c,
                                 const Execution& e) {
  bool two_levels = false;
  spanned_collective_seconds(op, bytes, l.dp, dp_span(l, c), dp_link(l, c), c, e, &two_levels);
  return two_levels;
}

double dp_collective_seconds(CollectiveOp op, double bytes, const Layout& l, const Cluster& c,
                             const Execution& e) {
  return spanned_collective_seconds(op, bytes, l.dp, dp_span(l, c), dp_link(l, c), c, e);
}

GroupSpan tp_span(const Layout& l, const Cluster& c) {
  if (l.tp <= c.gpus_per_node) return {l.tp, 1};
  if (l.tp % c.gpus_per_node == 0) return {c.gpus_per_node, l.tp / c.gpus_per_node};
  return {1, l.tp};
}

double tp_collective_seconds(CollectiveOp op, double bytes, const Layout& l, const Cluster& c,
                             const Execution& e) {
  return spanned_collective_seconds(op, bytes, l.tp, tp_span(l, c), tp_link(l, c), c, e);
}

const LinkLevel& tp_link(const Layout& l, const Cluster& c) {
  return l.tp <= c.gpus_per_node ? c.intra : c.inter;
}

const LinkLevel& dp_link(const Layout& l, const Cluster& c) {
  return l.tp * l.dp <= c.gpus_per_node ? c.intra : c.inter;
}

const LinkLevel& ep_link(const Layout& l, const Cluster& c) {
  return l.tp * l.ep <= c.gpus_per_node ? c.intra : c.inter;
}

const LinkLevel& pp_link(const Layout& l, const Cluster& c) {
  return l.gpus() <= c.gpus_per_node ? c.intra : c.inter;
}

namespace {

// One tp rank's share of a matmul of a micro-batch's b s tokens.
double matmul_seconds(const Matmul& mm, double tokens, int tp, const DeviceRates& d) {
  return gemm_seconds(2.0 * tokens * mm.in * mm.out / tp, d);
}

}  // namespace

double layer_gemms_forward(const TransformerShape& m, int mb, int tp, const DeviceRates& d) {
  const double tokens = double(m.seq) * double(mb);
  const double bs2h = tokens * double(m.seq) * double(m.hidden) / tp;
  double seconds = 2 * gemm_seconds(2 * bs2h, d);  // scores and context
  for (const Matmul& mm : m.layer_matmuls()) seconds += matmul_seconds(mm, tokens, tp, d);
  return seconds;
}

double layer_elementwise_bytes_forward(const TransformerShape& m, int mb, int tp, bool sp,
                                       const Execution& e) {
  return 2.0 * layer_activation_bytes(m, mb, tp, sp, Recompute::kNone, e);
}

namespace {

// The attention's scores and context GEMMs alone (what selective recomputation redoes).
double attention_gemms_forward(const TransformerShape& m, int mb, int tp, const DeviceRates& d) {
  const double bs2h = double(mb) * double(m.seq) * double(m.seq) * double(m.hidden) / tp;
  return 2 * gemm_seconds(2 * bs2h, d);
}

}  // namespace

MoeLayerCosts moe_layer_costs(const TransformerShape& m, const Layout& l, const Cluster& c,
                              const Execution& e, double attention_recompute, double load) {
  const DeviceRates& d = c.device;
  const double s = double(m.seq), b = double(l.mb), h = double(m.hidden), t = double(l.tp);
  const double experts = double(m.moe.experts), k = double(m.moe.top_k);
  const double f = double(m.expert_width());
  const double bsh2 = b * s * h * h / t, bs2h = b * s * s * h / t;
  const double attention =
      gemm_seconds(6 * bsh2, d) + 2 * gemm_seconds(2 * bs2h, d) + gemm_seconds(2 * bsh2, d);
  const double router = gemm_seconds(2.0 * b * s * h * experts, d);
  // The ep group's k b s ep rows spread over the experts / ep local experts, through two GEMMs
  // each; the busiest rank's experts, which every rank waits for at the exchange back, get
  // `load` times the balanced rows (expert_load).
  const double local = experts / l.ep, rows = load * k * b * s * l.ep / experts;
  const double expert_gemms = local * 2.0 * gemm_seconds(2.0 * rows * h * f, d);
  const double gemms = attention + router + expert_gemms;
  const double elementwise =
      2.0 * moe_layer_activation_bytes(m, l.mb, l.tp, l.sp, load, Recompute::kNone, e) /
      block_bandwidth(d);
  // tp: the attention's all-reduce each way (with sp its all-gather and reduce-scatter, and the
  // MoE's gather of the whole sequence and scatter back).
  const double allreduce =
      tp_collective_seconds(CollectiveOp::kAllreduce, b * s * h * e.param_bytes, l, c, e);
  const double tp = l.sp ? 2.0 * allreduce : allreduce;
  // ep: the routed rows out to their experts and back (k b s h each way; the busiest rank
  // receives, and sends back, load times that), and the counts (an all-gather over dp, an
  // all-to-all over ep) first.
  const double rows_bytes = load * k * b * s * h * e.activation_bytes;
  const double exchange = 2.0 * all_to_all_seconds(rows_bytes, l.ep, ep_link(l, c));
  const double counts = all_gather_seconds(8.0 * (experts + 1) * l.dp, l.dp, dp_link(l, c)) +
                        all_to_all_seconds(8.0 * experts, l.ep, ep_link(l, c));
  MoeLayerCosts out;
  out.forward = gemms + elementwise + tp + exchange + counts + d.block_overhead_s / 3.0;
  out.recompute = l.recompute == Recompute::kFull ? out.forward : attention_recompute;
  out.backward = 2.0 * gemms + 2.0 * elementwise + tp + exchange + out.recompute +
                 2.0 * d.block_overhead_s / 3.0;
  const bool full = l.recompute == Recompute::kFull;
  out.tp_comm = (full ? 3.0 : 2.0) * tp;
  out.ep_comm = (full ? 3.0 : 2.0) * exchange + (full ? 2.0 : 1.0) * counts;
  return out;
}

EndCosts end_costs(const TransformerShape& m, int mb, int tp, const Execution& e,
                   const DeviceRates& d) {
  const double b = double(mb), s = double(m.seq), h = double(m.hidden);
  const double vocab_t = double(m.vocab) / tp;
  const double activation_bytes = b * s * h * e.param_bytes;
  const double logits_flops = 2.0 * b * s * h * vocab_t;
  // The logits written, read for the softmax, their gradient written.
  const double loss_bytes = 3.0 * e.logits_bytes * b * s * vocab_t;
  EndCosts ends;
  ends.embed_forward = activation_bytes / d.memory_bandwidth;
  ends.embed_backward = 2.0 * activation_bytes / d.memory_bandwidth;
  ends.head_forward = gemm_seconds(logits_flops, d) + loss_bytes / d.memory_bandwidth;
  ends.head_backward = 2.0 * gemm_seconds(logits_flops, d) + loss_bytes / d.memory_bandwidth;
  return ends;
}

ActionCosts action_costs(const Workload& w, const Layout& l, const Cluster& c, const Execution& e) {
  const TransformerShape& m = w.model;
  const DeviceRates& d = c.device;
  const double s = double(m.seq), b = double(l.mb), h = double(m.hidden), t = double(l.tp);
  const double layers = double(m.layers) / l.pp;  // one rank's share of one pipeline

  const double scores = double(m.heads) * s * s * b * (2 * e.activation_bytes + e.mask_bytes) / t;
  const double elementwise_f =
      layer_elementwise_bytes_forward(m, l.mb, l.tp, l.sp, e) / block_bandwidth(d);
  const double gemm_f = layer_gemms_forward(m, l.mb, l.tp, d);
  const double activation_bytes = b * s * h * e.param_bytes;
  const double tp_f =
      2.0 * tp_collective_seconds(CollectiveOp::kAllreduce, activation_bytes, l, c, e);

  // A block's fixed time per micro-batch (DeviceRates::block_overhead_s): a third in the
  // forward, two in the backward, as its kernels are.
  const double layer_f = gemm_f + elementwise_f + tp_f + d.block_overhead_s / 3.0;
  double layer_recompute = 0;
  if (l.recompute == Recompute::kSelective) {
    switch (e.selective) {
      case SelectivePolicy::kAttention:
        layer_recompute =
            attention_gemms_forward(m, l.mb, l.tp, d) + 2.0 * scores / block_bandwidth(d);
        break;
      case SelectivePolicy::kEveryOtherMatmul: {  // Note [Recomputing every other matmul]
        layer_recompute = elementwise_f;
        for (const Matmul& mm : every_other_matmul(m.layer_matmuls(), true))
          layer_recompute += matmul_seconds(mm, s * b, l.tp, d);
        break;
      }
      case SelectivePolicy::kEveryOtherLayer:
        layer_recompute = 0.5 * layer_f;
        break;
    }
  } else if (l.recompute == Recompute::kFull) {
    layer_recompute = layer_f;
  }
  // sp's backward gathers the column-parallel linears' inputs again: two all-gathers, one
  // all-reduce's time (Execution::sp_regather_exposed).
  const double regather = l.sp && e.sp_regather_exposed ? tp_f / 2.0 : 0.0;
  const double layer_b = 2.0 * gemm_f + 2.0 * elementwise_f + tp_f + regather + layer_recompute +
                         2.0 * d.block_overhead_s / 3.0;
  double recomputed_tp = l.recompute == Recompute::kFull ? tp_f : 0.0;
  if (l.recompute == Recompute::kSelective && e.selective == SelectivePolicy::kEveryOtherLayer)
    recomputed_tp = 0.5 * tp_f;
  const double layer_tp = 2.0 * tp_f + regather + recomputed_tp;

  ActionCosts a;
  // The MoE layers (one rank's share, on average) in place of dense ones: See moe_layer_costs.
  const double moes = double(m.moe_layers()) / l.pp;
  const double dense = layers - moes;
  a.forward = dense * layer_f;
  a.backward = dense * layer_b;
  a.recompute = dense * layer_recompute;
  a.tp_comm = dense * layer_tp;
  if (moes > 0) {
    const MoeLayerCosts moe = moe_layer_costs(m, l, c, e, layer_recompute, expert_load(w, l));
    a.forward += moes * moe.forward;
    a.backward += moes * moe.backward;
    a.recompute += moes * moe.recompute;
    a.tp_comm += moes * moe.tp_comm;
    a.ep_comm = moes * moe.ep_comm;
    a.moe_forward_delta = moe.forward - layer_f;
    a.moe_backward_delta = moe.backward - layer_b;
  }

  // ZeRO per micro-batch: stage 3 gathers the weights for the forward and again for the
  // backward; stages 2 and 3 reduce-scatter the backward's gradients. Prefetching overlaps them
  // with the compute, so an action takes the longer of the two.
  // (The experts are not in the buckets: loom reduces them after the backward.)
  const double params =
      dense * layer_rank_parameters(m, l.tp) + moes * moe_layer_rank_parameters(m, l.tp);
  if (l.dp > 1 && l.zero >= 2) {
    double gather = l.zero >= 3 ? dp_collective_seconds(CollectiveOp::kAllGather,
                                                        params * e.param_bytes, l, c, e)
                                : 0;
    // Stage 3 without pipelines shards the experts too, over their dp / ep replicas, gathered
    // around each MoE layer's forward and backward as the rest.
    const int replicas = l.dp / l.ep;
    if (l.zero >= 3 && l.pp == 1 && moes > 0 && replicas > 1)
      gather += all_gather_seconds(
          moes * double(m.moe.experts / l.ep) * m.expert_parameters() * e.param_bytes, replicas,
          dp_link(l, c));
    const double scatter =
        dp_collective_seconds(CollectiveOp::kReduceScatter, params * e.grad_bytes, l, c, e);
    a.zero_comm = 2.0 * gather + scatter;
    if (e.comm_overlaps_compute) {
      a.forward = std::max(a.forward, gather);
      a.backward = std::max(a.backward, gather + scatter);
    } else {
      a.forward += gather;
      a.backward += gather + scatter;
    }
  }

  // The first stage looks up b s tokens (vocab-parallel: an all-reduce of the result), the last
  // computes the logits (one GEMM of 2 b s h V / t) and the loss (end_costs), each GEMM twice in
  // the backward.
  const EndCosts ends = end_costs(m, l.mb, l.tp, e, d);
  a.embed_forward = ends.embed_forward +
                    tp_collective_seconds(CollectiveOp::kAllreduce, activation_bytes, l, c, e);
  a.embed_backward = ends.embed_backward;
  // The rest's fixed time goes to the last stage, with the head (the embedding's share is small).
  a.head_forward = ends.head_forward + d.rest_overhead_s / 3.0;
  a.head_backward = ends.head_backward + 2.0 * d.rest_overhead_s / 3.0;

  if (l.pp > 1) {
    const double sent = e.scatter_gather_p2p ? activation_bytes / t : activation_bytes;
    a.p2p = pp_link(l, c).latency_s + sent / pp_link(l, c).bandwidth;
  }
  return a;
}

StepCosts step_costs(const Workload& w, const Layout& l, const Cluster& c, const Execution& e,
                     double rank_params, double last_backward, double rank_experts) {
  StepCosts s;
  const double bucketed = rank_params - rank_experts;
  const double grads = bucketed * e.grad_bytes, weights = bucketed * e.param_bytes;
  if (l.dp > 1) {
    auto dp = [&](CollectiveOp op, double bytes) {
      return dp_collective_seconds(op, bytes, l, c, e);
    };
    double hidden_part = 0, after = 0;  // what may overlap the backward, what follows the step
    switch (l.zero) {
      case 0:
        hidden_part = dp(CollectiveOp::kAllreduce, grads);
        break;
      case 1:
        hidden_part = dp(CollectiveOp::kReduceScatter, grads);
        after = dp(CollectiveOp::kAllGather, weights);
        break;
      case 2:  // the reduce-scatters ran with each micro-batch (action_costs)
        after = dp(CollectiveOp::kAllGather, weights);
        break;
      default:  // stage 3: gathered per micro-batch, nothing after the step
        break;
    }
    s.dp_comm = hidden_part + after;
    double exposed = hidden_part;
    if (e.overlap_grad_reduce && e.comm_overlaps_compute && hidden_part > 0) {
      // Buckets launch as the last backward fills them; the last bucket always follows it.
      const double last_bucket = hidden_part * std::min(1.0, e.bucket_bytes / grads);
      exposed = std::max(last_bucket, hidden_part - last_backward);
    }
    s.dp_exposed = exposed + after;
  }
  const int replicas = l.dp / l.ep;
  if (rank_experts > 0 && replicas > 1) {  // summed over the replicas after the backward
    const double bytes = rank_experts * e.grad_bytes;
    const double experts =
        l.zero == 0 ? allreduce_seconds(bytes, replicas, dp_link(l, c))
                    : reduce_scatter_seconds(bytes, replicas, dp_link(l, c)) +
                          all_gather_seconds(rank_experts * e.param_bytes, replicas, dp_link(l, c));
    s.dp_comm += experts;
    s.dp_exposed += experts;
  }
  if (l.pp > 1 && w.model.tied_output()) {
    const double table = double(w.model.vocab) * double(w.model.hidden) / l.tp;
    s.tied_embedding = allreduce_seconds(table * e.grad_bytes, 2, pp_link(l, c));
  }
  const double shard = bucketed / (l.zero >= 1 ? double(l.dp) : 1.0) +
                       rank_experts / (l.zero >= 1 ? double(replicas) : 1.0);
  const double traffic = e.param_bytes + e.grad_bytes + 2.0 * e.optimizer_bytes;
  s.optimizer = shard * traffic / c.device.memory_bandwidth;
  return s;
}

}  // namespace loom::planner
