// planner/data/published_runs.json: the published training runs the planner's tests predict
// (sources, quotes and conventions inside the file). Tests run from the source tree.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

namespace loom::testing {

inline nlohmann::json published_runs() {
  std::ifstream in("planner/data/published_runs.json");
  EXPECT_TRUE(in.good()) << "planner/data/published_runs.json (run from the source tree)";
  return nlohmann::json::parse(in);
}

}  // namespace loom::testing
