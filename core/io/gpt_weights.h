// The one entry point for GPT weights (loom-gpt --init-from / --save): loading picks the format
// from the file's first bytes, so a misnamed file still loads; saving picks it from the
// extension, so the user says which format they want.
//   .bin          llm.c model file (core/io/llmc_checkpoint.h)
//   .safetensors  Hugging Face GPT-2 names (core/io/gpt2_weights.h)
#pragma once

#include <cstdint>
#include <string>

#include "core/io/gpt_params.h"

namespace loom::io {

// `path` is a weights file or a Hugging Face model directory (its model.safetensors is read).
// A safetensors file with a Hugging Face config.json beside it takes its head count from there,
// and the config's other sizes (n_layer, n_embd, vocab_size, n_positions) must match the weights.
// `heads_hint`: the --heads the user gave, 0 for none. A file that records its heads (every
// llm.c file; safetensors saved by loom; a config.json beside it) must agree with it; otherwise
// it supplies the heads.
// Throws loom::Error naming the file when it is neither format (with a hint when it is an llm.c
// token file).
// A weight that is NaN or infinite is refused, naming the tensor, the first such element and how
// many there are (a damaged or diverged file would otherwise train on silently), unless
// `allow_nonfinite`.
GptWeights load_gpt_weights(const std::string& path, int64_t heads_hint = 0,
                            bool allow_nonfinite = false);

// Throws loom::Error for an extension other than .bin or .safetensors, and for a model with
// mixture-of-experts blocks (`moe`) in llm.c's format, which has no place for experts.
void save_gpt_weights(const std::string& path, const GptConfig& config, const GptParams& params,
                      const nn::MoeOptions& moe = {});

}  // namespace loom::io
