// ShardedParameters: the parameter side of ZeRO-3. Each rank keeps only its shard of the
// parameters; a module's full parameters exist only while that module computes.
//
// The parameters are grouped into units, one module each (See zero3_units), and each unit is one
// bucket of a BucketPlan: a flat buffer padded to divide evenly, whose shard r lives on rank r.
// Every parameter is a view of its unit's full ("gathered") buffer, whose bytes are released
// whenever the unit is not in use, so outside a forward or backward a rank holds 1/N of the
// parameters. Around each unit module:
//   pre-forward     all-gather the unit (waiting for its prefetch if one is in flight), then
//                   prefetch the unit that came next in the previous forward;
//   post-forward    release the unit; when the output needs a gradient, pass it through an
//                   identity whose backward is the pre-backward hook;
//   pre-backward    all-gather the unit again (and prefetch the next one backward reaches);
//   gradients done  release the unit once every parameter of it has its gradient.
//
// Note [Released parameter memory]
// Autograd saves views of the parameters for backward (a Linear's weight for its input
// gradient). Releasing the gathered buffer frees its bytes but keeps the Storage object (See
// Storage::release), so those views stay valid and read the re-gathered bytes in backward, as
// FSDP does by resizing the storage to zero. A parameter read while released raises a clear error
// instead of reading freed memory.
//
// Note [ZeRO-3 re-gathers]
// The saved views also carry the gathered buffer's version (See Note [Version counter]), and a
// unit is gathered into the same buffer before forward and again before backward, so the rule
// for its all-gathers is: a gather leaves the gathered buffer's version as it found it, unless
// this rank's shard changed since the buffer was last gathered (its version moved: an optimizer
// step, a checkpoint load); then it bumps it once. Re-gathering unchanged shards rewrites the very
// values the forward used, so the gather before backward and activation checkpointing's
// recomputation raise nothing, while a step between forward and backward makes that backward
// raise instead of computing with the new values. Whatever the backend's own writes did to the
// version (the self backend copies with copy_, which bumps), it is set to that value once the
// gather completes. Ranks step their shards together, so each rank's own shard stands for the
// group's.
//
// All-gathers go over a communicator of their own (a split of the group): their order is the
// order the modules compute in, which is the same on every rank, while gradient reductions on the
// group's communicator follow gradient arrival (See Note [Bucket launch order]).
#pragma once

#include <memory>
#include <vector>

#include "collectives/communicator.h"
#include "core/nn/module.h"
#include "parallel/bucket_plan.h"

namespace loom::parallel {

// How ZeRO-3 groups a model's parameters. The units are `root` and every entry of every
// ModuleList in its tree (a GPT's blocks); a parameter belongs to the innermost unit holding it,
// and units owning none are left out. Units are listed in the order backward is expected to
// finish them (by their first parameter, last first), each with its parameter indices into
// `params` in reverse registration order: ready to be the buckets of a BucketPlan.
struct Zero3Layout {
  std::vector<nn::Module*> units;
  std::vector<std::vector<size_t>> parameters;  // per unit
};
Zero3Layout zero3_layout(nn::Module& root, const NamedParams& params);
// zero3_layout of each child of `root` in turn (a pipeline's chunks: StageSet), so no unit spans
// two children; `root` itself may own no parameter. Each child is a unit for the parameters its
// ModuleLists' entries do not own, and is called through its operator() (the hooks gather there).
Zero3Layout zero3_layout_by_child(nn::Module& root, const NamedParams& params);

class ShardedParameters {
 public:
  // Collective over `gather_group`. bucket b of `plan` holds the parameters of units[b], whose
  // current (full, identical on every rank) values are taken as the starting point; afterwards
  // each parameter views its unit's gathered buffer, released until the unit first computes.
  ShardedParameters(const NamedParams& params, const BucketPlan& plan,
                    std::vector<nn::Module*> units,
                    std::shared_ptr<comm::Communicator> gather_group);
  ~ShardedParameters();
  ShardedParameters(const ShardedParameters&) = delete;
  ShardedParameters& operator=(const ShardedParameters&) = delete;

  // This rank's shard of bucket b (the optimizer steps views of it).
  const Tensor& shard(size_t b) const { return shards_.at(b); }
  // Gathers every unit, so every parameter can be read (to save, evaluate or compare them) until
  // the unit's next forward releases it again. Collective.
  void gather_all();
  // The end of a backward: waits for prefetches no one used and releases every unit.
  void release_all();
  // Bytes held now: the shards plus the units currently gathered.
  size_t resident_bytes() const;

 private:
  void pre_forward(size_t unit);
  Tensor post_forward(size_t unit, const Tensor& output);
  void pre_backward(size_t unit);
  void on_gradient(size_t unit);
  void start_gather(size_t unit);
  void gather(size_t unit);
  void release(size_t unit);
  // The unit after `unit` in `order` (the previous pass's), started early.
  void prefetch_after(size_t unit, const std::vector<size_t>& order);

  std::shared_ptr<comm::Communicator> group_;
  std::vector<nn::Module*> units_;  // per bucket
  std::vector<Tensor> shards_;      // per bucket: this rank's shard
  std::vector<Tensor> gathered_;    // per bucket: the full padded buffer the parameters view
  // Per bucket, See Note [ZeRO-3 re-gathers]: the shard's version when last gathered, and the
  // version the gathered buffer shows autograd.
  std::vector<uint64_t> gathered_from_, gathered_version_;
  std::vector<comm::WorkPtr> in_flight_;
  std::vector<char> resident_;
  std::vector<int> grads_expected_, grads_seen_;
  std::vector<size_t> forward_order_, backward_order_;  // as the last pass ran the units
  std::vector<size_t> forward_seen_, backward_seen_;    // this pass so far
  std::vector<std::pair<nn::Module*, int>> hooks_;
  std::shared_ptr<bool> alive_;  // graph nodes and parameter hooks may outlive us
};

}  // namespace loom::parallel
