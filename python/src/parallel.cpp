// parallel/ as loom._loom.parallel: the device mesh, DistributedDataParallel, ZeRO
// (ZeroOptimizer over a C++ SGD or AdamW), the tensor-parallel layers and GPT, and the
// tensor-parallel helpers (gradient clipping, whole-state gather and load, vocab-parallel
// cross-entropy). python/loom/distributed/__init__.py and python/loom/nn/tensor_parallel.py give
// them PyTorch's names; this file only converts arguments.
//
// Lifetimes: DDP and ZeRO hold an nn::Module& (not owning); the bound objects keep the C++ module
// alive (PyDdp stores its shared_ptr, ZeroOptimizer's constructor has keep_alive<1, 2>). Every
// call that communicates or runs backward releases the GIL: no Python runs inside them (the
// optimizer factory builds C++ optimizers only).
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "core/nn/nn.h"
#include "optimizer/adamw.h"
#include "optimizer/sgd.h"
#include "parallel/ddp.h"
#include "parallel/expert_parallel.h"
#include "parallel/mesh.h"
#include "parallel/tensor_parallel/layers.h"
#include "parallel/tensor_parallel/tp_comm.h"
#include "parallel/tensor_parallel/tp_gpt.h"
#include "parallel/tensor_parallel/tp_grad_norm.h"
#include "parallel/tensor_parallel/tp_state.h"
#include "parallel/tensor_parallel/vocab_parallel_cross_entropy.h"
#include "parallel/training_memory.h"
#include "parallel/zero.h"

namespace loom::python {
namespace {

// Whether a parameter's name starts with one of `prefixes` (the experts of expert-parallel MoE
// layers, as loom.distributed names them: DdpOptions / ZeroOptions::own_parameters).
std::function<bool(const std::string&)> under_prefixes(std::vector<std::string> prefixes) {
  return [prefixes = std::move(prefixes)](const std::string& name) {
    for (const std::string& prefix : prefixes)
      if (name.rfind(prefix, 0) == 0) return true;
    return false;
  };
}

using comm::Communicator;
using parallel::GroupPtr;
using Release = py::call_guard<py::gil_scoped_release>;

GroupPtr group_or_world(GroupPtr group) {
  if (group) return group;
  return comm::world();
}

GroupPtr required_group(GroupPtr group, const char* owner) {
  if (!group)
    throw py::type_error(
        std::string(owner) +
        ": group must be a loom.distributed.Communicator (the tp group), got None");
  return group;
}

// The mesh and the world it was built over (DeviceMesh holds the world by shared_ptr but hands
// out a reference; Python needs the shared_ptr).
struct PyMesh {
  GroupPtr world;
  std::unique_ptr<parallel::DeviceMesh> mesh;
};

// DDP and the C++ module it wraps (DDP keeps a reference only).
struct PyDdp {
  std::shared_ptr<nn::Module> module;
  std::unique_ptr<parallel::DistributedDataParallel> ddp;
};

// The wrapped optimizer's hyper-parameters, resolved from loom.optim's signatures by Python.
struct OptimizerSpec {
  std::string kind;  // "sgd" or "adamw"
  double lr = 1e-3, momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
};

optim::OptimizerFactory optimizer_factory(const OptimizerSpec& s) {
  if (s.kind == "sgd") {
    const optim::SgdOptions o =
        sgd_options(s.lr, s.momentum, s.dampening, s.weight_decay, s.nesterov);
    return [o](std::vector<Tensor> params) -> std::unique_ptr<optim::Optimizer> {
      return std::make_unique<optim::SGD>(std::move(params), o);
    };
  }
  if (s.kind == "adamw") {
    const optim::AdamWOptions o = adamw_options(s.lr, s.beta1, s.beta2, s.eps, s.weight_decay);
    return [o](std::vector<Tensor> params) -> std::unique_ptr<optim::Optimizer> {
      return std::make_unique<optim::AdamW>(std::move(params), o);
    };
  }
  throw py::type_error("ZeroRedundancyOptimizer: optimizer must be 'sgd' or 'adamw', got '" +
                       s.kind + "'");
}

void init_mesh(py::module_& p) {
  py::class_<parallel::MeshCoords>(p, "MeshCoords", "This rank's place in a DeviceMesh.")
      .def(py::init([](int pp, int dp, int tp) {
             return parallel::MeshCoords{pp, dp, tp};
           }),
           py::arg("pp") = 0, py::arg("dp") = 0, py::arg("tp") = 0)
      .def_readonly("pp", &parallel::MeshCoords::pp)
      .def_readonly("dp", &parallel::MeshCoords::dp)
      .def_readonly("tp", &parallel::MeshCoords::tp)
      .def("__iter__",
           [](const parallel::MeshCoords& c) { return py::iter(py::make_tuple(c.pp, c.dp, c.tp)); })
      .def("__eq__",
           [](const parallel::MeshCoords& a, py::object b) {
             if (py::isinstance<parallel::MeshCoords>(b)) {
               const auto& c = b.cast<const parallel::MeshCoords&>();
               return a.pp == c.pp && a.dp == c.dp && a.tp == c.tp;
             }
             if (py::isinstance<py::tuple>(b)) return py::make_tuple(a.pp, a.dp, a.tp).equal(b);
             return false;
           })
      .def("__repr__", [](const parallel::MeshCoords& c) {
        return "MeshCoords(pp=" + std::to_string(c.pp) + ", dp=" + std::to_string(c.dp) +
               ", tp=" + std::to_string(c.tp) + ")";
      });

  py::class_<PyMesh>(p, "DeviceMesh", R"(The world's ranks arranged [pp][dp][tp], tp fastest.

    world rank = (pp_index * dp + dp_index) * tp + tp_index

Collective over `group` (default: the world): every rank builds it with the same sizes. dp=None
takes what is left: group.size // (pp * tp). Bad sizes raise ValueError.

    mesh = loom.distributed.DeviceMesh(dp=2, tp=2)     # under mpirun -np 4
    mesh.coords                                        # MeshCoords(pp=0, dp=1, tp=0) on rank 2
    mesh.tp_group.size                                 # 2
)")
      .def(py::init([](int pp, std::optional<int> dp, int tp, GroupPtr group) {
             auto out = std::make_unique<PyMesh>();
             {
               py::gil_scoped_release release;
               out->world = group_or_world(std::move(group));
             }
             const int size = out->world->size();
             int d = dp.value_or(1);
             if (!dp && pp > 0 && tp > 0) {  // else DeviceMesh reports the non-positive size
               if (size % (pp * tp) != 0)
                 throw py::value_error("DeviceMesh: pp " + std::to_string(pp) + " x tp " +
                                       std::to_string(tp) + " does not divide the world size " +
                                       std::to_string(size));
               d = size / (pp * tp);
             }
             py::gil_scoped_release release;
             out->mesh = std::make_unique<parallel::DeviceMesh>(out->world, pp, d, tp);
             return out;
           }),
           py::arg("pp") = 1, py::arg("dp") = py::none(), py::arg("tp") = 1,
           py::arg("group") = py::none())
      .def_property_readonly("pp_group", [](const PyMesh& m) { return m.mesh->pp_ptr(); })
      .def_property_readonly("dp_group", [](const PyMesh& m) { return m.mesh->dp_ptr(); })
      .def_property_readonly("tp_group", [](const PyMesh& m) { return m.mesh->tp_ptr(); })
      .def_property_readonly("world", [](const PyMesh& m) { return m.world; })
      .def_property_readonly("coords", [](const PyMesh& m) { return m.mesh->coords(); })
      .def_property_readonly("shape",
                             [](const PyMesh& m) {
                               return py::make_tuple(m.mesh->pp_size(), m.mesh->dp_size(),
                                                     m.mesh->tp_size());
                             })
      .def_property_readonly("pp", [](const PyMesh& m) { return m.mesh->pp_size(); })
      .def_property_readonly("dp", [](const PyMesh& m) { return m.mesh->dp_size(); })
      .def_property_readonly("tp", [](const PyMesh& m) { return m.mesh->tp_size(); })
      .def(
          "rank_of",
          [](const PyMesh& m, int pp, int dp, int tp) {
            return m.mesh->rank_of(parallel::MeshCoords{pp, dp, tp});
          },
          py::arg("pp"), py::arg("dp"), py::arg("tp"), "The world rank at a place.")
      .def(
          "coords_of", [](const PyMesh& m, int rank) { return m.mesh->coords_of(rank); },
          py::arg("rank"))
      .def(
          "new_group",
          [](const PyMesh& m, const std::vector<int>& ranks, const std::string& name) {
            return m.mesh->new_group(ranks, name);
          },
          py::arg("ranks"), py::arg("name"), Release(),
          "A group of these world ranks (position i is group rank i); None on ranks outside it. "
          "Collective over the world.")
      .def("__repr__",
           [](const PyMesh& m) { return "<loom.distributed.DeviceMesh " + m.mesh->str() + ">"; });
}

void init_training_memory(py::module_& p) {
  py::class_<parallel::TrainingMemory>(p, "TrainingMemory",
                                       "What a rank keeps for training, in bytes.")
      .def_readonly("parameters", &parallel::TrainingMemory::parameters)
      .def_readonly("gradients", &parallel::TrainingMemory::gradients)
      .def_readonly("optimizer_state", &parallel::TrainingMemory::optimizer_state)
      .def_property_readonly("total", &parallel::TrainingMemory::total)
      .def("_asdict",
           [](const parallel::TrainingMemory& t) {
             py::dict d;
             d["parameters"] = t.parameters;
             d["gradients"] = t.gradients;
             d["optimizer_state"] = t.optimizer_state;
             return d;
           })
      .def("__repr__", [](const parallel::TrainingMemory& t) {
        return "TrainingMemory(parameters=" + std::to_string(t.parameters) +
               ", gradients=" + std::to_string(t.gradients) +
               ", optimizer_state=" + std::to_string(t.optimizer_state) + ")";
      });
}

void init_ddp(py::module_& p) {
  py::class_<PyDdp>(p, "DistributedDataParallel")
      .def(py::init([](std::shared_ptr<nn::Module> module, GroupPtr group, double bucket_mb,
                       int grad_accum, bool overlap, bool check_replicas,
                       std::vector<std::string> own_prefixes, GroupPtr own_replicas) {
             if (!module) throw py::type_error("DistributedDataParallel: module is None");
             parallel::DdpOptions o;
             o.bucket_mb = bucket_mb;
             o.grad_accum = grad_accum;
             o.overlap = overlap;
             o.check_replicas = check_replicas;
             if (!own_prefixes.empty()) {  // the experts of expert-parallel MoE layers
               o.own_parameters = under_prefixes(own_prefixes);
               o.own_replicas = std::move(own_replicas);
             }
             auto out = std::make_unique<PyDdp>();
             out->module = module;
             py::gil_scoped_release release;
             out->ddp = std::make_unique<parallel::DistributedDataParallel>(
                 *module, group_or_world(std::move(group)), o);
             return out;
           }),
           py::arg("module"), py::arg("group"), py::arg("bucket_mb"), py::arg("grad_accum"),
           py::arg("overlap"), py::arg("check_replicas"),
           py::arg("own_prefixes") = std::vector<std::string>{},
           py::arg("own_replicas") = py::none())
      .def(
          "backward", [](PyDdp& self, const Tensor& loss) { self.ddp->backward(loss); },
          py::arg("loss"), Release())
      .def(
          "finish", [](PyDdp& self) { self.ddp->finish(); }, Release())
      .def("memory", [](const PyDdp& self) { return self.ddp->memory(); })
      .def_property_readonly("exposed_wait_seconds",
                             [](const PyDdp& self) { return self.ddp->exposed_wait_seconds(); })
      .def_property_readonly("module", [](const PyDdp& self) { return self.module; });
}

void init_zero(py::module_& p) {
  py::class_<OptimizerSpec>(p, "_OptimizerSpec")
      .def(py::init<>())
      .def_readwrite("kind", &OptimizerSpec::kind)
      .def_readwrite("lr", &OptimizerSpec::lr)
      .def_readwrite("momentum", &OptimizerSpec::momentum)
      .def_readwrite("dampening", &OptimizerSpec::dampening)
      .def_readwrite("weight_decay", &OptimizerSpec::weight_decay)
      .def_readwrite("nesterov", &OptimizerSpec::nesterov)
      .def_readwrite("beta1", &OptimizerSpec::beta1)
      .def_readwrite("beta2", &OptimizerSpec::beta2)
      .def_readwrite("eps", &OptimizerSpec::eps);

  using parallel::ZeroOptimizer;
  py::class_<ZeroOptimizer, optim::Optimizer, std::shared_ptr<ZeroOptimizer>>(p, "ZeroOptimizer")
      .def(
          py::init([](std::shared_ptr<nn::Module> module, GroupPtr group, const OptimizerSpec& spec,
                      int stage, double bucket_mb, int grad_accum, bool overlap,
                      bool check_replicas, GroupPtr tp, bool external_backward, GroupPtr pp,
                      std::optional<std::vector<std::string>> counted_in_norm,
                      std::optional<std::vector<std::pair<std::vector<std::string>, OptimizerSpec>>>
                          param_groups,
                      py::object shard_group, std::vector<std::string> own_prefixes,
                      GroupPtr own_replicas) {
            if (!module) throw py::type_error("ZeroRedundancyOptimizer: module is None");
            // Parameter groups (names, options), or one group of every parameter: `spec`.
            std::vector<parallel::ZeroParamGroup> groups;
            if (param_groups)
              for (const auto& [names, group_spec] : *param_groups)
                groups.push_back({names, optimizer_factory(group_spec)});
            else
              groups.push_back({{}, optimizer_factory(spec)});
            parallel::ZeroOptions o;
            o.stage = stage;
            o.bucket_mb = bucket_mb;
            o.grad_accum = grad_accum;
            o.overlap = overlap;
            o.check_replicas = check_replicas;
            o.tp = std::move(tp);
            // Pipelines (See ZeroOptions::external_backward): the executor's backwards leave the
            // gradients in the parameters; the norm sums over pp, counting the names given.
            o.external_backward = external_backward;
            o.pp = std::move(pp);
            if (counted_in_norm) {
              std::set<std::string> names(counted_in_norm->begin(), counted_in_norm->end());
              o.counted_in_norm = [names](const std::string& name) {
                return names.count(name) > 0;
              };
            }
            if (!own_prefixes.empty()) {  // the experts of expert-parallel MoE layers
              o.own_parameters = under_prefixes(own_prefixes);
              o.own_replicas = std::move(own_replicas);
              // Stage 3 gathers them around their MoE layer: "a.moe.experts." -> "a.moe".
              o.own_unit = [prefixes = own_prefixes](const std::string& name) {
                for (const std::string& prefix : prefixes)
                  if (name.rfind(prefix, 0) == 0) {
                    const std::string layer = prefix.substr(0, prefix.size() - 8);  // "experts."
                    return layer.empty() ? layer : layer.substr(0, layer.size() - 1);
                  }
                return std::string();
              };
            }
            GroupPtr shards = group_or_world(std::move(group));
            if (!shard_group.is_none()) {  // hybrid sharding: See ZeroOptions::replicas
              int size = 0;                // 0: by node
              if (py::isinstance<py::int_>(shard_group) &&
                  !py::isinstance<py::bool_>(shard_group)) {
                size = shard_group.cast<int>();
                if (size <= 0)
                  throw py::value_error("ZeroRedundancyOptimizer: shard_group must be positive");
              } else if (!(py::isinstance<py::str>(shard_group) &&
                           shard_group.cast<std::string>() == "node")) {
                throw py::value_error(
                    "ZeroRedundancyOptimizer: shard_group must be None, 'node' or a number of "
                    "consecutive ranks");
              }
              py::gil_scoped_release release;
              const parallel::HybridGroups h =
                  parallel::hybrid_groups(shards, size, "ZeroRedundancyOptimizer: shard_group");
              shards = h.shards;
              o.replicas = h.replicas;
            }
            py::gil_scoped_release release;
            return std::make_shared<ZeroOptimizer>(*module, shards, o, std::move(groups));
          }),
          py::arg("module"), py::arg("group"), py::arg("optimizer"), py::arg("stage"),
          py::arg("bucket_mb"), py::arg("grad_accum"), py::arg("overlap"),
          py::arg("check_replicas"), py::arg("tp"), py::arg("external_backward") = false,
          py::arg("pp") = nullptr, py::arg("counted_in_norm") = py::none(),
          py::arg("param_groups") = py::none(), py::arg("shard_group") = py::none(),
          py::arg("own_prefixes") = std::vector<std::string>{},
          py::arg("own_replicas") = py::none(), py::keep_alive<1, 2>())
      .def_property_readonly("group_count", &ZeroOptimizer::group_count)
      .def(
          "group_optimizer",
          [](const ZeroOptimizer& z, size_t g) -> optim::Optimizer& {
            return z.group_optimizer(g);
          },
          py::arg("group"), py::return_value_policy::reference_internal,
          "Group g's C++ optimizer over this rank's pieces (its lr is the group's).")
      .def("backward", &ZeroOptimizer::backward, py::arg("loss"), Release())
      .def("finish_gradients", &ZeroOptimizer::finish_gradients, Release())
      .def("accumulate_in_buckets", &ZeroOptimizer::accumulate_in_buckets)
      .def("clip_grad_norm", &ZeroOptimizer::clip_grad_norm, py::arg("max_norm"), Release())
      .def("gather_parameters", &ZeroOptimizer::gather_parameters, Release())
      .def("memory", &ZeroOptimizer::memory)
      .def_property_readonly("stage", &ZeroOptimizer::stage)
      .def_property_readonly("exposed_wait_seconds", &ZeroOptimizer::exposed_wait_seconds)
      .def_property_readonly("inner_name",
                             [](const ZeroOptimizer& z) { return std::string(z.inner().name()); });
}

void init_tensor_parallel(py::module_& p) {
  using parallel::ColumnParallelLinear;
  using parallel::RowParallelLinear;
  // Registered after loom._loom.nn (init_nn runs first), whose MoeLayer it extends.
  py::class_<parallel::ExpertParallelMoE, nn::MoeLayer,
             std::shared_ptr<parallel::ExpertParallelMoE>>(p, "ExpertParallelMoE")
      .def(py::init([](int64_t channels, int64_t experts, int64_t top_k, double capacity_factor,
                       double aux_loss, double z_loss, GroupPtr ep, GroupPtr batch, double dropout,
                       double proj_std, double receive_budget_mb, int64_t hidden) {
             const nn::MoeOptions o{experts,           top_k, 1, capacity_factor, aux_loss, z_loss,
                                    receive_budget_mb, hidden};
             GroupPtr ep_group = required_group(std::move(ep), "MoE (ep_group)");
             GroupPtr batch_group = batch ? std::move(batch) : ep_group;
             return std::make_shared<parallel::ExpertParallelMoE>(channels, o, ep_group,
                                                                  batch_group, dropout, proj_std);
           }),
           py::arg("channels"), py::arg("experts"), py::arg("top_k"), py::arg("capacity_factor"),
           py::arg("aux_loss"), py::arg("z_loss"), py::arg("ep_group"), py::arg("batch_group"),
           py::arg("dropout"), py::arg("proj_std"), py::arg("receive_budget_mb") = 0.0,
           py::arg("hidden") = 0)
      .def_property_readonly("first_expert", &parallel::ExpertParallelMoE::first_expert)
      .def_property_readonly("local_experts", &parallel::ExpertParallelMoE::local_experts);

  using parallel::TpGPT;
  using parallel::VocabParallelEmbedding;
  py::class_<ColumnParallelLinear, nn::Module, std::shared_ptr<ColumnParallelLinear>>(
      p, "ColumnParallelLinear")
      .def(py::init([](int64_t in, int64_t out, GroupPtr tp, bool bias, double init_std,
                       bool gather_output, bool sequence_parallel, int64_t blocks) {
             parallel::ColumnParallelOptions o;
             o.bias = bias;
             o.init_std = init_std;
             o.gather_output = gather_output;
             o.sequence_parallel = sequence_parallel;
             o.blocks = blocks;
             return std::make_shared<ColumnParallelLinear>(
                 in, out, required_group(std::move(tp), "ColumnParallelLinear"), o);
           }),
           py::arg("in_features"), py::arg("out_features"), py::arg("group"),
           py::arg("bias") = true, py::arg("init_std") = 0.02, py::arg("gather_output") = false,
           py::arg("sequence_parallel") = false, py::arg("blocks") = 1);

  py::class_<RowParallelLinear, nn::Module, std::shared_ptr<RowParallelLinear>>(p,
                                                                                "RowParallelLinear")
      .def(py::init([](int64_t in, int64_t out, GroupPtr tp, bool bias, double init_std,
                       bool sequence_parallel) {
             parallel::RowParallelOptions o;
             o.bias = bias;
             o.init_std = init_std;
             o.sequence_parallel = sequence_parallel;
             return std::make_shared<RowParallelLinear>(
                 in, out, required_group(std::move(tp), "RowParallelLinear"), o);
           }),
           py::arg("in_features"), py::arg("out_features"), py::arg("group"),
           py::arg("bias") = true, py::arg("init_std") = 0.02,
           py::arg("sequence_parallel") = false);

  py::class_<VocabParallelEmbedding, nn::Module, std::shared_ptr<VocabParallelEmbedding>>(
      p, "VocabParallelEmbedding")
      .def(py::init([](int64_t rows, int64_t dim, GroupPtr tp, double init_std) {
             return std::make_shared<VocabParallelEmbedding>(
                 rows, dim, required_group(std::move(tp), "VocabParallelEmbedding"),
                 nn::Init::normal(init_std));
           }),
           py::arg("num_embeddings"), py::arg("embedding_dim"), py::arg("group"),
           py::arg("init_std") = 0.02)
      .def_property_readonly("rows_per_rank", &VocabParallelEmbedding::rows_per_rank)
      .def_property_readonly("first_row", &VocabParallelEmbedding::first_row);

  // TpGPT's children, so views of them (gpt.blocks[0].attn) have their own type names.
  py::class_<parallel::TpLayerNorm, nn::Module, std::shared_ptr<parallel::TpLayerNorm>>(
      p, "TpLayerNorm");
  py::class_<parallel::TpAttention, nn::Module, std::shared_ptr<parallel::TpAttention>>(
      p, "TpAttention");
  py::class_<parallel::TpMLP, nn::Module, std::shared_ptr<parallel::TpMLP>>(p, "TpMLP");
  py::class_<parallel::TpBlock, nn::Module, std::shared_ptr<parallel::TpBlock>>(p, "TpBlock");

  py::class_<TpGPT, nn::Module, std::shared_ptr<TpGPT>>(p, "TpGPT")
      .def(py::init([](const GptConfig& config, GroupPtr tp, double dropout, bool sequence_parallel,
                       bool checkpoint) {
             parallel::TpGptOptions o;
             o.dropout = dropout;
             o.sequence_parallel = sequence_parallel;
             o.checkpoint = checkpoint;
             return std::shared_ptr<TpGPT>(std::make_shared<TpGPT>(
                 config, required_group(std::move(tp), "TensorParallelGPT"), o));
           }),
           py::arg("config"), py::arg("group"), py::arg("dropout") = 0.0,
           py::arg("sequence_parallel") = false, py::arg("checkpoint") = false)
      .def("loss", &TpGPT::loss, py::arg("idx"), py::arg("targets"), Release())
      .def(
          "logits", [](TpGPT& self, const Tensor& idx) { return self.full_logits(idx); },
          py::arg("idx"), Release())
      .def_property_readonly("config", &TpGPT::config)
      .def_property_readonly("wte_rows", &TpGPT::wte_rows);
}

void init_tp_functions(py::module_& p) {
  p.def(
      "tp_clip_grad_norm",
      [](std::shared_ptr<nn::Module> module, double max_norm, GroupPtr tp) {
        tp = required_group(std::move(tp), "tp_clip_grad_norm_");
        py::gil_scoped_release release;
        return parallel::tp_clip_grad_norm(*module, max_norm, *tp);
      },
      py::arg("module"), py::arg("max_norm"), py::arg("group"));
  p.def(
      "gather_full_state",
      [](std::shared_ptr<nn::Module> module, GroupPtr tp) {
        tp = required_group(std::move(tp), "gather_full_state");
        py::gil_scoped_release release;
        nn::StateDict full = parallel::gather_full_state(*module, *tp);
        // A TpGPT's wte has rows past the single-process padding (See TpGPT::wte_rows).
        if (auto* gpt = dynamic_cast<parallel::TpGPT*>(module.get())) {
          auto it = full.find("wte.weight");
          if (it != full.end() && it->second.size(0) > gpt->config().padded_vocab)
            it->second = it->second.narrow(0, 0, gpt->config().padded_vocab).contiguous();
        }
        return full;
      },
      py::arg("module"), py::arg("group"));
  p.def(
      "load_full_state",
      [](std::shared_ptr<nn::Module> module, const nn::StateDict& full) {
        py::gil_scoped_release release;
        parallel::load_full_state(*module, full);
      },
      py::arg("module"), py::arg("state_dict"));
  p.def(
      "vocab_parallel_cross_entropy",
      [](const Tensor& logits, const Tensor& targets, GroupPtr tp, int64_t vocab,
         int64_t ignore_index) {
        tp = required_group(std::move(tp), "vocab_parallel_cross_entropy");
        py::gil_scoped_release release;
        return parallel::vocab_parallel_cross_entropy(logits, targets, tp, vocab, ignore_index);
      },
      py::arg("logits"), py::arg("targets"), py::arg("group"), py::arg("vocab"),
      py::arg("ignore_index") = -100);
}

}  // namespace

void init_parallel(py::module_& m) {
  py::module_ p = m.def_submodule(
      "parallel", "mesh, DDP, ZeRO and tensor parallelism (import loom.distributed / loom.nn)");
  init_mesh(p);
  init_training_memory(p);
  init_ddp(p);
  init_zero(p);
  init_tensor_parallel(p);
  init_tp_functions(p);
}

}  // namespace loom::python
