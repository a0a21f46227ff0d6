// loom-plan: chooses a parallel layout for training a GPT on a cluster, and predicts its step.
//
//   loom-plan --layers 96 --hidden 12288 --heads 96 --seq 2048 --vocab 51200 \
//             --global-batch 1536 --gpus 1024 --gpus-per-node 8 --gpu a100-80gb
//   loom-plan --block llama --layers 32 --hidden 4096 --heads 32 --kv-heads 8 --ffn-hidden 14336 \
//             --seq 8192 --vocab 128256 ...                    # a Llama 3 8B
//   loom-plan ... --evaluate "tp=8,pp=8,v=3,mb=1,schedule=interleaved,recompute=selective,sp=1"
//   loom-plan ... --moe-experts 8 --moe-top-k 2 --moe-every 2     # MoE layers; plans ep too
//   mpirun -np 2 loom-plan --calibrate cpu.json     # this machine's rates, for --profile
//
// Ranks every valid layout that fits in memory by predicted step time (planner/search.h), prints
// the best with its step, tokens/s, TFLOP/s per GPU, MFU, bubble, communication share and memory
// per GPU, and says why each runner-up lost. --json prints the same records as JSON.

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "collectives/topology.h"
#include "common/flags.h"
#include "core/error.h"
#include "planner/calibrate.h"
#include "planner/report.h"
#include "planner/search.h"

namespace loom::planner {
namespace {

void print_prediction(const char* label, const Prediction& p) {
  std::printf("%s %s\n", label, p.layout.str().c_str());
  if (!p.problem.empty()) {
    std::printf("  invalid: %s\n", p.problem.c_str());
    return;
  }
  std::printf(
      "  step %.4f s, %.0f tokens/s, %.1f TFLOP/s per GPU (model), %.1f (hardware), MFU "
      "%.1f%%\n",
      p.step_s, p.tokens_per_s, p.model_tflops_per_gpu, p.hardware_tflops_per_gpu, 100 * p.mfu);
  std::printf(
      "  pipeline %.4f s (bubble %.1f%%), communication %.4f s (%.1f%%), data-parallel "
      "exposed %.4f s, optimizer %.4f s\n",
      p.pipeline_s, 100 * p.bubble, p.comm_s, 100 * p.comm_s / p.step_s, p.step.dp_exposed,
      p.step.optimizer);
  std::printf("  memory per GPU (pipeline rank %d): %s%s\n", p.memory_rank, p.memory.str().c_str(),
              p.oom ? "  OUT OF MEMORY" : "");
}

int calibrate_command(const cli::Flags& f) {
  auto world = comm::world();
  const comm::NodeMap nodes = comm::node_map(*world);
  Cluster base;
  base.gpus = world->size();
  base.gpus_per_node =
      int(std::count(nodes.node_of_rank.begin(), nodes.node_of_rank.end(), 0));  // node 0's
  const bool on_cpu = f.get_string("device") == "cpu";
  if (!on_cpu || f.was_set("gpu")) {
    base.device = device_preset(f.get_string("gpu"));
    base.intra = intra_preset(f.get_string("gpu"));
    base.inter = inter_preset(f.get_string("gpu"));
  }
  CalibrationOptions o;
  o.device = Device::parse(f.get_string("device"));
  o.dtype = on_cpu ? DType::kF32 : DType::kBF16;
  o.max_gemm = on_cpu ? 1024 : 8192;
  o.peak_flops = on_cpu ? 0.0 : base.device.peak_flops;
  // No datasheet: rates calibrated below; each rank's memory is its share of its node's.
  if (on_cpu) base.device = cpu_device(base.gpus_per_node);
  o.node_of_rank = nodes.node_of_rank;
  // The block the element-wise term is fitted on: the planned model's layer shape when given.
  if (f.was_set("hidden")) o.block.hidden = f.get_int("hidden");
  if (f.was_set("heads")) o.block.heads = f.get_int("heads");
  if (f.was_set("seq")) o.block.seq = f.get_int("seq");
  if (f.was_set("vocab")) o.block.vocab = f.get_int("vocab");
  o.block_batch = int(f.get_int("calibrate-batch"));
  const Cluster c = calibrate(base, world, o);
  if (world->rank() == 0) {
    write_profile(f.get_string("calibrate"), c);
    std::printf(
        "calibrated on %d rank(s) (%s): GEMM %.1f GFLOP/s at large sizes, half of it at "
        "%.0f MFLOP; element-wise kernels %.1f GB/s; a block's element-wise traffic %.1f GB/s, "
        "plus %.3f ms per block and %.3f ms for the rest per micro-batch; ",
        world->size(), f.get_string("device").c_str(),
        c.device.peak_flops * c.device.gemm_efficiency / 1e9, c.device.gemm_half_flops / 1e6,
        c.device.memory_bandwidth / 1e9, block_bandwidth(c.device) / 1e9,
        c.device.block_overhead_s * 1e3, c.device.rest_overhead_s * 1e3);
    if (world->size() > 1 &&
        (c.intra.latency_s != c.inter.latency_s || c.intra.bandwidth != c.inter.bandwidth))
      std::printf(
          "all-reduce over %d node(s): inside a node latency %.1f us, bandwidth %.2f GB/s; "
          "across nodes latency %.1f us, bandwidth %.3f GB/s per rank\n",
          nodes.nodes(), c.intra.latency_s * 1e6, c.intra.bandwidth / 1e9, c.inter.latency_s * 1e6,
          c.inter.bandwidth / 1e9);
    else if (world->size() > 1)
      std::printf("all-reduce latency %.1f us, bandwidth %.2f GB/s\n", c.intra.latency_s * 1e6,
                  c.intra.bandwidth / 1e9);
    else
      std::printf("all-reduce not measured (one rank: run under mpirun for it)\n");
    std::printf("wrote %s\n", f.get_string("calibrate").c_str());
  }
  return 0;
}

int run(int argc, char** argv) {
  cli::Flags f("loom-plan",
               "Chooses dp x tp x pp, schedule, micro-batch, ZeRO stage, recomputation and\n"
               "sequence parallelism for training a GPT on a cluster, and predicts the step.");
  f.add_int("layers", 0, "transformer layers");
  f.add_int("hidden", 0, "hidden size");
  f.add_int("heads", 0, "attention heads");
  f.add_int("seq", 2048, "sequence length");
  f.add_int("vocab", 51200, "vocabulary size");
  f.add_string("block", "gpt",
               "the block: gpt (LayerNorm, biases, GELU MLP, learned positions, tied output) or "
               "llama (RMSNorm, no biases, SwiGLU MLP, rotary positions, untied output)",
               {"gpt", "llama"});
  f.add_int("ffn-hidden", 0, "the MLP's hidden width (0: 4 x hidden)");
  f.add_int("kv-heads", 0, "grouped-query attention: key/value heads (0: --heads)");
  f.add_int("moe-experts", 0, "mixture of experts: experts per MoE layer (0: a dense model)");
  f.add_int("moe-top-k", 1, "MoE: experts per token");
  f.add_int("moe-every", 1, "MoE: every N-th layer (from the first) is a MoE layer");
  f.add_int("moe-hidden", 0, "MoE: each expert's hidden width (0: 4 x hidden)");
  f.add_double("moe-aux-loss", 0.01,
               "MoE: the load-balancing loss coefficient (loom-gpt's; > 0: a routing pass)");
  f.add_double("moe-load", 1.0,
               "MoE: the busiest rank's routed rows over the balanced share (>= 1; with a "
               "capacity factor and no --moe-load: as many as the capacity lets through)");
  f.add_double(
      "moe-capacity-factor", 0,
      "MoE: loom-gpt's capacity factor, which bounds the busiest rank's rows (0: dropless)");
  f.add_int("global-batch", 0, "sequences per optimizer step");
  f.add_int("gpus", 0, "GPUs in all");
  f.add_int("gpus-per-node", 8, "GPUs per node (tp stays inside one)");
  f.add_string("gpu", "h100-sxm", "GPU preset: a100-80gb, h100-sxm, h200");
  f.add_double("peak-tflops", 0, "override: dense 16-bit peak TFLOP/s per GPU");
  f.add_double("memory-gb", 0, "override: GPU memory in GB");
  f.add_double("intra-gbps", 0, "override: GB/s per GPU and direction inside a node");
  f.add_double("inter-gbps", 0, "override: GB/s per GPU and direction between nodes");
  f.add_string("profile", "", "a profile JSON (planner/cluster.h) overriding the preset's rates");
  f.add_string("execution", "loom", "whose runtime executes the plan (its pipeline schedules only)",
               {"loom", "loom-f32", "loom-cpu", "megatron", "torchtitan", "torchtitan-layer-sac"});
  f.add_string("evaluate", "",
               "predict one layout: dp=..,tp=..,pp=..,v=..,mb=..,schedule=..,"
               "zero=..,recompute=none|selective|full,sp=0|1[,ep=..]");
  f.add_int("top", 5, "plans to print");
  f.add_string("calibrate", "",
               "measure this machine (GEMM curve, memory bandwidth, and under mpirun the "
               "all-reduce) into this profile file, then exit");
  f.add_string("device", "cpu", "--calibrate: where to measure (cpu, cuda, cuda:N)");
  f.add_int("calibrate-batch", 4,
            "--calibrate: sequences per micro-batch of the block it fits the element-wise term on "
            "(--hidden, --heads, --seq, --vocab give its shape)");
  f.add_bool("json", "print JSON instead of text");
  if (!f.parse(argc, argv)) return 0;

  if (!f.get_string("calibrate").empty()) return calibrate_command(f);

  Workload w;
  w.model.layers = f.get_int("layers");
  w.model.hidden = f.get_int("hidden");
  w.model.heads = f.get_int("heads");
  w.model.seq = f.get_int("seq");
  w.model.vocab = f.get_int("vocab");
  w.model.block = parse_block(f.get_string("block"));
  w.model.ffn_hidden = f.get_int("ffn-hidden");
  w.model.kv_heads = f.get_int("kv-heads");
  const double capacity = f.get_double("moe-capacity-factor");
  w.model.moe = {f.get_int("moe-experts"),
                 f.get_int("moe-top-k"),
                 f.get_int("moe-every"),
                 f.get_int("moe-hidden"),
                 f.get_double("moe-aux-loss") > 0,
                 f.was_set("moe-load") ? f.get_double("moe-load") : default_moe_load(capacity),
                 capacity};
  w.global_batch = f.get_int("global-batch");
  for (const char* required : {"layers", "hidden", "heads", "global-batch", "gpus"})
    LOOM_CHECK(f.was_set(required), "loom-plan: --", required, " is required (see --help)");
  w.check();
  LOOM_CHECK(f.get_int("top") >= 1, "loom-plan: --top must be at least 1");

  Cluster c;
  c.gpus = int(f.get_int("gpus"));
  c.gpus_per_node = int(f.get_int("gpus-per-node"));
  c.device = device_preset(f.get_string("gpu"));
  c.intra = intra_preset(f.get_string("gpu"));
  c.inter = inter_preset(f.get_string("gpu"));
  if (!f.get_string("profile").empty()) c = read_profile(f.get_string("profile"), c);
  auto positive = [&](const char* name) {
    LOOM_CHECK(f.get_double(name) > 0, "loom-plan: --", name, " must be positive");
    return f.get_double(name);
  };
  if (f.was_set("peak-tflops")) c.device.peak_flops = positive("peak-tflops") * 1e12;
  if (f.was_set("memory-gb")) c.device.memory_bytes = positive("memory-gb") * 1e9;
  if (f.was_set("intra-gbps")) c.intra.bandwidth = positive("intra-gbps") * 1e9;
  if (f.was_set("inter-gbps")) c.inter.bandwidth = positive("inter-gbps") * 1e9;
  c.check();
  const Execution e = execution_preset(f.get_string("execution"));
  const bool json = f.get_bool("json");

  if (!f.get_string("evaluate").empty()) {
    const Prediction p = evaluate(w, parse_layout(f.get_string("evaluate"), c.gpus), c, e);
    if (json) {
      std::printf("%s\n", prediction_json(p).dump(2).c_str());
    } else {
      std::printf("model: %s, global batch %lld\ncluster: %s\n", w.model.str().c_str(),
                  (long long)w.global_batch, c.str().c_str());
      print_prediction("layout", p);
    }
    return p.problem.empty() ? 0 : 1;
  }

  SearchOptions o;
  o.top = int(f.get_int("top"));
  const SearchResult r = search(w, c, e, o);
  if (json) {
    const nlohmann::json j = search_json(r);
    std::printf("%s\n", j.dump(2).c_str());
    return r.ranked.empty() ? 1 : 0;
  }
  std::printf("model: %s, global batch %lld\ncluster: %s\n", w.model.str().c_str(),
              (long long)w.global_batch, c.str().c_str());
  std::printf(
      "searched %ld layouts in %.2f s: %ld invalid, %ld out of memory, %ld simulated, "
      "%ld pruned by their lower bound\n",
      r.candidates, r.seconds, r.invalid, r.oom, r.simulated, r.pruned);
  LOOM_CHECK(!r.ranked.empty(), "loom-plan: no layout fits in memory",
             r.any_oom && r.fastest_oom.problem.empty()
                 ? " (the fastest needs " + std::to_string(r.fastest_oom.memory.total() / 1e9) +
                       " GB: " + r.fastest_oom.layout.str() + ")"
                 : std::string());
  print_prediction("best:", r.ranked.front());
  for (size_t i = 1; i < r.ranked.size(); ++i) {
    char label[32];
    std::snprintf(label, sizeof label, "#%zu:", i + 1);
    print_prediction(label, r.ranked[i]);
    std::printf("  slower by %s\n", why_slower(r.ranked.front(), r.ranked[i]).c_str());
  }
  return 0;
}

}  // namespace
}  // namespace loom::planner

int main(int argc, char** argv) {
  try {
    return loom::planner::run(argc, argv);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "loom-plan: error: %s\n", e.what());
    return 1;
  }
}
