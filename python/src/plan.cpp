// The planner (planner/) as loom._loom._plan: searches or evaluates layouts and returns the same
// JSON records as `loom-plan --json` (planner/report.h), as text; python/loom/planner.py parses
// them into dicts behind loom.plan. The search runs without the GIL.
#include <pybind11/stl.h>

#include <optional>
#include <string>

#include "bindings.h"
#include "planner/report.h"
#include "planner/search.h"

namespace loom::python {

void init_plan(py::module_& m) {
  m.def(
      "_plan",
      [](int64_t layers, int64_t hidden, int64_t heads, int64_t seq, int64_t vocab,
         int64_t global_batch, int gpus, int gpus_per_node, const std::string& gpu,
         const std::string& profile, const std::string& execution, int top,
         const std::string& evaluate, int64_t moe_experts, int64_t moe_top_k, int64_t moe_every,
         int64_t moe_hidden, double moe_aux_loss, const std::string& block, int64_t ffn_hidden,
         int64_t kv_heads, std::optional<double> moe_load, double moe_capacity_factor) {
        planner::Workload w{{layers,
                             hidden,
                             heads,
                             seq,
                             vocab,
                             {moe_experts, moe_top_k, moe_every, moe_hidden, moe_aux_loss > 0,
                              moe_load ? *moe_load : planner::default_moe_load(moe_capacity_factor),
                              moe_capacity_factor},
                             planner::parse_block(block),
                             ffn_hidden,
                             kv_heads},
                            global_batch};
        w.check();
        planner::Cluster c = planner::cluster_preset(gpu, gpus, gpus_per_node);
        if (!profile.empty()) c = planner::read_profile(profile, c);
        c.check();
        const planner::Execution e = planner::execution_preset(execution);
        py::gil_scoped_release release;
        if (!evaluate.empty())
          return planner::prediction_json(
                     planner::evaluate(w, planner::parse_layout(evaluate, gpus), c, e))
              .dump();
        LOOM_CHECK(top >= 1, "loom.plan: top must be at least 1, got ", top);
        planner::SearchOptions o;
        o.top = top;
        return planner::search_json(planner::search(w, c, e, o)).dump();
      },
      py::arg("layers"), py::arg("hidden"), py::arg("heads"), py::arg("seq"), py::arg("vocab"),
      py::arg("global_batch"), py::arg("gpus"), py::arg("gpus_per_node"), py::arg("gpu"),
      py::arg("profile"), py::arg("execution"), py::arg("top"), py::arg("evaluate"),
      py::arg("moe_experts"), py::arg("moe_top_k"), py::arg("moe_every"), py::arg("moe_hidden"),
      py::arg("moe_aux_loss"), py::arg("block"), py::arg("ffn_hidden"), py::arg("kv_heads"),
      py::arg("moe_load"), py::arg("moe_capacity_factor"));
}

}  // namespace loom::python
