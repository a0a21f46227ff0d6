// Distributed checkpoints (parallel/checkpoint/) as loom._loom.checkpoint: save and load a
// (module, optimizer) training state, or a module's parameters alone, with the run's JSON state
// (python/loom/distributed/checkpoint.py passes a dict and gets one back); latest, verify and the
// manifest. python/loom/distributed/checkpoint.py gives them their keyword arguments and checks;
// this file converts and guards the C++ calls.
//
// The one decision: the JSON state crosses as Python's own json text (json.dumps / json.loads),
// not by walking the objects here: one conversion with Python's rules (ints of any size, no NaN),
// and nlohmann's parser checks what arrives. save and load release the GIL for everything after
// the conversion: they are collective, and the tensors they read and write are held by C++ (a
// Python-defined module's node holds the very parameters: Note [Python modules as C++ modules]).
#include <pybind11/stl.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "collectives/communicator.h"
#include "core/error.h"
#include "core/nn/module.h"
#include "optimizer/optimizer.h"
#include "parallel/checkpoint/checkpoint.h"
#include "parallel/checkpoint/durable.h"
#include "parallel/checkpoint/training_state.h"
#include "parallel/pipeline/gpt_stage.h"
#include "parallel/zero.h"

namespace loom::python {
namespace {

namespace ckpt = parallel::checkpoint;
using GroupPtr = std::shared_ptr<comm::Communicator>;
using ModulePtr = std::shared_ptr<nn::Module>;
using OptimizerPtr = std::shared_ptr<optim::Optimizer>;
using Release = py::call_guard<py::gil_scoped_release>;

constexpr const char* kOwner = "loom.distributed.checkpoint";

nlohmann::json json_arg(py::handle obj) {
  const std::string text = py::module_::import("json")
                               .attr("dumps")(obj, py::arg("allow_nan") = false)
                               .cast<std::string>();
  nlohmann::json j = nlohmann::json::parse(text);
  LOOM_CHECK(j.is_object(), kOwner, ": the state must be a dict, got ", j.type_name());
  return j;
}

py::object json_object(const nlohmann::json& j) {
  return py::module_::import("json").attr("loads")(
      j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

// A checkpoint root (what save's path names) stands for its latest committed step directory.
std::string resolve(const std::string& path) {
  if (ckpt::path_exists(path + "/manifest.json")) return path;
  const std::string latest = ckpt::latest_checkpoint(path);
  return latest.empty() ? path : latest;
}

// The single-process names of a module's parameters: a pipeline's StageSet prefixes each stage's
// with "chunk{k}."; every other module (a GPTStage too) already uses them.
ckpt::TrainingState::GlobalName global_names(const nn::Module& module) {
  if (dynamic_cast<const parallel::pipeline::StageSet*>(&module))
    return parallel::pipeline::StageSet::single_process_name;
  return {};
}

// TrainingState pairs the module's parameters with the optimizer's by position: check that they
// are the same tensors (a plain optimizer) or the same names (ZeRO over the module).
void check_optimizer_of(const nn::Module& module, const optim::Optimizer& optimizer) {
  const auto named = module.named_parameters();
  if (const auto* zero = dynamic_cast<const parallel::ZeroOptimizer*>(&optimizer)) {
    const auto& own = zero->named_parameters();
    bool same = own.size() == named.size();
    for (size_t i = 0; same && i < own.size(); ++i) same = own[i].first == named[i].first;
    LOOM_CHECK(same, kOwner, ": the ZeroRedundancyOptimizer shards ", own.size(),
               " parameters that are not the model's ", named.size(),
               ": pass the module it was built over");
    return;
  }
  const std::vector<Tensor>& params = optimizer.params();
  LOOM_CHECK(params.size() == named.size(), kOwner, ": the optimizer (", optimizer.name(),
             ") steps ", params.size(), " tensors but the model has ", named.size(),
             " parameters: build it over model.parameters(), all of them, in order");
  for (size_t i = 0; i < params.size(); ++i)
    LOOM_CHECK(params[i].same_as(named[i].second), kOwner, ": the optimizer's tensor ", i,
               " is not the model's parameter ", named[i].first,
               ": build the optimizer over model.parameters(), in order");
}

// The module's parameters as "model.*" pieces (views: loading writes into them).
std::vector<ckpt::StatePiece> parameter_pieces(const nn::Module& module) {
  std::vector<ckpt::ParamPlace> places = ckpt::parameter_places(module);
  if (const auto global = global_names(module))
    for (ckpt::ParamPlace& p : places) p.name = global(p.name);
  const std::vector<Tensor> params = module.parameters();
  for (size_t i = 0; i < places.size(); ++i) {
    // ZeRO-3 releases a parameter's memory between its module's uses.
    const bool released = params[i].storage() && params[i].storage()->released();
    LOOM_CHECK(!released && params[i].numel() == places[i].placement.numel(), kOwner,
               ": parameter ", places[i].name,
               " is not whole on this rank (a ZeRO-3 parameter between steps): pass the "
               "ZeroRedundancyOptimizer as optimizer=, or call its gather_parameters() first");
    LOOM_CHECK(params[i].is_contiguous(), kOwner, ": parameter ", places[i].name,
               " is not contiguous");
  }
  return ckpt::value_pieces(places, params);
}

py::dict save(const std::string& dir, int64_t step, const ModulePtr& module,
              const OptimizerPtr& optimizer, py::handle state_obj, GroupPtr group, int keep_last,
              uint64_t chunk_bytes) {
  if (!module) throw py::type_error(std::string(kOwner) + ".save: model is None");
  nlohmann::json state = json_arg(state_obj);
  LOOM_CHECK(keep_last >= 0, kOwner, ".save: keep_last must be >= 0, got ", keep_last);
  ckpt::SaveResult r;
  {
    py::gil_scoped_release release;
    if (!group) group = comm::world();
    std::vector<ckpt::StatePiece> pieces;
    if (optimizer) {
      check_optimizer_of(*module, *optimizer);
      pieces = ckpt::TrainingState(*module, *optimizer, global_names(*module)).save_pieces(state);
    } else {
      pieces = parameter_pieces(*module);  // save snapshots them before it returns
    }
    ckpt::SaveOptions o;
    o.keep_last = keep_last;
    o.chunk_bytes = chunk_bytes;
    r = ckpt::save(dir, step, pieces, state, *group, o);
  }
  py::dict out;
  out["path"] = r.path;
  out["bytes"] = r.bytes;
  out["total_bytes"] = r.total_bytes;
  out["seconds"] = r.seconds;
  return out;
}

py::dict load(const std::string& path, const ModulePtr& module, const OptimizerPtr& optimizer,
              GroupPtr group) {
  if (!module) throw py::type_error(std::string(kOwner) + ".load: model is None");
  std::string resolved;
  io::CheckpointManifest manifest;
  {
    py::gil_scoped_release release;
    if (!group) group = comm::world();
    resolved = resolve(path);
    manifest = ckpt::read_manifest(resolved);
    if (optimizer) {
      check_optimizer_of(*module, *optimizer);
      ckpt::TrainingState(*module, *optimizer, global_names(*module))
          .load(resolved, manifest, *group);
    } else {
      ckpt::load(resolved, manifest, parameter_pieces(*module), *group);
    }
  }
  py::dict out;
  out["path"] = resolved;
  out["step"] = manifest.step;
  out["state"] = json_object(manifest.state);
  return out;
}

}  // namespace

void init_checkpoint(py::module_& m) {
  py::module_ c = m.def_submodule(
      "checkpoint", "distributed checkpoints (import loom.distributed.checkpoint instead)");
  c.def("save", &save, py::arg("dir"), py::arg("step"), py::arg("module"),
        py::arg("optimizer").none(true), py::arg("state"), py::arg("group").none(true),
        py::arg("keep_last") = 0, py::arg("chunk_bytes") = uint64_t(1) << 20,
        R"(Saves step `step` under dir (DIR/step-XXXXXXXX/, two-phase commit, `latest` updated):
the module's parameters ("model.*") and, with an optimizer, its state ("optim.*", update counts in
state["optimizer_steps"]); `state` (a JSON-able dict, the same on every rank) goes into the
manifest. Collective over group (default: the world). Returns {path, bytes, total_bytes, seconds}.

    loom._loom.checkpoint.save("ckpt", 100, model._cpp_module(), opt._impl, {"epoch": 3}, None)
)");
  c.def("load", &load, py::arg("path"), py::arg("module"), py::arg("optimizer").none(true),
        py::arg("group").none(true),
        R"(Loads a checkpoint (a step directory, or a root: its latest) saved by any layout into the
module (and optimizer). Collective over group. Returns {path, step, state}.

    loom._loom.checkpoint.load("ckpt", model._cpp_module(), opt._impl, None)["step"]   # 100
)");
  c.def(
      "latest_checkpoint", [](const std::string& dir) { return ckpt::latest_checkpoint(dir); },
      py::arg("dir"), Release(),
      "The latest committed step directory in dir; '' when there is none.");
  c.def(
      "has_checkpoint",
      [](const std::string& dir, int64_t step) { return ckpt::has_checkpoint(dir, step); },
      py::arg("dir"), py::arg("step"), Release(),
      "Whether dir holds a committed checkpoint of this step.");
  c.def(
      "verify",
      [](const std::string& path) {
        std::string resolved;
        {
          py::gil_scoped_release release;
          resolved = resolve(path);
          ckpt::verify(resolved, ckpt::read_manifest(resolved));
        }
        return resolved;
      },
      py::arg("path"),
      "Reads every chunk of a checkpoint and checks its checksum; raises ValueError naming the "
      "first damaged file and tensor. Returns the step directory verified.");
  c.def(
      "read_manifest",
      [](const std::string& path) {
        std::string text;
        {
          py::gil_scoped_release release;
          text = ckpt::read_manifest(resolve(path)).to_json();
        }
        return py::module_::import("json").attr("loads")(text);
      },
      py::arg("path"), "A committed checkpoint's manifest as a dict (checked on reading).");
}

}  // namespace loom::python
