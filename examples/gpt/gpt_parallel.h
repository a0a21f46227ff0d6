// How loom-gpt runs one optimizer step on this rank under data (and tensor) parallelism: which
// rows of the global batch the rank takes (by its dp index: the ranks of one tp group take the
// same rows), how they split into micro-batches, and which wrapper (none, DDP, ZeRO 1/2/3)
// reduces the gradients over the dp group. --batch stays the global batch, so the same flags on
// any number of ranks train on the same data and give the single-process losses.
//
// Note [Loss weighting]
// The single-process loss is the mean over the global batch's counted targets (the addition
// task masks all but the answer). Micro-batch j on rank r holds v_rj of the G counted targets,
// and its loss is the mean over those; backpropagating loss_rj * v_rj * N / G, where the
// wrapper averages over the N ranks, gives exactly the gradient of the global mean, however the
// counted targets fall over ranks and micro-batches. The reported loss is the same weighting,
// summed over ranks.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "core/io/batch_loader.h"
#include "core/nn/gpt.h"
#include "gpt/gpt_model.h"
#include "gpt/gpt_options.h"
#include "optimizer/mixed_precision.h"
#include "optimizer/optimizer.h"
#include "parallel/checkpoint/checkpoint.h"
#include "parallel/ddp.h"
#include "parallel/zero.h"

namespace loom::gpt {

// Targets that count in the loss (not the ignore index): the weights of Note [Loss weighting].
int64_t counted_targets(const Tensor& targets);

// For MixedPrecisionOptimizer::set_skip_agreement: whether any rank of `group` found an inf or
// nan (the largest flag over it), for ranks that see gradients the others do not.
std::function<bool(bool)> any_rank_of(std::shared_ptr<comm::Communicator> group);

struct StepResult {
  double loss;          // over the whole global batch
  double grad_norm;     // before clipping; -1 without clipping
  double comm_wait_ms;  // waiting for the gradient reductions after backward; -1 without any
  // The least comm_wait_ms over the data-parallel ranks: a rank's wait also holds the time it
  // waited for a later rank to finish its backward; the last rank's holds only the reduction.
  double comm_wait_least_ms = -1;
  bool skipped;  // bf16 / f16: an inf or nan gradient on some rank; nothing was updated
  // With MoE blocks (loss is then the cross-entropy alone): their auxiliary losses, each
  // expert's assignments summed over the MoE blocks, and the assignments capacity dropped.
  double moe_aux_loss = -1;
  std::vector<int64_t> moe_load;
  int64_t moe_dropped = 0;
  double moe_exchange_ms = -1;  // expert parallelism: this rank's time in the all-to-alls
};

// What loom-gpt's training loop drives: one optimizer step over the global batch, under data and
// tensor parallelism (DataParallelStep) or with a pipeline (PipelineStep, gpt_pipeline.h).
class Trainer {
 public:
  virtual ~Trainer() = default;
  // Forward, backward, reduction, clipping and the optimizer update for one global batch.
  virtual StepResult run(const io::Batch& global, int64_t step, double lr) = 0;
  virtual std::string str() const = 0;
  virtual const char* optimizer_name() const = 0;
  // This rank's parameters, gradients and optimizer state.
  virtual parallel::TrainingMemory memory() const = 0;
  // The loss scaler of bf16 / f16 training (null for f32).
  virtual const optim::LossScaler* scaler() const { return nullptr; }
  // The single-process weights (f32). Collective: every rank calls it.
  virtual io::GptParams full_params() = 0;
  // After the last step (prints what the run measured, writes --trace). Collective.
  virtual void finish() {}
  // Checkpoints (gpt_checkpoint.h): this rank's training state as pieces (snapshots) with its
  // part of the manifest's state, and loading a checkpoint saved by any layout. Collective.
  virtual std::vector<parallel::checkpoint::StatePiece> checkpoint_pieces(
      nlohmann::json& state) const;
  virtual parallel::checkpoint::LoadStats load_checkpoint(const std::string& path,
                                                          const io::CheckpointManifest& manifest,
                                                          comm::Communicator& world);
};

// The ZeRO options of --zero, --bucket-mb, --grad-accum, --no-overlap and --loss-scale over
// `model` (its tensor-parallel group; its experts, with expert parallelism, as own parameters:
// See ZeroOptions::own_parameters).
parallel::ZeroOptions zero_options(const GptOptions& o, const GptModel& model);

// f16's dynamic loss scaling, starting at --loss-scale.
optim::LossScalerOptions f16_scaling(const GptOptions& o);

class DataParallelStep : public Trainer {
 public:
  // Collective over the mesh's dp group (the wrappers broadcast its rank 0's parameters).
  DataParallelStep(GptModel& model, const GptOptions& o, const parallel::DeviceMesh& mesh,
                   const parallel::OptimizerFactory& make_optimizer);

  StepResult run(const io::Batch& global, int64_t step, double lr) override;
  const char* optimizer_name() const override { return opt_->name(); }
  io::GptParams full_params() override;
  std::vector<parallel::checkpoint::StatePiece> checkpoint_pieces(
      nlohmann::json& state) const override;
  parallel::checkpoint::LoadStats load_checkpoint(const std::string& path,
                                                  const io::CheckpointManifest& manifest,
                                                  comm::Communicator& world) override;

  optim::Optimizer& optimizer() const { return *opt_; }
  // Makes the model's parameters whole (ZeRO-3 shards them between steps) until its next
  // forward. Collective: every rank calls it.
  void gather_parameters() {
    if (zero_) zero_->gather_parameters();
  }
  // This rank's parameters, gradients (counted at their steady-state size, also before the first
  // backward allocates them) and optimizer state.
  parallel::TrainingMemory memory() const override;
  std::string str() const override;  // "dp 2 x tp 2, ZeRO-1, grad-accum 2, buckets 25 MiB"
  const optim::LossScaler* scaler() const override;

 private:
  GptModel& model_;
  const GptOptions& o_;
  std::shared_ptr<comm::Communicator> dp_;
  int dp_rank_;
  std::unique_ptr<parallel::DistributedDataParallel> ddp_;
  parallel::ZeroOptimizer* zero_ = nullptr;          // opt_ when ZeRO wraps the optimizer
  optim::MixedPrecisionOptimizer* mixed_ = nullptr;  // opt_ for bf16 / f16 without ZeRO
  std::unique_ptr<optim::Optimizer> opt_;
};

}  // namespace loom::gpt
