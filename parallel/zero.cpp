#include "parallel/zero.h"

#include <cmath>

#include "collectives/hierarchical.h"
#include "core/ops.h"
#include "optimizer/clip_grad.h"
#include "optimizer/grouped.h"
#include "parallel/replicas.h"

namespace loom::parallel {
namespace {

const char* owner_name(int stage) {
  switch (stage) {
    case 1:
      return "ZeRO-1";
    case 2:
      return "ZeRO-2";
    case 3:
      return "ZeRO-3";
    default:
      return "ZeRO";
  }
}

void check_stage(int stage) {
  LOOM_CHECK(stage >= 1 && stage <= 3, "ZeRO: stage must be 1, 2 or 3, got ", stage,
             " (stage 0 is plain DDP)");
}

}  // namespace

// What the reducer and the parameter sharding are built from, worked out before either exists.
struct ZeroOptimizer::Prepared {
  NamedParams params;
  GradReducerOptions reducer;
  Zero3Layout layout;  // stage 3
};

namespace {

// The module's parameters that ZeRO shards (own = false) or leaves whole (own = true; See
// ZeroOptions::own_parameters).
NamedParams zero_parameters(nn::Module& module, const ZeroOptions& o, bool own) {
  return parameters_by_owner(module, o.own_parameters, own);
}

}  // namespace

ZeroOptimizer::Prepared ZeroOptimizer::prepare(nn::Module& module, comm::Communicator* group,
                                               const ZeroOptions& o) {
  check_stage(o.stage);
  ZeroOptimizer::Prepared p;
  const char* owner = owner_name(o.stage);
  p.params = agreed_parameters(zero_parameters(module, o, false), group, o.check_replicas, owner);
  if (o.replicas)  // every shard group from the same start: replica rank 0's
    agreed_parameters(module, o.replicas.get(), o.check_replicas, owner);
  plan_layout(module, o, p);
  return p;
}

void ZeroOptimizer::plan_layout(nn::Module& module, const ZeroOptions& o, Prepared& p) {
  const char* owner = owner_name(o.stage);
  p.reducer.mode = o.stage == 1 ? GradMode::kShardKeep : GradMode::kShardOnly;
  p.reducer.bucket_bytes = bucket_bytes_from_mb(o.bucket_mb, owner);
  p.reducer.grad_accum = o.grad_accum;
  p.reducer.overlap = o.overlap;
  p.reducer.hooks = !o.external_backward;
  p.reducer.replicas = o.replicas;
  LOOM_CHECK(!o.external_backward || o.stage < 3 || o.chunk_of, owner,
             ": stage 3 with external_backward (a pipeline) needs chunk_of: its gradients must "
             "be reduced as each chunk's backward produces them");
  LOOM_CHECK(!o.chunk_of || (o.stage >= 2 && o.external_backward), owner,
             ": chunk_of is for stages 2 and 3 in a pipeline (external_backward)");
  LOOM_CHECK(o.chunk_sums.empty() || o.chunk_of, owner, ": chunk_sums needs chunk_of");
  std::vector<int> chunk;  // chunk_of's, per parameter
  if (o.chunk_of)
    for (const auto& [name, t] : p.params) {
      chunk.push_back(o.chunk_of(name));
      LOOM_CHECK(chunk.back() >= -1, owner, ": chunk_of('", name, "') is ", chunk.back(),
                 " (a chunk >= 0, or -1 for the step's end)");
    }
  if (o.stage == 3) {
    p.layout =
        o.chunk_of ? zero3_layout_by_child(module, p.params) : zero3_layout(module, p.params);
    p.reducer.bucket_groups = p.layout.parameters;
  } else if (o.chunk_of) {
    std::vector<Tensor> tensors;
    for (const auto& [name, t] : p.params) tensors.push_back(t);
    p.reducer.bucket_groups = bucket_groups_by_unit(tensors, chunk, p.reducer.bucket_bytes);
  }
  if (o.chunk_of) {  // See Note [ZeRO-2 in a pipeline]
    for (const std::vector<size_t>& group : p.reducer.bucket_groups) {
      // Stage 3's buckets are its units (a chunk, or a block of one): one holding a parameter
      // reduced at the step's end is reduced there whole.
      int unit = chunk[group.front()];
      for (size_t i : group) {
        LOOM_CHECK(chunk[i] == -1 || unit == -1 || chunk[i] == unit, owner, ": parameters '",
                   p.params[group.front()].first, "' and '", p.params[i].first,
                   "' share a bucket but chunk_of puts them in chunks ", unit, " and ", chunk[i]);
        if (chunk[i] == -1) unit = -1;
      }
      p.reducer.bucket_units.push_back(unit);
    }
    p.reducer.hooks = true;  // each chunk's gradients staged as its backward produces them
  }
}

HybridGroups hybrid_groups(std::shared_ptr<comm::Communicator> group, int shard_size,
                           const std::string& owner) {
  LOOM_CHECK(group != nullptr, owner, ": the group communicator is null");
  std::vector<int> group_of;  // empty: by node (comm::node_map)
  if (shard_size != 0) {
    LOOM_CHECK(shard_size > 0 && group->size() % shard_size == 0, owner, ": shard groups of ",
               shard_size, " do not divide the ", group->size(), " ranks of group '", group->name(),
               "'");
    for (int r = 0; r < group->size(); ++r) group_of.push_back(r / shard_size);
  }
  const comm::Hierarchy split(group, group_of);
  LOOM_CHECK(split.applies(), owner, ": the ranks of group '", group->name(), "' form ",
             split.str(), "; hybrid sharding needs two or more shard groups of two or more ranks");
  return {split.intra_ptr(), split.inter_ptr()};
}

std::vector<ShardPiece> ZeroOptimizer::planned_pieces(nn::Module& module, const ZeroOptions& o,
                                                      int rank, int group_size) {
  check_stage(o.stage);
  LOOM_CHECK(group_size > 0 && rank >= 0 && rank < group_size, "ZeRO: rank ", rank,
             " outside a group of ", group_size);
  Prepared p;
  p.params = zero_parameters(module, o, false);
  plan_layout(module, o, p);
  return plan_buckets(p.params, p.reducer, group_size).shard_pieces(rank);
}

ZeroOptimizer::ZeroOptimizer(nn::Module& module, std::shared_ptr<comm::Communicator> group,
                             const ZeroOptions& options, const OptimizerFactory& make_optimizer)
    : ZeroOptimizer(module, group, options, {ZeroParamGroup{{}, make_optimizer}},
                    prepare(module, group.get(), options)) {}

ZeroOptimizer::ZeroOptimizer(nn::Module& module, std::shared_ptr<comm::Communicator> group,
                             const ZeroOptions& options, std::vector<ZeroParamGroup> groups)
    : ZeroOptimizer(module, group, options, std::move(groups),
                    prepare(module, group.get(), options)) {}

ZeroOptimizer::ZeroOptimizer(nn::Module& module, std::shared_ptr<comm::Communicator> group,
                             const ZeroOptions& options, std::vector<ZeroParamGroup> groups,
                             Prepared prepared)
    : Optimizer(owner_name(options.stage), module.parameters(), 0.0, /*f32_only=*/false),
      options_(options),
      reducer_(owner_name(options.stage), prepared.params, group, prepared.reducer) {
  LOOM_CHECK(!groups.empty(), name_, ": no parameter group given");
  for (const ZeroParamGroup& g : groups)
    LOOM_CHECK(g.make_optimizer != nullptr, name_, ": no optimizer factory given");
  const BucketPlan& plan = reducer_.plan();
  for (const auto& [name, p] : reducer_.params())
    tp_sharded_.push_back(char(module.parameter_shard(name) != nullptr));
  const NamedParams& named = reducer_.params();
  const int rank = reducer_.group().rank();
  if (options.stage == 3) {
    // The gathers get a communicator of their own, See ShardedParameters.
    sharded_ = std::make_unique<ShardedParameters>(
        named, plan, prepared.layout.units,
        group->split(0, group->rank(), group->name() + ".zero3_gather"));
  } else {
    for (size_t b = 0; b < plan.buckets().size(); ++b) {
      const Bucket& bucket = plan.buckets()[b];
      Tensor flat =
          Tensor::zeros({bucket.padded}, named[0].second.dtype(), named[0].second.device());
      for (const BucketSlot& s : bucket.slots) {
        Tensor p = named[s.param].second;
        Tensor view = flat.narrow(0, s.offset, s.numel).reshape(p.shape());
        view.copy_(p.detach());
        p.set_data(view);
      }
      flat_params_.push_back(flat);
    }
  }
  std::vector<Tensor> stepped;  // what the wrapped optimizer steps: the pieces, or f32 masters
  for (const ShardPiece& sp : plan.shard_pieces(rank)) {
    const Tensor shard =
        sharded_ ? sharded_->shard(sp.bucket)
                 : flat_params_[sp.bucket].narrow(0, int64_t(rank) * plan.shard_numel(sp.bucket),
                                                  plan.shard_numel(sp.bucket));
    Piece piece{sp.param, shard.narrow(0, sp.shard_offset, sp.numel),
                reducer_.shard_grad(sp.bucket).narrow(0, sp.shard_offset, sp.numel)};
    stepped.push_back(piece.master);
    pieces_.push_back(std::move(piece));
  }
  // Own parameters step whole beside the pieces (See ZeroOptions::own_parameters).
  own_ = zero_parameters(module, options, true);
  if (!own_.empty() && options.own_replicas && options.own_replicas->size() > 1)
    own_ = agreed_parameters(std::move(own_), options.own_replicas.get(), options.check_replicas,
                             owner_name(options.stage));
  const DType dtype = named.empty() ? DType::kF32 : named[0].second.dtype();
  for (const auto& [name, p] : own_) {
    LOOM_CHECK(p.dtype() == dtype, name_, ": own parameter '", name, "' is ", dtype_name(p.dtype()),
               " but the sharded ones are ", dtype_name(dtype));
    own_tp_sharded_.push_back(char(module.parameter_shard(name) != nullptr));
  }
  // bf16 / f16: each stepped own tensor gets its f32 master below, as the pieces do.
  if (!own_.empty() && options.own_replicas && options.own_replicas->size() > 1) {
    if (options.stage == 3 && options.own_unit)
      shard_own_parameters_stage3(module);
    else
      shard_own_parameters();
    for (const OwnPiece& op : own_pieces_) stepped.push_back(op.value);
  } else {
    for (const auto& [name, p] : own_) stepped.push_back(p);
  }
  if (optim::is_low_precision(dtype)) {
    masters_ = std::make_unique<optim::MasterWeights>(stepped);
    stepped = masters_->masters();
  }
  scaler_ = options.loss_scaling   ? optim::LossScaler(*options.loss_scaling)
            : dtype == DType::kF16 ? optim::LossScaler()
                                   : optim::LossScaler::none();
  group_count_ = groups.size();
  inner_ = make_inner(std::move(stepped), groups);
  lr_ = inner_->lr();
  name_ = inner_->name();  // what is being stepped; errors of the sharding itself name the stage
}

std::unique_ptr<optim::Optimizer> ZeroOptimizer::make_inner(
    std::vector<Tensor> stepped, const std::vector<ZeroParamGroup>& groups) const {
  if (groups.size() == 1 && groups[0].params.empty()) {  // the one-factory constructor's
    std::unique_ptr<optim::Optimizer> inner = groups[0].make_optimizer(std::move(stepped));
    LOOM_CHECK(inner != nullptr, name_, ": the optimizer factory returned null");
    return inner;
  }
  LOOM_CHECK(own_.empty(), name_,
             ": parameter groups with own parameters (expert parallelism) are not supported yet");
  // Each parameter's group, by name; every parameter in exactly one.
  const NamedParams& named = reducer_.params();
  std::vector<size_t> group_of_param(named.size(), groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const std::string& name : groups[g].params) {
      size_t i = 0;
      while (i < named.size() && named[i].first != name) ++i;
      LOOM_CHECK(i < named.size(), name_, ": parameter group ", g, " names '", name,
                 "', which is not a parameter of the module");
      LOOM_CHECK(group_of_param[i] == groups.size(), name_, ": parameter '", name,
                 "' is in groups ", group_of_param[i], " and ", g,
                 "; a parameter can be in one group only");
      group_of_param[i] = g;
    }
  }
  for (size_t i = 0; i < named.size(); ++i)
    LOOM_CHECK(group_of_param[i] < groups.size(), name_, ": parameter '", named[i].first,
               "' is in no parameter group; ZeRO shards every parameter of the module, so every "
               "one needs a group");
  std::vector<size_t> group_of_piece;
  for (const Piece& p : pieces_) group_of_piece.push_back(group_of_param[p.param]);
  std::vector<optim::OptimizerFactory> factories;
  for (const ZeroParamGroup& g : groups) factories.push_back(g.make_optimizer);
  return std::make_unique<optim::GroupedOptimizer>(std::move(stepped), group_of_piece, factories);
}

optim::Optimizer& ZeroOptimizer::group_optimizer(size_t g) const {
  if (auto* grouped = dynamic_cast<optim::GroupedOptimizer*>(inner_.get()))
    return grouped->group(g);
  LOOM_CHECK(g == 0, name_, ": parameter group ", g, " of 1");
  return *inner_;
}

// Note [Own parameters sharded over their replicas]
// Expert parallelism with ep < dp holds each expert on R = dp / ep ranks (own_replicas). Their
// training state is sharded over those R ranks the way stages 1 and 2 shard the rest over the
// group: the own parameters are laid end to end in one flat tensor of R x S elements (S = their
// total / R, rounded up; the parameters become views of it), rank q of own_replicas steps
// elements [q S, (q + 1) S) (the parts of parameters that fall there: own_pieces_), so it keeps
// the optimizer state and f32 masters of those alone. After backward the flat gradients are
// reduce-scattered over the replicas (the sum of Note [Own parameters under data parallelism],
// divided by the group's size as before), and after the step the updated shards are
// all-gathered back into the flat tensor, so every replica's parameters are whole again: what
// shrinks is their state, 12/R bytes per f32 element with AdamW instead of 12. Stage 3 given
// ZeroOptions::own_unit (the module whose forward reads each one: an expert's MoE layer) shards
// the parameters themselves instead: a bucket per unit, sharded over the replicas and gathered
// around the unit's forward and backward by a ShardedParameters of its own (over a split of
// own_replicas), as the rest are around their modules; the same reduce-scatter per bucket.
namespace {

// The module at `path` ("a.b.0"; "" is `root`) in `root`'s tree, or an error naming the path.
nn::Module* module_at(nn::Module& root, const std::string& path, const char* owner) {
  nn::Module* at = &root;
  size_t begin = 0;
  while (!path.empty() && begin <= path.size()) {
    const size_t dot = std::min(path.find('.', begin), path.size());
    const std::string name = path.substr(begin, dot - begin);
    nn::Module* next = nullptr;
    for (const auto& [child_name, child] : at->children())
      if (child_name == name) next = child.get();
    LOOM_CHECK(next != nullptr, owner, ": own_unit named module '", path,
               "', which the model does not have (no child '", name, "')");
    at = next;
    begin = dot + 1;
  }
  return at;
}

// How the own parameters `own` are laid out over their replicas (See Note [Own parameters
// sharded over their replicas]): one bucket of them all in order (the flat tensor), or at stage 3
// with own_unit one per unit module (`paths`: each unit's path, in the buckets' order).
std::vector<std::vector<size_t>> own_groups(const NamedParams& own, const ZeroOptions& o,
                                            std::vector<std::string>* paths) {
  std::vector<std::vector<size_t>> groups;
  if (o.stage != 3 || !o.own_unit) {
    groups.emplace_back(own.size());
    for (size_t i = 0; i < own.size(); ++i) groups[0][i] = i;
    return groups;
  }
  for (size_t i = 0; i < own.size(); ++i) {
    const std::string path = o.own_unit(own[i].first);
    size_t g = 0;
    while (g < paths->size() && (*paths)[g] != path) ++g;
    if (g == paths->size()) {
      paths->push_back(path);
      groups.emplace_back();
    }
    groups[g].push_back(i);
  }
  return groups;
}

std::vector<Tensor> tensors_of(const NamedParams& named) {
  std::vector<Tensor> out;
  for (const auto& [name, p] : named) out.push_back(p);
  return out;
}

}  // namespace

void ZeroOptimizer::shard_own_parameters() {
  NoGradGuard no_grad;
  const comm::Communicator& replicas = *options_.own_replicas;
  std::vector<std::string> paths;
  const BucketPlan plan(tensors_of(own_), own_groups(own_, options_, &paths), replicas.size());
  own_buckets_ = plan.buckets();  // one: every own parameter end to end
  const Tensor& first = own_.front().second;
  own_flat_ = Tensor::zeros({own_buckets_[0].padded}, first.dtype(), first.device());
  for (const BucketSlot& slot : own_buckets_[0].slots) {
    Tensor p = own_[slot.param].second;
    Tensor view = own_flat_.narrow(0, slot.offset, slot.numel).reshape(p.shape());
    view.copy_(p.detach());
    p.set_data(view);
  }
  const int64_t shard = plan.shard_numel(0), rank = replicas.rank();
  for (const ShardPiece& sp : plan.shard_pieces(int(rank)))
    own_pieces_.push_back({sp.param, sp.param_offset, sp.numel, sp.bucket, sp.shard_offset,
                           own_flat_.narrow(0, rank * shard + sp.shard_offset, sp.numel)});
}

// Stage 3 with ZeroOptions::own_unit: the own parameters themselves sharded over their replicas,
// one bucket per unit module (its own parameters), gathered around the unit's forward and again
// for its backward by a ShardedParameters of their own, as the rest are around theirs. What each
// rank steps is its shard of every unit (See Note [Own parameters sharded over their replicas]).
void ZeroOptimizer::shard_own_parameters_stage3(nn::Module& module) {
  const char* owner = owner_name(options_.stage);
  comm::Communicator& replicas = *options_.own_replicas;
  std::vector<std::string> paths;
  const std::vector<std::vector<size_t>> groups = own_groups(own_, options_, &paths);
  std::vector<nn::Module*> units;
  for (const std::string& path : paths) units.push_back(module_at(module, path, owner));
  const BucketPlan plan(tensors_of(own_), groups, replicas.size());
  own_buckets_ = plan.buckets();
  own_params_ = std::make_unique<ShardedParameters>(
      own_, plan, units,
      options_.own_replicas->split(0, replicas.rank(), replicas.name() + ".zero3_gather"));
  for (const ShardPiece& sp : plan.shard_pieces(replicas.rank()))
    own_pieces_.push_back({sp.param, sp.param_offset, sp.numel, sp.bucket, sp.shard_offset,
                           own_params_->shard(sp.bucket).narrow(0, sp.shard_offset, sp.numel)});
}

std::vector<ZeroOptimizer::OwnPlace> ZeroOptimizer::planned_own_places(nn::Module& module,
                                                                       const ZeroOptions& o,
                                                                       int replica_rank,
                                                                       int replicas) {
  check_stage(o.stage);
  LOOM_CHECK(replicas > 0 && replica_rank >= 0 && replica_rank < replicas, "ZeRO: replica rank ",
             replica_rank, " outside ", replicas, " replicas");
  const NamedParams own = zero_parameters(module, o, true);
  std::vector<OwnPlace> out;
  if (own.empty()) return out;
  if (replicas == 1) {  // each stepped whole, as the constructor does
    for (const auto& [name, p] : own) out.push_back({name, 0, p.numel(), true, Tensor()});
    return out;
  }
  std::vector<std::string> paths;
  const BucketPlan plan(tensors_of(own), own_groups(own, o, &paths), replicas);
  for (const ShardPiece& sp : plan.shard_pieces(replica_rank))
    out.push_back({own[sp.param].first, sp.param_offset, sp.numel,
                   sp.numel == own[sp.param].second.numel(), Tensor()});
  return out;
}

void ZeroOptimizer::allgather_own() {
  if (own_params_) {  // stage 3: the next forward gathers the updated shards
    own_params_->release_all();
    return;
  }
  const int64_t rank = options_.own_replicas->rank(),
                shard = own_flat_.numel() / options_.own_replicas->size();
  Tensor mine = own_flat_.narrow(0, rank * shard, shard);
  own_flat_.storage()->bump_version();  // as allgather_shards: a write autograd must see
  options_.own_replicas->allgather(mine, own_flat_)->wait();
}

std::vector<ZeroOptimizer::OwnPlace> ZeroOptimizer::own_places() const {
  std::vector<OwnPlace> out;
  if (own_sharded()) {
    for (const OwnPiece& op : own_pieces_)
      out.push_back({own_[op.param].first, op.param_offset, op.numel,
                     op.numel == own_[op.param].second.numel(), op.value});
  } else {
    for (const auto& [name, p] : own_) out.push_back({name, 0, p.numel(), true, p.detach()});
  }
  return out;
}

std::vector<ShardPiece> ZeroOptimizer::own_pieces() const {
  return reducer_.plan().shard_pieces(reducer_.group().rank());
}

void ZeroOptimizer::parameters_changed() {
  if (own_sharded()) allgather_own();
  if (sharded_)
    sharded_->release_all();
  else
    allgather_shards();
}

void ZeroOptimizer::backward(const Tensor& unscaled_loss) {
  const Tensor loss =
      scaler_.scale() == 1.0 ? unscaled_loss : scale(unscaled_loss, scaler_.scale());
  if (!sharded_) return reducer_.backward(loss);
  try {
    reducer_.backward(loss);
  } catch (...) {
    sharded_->release_all();
    if (own_params_) own_params_->release_all();
    throw;
  }
  sharded_->release_all();
  if (own_params_) own_params_->release_all();
}

// Note [ZeRO-2 in a pipeline]
// A pipeline's executor runs each chunk's backward for every micro-batch itself
// (external_backward). Accumulated in the parameters and reduced at the step's end, the
// gradients would be whole on every rank throughout the step: ZeRO-1's gradient memory. With
// chunk_of, stage 2 buckets each chunk's parameters apart (a bucket spanning two chunks would
// fill at two different moments) and the reducer's grad-ready hooks take each gradient as the
// chunk's backward produces it: copied into its bucket and dropped from the parameter; a full
// bucket is reduce-scattered over the group (averaged) while the backward goes on, and this rank's
// shard added into its shard gradient when it completes. A full bucket first waits for the one
// before it, so a rank keeps its shards plus one bucket reducing and one filling.
// reduce_chunk(c), after each backward of chunk c, launches the buckets an unused parameter held
// back. Every dp rank runs the same
// actions on the same graph, so the group's ranks launch the same buckets in the same order; a
// blocking wait at the same point of every dp replica's identical schedule cannot deadlock the
// pipeline, whose sends are posted without blocking. Parameters with chunk -1 accumulate whole
// and are reduced at the step's end (reduce_accumulated): copies of one parameter that must be
// summed first (the tied embedding's copies, on two stages, or four under Chimera). A chunk
// another rank holds too (Chimera's two pipelines each hold every stage) has its buckets laid out
// alike on both ranks, so its copies are summed shard by shard after the reduction
// (ZeroOptions::chunk_sums). The experts (own parameters) are not bucketed and are reduced at the
// step's end as in stage 1. Each shard adds the per-backward averages in launch order: the
// single-process gradient up to rounding, the same bits on every run. Stage 3 in a pipeline works
// the same way over its units (each chunk's blocks and the rest of the chunk, See
// zero3_layout_by_child): ShardedParameters gathers a unit around every micro-batch's forward and
// backward through it and releases it once the backward gave each of its parameters a gradient; a
// unit holding a parameter reduced at the step's end (the chunk's embeddings, beside wte) is
// reduced there whole.

// ZeroOptions::chunk_sums: each chunk's shard gradients summed over the ranks holding its other
// copies (Chimera's replica pairs), one allreduce of them packed, in the order given.
void ZeroOptimizer::sum_chunk_copies() {
  NoGradGuard no_grad;
  for (const auto& [chunk, group] : options_.chunk_sums) {
    const std::vector<size_t>& buckets = reducer_.unit_buckets(chunk);
    std::vector<Tensor> shards;
    int64_t n = 0;
    for (size_t b : buckets) {
      shards.push_back(reducer_.shard_grad(b));
      n += shards.back().numel();
    }
    if (n == 0) continue;  // the same on every copy: their layouts are alike
    Tensor flat = Tensor::empty({n}, shards.front().dtype(), shards.front().device());
    int64_t at = 0;
    for (const Tensor& s : shards) {
      flat.narrow(0, at, s.numel()).copy_(s);
      at += s.numel();
    }
    group->allreduce(flat)->wait();
    at = 0;
    for (Tensor s : shards) {
      s.copy_(flat.narrow(0, at, s.numel()));
      at += s.numel();
    }
  }
}

bool ZeroOptimizer::reduced_at_step_end(const std::string& name) const {
  const NamedParams& named = reducer_.params();
  for (size_t i = 0; i < named.size(); ++i)
    if (named[i].first == name) {
      return reducer_.bucket_unit(reducer_.plan().bucket_of(i)) < 0;
    }
  return false;
}

void ZeroOptimizer::reduce_chunk(int chunk) {
  LOOM_CHECK(options_.chunk_of != nullptr, name_,
             ": reduce_chunk() needs ZeroOptions::chunk_of (stage 2 or 3 in a pipeline)");
  reducer_.end_unit_backward(chunk);
}

void ZeroOptimizer::accumulate_in_buckets() {
  LOOM_CHECK(options_.stage == 1 && options_.external_backward, name_,
             ": accumulate_in_buckets() is for stage 1 with external_backward (a pipeline); "
             "stages 2 and 3 keep shards only");
  reducer_.accumulate_in_buckets();
}

void ZeroOptimizer::finish_gradients() {
  if (reducer_.finished()) return;
  if (options_.external_backward)
    reducer_.reduce_accumulated();
  else
    reducer_.finish();
  sum_chunk_copies();
  reduce_own_gradients();
  // The wrapped optimizer's gradients: this rank's shard, none for a parameter no rank used.
  if (!masters_) {
    for (Piece& p : pieces_) p.master.set_grad(reducer_.used_anywhere(p.param) ? p.grad : Tensor());
    found_nonfinite_ = false;
    return;
  }
  // See Note [Skipping a step]: the decision is the group's, since each rank sees its shards.
  std::vector<Tensor> grads;
  for (Piece& p : pieces_) grads.push_back(reducer_.used_anywhere(p.param) ? p.grad : Tensor());
  if (own_sharded()) {  // after the pieces, as stepped
    for (const OwnPiece& op : own_pieces_) grads.push_back(op.value.grad());
  } else {
    for (const auto& [name, p] : own_) grads.push_back(p.grad());
  }
  const bool finite = masters_->set_gradients(grads, 1.0 / scaler_.scale());
  Tensor flag = Tensor::full({1}, finite ? 0.0 : 1.0, DType::kI32);
  reducer_.group().allreduce(flag, comm::AllreduceOptions{comm::ReduceOp::kMax})->wait();
  if (options_.replicas)
    options_.replicas->allreduce(flag, comm::AllreduceOptions{comm::ReduceOp::kMax})->wait();
  // tp ranks hold other shards, pp ranks other stages: one skips only if every rank does.
  for (const auto& other : {options_.tp, options_.pp})
    if (other && other->size() > 1)
      other->allreduce(flag, comm::AllreduceOptions{comm::ReduceOp::kMax})->wait();
  found_nonfinite_ = flag.item() != 0;
}

void ZeroOptimizer::reduce_own_gradients() {
  // See Note [Own parameters under data parallelism] in parallel/ddp.cpp: summed over the own
  // parameter's replicas, divided by the data-parallel size (the group's, times the hybrid
  // replicas' count). Every replica takes part, with zeros for a parameter its rank's backward
  // did not reach.
  const bool replicated = options_.own_replicas && options_.own_replicas->size() > 1;
  const double mean = 1.0 / (double(reducer_.group().size()) *
                             double(options_.replicas ? options_.replicas->size() : 1));
  if (own_sharded()) {  // See Note [Own parameters sharded over their replicas]
    NoGradGuard no_grad;
    const Tensor& first = own_.front().second;
    const int64_t count = options_.own_replicas->size();
    std::vector<Tensor> shards;  // per bucket: this rank's reduced part
    for (size_t b = 0; b < own_buckets_.size(); ++b) {
      const Bucket& bucket = own_buckets_[b];
      Tensor flat = Tensor::zeros({bucket.padded}, first.dtype(), first.device());
      for (const BucketSlot& slot : bucket.slots) {
        const Tensor g = own_[slot.param].second.grad();
        if (g.defined()) flat.narrow(0, slot.offset, slot.numel).copy_(g.reshape({slot.numel}));
      }
      Tensor shard = Tensor::empty({bucket.padded / count}, first.dtype(), first.device());
      options_.own_replicas->reduce_scatter(flat, shard)->wait();
      shards.push_back(scale(shard, mean));
    }
    for (OwnPiece& op : own_pieces_)
      op.value.set_grad(shards[op.bucket].narrow(0, op.shard_offset, op.numel));
    return;
  }
  for (auto& [name, p] : own_) {
    Tensor g = p.grad().defined() ? p.grad().contiguous()
                                  : Tensor::zeros(p.shape(), p.dtype(), p.device());
    if (replicated) options_.own_replicas->allreduce(g)->wait();
    p.set_grad(scale(g, mean));
  }
}

double ZeroOptimizer::clip_grad_norm(double max_norm) {
  finish_gradients();
  const std::vector<Tensor>& mine = inner_->params();
  // Each element sits in exactly one rank's shard, so the sum over ranks counts it once. With
  // tp, a sharded parameter's elements are spread over the tp ranks too; a whole one's repeat.
  std::vector<Tensor> sharded, whole;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const size_t param = pieces_[i].param;
    if (options_.counted_in_norm && !options_.counted_in_norm(reducer_.params()[param].first))
      continue;
    (options_.tp && tp_sharded_[param] ? sharded : whole).push_back(mine[i]);
  }
  // An own parameter whole on every one of its replicas: its squares, summed over every
  // data-parallel rank, count it that many times. Sharded over its replicas (See Note [Own
  // parameters sharded over their replicas]), each element is stepped by one replica: counted
  // once. (Under hybrid sharding the pieces' squares sum over the shard group alone, which holds
  // each once, and the own ones' over its replicas too, which hold other experts.)
  // (What the wrapped optimizer steps: the own parameters after the pieces, or their masters.)
  const bool split = own_sharded();
  std::vector<Tensor> own_tp_split, own_tp_whole;
  for (size_t i = 0; i < (split ? own_pieces_.size() : own_.size()); ++i) {
    const size_t param = split ? own_pieces_[i].param : i;
    if (options_.counted_in_norm && !options_.counted_in_norm(own_[param].first)) continue;
    (options_.tp && own_tp_sharded_[param] ? own_tp_split : own_tp_whole)
        .push_back(mine[pieces_.size() + i]);
  }
  const double copies =
      options_.own_replicas && !split ? double(options_.own_replicas->size()) : 1.0;
  // [pieces split over tp, pieces whole over tp, own split over tp, own whole over tp]
  std::vector<float> s = {float(optim::grad_sum_of_squares(sharded)),
                          float(optim::grad_sum_of_squares(whole)),
                          float(optim::grad_sum_of_squares(own_tp_split) / copies),
                          float(optim::grad_sum_of_squares(own_tp_whole) / copies)};
  auto sum_over = [&s](comm::Communicator& group, const std::vector<size_t>& entries) {
    std::vector<float> part;
    for (size_t i : entries) part.push_back(s[i]);
    Tensor t = Tensor::from_vector(part, {int64_t(part.size())});
    group.allreduce(t)->wait();
    const std::vector<float> summed = t.to_vector<float>();
    for (size_t k = 0; k < entries.size(); ++k) s[entries[k]] = summed[k];
  };
  sum_over(reducer_.group(), {0, 1, 2, 3});
  if (options_.replicas && !own_.empty()) sum_over(*options_.replicas, {2, 3});
  if (options_.tp) sum_over(*options_.tp, {0, 2});
  if (options_.pp) sum_over(*options_.pp, {0, 1, 2, 3});
  const double norm = std::sqrt(double(s[0]) + double(s[1]) + double(s[2]) + double(s[3]));
  optim::scale_grads_to_norm(mine, norm, max_norm);
  return norm;
}

void ZeroOptimizer::step() {
  finish_gradients();
  if (options_.external_backward) reducer_.begin_step();  // the next step accumulates anew
  const bool skip = found_nonfinite_;
  if (!skip) {
    if (group_count_ == 1) group_optimizer(0).set_lr(lr_);  // with groups, each has its own
    inner_->step();
  }
  for (Piece& p : pieces_) p.master.set_grad(Tensor());
  for (OwnPiece& op : own_pieces_) op.value.set_grad(Tensor());
  if (masters_) {
    masters_->clear_gradients();
    if (!skip) masters_->copy_to_model();  // rounded into this rank's shard of the parameters
  }
  scaler_.update(skip);
  if (skip) return;  // parameters and optimizer state as they were (See Note [Skipping a step])
  if (own_sharded()) allgather_own();
  if (sharded_) {
    sharded_->release_all();  // a gathered copy (gather_parameters) is stale now
    return;                   // the next forward gathers the updated shards
  }

  allgather_shards();
}

void ZeroOptimizer::allgather_shards() {
  // Every rank's shards into every rank's parameters, in place.
  const BucketPlan& plan = reducer_.plan();
  const int rank = reducer_.group().rank();
  std::vector<comm::WorkPtr> works;
  for (size_t b = 0; b < flat_params_.size(); ++b) {
    const int64_t size = plan.shard_numel(b);
    Tensor mine = flat_params_[b].narrow(0, int64_t(rank) * size, size);
    // Other ranks' updated shards land in the parameters: a write autograd must see, as the
    // local step's is (collectives do not bump; See Note [Version counter]).
    flat_params_[b].storage()->bump_version();
    works.push_back(reducer_.group().allgather(mine, flat_params_[b]));
  }
  comm::wait_all(works);
}

void ZeroOptimizer::gather_parameters() {
  if (sharded_) sharded_->gather_all();
  if (own_params_) own_params_->gather_all();
}

TrainingMemory ZeroOptimizer::memory() const {
  TrainingMemory m;
  for (const Tensor& t : flat_params_) m.parameters += t.nbytes();
  if (sharded_) m.parameters = sharded_->resident_bytes();
  m.gradients = reducer_.gradient_bytes();
  for (const auto& [name, p] : own_) {  // whole, with their gradients
    m.parameters += own_sharded() ? 0 : p.nbytes();
    m.gradients += p.nbytes();
  }
  // Sharded: views of the flat tensor (with its padding), or stage 3's shards and gathered
  // units; and the reduced gradient shards.
  if (own_flat_.defined()) m.parameters += own_flat_.nbytes();
  if (own_params_) m.parameters += own_params_->resident_bytes();
  for (const Bucket& b : own_buckets_)
    m.gradients +=
        size_t(b.padded / options_.own_replicas->size()) * dtype_size(own_.front().second.dtype());
  m.optimizer_state = state_bytes();  // the wrapped optimizer's and the f32 masters
  return m;
}

std::vector<std::pair<std::string, Tensor>> ZeroOptimizer::state() const {
  std::vector<std::pair<std::string, Tensor>> out = inner_->state();
  if (masters_)
    for (size_t i = 0; i < masters_->masters().size(); ++i)
      out.emplace_back(std::to_string(i) + ".master", masters_->masters()[i]);
  return out;
}

namespace {

Tensor i64_values(const std::vector<int64_t>& v) {
  return Tensor::from_vector(v, {int64_t(v.size())});
}

// The values of an i64 state entry, or an error naming it.
std::vector<int64_t> i64_entry(const std::map<std::string, Tensor>& state, const std::string& key,
                               const char* owner) {
  auto it = state.find(key);
  LOOM_CHECK(it != state.end() && it->second.defined(), owner, ": load_state_dict: no '", key,
             "' in the state (was it saved by a ZeroOptimizer's state_dict()?)");
  LOOM_CHECK(it->second.dtype() == DType::kI64, owner, ": load_state_dict: '", key, "' is ",
             it->second.str(), ", expected i64");
  return it->second.to_vector<int64_t>();
}

std::string list_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

std::map<std::string, Tensor> ZeroOptimizer::state_dict() const {
  LOOM_CHECK(!hybrid(), name_,
             ": state_dict of hybrid sharding (replicas) is not supported yet: every replica "
             "holds the same shards");
  LOOM_CHECK(own_.empty(), name_,
             ": state_dict with own parameters (expert parallelism's experts) is not supported "
             "yet");
  std::map<std::string, Tensor> out = inner_->state_dict();
  if (masters_)
    for (size_t i = 0; i < masters_->masters().size(); ++i)
      out["zero.master." + std::to_string(i)] = masters_->masters()[i].clone();
  const BucketPlan& plan = reducer_.plan();
  std::vector<int64_t> shard_numel;
  for (size_t b = 0; b < plan.buckets().size(); ++b) shard_numel.push_back(plan.shard_numel(b));
  out["zero.stage"] = i64_values({options_.stage});
  out["zero.rank"] = i64_values({reducer_.group().rank()});
  out["zero.world_size"] = i64_values({reducer_.group().size()});
  out["zero.shard_numel"] = i64_values(shard_numel);
  if (sharded_)
    for (size_t b = 0; b < plan.buckets().size(); ++b)
      out["zero.param_shard." + std::to_string(b)] = sharded_->shard(b).clone();
  return out;
}

void ZeroOptimizer::load_state_dict(const std::map<std::string, Tensor>& state) {
  const char* owner = owner_name(options_.stage);
  const int rank = reducer_.group().rank(), size = reducer_.group().size();
  const int64_t saved_size = i64_entry(state, "zero.world_size", owner).at(0);
  const int64_t saved_rank = i64_entry(state, "zero.rank", owner).at(0);
  const int64_t saved_stage = i64_entry(state, "zero.stage", owner).at(0);
  LOOM_CHECK(saved_size == size, owner, ": load_state_dict: the state was saved by rank ",
             saved_rank, " of ", saved_size, " ranks, but this group has ", size,
             ": a ZeRO state holds one rank's shards and loads only on the same number of ranks "
             "(See Note [Sharded state])");
  LOOM_CHECK(saved_rank == rank, owner, ": load_state_dict: the state was saved by rank ",
             saved_rank, " but this is rank ", rank, "; load each rank's own state");
  LOOM_CHECK(saved_stage == options_.stage, owner,
             ": load_state_dict: the state was saved by "
             "ZeRO stage ",
             saved_stage, ", not ", options_.stage);
  const BucketPlan& plan = reducer_.plan();
  std::vector<int64_t> mine;
  for (size_t b = 0; b < plan.buckets().size(); ++b) mine.push_back(plan.shard_numel(b));
  const std::vector<int64_t> saved = i64_entry(state, "zero.shard_numel", owner);
  LOOM_CHECK(saved == mine, owner, ": load_state_dict: the state's bucket shards hold ",
             list_str(saved), " elements but this optimizer's hold ", list_str(mine),
             " (a different model or bucket size)");
  std::map<std::string, Tensor> inner;
  for (const auto& [key, t] : state)
    if (key.rfind("zero.", 0) != 0) inner.emplace(key, t);
  if (sharded_) {
    for (size_t b = 0; b < plan.buckets().size(); ++b) {
      const std::string key = "zero.param_shard." + std::to_string(b);
      auto it = state.find(key);
      LOOM_CHECK(it != state.end() && it->second.defined() &&
                     it->second.shape() == sharded_->shard(b).shape() &&
                     it->second.dtype() == sharded_->shard(b).dtype(),
                 owner, ": load_state_dict: '", key, "' is missing or is not ",
                 sharded_->shard(b).str());
    }
  }
  if (masters_) {
    for (size_t i = 0; i < masters_->masters().size(); ++i) {
      const std::string key = "zero.master." + std::to_string(i);
      auto it = state.find(key);
      LOOM_CHECK(it != state.end() && it->second.defined() &&
                     it->second.shape() == masters_->masters()[i].shape() &&
                     it->second.dtype() == DType::kF32,
                 owner, ": load_state_dict: '", key, "' is missing or is not ",
                 masters_->masters()[i].str());
    }
  }
  inner_->load_state_dict(inner);  // checks its own entries before changing anything
  // The model's low-precision values are the masters rounded: the weights loaded into the
  // model (stages 1, 2) or the parameter shards below (stage 3) already hold them.
  if (masters_)
    for (size_t i = 0; i < masters_->masters().size(); ++i)
      Tensor(masters_->masters()[i]).copy_(state.at("zero.master." + std::to_string(i)));
  if (sharded_) {
    for (size_t b = 0; b < plan.buckets().size(); ++b)
      Tensor(sharded_->shard(b)).copy_(state.at("zero.param_shard." + std::to_string(b)));
    sharded_->release_all();  // a gathered copy is stale
  }
}

}  // namespace loom::parallel
