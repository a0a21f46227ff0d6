#include "gpt/gpt_plan.h"

#include <algorithm>
#include <cstdio>

#include "collectives/topology.h"
#include "common/gpu_peak.h"
#include "core/allocator.h"
#include "core/error.h"
#include "planner/calibrate.h"
#include "planner/search.h"

namespace loom::gpt {

namespace {

using planner::Recompute;

// The preset whose datasheet matches the CUDA device's name ("" when none does).
std::string gpu_preset_for(const std::string& name) {
  if (name.find("H200") != std::string::npos) return "h200";
  if (name.find("H100") != std::string::npos) return "h100-sxm";
  if (name.find("A100") != std::string::npos) return "a100-80gb";
  return "";
}

planner::Execution execution_for(const GptOptions& o, const Device& device) {
  planner::Execution e = planner::execution_preset(device.is_cpu() ? "loom-cpu" : "loom");
  if (o.dtype == "f32") {
    const planner::Execution f32 = planner::execution_preset("loom-f32");
    e.param_bytes = f32.param_bytes;
    e.grad_bytes = f32.grad_bytes;
    e.optimizer_bytes = f32.optimizer_bytes;
    e.activation_bytes = f32.activation_bytes;
  }
  return e;
}

planner::Cluster plan_cluster(const GptOptions& o, const GptConfig& config,
                              const std::shared_ptr<comm::Communicator>& world,
                              const Device& device) {
  const comm::NodeMap nodes = comm::node_map(*world);
  planner::Cluster c;
  c.gpus = world->size();
  c.gpus_per_node = int(std::count(nodes.node_of_rank.begin(), nodes.node_of_rank.end(), 0));
  // The element-wise fit runs on this model's layer shape with a small vocabulary (the output
  // layer cancels out of the fit), to keep a large model's calibration short.
  // (One sequence per micro-batch instead of 4 fitted this VM's 8-sequence steps 4.6x too slow:
  // per-op overheads dominate small micro-batches.)
  planner::CalibrationOptions calib;
  calib.device = device;
  calib.block = {1, config.channels, config.heads, o.seq > 0 ? o.seq : config.max_seq_len, 256, {}};
  calib.block_batch = int(std::min<int64_t>(4, o.batch));
  calib.node_of_rank = nodes.node_of_rank;
  if (device.is_cpu()) {
    c.device = planner::cpu_device(c.gpus_per_node);
    c.intra = c.inter = {1e-6, 1e10};  // replaced by the measured all-reduce with 2+ ranks
    calib.dtype = parse_dtype(o.dtype);
  } else {
    const cli::GpuPeak peak = cli::gpu_peak(device.index, parse_dtype(o.dtype));
    const std::string preset = gpu_preset_for(peak.gpu);
    LOOM_CHECK(!preset.empty() || !o.plan_profile.empty(),
               "loom-gpt: --plan auto knows no "
               "datasheet for '",
               peak.gpu,
               "': give its rates with --plan-profile (loom-plan "
               "--calibrate --device cuda writes one)");
    if (!preset.empty()) c = planner::cluster_preset(preset, c.gpus, c.gpus_per_node);
    calib.dtype = parse_dtype(o.dtype);
    calib.max_gemm = 8192;
    calib.peak_flops = peak.flops;
  }
  if (!o.plan_profile.empty()) return planner::read_profile(o.plan_profile, c);
  c.device.gemm_efficiency = c.device.gemm_efficiency > 0 ? c.device.gemm_efficiency : 1.0;
  return planner::calibrate(c, world, calib);
}

}  // namespace

std::string unsupported_by_loom_gpt(const planner::Layout& l, const GptOptions& o,
                                    const Device& device) {
  if (l.recompute == Recompute::kSelective)
    return "selective recomputation (loom-gpt recomputes whole blocks: --checkpoint-activations)";
  if (l.pp > 1 && !device.is_cpu()) return "a pipeline on CUDA";
  return "";
}

void plan_layout(GptOptions& o, const GptConfig& config,
                 const std::shared_ptr<comm::Communicator>& world, const Device& device) {
  planner::Workload w;
  w.model = {config.layers,       config.channels,
             config.heads,        o.seq > 0 ? o.seq : config.max_seq_len,
             config.padded_vocab, {}};
  if (o.moe_experts > 0) {
    LOOM_CHECK(o.expert_tp == 1,
               "loom-gpt: --plan auto keeps the experts whole over tp; drop --expert-tp");
    const nn::MoeOptions moe = o.moe();
    // With a capacity factor the plan takes the worst case it allows; dropless, balanced routing.
    w.model.moe = {moe.experts,        moe.top_k,
                   moe.every,          moe.expert_width(config.channels),
                   o.moe_aux_loss > 0, planner::default_moe_load(moe.capacity_factor),
                   moe.capacity_factor};
  }
  w.global_batch = o.batch;
  const planner::Cluster c = plan_cluster(o, config, world, device);
  const planner::Execution e = execution_for(o, device);
  planner::SearchOptions s;
  s.top = 3;
  s.unsupported = [&](const planner::Layout& l) { return unsupported_by_loom_gpt(l, o, device); };
  const planner::SearchResult r = planner::search(w, c, e, s);
  LOOM_CHECK(!r.ranked.empty(), "loom-gpt: --plan auto found no layout of this model for ",
             world->size(), " rank(s) that fits in memory and that loom-gpt runs (", r.candidates,
             " tried: ", r.invalid, " invalid, ", r.unsupported, " unsupported, ", r.oom,
             " out of memory)");
  // The calibration's buffers are gone: the run's peak memory starts from here.
  allocator_for(device).reset_peak();
  const planner::Prediction& best = r.ranked.front();
  std::printf("plan: %s (machine: %s)\n", best.summary().c_str(), c.str().c_str());
  for (size_t i = 1; i < r.ranked.size(); ++i)
    std::printf("plan: runner-up %s: slower by %s\n", r.ranked[i].layout.str().c_str(),
                planner::why_slower(best, r.ranked[i]).c_str());
  std::printf(
      "plan: searched %ld layouts in %.2f s (%ld invalid, %ld unsupported, %ld out of "
      "memory, %ld simulated)\n",
      r.candidates, r.seconds, r.invalid, r.unsupported, r.oom, r.simulated);
  const planner::Layout& l = best.layout;
  const int64_t m = l.microbatches(w);
  o.dp = l.dp;
  o.ep = l.ep;
  o.tp = l.tp;
  o.pp = l.pp;
  o.zero = l.zero;
  o.sequence_parallel = l.sp;
  o.checkpoint_activations = l.recompute == Recompute::kFull;
  o.schedule = l.pp > 1 ? l.schedule : o.schedule;
  o.virtual_stages = l.v;
  o.microbatches = l.pp > 1 ? m : 1;
  o.grad_accum = l.pp > 1 ? 1 : m;
}

}  // namespace loom::gpt
