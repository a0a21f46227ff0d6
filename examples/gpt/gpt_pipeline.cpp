#include "gpt/gpt_pipeline.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "core/nn/dropout.h"
#include "core/nn/moe.h"
#include "core/ops.h"
#include "optimizer/clip_grad.h"
#include "parallel/checkpoint/training_state.h"
#include "parallel/expert_parallel.h"
#include "parallel/pipeline/generators.h"
#include "parallel/pipeline/validator.h"
#include "parallel/tensor_parallel/tp_state.h"

namespace loom::gpt {

using parallel::pipeline::GptStage;
using parallel::pipeline::GradientSum;
using parallel::pipeline::StageChunk;

namespace {

// Whether this copy of a parameter is the one the gradient norm counts: pipeline 0's (Chimera's
// second pipeline holds replicas), and of wte the first stage's (the last holds a tied copy).
bool counted_once(const parallel::pipeline::ChunkPlace& place, const std::string& name) {
  return place.pipeline == 0 && (name != "wte.weight" || place.stage == 0);
}

// The stage of pipeline 0 that owns a single-process parameter (wte: the first stage's copy).
int owner_stage(const std::string& name, const GptConfig& c, int stages) {
  if (name.rfind("blocks.", 0) == 0) {
    const int64_t block = std::stoll(name.substr(7));
    for (int s = 0; s < stages; ++s) {
      const auto [first, count] = parallel::pipeline::stage_layers(c, s, stages);
      if (block >= first && block < first + count) return s;
    }
  }
  return name.rfind("ln_f.", 0) == 0 ? stages - 1 : 0;
}

}  // namespace

parallel::pipeline::Schedule schedule_from(const GptOptions& o) {
  parallel::pipeline::Schedule s =
      o.schedule_file.empty()
          ? parallel::pipeline::make_schedule(o.schedule, int(o.pp), int(o.microbatches),
                                              int(o.virtual_stages))
          : parallel::pipeline::read_schedule_file(o.schedule_file);
  LOOM_CHECK(s.ranks == o.pp, "loom-gpt: the schedule has ", s.ranks, " ranks but --pp is ", o.pp);
  LOOM_CHECK(o.layers >= s.stages, "loom-gpt: --layers ", o.layers, " cannot be split into the ",
             s.stages, " stages of schedule '", s.name, "' (each stage needs a block)");
  return s;
}

void check_pipeline_options(const GptOptions& o) {
  LOOM_CHECK(
      o.grad_accum == 1,
      "loom-gpt: --pp does not combine with --grad-accum: its micro-batches (--microbatches) "
      "accumulate the gradients");
}

std::vector<std::shared_ptr<GptStage>> make_stages(const GptConfig& config, const GptOptions& o,
                                                   const parallel::pipeline::Schedule& schedule,
                                                   int pp_rank,
                                                   std::shared_ptr<comm::Communicator> tp,
                                                   const nn::MoeFactory& make_moe) {
  std::vector<std::shared_ptr<GptStage>> stages;
  for (const auto& place : schedule.chunks.at(size_t(pp_rank))) {
    stages.push_back(std::make_shared<GptStage>(config, place.stage, schedule.stages, o.dropout, tp,
                                                o.sequence_parallel, o.moe(), make_moe));
    stages.back()->set_checkpointing(o.checkpoint_activations);
  }
  return stages;
}

parallel::ZeroOptions pipeline_zero_options(const GptOptions& o) {
  parallel::ZeroOptions z;
  z.stage = int(o.zero);
  z.bucket_mb = o.bucket_mb;
  z.external_backward = true;
  if (z.stage >= 2) {
    // See Note [ZeRO-2 in a pipeline]: each chunk's gradients reduce-scattered as its backwards
    // produce them, except the tied wte's copies, summed at the step's end (and at stage 3 the
    // rest of its chunk's unit), and the experts, which are not bucketed. Stage 3 shards the
    // parameters too, each chunk's blocks and the rest of it gathered around their forward and
    // backward (See zero3_layout_by_child). Chimera's replicas sum their shards (chunk_sums).
    z.chunk_of = [](const std::string& name) {
      // A StageSet's parameter: "chunk{k}.<single-process name>".
      const size_t dot = name.find('.');
      if (name.compare(dot + 1, std::string::npos, "wte.weight") == 0) return -1;
      return std::stoi(name.substr(5, dot - 5));
    };
  }

  return z;
}

PipelineStep::PipelineStep(const GptConfig& config, const GptOptions& o,
                           const parallel::DeviceMesh& mesh, parallel::pipeline::Schedule schedule,
                           const parallel::OptimizerFactory& make_optimizer,
                           const io::GptParams* init)
    : config_(config),
      o_(o),
      pp_(mesh.pp_ptr()),
      dp_(mesh.dp_ptr()),
      dp_rank_(mesh.coords().dp),
      schedule_(std::move(schedule)),
      dtype_(parse_dtype(o.dtype)),
      writes_output_(mesh.world().rank() == 0) {
  check_pipeline_options(o);
  if (o.tp > 1 || o.sequence_parallel) tp_ = mesh.tp_ptr();
  const int64_t per_dp = o.batch / o.dp;
  LOOM_CHECK(per_dp % schedule_.microbatches == 0, "loom-gpt: --batch ", o.batch, " over --dp ",
             o.dp, " leaves ", per_dp, " rows per data-parallel rank, which do not divide into ",
             schedule_.microbatches, " micro-batches");
  const int rank = pp_->rank();
  const auto pairs = parallel::pipeline::replica_pairs(schedule_, *pp_);
  if (o.moe_experts > 0) {
    // Each MoE layer counts its micro-batches in order, over the whole batch. Chimera's two
    // pipelines split them between two replicas of each layer, whose routing-pass counts are
    // added up (add_replica_counts).
    experts_ = expert_groups(o, dp_, mesh.tp_ptr());
  }
  replica_pairs_ = pairs;
  std::vector<StageChunk> chunks;
  stages_ = make_stages(config, o, schedule_, rank, tp_, experts_.make_moe);
  if (init)
    load(*init);
  else
    for (auto& s : stages_) s->init_parameters(o.seed);
  for (auto& s : stages_)
    if (dtype_ != DType::kF32) s->to(dtype_);  // initialised in f32, then rounded
  // The stages in one module (each keeping its own names, so initialisation and dropout are the
  // single-process ones): what ZeRO and checkpoints see.
  for (const auto& stage : stages_) stage_set_->add(stage);
  build_optimizer(mesh, make_optimizer);
  for (const auto& stage : stages_) {
    // ZeRO reduces over dp itself (the experts over their replicas too, ZeroOptions::own_*);
    // at stages 2 and 3 Chimera's pairs sum the shards of what it reduced as it came.
    std::function<bool(const std::string&)> summed_at_sync;
    if (o.zero >= 2)
      summed_at_sync = [this, prefix = "chunk" + std::to_string(chunks.size()) +
                                       "."](const std::string& name) {
        return zero_->reduced_at_step_end(prefix + name);
      };
    StageChunk chunk = parallel::pipeline::stage_chunk(stage, pairs[size_t(stage->stage())],
                                                       o.zero == 0 ? dp_ : nullptr,
                                                       experts_.replicas, summed_at_sync);
    if (o.zero >= 2)  // See Note [ZeRO-2 in a pipeline]
      chunk.after_backward = [this, c = chunks.size()](int) { zero_->reduce_chunk(int(c)); };
    if (chunk.extra_loss)  // MoE: the routing's figures of each forward of the step
      chunk.extra_loss = [this, raw = stage.get(), loss = chunk.extra_loss] {
        record_moe_stats(*raw);
        return loss();
      };
    chunks.push_back(std::move(chunk));
  }
  embedding_ = parallel::pipeline::embedding_group(schedule_, *pp_);
  if (o.sequence_parallel)
    LOOM_CHECK(o.seq % o.tp == 0, "loom-gpt: --seq ", o.seq, " must divide by --tp ", o.tp,
               " for --sequence-parallel");
  executor_ = std::make_unique<parallel::pipeline::PipelineExecutor>(
      schedule_, pp_, std::move(chunks),
      stages_.front()->activation_shape(per_dp / schedule_.microbatches, o.seq), dtype_);
}

void PipelineStep::build_optimizer(const parallel::DeviceMesh& mesh,
                                   const parallel::OptimizerFactory& make_optimizer) {
  const GptOptions& o = o_;
  if (o.zero == 0) {
    std::vector<Tensor> params;
    for (const auto& stage : stages_)
      for (const Tensor& p : stage->parameters()) params.push_back(p);
    if (dtype_ == DType::kF32) {
      opt_ = make_optimizer(params);
      return;
    }
    auto mp = std::make_unique<optim::MixedPrecisionOptimizer>(
        params, make_optimizer,
        dtype_ == DType::kF16 ? optim::LossScaler(f16_scaling(o)) : optim::LossScaler::none());
    // A non-finite gradient skips the step; each rank sees only its stages' (and tp shards' and
    // experts') gradients, so every rank of the job agrees on the skip, as one process skips.
    mp->set_skip_agreement(any_rank_of(mesh.world_ptr()));
    mixed_ = mp.get();
    opt_ = std::move(mp);
    return;
  }
  // ZeRO over dp, gradients taken from the executor's backwards (stages 2 and 3: as they come,
  // See the constructor's after_backward).
  parallel::ZeroOptions z = pipeline_zero_options(o);
  if (z.chunk_of)  // Chimera: each replicated stage's shards summed over its pair, in stage order
    for (int stage = 0; stage < schedule_.stages; ++stage)
      for (size_t c = 0; c < stages_.size(); ++c)
        if (stages_[c]->stage() == stage && replica_pairs_[size_t(stage)])
          z.chunk_sums.emplace_back(int(c), replica_pairs_[size_t(stage)]);
  if (dtype_ == DType::kF16) z.loss_scaling = f16_scaling(o);
  z.tp = tp_;
  z.pp = pp_;
  z.counted_in_norm = one_copy();
  if (experts_.replicas) {  // each rank's experts: reduced over, and sharded over, their replicas
    z.own_parameters = parallel::is_expert_parameter;
    z.own_replicas = experts_.replicas;
  }
  std::shared_ptr<comm::Communicator> shard_group = dp_;
  if (o.zero_shard_group != "all") {  // hybrid sharding, as DataParallelStep's
    const parallel::HybridGroups h = parallel::hybrid_groups(
        dp_, o.zero_shard_group == "node" ? 0 : std::stoi(o.zero_shard_group),
        "loom-gpt: --zero-shard-group " + o.zero_shard_group);
    shard_group = h.shards;
    z.replicas = h.replicas;
  }
  auto zero =
      std::make_unique<parallel::ZeroOptimizer>(*stage_set_, shard_group, z, make_optimizer);
  zero_ = zero.get();
  opt_ = std::move(zero);
}

void PipelineStep::load(const io::GptParams& params) {
  for (auto& s : stages_) {
    io::GptParams mine;  // the stage's own parameters out of the whole model's
    for (const auto& [name, p] : s->named_parameters()) {
      auto it = params.find(name);
      LOOM_CHECK(it != params.end(), "loom-gpt: the weights have no '", name, "'");
      mine.emplace(name, it->second);
    }
    if (tp_)
      parallel::load_full_state(*s, mine);
    else
      s->load_state_dict(mine);
  }
}

std::string PipelineStep::str() const {
  return detail::str_cat(
      "dp ", o_.dp, tp_ ? detail::str_cat(" x tp ", o_.tp) : std::string(),
      zero_ ? detail::str_cat(" (ZeRO-", zero_->stage(), ")") : std::string(),
      zero_ && zero_->hybrid()
          ? detail::str_cat(" sharded over groups of ", zero_->shard_group_size(),
                            " dp ranks (--zero-shard-group ", o_.zero_shard_group,
                            "), replicated across them")
          : std::string(),
      " x pp ", schedule_.ranks, ", schedule ", schedule_.name, ", ", schedule_.microbatches,
      " micro-batches", o_.sequence_parallel ? ", sequence parallel" : "",
      scaler()
          ? detail::str_cat(", ", o_.dtype, " with f32 masters, loss scaling ", scaler()->str())
          : std::string());
}

std::function<bool(const std::string&)> PipelineStep::one_copy() const {
  std::set<std::string> counted;  // StageSet names: "chunk{k}.<name>"
  for (size_t k = 0; k < stages_.size(); ++k) {
    const auto& place = schedule_.chunks[size_t(pp_->rank())][k];
    for (const auto& [name, p] : stages_[k]->named_parameters())
      if (counted_once(place, name)) counted.insert("chunk" + std::to_string(k) + "." + name);
  }
  return [counted](const std::string& name) { return counted.count(name) > 0; };
}

parallel::TrainingMemory PipelineStep::memory() const {
  if (zero_) return zero_->memory();
  parallel::TrainingMemory m;
  for (const auto& s : stages_)
    for (const Tensor& p : s->parameters()) m.parameters += p.nbytes();
  m.gradients = m.parameters;
  m.optimizer_state = opt_->state_bytes();
  return m;
}

// The global norm over the whole model: each single-process parameter counted once (pipeline
// 0's copy; wte on the first stage), the squares summed over pp; dp replicas agree already.
double PipelineStep::clip(double max_norm) {
  // With tp, a sharded parameter's squares add over tp too; a whole one's count once.
  // With expert parallelism each rank holds its experts: their squares add over ep (whole over
  // tp, they count once there).
  // (--expert-tp: their slices' squares add over tp first).
  // bf16: the norm of the f32 gradients the masters hold (MixedPrecisionOptimizer::
  // clip_grad_norm's), not of the bf16 ones; the masters' gradients are the ones clipped.
  // (The masters are in the stages' parameter order, which named_parameters() walks too.)
  if (mixed_) mixed_->unscale_gradients();
  size_t index = 0;
  std::vector<Tensor> sharded, whole, expert_sharded, expert_whole, all;
  for (size_t c = 0; c < stages_.size(); ++c) {
    const auto& place = schedule_.chunks[size_t(pp_->rank())][c];
    for (const auto& [name, param] : stages_[c]->named_parameters()) {
      const Tensor& p = mixed_ ? mixed_->masters()[index++] : param;
      all.push_back(p);
      if (!counted_once(place, name)) continue;
      const bool shard = tp_ && stages_[c]->parameter_shard(name);
      if (experts_.ep && parallel::is_expert_parameter(name))
        (shard ? expert_sharded : expert_whole).push_back(p);
      else
        (shard ? sharded : whole).push_back(p);
    }
  }
  Tensor tp_part =
      Tensor::from_vector(std::vector<float>{float(optim::grad_sum_of_squares(sharded)),
                                             float(optim::grad_sum_of_squares(expert_sharded))},
                          {2});
  if (tp_) tp_->allreduce(tp_part)->wait();
  const std::vector<float> tp_sums = tp_part.to_vector<float>();
  Tensor ep_part =
      Tensor::full({1}, tp_sums[1] + optim::grad_sum_of_squares(expert_whole), DType::kF32);
  if (experts_.ep) experts_.ep->allreduce(ep_part)->wait();
  Tensor sq = Tensor::full({1}, tp_sums[0] + ep_part.item() + optim::grad_sum_of_squares(whole),
                           DType::kF32);
  pp_->allreduce(sq)->wait();
  const double norm = std::sqrt(sq.item());
  optim::scale_grads_to_norm(all, norm, max_norm);
  return norm;
}

StepResult PipelineStep::run(const io::Batch& global, int64_t step, double lr) {
  const int m = schedule_.microbatches;
  const int64_t per_dp = o_.batch / o_.dp, rows = per_dp / m;
  const int64_t counted = counted_targets(global.targets);
  LOOM_CHECK(counted > 0, "loom-gpt: step ", step + 1, "'s batch has no targets to predict");
  nn::set_dropout_step(uint64_t(step));
  std::vector<Tensor> tokens, targets;
  std::vector<double> weights;
  // Micro-batch k of dp rank r is part k dp + r of the step's batch: every rank's micro-batch k
  // comes before any rank's k + 1, as DataParallelStep's (See Note [A batch in micro-batches]).
  for (int k = 0; k < m; ++k) {
    const int64_t first = (int64_t(k) * o_.dp + dp_rank_) * rows;
    tokens.push_back(global.inputs.narrow(0, first, rows).contiguous());
    targets.push_back(global.targets.narrow(0, first, rows).contiguous());
    // See Note [Loss weighting]: the dp average then gives the gradient of the global mean.
    weights.push_back(double(counted_targets(targets.back())) * double(o_.dp) / double(counted));
  }
  executor_->set_before_forward([this, m](int k) {
    nn::set_dropout_batch_part({int64_t(k) * o_.dp + dp_rank_, int64_t(o_.dp) * m});
  });
  StepResult result{0, -1, -1, false};
  const bool moe = o_.moe_experts > 0;
  if (moe) {
    moe_aux_ = 0;
    moe_load_.assign(size_t(o_.moe_experts), 0);
    moe_dropped_ = 0;
    // The load-balancing loss is over the whole batch: a routing pass through the pipeline
    // without gradients first (See Note [A batch in micro-batches] in core/nn/moe.h).
    // Chimera with capacity needs the pass for each part's place in the experts' queues too,
    // through pipeline 0 alone (See plan_replicas_from_pipeline0).
    const bool one_route = schedule_.pipelines > 1 && o_.moe_capacity_factor > 0;
    const bool record = o_.moe_aux_loss > 0 || one_route;
    for (size_t c = 0; c < stages_.size(); ++c) {  // each chunk sees its pipeline's micro-batches
      const int pipeline = schedule_.chunks[size_t(pp_->rank())][c].pipeline;
      const auto seen =
          int64_t(std::count(schedule_.pipeline_of.begin(), schedule_.pipeline_of.end(), pipeline));
      if (one_route)  // pipeline 0 records every part; the others are planned from it
        nn::moe_begin_batch(*stages_[c], m, pipeline == 0, pipeline == 0 ? 0 : seen);
      else
        nn::moe_begin_batch(*stages_[c], m, record, schedule_.pipelines > 1 ? seen : 0);
    }
    if (one_route) {
      executor_->forward_only(tokens, /*through_pipeline=*/0);
      plan_replicas_from_pipeline0();
    } else if (record) {
      executor_->forward_only(tokens);
      if (schedule_.pipelines > 1) add_replica_counts();
    }
  }
  // f16: every micro-batch backpropagates its loss times the scale; the optimizer divides it out
  // of the f32 gradients and skips the step, backing off, when any rank's overflowed.
  executor_->set_loss_scale(scaler() ? scaler()->scale() : 1.0);
  if (zero_ && o_.zero == 1) zero_->accumulate_in_buckets();  // the gradients held once
  const double local = executor_->run(tokens, targets, weights);
  nn::set_dropout_batch_part({});
  if (moe) {
    // The stages' figures add over pp. Each rank's auxiliary term is (with expert parallelism)
    // its share times dp, whose dp mean is the batch's; the loads are its dp group's already.
    Tensor aux = Tensor::full({1}, moe_aux_, DType::kF32);
    pp_->allreduce(aux)->wait();
    if (experts_.ep) dp_->allreduce(aux, {comm::ReduceOp::kAvg})->wait();
    std::vector<int64_t> counts = moe_load_;
    counts.push_back(moe_dropped_);
    Tensor c = Tensor::from_vector(counts, {int64_t(counts.size())});
    pp_->allreduce(c)->wait();
    counts = c.to_vector<int64_t>();
    result.moe_aux_loss = aux.item();
    result.moe_dropped = counts.back();
    result.moe_load.assign(counts.begin(), counts.end() - 1);
  }
  last_step_ = parallel::pipeline::gather_timelines(executor_->timeline(), *pp_);
  if (!o_.trace.empty() && writes_output_) trace_.add_step(step + 1, last_step_);
  std::vector<GptStage*> mine;
  for (auto& s : stages_) mine.push_back(s.get());
  parallel::pipeline::sync_tied_embedding(mine, embedding_.get());
  // wte's summed gradient is the dp replica's; the dp average covers it too (ZeRO: its own).
  if (dp_->size() > 1 && !zero_)
    for (GptStage* s : mine)
      if (s->wte) {
        Tensor g = s->wte_weight().grad();
        dp_->allreduce(g, {comm::ReduceOp::kAvg})->wait();
      }
  const double norm = o_.grad_clip <= 0 ? -1
                      : zero_           ? zero_->clip_grad_norm(o_.grad_clip)
                                        : clip(o_.grad_clip);
  opt_->set_lr(lr);
  opt_->step();
  opt_->zero_grad();
  Tensor total = Tensor::full({1}, executor_->mean_loss(local) / double(o_.dp), DType::kF32);
  dp_->allreduce(total)->wait();
  result.loss = total.item();
  result.grad_norm = norm;
  result.skipped = scaler() && scaler()->last_step_skipped();
  return result;
}

const optim::LossScaler* PipelineStep::scaler() const {
  if (dtype_ == DType::kF32) return nullptr;
  if (zero_) return &zero_->scaler();
  return mixed_ ? &mixed_->scaler() : nullptr;
}

// Chimera: each MoE layer's two replicas (one per pipeline) recorded the routing of their
// pipeline's micro-batches; the whole batch's counts are their sum over the replica pair.
void PipelineStep::add_replica_counts() {
  for_each_replica_pair([this](size_t chunk, comm::Communicator& pair) {
    for (nn::MoeLayer* layer : stages_[chunk]->moe_layers()) {
      const std::vector<int64_t> mine = layer->recorded_batch();
      Tensor t = Tensor::from_vector(mine, {int64_t(mine.size())});
      pair.allreduce(t)->wait();
      layer->set_recorded_batch(t.to_vector<int64_t>());
    }
  });
}

void PipelineStep::for_each_replica_pair(
    const std::function<void(size_t chunk, comm::Communicator& pair)>& fn) {
  // In stage order, so the two ranks of every pair meet in the same order (each holds its two
  // replicas in other chunk orders).
  for (int stage = 0; stage < schedule_.stages; ++stage) {
    const std::shared_ptr<comm::Communicator>& pair = replica_pairs_[size_t(stage)];
    const auto it = std::find_if(stages_.begin(), stages_.end(),
                                 [stage](const auto& s) { return s->stage() == stage; });
    if (pair && it != stages_.end()) fn(size_t(it - stages_.begin()), *pair);
  }
}

// Chimera with capacity: a micro-batch's place in each expert's queue counts every earlier
// micro-batch of the step, whichever pipeline forwards it, and in the routing pass an upstream
// MoE layer's drops shape what the layers after it route. So the routing pass ran every
// micro-batch through pipeline 0 (PipelineExecutor::forward_only's through_pipeline): each of
// its MoE layers saw the whole batch in order and dropped what one process's drops. Each layer's
// pipeline-0 replica now hands its pair the per-micro-batch counts and the batch's totals, and
// both replicas plan their real pass from them: their own micro-batches' places, in order.
void PipelineStep::plan_replicas_from_pipeline0() {
  const int64_t m = schedule_.microbatches, experts = o_.moe_experts;
  for_each_replica_pair([&](size_t chunk, comm::Communicator& pair) {
    const int pipeline = schedule_.chunks[size_t(pp_->rank())][chunk].pipeline;
    std::vector<int64_t> mine;  // the micro-batches this replica forwards, in order
    for (int64_t k = 0; k < m; ++k)
      if (schedule_.pipeline_of[size_t(k)] == pipeline) mine.push_back(k);
    for (nn::MoeLayer* layer : stages_[chunk]->moe_layers()) {
      // [micro-batch k's counts per expert for every k, then the batch's counts and tokens]:
      // pipeline 0's replica fills it, the other adds zeros.
      std::vector<int64_t> table(size_t(m * experts + experts + 1), 0);
      if (pipeline == 0) {
        const std::vector<std::vector<int64_t>>& parts = layer->recorded_parts();
        LOOM_ASSERT(int64_t(parts.size()) == m, parts.size(), " parts recorded of ", m);
        for (int64_t k = 0; k < m; ++k)
          std::copy(parts[size_t(k)].begin(), parts[size_t(k)].end(), table.begin() + k * experts);
        const std::vector<int64_t> whole = layer->recorded_batch();
        std::copy(whole.begin(), whole.end(), table.begin() + m * experts);
      }
      Tensor t = Tensor::from_vector(table, {int64_t(table.size())});
      pair.allreduce(t)->wait();
      table = t.to_vector<int64_t>();
      std::vector<std::vector<int64_t>> places;
      for (int64_t k : mine) {
        std::vector<int64_t> before(size_t(experts), 0);
        for (int64_t j = 0; j < k; ++j)
          for (int64_t e = 0; e < experts; ++e) before[size_t(e)] += table[size_t(j * experts + e)];
        places.push_back(std::move(before));
      }
      layer->plan_batch(m, std::vector<int64_t>(table.begin() + m * experts, table.end()),
                        std::move(places));
    }
  });
}

void PipelineStep::record_moe_stats(const GptStage& stage) {
  for (const nn::MoeLayer* m : stage.moe_layers()) {
    moe_aux_ += m->stats().aux_loss + m->stats().z_loss;
    for (size_t e = 0; e < m->stats().load.size(); ++e) moe_load_[e] += m->stats().load[e];
    moe_dropped_ += m->stats().dropped;
  }
}

io::GptParams PipelineStep::full_params() {
  nn::GptOptions shape;
  shape.moe = o_.moe();
  nn::GPT layout(config_, shape);         // names and shapes, in the single-process order
  std::map<std::string, Tensor> mine;     // whole parameters (gathered over tp)
  if (zero_) zero_->gather_parameters();  // ZeRO-3: whole until the next forward
  for (size_t c = 0; c < stages_.size(); ++c) {
    nn::StateDict whole =
        tp_ ? parallel::gather_full_state(*stages_[c], *tp_) : stages_[c]->state_dict();
    for (auto& [name, t] : whole)
      mine.emplace(name, name == "wte.weight" ? t.narrow(0, 0, config_.padded_vocab) : t);
  }
  if (experts_.ep && experts_.ep->size() > 1) gather_experts(mine, layout);
  io::GptParams out;
  for (const auto& [name, shape_of] : layout.named_parameters()) {
    const int owner = schedule_.holder(0, owner_stage(name, config_, schedule_.stages)).first;
    Tensor t = pp_->rank() == owner ? mine.at(name).detach().contiguous().clone()
                                    : Tensor::empty(shape_of.shape(), dtype_);
    pp_->broadcast(t, {owner})->wait();
    out[name] = t;
  }
  return out;
}

void PipelineStep::gather_experts(std::map<std::string, Tensor>& mine,
                                  const nn::GPT& layout) const {
  // Expert e of a block is held by ep rank e / (experts / ep) of the stage's dp replica; every
  // ep rank holds the same stages, so each takes part in the same broadcasts.
  const int64_t local = o_.moe_experts / experts_.ep->size();
  const std::string marker = ".mlp.experts.";
  for (const auto& [name, shape_of] : layout.named_parameters()) {
    const size_t at = name.find(marker);
    if (at == std::string::npos) continue;
    const int stage = owner_stage(name, config_, schedule_.stages);
    if (schedule_.holder(0, stage).first != pp_->rank()) continue;
    const int64_t e = std::stoll(name.substr(at + marker.size()));
    auto it = mine.find(name);
    Tensor t = it != mine.end() ? it->second.detach().contiguous().clone()
                                : Tensor::empty(shape_of.shape(), dtype_);
    experts_.ep->broadcast(t, {int(e / local)})->wait();
    mine[name] = t;
  }
}

void PipelineStep::finish() {
  if (!writes_output_ || last_step_.empty()) return;
  const std::vector<double> measured = parallel::pipeline::measured_bubbles(last_step_);
  const parallel::pipeline::Simulation predicted = parallel::pipeline::validate(schedule_);
  std::printf("pipeline bubble of the last step, measured (validator, unit costs):");
  for (size_t r = 0; r < measured.size(); ++r)
    std::printf(" rank %zu %.3f (%.3f)", r, measured[r], predicted.ranks[r].bubble);
  std::printf("\n");
  if (!o_.trace.empty()) {
    trace_.write(o_.trace);
    std::printf("wrote the pipeline timeline to %s (open it in chrome://tracing or Perfetto)\n",
                o_.trace.c_str());
  }
}

}  // namespace loom::gpt

namespace loom::gpt {

std::vector<parallel::checkpoint::StatePiece> PipelineStep::checkpoint_pieces(
    nlohmann::json& state) const {
  // One copy of each parameter written (See TrainingState's `saves`).
  return parallel::checkpoint::TrainingState(
             *stage_set_, *opt_, parallel::pipeline::StageSet::single_process_name, one_copy())
      .save_pieces(state);
}

parallel::checkpoint::LoadStats PipelineStep::load_checkpoint(
    const std::string& path, const io::CheckpointManifest& manifest, comm::Communicator& world) {
  return parallel::checkpoint::TrainingState(*stage_set_, *opt_,
                                             parallel::pipeline::StageSet::single_process_name)
      .load(path, manifest, world);
}

}  // namespace loom::gpt
