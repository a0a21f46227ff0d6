// llm.c's GPT-2 model file (what its train_gpt2.py writes and train_gpt2.c reads), so a model
// trained with llm.c runs here and ours runs there.
//
// Layout: a header of 256 little-endian int32 — [0] magic 20240326, [1] version 3 (f32),
// [2] max_seq_len, [3] vocab, [4] layers, [5] heads, [6] channels, [7] padded vocab, the rest
// zero — then f32 arrays, matrices (out, in), in this order:
//   wte [Vp, C]  wpe [maxT, C]  ln1w [L, C]  ln1b [L, C]  qkvw [L, 3C, C]  qkvb [L, 3C]
//   attprojw [L, C, C]  attprojb [L, C]  ln2w [L, C]  ln2b [L, C]  fcw [L, 4C, C]  fcb [L, 4C]
//   fcprojw [L, C, 4C]  fcprojb [L, C]  lnfw [C]  lnfb [C]
// Layer i of an [L, ...] array is blocks.{i}.* in loom's names; no transposes are needed.
#pragma once

#include <cstdint>
#include <string>

#include "core/io/gpt_params.h"

namespace loom::io {

constexpr int32_t kLlmcModelMagic = 20240326;
constexpr int32_t kLlmcModelVersionF32 = 3;
constexpr int32_t kLlmcModelVersionBF16 = 5;  // recognised, not supported yet

// Throws loom::Error naming the file for: a missing file, a short header, a wrong magic, an
// unsupported version (5 = bf16), an inconsistent header, and a size that disagrees with it.
GptWeights load_llmc_checkpoint(const std::string& path);

// Writes version 3 (f32). `params` must hold exactly the GPT's parameters (see
// check_gpt_params); rows of wte past config.vocab are written as zeros.
void save_llmc_checkpoint(const std::string& path, const GptConfig& config,
                          const GptParams& params);

}  // namespace loom::io
