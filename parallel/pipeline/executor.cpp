#include "parallel/pipeline/executor.h"

#include <algorithm>
#include <chrono>
#include <map>

#include "core/autograd.h"
#include "core/ops.h"

namespace loom::parallel::pipeline {
namespace {

// What one micro-batch on one chunk keeps between its actions.
struct Slot {
  Tensor input;        // the received activation (a leaf requiring a gradient), or tokens
  Tensor output;       // the forward's output (last stage: the scaled loss)
  Tensor grad_output;  // the received gradient of the output
  Tensor extra_loss;   // StageChunk::extra_loss of this forward
  comm::WorkPtr recv_activation, recv_grad;
};

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Waits for a posted receive and records the wait as the receive's span.
void wait_timed(const comm::WorkPtr& work, const Action& receive, std::vector<TimedAction>& out) {
  const double start = now();
  work->wait();
  out.push_back(TimedAction{receive, start, now()});
}

// Polls a just-posted send for up to 200 us (See Note [Progress between actions]): a peer
// already waiting for it takes it now, not after this rank's next compute action.
void push_briefly(const comm::WorkPtr& send) {
  const double until = now() + 200e-6;
  while (!send->test() && now() < until) {
  }
}

bool is_compute(ActionKind kind) {
  return kind == ActionKind::kForward || kind == ActionKind::kBackward ||
         kind == ActionKind::kWeightGrad;
}

}  // namespace

// Note [Progress between actions]
// MPI moves a large message only inside MPI calls on both ranks (over shared memory without a
// single-copy mechanism, every fragment is copied in by the sender and out by the receiver), so a
// send posted before a forward would sit until the sender's next wait, and a receive posted
// early until the receiver's: measured on 2 ranks of the development VM, GPipe's first
// activation reached the next stage only after all four forwards (bubble 0.50 against the
// validator's 0.20; 1F1B 0.25-0.35). So before every action the executor tests each posted send
// and receive not yet known complete (one pass of MPI's progress, which moves what the peer is
// ready for), and after posting a send it polls it for up to 200 us, so a peer already waiting
// takes the message at once. On those 2 ranks (GPT 4 x 256, 4 micro-batches) a GPipe step went
// from 435-468 ms to 299-307 and a 1F1B step from 301-322 to 278-297, against 290 and 280 with
// Open MPI's single-copy transfers (CMA) on. Inside a compute action the transfers move too, at
// the granularity of its ops (Note [Progress during compute], core/progress.cpp).
//
// Note [Receives posted early]
// A schedule places each receive (RA, RG) just before the compute that consumes it, which is
// where the data must be there. Posted only there, the transfer could not overlap anything: the
// F or B would wait for the whole message. So the executor posts each receive one compute
// earlier: before the last compute action that precedes the receive in the list (or at the
// receive itself when none does), and the consumer waits for it late, as before. Posting a
// non-blocking receive earlier cannot deadlock a list the validator accepted (it only changes
// when a buffer exists, not what any rank blocks on), and it holds at most one extra activation
// buffer per receive in flight. Tags name (kind, micro-batch, pipeline, stage), so the order of
// posting does not matter to the matching.
std::vector<int> receive_posts(const std::vector<Action>& actions) {
  std::vector<int> post_before(actions.size(), -1);
  int last_compute = -1;
  for (size_t i = 0; i < actions.size(); ++i) {
    const ActionKind kind = actions[i].kind;
    if (kind == ActionKind::kRecvActivation || kind == ActionKind::kRecvGrad)
      post_before[i] = last_compute >= 0 ? last_compute : int(i);
    if (is_compute(kind)) last_compute = int(i);
  }
  return post_before;
}

PipelineExecutor::PipelineExecutor(Schedule schedule, std::shared_ptr<comm::Communicator> pp,
                                   std::vector<StageChunk> chunks, Shape activation, DType dtype)
    : schedule_(std::move(schedule)),
      pp_(std::move(pp)),
      chunks_(std::move(chunks)),
      activation_(std::move(activation)),
      dtype_(dtype) {
  LOOM_CHECK(pp_ != nullptr, "PipelineExecutor: the pipeline group is null");
  LOOM_CHECK(pp_->size() == schedule_.ranks, "PipelineExecutor: schedule '", schedule_.name,
             "' is for ", schedule_.ranks, " ranks but the pipeline group has ", pp_->size());
  rank_ = pp_->rank();
  LOOM_CHECK(int(chunks_.size()) == schedule_.chunks_per_rank(),
             "PipelineExecutor: ", chunks_.size(), " chunks given for the schedule's ",
             schedule_.chunks_per_rank());
  for (const Action& a : schedule_.actions[size_t(rank_)])
    LOOM_CHECK(a.kind != ActionKind::kWeightGrad,
               "PipelineExecutor: split weight-gradient actions (W) are not supported yet");
}

int PipelineExecutor::tag(bool gradient, int microbatch, int pipeline, int stage) const {
  return ((int(gradient) * schedule_.microbatches + microbatch) * schedule_.pipelines + pipeline) *
             schedule_.stages +
         stage;
}

double PipelineExecutor::run(const std::vector<Tensor>& tokens, const std::vector<Tensor>& targets,
                             const std::vector<double>& weights_in) {
  const int m = schedule_.microbatches;
  LOOM_CHECK(int(tokens.size()) == m && int(targets.size()) == m, "PipelineExecutor: ", m,
             " micro-batches in the schedule but ", tokens.size(), " token and ", targets.size(),
             " target tensors given");
  LOOM_CHECK(weights_in.empty() || int(weights_in.size()) == m,
             "PipelineExecutor: ", weights_in.size(), " loss weights for ", m, " micro-batches");
  const std::vector<double> weights =
      weights_in.empty() ? std::vector<double>(size_t(m), 1.0 / m) : weights_in;
  const std::vector<ChunkPlace>& places = schedule_.chunks[size_t(rank_)];
  const int last = schedule_.stages - 1;
  std::map<std::pair<int, int>, Slot> slots;  // (microbatch, chunk)
  std::vector<comm::WorkPtr> sends, pending;  // pending: posted, not known complete
  std::vector<Tensor> in_flight;              // buffers of posted sends
  double loss_sum = 0;
  timeline_.clear();
  std::map<std::pair<int, int>, Action> receives;  // (microbatch, chunk) -> its RA / RG
  std::map<std::pair<int, int>, Action> grad_receives;
  const std::vector<Action>& actions = schedule_.actions[size_t(rank_)];
  // Posts a receive into its slot's buffer (See Note [Receives posted early]).
  auto post_receive = [&](const Action& a) {
    const ChunkPlace& place = places[size_t(a.chunk)];
    Slot& slot = slots[{a.microbatch, a.chunk}];
    if (a.kind == ActionKind::kRecvActivation) {
      slot.input = Tensor::empty(activation_, dtype_);
      slot.recv_activation = pp_->recv(slot.input, a.peer,
                                       {tag(false, a.microbatch, place.pipeline, place.stage - 1)});
      pending.push_back(slot.recv_activation);
      receives[{a.microbatch, a.chunk}] = a;
    } else {
      slot.grad_output = Tensor::empty(activation_, dtype_);
      slot.recv_grad = pp_->recv(slot.grad_output, a.peer,
                                 {tag(true, a.microbatch, place.pipeline, place.stage + 1)});
      pending.push_back(slot.recv_grad);
      grad_receives[{a.microbatch, a.chunk}] = a;
    }
  };
  std::vector<std::vector<int>> posted_at(actions.size());  // i -> the receives posted before i
  const std::vector<int> post_before = receive_posts(actions);
  for (size_t r = 0; r < actions.size(); ++r)
    if (post_before[r] >= 0) posted_at[size_t(post_before[r])].push_back(int(r));
  for (size_t i = 0; i < actions.size(); ++i) {
    for (int r : posted_at[i]) post_receive(actions[size_t(r)]);
    // See Note [Progress between actions]: completed ones leave the list (their buffers too).
    pending.erase(std::remove_if(pending.begin(), pending.end(),
                                 [](const comm::WorkPtr& w) { return w->test(); }),
                  pending.end());
    const Action& a = actions[i];
    const double start = now();
    if (a.kind == ActionKind::kGradSync) {
      if (chunks_[size_t(a.chunk)].sync) chunks_[size_t(a.chunk)].sync();
      timeline_.push_back(TimedAction{a, start, now()});
      continue;
    }
    const ChunkPlace& place = places[size_t(a.chunk)];
    Slot& slot = slots[{a.microbatch, a.chunk}];
    const StageChunk& chunk = chunks_[size_t(a.chunk)];
    switch (a.kind) {
      case ActionKind::kRecvActivation:
      case ActionKind::kRecvGrad:
        break;  // posted already (post_before[i] <= i)
      case ActionKind::kForward: {
        if (place.stage == 0) {
          slot.input = tokens[size_t(a.microbatch)];
        } else {
          wait_timed(slot.recv_activation, receives[{a.microbatch, a.chunk}], timeline_);
          slot.input.set_requires_grad(true);
        }
        const double compute_start = now();
        if (before_forward_) before_forward_(a.microbatch);
        Tensor out = chunk.forward(slot.input);
        if (place.stage == last) {
          Tensor loss = chunk.loss(out, targets[size_t(a.microbatch)]);
          const double w = weights[size_t(a.microbatch)];
          loss_sum += loss.item() * w;
          out = scale(loss, w);
        }
        slot.output = out;
        if (chunk.extra_loss) slot.extra_loss = chunk.extra_loss();
        timeline_.push_back(TimedAction{a, compute_start, now()});
        break;
      }
      case ActionKind::kSendActivation: {
        Tensor buffer = slot.output.detach().contiguous();
        in_flight.push_back(buffer);
        sends.push_back(
            pp_->send(buffer, a.peer, {tag(false, a.microbatch, place.pipeline, place.stage)}));
        push_briefly(sends.back());
        pending.push_back(sends.back());
        timeline_.push_back(TimedAction{a, start, now()});
        break;
      }
      case ActionKind::kBackward: {
        if (place.stage != last)
          wait_timed(slot.recv_grad, grad_receives[{a.microbatch, a.chunk}], timeline_);
        const double compute_start = now();
        std::vector<Tensor> roots{slot.output},
            grads{place.stage == last
                      ? Tensor::full(slot.output.shape(), loss_scale_, slot.output.dtype())
                      : slot.grad_output};
        if (slot.extra_loss.defined()) {  // weight 1 (See StageChunk::extra_loss)
          roots.push_back(slot.extra_loss);
          grads.push_back(
              Tensor::full(slot.extra_loss.shape(), loss_scale_, slot.extra_loss.dtype()));
        }
        autograd::backward(roots, grads);
        if (chunk.after_backward) chunk.after_backward(a.microbatch);
        timeline_.push_back(TimedAction{a, compute_start, now()});
        slot.output = Tensor();
        slot.grad_output = Tensor();
        slot.extra_loss = Tensor();
        break;
      }
      case ActionKind::kSendGrad: {
        LOOM_CHECK(slot.input.defined() && slot.input.grad().defined(), "PipelineExecutor: rank ",
                   rank_, " has no input gradient to send for ", a.str());
        Tensor buffer = slot.input.grad().detach().contiguous();
        in_flight.push_back(buffer);
        sends.push_back(
            pp_->send(buffer, a.peer, {tag(true, a.microbatch, place.pipeline, place.stage)}));
        push_briefly(sends.back());
        pending.push_back(sends.back());
        timeline_.push_back(TimedAction{a, start, now()});
        slot.input = Tensor();
        break;
      }
      case ActionKind::kWeightGrad:
      case ActionKind::kGradSync:
        break;
    }
  }
  comm::wait_all(sends);
  for (size_t c = 0; c < chunks_.size(); ++c) {
    if (!chunks_[c].sync_wait) continue;
    const double start = now();
    chunks_[c].sync_wait();
    timeline_.push_back(TimedAction{Action{ActionKind::kGradSync, -1, int(c)}, start, now()});
  }
  return loss_sum;
}

GradientSum::GradientSum(std::vector<Tensor> params, std::shared_ptr<comm::Communicator> group,
                         bool average, double scale)
    : params_(std::move(params)), group_(std::move(group)), average_(average), scale_(scale) {
  LOOM_CHECK(group_ != nullptr, "GradientSum: the group is null");
}

// Note [Summing gradients where they are]
// GradientSum packs the gradients into one flat f32 copy for one allreduce, which then holds
// them a second time until wait(). When they are views of shared buffers already (ZeRO-1's
// buckets under Chimera: the pair sums every chunk's gradients at its SYNC, and both SYNCs are
// waited at the step's end, so the copies met there), each run of gradients lying back to back
// in one buffer is allreduced in place instead. Runs follow the buffers' layouts, which the
// replicas build alike from the same parameters (a layout that differed would be refused by the
// communicator's signature check, not summed wrongly). The sums are the flat ones element for
// element (f32 only: a bf16 gradient is summed in f32 and rounded back, as before).
namespace {

std::vector<Tensor> gradient_runs(const std::vector<Tensor>& params) {
  struct Grad {
    Tensor g;
    size_t param;  // its index in params: runs go in the order of their first parameter
  };
  std::vector<Grad> grads;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor g = params[i].grad();
    if (!g.defined() || g.dtype() != DType::kF32 || !g.is_contiguous()) return {};
    grads.push_back({g, i});
  }
  // Neighbours in memory (the addresses differ between processes; only the runs matter).
  std::sort(grads.begin(), grads.end(), [](const Grad& a, const Grad& b) {
    return a.g.storage() != b.g.storage() ? a.g.storage() < b.g.storage()
                                          : a.g.offset() < b.g.offset();
  });
  std::vector<std::pair<size_t, Tensor>> runs;  // (first parameter, run)
  size_t first = 0, lowest = grads.empty() ? 0 : grads[0].param;
  for (size_t i = 1; i <= grads.size(); ++i) {
    if (i < grads.size() && grads[i].g.storage() == grads[i - 1].g.storage() &&
        grads[i].g.offset() == grads[i - 1].g.offset() + grads[i - 1].g.numel()) {
      lowest = std::min(lowest, grads[i].param);
      continue;
    }
    const int64_t start = grads[first].g.offset();
    const int64_t n = grads[i - 1].g.offset() + grads[i - 1].g.numel() - start;
    runs.emplace_back(lowest, make_view(grads[first].g, {n}, {1}, start));
    if (i < grads.size()) first = i, lowest = grads[i].param;
  }
  // Only worth it where the gradients share buffers: apart, one allreduce per parameter would
  // trade the copy for a latency each.
  if (runs.size() > 1 && runs.size() == params.size()) return {};
  std::sort(runs.begin(), runs.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Tensor> out;
  for (auto& r : runs) out.push_back(std::move(r.second));
  return out;
}

}  // namespace

void GradientSum::start() {
  LOOM_CHECK(works_.empty(), "GradientSum: started twice in a step");
  const comm::AllreduceOptions sum{average_ ? comm::ReduceOp::kAvg : comm::ReduceOp::kSum};
  runs_ = gradient_runs(params_);  // See Note [Summing gradients where they are]
  if (!runs_.empty()) {
    for (Tensor& run : runs_) works_.push_back(group_->allreduce(run, sum));
    return;
  }
  int64_t n = 0;
  for (const Tensor& p : params_) n += p.numel();
  flat_ = Tensor::zeros({n});
  int64_t offset = 0;
  for (const Tensor& p : params_) {
    if (p.grad().defined())
      flat_.narrow(0, offset, p.numel())
          .copy_(p.grad().detach().reshape({p.numel()}).to(DType::kF32));
    offset += p.numel();
  }
  works_.push_back(group_->allreduce(flat_, sum));
}

void GradientSum::wait() {
  if (works_.empty()) return;
  for (const comm::WorkPtr& w : works_) w->wait();
  works_.clear();
  if (!runs_.empty()) {
    if (scale_ != 1.0)
      for (Tensor& run : runs_) ::loom::scale_(run, scale_);
    runs_.clear();
    return;
  }
  if (scale_ != 1.0) flat_ = scale(flat_, scale_);
  int64_t offset = 0;
  for (Tensor p : params_) {
    // Summed in f32; a bf16 parameter's gradient is rounded back to its dtype, as DDP's. Written
    // back into the gradient the backwards accumulated rather than replacing it with a view of
    // the flat copy, which would then hold the chunk's gradients a second time to the step's end.
    const Tensor summed = flat_.narrow(0, offset, p.numel()).reshape(p.shape()).to(p.dtype());
    Tensor g = p.grad();
    if (g.defined() && g.dtype() == p.dtype())
      g.copy_(summed);
    else
      p.set_grad(summed.contiguous());
    offset += p.numel();
  }
  flat_ = Tensor();
}

void PipelineExecutor::forward_only(const std::vector<Tensor>& tokens, int through_pipeline) {
  const int m = schedule_.microbatches;
  LOOM_CHECK(int(tokens.size()) == m, "PipelineExecutor: ", m,
             " micro-batches in the schedule but ", tokens.size(), " token tensors given");
  LOOM_CHECK(through_pipeline < schedule_.pipelines, "PipelineExecutor: pipeline ",
             through_pipeline, " of a schedule of ", schedule_.pipelines);
  NoGradGuard no_grad;
  const std::vector<ChunkPlace>& places = schedule_.chunks[size_t(rank_)];
  const int last = schedule_.stages - 1;
  // The schedule's forwards of this rank, and where each one's input comes from and output goes.
  std::vector<Action> forwards;
  std::map<std::pair<int, int>, int> from, to;  // (microbatch, chunk) -> peer
  if (through_pipeline < 0) {
    for (const Action& a : schedule_.actions[size_t(rank_)]) {
      if (a.kind == ActionKind::kForward) forwards.push_back(a);
      if (a.kind == ActionKind::kRecvActivation) from[{a.microbatch, a.chunk}] = a.peer;
      if (a.kind == ActionKind::kSendActivation) to[{a.microbatch, a.chunk}] = a.peer;
    }
  } else {  // every micro-batch through this rank's chunks of the one pipeline
    for (size_t c = 0; c < places.size(); ++c) {
      const ChunkPlace& place = places[c];
      if (place.pipeline != through_pipeline) continue;
      for (int k = 0; k < m; ++k) {
        Action a;
        a.kind = ActionKind::kForward;
        a.microbatch = k;
        a.chunk = int(c);
        forwards.push_back(a);
        if (place.stage > 0)
          from[{k, int(c)}] = schedule_.holder(through_pipeline, place.stage - 1).first;
        if (place.stage < last)
          to[{k, int(c)}] = schedule_.holder(through_pipeline, place.stage + 1).first;
      }
    }
  }
  // Micro-batch then stage order: each forward needs only earlier ones (its micro-batch's
  // previous stage), so no rank waits on one that waits on it.
  std::stable_sort(forwards.begin(), forwards.end(), [&](const Action& x, const Action& y) {
    return std::make_pair(x.microbatch, places[size_t(x.chunk)].stage) <
           std::make_pair(y.microbatch, places[size_t(y.chunk)].stage);
  });
  std::vector<comm::WorkPtr> sends;
  std::vector<Tensor> in_flight;
  for (const Action& a : forwards) {
    const ChunkPlace& place = places[size_t(a.chunk)];
    Tensor input = tokens[size_t(a.microbatch)];
    if (place.stage > 0) {
      input = Tensor::empty(activation_, dtype_);
      pp_->recv(input, from.at({a.microbatch, a.chunk}),
                {tag(false, a.microbatch, place.pipeline, place.stage - 1)})
          ->wait();
    }
    if (before_forward_) before_forward_(a.microbatch);
    Tensor out = chunks_[size_t(a.chunk)].forward(input);
    if (place.stage == last) continue;
    in_flight.push_back(out.contiguous());
    sends.push_back(pp_->send(in_flight.back(), to.at({a.microbatch, a.chunk}),
                              {tag(false, a.microbatch, place.pipeline, place.stage)}));
  }
  comm::wait_all(sends);
}

double PipelineExecutor::mean_loss(double local) const {
  Tensor l = Tensor::full({1}, local, DType::kF32);
  pp_->allreduce(l)->wait();
  return l.item();
}

}  // namespace loom::parallel::pipeline
