// A GPT's weights as the weight formats exchange them: the config plus a flat map from loom's
// parameter names (See Note [GPT parameter names] in core/nn/gpt_config.h) to CPU f32 tensors.
// The formats depend on this map only, not on nn::Module, so a checkpoint can be read, checked
// and converted without building a model.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/nn/gpt_config.h"
#include "core/nn/moe.h"
#include "core/tensor.h"

namespace loom::io {

using GptParams = std::map<std::string, Tensor>;

struct GptWeights {
  GptConfig config;
  GptParams params;  // loom names -> CPU f32 tensors
  // The mixture-of-experts blocks (experts 0: a dense model). `hidden` is the experts' width.
  nn::MoeOptions moe;
};

struct GptParamSpec {
  std::string name;
  Shape shape;
};

// Every parameter of a GPT with this config, in the order of Note [GPT parameter names]
// (wte, wpe, then each block, then ln_f).
// With `moe` enabled, the MoE blocks (i % moe.every == 0) hold mlp.router.weight [E, C] and
// mlp.experts.{e}.fc.weight [H, C] / .fc.bias [H] / .proj.weight [C, H] / .proj.bias [C]
// (H: moe.hidden, or 4C) in place of the dense MLP.
std::vector<GptParamSpec> gpt_param_specs(const GptConfig& config, const nn::MoeOptions& moe = {});

// Checks that `params` holds exactly the parameters of gpt_param_specs(config), each with its
// shape and a floating dtype. Throws loom::Error naming `context` (e.g. "saving model.bin") and
// the first missing, unexpected or misshapen tensor.
void check_gpt_params(const GptConfig& config, const GptParams& params, const std::string& context,
                      const nn::MoeOptions& moe = {});

// The config as checkpoints record it ({"layers", "heads", "channels", "vocab", "padded_vocab",
// "max_seq_len"}) and back. Reading throws naming `where` for a missing or non-integer field or an
// inconsistent config.
nlohmann::json gpt_config_json(const GptConfig& config);
GptConfig gpt_config_from_json(const nlohmann::json& j, const std::string& where);

// A contiguous CPU f32 copy (or the tensor itself when it already is one), without autograd
// history: what a writer puts in a file.
Tensor host_f32(const Tensor& t);

}  // namespace loom::io
