// GradReducer: the gradient side of data parallelism, shared by DDP and ZeRO. It owns the
// bucketed gradient buffers of a parameter list (See BucketPlan), registers a grad-ready hook on
// every parameter, and launches each bucket's reduction over the group as soon as the bucket's
// last gradient arrives, while backward goes on (See Note [Bucket launch order]).
//
// One optimizer step is `grad_accum` micro-batches, each run through backward(loss), then
// finish(). What is reduced and what is kept depends on the mode:
//   kAllreduce   (DDP)     gradients live in the buckets (each param's .grad is a view of its
//                          slot); the last micro-batch allreduces them (average) in place.
//   kShardKeep   (ZeRO 1)  as kAllreduce, but the last micro-batch reduce-scatters: afterwards
//                          only this rank's shard of each bucket holds the averaged sum.
//   kShardOnly   (ZeRO 2, 3) every micro-batch copies gradients into a temporary bucket, drops
//                          the parameters' .grad, reduce-scatters the bucket and adds this rank's
//                          shard into a persistent shard buffer: a rank never keeps more than its
//                          shard of the gradients between micro-batches.
//
// Note [Unused parameters]
// A parameter may get no gradient in a step (a branch not taken). Its slot then reduces as
// zeros, so no rank waits for a bucket another rank never fills; and finish() allreduces one
// "used" flag per parameter, so a parameter no rank used ends with no gradient — as in the
// single-process run, where the optimizer skips it — while one used anywhere gets the average.
#pragma once

#include <memory>
#include <vector>

#include "collectives/communicator.h"
#include "parallel/bucket_plan.h"

namespace loom::parallel {

enum class GradMode { kAllreduce, kShardKeep, kShardOnly };

struct GradReducerOptions {
  GradMode mode = GradMode::kAllreduce;
  size_t bucket_bytes = 25u << 20;
  int grad_accum = 1;  // micro-batches per step
  // Launch each bucket as soon as it fills (overlapping backward); false launches them all
  // after backward, which only benchmarks want (to measure how much the overlap hides).
  bool overlap = true;
  // Explicit buckets (groups of parameter indices, See BucketPlan); empty: by bucket_bytes.
  std::vector<std::vector<size_t>> bucket_groups;
  // false: no grad-ready hooks; the step's gradients are accumulated in the parameters' .grad by
  // someone else (a pipeline executor's backwards) and reduce_accumulated() reduces them.
  bool hooks = true;
  // kShardOnly with hooks, backwards run by someone else one unit at a time (a pipeline's chunks;
  // See Note [ZeRO-2 in a pipeline] in zero.cpp): bucket_units[g] is the unit of bucket_groups[g]
  // (>= 0), or -1 for a bucket whose gradients accumulate in the parameters and are reduced by
  // reduce_accumulated() at the step's end. A unit's gradients are staged as they arrive, each
  // bucket launched once full (a unit's buckets in order; the one before it waited first), and
  // end_unit_backward(u) closes each backward of unit u. Empty: no units.
  std::vector<int> bucket_units;
  // Hybrid sharding (sharded modes only): the ranks holding the same shards in the other shard
  // groups (MiCS, PyTorch's HSDP: sharded inside a node, replicated across nodes). finish()
  // averages each shard gradient over them after the group's reduce-scatter, so the result is
  // the average over every rank of both.
  std::shared_ptr<comm::Communicator> replicas;
};

// The buckets a reducer over `params` in a group of `group_size` ranks uses (sharded modes pad
// each bucket to one equal shard per rank).
BucketPlan plan_buckets(const NamedParams& params, const GradReducerOptions& options,
                        int group_size);

// Bytes of a bucket size given in MiB (checked positive).
size_t bucket_bytes_from_mb(double mb, const char* owner);

class GradReducer {
 public:
  // `owner` prefixes errors ("DDP", "ZeRO-2"). Registers hooks on the parameters.
  GradReducer(const char* owner, NamedParams params, std::shared_ptr<comm::Communicator> group,
              const GradReducerOptions& options);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Backward of one micro-batch (scale its loss by 1 / grad_accum yourself).
  void backward(const Tensor& loss);
  // Waits for every reduction of the step; requires grad_accum micro-batches since the last
  // finish(). Afterwards (kAllreduce) each used parameter's .grad is the group average, or
  // (kShard*) shard_grad(b) holds this rank's shard of the averaged bucket b.
  void finish();
  // With hooks off: reduces the gradients the parameters hold now (none: zeros, as an unused
  // parameter), then finishes the step as finish() does. With bucket_units: those of the buckets
  // of unit -1 (the others were reduced after each backward).
  void reduce_accumulated();
  // Without hooks, at ZeRO-1 (kShardKeep): points every parameter's .grad at its zeroed bucket
  // slot, so the step's backwards accumulate in the buckets and reduce_accumulated() reduces them
  // there, the gradients held once (See Note [Accumulating in the buckets]). Before a step's
  // first backward; optional (without it the backwards allocate .grad and the step copies it).
  void accumulate_in_buckets();
  // With bucket_units, after each backward of unit u (on every rank of the group after the same
  // backwards, in the same order): launches the unit's buckets a parameter without a gradient
  // kept waiting (it reduces as zeros). What it launched is waited by the next full bucket, or the
  // next backward's first gradient: one bucket reduces while the next fills.
  void end_unit_backward(int unit);
  // With hooks off: the next step's gradients are being accumulated (finished() turns false).
  void begin_step() { finished_ = false; }

  bool finished() const { return finished_; }
  int micro_batches_done() const { return micro_; }
  const BucketPlan& plan() const { return plan_; }
  const NamedParams& params() const { return params_; }
  comm::Communicator& group() const { return *group_; }
  // After finish(): whether any rank produced a gradient for parameter i this step.
  bool used_anywhere(size_t i) const { return used_anywhere_.at(i) != 0; }
  // kShard*: this rank's shard of bucket b's averaged gradient (shard_numel(b) elements).
  const Tensor& shard_grad(size_t b) const { return shard_grads_.at(b); }
  // With bucket_units: unit u's buckets, in order (none for a unit without any), and bucket b's
  // unit (-1: reduced by reduce_accumulated, as every bucket is without units).
  const std::vector<size_t>& unit_buckets(int unit) const;
  int bucket_unit(size_t b) const { return unit_of_bucket_.empty() ? -1 : unit_of_bucket_.at(b); }
  // Bytes of the gradient buffers this reducer keeps between steps (buckets or shards).
  size_t gradient_bytes() const;
  // Seconds finish() spent waiting for reductions in the last step: the part of the
  // communication backward did not hide.
  double exposed_wait_seconds() const { return exposed_wait_s_; }

 private:
  struct Pending {
    size_t bucket;
    int64_t backward = 0;  // the backward that launched it (current_backward())
    comm::WorkPtr work;
    Tensor input, output;  // kShardOnly: the temporary bucket and its reduced shard
  };
  void on_gradient(size_t param);
  void stage_gradient(size_t param);
  int64_t current_backward() const;
  void complete_earlier_backwards();
  void launch_ready_buckets();
  void launch(size_t bucket);
  void flush_micro_batch();
  void complete(Pending& pending);
  void poll();
  bool reduces_this_micro_batch() const;
  // bucket_units: the first gradient of a step resets its state; completed reductions (oldest
  // first, so each shard adds them in launch order) free their temporary buckets.
  void start_external_step();
  void on_unit_gradient(size_t param);
  void launch_ready_in_unit(int unit);
  void complete_finished();
  std::string describe(size_t param) const;

  const char* owner_;
  NamedParams params_;
  std::shared_ptr<comm::Communicator> group_;
  GradReducerOptions options_;
  BucketPlan plan_;
  int rank_;

  std::vector<Tensor> buckets_;      // kAllreduce, kShardKeep: the persistent flat gradients
  std::vector<Tensor> staging_;      // kShardOnly: this micro-batch's temporary buckets
  std::vector<Tensor> shard_grads_;  // kShard*: this rank's shard of each bucket
  std::vector<int> ready_in_bucket_;
  std::vector<char> ready_;  // param got its gradient in this micro-batch
  std::vector<char> used_;   // param got a gradient in this step on this rank
  std::vector<char> used_anywhere_;
  // bucket_units: each bucket's unit, each unit's buckets in order and the next to launch, and
  // the unit backwards ended so far in this step.
  std::vector<int> unit_of_bucket_;
  std::vector<std::vector<size_t>> unit_buckets_;
  std::vector<size_t> unit_next_;
  int64_t unit_backwards_ = 0;
  bool external_started_ = false;
  size_t next_launch_ = 0;
  std::vector<Pending> pending_;
  bool in_backward_ = false;
  bool finished_ = false;
  bool in_buckets_ = false;  // this step accumulates in the buckets (accumulate_in_buckets)
  int micro_ = 0;
  double exposed_wait_s_ = 0;
  std::shared_ptr<bool> alive_;  // hooks outlive us on the parameters; they check this
};

}  // namespace loom::parallel
