// See core/io/gpt_params.h.
#include "core/io/gpt_params.h"

#include <set>

#include "core/error.h"
#include "core/io/detail/json.h"

namespace loom::io {

std::vector<GptParamSpec> gpt_param_specs(const GptConfig& c, const nn::MoeOptions& moe) {
  const int64_t C = c.channels;
  std::vector<GptParamSpec> specs = {{"wte.weight", {c.padded_vocab, C}},
                                     {"wpe.weight", {c.max_seq_len, C}}};
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = "blocks." + std::to_string(i) + ".";
    specs.push_back({p + "ln1.weight", {C}});
    specs.push_back({p + "ln1.bias", {C}});
    specs.push_back({p + "attn.qkv.weight", {3 * C, C}});
    specs.push_back({p + "attn.qkv.bias", {3 * C}});
    specs.push_back({p + "attn.proj.weight", {C, C}});
    specs.push_back({p + "attn.proj.bias", {C}});
    specs.push_back({p + "ln2.weight", {C}});
    specs.push_back({p + "ln2.bias", {C}});
    if (moe.enabled() && i % moe.every == 0) {
      const int64_t H = moe.expert_width(C);
      specs.push_back({p + "mlp.router.weight", {moe.experts, C}});
      for (int64_t e = 0; e < moe.experts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        specs.push_back({x + "fc.weight", {H, C}});
        specs.push_back({x + "fc.bias", {H}});
        specs.push_back({x + "proj.weight", {C, H}});
        specs.push_back({x + "proj.bias", {C}});
      }
      continue;
    }
    specs.push_back({p + "mlp.fc.weight", {4 * C, C}});
    specs.push_back({p + "mlp.fc.bias", {4 * C}});
    specs.push_back({p + "mlp.proj.weight", {C, 4 * C}});
    specs.push_back({p + "mlp.proj.bias", {C}});
  }
  specs.push_back({"ln_f.weight", {C}});
  specs.push_back({"ln_f.bias", {C}});
  return specs;
}

void check_gpt_params(const GptConfig& config, const GptParams& params, const std::string& context,
                      const nn::MoeOptions& moe) {
  std::set<std::string> expected;
  for (const GptParamSpec& spec : gpt_param_specs(config, moe)) {
    expected.insert(spec.name);
    auto it = params.find(spec.name);
    LOOM_CHECK(it != params.end(), context, ": parameter ", spec.name, " is missing (",
               config.str(), ")");
    const Tensor& t = it->second;
    LOOM_CHECK(t.defined(), context, ": parameter ", spec.name, " is an undefined tensor");
    LOOM_CHECK(t.shape() == spec.shape, context, ": parameter ", spec.name, " has shape ",
               shape_str(t.shape()), ", expected ", shape_str(spec.shape), " (", config.str(), ")");
    LOOM_CHECK(is_floating(t.dtype()), context, ": parameter ", spec.name, " is ",
               dtype_name(t.dtype()), ", expected a floating dtype");
  }
  for (const auto& [name, t] : params)
    LOOM_CHECK(expected.count(name), context, ": unexpected parameter ", name,
               " (not a GPT parameter; see Note [GPT parameter names] in core/nn/gpt_config.h)");
}

Tensor host_f32(const Tensor& t) {
  return t.detach().to(Device::cpu()).to(DType::kF32).contiguous();
}

nlohmann::json gpt_config_json(const GptConfig& c) {
  return {{"layers", c.layers},
          {"heads", c.heads},
          {"channels", c.channels},
          {"vocab", c.vocab},
          {"padded_vocab", c.padded_vocab},
          {"max_seq_len", c.max_seq_len}};
}

GptConfig gpt_config_from_json(const nlohmann::json& j, const std::string& where) {
  LOOM_CHECK(j.is_object(), where,
             ": the model config is not a JSON object: ", detail::json_excerpt(j));
  auto field = [&](const char* key) {
    LOOM_CHECK(j.contains(key) && j[key].is_number_integer(), where, ": model config field \"", key,
               "\" is ",
               j.contains(key) ? "not an integer: " + detail::json_excerpt(j[key]) : "missing",
               " (expected layers, heads, channels, vocab, padded_vocab, max_seq_len)");
    return j[key].get<int64_t>();
  };
  GptConfig c;
  c.layers = field("layers");
  c.heads = field("heads");
  c.channels = field("channels");
  c.vocab = field("vocab");
  c.padded_vocab = field("padded_vocab");
  c.max_seq_len = field("max_seq_len");
  try {
    c.validate();
  } catch (const Error& e) {
    LOOM_FAIL(where, ": the model config is not a valid GPT: ", e.what());
  }
  return c;
}

}  // namespace loom::io
