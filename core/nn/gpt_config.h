// The shape of a GPT-2-style model, shared by the module (core/nn/gpt.h), the weight formats
// (core/io/) and the CLI.
//
// Note [GPT parameter names]
// loom names GPT parameters hierarchically, as Module builds them:
//   wte.weight                 [padded_vocab, channels]  token embedding, tied to the output head
//   wpe.weight                 [max_seq_len, channels]   learned positions
//   blocks.{i}.ln1.weight      [channels]        blocks.{i}.ln1.bias       [channels]
//   blocks.{i}.attn.qkv.weight [3*channels, channels]   .bias [3*channels]   (out, in)
//   blocks.{i}.attn.proj.weight [channels, channels]    .bias [channels]
//   blocks.{i}.ln2.weight / .bias [channels]
//   blocks.{i}.mlp.fc.weight   [4*channels, channels]   .bias [4*channels]
//   blocks.{i}.mlp.proj.weight [channels, 4*channels]   .bias [channels]
//   ln_f.weight / ln_f.bias    [channels]
// Rows of wte past `vocab` are padding: they never receive probability (the loss masks them) and
// are written as zeros. Matrices are (out, in) as in llm.c; Hugging Face's Conv1D is (in, out).
#pragma once

#include <cstdint>
#include <string>

namespace loom {

struct GptConfig {
  int64_t max_seq_len = 1024;
  int64_t vocab = 50257;         // real tokens
  int64_t padded_vocab = 50304;  // rows of wte (>= vocab; a multiple of 64 or 128 is fastest)
  int64_t layers = 12;
  int64_t heads = 12;
  int64_t channels = 768;

  // Throws loom::Error naming the first inconsistent field (e.g. heads not dividing channels).
  void validate() const;
  std::string str() const;
  // Elements of all parameters (wte at padded_vocab rows), however the model is split.
  int64_t num_parameters()
      const;  // "layers 12 heads 12 channels 768 vocab 50257 (padded 50304) seq 1024"
};

// The rows loom-gpt gives the embedding for `vocab` tokens: matmuls over the vocabulary run
// fastest on round sizes; llm.c pads 50257 to 50304 (x128).
inline int64_t padded_vocab_for(int64_t vocab) {
  const int64_t multiple = vocab > 1024 ? 128 : 16;
  return (vocab + multiple - 1) / multiple * multiple;
}

}  // namespace loom
