// The pipeline executor: runs this rank's action list of a Schedule for one training step.
//
//   RA / RG   a receive (into a buffer of the activation's shape), posted one compute action
//             earlier than its place in the list (See receive_posts); the F or B that needs it
//             waits for it
//   F         the chunk's forward on the received activation (a leaf that requires a gradient)
//             or, on the first stage, the micro-batch's tokens; the last stage also computes the
//             loss, scaled by 1 / microbatches so the step's gradient is that of the mean
//   SA / SG   post the send of the output / of the input's gradient and go on
//   B         backward from the output with the received gradient (last stage: from the loss);
//             gradients accumulate in the parameters over the step's micro-batches (or the
//             chunk's after_backward takes them)
//   SYNC      the chunk's gradients are complete: runs the chunk's sync callback (data
//             parallelism's reduction, Chimera's replica pair)
// Messages carry a tag naming (kind, micro-batch, pipeline, stage), so each receive matches its
// send whatever order the ranks post them in. Every send is waited before the step returns.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "collectives/communicator.h"
#include "core/tensor.h"
#include "parallel/pipeline/schedule.h"

namespace loom::parallel::pipeline {

// One chunk of this rank: its forward (input -> output), and on a last stage the loss of its
// output against the micro-batch's targets.
struct StageChunk {
  std::function<Tensor(const Tensor& input)> forward;
  std::function<Tensor(const Tensor& output, const Tensor& targets)> loss;  // last stages
  // At SYNC: start the chunk's gradient reduction without blocking (a blocking collective there
  // could wait on a peer that waits on this rank's next send); sync_wait finishes it once the
  // step's actions are done. Either may be empty.
  std::function<void()> sync;
  std::function<void()> sync_wait;
  // A scalar loss the forward made besides its output (MoE's auxiliary losses: See
  // GptStage::moe_aux_loss), taken right after each forward and backpropagated with weight 1 by
  // that micro-batch's B. Empty, or an undefined tensor: none.
  std::function<Tensor()> extra_loss;
  // After each B of the chunk, with its micro-batch: that backward's gradients are in the
  // parameters (ZeRO-2 reduce-scatters them there, See ZeroOptimizer::reduce_chunk). Empty: none.
  std::function<void(int microbatch)> after_backward;
};

// The gradients of a set of parameters summed (or averaged) over a group, started and finished
// separately (See StageChunk::sync): one allreduce of their packed gradients, or, when they lie
// in shared buffers (ZeRO-1's buckets), an allreduce of each run of them in place (Note
// [Summing gradients where they are] in executor.cpp).
class GradientSum {
 public:
  // `scale`: a factor applied to the reduced gradients (e.g. 1 / dp for experts summed over
  // their replicas, See GptStage's stage_chunk).
  GradientSum(std::vector<Tensor> params, std::shared_ptr<comm::Communicator> group,
              bool average = false, double scale = 1.0);
  void start();
  void wait();

 private:
  std::vector<Tensor> params_;
  std::shared_ptr<comm::Communicator> group_;
  bool average_;
  double scale_;
  Tensor flat_;               // the packed copy, or
  std::vector<Tensor> runs_;  // the gradients' runs, summed in place
  std::vector<comm::WorkPtr> works_;
};

// What one action took in a step, in seconds on the node's monotonic clock (comparable between
// the processes of one node). Receives are timed where they are waited (by the F or B that needs
// them), SYNC where its reduction is finished; sends are the instants they were posted.
struct TimedAction {
  Action action;
  double start, end;
};

// Where the executor posts each receive of a rank's action list: post_before[i] is the index of
// the action before which receive i is posted (the last F, B or W before it, or i itself when
// none precedes it); -1 for the other actions. See Note [Receives posted early].
std::vector<int> receive_posts(const std::vector<Action>& actions);

class PipelineExecutor {
 public:
  // `pp`: the pipeline group (rank i runs schedule.actions[i]). chunks[c] runs this rank's chunk
  // c. `activation`: the shape of one micro-batch's activation between stages ([rows, T, C]),
  // `dtype` its element type (the stages' parameters': bf16 stages pass bf16 activations and
  // gradients).
  PipelineExecutor(Schedule schedule, std::shared_ptr<comm::Communicator> pp,
                   std::vector<StageChunk> chunks, Shape activation, DType dtype = DType::kF32);

  // One step: tokens and targets per micro-batch (only the first and last stages read them).
  // Micro-batch k's loss is multiplied by weights[k] before its backward (default 1 / m: the
  // step's gradient is that of the mean). Returns the sum of weights[k] * loss_k over the
  // micro-batches whose last stage is on this rank, 0 elsewhere (See mean_loss).
  double run(const std::vector<Tensor>& tokens, const std::vector<Tensor>& targets,
             const std::vector<double>& weights = {});
  // Every micro-batch's forward without gradients and without the loss, in micro-batch then
  // stage order, the activations passed between the ranks as run() passes them (sends posted
  // and waited at the end, so the pass is pipelined as GPipe's forwards). MoE's routing pass
  // (See Note [A batch in micro-batches] in core/nn/moe.h). Collective over pp.
  // through_pipeline >= 0 (schedules of several pipelines, as Chimera's): every micro-batch
  // through that one pipeline's chunks instead of its own, so each of that pipeline's chunks
  // sees the whole batch in micro-batch order; the other pipelines' chunks forward nothing.
  void forward_only(const std::vector<Tensor>& tokens, int through_pipeline = -1);
  // The step's mean loss on every rank of the pipeline group: the sum over the ranks of what
  // run() returned (each micro-batch's loss is on its pipeline's last stage). Collective.
  double mean_loss(double local) const;

  // Called with the micro-batch's index before every F (e.g. to set the dropout batch part, See
  // Note [Dropout keys]).
  void set_before_forward(std::function<void(int microbatch)> hook) {
    before_forward_ = std::move(hook);
  }

  // f16's loss scale (See optim::LossScaler): every micro-batch's loss, and its extra loss,
  // backpropagates multiplied by it, so the gradients are the scaled ones; the losses run()
  // returns are not scaled. 1 by default.
  void set_loss_scale(double scale) { loss_scale_ = scale; }

  const Schedule& schedule() const { return schedule_; }
  // The last run()'s actions with their times (See TimedAction).
  const std::vector<TimedAction>& timeline() const { return timeline_; }

 private:
  int tag(bool gradient, int microbatch, int pipeline, int stage) const;

  Schedule schedule_;
  std::shared_ptr<comm::Communicator> pp_;
  std::vector<StageChunk> chunks_;
  Shape activation_;
  DType dtype_;
  int rank_;
  std::vector<TimedAction> timeline_;
  std::function<void(int)> before_forward_;
  double loss_scale_ = 1.0;
};

}  // namespace loom::parallel::pipeline
