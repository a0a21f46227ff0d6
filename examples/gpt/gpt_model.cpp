#include "gpt/gpt_model.h"

#include "collectives/planning_backend.h"
#include "core/ops.h"
#include "parallel/expert_parallel.h"
#include "parallel/tensor_parallel/tp_state.h"

namespace loom::gpt {

ExpertGroups expert_groups(const GptOptions& o, const std::shared_ptr<comm::Communicator>& dp,
                           const std::shared_ptr<comm::Communicator>& tp) {
  ExpertGroups g;
  const bool split = o.expert_tp > 1;  // See Note [Experts split over tp]
  if (o.moe_experts == 0 || (dp->size() == 1 && !split)) return g;
  // The dp ranks' tokens form the batch; the experts split over ep groups of consecutive dp
  // ranks, each group holding all of them, replicated across the groups. With tp, each tp
  // rank's dp group does the same (the experts are whole over tp).
  const int ep = int(o.ep), rank = dp->rank();
  LOOM_CHECK(ep >= 1 && dp->size() % ep == 0, "loom-gpt: --ep ", ep,
             " must divide the data-parallel ranks (", dp->size(), ")");
  if (std::string(dp->backend()) == "planning") {  // a layout worked out, not running
    g.ep = comm::make_planning_communicator(rank % ep, ep, dp->name() + ".ep");
    g.replicas =
        comm::make_planning_communicator(rank / ep, dp->size() / ep, dp->name() + ".experts");
  } else {
    g.ep = dp->split(rank / ep, rank, dp->name() + ".ep");
    g.replicas = dp->split(rank % ep, rank, dp->name() + ".experts");
  }
  g.make_moe = [group = g.ep, dp, tp = split ? tp : nullptr](
                   int64_t channels, const nn::MoeOptions& moe, double dropout,
                   double proj_std) -> std::shared_ptr<nn::MoeLayer> {
    return std::make_shared<parallel::ExpertParallelMoE>(channels, moe, group, dp, dropout,
                                                         proj_std, tp);
  };
  return g;
}

GptModel::GptModel(const GptConfig& config, const GptOptions& o, const parallel::DeviceMesh& mesh)
    : config_(config), moe_options_(o.moe()) {
  const ExpertGroups groups = expert_groups(o, mesh.dp_ptr(), mesh.tp_ptr());
  ep_ = groups.ep;
  expert_replicas_ = groups.replicas;
  const nn::MoeFactory& make_moe = groups.make_moe;
  if (mesh.tp_size() == 1 && !o.sequence_parallel) {
    nn::GptOptions g{o.dropout, o.checkpoint_activations, o.moe()};
    g.make_moe = make_moe;
    gpt_ = std::make_unique<nn::GPT>(config, g);
    return;
  }
  tp_ = mesh.tp_ptr();
  parallel::TpGptOptions t{o.dropout, o.sequence_parallel, o.moe(), make_moe,
                           o.checkpoint_activations};
  tp_gpt_ = std::make_unique<parallel::TpGPT>(config, tp_, t);
}

nn::Module& GptModel::module() const {
  if (gpt_) return *gpt_;
  return *tp_gpt_;
}

void GptModel::to(Device device) {
  module().to(device);
  device_ = device;
}

Tensor GptModel::loss(const Tensor& idx, const Tensor& targets) const {
  const Tensor i = idx.to(device_), t = targets.to(device_);
  return gpt_ ? gpt_->loss(i, t) : tp_gpt_->loss(i, t);
}

Tensor GptModel::aux_loss() const { return gpt_ ? gpt_->aux_loss() : tp_gpt_->aux_loss(); }

std::vector<const nn::MoeLayer*> GptModel::moe_layers() const {
  return gpt_ ? gpt_->moe_layers() : tp_gpt_->moe_layers();
}

Tensor GptModel::logits(const Tensor& idx) const {
  if (gpt_) return (*gpt_)(idx.to(device_));
  return tp_gpt_->full_logits(idx.to(device_));
}

void GptModel::load(const io::GptParams& params) {
  io::GptParams mine = params;
  if (ep_ && ep_->size() > 1) {  // this rank holds only its experts: the others' are not its
    mine.clear();
    for (auto& [name, p] : module().named_parameters())
      if (auto it = params.find(name); it != params.end()) mine.insert(*it);
  }
  if (gpt_) {
    gpt_->load_state_dict(mine);
    return;
  }
  parallel::load_full_state(*tp_gpt_, mine);
}

io::GptParams GptModel::full_params() const {
  io::GptParams out;
  if (gpt_) {
    for (auto& [name, t] : gpt_->named_parameters()) out[name] = t.detach().to(DType::kF32);
  } else {
    for (auto& [name, t] : parallel::gather_full_state(*tp_gpt_, *tp_)) {
      Tensor v = t.to(DType::kF32);
      // wte's rows past the single-process padding exist only for tp (See TpGPT::wte_rows).
      out[name] = name == "wte.weight" ? v.narrow(0, 0, config_.padded_vocab).contiguous() : v;
    }
  }
  if (ep_ && ep_->size() > 1) gather_experts(out);
  return out;
}

// Each MoE block's experts are split over the ep group (rank r holds E / ep from r E / ep):
// every expert's tensors are broadcast from its holder, so every rank of the ep group (rank 0
// of the job among them) ends with all of them, under their single-process names.
void GptModel::gather_experts(io::GptParams& params) const {
  const nn::MoeOptions& moe = moe_options_;
  if (!moe.enabled()) return;
  const int64_t local = moe.experts / ep_->size();
  for (int64_t i = 0; i < config_.layers; ++i) {
    if (i % moe.every != 0) continue;
    const std::string block = "blocks." + std::to_string(i) + ".mlp.experts.";
    const std::string first = block + std::to_string(ep_->rank() * local) + ".";
    for (const char* w : {"fc.weight", "fc.bias", "proj.weight", "proj.bias"}) {
      const Shape shape = params.at(first + w).shape();
      for (int64_t e = 0; e < moe.experts; ++e) {
        const std::string name = block + std::to_string(e) + "." + w;
        Tensor t =
            params.count(name) ? params.at(name).contiguous() : Tensor::zeros(shape, DType::kF32);
        ep_->broadcast(t, comm::BroadcastOptions{int(e / local)})->wait();
        params[name] = t;
      }
    }
  }
}

}  // namespace loom::gpt
