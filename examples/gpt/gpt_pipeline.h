// loom-gpt's pipeline-parallel training step (--pp): this rank's stages of the GPT (See
// parallel::pipeline::GptStage), the schedule's executor over the mesh's pp group, and the
// gradient sums a step needs after its actions: Chimera's replica pairs and the tied embedding's
// copies, then the average over the dp group. --batch stays the global batch: each dp rank's
// share is split into --microbatches micro-batches, each loss weighted as in Note [Loss
// weighting], so the same flags give the single-process losses.
//
// With --tp each stage is tensor-parallel too (dp x tp x pp); --zero 1 shards the optimizer state
// over dp (the executor accumulates each step's gradients in the parameters; ZeRO reduce-scatters
// them after the actions); --zero 2 also keeps only gradient shards between micro-batches: each
// chunk's gradients are reduce-scattered as its backwards produce them (See Note [ZeRO-2 in a
// pipeline] in parallel/zero.cpp; the tied wte and the experts are reduced at the step's end,
// and Chimera's replicas sum their shards after the reduction); --zero 3 also shards the
// parameters, each chunk's blocks and the rest of it gathered around every micro-batch's forward
// and backward (the experts stay whole). Not combined yet: --grad-accum (micro-batches do its work)
// and activation checkpointing. With
// --dtype bf16 or f16 the stages hold bf16 / f16 parameters and pass activations and gradients in
// it; the optimizer steps f32 masters (a MixedPrecisionOptimizer, or ZeRO's), as
// DataParallelStep's. f16 scales every micro-batch's loss by the dynamic loss scale
// (PipelineExecutor::set_loss_scale); every rank skips a step whose gradients overflowed on any
// rank, and the scale backs off. Evaluation and --save gather the whole model onto every rank (the
// owner of each parameter broadcasts it over pp). Checkpoints hold each rank's stages under
// single-process names, so they reshard to and from any layout.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/io/batch_loader.h"
#include "core/io/gpt_params.h"
#include "core/nn/gpt.h"
#include "gpt/gpt_model.h"
#include "gpt/gpt_options.h"
#include "gpt/gpt_parallel.h"
#include "parallel/mesh.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/gpt_stage.h"
#include "parallel/pipeline/trace.h"

namespace loom::gpt {

// The schedule --schedule / --schedule-file gives, checked against --pp and --layers.
parallel::pipeline::Schedule schedule_from(const GptOptions& o);

// Refuses what --pp does not combine with yet, naming it.
void check_pipeline_options(const GptOptions& o);

// The stages pipeline rank `pp_rank` holds (the schedule's chunks of it, in order), tensor-
// parallel over `tp` when given: what PipelineStep builds, and loom-ckpt check plans. Their MoE
// blocks (--moe-experts) are built by `make_moe` (empty: every expert on this rank).
std::vector<std::shared_ptr<parallel::pipeline::GptStage>> make_stages(
    const GptConfig& config, const GptOptions& o, const parallel::pipeline::Schedule& schedule,
    int pp_rank, std::shared_ptr<comm::Communicator> tp, const nn::MoeFactory& make_moe = {});

// ZeRO (--zero 1 or 2) over dp as a pipeline runs it (gradients accumulated by the executor's
// backwards; stage 2 reduce-scatters each chunk's after each of its backwards, See Note [ZeRO-2 in
// a pipeline] in parallel/zero.cpp); PipelineStep adds the tp and pp groups and the norm's
// counting.
parallel::ZeroOptions pipeline_zero_options(const GptOptions& o);

class PipelineStep : public Trainer {
 public:
  // Collective over the mesh's pp and dp groups. The stages start from `init` (single-process
  // weights; each stage takes its own) or, when it is null, from --seed's initialisation; then
  // they are rounded to --dtype and the optimizer takes them (its f32 masters are copies).
  PipelineStep(const GptConfig& config, const GptOptions& o, const parallel::DeviceMesh& mesh,
               parallel::pipeline::Schedule schedule,
               const parallel::OptimizerFactory& make_optimizer, const io::GptParams* init);
  StepResult run(const io::Batch& global, int64_t step, double lr) override;
  // The single-process weights on every rank. Collective over pp.
  io::GptParams full_params() override;
  parallel::TrainingMemory memory() const override;
  std::string str() const override;  // "dp 2 x pp 2, schedule 1f1b, 4 micro-batches"
  const char* optimizer_name() const override { return opt_->name(); }
  const optim::LossScaler* scaler() const override;  // bf16 / f16: the masters'; f32: null
  // Writes --trace and prints the last step's measured bubble beside the validator's.
  void finish() override;
  // Every chunk's parameters and optimizer state under their single-process names: the tied
  // wte's copies and Chimera's replicas are the same pieces twice, which a save stores once.
  std::vector<parallel::checkpoint::StatePiece> checkpoint_pieces(
      nlohmann::json& state) const override;
  parallel::checkpoint::LoadStats load_checkpoint(const std::string& path,
                                                  const io::CheckpointManifest& manifest,
                                                  comm::Communicator& world) override;

 private:
  void load(const io::GptParams& params);
  // opt_ over the stages as they are now (ZeRO-1 or 2, a MixedPrecisionOptimizer for bf16 / f16, or
  // the factory's own).
  void build_optimizer(const parallel::DeviceMesh& mesh,
                       const parallel::OptimizerFactory& make_optimizer);
  double clip(double max_norm);
  // Whether a parameter of the StageSet (its "chunk{k}.<name>") is the one copy the gradient
  // norm counts and a checkpoint writes: pipeline 0's, and of wte the first stage's.
  std::function<bool(const std::string&)> one_copy() const;
  // --moe-experts: every expert of this rank's stages' MoE blocks from its holder over ep (See
  // GptModel::full_params).
  void gather_experts(std::map<std::string, Tensor>& mine, const nn::GPT& layout) const;
  // The MoE layers' routing of the step so far: auxiliary losses (this rank's terms), loads and
  // drops, summed over the forwards (See run).
  void record_moe_stats(const parallel::pipeline::GptStage& stage);
  void add_replica_counts();            // Chimera: See the .cpp
  void plan_replicas_from_pipeline0();  // Chimera with capacity: See the .cpp
  // fn(chunk, pair) for each of this rank's chunks whose stage is replicated over a pair of
  // ranks (Chimera), in stage order.
  void for_each_replica_pair(const std::function<void(size_t chunk, comm::Communicator& pair)>& fn);
  std::vector<std::shared_ptr<comm::Communicator>> replica_pairs_;  // per stage (Chimera)

  GptConfig config_;
  const GptOptions& o_;
  std::shared_ptr<comm::Communicator> pp_, dp_, tp_;  // tp_: null without tensor parallelism
  int dp_rank_;
  ExpertGroups experts_;  // --moe-experts over dp > 1 (empty otherwise)
  double moe_aux_ = 0;
  std::vector<int64_t> moe_load_;
  int64_t moe_dropped_ = 0;
  parallel::pipeline::Schedule schedule_;
  std::vector<std::shared_ptr<parallel::pipeline::GptStage>> stages_;  // per chunk
  std::shared_ptr<comm::Communicator> embedding_;  // ranks holding wte copies (null elsewhere)
  std::unique_ptr<parallel::pipeline::PipelineExecutor> executor_;
  // With --zero: the stages under one module for the ZeroOptimizer.
  std::shared_ptr<parallel::pipeline::StageSet> stage_set_ =
      std::make_shared<parallel::pipeline::StageSet>();
  DType dtype_;  // the stages' parameters, activations and gradients (--dtype)
  parallel::ZeroOptimizer* zero_ = nullptr;
  optim::MixedPrecisionOptimizer* mixed_ = nullptr;  // bf16 / f16 without ZeRO
  std::unique_ptr<optim::Optimizer> opt_;
  parallel::pipeline::ChromeTrace trace_;
  parallel::pipeline::Timelines last_step_;
  bool writes_output_;  // world rank 0
};

}  // namespace loom::gpt
