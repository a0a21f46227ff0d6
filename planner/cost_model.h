// How long each piece of a training step takes on a cluster: the per-micro-batch actions the
// pipeline schedule is simulated with, and the once-per-step data-parallel reduction and
// optimizer update.
//
//   GEMMs        a GEMM of f FLOPs takes (f + gemm_half_flops) / (peak * gemm_efficiency): the
//                efficiency curve of DeviceRates, so small GEMMs (a thin tp shard, a short
//                micro-batch) pay a fixed cost that large ones amortise. Six per layer forward
//                (QKV, scores, context, projection, MLP in and out), two per GEMM backward.
//   element-wise LayerNorms, GELU, softmax, dropouts, residual adds: memory-bound; they move
//                twice the bytes the forward stores (Korthikanti's count, written then read) at
//                the GPU's memory bandwidth, twice that in the backward.
//   collectives  ring algorithms on the slowest link level the group spans, alpha-beta:
//                all-reduce 2(n-1) (latency + bytes / (n bandwidth)), reduce-scatter and
//                all-gather half of that. Tensor parallelism: two all-reduces (or with sp an
//                all-gather and a reduce-scatter each) of b s h activations per layer forward,
//                two per backward, not overlapped (loom's and Megatron's default).
//                A data-parallel or tensor-parallel group spanning nodes with L > 1 of its
//                ranks in each runs as Execution::spanning says. loom's in two levels when
//                faster (BlueConnect, collectives/hierarchical.h; LOOM_COLL_ALGO=auto picks per
//                call): all-reduce = reduce-scatter inside the node + all-reduce of 1/L of the
//                bytes across nodes + all-gather inside; reduce-scatter and all-gather = their
//                node and across-node halves. NCCL's as one ring per NIC: a ring whose
//                crossing runs on the node's L links at once.
//   pipeline     one activation (b s h, 16-bit) per micro-batch and stage boundary, latency +
//                bytes / bandwidth on the link between neighbouring pipeline ranks.
//   recompute    selective: the scores and context GEMMs and the softmax again in the backward;
//                full: the whole forward again, its collectives included.
//   ZeRO         stage 3 gathers a rank's weights before each micro-batch's forward and backward,
//                stages 2 and 3 reduce-scatter each micro-batch's gradients, overlapped with that
//                compute by prefetching (an action takes the longer of the two); stages 0 and 1
//                reduce once per step, stages 1 and 2 then all-gather the updated weights.
//   optimizer    memory-bound: weights, gradients, masters and moments read and written.
//   MoE          a MoE layer (workload.h) is a dense layer's attention, the router's GEMM and,
//                with balanced routing, k b s rows per rank through its experts / ep local
//                experts (two GEMMs each, of k b s ep / experts rows); element-wise bytes as a
//                dense layer's (memory_model.h's MoE count); two all-to-alls of the k b s h
//                routed rows over the ep group each way (and the routing counts: an all-gather
//                over dp and an all-to-all over ep, latency-bound), not overlapped. The
//                experts' gradients are summed over their dp / ep replicas after the backward
//                (all-reduce, or with ZeRO reduce-scatter + all-gather), exposed; ZeRO-3
//                without pipelines also gathers them over those replicas with the rest.
#pragma once

#include "planner/cluster.h"
#include "planner/execution.h"
#include "planner/layout.h"
#include "planner/workload.h"

namespace loom::planner {

// Seconds of one GEMM of `flops` (the efficiency curve above).
double gemm_seconds(double flops, const DeviceRates& d);
// Ring collectives over n ranks of a buffer of `bytes` (the whole buffer, not a shard).
double allreduce_seconds(double bytes, int n, const LinkLevel& link);
double reduce_scatter_seconds(double bytes, int n, const LinkLevel& link);
double all_gather_seconds(double bytes, int n, const LinkLevel& link);

enum class CollectiveOp { kAllreduce, kReduceScatter, kAllGather };
// An all-to-all in which each of n ranks holds `bytes` for the group: n - 1 exchanges of
// bytes / n each.
double all_to_all_seconds(double bytes, int n, const LinkLevel& link);
// A ring collective of a `bytes` buffer over n ranks on one link level.
double ring_seconds(CollectiveOp op, double bytes, int n, const LinkLevel& link);

// How a group sits on the nodes: `local` of its ranks in each of `nodes` nodes; local 1 when they
// do not split evenly (two levels then do not apply and loom stays flat). dp_span: the layout's
// data-parallel group (tp innermost, then dp).
struct GroupSpan {
  int local = 1;
  int nodes = 1;
};
GroupSpan dp_span(const Layout& l, const Cluster& c);
// A data-parallel collective of a `bytes` buffer as the execution runs it: one ring on dp_link,
// or across nodes as Execution::spanning says.
double dp_collective_seconds(CollectiveOp op, double bytes, const Layout& l, const Cluster& c,
                             const Execution& e);
// Whether that collective runs in loom's two levels (kTwoLevels across nodes, where predicted
// faster by collectives' margin): they hold buffers of their own (memory_model.cpp).
bool dp_collective_in_two_levels(CollectiveOp op, double bytes, const Layout& l, const Cluster& c,
                                 const Execution& e);
// The same for the tensor-parallel group: inside a node, or over whole nodes when tp exceeds one.
GroupSpan tp_span(const Layout& l, const Cluster& c);
double tp_collective_seconds(CollectiveOp op, double bytes, const Layout& l, const Cluster& c,
                             const Execution& e);

// One layer's forward GEMMs for a micro-batch of mb sequences, one tp rank's share (the
// backward's are twice these), and the bytes its element-wise ops move (the backward's: twice).
double layer_gemms_forward(const TransformerShape& m, int mb, int tp, const DeviceRates& d);
double layer_elementwise_bytes_forward(const TransformerShape& m, int mb, int tp, bool sp,
                                       const Execution& e);

// The embedding lookup's and the head's (logits GEMM, the loss) device time for one micro-batch
// of mb sequences, one tp rank's share of the vocabulary, without communication; each side's
// forward and backward. The rest's fixed time (rest_overhead_s) is not in them.
struct EndCosts {
  double embed_forward = 0, embed_backward = 0, head_forward = 0, head_backward = 0;
};
EndCosts end_costs(const TransformerShape& m, int mb, int tp, const Execution& e,
                   const DeviceRates& d);

// The link level each group of the layout crosses, given the mesh order (layout.h): a group
// spanning consecutive ranks stays inside a node while it spans at most gpus_per_node.
const LinkLevel& tp_link(const Layout& l, const Cluster& c);
const LinkLevel& dp_link(const Layout& l, const Cluster& c);
const LinkLevel& pp_link(const Layout& l, const Cluster& c);
// An expert-parallel group: ep consecutive dp ranks, tp apart.
const LinkLevel& ep_link(const Layout& l, const Cluster& c);

// One micro-batch through one pipeline rank's share of one pipeline (layers / pp layers; the
// schedule validator divides it among interleaved chunks), in seconds.
struct ActionCosts {
  double forward = 0;
  double backward = 0;                           // with the weight gradients and any recomputation
  double embed_forward = 0, embed_backward = 0;  // extra on the first stage
  double head_forward = 0, head_backward = 0;    // extra on the last: logits and the loss
  double p2p = 0;                                // one activation or gradient between stages
  double tp_comm = 0;                            // the tp collectives inside forward + backward
  double zero_comm = 0;  // ZeRO-3 gathers / ZeRO-2+ reduce-scatters per micro-batch (hidden
                         // up to the compute they overlap)
  double recompute = 0;  // the recomputation inside backward
  double ep_comm = 0;    // the MoE layers' all-to-alls inside forward + backward
  // forward and backward count each rank's average share of the MoE layers (moe_layers / pp);
  // these are one MoE layer's forward and backward minus a dense layer's, for the stages that
  // hold more or fewer (evaluate's moe_stage_costs).
  double moe_forward_delta = 0, moe_backward_delta = 0;
};
// One MoE layer's micro-batch (See the header comment's MoE): forward, backward (with any
// recomputation: the whole forward again for full, `attention_recompute` for selective), and
// the tp and ep communication inside them; the busiest rank's experts receive `load` times the
// balanced rows (expert_load).
struct MoeLayerCosts {
  double forward = 0, backward = 0, recompute = 0, tp_comm = 0, ep_comm = 0;
};
MoeLayerCosts moe_layer_costs(const TransformerShape& m, const Layout& l, const Cluster& c,
                              const Execution& e, double attention_recompute, double load);
ActionCosts action_costs(const Workload& w, const Layout& l, const Cluster& c, const Execution& e);

struct StepCosts {
  double dp_comm = 0;         // the step's data-parallel reduction (and ZeRO 1/2's gather)
  double dp_exposed = 0;      // what of it no backward hides
  double tied_embedding = 0;  // summing the embedding's two copies' gradients (pp > 1)
  double optimizer = 0;
};
// rank_params: the parameters of the rank whose reduction is largest (rank_experts of them
// experts, reduced over their replicas); last_backward: the backward its reduction can overlap.
StepCosts step_costs(const Workload& w, const Layout& l, const Cluster& c, const Execution& e,
                     double rank_params, double last_backward, double rank_experts = 0);

}  // namespace loom::planner
