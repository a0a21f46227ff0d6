// See core/io/gpt_weights.h.
#include "core/io/gpt_weights.h"

#include "core/error.h"
#include "core/io/detail/file.h"
#include "core/io/gpt2_weights.h"
#include "core/io/llmc_checkpoint.h"
#include "core/io/safetensors.h"
#include "core/io/token_file.h"

namespace loom::io {

GptWeights load_gpt_weights(const std::string& path, int64_t heads_hint) {
  int32_t magic = 0;
  {
    detail::InFile in(path, "weights file");
    if (in.size() >= 4) in.read_at(0, &magic, 4);
  }
  if (magic == kLlmcModelMagic) {
    GptWeights w = load_llmc_checkpoint(path);
    LOOM_CHECK(heads_hint == 0 || heads_hint == w.config.heads, "llm.c model file ", path, " has ",
               w.config.heads, " heads but ", heads_hint, " were asked for");
    return w;
  }
  LOOM_CHECK(magic != kTokenFileMagic, path,
             " is an llm.c token file (magic 20240520), not model weights: pass it as data");
  LOOM_CHECK(looks_like_safetensors(path), path,
             " is neither an llm.c model file (magic 20240326) nor a safetensors file "
             "(8-byte header length, then a JSON header)");
  return load_gpt2_safetensors(path, heads_hint);
}

void save_gpt_weights(const std::string& path, const GptConfig& config, const GptParams& params) {
  const std::string ext = detail::extension_of(path);
  if (ext == ".bin") return save_llmc_checkpoint(path, config, params);
  if (ext == ".safetensors") return save_gpt2_safetensors(path, config, params);
  LOOM_FAIL("cannot tell which weight format to write to ", path, ": the extension is '", ext,
            "', expected .bin (llm.c) or .safetensors (Hugging Face GPT-2)");
}

}  // namespace loom::io
