// Byte-level text data: every byte of a file is one token, so the vocabulary is exactly 256 and
// any file (UTF-8 or not) round-trips. This is the simplest real-data option and needs no
// tokenizer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::io {

constexpr int64_t kByteVocab = 256;

// The file's bytes as tokens 0..255. Throws loom::Error naming the file when it cannot be read.
std::vector<int32_t> read_text_file(const std::string& path);

// The same mapping for in-memory text, and back (tokens outside 0..255 are a loom::Error).
std::vector<int32_t> text_to_tokens(const std::string& text);
std::string tokens_to_text(const std::vector<int32_t>& tokens);

}  // namespace loom::io
