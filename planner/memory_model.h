// What one GPU holds for a layout: the training state by ZeRO stage, and the activations the
// schedule keeps in flight.
//
// Activations follow Korthikanti et al. ("Reducing Activation Recomputation in Large Transformer
// Models", 2022, section 4): one layer's forward stores, per micro-batch of b sequences of s
// tokens (their count: 16-bit activations, 1-byte dropout masks; Execution gives other sizes, as
// loom's f32 activations and its masks, which are never stored),
//   no parallelism                  s b h (34 + 5 a s / h)
//   tensor parallel t               s b h (10 + 24/t + 5 a s / (h t))
//   tensor + sequence parallel      s b h / t (34 + 5 a s / h)
//   selective recomputation         the 5 a s / h term (scores, softmax, its dropout) recomputed
//   full recomputation              the layer's input only: 2 s b h (/t with sequence parallel)
// and recomputation materialises one layer's full set again during its backward. An attention
// that does not keep its scores (Execution::materialised_scores false: loom's, as
// FlashAttention) replaces the 5 a s / h term by its output and the log-sum-exps, s b h + a s b
// (f32), over tp. A pipeline rank keeps that
// for each micro-batch-chunk in flight (in_flight_at_backwards: 1F1B holds p on the first stage,
// so s b h L (34 + 5as/h) / t in all; interleaved (1 + (p-1)/(p v)) times that), with the chunk's
// output when it sends it on. The first stage also keeps the embedding's dropout mask (s b h
// mask bytes per micro-batch, /t with sp).
//
// The peak falls in a backward, with its temporaries (the loss's logits and their gradient, fresh
// weight gradients, a layer's token gradients) and with the gradients only once they exist: See
// Note [Where the memory peaks] (memory_model.cpp).
//
// State per parameter (Execution): weights, gradients and optimizer state (f32 masters and Adam's
// moments), divided over dp by ZeRO stage 3, >= 2 and >= 1 respectively; ZeRO-3 also gathers
// a block's weights while the next is prefetched, and stages a block's gradients whole before
// their reduce-scatter; ZeRO-2 stages a bucket filling and one reducing. Experts (MoE, with expert
// parallelism ep): a rank holds experts / ep of each of its MoE layers; their optimizer state is
// divided over their dp / ep replicas by ZeRO >= 1, their weights by stage 3 without pipelines
// (then one MoE layer's local experts are gathered at a time, beside the layers'), their gradients
// not (loom reduces them after the backward, into shards of 1/replicas it keeps beside them).
#pragma once

#include <string>
#include <vector>

#include "parallel/pipeline/schedule.h"
#include "planner/cluster.h"
#include "planner/execution.h"
#include "planner/layout.h"
#include "planner/workload.h"

namespace loom::planner {

// What a rank holds at its peak. `gradients` is the training state's share (what the rank keeps
// between steps once they exist); gradients_at_peak what of them exists at the peak, which may be
// none: a rank without data parallelism allocates them in its first backward of the step.
struct MemoryBreakdown {
  double parameters = 0;
  double gradients = 0;
  double optimizer_state = 0;
  double activations = 0;  // the micro-batch-chunks' activations held at the peak
  double gathered = 0;     // ZeRO-3: the whole weights of the layer in use and the prefetched one
  double working = 0;      // the backward's temporaries at the peak (Note [Where the memory peaks])
  double reserved = 0;     // the device's reserved bytes + fragmentation of the rest
  double gradients_at_peak = 0;
  double total() const {
    return parameters + gradients_at_peak + optimizer_state + activations + gathered + working +
           reserved;
  }
  std::string str() const;  // "params 1.2 GB, grads ..., total 71.3 GB"
};

// The micro-batch-chunks a pipeline rank holds at its backwards (those whose forward has run and
// whose backward has not, the one starting included): at its first backward of the step and the
// most at any later one. 0 and 0: the training state alone (no step running).
struct InFlight {
  int first_backward = 0;
  int later_backwards = 0;
};
// From `rank`'s actions in `schedule`.
InFlight in_flight_at_backwards(const parallel::pipeline::Schedule& schedule, int rank);

// Note [Recomputing every other matmul] (memory_model.cpp) splits a layer's matmuls, in forward
// order, into those whose outputs are kept (the first, third, ...) and those recomputed (the
// second, fourth, ...): one side of `mms`.
std::vector<Matmul> every_other_matmul(const std::vector<Matmul>& mms, bool recomputed);

// Bytes one layer's forward keeps until its backward, per micro-batch (Korthikanti, above).
double layer_activation_bytes(const TransformerShape& m, int mb, int tp, bool sp, Recompute r,
                              const Execution& e);
// Of those, the attention block's (what is left of the layer once its MLP's backward has run).
double attention_activation_bytes(const TransformerShape& m, int mb, int tp, bool sp, Recompute r,
                                  const Execution& e);
// The extra bytes recomputation materialises during one layer's backward (0 without it).
// (`expert_load`: a MoE layer's routed rows: See moe_layer_activation_bytes.)
double recompute_working_bytes(const TransformerShape& m, int mb, int tp, bool sp,
                               double expert_load, Recompute r, const Execution& e);

// A MoE layer's (the attention's as a dense layer's, the MoE MLP's whole on every tp rank: the
// router's f32 logits and gates, and per routed token its row, the expert's hidden before and
// after GELU and its f32 output); the rank's experts receive `expert_load` times the balanced
// rows (TransformerShape::rank_expert_load).
double moe_layer_activation_bytes(const TransformerShape& m, int mb, int tp, bool sp,
                                  double expert_load, Recompute r, const Execution& e);

// One layer's parameters on one tp rank of tp: QKV, projection and MLP weights and the
// column-parallel biases split over tp (12h^2 + 7h), the row-parallel biases and the LayerNorms
// whole (6h). A MoE layer's outside its experts: the attention's split (4h^2 + 3h) and whole
// (5h) parts and the router (h E, whole).
double layer_rank_parameters(const TransformerShape& m, int tp);
double moe_layer_rank_parameters(const TransformerShape& m, int tp);

// Parameters on pipeline rank `rank` of `layout` (its layers' tp shards, and the embedding or the
// tied output layer when it holds the first or last stage; in MoE layers the router and
// experts / ep experts, whole over tp).
double rank_parameters(const TransformerShape& m, const Layout& layout, int rank);
// The MoE layers among pipeline rank `rank`'s chunks, and the expert parameters it holds.
int64_t rank_moe_layers(const TransformerShape& m, const Layout& layout, int rank);
double rank_expert_parameters(const TransformerShape& m, const Layout& layout, int rank);

// What pipeline rank `rank` of `layout` holds at its peak, with `in_flight` from its schedule.
MemoryBreakdown rank_memory(const Workload& w, const Layout& layout, const Cluster& c,
                            const Execution& e, int rank, const InFlight& in_flight);

}  // namespace loom::planner
