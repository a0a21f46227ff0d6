#include "core/nn/gpt_config.h"

#include "core/error.h"

namespace loom {

void GptConfig::validate() const {
  LOOM_CHECK(layers > 0, "GPT config: layers must be positive, got ", layers);
  LOOM_CHECK(heads > 0, "GPT config: heads must be positive, got ", heads);
  LOOM_CHECK(channels > 0, "GPT config: channels (dim) must be positive, got ", channels);
  LOOM_CHECK(channels % heads == 0, "GPT config: heads (", heads, ") must divide dim (", channels,
             ")");
  LOOM_CHECK(vocab > 0, "GPT config: vocab must be positive, got ", vocab);
  LOOM_CHECK(padded_vocab >= vocab, "GPT config: padded vocab ", padded_vocab,
             " is smaller than vocab ", vocab);
  LOOM_CHECK(max_seq_len > 0, "GPT config: max sequence length must be positive, got ",
             max_seq_len);
}

std::string GptConfig::str() const {
  return detail::str_cat("layers ", layers, " heads ", heads, " dim ", channels, " vocab ", vocab,
                         " (padded ", padded_vocab, ") seq ", max_seq_len);
}

int64_t GptConfig::num_parameters() const {
  const int64_t c = channels;
  const int64_t per_block = 12 * c * c + 13 * c;  // 2 LayerNorms, qkv, proj, fc, proj
  return padded_vocab * c + max_seq_len * c + layers * per_block + 2 * c;
}

}  // namespace loom
