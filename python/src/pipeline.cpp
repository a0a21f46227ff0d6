// Pipeline parallelism (parallel/pipeline) as loom._loom.pipeline: schedules as data (generators,
// the text form), the validator, the executor with chunks whose forward, loss and gradient sync
// are Python callables or C++ stages, the GPT stages and their helpers, and the timelines.
// python/loom/distributed/pipelining.py re-exports these and wraps GptStage as a loom.nn module.
//
// Note [Python callables in the executor]
// PipelineExecutor.run releases the GIL for the whole step. A chunk's forward, loss, sync and
// sync_wait, and the before-forward hook, are std::functions; when built from Python callables
// they hold the Python objects (pybind11's function wrapper keeps a reference), and calling one
// re-acquires the GIL for the call. So a Python-defined loom.nn.Module is a valid forward; the
// autograd graph it records is C++ and the backward runs with the GIL released. A Python
// exception raised in a callable travels through the executor as pybind11's error_already_set
// and comes out of run() as the same exception. The step is then abandoned: gradients already
// accumulated stay in the parameters (zero them before retrying). With several ranks, the
// raising rank first waits (up to the group's timeout_seconds) for the messages it had posted;
// its peers block on the receives it will not send and fail with a communication error
// (RuntimeError) when the group's timeout passes: lower pp.timeout_seconds, or let mpirun
// abort the job on the first failing rank.
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "collectives/communicator.h"
#include "core/nn/gpt_config.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/generators.h"
#include "parallel/pipeline/gpt_stage.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/trace.h"
#include "parallel/pipeline/validator.h"

namespace loom::python {
namespace {

namespace pp = parallel::pipeline;
using comm::Communicator;
using Release = py::call_guard<py::gil_scoped_release>;
using CommPtr = std::shared_ptr<Communicator>;

py::tuple shape_tuple(const Shape& s) {
  py::tuple t(s.size());
  for (size_t i = 0; i < s.size(); ++i) t[i] = s[i];
  return t;
}

// A Python callable (or None when `optional`) for a StageChunk field.
template <typename Fn>
Fn callable_arg(py::handle obj, const char* name, bool optional) {
  if (obj.is_none()) {
    if (optional) return Fn();
    throw py::type_error(std::string("StageChunk: ") + name + " must be callable, got None");
  }
  if (!PyCallable_Check(obj.ptr()))
    throw py::type_error(std::string("StageChunk: ") + name + " must be callable, got " +
                         std::string(py::str(py::type::of(obj).attr("__name__"))));
  return obj.cast<Fn>();
}

// run()'s tokens / targets: None (every micro-batch's is unused here) or a sequence of m tensors
// or Nones (the stages that do not read them).
std::vector<Tensor> batch_arg(py::handle obj, int m, const char* name) {
  std::vector<Tensor> out;
  if (obj.is_none()) return std::vector<Tensor>(size_t(m));
  if (!py::isinstance<py::sequence>(obj))
    throw py::type_error(std::string("PipelineExecutor.run: ") + name +
                         " must be a list of tensors (one per micro-batch) or None");
  for (py::handle t : obj) out.push_back(t.is_none() ? Tensor() : t.cast<Tensor>());
  return out;
}

std::string schedule_repr(const pp::Schedule& s) {
  return "<loom Schedule '" + s.name + "' ranks " + std::to_string(s.ranks) + ", " +
         std::to_string(s.pipelines) + " pipeline(s) of " + std::to_string(s.stages) + " stages, " +
         std::to_string(s.microbatches) + " micro-batches>";
}

void init_schedules(py::module_& p) {
  py::class_<pp::Action>(p, "Action", "One action of a rank's list (See Schedule.actions).")
      .def_property_readonly(
          "kind", [](const pp::Action& a) { return std::string(action_token(a.kind)); },
          "'F', 'B', 'W', 'SA', 'RA', 'SG', 'RG' or 'SYNC'")
      .def_readonly("microbatch", &pp::Action::microbatch, "-1 for SYNC")
      .def_readonly("chunk", &pp::Action::chunk, "an index into the rank's chunks")
      .def_readonly("peer", &pp::Action::peer, "the other rank of a send or receive, else -1")
      .def("__eq__", [](const pp::Action& a, const pp::Action& b) { return a == b; })
      .def("__str__", &pp::Action::str)
      .def("__repr__", [](const pp::Action& a) { return "<Action " + a.str() + ">"; });

  py::class_<pp::ChunkPlace>(p, "ChunkPlace", "Where a rank's chunk sits: (pipeline, stage).")
      .def_readonly("pipeline", &pp::ChunkPlace::pipeline)
      .def_readonly("stage", &pp::ChunkPlace::stage)
      .def("__eq__", [](const pp::ChunkPlace& a, const pp::ChunkPlace& b) { return a == b; })
      .def("__repr__", [](const pp::ChunkPlace& c) {
        return "ChunkPlace(pipeline=" + std::to_string(c.pipeline) +
               ", stage=" + std::to_string(c.stage) + ")";
      });

  py::class_<pp::Schedule>(p, "Schedule", R"(A pipeline schedule as data: each rank's actions.

    s = pipelining.schedule("1f1b", ranks=4, microbatches=8)
    s.chunks[r]            # rank r's chunks: [ChunkPlace(pipeline=0, stage=r)]
    s.holder(0, 3)         # (rank, chunk) holding stage 3 of pipeline 0
    [str(a) for a in s.actions[0]][:2]     # ['F mb 0 chunk 0', 'SA mb 0 chunk 0 -> rank 1']
    text = str(s)          # the text form; pipelining.parse_schedule(text) reads it back
)")
      .def_readonly("name", &pp::Schedule::name)
      .def_readonly("ranks", &pp::Schedule::ranks)
      .def_readonly("pipelines", &pp::Schedule::pipelines)
      .def_readonly("stages", &pp::Schedule::stages, "stages per pipeline")
      .def_readonly("microbatches", &pp::Schedule::microbatches)
      .def_readonly("chunks", &pp::Schedule::chunks, "[rank][chunk]: ChunkPlace")
      .def_readonly("pipeline_of", &pp::Schedule::pipeline_of,
                    "[microbatch]: the pipeline it runs through")
      .def_readonly("actions", &pp::Schedule::actions, "[rank]: Actions in order")
      .def_property_readonly("chunks_per_rank", &pp::Schedule::chunks_per_rank)
      .def("holder", &pp::Schedule::holder, py::arg("pipeline"), py::arg("stage"),
           "(rank, chunk) holding stage `stage` of `pipeline` (ValueError when none does).")
      .def("__str__", &pp::format_schedule)
      .def("__repr__", &schedule_repr)
      .def("__eq__", [](const pp::Schedule& a, const pp::Schedule& b) {
        return a.name == b.name && a.ranks == b.ranks && a.pipelines == b.pipelines &&
               a.stages == b.stages && a.microbatches == b.microbatches && a.chunks == b.chunks &&
               a.pipeline_of == b.pipeline_of && a.actions == b.actions;
      });

  p.def("schedule", &pp::make_schedule, py::arg("name"), py::arg("ranks"), py::arg("microbatches"),
        py::arg("virtual_stages") = 1,
        "A published schedule by name: 'gpipe', '1f1b', 'interleaved' (virtual_stages chunks "
        "per rank), 'chimera'. ValueError for an unknown name or bad sizes.");
  p.def("parse_schedule", &pp::parse_schedule, py::arg("text"), py::arg("source") = "schedule",
        "A schedule from its text form (ValueError naming the line).");
  p.def("read_schedule", &pp::read_schedule_file, py::arg("path"), Release(),
        "parse_schedule of a file's text.");
  p.def("format_schedule", &pp::format_schedule, py::arg("schedule"), "The text form (= str(s)).");
  p.def("check_well_formed", &pp::check_well_formed, py::arg("schedule"),
        "ValueError naming the rank and action when the bookkeeping is wrong.");

  py::class_<pp::RankStats>(p, "RankStats")
      .def_readonly("busy", &pp::RankStats::busy)
      .def_readonly("finish", &pp::RankStats::finish)
      .def_readonly("bubble", &pp::RankStats::bubble)
      .def_readonly("peak_activations", &pp::RankStats::peak_activations)
      .def("__repr__", [](const pp::RankStats& r) {
        return "RankStats(busy=" + std::to_string(r.busy) + ", finish=" + std::to_string(r.finish) +
               ", bubble=" + std::to_string(r.bubble) +
               ", peak_activations=" + std::to_string(r.peak_activations) + ")";
      });
  py::class_<pp::Simulation>(p, "Simulation", "What validate() found: makespan and per-rank stats.")
      .def_readonly("makespan", &pp::Simulation::makespan)
      .def_readonly("ranks", &pp::Simulation::ranks, "[rank]: RankStats")
      .def_property_readonly("bubbles",
                             [](const pp::Simulation& s) {
                               std::vector<double> out;
                               for (const auto& r : s.ranks) out.push_back(r.bubble);
                               return out;
                             })
      .def_property_readonly("peak_activations",
                             [](const pp::Simulation& s) {
                               std::vector<int> out;
                               for (const auto& r : s.ranks) out.push_back(r.peak_activations);
                               return out;
                             })
      .def("report", &pp::Simulation::report)
      .def("__str__", &pp::Simulation::report);
  p.def(
      "validate",
      [](const pp::Schedule& s, double forward, double backward, double weight_grad,
         double transfer) {
        pp::CostModel costs;
        costs.forward = forward;
        costs.backward = backward;
        costs.weight_grad = weight_grad;
        costs.transfer = transfer;
        return pp::validate(s, costs);
      },
      py::arg("schedule"), py::kw_only(), py::arg("forward") = 1.0, py::arg("backward") = 1.0,
      py::arg("weight_grad") = 1.0, py::arg("transfer") = 0.0, Release(),
      "Simulates every rank's actions under the cost model; ValueError naming the rank and "
      "action for a broken dependency or a deadlock.");
}

void init_executor(py::module_& p) {
  py::class_<pp::StageChunk>(p, "StageChunk", R"(One chunk of this rank for the executor.

forward(input) -> output; on a last stage loss(output, targets) -> scalar. At SYNC the executor
calls sync() (start the chunk's gradient reduction without blocking), and sync_wait() after the
step's actions. Any callable works (a loom.nn.Module instance included); see
Note [Python callables in the executor].

    chunk = pipelining.StageChunk(model, loss=lambda out, t: F.cross_entropy(out, t))
)")
      .def(py::init([](py::object forward, py::object loss, py::object sync, py::object sync_wait) {
             pp::StageChunk c;
             c.forward = callable_arg<decltype(c.forward)>(forward, "forward", false);
             c.loss = callable_arg<decltype(c.loss)>(loss, "loss", true);
             c.sync = callable_arg<decltype(c.sync)>(sync, "sync", true);
             c.sync_wait = callable_arg<decltype(c.sync_wait)>(sync_wait, "sync_wait", true);
             return c;
           }),
           py::arg("forward"), py::arg("loss") = py::none(), py::arg("sync") = py::none(),
           py::arg("sync_wait") = py::none())
      .def_property_readonly("has_loss", [](const pp::StageChunk& c) { return bool(c.loss); })
      .def_property_readonly("has_sync", [](const pp::StageChunk& c) { return bool(c.sync); });

  py::class_<pp::GradientSum, std::shared_ptr<pp::GradientSum>>(
      p, "GradientSum",
      "Gradients of `params` summed (or averaged) over `group` in one allreduce, started and "
      "finished separately: StageChunk(f, sync=gs.start, sync_wait=gs.wait).")
      .def(py::init<std::vector<Tensor>, CommPtr, bool>(), py::arg("params"), py::arg("group"),
           py::arg("average") = false)
      .def("start", &pp::GradientSum::start, Release())
      .def("wait", &pp::GradientSum::wait, Release());

  py::class_<pp::TimedAction>(p, "TimedAction", "An action of the last step and its times (s).")
      .def_readonly("action", &pp::TimedAction::action)
      .def_readonly("start", &pp::TimedAction::start)
      .def_readonly("end", &pp::TimedAction::end)
      .def("__repr__", [](const pp::TimedAction& t) {
        return "<TimedAction " + t.action.str() + " " + std::to_string(t.end - t.start) + " s>";
      });

  p.def("receive_posts", &pp::receive_posts, py::arg("actions"));

  py::class_<pp::PipelineExecutor>(p, "PipelineExecutor", R"(Runs this rank's actions of a step.

    ex = pipelining.PipelineExecutor(schedule, pp_group, [chunk], activation_shape=(rows, T, C))
    local = ex.run(tokens, targets)        # lists of m tensors; GIL released
    loss = ex.mean_loss(local)             # collective over pp_group
)")
      .def(py::init([](const pp::Schedule& schedule, CommPtr group,
                       std::vector<pp::StageChunk> chunks, std::vector<int64_t> activation) {
             if (!group) throw py::value_error("PipelineExecutor: pp_group is None");
             const int rank = group->rank();
             if (rank < schedule.ranks && chunks.size() == schedule.chunks[size_t(rank)].size())
               for (size_t c = 0; c < chunks.size(); ++c)
                 if (schedule.chunks[size_t(rank)][c].stage == schedule.stages - 1 &&
                     !chunks[c].loss)
                   throw py::value_error("PipelineExecutor: chunk " + std::to_string(c) +
                                         " of rank " + std::to_string(rank) +
                                         " is a last stage and needs a loss");
             py::gil_scoped_release release;
             return std::make_unique<pp::PipelineExecutor>(schedule, std::move(group),
                                                           std::move(chunks), Shape(activation));
           }),
           py::arg("schedule"), py::arg("pp_group"), py::arg("chunks"), py::arg("activation_shape"))
      .def(
          "run",
          [](pp::PipelineExecutor& self, py::object tokens, py::object targets,
             std::optional<std::vector<double>> weights) {
            const int m = self.schedule().microbatches;
            std::vector<Tensor> tok = batch_arg(tokens, m, "tokens");
            std::vector<Tensor> tgt = batch_arg(targets, m, "targets");
            std::vector<double> w = weights.value_or(std::vector<double>());
            py::gil_scoped_release release;
            return self.run(tok, tgt, w);
          },
          py::arg("tokens"), py::arg("targets"), py::arg("weights") = py::none(),
          "One step. tokens, targets: m tensors each (None where this rank does not read them). "
          "Micro-batch k's loss is weighted weights[k] (default 1/m). Returns the weighted sum "
          "of the losses whose last stage is on this rank (0 elsewhere).")
      .def("mean_loss", &pp::PipelineExecutor::mean_loss, py::arg("local"), Release(),
           "The sum over the pipeline group of run()'s results (collective).")
      .def(
          "set_before_forward",
          [](pp::PipelineExecutor& self, py::object hook) {
            if (hook.is_none()) {
              self.set_before_forward(nullptr);
              return;
            }
            if (!PyCallable_Check(hook.ptr()))
              throw py::type_error("set_before_forward: hook must be callable or None");
            self.set_before_forward(hook.cast<std::function<void(int)>>());
          },
          py::arg("hook"), "hook(microbatch) before every forward (None removes it).")
      .def_property_readonly("schedule", &pp::PipelineExecutor::schedule)
      .def_property_readonly("timeline", &pp::PipelineExecutor::timeline,
                             "The last run()'s TimedActions.");
}

void init_gpt_stages(py::module_& p) {
  py::class_<pp::GptStage, nn::Module, std::shared_ptr<pp::GptStage>>(p, "GptStage")
      .def(py::init([](const GptConfig& config, int stage, int stages, double dropout, CommPtr tp,
                       bool sequence_parallel, bool checkpoint) {
             auto s = std::make_shared<pp::GptStage>(config, stage, stages, dropout, std::move(tp),
                                                     sequence_parallel);
             s->set_checkpointing(checkpoint);
             return s;
           }),
           py::arg("config"), py::arg("stage"), py::arg("stages"), py::arg("dropout") = 0.0,
           py::arg("tp") = py::none(), py::arg("sequence_parallel") = false,
           py::arg("checkpoint") = false, Release())
      .def_property_readonly("is_first", &pp::GptStage::is_first)
      .def_property_readonly("is_last", &pp::GptStage::is_last)
      .def_property_readonly("config", &pp::GptStage::config)
      .def("loss", &pp::GptStage::loss, py::arg("logits"), py::arg("targets"), Release())
      .def_property_readonly("wte_weight",
                             [](const pp::GptStage& s) -> py::object {
                               Tensor w = s.wte_weight();
                               if (!w.defined()) return py::none();
                               return py::cast(w);
                             })
      .def(
          "activation_shape",
          [](const pp::GptStage& s, int64_t rows, int64_t seq) {
            return shape_tuple(s.activation_shape(rows, seq));
          },
          py::arg("rows"), py::arg("seq"));

  py::class_<pp::StageSet, nn::Module, std::shared_ptr<pp::StageSet>>(p, "StageSet")
      .def(py::init<>())
      .def("add", &pp::StageSet::add, py::arg("stage"));

  p.def("stage_layers", py::overload_cast<const GptConfig&, int, int>(&pp::stage_layers),
        py::arg("config"), py::arg("stage"), py::arg("stages"));
  p.def("stage_layers", py::overload_cast<int64_t, int, int>(&pp::stage_layers), py::arg("layers"),
        py::arg("stage"), py::arg("stages"));
  p.def("stage_costs", &pp::stage_costs, py::arg("config"), py::arg("stages"));
  p.def(
      "replica_pairs",
      [](const pp::Schedule& s, Communicator& group) { return pp::replica_pairs(s, group); },
      py::arg("schedule"), py::arg("pp_group"), Release(),
      "Per stage: the group of the two ranks holding its replicas (Chimera), else None. "
      "Collective over pp_group.");
  p.def(
      "stage_chunk",
      [](const std::shared_ptr<pp::GptStage>& stage, CommPtr replica_pair, CommPtr dp_average,
         CommPtr expert_replicas) {
        return pp::stage_chunk(stage, std::move(replica_pair), std::move(dp_average),
                               std::move(expert_replicas));
      },
      py::arg("stage"), py::arg("replica_pair") = py::none(), py::arg("dp_average") = py::none(),
      py::arg("expert_replicas") = py::none(),
      "The executor's chunk of a GptStage (C++ forward, loss and gradient reductions; with "
      "expert_replicas, the experts' gradients summed over it and divided by dp).");
  p.def(
      "sync_tied_embedding",
      [](const std::vector<std::shared_ptr<pp::GptStage>>& stages, CommPtr group) {
        std::vector<pp::GptStage*> local;
        for (const auto& s : stages) local.push_back(s.get());
        pp::sync_tied_embedding(local, group.get());
      },
      py::arg("stages"), py::arg("group") = py::none(), Release(),
      "Sums the gradients of every copy of wte.weight in `stages` and over `group`.");
  p.def(
      "embedding_group",
      [](const pp::Schedule& schedule, Communicator& pp_group) {
        return pp::embedding_group(schedule, pp_group);
      },
      py::arg("schedule"), py::arg("pp_group"), Release(),
      "sync_tied_embedding's group (collective over pp_group); None off it.");
}

void init_trace(py::module_& p) {
  p.def("gather_timelines", &pp::gather_timelines, py::arg("mine"), py::arg("group"), Release(),
        "Every rank's timeline on every rank of group (collective): [rank][TimedAction].");
  p.def("measured_bubbles", &pp::measured_bubbles, py::arg("timelines"));
  py::class_<pp::ChromeTrace>(p, "ChromeTrace", "Pipeline steps as a Chrome trace (Perfetto).")
      .def(py::init<>())
      .def("add_step", &pp::ChromeTrace::add_step, py::arg("step"), py::arg("timelines"))
      .def("write", &pp::ChromeTrace::write, py::arg("path"), Release())
      .def("json", &pp::ChromeTrace::json);
}

}  // namespace

void init_pipeline(py::module_& m) {
  py::module_ p = m.def_submodule(
      "pipeline", "loom's pipeline parallelism (import loom.distributed.pipelining instead)");
  init_schedules(p);
  init_executor(p);
  init_gpt_stages(p);
  init_trace(p);
}

}  // namespace loom::python
