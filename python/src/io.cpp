// Weight I/O as loom.load / loom.save: a flat map name -> Tensor, the shape every format in
// core/io exchanges. save writes safetensors (core/io/safetensors.h, generic: any names, loom's
// dtypes). load reads safetensors, or an llm.c GPT-2 model file (.bin, core/io/llmc_checkpoint.h)
// as loom's parameter names; the format comes from the file's first bytes, as loom-gpt's
// --init-from does. An llm.c file is written only from a GPT's config (loom-gpt --save), so
// save does not offer .bin. Errors are loom::Error naming the file, hence ValueError.
#include <pybind11/stl.h>

#include <map>
#include <optional>
#include <string>

#include "bindings.h"
#include "core/io/gpt_weights.h"
#include "core/io/safetensors.h"
#include "core/nn/moe.h"

namespace loom::python {

void init_io(py::module_& m) {
  m.def(
      "load",
      [](const std::string& path, bool allow_nonfinite) {
        py::gil_scoped_release release;
        if (io::looks_like_safetensors(path)) return io::read_safetensors(path).tensors;
        return io::load_gpt_weights(path, 0, allow_nonfinite).params;
      },
      py::arg("path"), py::arg("allow_nonfinite") = false,
      R"(A dict name -> CPU Tensor from a .safetensors file or an llm.c model .bin.
An llm.c model with NaN or infinite weights is refused unless `allow_nonfinite`.

    loom.save({"w": loom.ones(2, 3)}, "w.safetensors")
    loom.load("w.safetensors")["w"].shape    # [2, 3]
)");
  m.def(
      "save",
      [](const std::map<std::string, Tensor>& tensors, const std::string& path,
         const std::map<std::string, std::string>& metadata) {
        const std::string ext = ".safetensors";
        LOOM_CHECK(path.size() >= ext.size() &&
                       path.compare(path.size() - ext.size(), ext.size(), ext) == 0,
                   "save: '", path, "': loom.save writes .safetensors only (an llm.c .bin needs ",
                   "a GPT's config: loom-gpt --save)");
        py::gil_scoped_release release;
        io::write_safetensors(path, tensors, metadata);
      },
      py::arg("tensors"), py::arg("path"),
      py::arg("metadata") = std::map<std::string, std::string>{},
      "Writes a dict name -> Tensor (any device or layout) to a .safetensors file.");
  m.def(
      "load_gpt",
      [](const std::string& path, int64_t heads, bool allow_nonfinite, bool with_moe) {
        io::GptWeights w;
        {
          py::gil_scoped_release release;
          w = io::load_gpt_weights(path, heads, allow_nonfinite);
        }
        if (!with_moe) return py::make_tuple(w.config, w.params);
        return py::make_tuple(w.config, w.params,
                              w.moe.enabled() ? py::cast(w.moe) : py::object(py::none()));
      },
      py::arg("path"), py::arg("heads") = 0, py::arg("allow_nonfinite") = false,
      py::arg("with_moe") = false,
      R"(GPT weights as loom-gpt reads them: (GPTConfig, state dict under loom's names).

`path` is an llm.c model .bin, a Hugging Face GPT-2 .safetensors (with or without its
config.json beside it), or a Hugging Face directory; `heads` is needed only when nothing in the
files records the head count. Weights that are NaN or infinite are refused, naming the tensor,
unless `allow_nonfinite`.

    config, state = loom.load_gpt("model.safetensors")   # e.g. written by loom-gpt --save
    model = loom.nn.GPT(config)
    model.load_state_dict(state)

With `with_moe`, a third element: the file's mixture-of-experts blocks (loom.nn.MoEConfig; None
for a dense model). loom.nn.GPT.from_file does all of it.
)");
  m.def(
      "save_gpt",
      [](const std::string& path, const GptConfig& config,
         const std::map<std::string, Tensor>& state, std::optional<nn::MoeOptions> moe) {
        py::gil_scoped_release release;
        io::save_gpt_weights(path, config, state, moe.value_or(nn::MoeOptions{}));
      },
      py::arg("path"), py::arg("config"), py::arg("state"), py::arg("moe") = py::none(),
      R"(Writes a GPT's weights as loom-gpt --save does: .bin (llm.c) or .safetensors (Hugging
Face GPT-2 names), by the extension; loom-gpt --init-from reads either.

    loom.save_gpt("model.safetensors", model.config, model.state_dict())

A model with MoE blocks passes them as `moe` (model.moe): the experts are written under
h.{i}.mlp.experts.{e}.c_fc / c_proj, as loom-gpt --save writes them (.safetensors only).
)");
}

}  // namespace loom::python
