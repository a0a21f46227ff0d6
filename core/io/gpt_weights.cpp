// See core/io/gpt_weights.h.
#include "core/io/gpt_weights.h"

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/io/detail/file.h"
#include "core/io/detail/json.h"
#include "core/io/gpt2_weights.h"
#include "core/io/llmc_checkpoint.h"
#include "core/io/safetensors.h"
#include "core/io/token_file.h"

namespace loom::io {

namespace {

// The Hugging Face config.json beside a safetensors file: its head count (0 when there is no such
// file or it has none), and, once the weights are read, its other sizes checked against them.
struct HfConfig {
  std::string path;
  nlohmann::json json;

  static HfConfig beside(const std::string& weights) {
    const size_t slash = weights.find_last_of('/');
    HfConfig c;
    c.path =
        (slash == std::string::npos ? std::string() : weights.substr(0, slash + 1)) + "config.json";
    if (!std::filesystem::is_regular_file(c.path)) return HfConfig{};
    c.json = detail::parse_json(detail::read_all(c.path, "Hugging Face config"),
                                "Hugging Face config " + c.path);
    LOOM_CHECK(c.json.is_object(), "Hugging Face config ", c.path, " is not a JSON object");
    return c;
  }
  int64_t field(const char* key) const {
    if (path.empty() || !json.contains(key)) return 0;
    LOOM_CHECK(json[key].is_number_integer() && json[key].get<int64_t>() > 0,
               "Hugging Face config ", path, ": \"", key, "\" must be a positive integer, got ",
               detail::json_excerpt(json[key]));
    return json[key].get<int64_t>();
  }
  void check(const GptConfig& c, const std::string& weights) const {
    const std::pair<const char*, int64_t> sizes[] = {{"n_layer", c.layers},
                                                     {"n_embd", c.channels},
                                                     {"vocab_size", c.vocab},
                                                     {"n_positions", c.max_seq_len}};
    for (const auto& [key, value] : sizes) {
      const int64_t said = field(key);
      LOOM_CHECK(said == 0 || said == value, "Hugging Face config ", path, " says ", key, " ", said,
                 " but the weights in ", weights, " have ", value);
    }
  }
};

}  // namespace

namespace {

void check_finite(const GptWeights& w, const std::string& path) {
  for (const auto& [name, t] : w.params) {
    const Tensor f = t.to(DType::kF32).contiguous();
    const float* p = f.data<float>();
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < f.numel(); ++i)
      if (!std::isfinite(p[i])) {
        if (first < 0) first = i;
        ++bad;
      }
    LOOM_CHECK(bad == 0, "weights file ", path, ": tensor ", name, " holds ", bad,
               " NaN or infinite value(s), the first at element ", first, " (", p[first],
               "): a damaged file or a diverged run?");
  }
}

}  // namespace

GptWeights load_gpt_weights(const std::string& given, int64_t heads_hint, bool allow_nonfinite) {
  std::string path = given;
  if (std::filesystem::is_directory(given)) {
    path = (given.back() == '/' ? given : given + "/") + "model.safetensors";
    LOOM_CHECK(std::filesystem::is_regular_file(path), given,
               " is a directory without model.safetensors (a Hugging Face GPT-2 directory holds "
               "config.json and model.safetensors)");
  }
  int32_t magic = 0;
  {
    detail::InFile in(path, "weights file");
    if (in.size() >= 4) in.read_at(0, &magic, 4);
  }
  if (magic == kLlmcModelMagic) {
    GptWeights w = load_llmc_checkpoint(path);
    LOOM_CHECK(heads_hint == 0 || heads_hint == w.config.heads, "llm.c model file ", path, " has ",
               w.config.heads, " heads but ", heads_hint, " were asked for");
    if (!allow_nonfinite) check_finite(w, path);
    return w;
  }
  LOOM_CHECK(magic != kTokenFileMagic, path,
             " is an llm.c token file (magic 20240520), not model weights: pass it as data");
  LOOM_CHECK(looks_like_safetensors(path), path,
             " is neither an llm.c model file (magic 20240326) nor a safetensors file "
             "(8-byte header length, then a JSON header)");
  const HfConfig hf = HfConfig::beside(path);
  const int64_t hf_heads = hf.field("n_head");
  LOOM_CHECK(hf_heads == 0 || heads_hint == 0 || hf_heads == heads_hint, "Hugging Face config ",
             hf.path, " says n_head ", hf_heads, " but ", heads_hint, " heads were asked for");
  GptWeights w = load_gpt2_safetensors(path, hf_heads ? hf_heads : heads_hint);
  hf.check(w.config, path);
  if (!allow_nonfinite) check_finite(w, path);
  return w;
}

void save_gpt_weights(const std::string& path, const GptConfig& config, const GptParams& params,
                      const nn::MoeOptions& moe) {
  const std::string ext = detail::extension_of(path);
  LOOM_CHECK(!(ext == ".bin" && moe.enabled()), "cannot save ", path,
             ": llm.c's format has no place for a mixture of experts; save to .safetensors");
  if (ext == ".bin") return save_llmc_checkpoint(path, config, params);
  if (ext == ".safetensors") return save_gpt2_safetensors(path, config, params, moe);
  LOOM_FAIL("cannot tell which weight format to write to ", path, ": the extension is '", ext,
            "', expected .bin (llm.c) or .safetensors (Hugging Face GPT-2)");
}

}  // namespace loom::io
