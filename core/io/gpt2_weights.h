// GPT-2 weights in safetensors with Hugging Face's names, so a model from the Hub (or saved by
// transformers) runs here and ours loads there.
//
// Names (an optional "transformer." prefix is accepted on load; save writes none, like the
// Hub's gpt2/model.safetensors):
//   wte.weight [V, C]  wpe.weight [maxT, C]  ln_f.weight / ln_f.bias [C]
//   h.{i}.ln_1.weight / .bias [C]            h.{i}.ln_2.weight / .bias [C]
//   h.{i}.attn.c_attn.weight [C, 3C]  .bias [3C]    h.{i}.attn.c_proj.weight [C, C]  .bias [C]
//   h.{i}.mlp.c_fc.weight [C, 4C]     .bias [4C]    h.{i}.mlp.c_proj.weight [4C, C]  .bias [C]
// Hugging Face's Conv1D stores matrices (in, out); loom's are (out, in), so the four matrices
// are transposed both ways. lm_head.weight (tied to wte) and the attention mask buffers
// h.{i}.attn.bias / h.{i}.attn.masked_bias are ignored on load and not written.
//
// The config comes from the shapes: layers from the h.{i} count, channels and vocab from wte,
// max_seq_len from wpe. padded_vocab comes from metadata "padded_vocab_size" (save writes it),
// else vocab rounded up to a multiple of 128 as llm.c pads 50257 to 50304; padding rows are
// zeros. Heads cannot be seen in any shape: they come from metadata "n_head" (save writes it),
// else from the caller's hint, else loading fails asking for --heads.
#pragma once

#include <cstdint>
#include <string>

#include "core/io/gpt_params.h"

namespace loom::io {

// `heads_hint` is the head count the user asked for (--heads), 0 when none: it is used when the
// file does not record n_head, and must agree with it when the file does. Throws loom::Error
// naming the file and the tensor for unexpected, missing or misshapen tensors.
GptWeights load_gpt2_safetensors(const std::string& path, int64_t heads_hint = 0);

// Writes the unpadded vocab rows of wte, and metadata format=pt (which transformers requires),
// n_head, n_layer, n_embd, n_positions, vocab_size and padded_vocab_size.
// A model with mixture-of-experts blocks (`moe`, See gpt_param_specs) also writes, for each
// MoE block i, h.{i}.mlp.router.weight [E, C] (as a Linear's, out x in) and
// h.{i}.mlp.experts.{e}.c_fc.weight [C, H] / .c_fc.bias [H] / .c_proj.weight [H, C] /
// .c_proj.bias [C] (Conv1D's layout, as the dense MLP's), in place of h.{i}.mlp.c_*, and
// metadata moe_experts, moe_top_k, moe_every, moe_hidden, moe_capacity_factor, moe_aux_loss,
// moe_z_loss; load_gpt2_safetensors reads them back into GptWeights::moe.
void save_gpt2_safetensors(const std::string& path, const GptConfig& config,
                           const GptParams& params, const nn::MoeOptions& moe = {});

// The padded vocabulary llm.c would use: vocab rounded up to a multiple of 128.
int64_t llmc_padded_vocab(int64_t vocab);

}  // namespace loom::io
