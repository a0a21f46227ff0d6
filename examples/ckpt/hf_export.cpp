#include "ckpt/hf_export.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "collectives/communicator.h"
#include "core/error.h"
#include "core/io/gpt2_weights.h"
#include "parallel/checkpoint/checkpoint.h"
#include "parallel/checkpoint/durable.h"

namespace loom::ckpt {

namespace {

constexpr const char* kModelPrefix = "model.";

std::string master_name(const std::string& param) { return "optim." + param + ".master"; }

}  // namespace

GptConfig checkpoint_gpt_config(const io::CheckpointManifest& manifest, const std::string& path) {
  const nlohmann::json& state = manifest.state;
  LOOM_CHECK(state.contains("model") && state["model"].is_object(), "checkpoint ", path,
             " records no model config (state[\"model\"], which loom-gpt writes), so its GPT "
             "shape is unknown; `loom-ckpt inspect ",
             path, " --json` shows the state it has");
  return io::gpt_config_from_json(state["model"], "checkpoint " + path);
}

ConsolidatedGpt consolidate_gpt(const std::string& path, const io::CheckpointManifest& manifest) {
  ConsolidatedGpt out;
  out.weights.config = checkpoint_gpt_config(manifest, path);
  const std::vector<io::GptParamSpec> specs = io::gpt_param_specs(out.weights.config);

  // Every model.* tensor must be a parameter of this config: anything else means state["model"]
  // does not describe the tensors (or the model is not a GPT), and the export would be wrong.
  std::set<std::string> expected;
  for (const io::GptParamSpec& s : specs) expected.insert(kModelPrefix + s.name);
  for (const auto& [name, t] : manifest.tensors)
    LOOM_CHECK(name.rfind(kModelPrefix, 0) != 0 || expected.count(name), "checkpoint ", path,
               " holds tensor ", name, ", which is not a parameter of a GPT with ",
               out.weights.config.str(),
               " (See Note [GPT parameter names] in core/nn/gpt_config.h)");

  bool masters = true;
  for (const io::GptParamSpec& s : specs)
    masters = masters && manifest.tensors.count(master_name(s.name));
  out.source = masters ? "optim.*.master" : "model.*";

  std::vector<parallel::checkpoint::StatePiece> pieces;
  for (const io::GptParamSpec& s : specs) {
    const std::string name = masters ? master_name(s.name) : kModelPrefix + s.name;
    auto it = manifest.tensors.find(name);
    LOOM_CHECK(it != manifest.tensors.end(), "checkpoint ", path, " has no tensor ", name,
               " of a GPT with ", out.weights.config.str(),
               " (its state[\"model\"]); is it a GPT checkpoint?");
    LOOM_CHECK(it->second.shape == s.shape, "checkpoint ", path, ": tensor ", name, " is ",
               shape_str(it->second.shape), " but a GPT with ", out.weights.config.str(),
               " (its state[\"model\"]) has ", shape_str(s.shape));
    out.stored_dtype = it->second.dtype;
    Tensor data = Tensor::empty(s.shape, DType::kF32);
    out.weights.params[s.name] = data;
    pieces.push_back({name, s.shape, io::Region::whole(s.shape), data});
  }
  // One process reads everything: the `self` communicator, even when started under mpirun.
  auto self = comm::world("self");
  parallel::checkpoint::load(path, manifest, pieces, *self);
  return out;
}

void write_hf_gpt2(const std::string& out_dir, const io::GptWeights& weights) {
  const GptConfig& c = weights.config;
  std::error_code ec;
  LOOM_CHECK(!std::filesystem::exists(out_dir, ec) || std::filesystem::is_directory(out_dir, ec),
             "loom-ckpt export: --hf ", out_dir, " exists and is not a directory");
  parallel::checkpoint::make_directories(out_dir);
  const std::filesystem::path dir(out_dir);
  io::save_gpt2_safetensors((dir / "model.safetensors").string(), c, weights.params);
  // GPT-2's config keys; the activation and epsilon are loom's (the tanh GELU, LayerNorm 1e-5),
  // which are also transformers' GPT-2 defaults.
  nlohmann::ordered_json config = {
      {"architectures", nlohmann::ordered_json::array({"GPT2LMHeadModel"})},
      {"model_type", "gpt2"},
      {"n_layer", c.layers},
      {"n_head", c.heads},
      {"n_embd", c.channels},
      {"vocab_size", c.vocab},
      {"n_positions", c.max_seq_len},
      {"n_ctx", c.max_seq_len},
      {"activation_function", "gelu_new"},
      {"layer_norm_epsilon", 1e-5},
      {"tie_word_embeddings", true},
      {"torch_dtype", "float32"},
  };
  parallel::checkpoint::write_file_durably((dir / "config.json").string(), config.dump(2) + "\n");
}

}  // namespace loom::ckpt
