#include "parallel/grad_reducer.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/autograd.h"
#include "core/ops.h"

namespace loom::parallel {

// Note [Bucket launch order]
// Nonblocking collectives must be posted in the same order on every rank of a group. Gradients
// may arrive in a different order on different ranks (and a bucket holding an unused parameter
// fills only when the micro-batch ends), so buckets are launched strictly in index order: a
// bucket that fills early waits until every bucket before it has been launched. Each hook also
// polls the reductions in flight, since MPI progresses a nonblocking collective only while it is
// called.

namespace {

using Clock = std::chrono::steady_clock;

// Note [ZeRO-2 keeps one bucket in flight]
// ZeRO-2's point is memory: a rank keeps only its shard of the gradients. Each bucket's gradients
// are staged whole in a temporary bucket and reduce-scattered, and the temporary lives until the
// reduce-scatter completes. So a rank keeps at most kShardOnlyBucketsInFlight launched buckets
// besides the one filling: launching one more waits for the oldest (a bucket reduces while the
// next fills), and a backward's first gradient for a bucket waits for what earlier backwards
// launched (a bucket no gradient reached gets its zeros at its launch, under the same rule, one
// at a time). (Left to the step's end, a model in a few buckets held whole gradients once per
// micro-batch of gradient accumulation: with 4, a rank's peak grew by 3 copies of the model's
// gradients, more than DDP holds.)
constexpr size_t kShardOnlyBucketsInFlight = 1;

}  // namespace

BucketPlan plan_buckets(const NamedParams& params, const GradReducerOptions& o, int group_size) {
  std::vector<Tensor> tensors;
  for (auto& [name, t] : params) tensors.push_back(t);
  // Sharded modes split every bucket into one equal shard per rank.
  const int64_t pad_to = o.mode == GradMode::kAllreduce ? 1 : group_size;
  if (!o.bucket_groups.empty()) return BucketPlan(tensors, o.bucket_groups, pad_to);
  return BucketPlan(tensors, o.bucket_bytes, pad_to);
}

size_t bucket_bytes_from_mb(double mb, const char* owner) {
  LOOM_CHECK(std::isfinite(mb) && mb > 0, owner, ": bucket size must be positive MiB, got ", mb);
  return std::max<size_t>(1, size_t(mb * double(1 << 20)));
}

GradReducer::GradReducer(const char* owner, NamedParams params,
                         std::shared_ptr<comm::Communicator> group,
                         const GradReducerOptions& options)
    : owner_(owner),
      params_(std::move(params)),
      group_(std::move(group)),
      options_(options),
      plan_(plan_buckets(params_, options, group_ ? group_->size() : 1)),
      rank_(group_ ? group_->rank() : 0),
      alive_(std::make_shared<bool>(true)) {
  LOOM_CHECK(group_ != nullptr, owner_, ": the group communicator is null");
  LOOM_CHECK(options_.grad_accum >= 1, owner_, ": grad_accum must be >= 1, got ",
             options_.grad_accum);
  const bool units = !options_.bucket_units.empty();
  LOOM_CHECK(!units || (options_.hooks && options_.mode == GradMode::kShardOnly &&
                        options_.bucket_units.size() == options_.bucket_groups.size()),
             owner_, ": bucket_units need hooks, kShardOnly and one unit per bucket group (",
             options_.bucket_units.size(), " for ", options_.bucket_groups.size(), ")");
  const size_t n = params_.size();
  for (size_t i = 0; i < n; ++i) {
    const Tensor& p = params_[i].second;
    LOOM_CHECK(p.requires_grad(), owner_, ": parameter '", params_[i].first,
               "' does not require a gradient");
    LOOM_CHECK(p.dtype() == params_[0].second.dtype() && p.device() == params_[0].second.device(),
               owner_, ": parameters must share one dtype and device; '", params_[i].first, "' is ",
               p.str(), " but '", params_[0].first, "' is ", params_[0].second.str());
  }
  const DType dt = n ? params_[0].second.dtype() : DType::kF32;
  const Device dev = n ? params_[0].second.device() : Device::cpu();
  const auto& buckets = plan_.buckets();
  for (size_t b = 0; b < buckets.size(); ++b) {
    if (options_.mode != GradMode::kShardOnly)
      buckets_.push_back(Tensor::zeros({buckets[b].padded}, dt, dev));
    if (options_.mode != GradMode::kAllreduce) {
      // kShardKeep: the shard is a view of the bucket (reduce-scatter writes it in place).
      shard_grads_.push_back(
          options_.mode == GradMode::kShardKeep
              ? buckets_[b].narrow(0, rank_ * plan_.shard_numel(b), plan_.shard_numel(b))
              : Tensor::zeros({plan_.shard_numel(b)}, dt, dev));
    }
  }
  staging_.resize(buckets.size());
  ready_in_bucket_.assign(buckets.size(), 0);
  ready_.assign(n, 0);
  used_.assign(n, 0);
  used_anywhere_.assign(n, 0);
  if (units) {  // BucketPlan keeps bucket_groups' order: bucket g is group g
    unit_of_bucket_ = options_.bucket_units;
    for (size_t b = 0; b < buckets.size(); ++b) {
      const int u = unit_of_bucket_[b];
      LOOM_CHECK(u >= -1, owner_, ": bucket unit ", u, " (units are >= 0, or -1)");
      if (u < 0) continue;
      if (unit_buckets_.size() <= size_t(u)) unit_buckets_.resize(size_t(u) + 1);
      unit_buckets_[size_t(u)].push_back(b);
    }
    unit_next_.assign(unit_buckets_.size(), 0);
  }
  for (size_t i = 0; i < n && options_.hooks; ++i) {
    std::weak_ptr<bool> alive = alive_;
    Tensor(params_[i].second).register_grad_ready_hook([this, alive, units, i](const Tensor&) {
      if (!alive.lock()) return;
      if (units)
        on_unit_gradient(i);
      else
        on_gradient(i);
    });
  }
  // Without hooks, in the buckets (accumulate_in_buckets): a gradient's arrival says the
  // parameter was used, since its .grad is defined either way.
  for (size_t i = 0; i < n && !options_.hooks && options_.mode == GradMode::kShardKeep; ++i) {
    std::weak_ptr<bool> alive = alive_;
    Tensor(params_[i].second).register_grad_ready_hook([this, alive, i](const Tensor&) {
      if (alive.lock() && in_buckets_) used_[i] = 1;
    });
  }
}

// Note [Accumulating in the buckets]
// A pipeline's ZeRO-1 (kShardKeep without hooks) lets the executor's backwards accumulate every
// micro-batch's gradients in the parameters' .grad and reduce-scatters them at the step's end.
// Fresh .grad tensors beside the persistent buckets would hold the step's gradients twice; so
// accumulate_in_buckets() points each .grad at its zeroed bucket slot first, autograd adds into it
// in place, and reduce_accumulated() finds them there (no copy). A parameter that got no gradient
// keeps a defined zero .grad: the grad-ready hooks above mark the used ones, and an unused one's
// slot reduces as zeros and ends with no gradient where no rank used it (Note [Unused
// parameters]), as before.
void GradReducer::accumulate_in_buckets() {
  LOOM_CHECK(!options_.hooks && options_.mode == GradMode::kShardKeep, owner_,
             ": accumulate_in_buckets() is for ZeRO-1 without hooks (a pipeline's)");
  NoGradGuard no_grad;
  start_external_step();
  for (Tensor& b : buckets_) b.zero_();
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor p = params_[i].second;
    const BucketSlot& s = plan_.slot_of(i);
    p.set_grad(buckets_[plan_.bucket_of(i)].narrow(0, s.offset, s.numel).reshape(p.shape()));
  }
  in_buckets_ = true;
}

GradReducer::~GradReducer() {
  *alive_ = false;
  // Reductions still in flight (an exception unwound past finish()) are waited by their Works.
}

std::string GradReducer::describe(size_t param) const {
  return detail::str_cat("'", params_[param].first, "'");
}

bool GradReducer::reduces_this_micro_batch() const {
  return options_.mode == GradMode::kShardOnly || micro_ == options_.grad_accum - 1;
}

void GradReducer::start_external_step() {
  if (external_started_) return;
  external_started_ = true;
  std::fill(used_.begin(), used_.end(), 0);
  if (options_.mode == GradMode::kShardOnly)
    for (Tensor& s : shard_grads_) s.zero_();
}

void GradReducer::on_unit_gradient(size_t i) {
  const size_t b = plan_.bucket_of(i);
  const int unit = unit_of_bucket_[b];
  if (unit < 0) return;  // accumulates in the parameter; reduced at the step's end
  start_external_step();
  LOOM_CHECK(!ready_[i], owner_, ": parameter ", describe(i),
             " received two gradients in one backward of its chunk");
  ready_[i] = used_[i] = 1;
  stage_gradient(i);
  if (++ready_in_bucket_[b] == int(plan_.buckets()[b].slots.size())) launch_ready_in_unit(unit);
  complete_finished();
}

void GradReducer::launch_ready_in_unit(int unit) {
  const std::vector<size_t>& mine = unit_buckets_[size_t(unit)];
  size_t& next = unit_next_[size_t(unit)];
  while (next < mine.size() &&
         ready_in_bucket_[mine[next]] == int(plan_.buckets()[mine[next]].slots.size())) {
    launch(mine[next++]);
  }
}

void GradReducer::complete_finished() {
  size_t done = 0;
  while (done < pending_.size() && pending_[done].work->test()) complete(pending_[done++]);
  pending_.erase(pending_.begin(), pending_.begin() + int64_t(done));
}

const std::vector<size_t>& GradReducer::unit_buckets(int unit) const {
  static const std::vector<size_t> none;
  return unit >= 0 && size_t(unit) < unit_buckets_.size() ? unit_buckets_[size_t(unit)] : none;
}

void GradReducer::end_unit_backward(int unit) {
  LOOM_CHECK(!unit_of_bucket_.empty(), owner_,
             ": end_unit_backward() needs GradReducerOptions::bucket_units");
  LOOM_CHECK(unit >= 0, owner_, ": end_unit_backward(", unit, ")");
  start_external_step();
  if (size_t(unit) < unit_buckets_.size()) {
    const std::vector<size_t>& mine = unit_buckets_[size_t(unit)];
    for (size_t k = unit_next_[size_t(unit)]; k < mine.size(); ++k)  // not launched yet
      ready_in_bucket_[mine[k]] = int(plan_.buckets()[mine[k]].slots.size());
    launch_ready_in_unit(unit);
    // The next backward of the unit starts afresh.
    unit_next_[size_t(unit)] = 0;
    for (size_t b : mine) {
      ready_in_bucket_[b] = 0;
      for (const BucketSlot& s : plan_.buckets()[b].slots) ready_[s.param] = 0;
    }
  }
  ++unit_backwards_;
}

void GradReducer::reduce_accumulated() {
  const bool units = !unit_of_bucket_.empty();
  LOOM_CHECK(!options_.hooks || units, owner_,
             ": reduce_accumulated() is for a reducer without hooks, or with bucket_units");
  start_external_step();
  std::fill(ready_.begin(), ready_.end(), 0);
  next_launch_ = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].second.grad().defined()) continue;
    if (in_buckets_ && !used_[i]) continue;  // its zeroed slot (Note [Accumulating in the buckets])
    LOOM_CHECK(!units || unit_of_bucket_[plan_.bucket_of(i)] < 0, owner_, ": parameter ",
               describe(i),
               " holds a gradient its chunk's hooks did not take (a backward outside the "
               "executor's, or end_unit_backward missing)");
    ready_[i] = used_[i] = 1;
    stage_gradient(i);
  }
  flush_micro_batch();
  micro_ = options_.grad_accum;
  finish();
}

void GradReducer::backward(const Tensor& loss) {
  LOOM_CHECK(options_.hooks && unit_of_bucket_.empty(), owner_,
             ": this reducer takes gradients from backwards run elsewhere (a pipeline's); finish "
             "the step with reduce_accumulated()");
  LOOM_CHECK(micro_ < options_.grad_accum, owner_, ": backward() for micro-batch ", micro_ + 1,
             " but a step has ", options_.grad_accum,
             " (grad_accum); call finish() / step() after the last micro-batch");
  if (micro_ == 0) {
    std::fill(used_.begin(), used_.end(), 0);
    finished_ = false;
    if (options_.mode == GradMode::kShardOnly)
      for (Tensor& s : shard_grads_) s.zero_();
    // A sharded step consumes its gradients: what the buckets hold after a reduce-scatter is
    // no one's gradient, so none carries over into the next step.
    if (options_.mode == GradMode::kShardKeep)
      for (auto& [name, p] : params_) Tensor(p).set_grad(Tensor());
  }
  std::fill(ready_.begin(), ready_.end(), 0);
  std::fill(ready_in_bucket_.begin(), ready_in_bucket_.end(), 0);
  next_launch_ = 0;
  in_backward_ = true;
  try {
    loss.backward();
  } catch (...) {
    in_backward_ = false;
    throw;
  }
  in_backward_ = false;
  if (reduces_this_micro_batch()) flush_micro_batch();
  ++micro_;
}

void GradReducer::on_gradient(size_t i) {
  LOOM_CHECK(in_backward_, owner_, ": the gradient of ", describe(i),
             " arrived outside backward(loss); run each micro-batch's backward through the "
             "wrapper (its backward(loss)), not loss.backward()");
  LOOM_CHECK(!ready_[i], owner_, ": parameter ", describe(i),
             " received two gradients in one backward (is it used both inside and outside an "
             "activation-checkpointed region?)");
  ready_[i] = 1;
  used_[i] = 1;
  stage_gradient(i);
  const size_t b = plan_.bucket_of(i);
  if (++ready_in_bucket_[b] == int(plan_.buckets()[b].slots.size()) && options_.overlap &&
      reduces_this_micro_batch())
    launch_ready_buckets();
  poll();
}

// Moves parameter i's fresh gradient into its bucket slot.
void GradReducer::stage_gradient(size_t i) {
  Tensor p = params_[i].second;
  const Tensor g = p.grad();
  const BucketSlot& s = plan_.slot_of(i);
  const size_t b = plan_.bucket_of(i);
  if (options_.mode == GradMode::kShardOnly) {
    if (!staging_[b].defined()) {
      complete_earlier_backwards();  // See Note [ZeRO-2 keeps one bucket in flight]
      staging_[b] = Tensor::zeros({plan_.buckets()[b].padded}, g.dtype(), g.device());
    }
    staging_[b].narrow(0, s.offset, s.numel).copy_(g.detach().reshape({s.numel}));
    p.set_grad(Tensor());  // this rank keeps only its shard
    return;
  }
  Tensor view = buckets_[b].narrow(0, s.offset, s.numel).reshape(p.shape());
  const bool already_there = g.storage() == view.storage() && g.offset() == view.offset();
  if (!already_there) {
    view.copy_(g.detach());
    p.set_grad(view);  // later micro-batches accumulate in the bucket
  }
}

void GradReducer::launch_ready_buckets() {
  const auto& buckets = plan_.buckets();
  while (next_launch_ < buckets.size() &&
         ready_in_bucket_[next_launch_] == int(buckets[next_launch_].slots.size()))
    launch(next_launch_++);
}

// The end of a micro-batch that reduces: launch, in order, the buckets still waiting for a
// parameter that got no gradient (See Note [Unused parameters]).
void GradReducer::flush_micro_batch() {
  const auto& buckets = plan_.buckets();
  for (; next_launch_ < buckets.size(); ++next_launch_) {
    const size_t b = next_launch_;
    if (!unit_of_bucket_.empty() && unit_of_bucket_[b] >= 0) continue;  // end_unit_backward's
    for (const BucketSlot& s : buckets[b].slots) {
      if (ready_[s.param]) continue;
      if (options_.mode == GradMode::kShardOnly) continue;  // staging starts zeroed
      if (!used_[s.param]) {
        // Never used this step: reduce zeros. (Used in an earlier micro-batch: the slot holds
        // that accumulation already.)
        buckets_[b].narrow(0, s.offset, s.numel).zero_();
      }
    }
    launch(b);
  }
}

// The backward a launch or a staged gradient belongs to: the unit backward with bucket_units,
// else the micro-batch.
int64_t GradReducer::current_backward() const {
  return unit_of_bucket_.empty() ? int64_t(micro_) : unit_backwards_;
}

void GradReducer::complete_earlier_backwards() {
  size_t done = 0;
  while (done < pending_.size() && pending_[done].backward < current_backward())
    complete(pending_[done++]);
  pending_.erase(pending_.begin(), pending_.begin() + int64_t(done));
}

void GradReducer::launch(size_t b) {
  Pending p{b, current_backward(), nullptr, Tensor(), Tensor()};
  switch (options_.mode) {
    case GradMode::kAllreduce:
      p.work = group_->allreduce(buckets_[b], comm::AllreduceOptions{comm::ReduceOp::kAvg});
      break;
    case GradMode::kShardKeep:
      p.work = group_->reduce_scatter(buckets_[b], shard_grads_[b],
                                      comm::ReduceScatterOptions{comm::ReduceOp::kAvg});
      break;
    case GradMode::kShardOnly:
      if (!staging_[b].defined()) {    // no gradient reached it: it reduces zeros
        complete_earlier_backwards();  // See Note [ZeRO-2 keeps one bucket in flight]
        staging_[b] = Tensor::zeros({plan_.buckets()[b].padded}, shard_grads_[b].dtype(),
                                    shard_grads_[b].device());
      }
      p.input = std::move(staging_[b]);
      staging_[b] = Tensor();
      p.output = Tensor::empty({plan_.shard_numel(b)}, p.input.dtype(), p.input.device());
      p.work = group_->reduce_scatter(p.input, p.output,
                                      comm::ReduceScatterOptions{comm::ReduceOp::kAvg});
      break;
  }
  pending_.push_back(std::move(p));
  // See Note [ZeRO-2 keeps one bucket in flight].
  while (options_.mode == GradMode::kShardOnly && pending_.size() > kShardOnlyBucketsInFlight) {
    complete(pending_.front());
    pending_.erase(pending_.begin());
  }
}

void GradReducer::complete(Pending& p) {
  p.work->wait();
  if (options_.mode == GradMode::kShardOnly) {
    NoGradGuard no_grad;
    Tensor acc = shard_grads_[p.bucket];
    add_(acc, p.output);
  }
  p.input = Tensor();
  p.output = Tensor();
}

void GradReducer::poll() {
  for (Pending& p : pending_) p.work->test();
}

size_t GradReducer::gradient_bytes() const {
  size_t total = 0;
  if (options_.mode == GradMode::kShardOnly)
    for (const Tensor& t : shard_grads_) total += t.nbytes();
  else
    for (const Tensor& t : buckets_) total += t.nbytes();
  return total;
}

void GradReducer::finish() {
  LOOM_CHECK(micro_ == options_.grad_accum, owner_, ": finish() after ", micro_, " of ",
             options_.grad_accum,
             " micro-batches; run backward(loss) once per micro-batch before finishing the step");
  const auto start = Clock::now();
  for (Pending& p : pending_) complete(p);
  pending_.clear();
  if (options_.replicas && options_.mode != GradMode::kAllreduce) {
    // Each shard: the group's average (above), then the average of that over the replicas.
    std::vector<comm::WorkPtr> works;
    for (Tensor& g : shard_grads_)
      works.push_back(
          options_.replicas->allreduce(g, comm::AllreduceOptions{comm::ReduceOp::kAvg}));
    comm::wait_all(works);
  }
  exposed_wait_s_ = std::chrono::duration<double>(Clock::now() - start).count();

  // See Note [Unused parameters].
  const int64_t n = int64_t(params_.size());
  Tensor flags = Tensor::empty({n}, DType::kI32);
  auto* f = flags.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) f[i] = used_[i];
  group_->allreduce(flags, comm::AllreduceOptions{comm::ReduceOp::kMax})->wait();
  if (options_.replicas && options_.mode != GradMode::kAllreduce)
    options_.replicas->allreduce(flags, comm::AllreduceOptions{comm::ReduceOp::kMax})->wait();
  for (int64_t i = 0; i < n; ++i) used_anywhere_[i] = char(f[i] != 0);

  if (options_.mode == GradMode::kAllreduce) {
    for (int64_t i = 0; i < n; ++i) {
      Tensor p = params_[i].second;
      if (!used_anywhere_[i]) {
        p.set_grad(Tensor());
      } else if (!used_[i]) {  // others used it: its average is in the slot
        const BucketSlot& s = plan_.slot_of(size_t(i));
        p.set_grad(
            buckets_[plan_.bucket_of(size_t(i))].narrow(0, s.offset, s.numel).reshape(p.shape()));
      }
    }
  }
  micro_ = 0;
  finished_ = true;
  external_started_ = false;
  in_buckets_ = false;
  unit_backwards_ = 0;
}

}  // namespace loom::parallel
