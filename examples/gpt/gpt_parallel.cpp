#include "gpt/gpt_parallel.h"

#include <cmath>

#include "core/autograd.h"
#include "core/nn/dropout.h"
#include "core/nn/moe.h"
#include "core/ops.h"
#include "optimizer/clip_grad.h"
#include "optimizer/mixed_precision.h"
#include "parallel/checkpoint/training_state.h"
#include "parallel/expert_parallel.h"
#include "parallel/tensor_parallel/tp_grad_norm.h"

namespace loom::gpt {

int64_t counted_targets(const Tensor& targets) {
  int64_t n = 0;
  for (int64_t t : targets.to(DType::kI64).to_vector<int64_t>())
    n += t != CrossEntropyOptions{}.ignore_index;
  return n;
}

std::function<bool(bool)> any_rank_of(std::shared_ptr<comm::Communicator> group) {
  return [group = std::move(group)](bool found) {
    Tensor flag = Tensor::full({1}, found ? 1.0 : 0.0, DType::kF32);
    group->allreduce_sync(flag, comm::ReduceOp::kMax);
    return flag.item() > 0;
  };
}

optim::LossScalerOptions f16_scaling(const GptOptions& o) {
  optim::LossScalerOptions s;
  s.init_scale = o.loss_scale;
  return s;
}

parallel::ZeroOptions zero_options(const GptOptions& o, const GptModel& model) {
  parallel::ZeroOptions z;
  z.stage = int(o.zero);
  z.bucket_mb = o.bucket_mb;
  z.grad_accum = int(o.grad_accum);
  z.overlap = !o.no_overlap;
  z.tp = model.tp();
  if (o.dtype == "f16") z.loss_scaling = f16_scaling(o);
  if (model.ep_group()) {  // each rank's experts: reduced over, and sharded over, their replicas
    z.own_parameters = parallel::is_expert_parameter;
    z.own_replicas = model.expert_replicas();
    z.own_unit = parallel::expert_layer_of;  // ZeRO-3 gathers them around their MoE layer
  }
  return z;
}

DataParallelStep::DataParallelStep(GptModel& model, const GptOptions& o,
                                   const parallel::DeviceMesh& mesh,
                                   const parallel::OptimizerFactory& make_optimizer)
    : model_(model), o_(o), dp_(mesh.dp_ptr()), dp_rank_(mesh.coords().dp) {
  nn::Module& module = model.module();
  if (o.zero > 0) {
    std::shared_ptr<comm::Communicator> shard_group = dp_;
    parallel::ZeroOptions z = zero_options(o, model);
    if (o.zero_shard_group != "all") {  // hybrid sharding: a node's dp ranks, or N consecutive
      const parallel::HybridGroups h = parallel::hybrid_groups(
          dp_, o.zero_shard_group == "node" ? 0 : std::stoi(o.zero_shard_group),
          "loom-gpt: --zero-shard-group " + o.zero_shard_group);
      shard_group = h.shards;
      z.replicas = h.replicas;
    }
    auto zero = std::make_unique<parallel::ZeroOptimizer>(module, shard_group, z, make_optimizer);
    zero_ = zero.get();
    opt_ = std::move(zero);
  } else {
    if (o.dp > 1) {
      parallel::DdpOptions d;
      d.bucket_mb = o.bucket_mb;
      d.grad_accum = int(o.grad_accum);
      d.overlap = !o.no_overlap;
      if (model.ep_group()) {  // each rank's experts: reduced over their replicas by finish()
        d.own_parameters = parallel::is_expert_parameter;
        d.own_replicas = model.expert_replicas();
      }
      ddp_ = std::make_unique<parallel::DistributedDataParallel>(module, dp_, d);
    }
    const DType dtype = module.parameters().at(0).dtype();
    if (optim::is_low_precision(dtype)) {
      LOOM_CHECK(model.tp() == nullptr || o.grad_clip == 0, "loom-gpt: --dtype ", o.dtype,
                 " with --tp and gradient clipping needs --zero "
                 "1, 2 or 3 for now (the plain mixed-precision optimizer clips without tp)");
      auto mp = std::make_unique<optim::MixedPrecisionOptimizer>(
          module.parameters(), make_optimizer,
          dtype == DType::kF16 ? optim::LossScaler(f16_scaling(o)) : optim::LossScaler::none());
      mixed_ = mp.get();
      if (model.ep_group() && o.dp > 1) {
        // Each rank's own experts' gradients are summed over their replicas only: an inf there
        // is not every rank's, so the ranks agree on the skip (the largest flag over dp).
        mp->set_skip_agreement(any_rank_of(dp_));
      }
      opt_ = std::move(mp);
    } else {
      opt_ = make_optimizer(module.parameters());
    }
  }
}

const optim::LossScaler* DataParallelStep::scaler() const {
  if (o_.dtype == "f32") return nullptr;
  if (zero_) return &zero_->scaler();
  return mixed_ ? &mixed_->scaler() : nullptr;
}

std::string DataParallelStep::str() const {
  std::string s = detail::str_cat("dp ", o_.dp);
  if (model_.tp())
    s += detail::str_cat(" x tp ", o_.tp, o_.sequence_parallel ? " (sequence parallel)" : "");
  if (zero_) s += detail::str_cat(", ZeRO-", o_.zero);
  if (zero_ && zero_->hybrid())
    s += detail::str_cat(" sharded over groups of ", zero_->shard_group_size(),
                         " dp ranks (--zero-shard-group ", o_.zero_shard_group,
                         "), replicated across them");
  if (o_.grad_accum > 1) s += detail::str_cat(", grad-accum ", o_.grad_accum);
  if (o_.grad_accum > 1 && o_.moe_experts > 0 && o_.moe_aux_loss > 0)
    s += " (MoE: a routing pass per step for the whole batch's load-balancing loss)";
  if (zero_ || ddp_) s += detail::str_cat(", buckets ", o_.bucket_mb, " MiB");
  if (scaler())
    s += detail::str_cat(", ", o_.dtype, " with f32 masters, loss scaling ", scaler()->str());
  return s;
}

parallel::TrainingMemory DataParallelStep::memory() const {
  if (zero_) return zero_->memory();
  parallel::TrainingMemory m;
  if (ddp_) {
    m = ddp_->memory();
  } else {
    for (const Tensor& p : model_.module().parameters()) m.parameters += p.nbytes();
    m.gradients = m.parameters;  // one gradient per parameter, made by backward
  }
  m.optimizer_state = opt_->state_bytes();
  return m;
}

StepResult DataParallelStep::run(const io::Batch& global, int64_t step, double lr) {
  const int64_t n = o_.dp, k_count = o_.grad_accum;
  const int64_t rows = o_.batch / n / k_count;
  const int64_t counted = counted_targets(global.targets);
  LOOM_CHECK(counted > 0, "loom-gpt: step ", step + 1, "'s batch has no targets to predict");
  nn::set_dropout_step(uint64_t(step));
  if (model_.ep_group()) parallel::take_expert_exchange_seconds();  // count this step's alone
  double loss_sum = 0;  // this rank's share of the global mean loss
  StepResult result;
  // Micro-batch k of dp rank r holds the batch's part k n + r: every rank's micro-batch k comes
  // before any rank's k + 1, the order in which MoE layers count capacity over a split batch
  // (See Note [A batch in micro-batches] in core/nn/moe.h).
  auto micro_batch = [&](int64_t k, Tensor& inputs, Tensor& targets) {
    const int64_t part = k * n + int64_t(dp_rank_);
    inputs = global.inputs.narrow(0, part * rows, rows).contiguous();
    targets = global.targets.narrow(0, part * rows, rows).contiguous();
    return part;
  };
  const bool moe = !model_.moe_layers().empty();
  if (moe && k_count > 1) {
    // The load-balancing loss is over the whole batch: a routing pass without gradients first.
    const bool record = o_.moe_aux_loss > 0;
    nn::moe_begin_batch(model_.module(), k_count, record);
    for (int64_t k = 0; record && k < k_count; ++k) {
      NoGradGuard no_grad;
      Tensor inputs, targets;
      nn::set_dropout_batch_part({micro_batch(k, inputs, targets), n * k_count});
      model_.loss(inputs, targets);
      nn::set_dropout_batch_part({});
    }
  }
  if (moe) result.moe_aux_loss = 0;
  for (int64_t k = 0; k < k_count; ++k) {
    Tensor inputs, targets;
    const int64_t part = micro_batch(k, inputs, targets);
    const int64_t mine = counted_targets(targets);
    LOOM_CHECK(mine > 0, "loom-gpt: micro-batch ", k + 1, " of dp rank ", dp_rank_,
               " has no targets to predict; use fewer ranks or micro-batches");
    // These rows are part k n + r of the step's batch: See Note [Dropout keys].
    nn::set_dropout_batch_part({part, n * k_count});
    Tensor loss = model_.loss(inputs, targets);
    nn::set_dropout_batch_part({});
    const std::vector<const nn::MoeLayer*> moes = model_.moe_layers();
    if (moes.empty()) {
      loss_sum += loss.item() * double(mine) / double(counted);
    } else {  // report the cross-entropy and the routing (summed over the micro-batches)
      loss_sum += model_.last_lm_loss() * double(mine) / double(counted);
      result.moe_aux_loss += loss.item() - model_.last_lm_loss();
      result.moe_load.resize(moes.front()->stats().load.size(), 0);
      for (const nn::MoeLayer* m : moes) {
        for (size_t e = 0; e < m->stats().load.size(); ++e)
          result.moe_load[e] += m->stats().load[e];
        result.moe_dropped += m->stats().dropped;
      }
    }
    // See Note [Loss weighting].
    const double weight = double(mine) * double(n) / double(counted);
    Tensor weighted = scale(loss, weight);
    if (moe) {
      // Each part's aux_loss() is its term of the whole batch's auxiliary losses (with expert
      // parallelism times the dp size, whose dp mean is the batch's): weighted 1, not `weight`
      // as the cross-entropy is.
      weighted = add(weighted, scale(model_.aux_loss(), 1.0 - weight));
    }
    if (zero_) {
      zero_->backward(weighted);  // applies the loss scale itself
    } else {
      if (mixed_) weighted = mixed_->scale_loss(weighted);
      if (ddp_)
        ddp_->backward(weighted);
      else
        weighted.backward();
    }
  }
  double wait_ms = -1;
  if (ddp_) {
    ddp_->finish();
    wait_ms = ddp_->exposed_wait_seconds() * 1e3;
  } else if (zero_) {
    zero_->finish_gradients();  // the experts' too (ZeroOptions::own_parameters)
    wait_ms = zero_->exposed_wait_seconds() * 1e3;
  }
  if (wait_ms >= 0) {
    Tensor least = Tensor::full({1}, wait_ms, DType::kF32);
    dp_->allreduce_sync(least, comm::ReduceOp::kMin);
    result.comm_wait_least_ms = least.item();
  }
  if (model_.ep_group()) {
    result.moe_exchange_ms = parallel::take_expert_exchange_seconds() * 1e3;
    Tensor aux = Tensor::full({1}, result.moe_aux_loss, DType::kF32);
    dp_->allreduce_sync(aux, comm::ReduceOp::kAvg);  // the mean of the ranks' terms
    result.moe_aux_loss = aux.item();
  }
  double norm = -1;
  // (ZeRO's clip counts each expert once itself, See ZeroOptions::own_parameters.)
  if (o_.grad_clip > 0 && model_.ep_group() && !zero_) {
    // The global norm: the replicated parameters' squares once, each expert's once (summed over
    // the ep group, which holds every expert once).
    // With tp, the shared parameters' squares are tp's (shards summed over tp, whole ones
    // once); the experts are whole over tp, so their local squares come out of it.
    // With --expert-tp their slices' squares add over tp too (the tp sum counts each once).
    // bf16/f16: the norm of the unscaled f32 gradients of the masters (which follow the
    // parameters' order), clipped there (mixed precision with tp and a clip is refused above).
    if (mixed_) mixed_->unscale_gradients();
    const std::vector<Tensor> clipped = mixed_ ? mixed_->masters() : model_.module().parameters();
    std::vector<Tensor> shared, own;
    size_t at = 0;
    for (auto& [name, p] : model_.module().named_parameters())
      (parallel::is_expert_parameter(name) ? own : shared).push_back(clipped.at(at++));
    const auto not_expert = [](const std::string& n) { return !parallel::is_expert_parameter(n); };
    const double mine = model_.tp()
                            ? parallel::tp_grad_sum_of_squares(model_.module(), *model_.tp(),
                                                               parallel::is_expert_parameter)
                            : optim::grad_sum_of_squares(own);
    Tensor expert_squares = Tensor::full({1}, mine, DType::kF32);
    model_.ep_group()->allreduce(expert_squares)->wait();
    const double shared_squares =
        model_.tp() ? parallel::tp_grad_sum_of_squares(model_.module(), *model_.tp(), not_expert)
                    : optim::grad_sum_of_squares(shared);
    norm = std::sqrt(shared_squares + expert_squares.item());
    optim::scale_grads_to_norm(clipped, norm, o_.grad_clip);
  } else if (o_.grad_clip > 0)
    norm = zero_         ? zero_->clip_grad_norm(o_.grad_clip)
           : mixed_      ? mixed_->clip_grad_norm(o_.grad_clip)
           : model_.tp() ? parallel::tp_clip_grad_norm(model_.module(), o_.grad_clip, *model_.tp())
                         : optim::clip_grad_norm(model_.module().parameters(), o_.grad_clip);
  opt_->set_lr(lr);
  opt_->step();
  opt_->zero_grad();
  Tensor total = Tensor::full({1}, loss_sum, DType::kF32);
  dp_->allreduce(total)->wait();  // the ranks of a tp group hold the same loss: sum over dp
  const optim::LossScaler* s = scaler();
  result.loss = total.item();
  result.grad_norm = norm;
  result.comm_wait_ms = wait_ms;
  result.skipped = s && s->last_step_skipped();
  return result;
}

io::GptParams DataParallelStep::full_params() {
  gather_parameters();  // ZeRO-3
  return model_.full_params();
}

}  // namespace loom::gpt

namespace loom::gpt {

std::vector<parallel::checkpoint::StatePiece> Trainer::checkpoint_pieces(nlohmann::json&) const {
  LOOM_FAIL("loom-gpt: checkpoints of this trainer are not wired yet");
}

parallel::checkpoint::LoadStats Trainer::load_checkpoint(const std::string&,
                                                         const io::CheckpointManifest&,
                                                         comm::Communicator&) {
  LOOM_FAIL("loom-gpt: checkpoints of this trainer are not wired yet");
}

std::vector<parallel::checkpoint::StatePiece> DataParallelStep::checkpoint_pieces(
    nlohmann::json& state) const {
  return parallel::checkpoint::TrainingState(model_.module(), *opt_).save_pieces(state);
}

parallel::checkpoint::LoadStats DataParallelStep::load_checkpoint(
    const std::string& path, const io::CheckpointManifest& manifest, comm::Communicator& world) {
  return parallel::checkpoint::TrainingState(model_.module(), *opt_).load(path, manifest, world);
}

}  // namespace loom::gpt
