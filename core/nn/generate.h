// Text generation with a GPT: nanoGPT's generate (`GPT.generate(idx, max_new_tokens,
// temperature, top_k)`) with a KV cache.
//
// Each new token is drawn from the logits of the last position: divided by the temperature, cut
// to the top_k largest (values equal to the k-th largest stay, as nanoGPT's `logits < v[:, [-1]]`),
// softmax, one draw. temperature 0 takes the argmax instead (the first index among equal
// largest), as `do_sample=False` in Hugging Face; top_k 0 keeps every token. Only the first
// `vocab` logits are tokens (a padded vocabulary's extra columns are never drawn).
//
// The prompt runs once through the model, filling the cache; each later token runs alone,
// attending to the cached keys and values. A sequence longer than max_seq_len is cut to its last
// max_seq_len tokens, as nanoGPT's `idx[:, -block_size:]`: the learned positions then shift, so
// the cut window runs again from an empty cache (every later step too, while the sequence is
// longer than the model's window).
//
// Draws are counter-based (core/rng.h): the draw of row b at new token s is uniform element
// s * B + b of the stream `stream` under `seed`, so a seed gives the same text on any device and
// run. They are not PyTorch's draws (torch.multinomial uses its own generator): only greedy
// decoding (temperature 0 or top_k 1) gives PyTorch's tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/nn/gpt.h"

namespace loom::nn {

struct GenerateOptions {
  int64_t max_new_tokens = 0;
  double temperature = 1.0;  // > 0 samples; 0 takes the argmax
  int64_t top_k = 0;         // 0: every token; else 1 .. vocab
  uint64_t seed = 0;
  std::string stream = "loom.generate";
};

// idx [B, T] token ids (i32/i64, T >= 1, each in [0, vocab)) -> [B, T + max_new_tokens] of
// idx's dtype and device: the prompt followed by the generated tokens. Runs without autograd;
// dropout follows the model's mode, as in PyTorch (call model.eval() first).
Tensor generate(GPT& model, const Tensor& idx, const GenerateOptions& options);

// The next token of one row from its logits (the first `vocab` of them; all finite or -inf),
// given the draw's uniform u in [0, 1): the rule above. Exposed for tests.
int64_t sample_token(const float* logits, int64_t vocab, double temperature, int64_t top_k,
                     double u);

}  // namespace loom::nn
