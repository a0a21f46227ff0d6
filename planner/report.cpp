#include "planner/report.h"

namespace loom::planner {

namespace {

nlohmann::json memory_json(const MemoryBreakdown& m) {
  return {{"parameters", m.parameters},
          {"gradients", m.gradients},
          {"optimizer_state", m.optimizer_state},
          {"activations", m.activations},
          {"gathered", m.gathered},
          {"working", m.working},
          {"gradients_at_peak", m.gradients_at_peak},
          {"reserved", m.reserved},
          {"total", m.total()}};
}

}  // namespace

nlohmann::json prediction_json(const Prediction& p) {
  nlohmann::json j;
  j["layout"] = p.layout.str();
  if (!p.problem.empty()) {
    j["problem"] = p.problem;
    return j;
  }
  j["step_s"] = p.step_s;
  j["tokens_per_s"] = p.tokens_per_s;
  j["model_tflops_per_gpu"] = p.model_tflops_per_gpu;
  j["hardware_tflops_per_gpu"] = p.hardware_tflops_per_gpu;
  j["mfu"] = p.mfu;
  j["bubble"] = p.bubble;
  j["comm_s"] = p.comm_s;
  j["pipeline_s"] = p.pipeline_s;
  j["dp_exposed_s"] = p.step.dp_exposed;
  j["optimizer_s"] = p.step.optimizer;
  j["memory_bytes"] = memory_json(p.memory);
  j["memory_bytes"]["pipeline_rank"] = p.memory_rank;
  j["memory_per_pipeline_rank"] = nlohmann::json::array();
  for (const MemoryBreakdown& m : p.memory_per_rank)
    j["memory_per_pipeline_rank"].push_back(memory_json(m));
  j["oom"] = p.oom;
  return j;
}

nlohmann::json search_json(const SearchResult& r) {
  nlohmann::json j;
  j["plans"] = nlohmann::json::array();
  j["why_slower"] = nlohmann::json::array();
  for (size_t i = 0; i < r.ranked.size(); ++i) {
    j["plans"].push_back(prediction_json(r.ranked[i]));
    if (i > 0) j["why_slower"].push_back(why_slower(r.ranked.front(), r.ranked[i]));
  }
  j["candidates"] = r.candidates;
  j["invalid"] = r.invalid;
  j["unsupported"] = r.unsupported;
  j["oom"] = r.oom;
  j["simulated"] = r.simulated;
  j["pruned"] = r.pruned;
  j["search_s"] = r.seconds;
  return j;
}

}  // namespace loom::planner
