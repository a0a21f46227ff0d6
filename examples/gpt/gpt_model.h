// The model loom-gpt trains, behind one interface: the single-process GPT, or with --tp its
// tensor-parallel split (parallel::TpGPT) over the mesh's tp group. Checkpoints are always the
// single-process layout: loading cuts each rank's slice, saving gathers the whole.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "core/io/gpt_params.h"
#include "core/nn/gpt.h"
#include "gpt/gpt_options.h"
#include "parallel/mesh.h"
#include "parallel/tensor_parallel/tp_gpt.h"

namespace loom::gpt {

// Expert parallelism's groups over a dp group (--moe-experts with more than one dp rank): `ep`,
// the --ep consecutive dp ranks the experts split over; `replicas`, the dp ranks holding the
// same experts in the other ep groups; and the factory of the MoE layers over them (capacity and
// the auxiliary losses over the whole dp group's batch; with --expert-tp, each expert split over
// `tp`, also on one dp rank). Empty otherwise. Collective over dp.
struct ExpertGroups {
  std::shared_ptr<comm::Communicator> ep, replicas;
  nn::MoeFactory make_moe;
};
ExpertGroups expert_groups(const GptOptions& o, const std::shared_ptr<comm::Communicator>& dp,
                           const std::shared_ptr<comm::Communicator>& tp);

class GptModel {
 public:
  GptModel(const GptConfig& config, const GptOptions& o, const parallel::DeviceMesh& mesh);

  nn::Module& module() const;
  const GptConfig& config() const { return config_; }
  // The tp group (null without tensor parallelism).
  std::shared_ptr<comm::Communicator> tp() const { return tp_; }

  // Mean next-token cross-entropy over the first `vocab` columns (the same on every tp rank),
  // plus the MoE blocks' auxiliary losses (--moe-experts); last_lm_loss() is then the
  // cross-entropy of the last loss() alone.
  Tensor loss(const Tensor& idx, const Tensor& targets) const;
  double last_lm_loss() const { return gpt_ ? gpt_->last_lm_loss() : tp_gpt_->last_lm_loss(); }
  std::vector<const nn::MoeLayer*> moe_layers() const;  // empty for a dense model
  // The MoE blocks' auxiliary losses of the last forward, summed (See nn::GPT::aux_loss).
  Tensor aux_loss() const;
  // With MoE blocks and dp > 1: the ep group this rank's experts are split over (--ep
  // consecutive dp ranks), and the ranks holding the same experts in the other ep groups.
  std::shared_ptr<comm::Communicator> ep_group() const { return ep_; }
  std::shared_ptr<comm::Communicator> expert_replicas() const { return expert_replicas_; }
  // Full logits [B, T, padded_vocab], the same on every tp rank (the tp split gathers them).
  Tensor logits(const Tensor& idx) const;
  std::function<Tensor(const Tensor&)> logits_fn() const {
    return [this](const Tensor& idx) { return logits(idx); };
  }

  // Moves the parameters to `device` (after load/init and any dtype change, before the trainer is
  // built); loss() and logits() then move their token inputs there.
  void to(Device device);
  Device device() const { return device_; }

  // Single-process weights in, each rank taking its slice (its experts among them).
  void load(const io::GptParams& params);
  // The single-process weights (f32, CPU), every expert included. Collective over tp and ep.
  io::GptParams full_params() const;
  const nn::MoeOptions& moe() const { return moe_options_; }

 private:
  void gather_experts(io::GptParams& params) const;

  GptConfig config_;
  nn::MoeOptions moe_options_;
  std::shared_ptr<comm::Communicator> tp_, ep_, expert_replicas_;
  Device device_ = Device::cpu();
  std::unique_ptr<nn::GPT> gpt_;
  std::unique_ptr<parallel::TpGPT> tp_gpt_;
};

}  // namespace loom::gpt
