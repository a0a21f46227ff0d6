// Mixture of experts (Switch, Mixtral): a routed replacement for a block's MLP.
//
//   logits = x W_r^T (f32; W_r [experts, C], no bias), p = softmax(logits)
//   the top_k experts of each token by p (ties to the lower index); gate weights: the k
//   probabilities renormalised to sum to 1 when k > 1 (Mixtral), the raw probability when k = 1
//   (Switch)
//   out = dropout(sum over experts e, in index order, of gate_e * expert_e(x)) over the tokens
//   routed to e; each expert is the block's GELU MLP (C -> 4C -> C, or MoeOptions::hidden wide)
//   without its own dropout
//
// Capacity (capacity_factor c > 0): each expert takes at most ceil(k * tokens * c / experts)
// assignments, in token order; the rest are dropped (their gate contributes nothing; the block's
// residual passes the token on). c = 0: dropless.
//
// Note [Dropless receive budget]
// Dropless routing lets any expert receive any number of rows: a router that sends every token
// to one expert (early in training, or diverging) makes the rank holding it keep activations for
// k x tokens rows, the load-imbalance OOM users of other MoE runtimes meet. So each rank has a
// receive budget in rows: `receive_budget_mb` of activations (0: a quarter of the memory
// available when the layer first runs, agreed as the smallest over the ranks; < 0: none), at
// about 22 x C x 4 bytes per received row (the expert's input, hidden and GELU rows and output
// kept for backward, and their gradients). A forward whose routing would have some rank receive
// more falls back, declared: it keeps the first `cap` assignments of each expert in global token
// order (capacity mode's rule, with the largest cap under which every rank's rows fit) and drops
// the rest; stats().budget_capacity is that cap (-1: no fallback), stats().dropped counts them,
// and the first fallback (and every 100th) prints a warning naming the rows, the budget and the
// cap. Within the budget, dropless is exact as ever. With expert parallelism every rank decides
// from the same gathered counts, so all take the same cap.
//
// Auxiliary losses, of the last forward (aux_loss(), added by GPT::loss):
//   load balancing  alpha * E * sum_e f_e * P_e, f_e the fraction of routed token-slots sent to e
//                   (before capacity), P_e the mean router probability of e;
//   router z-loss   beta * mean over tokens of logsumexp(logits)^2.
// With one expert and top_k 1 the layer is the dense MLP bit for bit (the gate is exactly 1, and
// no auxiliary gradient reaches the MLP while beta is 0; tests/unit/moe_test.cpp).
//
// Parameter names: router.weight, experts.{e}.fc.weight / .bias, experts.{e}.proj.weight / .bias.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "core/nn/dropout.h"
#include "core/nn/linear.h"
#include "core/nn/mlp.h"

namespace loom::nn {

struct MoeOptions {
  int64_t experts = 0;  // 0: no MoE (dense blocks)
  int64_t top_k = 1;
  int64_t every = 1;           // block i is a MoE when i % every == 0
  double capacity_factor = 0;  // 0: dropless
  double aux_loss = 0.01;      // alpha
  double z_loss = 0.001;       // beta
  // Dropless only: See Note [Dropless receive budget]. 0: derived from memory; < 0: none.
  double receive_budget_mb = 0;
  // Each expert's hidden width (0: 4 x channels, the dense MLP's). Narrower experts give a top-k
  // model the dense model's active parameters: k experts of 4C / k.
  int64_t hidden = 0;
  bool enabled() const { return experts > 0; }
  int64_t expert_width(int64_t channels) const { return hidden > 0 ? hidden : 4 * channels; }
  void validate() const;  // throws loom::Error naming the bad field
};

// What the last forward routed.
struct MoeStats {
  std::vector<int64_t> load;  // assignments each expert received (after capacity)
  int64_t tokens = 0;
  int64_t dropped = 0;  // assignments dropped by capacity (or the budget's fallback)
  // Dropless only: the per-expert cap this forward fell back to because some rank's rows would
  // exceed its receive budget, -1 when it did not (See Note [Dropless receive budget]).
  int64_t budget_capacity = -1;
  double aux_loss = 0;  // the load-balancing term's value
  double z_loss = 0;    // the z-loss term's value
};

// The pieces of the layer's forward, shared with expert parallelism (parallel/expert_parallel.h),
// which runs them over the tokens of several ranks.
//
// The routing of one batch of tokens flat [N, C]: router logits and probabilities, each token's
// top-k experts and their gates.
struct MoeRouting {
  Tensor logits;                // [N, E], f32
  Tensor probs;                 // softmax(logits)
  Tensor gates;                 // [N * k, 1]: the gate of token t's j-th choice at row t * k + j
  std::vector<int64_t> choice;  // [N * k]: token t's j-th expert at t * k + j
  std::vector<int64_t> routed;  // per expert: assignments, before capacity
};
MoeRouting moe_route(Linear& router, const Tensor& flat, const MoeOptions& options);

// Each expert's assignments in token order after capacity: of expert e's, those whose place
// among all its assignments (taken[e] of them come before this batch's; empty: none) is below
// `capacity` (< 0: all kept).
struct MoeAssignments {
  std::vector<std::vector<int64_t>> tokens;  // per expert: token rows
  std::vector<std::vector<int64_t>> slots;   // per expert: the matching rows of gates
  int64_t dropped = 0;
};
MoeAssignments moe_assign(const MoeRouting& routing, const MoeOptions& options, int64_t capacity,
                          const std::vector<int64_t>& taken = {});
// The experts' MLPs (fc, GELU, proj; no dropout) over rows sorted by expert: counts[e] rows of
// experts[e], in order. One grouped linear per layer for all of them (Note [Grouped linear] in
// core/ops/grouped_linear.cpp: one grouped GEMM on CUDA, each expert's own GEMMs on the CPU, so
// the results are the experts' own bit for bit). Experts without rows take no part (their
// parameters get no gradient). [rows, C] -> [rows, C].
Tensor moe_experts_forward(const std::vector<std::shared_ptr<MLP>>& experts, const Tensor& rows,
                           const std::vector<int64_t>& counts);
// Slots per expert for a batch of `tokens` tokens in all: ceil(k x tokens x c / E); -1 when
// dropless.
int64_t moe_capacity(const MoeOptions& options, int64_t tokens);

// See Note [Dropless receive budget]. The budget in rows of C channels: from `budget_mb`, or
// (0) a quarter of the memory now available on `device`; -1 for none (budget_mb < 0).
int64_t moe_receive_budget_rows(double budget_mb, int64_t channels, Device device);
// The largest per-expert cap in [0, upper] whose `rows(cap)` (the most rows any rank would
// receive with that cap: non-decreasing in it) is within `budget`.
int64_t moe_budget_capacity(int64_t budget, int64_t upper,
                            const std::function<int64_t(int64_t)>& rows);
// Prints the fallback's warning (the first and every 100th call of the process).
void moe_warn_budget_fallback(int64_t rows, int64_t budget, int64_t cap, int64_t dropped);

// These tokens' share of the auxiliary losses of a batch of `tokens` tokens in all, in which
// expert e received routed[e] assignments (on one process: this batch's own):
//   alpha E sum_e (routed_e / (k tokens)) (sum over these tokens of p_te) / tokens
//   + beta (sum over these tokens of logsumexp_t^2) / tokens.
// The shares of all parts of the batch add up to the whole batch's losses. `balance` and `z`
// receive the two terms' values.
Tensor moe_aux_loss(const MoeRouting& routing, const MoeOptions& options,
                    const std::vector<int64_t>& routed, int64_t tokens, double* balance, double* z);

// Note [A batch in micro-batches]
// A batch may reach a MoE layer in parts (gradient accumulation's micro-batches), forwarded in
// order: part p holds the batch's tokens after those of parts < p (with a batch group, all its
// ranks' part p comes before any rank's part p + 1, each part in rank order). Capacity is the
// whole batch's, ceil(k N c / E) of its N tokens (a part's tokens x parts), and each expert's
// places count from the batch's first token, so the parts drop what one process drops. The
// load-balancing loss needs f_e over the whole batch, known only once every part is routed; a
// part's backward cannot wait for that. So a trainer that splits a batch while aux_loss > 0
// forwards every part twice: first without gradients in recording mode (the routing pass: the
// layers count the whole batch's assignments; their aux_loss() is zero), then for real, with the
// recorded counts. The two passes route alike (the same tokens, the same dropout keys), so the
// split batch's losses and gradients are one process's, for one more forward of the batch.
// Megatron-Core and DeepSpeed take f_e over each micro-batch instead, which differs from the
// whole batch's. The dropless receive budget applies to each forward: a part's rows are what
// memory holds at once.
// moe_begin_batch(model, parts, record) readies every MoE layer of a model for the next batch;
// after its last part a layer turns to the real pass (after recording), or back to whole batches.
class MoeBatchSplit {
 public:
  // `seen`: how many of the parts this layer forwards (0: all of them; fewer where replicas of
  // the layer share them, as Chimera's two pipelines do: then the replicas' recorded counts are
  // added up with set_recorded before the real pass; with capacity, each part's place in the
  // experts' queues counts the other replica's earlier parts too, and the trainer sets the real
  // pass up with plan()).
  void begin(int64_t parts, bool record, int64_t seen = 0);
  // What this forward's part is of its batch.
  struct Part {
    int64_t tokens = 0;           // the whole batch's
    std::vector<int64_t> before;  // per expert: assignments routed in the earlier parts
    std::vector<int64_t> routed;  // per expert: the whole batch's assignments (f_e's counts)
    bool recording = false;       // the routing pass: no loss is needed
  };
  // From this part's routed counts and tokens (over the batch group); moves on to the next part.
  // `aux_loss`: the layer's alpha (a split batch without recorded counts needs it 0).
  Part next(const std::vector<int64_t>& routed, int64_t tokens, double aux_loss,
            double capacity_factor = 0);
  // The routing pass's counts (per expert, then the tokens), and their replacement by the sum
  // over the layer's replicas (after the routing pass, before the real one).
  std::vector<int64_t> recorded() const;
  void set_recorded(const std::vector<int64_t>& counts);
  // The routing pass's counts of each part this layer forwarded, in its order (per expert).
  const std::vector<std::vector<int64_t>>& recorded_parts() const { return recorded_parts_; }
  // The real pass of a batch in `parts` parts whose routing pass ran elsewhere (Chimera with
  // capacity: every part through one replica of the layer, in order): the whole batch's counts
  // (recorded()'s form) and, for each part this layer forwards, in its order, the assignments
  // routed to each expert in the batch's earlier parts (Part::before), whoever forwards them.
  void plan(int64_t parts, const std::vector<int64_t>& recorded,
            std::vector<std::vector<int64_t>> before);

 private:
  int64_t parts_ = 1, seen_ = 1, done_ = 0, recorded_tokens_ = 0;
  bool recording_ = false;
  std::vector<int64_t> before_, recorded_;
  std::vector<std::vector<int64_t>> recorded_parts_, part_places_;
};

// What a GPT block needs of a MoE layer, whoever computes it (this file's MoE on one process,
// parallel::ExpertParallelMoE over an ep group).
class MoeLayer : public Module {
 public:
  // The last forward's auxiliary losses (a scalar, differentiable in the router and the input;
  // with expert parallelism this rank's term: the mean of the batch group's terms is the batch's
  // losses, See parallel/expert_parallel.h), and what it routed.
  virtual const Tensor& aux_loss() const = 0;
  virtual const MoeStats& stats() const = 0;
  // See Note [A batch in micro-batches].
  void begin_batch(int64_t parts, bool record, int64_t seen = 0) {
    split_.begin(parts, record, seen);
  }
  std::vector<int64_t> recorded_batch() const { return split_.recorded(); }
  void set_recorded_batch(const std::vector<int64_t>& counts) { split_.set_recorded(counts); }
  const std::vector<std::vector<int64_t>>& recorded_parts() const {
    return split_.recorded_parts();
  }
  void plan_batch(int64_t parts, const std::vector<int64_t>& recorded,
                  std::vector<std::vector<int64_t>> before) {
    split_.plan(parts, recorded, std::move(before));
  }
  // The last forward's part of its batch, and the part the next recomputation replays: a
  // checkpointed block keeps its forward's, since other forwards (a pipeline's later
  // micro-batches) may pass through the layer before its backward (See Note [Checkpointed MoE
  // blocks] in core/nn/block_checkpointing.h).
  const MoeBatchSplit::Part& forward_part() const { return forward_part_; }
  void replay_part(MoeBatchSplit::Part part) { forward_part_ = std::move(part); }

 protected:
  // split_.next() for a forward; when activation checkpointing recomputes that forward in
  // backward (autograd::recomputing()), the part it had instead: the recomputation routes,
  // drops and weighs the auxiliary losses as the forward did, and counts nothing again.
  MoeBatchSplit::Part next_part(const std::vector<int64_t>& routed, int64_t tokens, double aux_loss,
                                double capacity_factor);
  MoeBatchSplit split_;

 private:
  MoeBatchSplit::Part forward_part_;  // the last forward's (not a recomputation's), or replayed
};
// Readies every MoE layer under `model` for a batch forwarded in `parts` parts, recording first
// when `record` (See Note [A batch in micro-batches]); returns how many layers it found.
int64_t moe_begin_batch(Module& model, int64_t parts, bool record, int64_t seen = 0);
// Every MoE layer under `model`, in registration order.
std::vector<MoeLayer*> moe_layers_of(Module& model);
// Builds a block's MoE layer (GptOptions::make_moe): channels, options, dropout, proj_std.
using MoeFactory =
    std::function<std::shared_ptr<MoeLayer>(int64_t, const MoeOptions&, double, double)>;

class MoE : public MoeLayer {
 public:
  MoE(int64_t channels, const MoeOptions& options, double dropout = 0.0, double proj_std = 0.02);
  Tensor forward(const Tensor& x) override;  // [..., C] -> [..., C]

  const Tensor& aux_loss() const override { return aux_loss_; }
  const MoeStats& stats() const override { return stats_; }
  const MoeOptions& options() const { return options_; }

  std::shared_ptr<Linear> router;  // weight [experts, C]
  std::shared_ptr<ModuleList> experts;
  std::shared_ptr<Dropout> drop;  // on the combined output, as the dense MLP's

 private:
  MoeOptions options_;
  std::vector<std::shared_ptr<MLP>> experts_;
  Tensor aux_loss_;
  MoeStats stats_;
  int64_t budget_rows_ = 0;  // See Note [Dropless receive budget]; 0 until the first forward
};

}  // namespace loom::nn
