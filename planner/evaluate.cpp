#include "planner/evaluate.h"

#include <algorithm>
#include <cstdio>

#include "parallel/pipeline/generators.h"
#include "parallel/pipeline/validator.h"

namespace loom::planner {

namespace pl = parallel::pipeline;

std::string Prediction::summary() const {
  if (!problem.empty()) return layout.str() + ": invalid: " + problem;
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "%s: step %.3f s, %.0f tokens/s, %.1f TFLOP/s/GPU (MFU %.1f%%), bubble %.1f%%, "
                "comm %.1f%%, memory %.1f GB%s",
                layout.str().c_str(), step_s, tokens_per_s, model_tflops_per_gpu, 100 * mfu,
                100 * bubble, 100 * comm_s / step_s, memory.total() / 1e9,
                oom ? " (out of memory)" : "");
  return buf;
}

namespace {

// FLOPs recomputation adds to a step (hardware FLOPs beyond the model's): selective, the
// attention scores and context (4 s^2 h per layer and sequence), or with torchtitan's policies
// every second matmul of each layer (Note [Recomputing every other matmul]) or every second
// layer's forward; full, every layer's forward again.
double recompute_flops(const Workload& w, Recompute r, const Execution& e) {
  const TransformerShape& m = w.model;
  const double sequences = double(w.global_batch), s = double(m.seq);
  if (r == Recompute::kFull) return m.layers_forward_flops() * sequences;
  if (r == Recompute::kNone) return 0;
  double per_layer = 0;
  switch (e.selective) {
    case SelectivePolicy::kAttention:
      per_layer = 4.0 * s * s * double(m.hidden);
      break;
    case SelectivePolicy::kEveryOtherMatmul: {
      for (const Matmul& mm : every_other_matmul(m.layer_matmuls(), true))
        per_layer += 2.0 * s * mm.in * mm.out;
      break;
    }
    case SelectivePolicy::kEveryOtherLayer:
      return 0.5 * m.layers_forward_flops() * sequences;
  }
  return per_layer * double(m.layers) * sequences;
}

// Note [MoE layers per stage]
// action_costs counts every pipeline rank's average share of the MoE layers. With `every` > 1
// the stages hold different numbers (4 layers, a MoE MLP every 4th, on 2 stages: 1 and 0), and
// a stage with more runs longer while the others wait, which the average hides. Each stage's
// chunk gets its own count n_s: its F is the average chunk's plus (n_s - average) times a MoE
// layer's extra cost over a dense one. The validator takes no negative cost, so the chunks'
// common F is set at the fewest MoE layers any stage holds (the most, if a MoE layer is the
// cheaper) and each stage's excess over that goes into its extras; the same for B. (The routing
// pass, the dp overlap window and the step's communication keep the average, and where ZeRO's
// per-micro-batch collectives hide the compute, the difference is added to the overlapped
// figure: an upper bound for that stage.)
void moe_stage_costs(const TransformerShape& m, const ActionCosts& a, int pp, int stages,
                     pl::CostModel& cost) {
  if (!m.moe.enabled() || stages < 2) return;
  const int64_t per_stage = m.layers / stages;
  std::vector<double> held(size_t(stages), 0.0);
  for (int s = 0; s < stages; ++s)
    held[size_t(s)] = double(m.moe_layers_in(s * per_stage, per_stage));
  const double average = double(m.moe_layers()) / double(stages);
  auto spread = [&](double delta, double& base, std::vector<double>& extra) {
    const double ref = delta > 0 ? *std::min_element(held.begin(), held.end())
                                 : *std::max_element(held.begin(), held.end());
    base += (ref - average) * delta * double(stages) / double(pp);  // per chunk: x pp / stages
    for (int s = 0; s < stages; ++s) extra[size_t(s)] += (held[size_t(s)] - ref) * delta;
  };
  spread(a.moe_forward_delta, cost.forward, cost.stage_forward_extra);
  spread(a.moe_backward_delta, cost.backward, cost.stage_backward_extra);
}

}  // namespace

Prediction evaluate(const Workload& w, const Layout& l, const Cluster& c, const Execution& e) {
  Prediction p;
  p.layout = l;
  w.check();
  c.check();
  p.problem = layout_problem(l, w, c);
  if (p.problem.empty() && l.pp > 1) p.problem = schedule_problem(e, l.schedule);
  if (!p.problem.empty()) return p;

  const int m = int(l.microbatches(w));
  p.actions = action_costs(w, l, c, e);
  const ActionCosts& a = p.actions;
  const pl::Schedule schedule = pl::make_schedule(l.schedule, l.pp, m, l.v);
  pl::CostModel cost;
  cost.forward = a.forward;
  cost.backward = a.backward;
  cost.weight_grad = 0;
  cost.transfer = a.p2p;
  cost.stage_forward_extra.assign(size_t(schedule.stages), 0.0);
  cost.stage_backward_extra.assign(size_t(schedule.stages), 0.0);
  cost.stage_forward_extra.front() += a.embed_forward;
  cost.stage_backward_extra.front() += a.embed_backward;
  cost.stage_forward_extra.back() += a.head_forward;
  cost.stage_backward_extra.back() += a.head_backward;
  moe_stage_costs(w.model, a, l.pp, schedule.stages, cost);
  const pl::Simulation sim = pl::validate(schedule, cost);
  p.pipeline_s = sim.makespan;
  for (const auto& r : sim.ranks) p.bubble += r.bubble / double(sim.ranks.size());

  double largest_params = 0, largest_experts = 0;
  for (int r = 0; r < l.pp; ++r) {
    const MemoryBreakdown mem = rank_memory(w, l, c, e, r, in_flight_at_backwards(schedule, r));
    p.memory_per_rank.push_back(mem);
    if (r == 0 || mem.total() > p.memory.total()) {
      p.memory = mem;
      p.memory_rank = r;
    }
    const double params = rank_parameters(w.model, l, r);
    if (params > largest_params) {
      largest_params = params;
      largest_experts = rank_expert_parameters(w.model, l, r);
    }
  }
  p.oom = p.memory.total() > c.device.memory_bytes;

  const double chunk_backward = a.backward * double(l.pp) / double(schedule.stages);
  p.step = step_costs(w, l, c, e, largest_params, chunk_backward, largest_experts);
  if (w.model.moe.enabled() && w.model.moe.balance_loss && e.moe_routing_pass &&
      (l.pp > 1 || m > 1)) {
    const double stages = double(l.pp) * (l.schedule == "chimera" ? 1 : l.v);
    const double chunk = a.forward * double(l.pp) / stages + (l.pp > 1 ? a.p2p : 0.0);
    p.routing_s = (double(m) * stages / l.pp + double(l.pp - 1)) * chunk +
                  double(m) * (a.embed_forward + a.head_forward);
  }
  p.step_s =
      p.routing_s + p.pipeline_s + p.step.dp_exposed + p.step.tied_embedding + p.step.optimizer;
  p.comm_s = double(m) * (a.tp_comm + a.ep_comm + (l.pp > 1 ? 2.0 * a.p2p : 0.0)) +
             p.step.dp_exposed + p.step.tied_embedding;

  const double tokens = double(w.global_batch) * double(w.model.seq);
  const double model_flops = w.model.step_model_flops(w.global_batch);
  p.tokens_per_s = tokens / p.step_s;
  p.model_tflops_per_gpu = model_flops / p.step_s / c.gpus / 1e12;
  p.hardware_tflops_per_gpu =
      (model_flops + recompute_flops(w, l.recompute, e)) / p.step_s / c.gpus / 1e12;
  p.mfu = p.model_tflops_per_gpu * 1e12 / c.device.peak_flops;
  return p;
}

double step_lower_bound(const Workload& w, const Layout& l, const Cluster& c, const Execution& e) {
  if (!layout_problem(l, w, c).empty()) return 0;
  const ActionCosts a = action_costs(w, l, c, e);
  // The widest overlap window evaluate could give the reduction (a whole rank share's backward),
  // so the exposed part is at least this. Dense: the larger of the first and last ranks' state
  // (evaluate takes the largest of all); MoE, where the largest state may hold fewer experts to
  // reduce, the smaller of their two step costs.
  double after_pipeline = 0;
  for (int r : {0, l.pp - 1}) {
    const StepCosts s = step_costs(w, l, c, e, rank_parameters(w.model, l, r), a.backward,
                                   rank_expert_parameters(w.model, l, r));
    const double cost = s.dp_exposed + s.tied_embedding + s.optimizer;
    after_pipeline = r == 0                  ? cost
                     : w.model.moe.enabled() ? std::min(after_pipeline, cost)
                                             : std::max(after_pipeline, cost);
  }
  // The pipeline: with every cost but F and B set to zero the validator gives exactly
  // (m + p - 1)(F + B) for GPipe and 1F1B and (m + (p - 1) / v)(F + B) for interleaved (See
  // pipeline_validator_test); sends, the extras of the first and last stages only add to it.
  // Chimera: at least m (F + B), every rank busy throughout.
  const double m = double(l.microbatches(w)), fb = a.forward + a.backward;
  double pipeline = m * fb;
  if (l.schedule == "gpipe" || l.schedule == "1f1b")
    pipeline = (m + l.pp - 1) * fb;
  else if (l.schedule == "interleaved")
    pipeline = (m + double(l.pp - 1) / l.v) * fb;
  return pipeline + after_pipeline;
}

}  // namespace loom::planner
