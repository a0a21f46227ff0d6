#include "parallel/zero.h"

#include <cmath>

#include "optimizer/clip_grad.h"
#include "parallel/replicas.h"

namespace loom::parallel {
namespace {

const char* owner_name(int stage) {
  switch (stage) {
    case 1:
      return "ZeRO-1";
    case 2:
      return "ZeRO-2";
    default:
      return "ZeRO";
  }
}

NamedParams prepared_parameters(nn::Module& module, comm::Communicator* group,
                                const ZeroOptions& o) {
  LOOM_CHECK(o.stage == 1 || o.stage == 2, "ZeRO: stage must be 1 or 2, got ", o.stage,
             " (stage 0 is plain DDP)");
  return agreed_parameters(module, group, o.check_replicas, owner_name(o.stage));
}

GradReducerOptions reducer_options(const ZeroOptions& o) {
  GradReducerOptions r;
  r.mode = o.stage == 1 ? GradMode::kShardKeep : GradMode::kShardOnly;
  r.bucket_bytes = bucket_bytes_from_mb(o.bucket_mb, owner_name(o.stage));
  r.grad_accum = o.grad_accum;
  r.overlap = o.overlap;
  return r;
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(nn::Module& module, std::shared_ptr<comm::Communicator> group,
                             const ZeroOptions& options, const OptimizerFactory& make_optimizer)
    : Optimizer(owner_name(options.stage), module.parameters(), 0.0),
      options_(options),
      reducer_(owner_name(options.stage), prepared_parameters(module, group.get(), options), group,
               reducer_options(options)) {
  LOOM_CHECK(make_optimizer != nullptr, name_, ": no optimizer factory given");
  const BucketPlan& plan = reducer_.plan();
  const NamedParams& named = reducer_.params();
  const int rank = reducer_.group().rank();
  for (size_t b = 0; b < plan.buckets().size(); ++b) {
    const Bucket& bucket = plan.buckets()[b];
    Tensor flat = Tensor::zeros({bucket.padded}, DType::kF32, named[0].second.device());
    for (const BucketSlot& s : bucket.slots) {
      Tensor p = named[s.param].second;
      Tensor view = flat.narrow(0, s.offset, s.numel).reshape(p.shape());
      view.copy_(p.detach());
      p.set_data(view);
    }
    flat_params_.push_back(flat);
  }
  std::vector<Tensor> masters;
  for (const ShardPiece& sp : plan.shard_pieces(rank)) {
    const int64_t shard_start = int64_t(rank) * plan.shard_numel(sp.bucket);
    Piece piece{sp.param,
                flat_params_[sp.bucket].narrow(0, shard_start + sp.shard_offset, sp.numel),
                reducer_.shard_grad(sp.bucket).narrow(0, sp.shard_offset, sp.numel)};
    masters.push_back(piece.master);
    pieces_.push_back(std::move(piece));
  }
  inner_ = make_optimizer(std::move(masters));
  LOOM_CHECK(inner_ != nullptr, name_, ": the optimizer factory returned null");
  lr_ = inner_->lr();
  name_ = inner_->name();  // what is being stepped; errors of the sharding itself name the stage
}

void ZeroOptimizer::finish_gradients() {
  if (reducer_.finished()) return;
  reducer_.finish();
  // The wrapped optimizer's gradients: this rank's shard, none for a parameter no rank used.
  for (Piece& p : pieces_) p.master.set_grad(reducer_.used_anywhere(p.param) ? p.grad : Tensor());
}

double ZeroOptimizer::clip_grad_norm(double max_norm) {
  finish_gradients();
  const std::vector<Tensor>& mine = inner_->params();
  // Each element sits in exactly one rank's shard, so the sum over ranks counts it once.
  Tensor total = Tensor::full({1}, optim::grad_sum_of_squares(mine), DType::kF32);
  reducer_.group().allreduce(total)->wait();
  const double norm = std::sqrt(total.item());
  optim::scale_grads_to_norm(mine, norm, max_norm);
  return norm;
}

void ZeroOptimizer::step() {
  finish_gradients();
  inner_->set_lr(lr_);
  inner_->step();
  for (Piece& p : pieces_) p.master.set_grad(Tensor());

  // Every rank's updated shards back into every rank's parameters, in place.
  const BucketPlan& plan = reducer_.plan();
  const int rank = reducer_.group().rank();
  std::vector<comm::WorkPtr> works;
  for (size_t b = 0; b < flat_params_.size(); ++b) {
    const int64_t size = plan.shard_numel(b);
    Tensor mine = flat_params_[b].narrow(0, int64_t(rank) * size, size);
    works.push_back(reducer_.group().allgather(mine, flat_params_[b]));
  }
  comm::wait_all(works);
}

TrainingMemory ZeroOptimizer::memory() const {
  TrainingMemory m;
  for (const Tensor& t : flat_params_) m.parameters += t.nbytes();
  m.gradients = reducer_.gradient_bytes();
  m.optimizer_state = inner_->state_bytes();
  return m;
}

std::vector<std::pair<std::string, Tensor>> ZeroOptimizer::state() const { return inner_->state(); }

}  // namespace loom::parallel
