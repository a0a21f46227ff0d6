// The planner's predicted step times against published training runs
// (planner/data/published_runs.json, with every source's quotes): Korthikanti et al.'s Megatron
// runs on A100s and torchtitan's Llama runs with FSDP2 on A100s and H100s. Each GPU type's GEMM
// efficiency is calibrated on one run (two in all, named below); every other run is a
// prediction, held to the planner issue's goal: median error 10%, worst 20%.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "planner/evaluate.h"
#include "testing/published_runs.h"

namespace loom::planner {
namespace {

using loom::testing::published_runs;

// The efficiency at which `predict_step` gives the `measured` step: the step is nearly inversely
// proportional to the efficiency, so a few fixed-point rounds settle it.
double calibrate_efficiency(const std::function<double(double)>& predict_step, double measured) {
  double eff = 0.8;
  for (int i = 0; i < 6; ++i) eff = std::min(1.0, eff * predict_step(eff) / measured);
  return eff;
}

struct Errors {
  std::vector<double> errors;
  void add(double predicted, double measured) {
    errors.push_back(std::abs(predicted - measured) / measured);
  }
  void expect_within_goal(const char* what) {
    ASSERT_FALSE(errors.empty());
    std::sort(errors.begin(), errors.end());
    const double median = errors.size() % 2
                              ? errors[errors.size() / 2]
                              : (errors[errors.size() / 2 - 1] + errors[errors.size() / 2]) / 2;
    std::printf("%s: median error %.1f%%, worst %.1f%% over %zu predicted rows\n", what,
                100 * median, 100 * errors.back(), errors.size());
    EXPECT_LE(median, 0.10) << what;
    EXPECT_LE(errors.back(), 0.20) << what;
  }
};

// Korthikanti et al., Table 5: iteration times of four models with full recomputation and with
// selective recomputation + sequence parallelism on A100 80GB (Table 3's layouts: tp 8; pp 1, 8,
// 35, 64; micro-batch 4 for 22B, 1 otherwise; the 175B and 530B interleaved with 3 chunks).
struct KorthikantiRow {
  std::string id;
  Workload w;
  Layout l;
  double measured = 0;
};

std::vector<KorthikantiRow> korthikanti_rows() {
  std::vector<KorthikantiRow> rows;
  const nlohmann::json runs = published_runs();
  for (const auto& r : runs["runs"]) {
    if (r["source"] != "korthikanti2022" || !r.contains("global_batch") ||
        !r.contains("micro_batch") || !r["measured"].contains("iteration_time_s"))
      continue;
    KorthikantiRow row;
    row.id = r["id"];
    const auto& m = r["model"];
    row.w.model = {m["layers"], m["hidden"], m["heads"], m["seq_len"], m["vocab"]};
    row.w.global_batch = r["global_batch"];
    row.l.tp = r["tp"], row.l.pp = r["pp"], row.l.dp = r["dp"], row.l.mb = r["micro_batch"];
    row.l.recompute = parse_recompute(r["recompute"]);
    row.l.sp = r["sequence_parallel"].get<bool>();
    if (r.contains("virtual_stages_per_pipeline_rank")) {
      row.l.schedule = "interleaved";
      row.l.v = r["virtual_stages_per_pipeline_rank"];
    }
    row.measured = r["measured"]["iteration_time_s"];
    rows.push_back(row);
  }
  return rows;
}

Prediction predict_korthikanti(const KorthikantiRow& row, double efficiency) {
  Cluster c = cluster_preset("a100-80gb", row.l.gpus(), 8);
  c.device.gemm_efficiency = efficiency;
  const Prediction p = evaluate(row.w, row.l, c, execution_preset("megatron"));
  EXPECT_TRUE(p.problem.empty()) << row.id << ": " << p.problem;
  return p;
}

// The A100's efficiency, calibrated on one point: 175B with selective recomputation and sp,
// 13.75 s.
double a100_efficiency(const std::vector<KorthikantiRow>& rows) {
  const KorthikantiRow& anchor = *std::find_if(rows.begin(), rows.end(), [](const auto& r) {
    return r.id == "korthikanti2022_175B_selective_sp";
  });
  return calibrate_efficiency([&](double eff) { return predict_korthikanti(anchor, eff).step_s; },
                              anchor.measured);
}

TEST(PlannerPublished, KorthikantiTable5IterationTimes) {
  const std::vector<KorthikantiRow> rows = korthikanti_rows();
  ASSERT_EQ(rows.size(), 8u);
  const double eff = a100_efficiency(rows);
  Errors errors;
  for (const KorthikantiRow& row : rows) {
    const Prediction p = predict_korthikanti(row, eff);
    std::printf("%-40s measured %7.2f s predicted %7.2f s (%+.1f%%) memory %.1f GB%s\n",
                row.id.c_str(), row.measured, p.step_s, 100 * (p.step_s / row.measured - 1),
                p.memory.total() / 1e9, p.oom ? " OOM" : "");
    if (row.id != "korthikanti2022_175B_selective_sp") errors.add(p.step_s, row.measured);
  }
  std::printf("calibrated A100 GEMM efficiency %.3f\n", eff);
  errors.expect_within_goal("Korthikanti et al., Table 5");
}

// torchtitan's Llama runs: the published model's shape (the llama block: SwiGLU, grouped-query
// attention, untied output), FSDP2 as ZeRO-3 over every GPU, its recomputation options (op-level
// selective: Execution "torchtitan"; layer-level: "torchtitan-layer-sac").
TransformerShape llama_shape(const nlohmann::json& m) {
  TransformerShape s{m["layers"], m["hidden"], m["heads"], m["seq_len"], m["vocab"]};
  s.block = parse_block(m["block"]);
  s.ffn_hidden = m["ffn_hidden"];
  s.kv_heads = m["kv_heads"];
  return s;
}

// torchtitan's MFU (6 N + 12 l h s FLOPs per token, N every parameter, 312 TFLOP/s for the A100)
// from the planner's parameter count reproduces each printed A100 MFU to its last digit: the
// Llama block's count is torchtitan's.
TEST(PlannerWorkload, LlamaParameterCountsGiveTorchtitansPrintedMfu) {
  int rows = 0;
  const nlohmann::json runs = published_runs();
  for (const auto& r : runs["runs"]) {
    if (r["source"] != "torchtitan_a100_perf_doc") continue;
    const TransformerShape m = llama_shape(r["model"]);
    const double flops_per_token =
        6.0 * m.parameters() + 12.0 * double(m.layers) * double(m.hidden) * double(m.seq);
    const double mfu =
        100.0 * flops_per_token * r["measured"]["tokens_per_s_per_gpu"].get<double>() / 312e12;
    EXPECT_NEAR(mfu, r["measured"]["mfu_percent"].get<double>(), 0.05) << r["id"];
    ++rows;
  }
  EXPECT_EQ(rows, 8);
}

TEST(PlannerPublished, TorchtitanLlamaThroughput) {
  struct Row {
    std::string id, gpu, execution;
    Workload w;
    Layout l;
    double measured_tps = 0;  // tokens/s per GPU
    double measured_gib = 0;  // peak memory, where printed
  };
  std::vector<Row> rows;
  const nlohmann::json runs = published_runs();
  for (const auto& r : runs["runs"]) {
    const std::string source = r["source"];
    if (source.rfind("torchtitan", 0) != 0 || !r.contains("fsdp")) continue;
    // Float8 GEMMs, torch.compile's fusions and context parallelism are not modelled.
    if (r.value("float8", false) || r.value("techniques", std::string("FSDP")) != "FSDP" ||
        r.contains("cp"))
      continue;
    Row row;
    row.id = r["id"];
    row.gpu = source == "torchtitan_a100_perf_doc" ? "a100-80gb" : "h100-sxm";
    row.w = {llama_shape(r["model"]), r["global_batch"]};
    row.l.dp = r["fsdp"], row.l.tp = r["tp"], row.l.pp = r["pp"];
    row.l.zero = 3;
    row.l.mb = r["local_batch"];
    const std::string recompute = r["recompute"];
    row.l.recompute = recompute == "full"   ? Recompute::kFull
                      : recompute == "none" ? Recompute::kNone
                                            : Recompute::kSelective;
    row.execution = recompute == "selective layer" ? "torchtitan-layer-sac" : "torchtitan";
    row.measured_tps = r["measured"]["tokens_per_s_per_gpu"];
    row.measured_gib = r["measured"].value("peak_memory_gib", 0.0);
    rows.push_back(row);
  }
  ASSERT_EQ(rows.size(), 10u);  // 8 on A100s, 2 on H100s

  const std::string h100_anchor = "torchtitan_h100_t1_8b_8gpu_FSDP";
  auto predict = [&](const Row& row, double efficiency) {
    Cluster c = cluster_preset(row.gpu, row.l.gpus(), 8);
    c.device.gemm_efficiency = efficiency;
    if (row.gpu == "h100-sxm") c.device.memory_bytes = 96e9;  // "96GB HBM2e"
    const Prediction p = evaluate(row.w, row.l, c, execution_preset(row.execution));
    EXPECT_TRUE(p.problem.empty()) << row.id << ": " << p.problem;
    return p;
  };
  // The A100's efficiency is Megatron's runs' (above): the torchtitan A100 rows are predicted
  // from another runtime's calibration. Their H100s (500 W, HBM2e: "between SXM and NVL", peak
  // unknown) are calibrated on one run, 8 GPUs in one node.
  const double a100 = a100_efficiency(korthikanti_rows());
  const Row& anchor =
      *std::find_if(rows.begin(), rows.end(), [&](const Row& r) { return r.id == h100_anchor; });
  const double seq_tokens = double(anchor.w.model.seq * anchor.w.global_batch);
  const double h100 = calibrate_efficiency([&](double eff) { return predict(anchor, eff).step_s; },
                                           seq_tokens / (anchor.measured_tps * anchor.l.gpus()));

  Errors errors;
  for (const Row& row : rows) {
    const Prediction p = predict(row, row.gpu == "a100-80gb" ? a100 : h100);
    const double tps = p.tokens_per_s / row.l.gpus();
    std::printf("%-45s measured %6.0f tokens/s/GPU predicted %6.0f (%+.1f%%)", row.id.c_str(),
                row.measured_tps, tps, 100 * (tps / row.measured_tps - 1));
    // The printed memory is PyTorch's caching allocator's peak reservation, which the planner
    // does not model (its device fragmentation is a flat 5%): shown, not held to a bound.
    if (row.measured_gib > 0)
      std::printf(", memory measured %.1f GiB predicted %.1f GiB (%+.1f%%)", row.measured_gib,
                  p.memory.total() / 1073741824.0,
                  100 * (p.memory.total() / 1073741824.0 / row.measured_gib - 1));
    std::printf("\n");
    if (row.id != h100_anchor) errors.add(tps, row.measured_tps);
  }
  std::printf("GEMM efficiency: A100 %.3f (from Korthikanti et al.), H100 %.3f (from %s)\n", a100,
              h100, h100_anchor.c_str());
  errors.expect_within_goal("torchtitan, Llama with FSDP2");
}

}  // namespace
}  // namespace loom::planner
