// See core/io/llmc_checkpoint.h. The array order is llm.c's fill_in_parameter_sizes().
#include "core/io/llmc_checkpoint.h"

#include <bit>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/io/detail/file.h"
#include "core/io/token_file.h"

namespace loom::io {

static_assert(std::endian::native == std::endian::little, "core/io assumes a little-endian host");

namespace {

constexpr const char* kWhat = "llm.c model file";

// One array of the file: its llm.c name, the loom name (per layer: "blocks.{i}." + suffix) and
// the shape of one layer's slice.
struct LlmcArray {
  const char* llmc_name;
  const char* loom_name;
  bool per_layer;
  Shape (*shape)(const GptConfig&);
};

const std::vector<LlmcArray>& llmc_arrays() {
  static const std::vector<LlmcArray> arrays = {
      {"wte", "wte.weight", false,
       [](const GptConfig& c) {
         return Shape{c.padded_vocab, c.channels};
       }},
      {"wpe", "wpe.weight", false,
       [](const GptConfig& c) {
         return Shape{c.max_seq_len, c.channels};
       }},
      {"ln1w", "ln1.weight", true, [](const GptConfig& c) { return Shape{c.channels}; }},
      {"ln1b", "ln1.bias", true, [](const GptConfig& c) { return Shape{c.channels}; }},
      {"qkvw", "attn.qkv.weight", true,
       [](const GptConfig& c) {
         return Shape{3 * c.channels, c.channels};
       }},
      {"qkvb", "attn.qkv.bias", true, [](const GptConfig& c) { return Shape{3 * c.channels}; }},
      {"attprojw", "attn.proj.weight", true,
       [](const GptConfig& c) {
         return Shape{c.channels, c.channels};
       }},
      {"attprojb", "attn.proj.bias", true, [](const GptConfig& c) { return Shape{c.channels}; }},
      {"ln2w", "ln2.weight", true, [](const GptConfig& c) { return Shape{c.channels}; }},
      {"ln2b", "ln2.bias", true, [](const GptConfig& c) { return Shape{c.channels}; }},
      {"fcw", "mlp.fc.weight", true,
       [](const GptConfig& c) {
         return Shape{4 * c.channels, c.channels};
       }},
      {"fcb", "mlp.fc.bias", true, [](const GptConfig& c) { return Shape{4 * c.channels}; }},
      {"fcprojw", "mlp.proj.weight", true,
       [](const GptConfig& c) {
         return Shape{c.channels, 4 * c.channels};
       }},
      {"fcprojb", "mlp.proj.bias", true, [](const GptConfig& c) { return Shape{c.channels}; }},
      {"lnfw", "ln_f.weight", false, [](const GptConfig& c) { return Shape{c.channels}; }},
      {"lnfb", "ln_f.bias", false, [](const GptConfig& c) { return Shape{c.channels}; }},
  };
  return arrays;
}

std::string loom_name(const LlmcArray& a, int64_t layer) {
  return a.per_layer ? "blocks." + std::to_string(layer) + "." + a.loom_name : a.loom_name;
}

// Bytes of all the arrays, in 128 bits so that a corrupt header cannot overflow the sum.
unsigned __int128 body_bytes(const GptConfig& c) {
  unsigned __int128 total = 0;
  for (const LlmcArray& a : llmc_arrays()) {
    unsigned __int128 n = a.per_layer ? uint64_t(c.layers) : 1;
    for (int64_t d : a.shape(c)) n *= uint64_t(d);
    total += n * 4;
  }
  return total;
}

std::string u128_str(unsigned __int128 v) {
  if (v == 0) return "0";
  std::string s;
  for (; v; v /= 10) s.insert(s.begin(), char('0' + int(v % 10)));
  return s;
}

}  // namespace

GptWeights load_llmc_checkpoint(const std::string& path) {
  detail::InFile in(path, kWhat);
  LOOM_CHECK(in.size() >= uint64_t(kLlmcHeaderBytes), kWhat, " ", path, " is ", in.size(),
             " bytes, shorter than the ", kLlmcHeaderBytes, "-byte header (256 x int32)");
  int32_t h[kLlmcHeaderInts];
  in.read_at(0, h, sizeof(h));
  LOOM_CHECK(h[0] == kLlmcModelMagic, path, " is not an llm.c model file: magic ", h[0],
             ", expected ", kLlmcModelMagic,
             h[0] == kTokenFileMagic ? " (it is an llm.c token file: pass it as data)" : "");
  LOOM_CHECK(h[1] != kLlmcModelVersionBF16, kWhat, " ", path,
             ": bf16 llm.c checkpoints (version 5) are not supported yet, only version 3 (f32)");
  LOOM_CHECK(h[1] == kLlmcModelVersionF32, kWhat, " ", path, " has version ", h[1],
             "; only version 3 (f32) is supported");

  GptConfig c;
  c.max_seq_len = h[2];
  c.vocab = h[3];
  c.layers = h[4];
  c.heads = h[5];
  c.channels = h[6];
  c.padded_vocab = h[7];
  const char* names[] = {"max_seq_len", "vocab", "layers", "heads", "channels", "padded_vocab"};
  for (int i = 0; i < 6; ++i)
    LOOM_CHECK(h[2 + i] > 0, kWhat, " ", path, ": header field ", names[i], " is ", h[2 + i],
               ", expected a positive number");
  LOOM_CHECK(c.channels % c.heads == 0, kWhat, " ", path, ": inconsistent header: heads ", c.heads,
             " do not divide channels ", c.channels);
  LOOM_CHECK(c.padded_vocab >= c.vocab, kWhat, " ", path, ": inconsistent header: padded vocab ",
             c.padded_vocab, " is smaller than vocab ", c.vocab);

  const unsigned __int128 expected = body_bytes(c);
  const uint64_t body = in.size() - uint64_t(kLlmcHeaderBytes);
  LOOM_CHECK(body == expected, kWhat, " ", path,
             body < expected ? " is truncated" : " has trailing bytes", ": its header (", c.str(),
             ") needs ", u128_str(expected), " bytes of f32 weights after the header, ",
             "the file holds ", body);

  GptWeights w;
  w.config = c;
  uint64_t offset = uint64_t(kLlmcHeaderBytes);
  for (const LlmcArray& a : llmc_arrays()) {
    for (int64_t i = 0; i < (a.per_layer ? c.layers : 1); ++i) {
      Tensor t = Tensor::empty(a.shape(c), DType::kF32);
      in.read_at(offset, t.data<float>(), t.nbytes());
      offset += t.nbytes();
      w.params.emplace(loom_name(a, i), t);
    }
  }
  LOOM_ASSERT(offset == in.size(), "read ", offset, " of ", in.size(), " bytes of ", path);
  return w;
}

void save_llmc_checkpoint(const std::string& path, const GptConfig& config,
                          const GptParams& params) {
  const std::string context = "saving " + std::string(kWhat) + " " + path;
  config.validate();
  for (int64_t v : {config.max_seq_len, config.vocab, config.layers, config.heads, config.channels,
                    config.padded_vocab})
    LOOM_CHECK(v <= INT32_MAX, context, ": ", config.str(), " does not fit the int32 header");
  check_gpt_params(config, params, context);

  int32_t h[kLlmcHeaderInts] = {};
  h[0] = kLlmcModelMagic;
  h[1] = kLlmcModelVersionF32;
  h[2] = int32_t(config.max_seq_len);
  h[3] = int32_t(config.vocab);
  h[4] = int32_t(config.layers);
  h[5] = int32_t(config.heads);
  h[6] = int32_t(config.channels);
  h[7] = int32_t(config.padded_vocab);

  detail::OutFile out(path, kWhat);
  out.write(h, sizeof(h));
  for (const LlmcArray& a : llmc_arrays()) {
    for (int64_t i = 0; i < (a.per_layer ? config.layers : 1); ++i) {
      const std::string name = loom_name(a, i);
      Tensor t = host_f32(params.at(name));
      if (name == "wte.weight") {
        // Padding rows never receive probability; writing zeros keeps files identical for
        // identical models (See Note [GPT parameter names]).
        const uint64_t real = uint64_t(config.vocab * config.channels) * 4;
        out.write(t.data<float>(), real);
        std::vector<float> zeros(size_t((config.padded_vocab - config.vocab) * config.channels));
        out.write(zeros.data(), zeros.size() * 4);
      } else {
        out.write(t.data<float>(), t.nbytes());
      }
    }
  }
  out.commit();
}

}  // namespace loom::io
