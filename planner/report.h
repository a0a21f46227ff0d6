// The planner's records as JSON: what `loom-plan --json` prints and `loom.plan` returns, so the
// CLI and Python read the same fields. Seconds, bytes, FLOP/s per GPU in TFLOP/s, shares in [0, 1].
#pragma once

#include <nlohmann/json.hpp>

#include "planner/search.h"

namespace loom::planner {

// {"layout", "step_s", "tokens_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu",
//  "bubble", "comm_s", "pipeline_s", "dp_exposed_s", "optimizer_s", "memory_bytes": {...},
//  "memory_per_pipeline_rank": [...], "oom"}; an invalid layout: {"layout", "problem"}.
nlohmann::json prediction_json(const Prediction& p);
// {"plans": [prediction_json...], "why_slower": [one per runner-up], "candidates", "invalid",
//  "oom", "simulated", "pruned", "search_s"}.
nlohmann::json search_json(const SearchResult& r);

}  // namespace loom::planner
