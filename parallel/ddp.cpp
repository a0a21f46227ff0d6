#include "parallel/ddp.h"

#include "core/ops.h"
#include "parallel/replicas.h"

namespace loom::parallel {

namespace {

GradReducerOptions reducer_options(const DdpOptions& o) {
  GradReducerOptions r;
  r.mode = GradMode::kAllreduce;
  r.bucket_bytes = bucket_bytes_from_mb(o.bucket_mb, "DDP");
  r.grad_accum = o.grad_accum;
  r.overlap = o.overlap;
  return r;
}

// The module's parameters that are (own = false) or are not (own = true) shared by every rank.
NamedParams parameters_of(nn::Module& module, const DdpOptions& o, bool own) {
  return parameters_by_owner(module, o.own_parameters, own);
}

NamedParams agreed_own_parameters(nn::Module& module, const DdpOptions& o) {
  NamedParams own = parameters_of(module, o, true);
  if (!o.own_replicas || o.own_replicas->size() == 1) return own;
  return agreed_parameters(std::move(own), o.own_replicas.get(), o.check_replicas,
                           "DDP (own parameters)");
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(nn::Module& module,
                                                 std::shared_ptr<comm::Communicator> group,
                                                 const DdpOptions& options)
    : module_(module),
      reducer_("DDP",
               agreed_parameters(parameters_of(module, options, false), group.get(),
                                 options.check_replicas, "DDP"),
               group, reducer_options(options)),
      own_(agreed_own_parameters(module, options)),
      own_replicas_(options.own_replicas) {
  LOOM_CHECK(!own_replicas_ || own_replicas_->size() <= group->size(), "DDP: own_replicas ('",
             own_replicas_ ? own_replicas_->name() : "", "', ", own_replicas_->size(),
             " ranks) is larger than the group ('", group->name(), "', ", group->size(),
             " ranks); it must hold some of the group's ranks");
}

// Note [Own parameters under data parallelism]
// Each rank's loss is the mean over its part of the batch, and the step is the single process's
// when the gradient is the group's mean of the ranks' gradients (what the bucketed allreduce
// gives the shared parameters). An own parameter (an expert) is touched by every rank's loss
// through the expert-parallel exchange, so its gradient on its rank already sums the losses of
// its ep group's ranks; summed over its replicas (the other ep groups' copies) it sums every
// rank's, and divided by the group's size it is that same mean. Every replica takes part, with
// zeros for a parameter its rank's backward did not reach.
void DistributedDataParallel::finish() {
  reducer_.finish();
  const bool replicated = own_replicas_ && own_replicas_->size() > 1;
  const double mean = 1.0 / double(reducer_.group().size());
  for (auto& [name, p] : own_) {
    if (replicated) {
      Tensor g = p.grad().defined() ? p.grad() : Tensor::zeros(p.shape(), p.dtype(), p.device());
      own_replicas_->allreduce(g)->wait();
      p.set_grad(g);
    }
    if (p.grad().defined() && mean != 1.0) {
      Tensor g = p.grad();
      scale_(g, mean);
    }
  }
}

TrainingMemory DistributedDataParallel::memory() const {
  TrainingMemory m;
  for (const auto& [name, p] : reducer_.params()) m.parameters += p.nbytes();
  m.gradients = reducer_.gradient_bytes();
  for (const auto& [name, p] : own_) {  // held by backward, one gradient each
    m.parameters += p.nbytes();
    m.gradients += p.nbytes();
  }
  return m;
}

}  // namespace loom::parallel
