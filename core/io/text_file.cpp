// See core/io/text_file.h.
#include "core/io/text_file.h"

#include "core/error.h"
#include "core/io/detail/file.h"

namespace loom::io {

std::vector<int32_t> read_text_file(const std::string& path) {
  return text_to_tokens(detail::read_all(path, "text file"));
}

std::vector<int32_t> text_to_tokens(const std::string& text) {
  std::vector<int32_t> tokens(text.size());
  // Through unsigned char: bytes >= 128 are tokens 128..255, never negative.
  for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

std::string tokens_to_text(const std::vector<int32_t>& tokens) {
  std::string text(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    LOOM_CHECK(tokens[i] >= 0 && tokens[i] < kByteVocab, "tokens_to_text: token ", tokens[i],
               " at position ", i, " is not a byte (expected 0..255)");
    text[i] = char(static_cast<unsigned char>(tokens[i]));
  }
  return text;
}

}  // namespace loom::io
