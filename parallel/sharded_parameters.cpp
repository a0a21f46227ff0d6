#include "parallel/sharded_parameters.h"

#include <algorithm>
#include <map>

#include "core/autograd.h"

namespace loom::parallel {
namespace {

void collect_units(nn::Module& m, std::vector<nn::Module*>& units) {
  const bool is_list = dynamic_cast<nn::ModuleList*>(&m) != nullptr;
  for (const auto& [name, child] : m.children()) {
    if (is_list) units.push_back(child.get());
    collect_units(*child, units);
  }
}

bool contains(const std::vector<size_t>& v, size_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

Zero3Layout zero3_layout(nn::Module& root, const NamedParams& params) {
  std::vector<nn::Module*> all{&root};
  collect_units(root, all);
  std::map<const TensorImpl*, size_t> index;
  for (size_t i = 0; i < params.size(); ++i) index[params[i].second.impl().get()] = i;
  // Outer units come first, so an inner unit claiming a parameter overrides its parents.
  std::vector<size_t> owner(params.size(), SIZE_MAX);
  for (size_t u = 0; u < all.size(); ++u)
    for (const Tensor& p : all[u]->parameters()) {
      auto it = index.find(p.impl().get());
      if (it != index.end()) owner[it->second] = u;
    }
  std::vector<std::vector<size_t>> owned(all.size());
  for (size_t i = params.size(); i-- > 0;) {
    LOOM_CHECK(owner[i] != SIZE_MAX, "ZeRO-3: parameter '", params[i].first,
               "' is not in the wrapped module");
    owned[owner[i]].push_back(i);  // reverse registration order
  }
  std::vector<size_t> order;
  for (size_t u = 0; u < all.size(); ++u)
    if (!owned[u].empty()) order.push_back(u);
  // Backward finishes a unit when its first-registered parameter gets its gradient.
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return owned[a].back() > owned[b].back(); });
  Zero3Layout layout;
  for (size_t u : order) {
    layout.units.push_back(all[u]);
    layout.parameters.push_back(owned[u]);
  }
  return layout;
}

Zero3Layout zero3_layout_by_child(nn::Module& root, const NamedParams& params) {
  std::map<const TensorImpl*, size_t> index;
  for (size_t i = 0; i < params.size(); ++i) index[params[i].second.impl().get()] = i;
  std::vector<char> claimed(params.size(), 0);
  Zero3Layout layout;
  for (const auto& [name, child] : root.children()) {
    NamedParams mine;  // the child's, in the order of `params`
    std::vector<size_t> global;
    std::vector<char> in_child(params.size(), 0);
    for (const Tensor& p : child->parameters()) {
      auto it = index.find(p.impl().get());
      if (it != index.end()) in_child[it->second] = 1;
    }
    for (size_t i = 0; i < params.size(); ++i) {
      if (!in_child[i]) continue;
      mine.push_back(params[i]);
      global.push_back(i);
      claimed[i] = 1;
    }
    if (mine.empty()) continue;
    Zero3Layout part = zero3_layout(*child, mine);
    for (size_t u = 0; u < part.units.size(); ++u) {
      layout.units.push_back(part.units[u]);
      std::vector<size_t> ids;
      for (size_t k : part.parameters[u]) ids.push_back(global[k]);
      layout.parameters.push_back(std::move(ids));
    }
  }
  for (size_t i = 0; i < params.size(); ++i)
    LOOM_CHECK(claimed[i], "ZeRO-3: parameter '", params[i].first,
               "' belongs to no child module of the wrapped module (by child, each child is laid "
               "out apart)");
  return layout;
}

ShardedParameters::ShardedParameters(const NamedParams& params, const BucketPlan& plan,
                                     std::vector<nn::Module*> units,
                                     std::shared_ptr<comm::Communicator> gather_group)
    : group_(std::move(gather_group)),
      units_(std::move(units)),
      alive_(std::make_shared<bool>(true)) {
  const size_t n = plan.buckets().size();
  LOOM_CHECK(units_.size() == n, "ZeRO-3: ", units_.size(), " units for ", n, " buckets");
  const int rank = group_->rank();
  in_flight_.resize(n);
  resident_.assign(n, 0);
  grads_expected_.assign(n, 0);
  grads_seen_.assign(n, 0);
  for (size_t b = 0; b < n; ++b) {
    const Bucket& bucket = plan.buckets()[b];
    const int64_t size = plan.shard_numel(b);
    Tensor full =
        Tensor::zeros({bucket.padded}, params[0].second.dtype(), params[0].second.device());
    for (const BucketSlot& s : bucket.slots) {
      Tensor p = params[s.param].second;
      Tensor view = full.narrow(0, s.offset, s.numel).reshape(p.shape());
      view.copy_(p.detach());
      p.set_data(view);
      std::weak_ptr<bool> alive = alive_;
      p.register_grad_ready_hook([this, alive, b](const Tensor&) {
        if (alive.lock()) on_gradient(b);
      });
    }
    grads_expected_[b] = int(bucket.slots.size());
    shards_.push_back(full.narrow(0, int64_t(rank) * size, size).clone());
    gathered_.push_back(full);
    gathered_from_.push_back(shards_.back().storage()->version());
    gathered_version_.push_back(full.storage()->version());
    full.storage()->release();  // See Note [Released parameter memory]

    nn::Module* unit = units_[b];
    std::weak_ptr<bool> alive = alive_;
    hooks_.emplace_back(unit, unit->add_forward_pre_hook([this, alive, b](nn::Module&) {
      if (alive.lock()) pre_forward(b);
    }));
    hooks_.emplace_back(unit,
                        unit->add_forward_hook([this, alive, b](nn::Module&, const Tensor& y) {
                          return alive.lock() ? post_forward(b, y) : y;
                        }));
  }
}

ShardedParameters::~ShardedParameters() {
  for (auto& [module, handle] : hooks_) module->remove_hook(handle);
  *alive_ = false;
  alive_.reset();
}

void ShardedParameters::start_gather(size_t b) {
  if (resident_[b]) return;
  gathered_[b].storage()->materialize();
  resident_[b] = 1;
  // See Note [ZeRO-3 re-gathers]: only new values invalidate what backward saved.
  gathered_version_[b] = gathered_[b].storage()->version();
  const uint64_t shard_version = shards_[b].storage()->version();
  if (shard_version != gathered_from_[b]) {
    ++gathered_version_[b];
    gathered_from_[b] = shard_version;
  }
  Tensor out = gathered_[b];
  in_flight_[b] = group_->allgather(shards_[b], out);
}

void ShardedParameters::gather(size_t b) {
  start_gather(b);
  if (in_flight_[b]) {
    in_flight_[b]->wait();
    in_flight_[b] = nullptr;
    gathered_[b].storage()->restore_version(gathered_version_[b]);
  }
}

void ShardedParameters::release(size_t b) {
  if (in_flight_[b]) {  // a prefetch no one used: the collective must still complete
    in_flight_[b]->wait();
    in_flight_[b] = nullptr;
    gathered_[b].storage()->restore_version(gathered_version_[b]);
  }
  gathered_[b].storage()->release();
  resident_[b] = 0;
}

void ShardedParameters::prefetch_after(size_t b, const std::vector<size_t>& order) {
  auto it = std::find(order.begin(), order.end(), b);
  if (it != order.end() && it + 1 != order.end()) start_gather(*(it + 1));
}

void ShardedParameters::pre_forward(size_t b) {
  gather(b);
  if (!backward_seen_.empty()) return;  // recomputation inside backward (checkpointing)
  if (contains(forward_seen_, b)) {     // a new forward without a backward in between (eval)
    forward_order_ = std::move(forward_seen_);
    forward_seen_.clear();
  }
  forward_seen_.push_back(b);
  prefetch_after(b, forward_order_);
}

Tensor ShardedParameters::post_forward(size_t b, const Tensor& output) {
  Tensor out = output;
  if (autograd::grad_enabled() && output.defined() && output.requires_grad()) {
    out = make_view(output, output.shape(), output.strides(), output.offset());
    std::weak_ptr<bool> alive = alive_;
    autograd::record(out, "zero3_gather", {output}, {}, [this, alive, b](const Tensor& g) {
      if (alive.lock()) pre_backward(b);
      return std::vector<Tensor>{g};
    });
    autograd::mark_view(out, output);  // it shares output's memory
  }
  release(b);
  return out;
}

void ShardedParameters::pre_backward(size_t b) {
  gather(b);
  backward_seen_.push_back(b);
  prefetch_after(b, backward_order_);
}

void ShardedParameters::on_gradient(size_t b) {
  // Each backward through the unit brings every parameter's gradient once (a pipeline's chunk
  // sees one backward per micro-batch before release_all).
  if (++grads_seen_[b] == grads_expected_[b]) {
    grads_seen_[b] = 0;
    release(b);
  }
}

void ShardedParameters::release_all() {
  for (size_t b = 0; b < gathered_.size(); ++b) release(b);
  std::fill(grads_seen_.begin(), grads_seen_.end(), 0);
  if (!forward_seen_.empty()) forward_order_ = std::move(forward_seen_);
  if (!backward_seen_.empty()) backward_order_ = std::move(backward_seen_);
  forward_seen_.clear();
  backward_seen_.clear();
}

void ShardedParameters::gather_all() {
  for (size_t b = 0; b < gathered_.size(); ++b) start_gather(b);
  for (size_t b = 0; b < gathered_.size(); ++b) gather(b);
}

size_t ShardedParameters::resident_bytes() const {
  size_t total = 0;
  for (size_t b = 0; b < shards_.size(); ++b)
    total += shards_[b].nbytes() + (resident_[b] ? gathered_[b].nbytes() : 0);
  return total;
}

}  // namespace loom::parallel
