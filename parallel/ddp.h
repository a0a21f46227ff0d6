// DistributedDataParallel: data parallelism over a group (the mesh's dp group, or the world).
// Every rank holds the whole model and a different part of the global batch; after backward
// the gradients are averaged over the group, so each rank's optimizer takes the step the
// single-process run takes on the whole batch (when each rank's loss is its mean, and the
// ranks' parts are equal).
//
//   parallel::DistributedDataParallel ddp(model, world, {.grad_accum = 2});
//   for (int k = 0; k < 2; ++k) ddp.backward(model.loss(x[k], y[k]).scale(0.5));
//   ddp.finish();  // averaged gradients in place
//   opt.step();
//
// Gradients are reduced in buckets, each launched while the rest of backward runs (See
// GradReducer); with grad_accum > 1 only the last micro-batch communicates.
#pragma once

#include <functional>
#include <memory>

#include "collectives/communicator.h"
#include "core/nn/module.h"
#include "parallel/grad_reducer.h"
#include "parallel/training_memory.h"

namespace loom::parallel {

struct DdpOptions {
  double bucket_mb = 25;  // gradient bucket size in MiB
  int grad_accum = 1;     // micro-batches per step
  // At wrap time every rank must have the same parameter names and shapes (always checked).
  // Values: rank 0's are broadcast to all; or, with check_replicas, the values are verified
  // identical instead and a difference is an error naming the parameter.
  bool check_replicas = false;
  bool overlap = true;  // See GradReducerOptions::overlap
  // Parameters (by name) a rank holds for only some ranks of the group, such as its experts
  // under expert parallelism: left out of the group's broadcast, checks and bucketed reduction.
  // finish() makes their gradients what the shared parameters' are, the single-process ones
  // when each rank's loss is its mean (See Note [Own parameters under data parallelism]):
  // summed over `own_replicas` and divided by the group's size.
  std::function<bool(const std::string&)> own_parameters;
  // The ranks holding the same own parameters as this one, this rank included (under expert
  // parallelism: one rank of each ep group, parallel::expert_replicas); null when no other rank
  // holds them. Their values are agreed over it at wrap time as the shared ones are over the
  // group (rank 0's broadcast, or verified with check_replicas).
  std::shared_ptr<comm::Communicator> own_replicas;
};

class DistributedDataParallel {
 public:
  // Collective over `group`.
  DistributedDataParallel(nn::Module& module, std::shared_ptr<comm::Communicator> group,
                          const DdpOptions& options = {});

  // Backward of one micro-batch; its reductions are launched as gradients become ready.
  void backward(const Tensor& loss) { reducer_.backward(loss); }
  // After the last micro-batch: waits for the reductions. Each parameter's .grad is then the
  // group average (undefined for a parameter no rank used); an own parameter's, See
  // DdpOptions::own_parameters.
  void finish();

  nn::Module& module() const { return module_; }
  comm::Communicator& group() const { return reducer_.group(); }
  const BucketPlan& buckets() const { return reducer_.plan(); }
  // What this rank keeps for training, in bytes (the optimizer's state is the optimizer's).
  TrainingMemory memory() const;
  // Seconds the last finish() waited: reduction time backward did not hide.
  double exposed_wait_seconds() const { return reducer_.exposed_wait_seconds(); }

 private:
  nn::Module& module_;
  GradReducer reducer_;
  NamedParams own_;  // See DdpOptions::own_parameters
  std::shared_ptr<comm::Communicator> own_replicas_;
};
}  // namespace loom::parallel
