// See core/io/gpt2_weights.h.
#include "core/io/gpt2_weights.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>

#include "core/error.h"
#include "core/io/safetensors.h"

namespace loom::io {
namespace {

constexpr const char* kWhat = "GPT-2 safetensors file";

// One per-layer tensor: the Hugging Face suffix after "h.{i}.", the loom suffix after
// "blocks.{i}.", and loom's shape in units of C: [rows * C] for vectors, [rows * C, cols * C]
// (out, in) for matrices, which Hugging Face's Conv1D stores transposed, (in, out).
struct LayerTensor {
  const char* hf;
  const char* loom;
  int64_t rows;
  int64_t cols;  // 0 for vectors
};
constexpr LayerTensor kLayerTensors[] = {
    {"ln_1.weight", "ln1.weight", 1, 0},
    {"ln_1.bias", "ln1.bias", 1, 0},
    {"attn.c_attn.weight", "attn.qkv.weight", 3, 1},
    {"attn.c_attn.bias", "attn.qkv.bias", 3, 0},
    {"attn.c_proj.weight", "attn.proj.weight", 1, 1},
    {"attn.c_proj.bias", "attn.proj.bias", 1, 0},
    {"ln_2.weight", "ln2.weight", 1, 0},
    {"ln_2.bias", "ln2.bias", 1, 0},
    {"mlp.c_fc.weight", "mlp.fc.weight", 4, 1},
    {"mlp.c_fc.bias", "mlp.fc.bias", 4, 0},
    {"mlp.c_proj.weight", "mlp.proj.weight", 1, 4},
    {"mlp.c_proj.bias", "mlp.proj.bias", 1, 0},
};

bool is_mlp(const LayerTensor& lt) { return std::strncmp(lt.hf, "mlp.", 4) == 0; }

bool is_moe_block(const nn::MoeOptions& moe, int64_t layer) {
  return moe.enabled() && layer % moe.every == 0;
}

// A double as metadata: the shortest text that reads back to the same value.
std::string number_str(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// Parses "h.{i}.{suffix}" into (i, suffix); false when the name is not of that form.
bool split_layer_name(const std::string& name, int64_t* layer, std::string* suffix) {
  if (name.rfind("h.", 0) != 0) return false;
  size_t dot = name.find('.', 2);
  if (dot == std::string::npos || dot == 2 || dot - 2 > 9) return false;
  for (size_t k = 2; k < dot; ++k)
    if (!std::isdigit(static_cast<unsigned char>(name[k]))) return false;
  *layer = std::stoll(name.substr(2, dot - 2));
  *suffix = name.substr(dot + 1);
  return true;
}

int64_t metadata_int(const std::string& path, const std::map<std::string, std::string>& meta,
                     const std::string& key) {
  auto it = meta.find(key);
  if (it == meta.end()) return 0;
  const std::string& v = it->second;
  bool ok = !v.empty() && v.size() <= 12;
  for (char ch : v) ok = ok && std::isdigit(static_cast<unsigned char>(ch));
  LOOM_CHECK(ok && std::stoll(v) > 0, kWhat, " ", path, ": metadata ", key, " is '", v,
             "', expected a positive integer");
  return std::stoll(v);
}

// A floating metadata value, `fallback` when absent.
double metadata_double(const std::string& path, const std::map<std::string, std::string>& meta,
                       const std::string& key, double fallback) {
  auto it = meta.find(key);
  if (it == meta.end()) return fallback;
  char* end = nullptr;
  const double v = std::strtod(it->second.c_str(), &end);
  LOOM_CHECK(!it->second.empty() && end && *end == '\0' && std::isfinite(v), kWhat, " ", path,
             ": metadata ", key, " is '", it->second, "', expected a number");
  return v;
}

// The mixture-of-experts blocks of a file loom saved with --moe-experts (the layers holding
// mlp.router.weight): the experts from the router's rows, the width from expert 0's c_fc, the
// rest from the moe_* metadata (top_k is required: no shape shows it). Experts 0: none.
nn::MoeOptions moe_from_file(const std::string& path, const std::map<std::string, Tensor>& hf,
                             const std::map<std::string, std::string>& meta, const GptConfig& c) {
  nn::MoeOptions m;
  std::vector<int64_t> layers;
  for (int64_t i = 0; i < c.layers; ++i)
    if (hf.count("h." + std::to_string(i) + ".mlp.router.weight")) layers.push_back(i);
  if (layers.empty()) return m;
  const std::string first = "h." + std::to_string(layers[0]) + ".mlp.";
  const Tensor& router = hf.at(first + "router.weight");
  LOOM_CHECK(router.dim() == 2 && router.size(1) == c.channels, kWhat, " ", path, ": tensor ",
             first, "router.weight has shape ", shape_str(router.shape()), ", expected [experts, ",
             c.channels, "]");
  m.experts = router.size(0);
  auto fc = hf.find(first + "experts.0.c_fc.weight");
  LOOM_CHECK(fc != hf.end() && fc->second.dim() == 2, kWhat, " ", path, ": tensor ", first,
             "experts.0.c_fc.weight is missing or not a matrix");
  m.hidden = fc->second.size(1) == 4 * c.channels ? 0 : fc->second.size(1);
  m.top_k = metadata_int(path, meta, "moe_top_k");
  LOOM_CHECK(m.top_k > 0, kWhat, " ", path,
             ": it holds mixture-of-experts blocks but no "
             "moe_top_k metadata (how many experts each token uses cannot be seen in the shapes)");
  m.every = metadata_int(path, meta, "moe_every");
  if (m.every == 0) m.every = layers.size() > 1 ? layers[1] - layers[0] : c.layers;
  const int64_t experts_meta = metadata_int(path, meta, "moe_experts");
  LOOM_CHECK(experts_meta == 0 || experts_meta == m.experts, kWhat, " ", path,
             ": metadata moe_experts is ", experts_meta, " but the routers have ", m.experts,
             " rows");
  m.capacity_factor = metadata_double(path, meta, "moe_capacity_factor", 0.0);
  m.aux_loss = metadata_double(path, meta, "moe_aux_loss", m.aux_loss);
  m.z_loss = metadata_double(path, meta, "moe_z_loss", m.z_loss);
  try {
    m.validate();
  } catch (const Error& e) {
    LOOM_FAIL(kWhat, " ", path, ": its mixture-of-experts metadata is invalid: ", e.what());
  }
  for (int64_t i = 0; i < c.layers; ++i)
    LOOM_CHECK(
        hf.count("h." + std::to_string(i) + ".mlp.router.weight") == size_t(i % m.every == 0),
        kWhat, " ", path, ": block ", i, (i % m.every == 0 ? " has no" : " has a"),
        " router, but every ", m.every, "-th block is a mixture of experts");
  return m;
}

}  // namespace

int64_t llmc_padded_vocab(int64_t vocab) { return (vocab + 127) / 128 * 128; }

GptWeights load_gpt2_safetensors(const std::string& path, int64_t heads_hint) {
  SafetensorsFile file = read_safetensors(path);

  // Strip the optional prefix and drop what GPT-2 checkpoints carry besides parameters.
  std::map<std::string, Tensor> hf;
  for (auto& [full_name, tensor] : file.tensors) {
    std::string name = full_name;
    if (name.rfind("transformer.", 0) == 0) name = name.substr(std::strlen("transformer."));
    int64_t layer;
    std::string suffix;
    if (name == "lm_head.weight") continue;  // tied to wte
    if (split_layer_name(name, &layer, &suffix) &&
        (suffix == "attn.bias" || suffix == "attn.masked_bias"))
      continue;  // causal-mask buffers, not parameters
    LOOM_CHECK(hf.emplace(name, tensor).second, kWhat, " ", path, ": tensor ", name,
               " appears both with and without the 'transformer.' prefix");
  }
  file.tensors.clear();  // `hf` holds the handles now; each is freed once converted

  auto take = [&](const std::string& name) -> Tensor {
    auto it = hf.find(name);
    LOOM_CHECK(it != hf.end(), kWhat, " ", path, ": tensor ", name, " is missing");
    LOOM_CHECK(is_floating(it->second.dtype()), kWhat, " ", path, ": tensor ", name, " is ",
               dtype_name(it->second.dtype()), ", expected a floating dtype");
    Tensor t = it->second.to(DType::kF32);
    hf.erase(it);
    return t;
  };
  auto expect_shape = [&](const std::string& name, const Tensor& t, const Shape& shape) {
    LOOM_CHECK(t.shape() == shape, kWhat, " ", path, ": tensor ", name, " has shape ",
               shape_str(t.shape()), ", expected ", shape_str(shape));
  };

  // Shapes give everything but the heads.
  Tensor wte = take("wte.weight");
  LOOM_CHECK(wte.dim() == 2, kWhat, " ", path, ": tensor wte.weight has shape ",
             shape_str(wte.shape()), ", expected [vocab, channels]");
  Tensor wpe = take("wpe.weight");
  LOOM_CHECK(wpe.dim() == 2, kWhat, " ", path, ": tensor wpe.weight has shape ",
             shape_str(wpe.shape()), ", expected [max_seq_len, channels]");
  GptConfig c;
  c.vocab = wte.size(0);
  c.channels = wte.size(1);
  c.max_seq_len = wpe.size(0);
  expect_shape("wpe.weight", wpe, {c.max_seq_len, c.channels});
  int64_t layers = 0;
  for (const auto& [name, t] : hf) {
    int64_t layer;
    std::string suffix;
    if (split_layer_name(name, &layer, &suffix)) layers = std::max(layers, layer + 1);
  }
  c.layers = layers;
  LOOM_CHECK(c.layers > 0, kWhat, " ", path, ": no transformer blocks (h.0.*) found");

  const auto& meta = file.metadata;
  c.padded_vocab = metadata_int(path, meta, "padded_vocab_size");
  if (c.padded_vocab == 0) c.padded_vocab = llmc_padded_vocab(c.vocab);
  LOOM_CHECK(c.padded_vocab >= c.vocab, kWhat, " ", path, ": metadata padded_vocab_size ",
             c.padded_vocab, " is smaller than the ", c.vocab, " rows of wte.weight");
  const std::pair<const char*, int64_t> recorded[] = {{"n_layer", c.layers},
                                                      {"n_embd", c.channels},
                                                      {"vocab_size", c.vocab},
                                                      {"n_positions", c.max_seq_len}};
  for (const auto& [key, value] : recorded) {
    int64_t m = metadata_int(path, meta, key);
    LOOM_CHECK(m == 0 || m == value, kWhat, " ", path, ": metadata ", key, " is ", m,
               " but the tensors say ", value);
  }
  const int64_t meta_heads = metadata_int(path, meta, "n_head");
  LOOM_CHECK(heads_hint >= 0, "load_gpt2_safetensors: heads hint ", heads_hint, " is negative");
  LOOM_CHECK(meta_heads == 0 || heads_hint == 0 || meta_heads == heads_hint, kWhat, " ", path,
             " records n_head ", meta_heads, " but ", heads_hint, " heads were asked for");
  c.heads = meta_heads ? meta_heads : heads_hint;
  LOOM_CHECK(c.heads > 0, kWhat, " ", path,
             ": the number of attention heads is not recorded in the file (no n_head metadata) "
             "and cannot be inferred from the shapes; pass --heads (GPT-2 small has 12)");
  LOOM_CHECK(c.channels % c.heads == 0, kWhat, " ", path, ": ", c.heads,
             " heads do not divide the ", c.channels, " channels");
  c.validate();

  GptWeights w;
  w.config = c;
  w.moe = moe_from_file(path, hf, meta, c);
  const int64_t C = c.channels;
  Tensor padded = Tensor::zeros({c.padded_vocab, C});
  padded.narrow(0, 0, c.vocab).copy_(wte);
  w.params["wte.weight"] = padded;
  w.params["wpe.weight"] = wpe.contiguous();
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    const std::string blocks = "blocks." + std::to_string(i) + ".";
    const bool experts = is_moe_block(w.moe, i);
    for (const LayerTensor& lt : kLayerTensors) {
      if (experts && is_mlp(lt)) continue;
      const std::string name = h + lt.hf;
      Tensor t = take(name);
      if (lt.cols) {
        expect_shape(name, t, {lt.cols * C, lt.rows * C});  // Conv1D: (in, out)
        w.params[blocks + lt.loom] = t.transpose(0, 1).contiguous();
      } else {
        expect_shape(name, t, {lt.rows * C});
        w.params[blocks + lt.loom] = t.contiguous();
      }
    }
    if (!experts) continue;
    const int64_t H = w.moe.expert_width(C);
    Tensor router = take(h + "mlp.router.weight");
    expect_shape(h + "mlp.router.weight", router, {w.moe.experts, C});
    w.params[blocks + "mlp.router.weight"] = router.contiguous();
    for (int64_t e = 0; e < w.moe.experts; ++e) {
      const std::string from = h + "mlp.experts." + std::to_string(e) + ".";
      const std::string to = blocks + "mlp.experts." + std::to_string(e) + ".";
      const std::pair<const char*, Shape> matrices[] = {{"c_fc.weight", {C, H}},
                                                        {"c_proj.weight", {H, C}}};
      for (const auto& [name, shape] : matrices) {  // Conv1D (in, out): transposed
        Tensor t = take(from + name);
        expect_shape(from + name, t, shape);
        w.params[to + (name[2] == 'f' ? "fc.weight" : "proj.weight")] =
            t.transpose(0, 1).contiguous();
      }
      Tensor fc_bias = take(from + "c_fc.bias"), proj_bias = take(from + "c_proj.bias");
      expect_shape(from + "c_fc.bias", fc_bias, {H});
      expect_shape(from + "c_proj.bias", proj_bias, {C});
      w.params[to + "fc.bias"] = fc_bias.contiguous();
      w.params[to + "proj.bias"] = proj_bias.contiguous();
    }
  }
  for (const char* name : {"ln_f.weight", "ln_f.bias"}) {
    Tensor t = take(name);
    expect_shape(name, t, {C});
    w.params[name] = t.contiguous();
  }
  LOOM_CHECK(hf.empty(), kWhat, " ", path, ": unexpected tensor ", hf.begin()->first,
             " (not a GPT-2 parameter", hf.size() > 1 ? ", and " : "",
             hf.size() > 1 ? std::to_string(hf.size() - 1) + " more" : std::string(), ")");
  check_gpt_params(c, w.params, std::string("loading ") + kWhat + " " + path, w.moe);
  return w;
}

void save_gpt2_safetensors(const std::string& path, const GptConfig& config,
                           const GptParams& params, const nn::MoeOptions& moe) {
  const std::string context = std::string("saving ") + kWhat + " " + path;
  config.validate();
  check_gpt_params(config, params, context, moe);
  std::map<std::string, Tensor> hf;
  hf["wte.weight"] = host_f32(params.at("wte.weight")).narrow(0, 0, config.vocab).contiguous();
  hf["wpe.weight"] = host_f32(params.at("wpe.weight"));
  for (int64_t i = 0; i < config.layers; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    const std::string blocks = "blocks." + std::to_string(i) + ".";
    const bool experts = is_moe_block(moe, i);
    for (const LayerTensor& lt : kLayerTensors) {
      if (experts && is_mlp(lt)) continue;
      Tensor t = host_f32(params.at(blocks + lt.loom));
      hf[h + lt.hf] = lt.cols ? t.transpose(0, 1).contiguous() : t;
    }
    if (!experts) continue;
    hf[h + "mlp.router.weight"] = host_f32(params.at(blocks + "mlp.router.weight"));
    for (int64_t e = 0; e < moe.experts; ++e) {
      const std::string from = blocks + "mlp.experts." + std::to_string(e) + ".";
      const std::string to = h + "mlp.experts." + std::to_string(e) + ".";
      hf[to + "c_fc.weight"] = host_f32(params.at(from + "fc.weight")).transpose(0, 1).contiguous();
      hf[to + "c_fc.bias"] = host_f32(params.at(from + "fc.bias"));
      hf[to + "c_proj.weight"] =
          host_f32(params.at(from + "proj.weight")).transpose(0, 1).contiguous();
      hf[to + "c_proj.bias"] = host_f32(params.at(from + "proj.bias"));
    }
  }
  hf["ln_f.weight"] = host_f32(params.at("ln_f.weight"));
  hf["ln_f.bias"] = host_f32(params.at("ln_f.bias"));
  std::map<std::string, std::string> meta = {
      {"format", "pt"},
      {"n_head", std::to_string(config.heads)},
      {"n_layer", std::to_string(config.layers)},
      {"n_embd", std::to_string(config.channels)},
      {"n_positions", std::to_string(config.max_seq_len)},
      {"vocab_size", std::to_string(config.vocab)},
      {"padded_vocab_size", std::to_string(config.padded_vocab)},
  };
  if (moe.enabled()) {  // what the shapes cannot tell (See load_gpt2_safetensors)
    meta["moe_experts"] = std::to_string(moe.experts);
    meta["moe_top_k"] = std::to_string(moe.top_k);
    meta["moe_every"] = std::to_string(moe.every);
    meta["moe_hidden"] = std::to_string(moe.expert_width(config.channels));
    meta["moe_capacity_factor"] = number_str(moe.capacity_factor);
    meta["moe_aux_loss"] = number_str(moe.aux_loss);
    meta["moe_z_loss"] = number_str(moe.z_loss);
  }
  write_safetensors(path, hf, meta);
}

}  // namespace loom::io
