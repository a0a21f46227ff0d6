// ZeRO (Rajbhandari et al.): data parallelism that shards the training state over the group
// instead of replicating it, wrapping any loom optimizer.
//   stage 1: optimizer state sharded. Gradients are reduce-scattered (average) at the end of the
//            step; each rank updates only its shard of the parameters; the updated shards are
//            all-gathered back into every rank's full parameters.
//   stage 2: as 1, and each rank keeps only its shard of the gradients: every micro-batch's
//            gradient buckets are reduce-scattered as they fill and then dropped (in a pipeline,
//            after each backward of a chunk: See ZeroOptions::chunk_of).
//   stage 3: as 2, and each rank keeps only its shard of the parameters: a module's parameters
//            are all-gathered just before its forward and again before its backward, released
//            after each, and the next module is prefetched (See ShardedParameters). Call the model
//            through operator() (`model(x)`; GPT::loss does), which runs the hooks that gather.
//
// Layout: the parameters are moved into flat buckets (See BucketPlan; in stage 3 one bucket per
// module, See zero3_layout), each padded to a multiple of the group size and split into one equal
// shard per rank; rank r owns shard r of every bucket. The wrapped optimizer sees only this rank's
// pieces of the parameters (views into the flat buckets), so its state is 1/N of the whole, and it
// steps those pieces exactly as it would step whole parameters: elementwise optimizers (SGD, AdamW)
// give the single-process update.
//
//   parallel::ZeroOptimizer opt(model, world, {.stage = 2}, [](std::vector<Tensor> p) {
//     return std::make_unique<optim::AdamW>(std::move(p), optim::AdamWOptions{});
//   });
//   opt.backward(model.loss(x, y));
//   opt.clip_grad_norm(1.0);  // optional: the global norm over every shard
//   opt.step();
//   opt.zero_grad();
//
// Note [Skipping a step]
// With bf16 or f16 parameters the wrapped optimizer steps f32 masters of this rank's pieces (so
// the masters, like the rest of the optimizer state, are sharded: 12/N bytes per parameter with
// Adam). A rank sees only its shards of the gradient, so whether a step holds an inf or nan is
// agreed over the group (one max-allreduce of a flag; then over the hybrid replicas, the tp
// group and the pipeline, whose ranks hold other shards and stages): then every rank skips the
// step, leaving parameters and optimizer state unchanged, and its loss scaler backs off and
// counts the skip.
//
// Note [Sharded state]
// A ZeRO rank's optimizer state covers only the elements of its shards, whose boundaries depend
// on the group size and the bucket layout. A state saved on N ranks therefore cannot be loaded on
// M != N ranks (re-sharding it would mean gathering and re-splitting every bucket, which loom
// does not do): load_state_dict refuses it, naming both sizes, rather than loading moments into
// the wrong elements.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>

#include "collectives/communicator.h"
#include "core/nn/module.h"
#include "optimizer/loss_scaler.h"
#include "optimizer/master_weights.h"
#include "optimizer/optimizer.h"
#include "parallel/grad_reducer.h"
#include "parallel/sharded_parameters.h"
#include "parallel/training_memory.h"

namespace loom::parallel {

struct ZeroOptions {
  int stage = 1;                // 1, 2 or 3
  double bucket_mb = 25;        // bucket size in MiB (stages 1 and 2; stage 3 buckets by module)
  int grad_accum = 1;           // micro-batches per step
  bool check_replicas = false;  // as DdpOptions::check_replicas
  bool overlap = true;          // See GradReducerOptions::overlap
  // bf16 / f16 parameters train with f32 master weights (See Note [Skipping a step]); the loss
  // scaling defaults to dynamic for f16 and none for bf16.
  std::optional<optim::LossScalerOptions> loss_scaling;
  // The model's tensor-parallel group, when it has one (dp x tp): clip_grad_norm then adds the
  // squares of tp-sharded parameters (those with a ShardSpec) over it, and counts whole ones once.
  std::shared_ptr<comm::Communicator> tp;
  // Pipelines: the gradients come from the executor's backwards, not through backward()
  // (stages 2 and 3 take them as they come with chunk_of, which stage 3 needs);
  // finish_gradients() reduces what the parameters accumulated. clip_grad_norm
  // then also sums over `pp`, counting only the parameters `counted_in_norm` names (one copy of
  // each: not a tied or replicated second copy).
  bool external_backward = false;
  // Stages 2 and 3 with external_backward (See Note [ZeRO-2 in a pipeline] in zero.cpp): the
  // pipeline chunk each parameter belongs to, or -1 for one reduced only at the step's end (a
  // tied copy whose gradient is summed with its other copies first). Buckets then never span two
  // chunks (stage 3: its units are each chunk's blocks and the rest of it, the module's children
  // being the chunks, See zero3_layout_by_child), each chunk's gradients are reduce-scattered and
  // dropped as its backwards produce them, and reduce_chunk(c) closes each backward of chunk c.
  // Not given: every gradient is reduced at the step's end (stages 1 and 2).
  std::function<int(const std::string& name)> chunk_of;
  // With chunk_of: after the reduction, the shard gradients of each (chunk, group)'s buckets are
  // summed over the group, in the order given: ranks holding another copy of that chunk with the
  // same parameters in the same order (Chimera's replica pairs), whose buckets of it are laid out
  // alike, so their shards hold the same elements.
  std::vector<std::pair<int, std::shared_ptr<comm::Communicator>>> chunk_sums;
  std::shared_ptr<comm::Communicator> pp;
  std::function<bool(const std::string& name)> counted_in_norm;
  // Hybrid sharding (MiCS / HSDP): `group` is a shard group (a node's dp ranks, say) and
  // `replicas` the ranks holding the same shards in the other shard groups. Every state is
  // sharded over `group` only (memory as for its size) and replicated over `replicas`;
  // gradients are averaged over both (See GradReducerOptions::replicas), the parameters start
  // from replica rank 0's, and the skip decision of a bf16/f16 step is taken over both.
  // Checkpoints of such a layout are refused (state_dict()) for now: every replica holds the
  // same pieces.
  std::shared_ptr<comm::Communicator> replicas;
  // Own parameters (expert parallelism's experts: each rank holds its own, See Note [Own
  // parameters under data parallelism] in parallel/ddp.cpp): the parameters `own_parameters`
  // names stay out of the buckets; after backward their gradients are summed over
  // `own_replicas` (the ranks holding the same ones; null: none) and divided by the
  // data-parallel size, the wrapped optimizer steps them beside this rank's pieces, and
  // clip_grad_norm counts each once. With own_replicas of size 1 (ep = dp) they step whole. With
  // R of 2 or more replicas their training state is sharded over own_replicas as ZeRO shards the
  // rest over the group (See Note [Own parameters sharded over their replicas] in zero.cpp):
  // gradients reduce-scattered, each replica stepping 1/R of the elements (its optimizer state and
  // f32 masters 1/R), the updated values all-gathered into the whole parameters; at stage 3 with
  // own_unit the parameters themselves are sharded too. In bf16 / f16 they step through f32 masters
  // as the pieces do, and a step's skip is the group's decision over both. Stages 1-3, with
  // external_backward (pipelines) and hybrid sharding (gradients divided by the group's size times
  // the replicas'). Checkpoints (parallel/checkpoint) hold what each rank steps of them
  // (own_places()) beside the pieces; state_dict() refuses them.
  std::function<bool(const std::string& name)> own_parameters;
  std::shared_ptr<comm::Communicator> own_replicas;
  // Stage 3: the module (its path in the model, "" for the root) whose forward reads an own
  // parameter. Given, stage 3 shards the own parameters themselves over own_replicas, gathered
  // around each such module as ZeRO-3 gathers the rest around theirs; not given, they stay whole.
  std::function<std::string(const std::string& name)> own_unit;
};

// Hybrid sharding's groups over `group` (See ZeroOptions::replicas): shard groups of
// `shard_size` consecutive ranks, or each node's ranks when shard_size is 0, and the replicas
// (the ranks at the same place in the other shard groups). Collective over `group`. Throws,
// prefixed with `owner`, unless there are two or more even shard groups of two or more ranks.
struct HybridGroups {
  std::shared_ptr<comm::Communicator> shards, replicas;
};
HybridGroups hybrid_groups(std::shared_ptr<comm::Communicator> group, int shard_size,
                           const std::string& owner);

// Builds the wrapped optimizer over the parameter pieces it is given.
using OptimizerFactory = optim::OptimizerFactory;

// A parameter group (torch.optim's): the module's parameters it holds, by name, and the
// optimizer that steps their pieces (its own kind and options: weight decay off for biases and
// norms, another learning rate for a head).
struct ZeroParamGroup {
  std::vector<std::string> params;  // the only group naming none: every parameter
  OptimizerFactory make_optimizer;
};

class ZeroOptimizer : public optim::Optimizer {
 public:
  // Collective over `group`. Moves the module's parameters into the flat buckets (their values
  // and autograd identity stay; rank 0's values are broadcast unless check_replicas).
  ZeroOptimizer(nn::Module& module, std::shared_ptr<comm::Communicator> group,
                const ZeroOptions& options, const OptimizerFactory& make_optimizer);
  // With parameter groups: every parameter of the module in exactly one group (else an error
  // naming it). This rank's pieces step with their parameter's group's optimizer
  // (optim::GroupedOptimizer), each group at its own learning rate: set it with
  // group_optimizer(g).set_lr(); set_lr() itself is for one group.
  ZeroOptimizer(nn::Module& module, std::shared_ptr<comm::Communicator> group,
                const ZeroOptions& options, std::vector<ZeroParamGroup> groups);

  // Backward of one micro-batch (scale its loss by 1 / grad_accum yourself; the loss scale, for
  // f16, is applied here).
  void backward(const Tensor& loss);
  // Waits for the step's gradient reductions (step() does it when you have not).
  void finish_gradients();
  // Stage 1 with external_backward (a pipeline): the step's backwards accumulate in the gradient
  // buckets rather than in fresh .grad tensors, so the gradients are held once (See Note
  // [Accumulating in the buckets] in grad_reducer.cpp); call before a step's first backward.
  void accumulate_in_buckets();
  // With ZeroOptions::chunk_of: whether the module's parameter `name` is reduced only at the
  // step's end (its bucket holds a parameter chunk_of gives -1), its gradient accumulating whole
  // until then; false for one reduced as it comes, or not bucketed (an own parameter).
  bool reduced_at_step_end(const std::string& name) const;
  // Stages 2 and 3 with ZeroOptions::chunk_of, after each backward of pipeline chunk `chunk` (the
  // executor's B): launches the chunk's reductions still waiting and frees what earlier backwards
  // reduced (See Note [ZeRO-2 in a pipeline]). Collective over the group (every rank calls it
  // after the same backwards).
  void reduce_chunk(int chunk);
  // Clips the global gradient norm (every shard of every parameter, counted once) to
  // max_norm, as optim::clip_grad_norm does for the whole model on one process. Returns the
  // norm before clipping.
  double clip_grad_norm(double max_norm);
  // Updates this rank's shard, then (stages 1, 2) all-gathers the parameters.
  void step() override;
  // Stage 3: gathers every parameter, so the model can be read whole (saved, compared) until
  // its next forward; a no-op in stages 1 and 2, whose parameters are always whole. Collective.
  void gather_parameters();
  // This rank's share of the wrapped optimizer's state.
  std::vector<std::pair<std::string, Tensor>> state() const override;
  // This rank's shard of the training state, to checkpoint: the wrapped optimizer's
  // state_dict() over this rank's pieces, plus where it belongs ("zero.stage", "zero.rank",
  // "zero.world_size", "zero.shard_numel" per bucket) and, in stage 3, the parameter shards
  // ("zero.param_shard.{b}"), which no other copy of the model holds whole. Each rank saves its
  // own (See Note [Sharded state]).
  std::map<std::string, Tensor> state_dict() const override;
  // Loads what state_dict() saved on the same rank of a group of the same size, stage and
  // bucket layout; anything else is refused with an error naming what differs, before anything
  // changes. Local: no communication, so a refusal cannot hang the other ranks.
  void load_state_dict(const std::map<std::string, Tensor>& state) override;

  // For checkpoints (parallel/checkpoint/training_state.h): the parameters ZeRO manages (the
  // module's, by name), this rank's pieces of them in the wrapped optimizer's parameter order, and
  // the tensor holding piece i's values (in the parameters' dtype; bf16 / f16 pieces step through
  // masters()).
  const NamedParams& named_parameters() const { return reducer_.params(); }
  std::vector<ShardPiece> own_pieces() const;
  // The own parameters (ZeroOptions::own_parameters), whole.
  const NamedParams& own_parameters() const { return own_; }
  // What the wrapped optimizer steps of the own parameters, after this rank's pieces and in this
  // order: elements [offset, offset + numel) of parameter `name` (all of it when not sharded over
  // own_replicas), held in `value` (the parameter's dtype; bf16 / f16 step through masters()).
  struct OwnPlace {
    std::string name;
    int64_t offset = 0, numel = 0;
    bool whole = true;  // numel is all of the parameter
    Tensor value;
  };
  std::vector<OwnPlace> own_places() const;
  // own_places() of rank `replica_rank` of `replicas` ranks holding `module`'s own parameters,
  // worked out without a group (loom-ckpt check); the values are left undefined.
  static std::vector<OwnPlace> planned_own_places(nn::Module& module, const ZeroOptions& options,
                                                  int replica_rank, int replicas);
  // own_pieces() of rank `rank` of a group of `group_size` over `module`, worked out without a
  // group and without touching the module: what a layout that is not running would hold
  // (loom-ckpt check). Its parameters are module.named_parameters().
  static std::vector<ShardPiece> planned_pieces(nn::Module& module, const ZeroOptions& options,
                                                int rank, int group_size);
  Tensor piece_values(size_t i) const { return pieces_.at(i).master; }
  const optim::MasterWeights* masters() const { return masters_.get(); }
  optim::LossScaler& scaler() { return scaler_; }
  // After this rank's pieces of the parameters changed outside the optimizer (a checkpoint
  // loaded them): stages 1 and 2 all-gather every rank's shards into every rank's parameters;
  // stage 3 drops any gathered copy, which is stale. Collective in stages 1 and 2.
  void parameters_changed();
  // Whether a checkpoint may fill the whole parameters on every rank instead of this rank's
  // pieces and parameters_changed(): stages 1 and 2 without own parameters, whose pieces view
  // the whole parameters, so nothing is left to gather (Note [ZeRO's parameters read whole when
  // cached] in parallel/checkpoint/training_state.cpp).
  bool pieces_view_whole_parameters() const { return !sharded_ && own_.empty(); }
  // The ranks that share the parameters' pieces (parameters_changed gathers over them).
  comm::Communicator& shard_group() const { return reducer_.group(); }

  int stage() const { return options_.stage; }
  bool hybrid() const { return options_.replicas != nullptr; }  // sharded with replicas
  int shard_group_size() const { return reducer_.group().size(); }
  const optim::LossScaler& scaler() const { return scaler_; }
  const BucketPlan& buckets() const { return reducer_.plan(); }
  optim::Optimizer& inner() const { return *inner_; }
  size_t group_count() const { return group_count_; }
  // Group g's optimizer over this rank's pieces of its parameters (the wrapped optimizer itself
  // with one group).
  optim::Optimizer& group_optimizer(size_t g) const;
  // What this rank keeps for training, in bytes: its parameters (full in stages 1 and 2; in
  // stage 3 its shards plus the modules gathered at the moment), its gradients (stage 1: full
  // buckets; stages 2, 3: its shards) and its share of the optimizer state.
  TrainingMemory memory() const;
  double exposed_wait_seconds() const { return reducer_.exposed_wait_seconds(); }

 private:
  struct Prepared;
  static Prepared prepare(nn::Module& module, comm::Communicator* group,
                          const ZeroOptions& options);
  // The reducer's options and stage 3's layout (no communication).
  static void plan_layout(nn::Module& module, const ZeroOptions& options, Prepared& p);
  ZeroOptimizer(nn::Module& module, std::shared_ptr<comm::Communicator> group,
                const ZeroOptions& options, std::vector<ZeroParamGroup> groups, Prepared prepared);
  // The wrapped optimizer over `stepped` (this rank's pieces, or their masters): one group's, or
  // a GroupedOptimizer of every group's.
  std::unique_ptr<optim::Optimizer> make_inner(std::vector<Tensor> stepped,
                                               const std::vector<ZeroParamGroup>& groups) const;
  void allgather_shards();  // stages 1, 2: every rank's shards into the full parameters
  struct Piece {            // this rank's part of one parameter
    size_t param;
    Tensor master;  // view into flat_params_ (stage 3: into the parameter shard)
    Tensor grad;    // view into the reducer's shard gradient
  };
  ZeroOptions options_;
  GradReducer reducer_;
  std::vector<Tensor> flat_params_;  // stages 1, 2: per bucket, padded; the parameters view them
  std::unique_ptr<ShardedParameters> sharded_;  // stage 3
  std::vector<Piece> pieces_;
  std::vector<char> tp_sharded_;  // per parameter: a ShardSpec shard of a tp model
  NamedParams own_;               // See ZeroOptions::own_parameters
  std::vector<char> own_tp_sharded_;
  // Own parameters sharded over own_replicas (See Note [Own parameters sharded over their
  // replicas]): their buckets (one flat tensor, or stage 3's one per unit) and the parts of this
  // rank's shards of them, which the wrapped optimizer steps.
  struct OwnPiece {
    size_t param;                 // in own_
    int64_t param_offset, numel;  // elements of that parameter
    size_t bucket;                // of own_buckets_
    int64_t shard_offset;         // where they sit in this rank's shard of the bucket
    Tensor value;                 // view into own_flat_ (stage 3: into the bucket's shard)
  };
  std::vector<OwnPiece> own_pieces_;
  std::vector<Bucket> own_buckets_;  // one (the flat tensor), or stage 3's one per unit
  Tensor own_flat_;                  // stages 1-2: the parameters view it
  std::unique_ptr<ShardedParameters> own_params_;  // stage 3 with own_unit
  bool own_sharded() const { return !own_buckets_.empty(); }
  void shard_own_parameters();  // the constructor's: the layout and the flat copy (stages 1-2)
  void shard_own_parameters_stage3(nn::Module& module);
  void allgather_own();  // every replica's updated shard into the whole own parameters
  void reduce_own_gradients();
  void sum_chunk_copies();  // See ZeroOptions::chunk_sums
  std::unique_ptr<optim::Optimizer> inner_;
  size_t group_count_ = 1;
  std::unique_ptr<optim::MasterWeights> masters_;  // bf16 / f16: f32 copies of the pieces
  optim::LossScaler scaler_ = optim::LossScaler::none();
  bool found_nonfinite_ = false;  // this step's gradients, on any rank
};

}  // namespace loom::parallel
