// What loom-bench-tp and loom-bench-pp share: `--name value` integer flags, the benchmark GPT's
// config, and reproducible random tokens (the same on every rank).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/nn/gpt_config.h"
#include "core/tensor.h"

namespace loom::bench {

// The usage line: every flag with its current value, which is its default before parsing.
inline std::string int_flags_usage(const char* program,
                                   const std::map<std::string, int64_t*>& fields) {
  std::string usage = std::string("usage: ") + program;
  for (const auto& [name, value] : fields)
    usage += " [--" + name + " " + std::to_string(*value) + "]";
  return usage;
}

// Sets *fields[name] from each `--name value` pair; an unknown flag, a missing value or a value
// that is not a positive integer is an error naming it. `--help` (or `-h`) prints the usage and
// exits, before any rank has started MPI.
inline void parse_int_flags(int argc, char** argv, const char* program,
                            const std::map<std::string, int64_t*>& fields) {
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::printf("%s\n", int_flags_usage(program, fields).c_str());
      std::exit(0);
    }
    auto it = flag.rfind("--", 0) == 0 ? fields.find(flag.substr(2)) : fields.end();
    LOOM_CHECK(it != fields.end(), program, ": unknown flag ", flag, "\n",
               int_flags_usage(program, fields));
    LOOM_CHECK(i + 1 < argc, program, ": ", flag, " needs a value");
    char* end = nullptr;
    const long long v = std::strtoll(argv[i + 1], &end, 10);
    LOOM_CHECK(end && *end == '\0' && v > 0, program, ": ", flag,
               " expects a positive integer, got '", argv[i + 1], "'");
    *it->second = v;
  }
}

// A GPT of `layers` blocks, dim `channels`, `heads` heads, sequences of `seq` over `vocab` tokens
// (no padding rows).
inline GptConfig bench_config(int64_t layers, int64_t channels, int64_t heads, int64_t seq,
                              int64_t vocab) {
  GptConfig c;
  c.layers = layers;
  c.channels = channels;
  c.heads = heads;
  c.max_seq_len = seq;
  c.vocab = vocab;
  c.padded_vocab = vocab;
  return c;
}

// Token ids [rows, seq] in [0, vocab) from an LCG seeded with `seed`.
inline Tensor random_tokens(int64_t rows, int64_t seq, int64_t vocab, uint64_t seed) {
  std::vector<int64_t> v;
  uint64_t s = seed;
  for (int64_t i = 0; i < rows * seq; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    v.push_back(int64_t((s >> 33) % uint64_t(vocab)));
  }
  return Tensor::from_vector(v, {rows, seq});
}

}  // namespace loom::bench
