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

#include <memory>
#include <string>

#include "collectives/communicator.h"
#include "core/io/batch_loader.h"
#include "core/nn/gpt.h"
#include "gpt/gpt_model.h"
#include "gpt/gpt_options.h"
#include "optimizer/mixed_precision.h"
#include "optimizer/optimizer.h"
#include "parallel/ddp.h"
#include "parallel/zero.h"

namespace loom::gpt {

struct StepResult {
  double loss;          // over the whole global batch
  double grad_norm;     // before clipping; -1 without clipping
  double comm_wait_ms;  // waiting for the gradient reductions after backward; -1 without any
  bool skipped;         // bf16 / f16: an inf or nan gradient on some rank; nothing was updated
};

class DataParallelStep {
 public:
  // Collective over the mesh's dp group (the wrappers broadcast its rank 0's parameters).
  DataParallelStep(GptModel& model, const GptOptions& o, const parallel::DeviceMesh& mesh,
                   const parallel::OptimizerFactory& make_optimizer);

  // Forward, backward, reduction, clipping and the optimizer update for one global batch.
  StepResult run(const io::Batch& global, int64_t step, double lr);

  optim::Optimizer& optimizer() const { return *opt_; }
  // Makes the model's parameters whole (ZeRO-3 shards them between steps) until its next
  // forward. Collective: every rank calls it.
  void gather_parameters() {
    if (zero_) zero_->gather_parameters();
  }
  // This rank's parameters, gradients (counted at their steady-state size, also before the first
  // backward allocates them) and optimizer state.
  parallel::TrainingMemory memory() const;
  std::string str() const;  // "dp 2 x tp 2, ZeRO-1, grad-accum 2, buckets 25 MiB"
  // The loss scaler of bf16 / f16 training (null for f32).
  const optim::LossScaler* scaler() const;

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
