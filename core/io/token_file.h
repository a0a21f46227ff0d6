// llm.c token files (the `.bin` shards its data scripts write): a header of 256 little-endian
// int32 — [0] magic 20240520, [1] version 1, [2] token count, the rest zero — then the tokens as
// uint16. loom keeps tokens as int32 in memory (the dtype its embedding takes), so reading widens
// and writing checks that every token fits in uint16.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::io {

constexpr int32_t kTokenFileMagic = 20240520;
constexpr int32_t kTokenFileVersion = 1;
constexpr int64_t kLlmcHeaderInts = 256;  // llm.c headers (tokens and models) are 256 x int32
constexpr int64_t kLlmcHeaderBytes = kLlmcHeaderInts * 4;

// Throws loom::Error naming the file for: a missing file, a file shorter than the header, a wrong
// magic or version, and a body whose size disagrees with the header's token count.
std::vector<int32_t> read_token_file(const std::string& path);

// Throws loom::Error (and leaves no file behind) when a token is outside [0, 65535].
void write_token_file(const std::string& path, const std::vector<int32_t>& tokens);

}  // namespace loom::io
