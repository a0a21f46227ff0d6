#include "parallel/ddp.h"

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

NamedParams shared_parameters(nn::Module& module, const DdpOptions& o) {
  NamedParams params = module.named_parameters();
  if (!o.own_parameters) return params;
  NamedParams shared;
  for (auto& p : params)
    if (!o.own_parameters(p.first)) shared.push_back(p);
  return shared;
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(nn::Module& module,
                                                 std::shared_ptr<comm::Communicator> group,
                                                 const DdpOptions& options)
    : module_(module),
      reducer_("DDP",
               agreed_parameters(shared_parameters(module, options), group.get(),
                                 options.check_replicas, "DDP"),
               group, reducer_options(options)) {}

TrainingMemory DistributedDataParallel::memory() const {
  TrainingMemory m;
  for (const auto& [name, p] : reducer_.params()) m.parameters += p.nbytes();
  m.gradients = reducer_.gradient_bytes();
  return m;
}

}  // namespace loom::parallel
