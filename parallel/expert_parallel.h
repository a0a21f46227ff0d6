// Expert parallelism: a mixture-of-experts layer (core/nn/moe.h) whose experts are split over an
// `ep` group, each rank holding E / ep of them, while every rank routes its own tokens.
//
// forward, on each rank's tokens:
//   1. route (the replicated router: logits, top-k, gates), and exchange the routed counts over
//      the `batch` group (the ranks whose tokens form the batch, e.g. dp): the whole batch's
//      counts, this rank's place in each expert's queue (capacity drops the same assignments
//      one process would: the first ceil(k N c / E) in global token order), and N;
//   2. dispatch: each expert's rows to the rank that holds it, by the variable-split all-to-all
//      (counts exchanged first: one small all-to-all);
//   3. each local expert runs once over the rows of all ranks, in rank order (the global token
//      order when the ep group's ranks hold consecutive parts of the batch);
//   4. the results go back by the reverse all-to-all and are combined as one process combines
//      them: gate x expert output added per token in expert-index order. No atomics.
// The all-to-alls are differentiable (their backward is the reverse exchange), so backward
// sends each row's gradient back to the expert that computed it and the experts' gradients sum
// every rank's rows.
//
// aux_loss() is this rank's term of the whole batch's auxiliary losses: its share of them
// (nn::moe_aux_loss with the batch's counts) times the batch group's size, so that the mean of
// the terms over the batch group is one process's losses, value and gradient, as the mean of the
// ranks' cross-entropies is under data parallelism (each rank's loss is its mean; DDP and ZeRO
// average). The experts' gradients then follow the same rule as the shared parameters':
// DistributedDataParallel sums them over the expert's replicas and divides by the group's size
// (DdpOptions::own_replicas). Averaged over the batch group, the router's gradients equal one
// process's, and so does each expert's gradient on its rank, divided by the batch group's size
// (tests/mpi/expert_parallel_test.cpp).
//
// Parameter names are one process's: router.weight, experts.{e}.fc.weight, ... for the experts
// e this rank holds, so init_parameters draws the single-process values. Only parallel/ knows
// the groups; the layer's maths is core/nn/moe.h's.
//
// Note [Experts split over tp]
// With a tp group whose ranks see the same tokens (tensor parallelism without sequence
// parallelism, or with it once the MoE gathers the sequence), each expert can be split over tp as
// Megatron's MLP is: fc's output rows (and bias) and proj's input columns in tp slices (ShardSpec
// shards of the single-process parameters: init, --save and checkpoints see the whole). Every
// tp rank exchanges the same rows with its ep peers, runs its slice of each local expert
// (copy_to_tp on the received rows: their gradient sums the slices'), and the partial outputs of
// all local rows are summed over tp by one allreduce per layer (reduce_from_tp) before proj's
// whole bias is added and the rows go back: the layer's output is then whole, the same on every
// tp rank, and so are the gates' and router's gradients. Each rank keeps 1 / tp of the experts'
// weights and work; the sums over tp associate differently than one process's, so results agree
// to rounding (as dense tensor parallelism's do).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "core/nn/moe.h"

namespace loom::parallel {

class ExpertParallelMoE : public nn::MoeLayer {
 public:
  // `ep`: the ranks that split the experts (experts must divide by its size). `batch`: the
  // ranks whose tokens form one batch (capacity and the auxiliary losses are over all of them);
  // it must contain the ep group's ranks (often the same group, or the dp group).
  // `tp` (optional): each expert is split over it too, as Megatron's expert tensor parallelism
  // (See Note [Experts split over tp]); every rank of `tp` must route the same tokens.
  ExpertParallelMoE(int64_t channels, const nn::MoeOptions& options,
                    std::shared_ptr<comm::Communicator> ep,
                    std::shared_ptr<comm::Communicator> batch, double dropout = 0.0,
                    double proj_std = 0.02, std::shared_ptr<comm::Communicator> tp = nullptr);
  Tensor forward(const Tensor& x) override;  // this rank's tokens [..., C] -> [..., C]

  const Tensor& aux_loss() const override { return aux_loss_; }  // this rank's term (above)
  // The whole batch's routing: load per expert (after capacity), tokens, dropped, and this
  // rank's terms of the two losses' values (their means over the batch group are the batch's).
  const nn::MoeStats& stats() const override { return stats_; }
  int64_t first_expert() const { return first_; }
  int64_t local_experts() const { return local_; }

  std::shared_ptr<nn::Linear> router;
  std::shared_ptr<nn::Module> experts;  // children named by their global index
  std::shared_ptr<nn::Dropout> drop;

 private:
  // The local experts' outputs for rows sorted by local expert (counts[l] of expert l): whole
  // (nn::moe_experts_forward), or with tp this rank's partial sums without proj's bias (See
  // Note [Experts split over tp]). One grouped linear per layer.
  Tensor expert_rows(const Tensor& rows, const std::vector<int64_t>& counts);

  nn::MoeOptions options_;
  std::shared_ptr<comm::Communicator> ep_, batch_, tp_;
  int64_t first_ = 0, local_ = 0;
  std::vector<std::shared_ptr<nn::MLP>> experts_;  // this rank's, from first_ (without tp)
  struct SplitExpert {                             // with tp: this rank's slices
    Tensor fc_weight, fc_bias, proj_weight, proj_bias;
  };
  std::vector<SplitExpert> split_experts_;
  Tensor aux_loss_;
  nn::MoeStats stats_;
  // Dropless receive budget (Note [Dropless receive budget] in core/nn/moe.h), set by the first
  // dropless forward: the batch group's smallest budget in rows (-1: none), and for each batch
  // rank its ep group (the batch rank of that group's ep rank 0) and its ep rank.
  int64_t budget_rows_ = 0;
  std::vector<int64_t> ep_group_of_, ep_rank_of_;
  void learn_budget(int64_t channels, Device device);
  // The most rows any rank of any ep group would receive if each expert kept its first `cap`
  // assignments of the batch (counts: each batch rank's routed counts, width experts + 1).
  int64_t most_received(int64_t cap, const std::vector<int64_t>& counts) const;
};

// Whether a GPT parameter's name is a MoE expert's ("blocks.{i}.mlp.experts.{e}. ..."): the
// parameters expert parallelism splits over ep, reduced over their replicas.
bool is_expert_parameter(const std::string& name);
// The MoE layer holding expert parameter `name`: its path ("blocks.3.mlp"), whose forward reads
// it (ZeroOptions::own_unit).
std::string expert_layer_of(const std::string& name);

// The variable-split all-to-all of rows as an autograd op: x [S, C], rank r sends its rows
// [sum of send_rows[:j], + send_rows[j]) to rank j and receives recv_rows[i] rows from rank i,
// in rank order. Backward: the reverse exchange of the gradient.
Tensor all_to_all_rows(const Tensor& x, const std::vector<int64_t>& send_rows,
                       const std::vector<int64_t>& recv_rows,
                       const std::shared_ptr<comm::Communicator>& group);

// Seconds this process has spent in all_to_all_rows exchanges (forward and backward, from
// posting to completion) since the last call; resets the count. What a trainer reports as the
// all-to-all's share of a step.
double take_expert_exchange_seconds();

}  // namespace loom::parallel
