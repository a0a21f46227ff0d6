// The built-in modules (core/nn) as loom._loom.nn.*, and the Tensor calls the Python Module base
// needs (Parameter's constructor, in-place conversion). python/loom/nn/modules.py wraps each class
// in a loom.nn.Module subclass, so a built-in module and a Python-defined one answer the same
// calls (parameters(), state_dict(), train(), ...) and can be nested either way round; this file
// stays a thin, typed layer over the C++ API. See Note [Built-in modules from Python].
//
// Note [Built-in modules from Python]
// A C++ module is held by std::shared_ptr (its holder here and in core/nn), so a child returned
// through children() or an attribute (gpt.blocks[0].attn) is the same C++ object as the parent's,
// and its tensors are the parent's: parameters handed to an optimizer from a child are the ones
// the parent's forward reads. forward and the other long calls release the GIL: no Python runs
// inside them (the C++ modules have no Python hooks).
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "core/nn/nn.h"

namespace loom::python {
namespace {

// Note [Python modules as C++ modules]
// DDP, ZeRO and the pipeline take a C++ nn::Module. A module written in Python gets one on demand
// (loom.nn.Module._cpp_module(), built once when a wrapper first asks for it): a PythonModule
// node holding the Python module's own parameters (the very tensors: adopt_parameter) and its
// children's nodes (a built-in child's C++ module itself), in named_parameters() order. The
// Python module's __call__ runs the node's forward hooks around its Python forward, so ZeRO-3's
// gather/release hooks act on Python units too, and the node's forward(x) calls back into the
// Python forward for C++ callers. The node refers to its Python module weakly (the module owns
// the node): no reference cycle.
class PythonModule : public nn::Module {
 public:
  explicit PythonModule(py::handle owner) : owner_(PyWeakref_NewRef(owner.ptr(), nullptr)) {
    if (owner_ == nullptr) throw py::error_already_set();
  }
  ~PythonModule() override {
    if (owner_ != nullptr && Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      Py_DECREF(owner_);
    }
  }

  void add_parameter(const std::string& name, const Tensor& t) { adopt_parameter(name, t); }
  void add_child(const std::string& name, std::shared_ptr<nn::Module> child) {
    register_module(name, std::move(child));
  }

  Tensor forward(const Tensor& x) override {
    py::gil_scoped_acquire gil;
    py::handle owner = PyWeakref_GetObject(owner_);
    LOOM_CHECK(owner.ptr() != Py_None, "Module '", full_name(),
               "': its Python module no longer exists");
    return py::reinterpret_borrow<py::object>(owner).attr("forward")(x).cast<Tensor>();
  }

 private:
  PyObject* owner_;  // a weak reference to the Python loom.nn.Module
};

using Release = py::call_guard<py::gil_scoped_release>;

py::object optional_tensor(const Tensor& t) {
  if (!t.defined()) return py::none();
  return py::cast(t);
}

kernels::EmbeddingBoundsCheck bounds_check_arg(const std::string& name) {
  if (name == "error") return kernels::EmbeddingBoundsCheck::kError;
  if (name == "warn") return kernels::EmbeddingBoundsCheck::kWarn;
  if (name == "skip") return kernels::EmbeddingBoundsCheck::kSkip;
  throw py::value_error(
      "EmbeddingBagCollection: bounds_check must be 'error', 'warn' or 'skip', got '" + name + "'");
}

void init_tensor_extras(py::module_& m) {
  auto cls = py::reinterpret_borrow<py::class_<Tensor>>(m.attr("Tensor"));
  // What loom.nn.Parameter(data) calls: a new leaf on data's memory (data.detach()), as
  // torch.nn.Parameter shares its data's storage.
  cls.def(py::init([](const Tensor& data, bool requires_grad) {
            Tensor t = data.detach();
            t.set_requires_grad(requires_grad);
            return t;
          }),
          py::arg("data"), py::arg("requires_grad") = false,
          "Tensor(data, requires_grad=False): a new leaf sharing data's memory (data.detach()).");
  cls.def(
      "_to_",
      [](Tensor& t, py::object dtype, py::object device) {
        std::optional<DType> to_dtype;
        std::optional<Device> to_device;
        if (!dtype.is_none()) to_dtype = dtype_arg(dtype);
        if (!device.is_none()) to_device = Device::parse(py::str(device));
        py::gil_scoped_release release;
        if (to_device) t.to_(*to_device);
        if (to_dtype) t.to_(*to_dtype);
      },
      py::arg("dtype") = py::none(), py::arg("device") = py::none(),
      "Converts this tensor in place (same tensor, same autograd identity; its gradient is "
      "dropped): what Module.to does to each parameter.");
  cls.def("_same_as", &Tensor::same_as,
          "True when both handles are the same tensor (Python objects may differ).");
}

}  // namespace

kernels::EmbeddingPooling embedding_pooling_arg(const std::string& name, const char* owner) {
  if (name == "sum") return kernels::EmbeddingPooling::kSum;
  if (name == "mean") return kernels::EmbeddingPooling::kMean;
  if (name == "none") return kernels::EmbeddingPooling::kNone;
  throw py::value_error(std::string(owner) + ": pooling must be 'sum', 'mean' or 'none', got '" +
                        name + "'");
}

void init_nn(py::module_& m) {
  init_tensor_extras(m);
  py::module_ nn_m = m.def_submodule("nn", "loom's built-in modules (import loom.nn instead)");

  py::class_<nn::Module, std::shared_ptr<nn::Module>>(nn_m, "Module")
      .def("forward", &nn::Module::forward, py::arg("input"), Release())
      .def(
          "__call__", [](nn::Module& self, const Tensor& x) { return self(x); }, py::arg("input"),
          Release())
      .def("named_parameters", &nn::Module::named_parameters)
      .def("num_parameters", &nn::Module::num_parameters)
      .def("state_dict", &nn::Module::state_dict)
      .def(
          "load_state_dict",
          [](nn::Module& self, const nn::StateDict& state, bool strict) {
            nn::LoadResult r;
            {
              py::gil_scoped_release release;
              r = self.load_state_dict(state, strict);
            }
            return py::make_tuple(r.missing, r.unexpected);
          },
          py::arg("state_dict"), py::arg("strict") = true)
      .def("children", &nn::Module::children)
      .def("train", &nn::Module::train, py::arg("mode") = true)
      .def("eval", &nn::Module::eval)
      .def_property_readonly("training", &nn::Module::is_training)
      .def("zero_grad", &nn::Module::zero_grad)
      .def("init_parameters", &nn::Module::init_parameters, py::arg("seed"), Release())
      .def(
          "to_dtype", [](nn::Module& self, py::object dtype) { self.to(dtype_arg(dtype)); },
          py::arg("dtype"))
      .def(
          "to_device",
          [](nn::Module& self, const std::string& device) {
            Device d = Device::parse(device);
            py::gil_scoped_release release;
            self.to(d);
          },
          py::arg("device"))
      .def_property("full_name", &nn::Module::full_name, &nn::Module::set_full_name)
      .def_property_readonly("has_forward_hooks", &nn::Module::has_forward_hooks)
      .def("_tie_parameter", &nn::Module::tie_parameter, py::arg("name"), py::arg("tensor"))
      .def(
          "_parameter_is_shard",
          [](const nn::Module& self, const std::string& name) {
            return self.parameter_shard(name) != nullptr;
          },
          py::arg("name"), "True for a tensor-parallel shard of a single-process parameter.")
      .def("_run_forward_pre_hooks", &nn::Module::run_forward_pre_hooks, Release())
      .def("_run_forward_hooks", &nn::Module::run_forward_hooks, py::arg("output"), Release());

  py::class_<PythonModule, nn::Module, std::shared_ptr<PythonModule>>(
      nn_m, "PythonModule", "The C++ module of a loom.nn.Module written in Python (internal).")
      .def(py::init<py::handle>(), py::arg("owner"))
      .def("_add_parameter", &PythonModule::add_parameter, py::arg("name"), py::arg("tensor"))
      .def("_add_child", &PythonModule::add_child, py::arg("name"), py::arg("child"));

  py::class_<nn::ModuleList, nn::Module, std::shared_ptr<nn::ModuleList>>(nn_m, "ModuleList")
      .def(py::init<>())
      .def("_append", &nn::ModuleList::push_back, py::arg("module"))
      .def("__len__", &nn::ModuleList::size);

  py::class_<nn::Linear, nn::Module, std::shared_ptr<nn::Linear>>(nn_m, "Linear")
      .def(py::init<int64_t, int64_t, bool, double>(), py::arg("in_features"),
           py::arg("out_features"), py::arg("bias") = true, py::arg("init_std") = 0.02)
      .def_property_readonly("in_features", &nn::Linear::in_features)
      .def_property_readonly("out_features", &nn::Linear::out_features)
      .def_property_readonly("weight", [](const nn::Linear& l) { return l.weight; })
      .def_property_readonly("bias", [](const nn::Linear& l) { return optional_tensor(l.bias); });

  py::class_<nn::LayerNorm, nn::Module, std::shared_ptr<nn::LayerNorm>>(nn_m, "LayerNorm")
      .def(py::init<int64_t, double>(), py::arg("dim"), py::arg("eps") = 1e-5)
      .def_property_readonly("weight", [](const nn::LayerNorm& l) { return l.weight; })
      .def_property_readonly("bias", [](const nn::LayerNorm& l) { return l.bias; });

  py::class_<nn::Embedding, nn::Module, std::shared_ptr<nn::Embedding>>(nn_m, "Embedding")
      .def(py::init([](int64_t n, int64_t dim, double std) {
             return std::make_shared<nn::Embedding>(n, dim, nn::Init::normal(std));
           }),
           py::arg("num_embeddings"), py::arg("embedding_dim"), py::arg("init_std") = 0.02)
      .def_property_readonly("num_embeddings", &nn::Embedding::num_embeddings)
      .def_property_readonly("embedding_dim", &nn::Embedding::dim)
      .def_property_readonly("weight", [](const nn::Embedding& e) { return e.weight; });

  py::class_<nn::Dropout, nn::Module, std::shared_ptr<nn::Dropout>>(nn_m, "Dropout")
      .def(py::init<double>(), py::arg("p"))
      .def_property_readonly("p", &nn::Dropout::p);
  nn_m.def("set_dropout_seed", &nn::set_dropout_seed, py::arg("seed"),
           "The process-wide dropout seed (See Note [Dropout keys] in core/nn/dropout.h).");
  nn_m.def("set_dropout_step", &nn::set_dropout_step, py::arg("step"),
           "The dropout step (the masks' Philox offset is step << 32); loom.optim's step() "
           "advances it. See python/loom/nn/_dropout.py.");
  nn_m.def("dropout_step", &nn::dropout_step, "The process-wide dropout step.");
  nn_m.def(
      "dropout_batch_part",
      [] {
        const nn::DropoutBatchPart b = nn::dropout_batch_part();
        return py::make_tuple(b.part, b.parts);
      },
      "(part, parts): the batch part the next forwards' rows are.");
  nn_m.def(
      "set_dropout_batch_part",
      [](int64_t part, int64_t parts) {
        if (parts < 1 || part < 0 || part >= parts)
          throw py::value_error("set_dropout_batch_part: need 0 <= part < parts, got part " +
                                std::to_string(part) + " of " + std::to_string(parts));
        nn::set_dropout_batch_part({part, parts});
      },
      py::arg("part") = 0, py::arg("parts") = 1,
      "The next forwards' rows are part `part` of `parts` equal parts of the step's batch (a "
      "data-parallel rank's or micro-batch's share), so dropout draws the single-process masks. "
      "(0, 1): the whole batch. See Note [Dropout keys] in core/nn/dropout.h.");

  py::class_<nn::MLP, nn::Module, std::shared_ptr<nn::MLP>>(nn_m, "MLP")
      .def(py::init<int64_t, double, double>(), py::arg("channels"), py::arg("dropout") = 0.0,
           py::arg("proj_std") = 0.02);
  // What every MoE layer reports after a forward (nn::MoE here, ExpertParallelMoE in parallel).
  py::class_<nn::MoeLayer, nn::Module, std::shared_ptr<nn::MoeLayer>>(nn_m, "MoeLayer")
      .def_property_readonly("aux_loss", &nn::MoeLayer::aux_loss)
      .def_property_readonly("load", [](const nn::MoeLayer& m) { return m.stats().load; })
      .def_property_readonly("dropped", [](const nn::MoeLayer& m) { return m.stats().dropped; })
      .def_property_readonly("balance_loss",
                             [](const nn::MoeLayer& m) { return m.stats().aux_loss; })
      .def_property_readonly("z_loss", [](const nn::MoeLayer& m) { return m.stats().z_loss; })
      .def_property_readonly(
          "budget_capacity", [](const nn::MoeLayer& m) { return m.stats().budget_capacity; },
          "The per-expert cap the last forward fell back to, over the receive budget (-1: "
          "none; See Note [Dropless receive budget] in core/nn/moe.h).")
      .def(
          "begin_batch",
          [](nn::MoeLayer& m, int64_t parts, bool record) { m.begin_batch(parts, record); },
          py::arg("parts"), py::arg("record") = true,
          "The next batch comes in `parts` micro-batches, forwarded in order (record: after a "
          "routing pass of them all without gradients). See Note [A batch in micro-batches] "
          "in core/nn/moe.h.");
  py::class_<nn::MoE, nn::MoeLayer, std::shared_ptr<nn::MoE>>(nn_m, "MoE")
      .def(py::init([](int64_t channels, int64_t experts, int64_t top_k, double capacity_factor,
                       double aux_loss, double z_loss, double dropout, double proj_std,
                       double receive_budget_mb, int64_t hidden) {
             const nn::MoeOptions o{experts,           top_k, 1, capacity_factor, aux_loss, z_loss,
                                    receive_budget_mb, hidden};
             return std::make_shared<nn::MoE>(channels, o, dropout, proj_std);
           }),
           py::arg("channels"), py::arg("experts"), py::arg("top_k"), py::arg("capacity_factor"),
           py::arg("aux_loss"), py::arg("z_loss"), py::arg("dropout"), py::arg("proj_std"),
           py::arg("receive_budget_mb") = 0.0, py::arg("hidden") = 0);
  py::class_<nn::CausalSelfAttention, nn::Module, std::shared_ptr<nn::CausalSelfAttention>>(
      nn_m, "CausalSelfAttention")
      .def(py::init<int64_t, int64_t, double, double>(), py::arg("channels"), py::arg("heads"),
           py::arg("dropout") = 0.0, py::arg("proj_std") = 0.02)
      .def_property_readonly("heads", &nn::CausalSelfAttention::heads);
  py::class_<nn::Block, nn::Module, std::shared_ptr<nn::Block>>(nn_m, "Block")
      .def(py::init<int64_t, int64_t, double, double>(), py::arg("channels"), py::arg("heads"),
           py::arg("dropout") = 0.0, py::arg("proj_std") = 0.02);

  py::class_<GptConfig>(nn_m, "GPTConfig")
      .def(py::init([](int64_t max_seq_len, int64_t vocab, int64_t padded_vocab, int64_t layers,
                       int64_t heads, int64_t channels) {
             GptConfig c;
             c.max_seq_len = max_seq_len;
             c.vocab = vocab;
             c.padded_vocab = padded_vocab < 0 ? vocab : padded_vocab;
             c.layers = layers;
             c.heads = heads;
             c.channels = channels;
             c.validate();
             return c;
           }),
           py::kw_only(), py::arg("max_seq_len") = 1024, py::arg("vocab") = 50257,
           py::arg("padded_vocab") = -1, py::arg("layers") = 12, py::arg("heads") = 12,
           py::arg("channels") = 768)
      .def_readwrite("max_seq_len", &GptConfig::max_seq_len)
      .def_readwrite("vocab", &GptConfig::vocab)
      .def_readwrite("padded_vocab", &GptConfig::padded_vocab)
      .def_readwrite("layers", &GptConfig::layers)
      .def_readwrite("heads", &GptConfig::heads)
      .def_readwrite("channels", &GptConfig::channels)
      .def("num_parameters", &GptConfig::num_parameters)
      .def("__repr__", [](const GptConfig& c) { return "GPTConfig(" + c.str() + ")"; });

  // A GPT's mixture-of-experts blocks (nn::MoeOptions; loom-gpt's --moe-* flags).
  py::class_<nn::MoeOptions>(nn_m, "MoEConfig")
      .def(py::init([](int64_t experts, int64_t top_k, int64_t every, double capacity_factor,
                       double aux_loss_coef, double z_loss_coef, int64_t expert_hidden,
                       double receive_budget_mb) {
             const nn::MoeOptions o{experts,           top_k,         every,
                                    capacity_factor,   aux_loss_coef, z_loss_coef,
                                    receive_budget_mb, expert_hidden};
             o.validate();
             return o;
           }),
           py::arg("experts"), py::arg("top_k") = 1, py::arg("every") = 1,
           py::arg("capacity_factor") = 0.0, py::arg("aux_loss_coef") = 0.01,
           py::arg("z_loss_coef") = 0.001, py::arg("expert_hidden") = 0,
           py::arg("receive_budget_mb") = 0.0,
           "Block i's MLP is a MoE of `experts` GELU MLPs when i % every == 0 (loom-gpt's --moe-* "
           "flags; core/nn/moe.h).")
      .def_readonly("experts", &nn::MoeOptions::experts)
      .def_readonly("top_k", &nn::MoeOptions::top_k)
      .def_readonly("every", &nn::MoeOptions::every)
      .def_readonly("capacity_factor", &nn::MoeOptions::capacity_factor)
      .def_readonly("aux_loss_coef", &nn::MoeOptions::aux_loss)
      .def_readonly("z_loss_coef", &nn::MoeOptions::z_loss)
      .def_readonly("expert_hidden", &nn::MoeOptions::hidden)
      .def_readonly("receive_budget_mb", &nn::MoeOptions::receive_budget_mb)
      .def("__eq__",
           [](const nn::MoeOptions& a, const nn::MoeOptions& b) {
             return a.experts == b.experts && a.top_k == b.top_k && a.every == b.every &&
                    a.capacity_factor == b.capacity_factor && a.aux_loss == b.aux_loss &&
                    a.z_loss == b.z_loss && a.hidden == b.hidden &&
                    a.receive_budget_mb == b.receive_budget_mb;
           })
      .def("__repr__", [](const nn::MoeOptions& o) {
        return detail::str_cat("MoEConfig(experts=", o.experts, ", top_k=", o.top_k,
                               ", every=", o.every, ", capacity_factor=", o.capacity_factor,
                               ", aux_loss_coef=", o.aux_loss, ", z_loss_coef=", o.z_loss,
                               ", expert_hidden=", o.hidden, ")");
      });

  py::class_<nn::GPT, nn::Module, std::shared_ptr<nn::GPT>>(nn_m, "GPT")
      .def(py::init([](const GptConfig& config, double dropout, bool checkpoint,
                       std::optional<nn::MoeOptions> moe) {
             nn::GptOptions o;
             o.dropout = dropout;
             o.checkpoint = checkpoint;
             if (moe) o.moe = *moe;
             return std::make_shared<nn::GPT>(config, o);
           }),
           py::arg("config"), py::arg("dropout") = 0.0, py::arg("checkpoint") = false,
           py::arg("moe") = py::none())
      .def_property_readonly("last_lm_loss", &nn::GPT::last_lm_loss,
                             "With MoE blocks: the cross-entropy of the last loss() alone.")
      .def("loss", &nn::GPT::loss, py::arg("idx"), py::arg("targets"), Release())
      .def_property_readonly("config", &nn::GPT::config)
      .def("set_checkpointing", &nn::GPT::set_checkpointing, py::arg("on"))
      .def(
          "generate",
          [](nn::GPT& gpt, const Tensor& idx, int64_t max_new_tokens, double temperature,
             std::optional<int64_t> top_k) {
            nn::GenerateOptions o;
            o.max_new_tokens = max_new_tokens;
            o.temperature = temperature;
            o.top_k = top_k.value_or(0);
            LOOM_CHECK(!top_k || *top_k > 0, "GPT.generate: top_k must be positive or None, got ",
                       *top_k);
            const RandomStream draw = next_random_stream();  // with the GIL held
            o.seed = draw.seed;
            o.stream = draw.stream;
            py::gil_scoped_release release;
            return nn::generate(gpt, idx, o);
          },
          py::arg("idx"), py::arg("max_new_tokens"), py::arg("temperature") = 1.0,
          py::arg("top_k") = py::none(),
          R"(nanoGPT's generate with a KV cache: idx [B, T] token ids -> [B, T + max_new_tokens].

Each new token is drawn from softmax(logits / temperature) of the last position, restricted to
the top_k largest logits when top_k is given (values equal to the k-th stay); temperature=0
takes the argmax (nanoGPT needs temperature > 0; Hugging Face calls this do_sample=False). The
prompt runs once and fills the cache; each later token runs alone over the cached keys and
values. A sequence longer than config.max_seq_len is cut to its last max_seq_len tokens, as
nanoGPT's idx[:, -block_size:]. Runs without autograd; call model.eval() first, as in PyTorch.

Differs from PyTorch: the draws come from loom's global generator (loom.manual_seed), one
counter-based stream per call, so a seed gives the same text on any device, but not torch's
tokens; greedy decoding (temperature=0 or top_k=1) gives torch's tokens.)");

  py::class_<nn::EmbeddingBagCollection, nn::Module, std::shared_ptr<nn::EmbeddingBagCollection>>(
      nn_m, "EmbeddingBagCollection")
      .def(py::init([](const std::vector<std::tuple<std::string, int64_t, int64_t>>& tables,
                       const std::string& pooling, const std::string& bounds_check) {
             std::vector<nn::EmbeddingTableConfig> configs;
             for (const auto& [name, rows, dim] : tables) configs.push_back({name, rows, dim});
             nn::EmbeddingBagCollectionOptions o;
             o.pooling = embedding_pooling_arg(pooling, "EmbeddingBagCollection");
             o.bounds_check = bounds_check_arg(bounds_check);
             return std::make_shared<nn::EmbeddingBagCollection>(std::move(configs), o);
           }),
           py::arg("tables"), py::arg("pooling") = "sum", py::arg("bounds_check") = "error")
      .def(
          "lookup",
          [](nn::EmbeddingBagCollection& self, const Tensor& indices, const Tensor& offsets,
             std::optional<Tensor> per_sample_weights) {
            py::gil_scoped_release release;
            return self.lookup(indices, offsets, per_sample_weights.value_or(Tensor()));
          },
          py::arg("indices"), py::arg("offsets"), py::arg("per_sample_weights") = py::none())
      .def_property_readonly("tables", [](const nn::EmbeddingBagCollection& self) {
        py::list out;
        for (const auto& t : self.tables()) out.append(py::make_tuple(t.name, t.rows, t.dim));
        return out;
      });
}

}  // namespace loom::python
