// Weight formats (core/io): llm.c model files and safetensors with Hugging Face GPT-2 names.
// The inputs are written by hand, byte by byte, with a recognisable value in every element, so a
// tensor landing in the wrong place (or not transposed) shows up as a wrong number.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/io/gpt2_weights.h"
#include "core/io/gpt_weights.h"
#include "core/io/llmc_checkpoint.h"
#include "core/io/safetensors.h"
#include "core/io/token_file.h"
#include "testing/files.h"
#include "testing/gradcheck.h"

namespace loom::io {
namespace {

using WeightsTest = testing::TempDirTest;
using testing::append;
using testing::expect_error;
using testing::read_bytes;
using testing::write_bytes;

// ---------------------------------------------------------------- a tiny llm.c model by hand

// maxT 4, vocab 10 (padded 16), 2 layers, 2 heads, 8 channels.
constexpr int32_t kT = 4, kV = 10, kVp = 16, kL = 2, kNH = 2, kC = 8;

// llm.c's arrays in file order, with the loom name and the shape of one layer's slice.
struct LlmcArray {
  const char* loom;
  bool per_layer;
  Shape shape;
};
const std::vector<LlmcArray> kLlmcArrays = {
    {"wte.weight", false, {kVp, kC}},
    {"wpe.weight", false, {kT, kC}},
    {"ln1.weight", true, {kC}},
    {"ln1.bias", true, {kC}},
    {"attn.qkv.weight", true, {3 * kC, kC}},
    {"attn.qkv.bias", true, {3 * kC}},
    {"attn.proj.weight", true, {kC, kC}},
    {"attn.proj.bias", true, {kC}},
    {"ln2.weight", true, {kC}},
    {"ln2.bias", true, {kC}},
    {"mlp.fc.weight", true, {4 * kC, kC}},
    {"mlp.fc.bias", true, {4 * kC}},
    {"mlp.proj.weight", true, {kC, 4 * kC}},
    {"mlp.proj.bias", true, {kC}},
    {"ln_f.weight", false, {kC}},
    {"ln_f.bias", false, {kC}},
};

// Element j of layer `layer` of array `id`; wte's padding rows are zero, as llm.c writes them.
float llmc_value(size_t id, int64_t layer, int64_t j) {
  if (id == 0 && j / kC >= kV) return 0.0f;
  return float(int64_t(id + 1) * 100000 + layer * 10000 + j);
}

std::string llmc_header(int32_t magic, int32_t version, std::vector<int32_t> fields) {
  std::string h;
  append(h, magic);
  append(h, version);
  for (int32_t f : fields) append(h, f);
  while (h.size() < 1024) append(h, int32_t(0));
  return h;
}

std::string tiny_llmc_file() {
  std::string bytes = llmc_header(20240326, 3, {kT, kV, kL, kNH, kC, kVp});
  for (size_t id = 0; id < kLlmcArrays.size(); ++id)
    for (int64_t layer = 0; layer < (kLlmcArrays[id].per_layer ? kL : 1); ++layer)
      for (int64_t j = 0; j < shape_numel(kLlmcArrays[id].shape); ++j)
        append(bytes, llmc_value(id, layer, j));
  return bytes;
}

void expect_tiny_llmc_params(const GptWeights& w) {
  EXPECT_EQ(w.config.max_seq_len, kT);
  EXPECT_EQ(w.config.vocab, kV);
  EXPECT_EQ(w.config.padded_vocab, kVp);
  EXPECT_EQ(w.config.layers, kL);
  EXPECT_EQ(w.config.heads, kNH);
  EXPECT_EQ(w.config.channels, kC);
  EXPECT_EQ(w.params.size(), 2u + 12u * kL + 2u);
  for (size_t id = 0; id < kLlmcArrays.size(); ++id) {
    const LlmcArray& a = kLlmcArrays[id];
    for (int64_t layer = 0; layer < (a.per_layer ? kL : 1); ++layer) {
      std::string name = a.per_layer ? "blocks." + std::to_string(layer) + "." + a.loom : a.loom;
      ASSERT_TRUE(w.params.count(name)) << name;
      const Tensor& t = w.params.at(name);
      ASSERT_EQ(t.shape(), a.shape) << name;
      ASSERT_EQ(t.dtype(), DType::kF32) << name;
      std::vector<float> v = t.to_vector<float>();
      for (int64_t j = 0; j < t.numel(); ++j)
        ASSERT_EQ(v[size_t(j)], llmc_value(id, layer, j)) << name << " element " << j;
    }
  }
}

TEST_F(WeightsTest, LlmcCheckpointByHandLoadsEveryTensorInPlace) {
  write_bytes(path("tiny.bin"), tiny_llmc_file());
  GptWeights w = load_llmc_checkpoint(path("tiny.bin"));
  expect_tiny_llmc_params(w);
  // A few elements spelled out: array 5 (qkvw) layer 1 row 5 column 3; array 13 (fcprojw) layer
  // 1 row 2 column 17; wte row 9 (last real row) and row 10 (padding).
  auto at = [&](const std::string& name, int64_t flat) {
    return w.params.at(name).to_vector<float>()[size_t(flat)];
  };
  EXPECT_EQ(at("blocks.1.attn.qkv.weight", 5 * 8 + 3), 510043.0f);
  EXPECT_EQ(at("blocks.1.mlp.proj.weight", 2 * 32 + 17), 1310081.0f);
  EXPECT_EQ(at("blocks.0.ln2.bias", 7), 1000007.0f);
  EXPECT_EQ(at("ln_f.bias", 0), 1600000.0f);
  EXPECT_EQ(at("wte.weight", 9 * 8 + 7), 100079.0f);
  EXPECT_EQ(at("wte.weight", 10 * 8), 0.0f);
}

TEST_F(WeightsTest, LlmcCheckpointSavesByteForByte) {
  write_bytes(path("tiny.bin"), tiny_llmc_file());
  GptWeights w = load_llmc_checkpoint(path("tiny.bin"));
  save_llmc_checkpoint(path("again.bin"), w.config, w.params);
  EXPECT_EQ(read_bytes(path("again.bin")), tiny_llmc_file());

  // Padding rows are written as zeros whatever the model holds there.
  w.params["wte.weight"].data<float>()[12 * kC + 1] = 42.0f;
  save_llmc_checkpoint(path("padded.bin"), w.config, w.params);
  EXPECT_EQ(read_bytes(path("padded.bin")), tiny_llmc_file());
}

TEST_F(WeightsTest, LlmcCheckpointBadInput) {
  const std::string p = path("bad.bin");
  expect_error([&] { load_llmc_checkpoint(path("nope.bin")); },
               {"cannot open llm.c model file", "nope.bin", "No such file"});

  write_bytes(p, std::string(1000, '\0'));
  expect_error([&] { load_llmc_checkpoint(p); }, {p, "1000 bytes", "shorter than the 1024-byte"});

  write_bytes(p, llmc_header(12345, 3, {kT, kV, kL, kNH, kC, kVp}));
  expect_error([&] { load_llmc_checkpoint(p); },
               {p + " is not an llm.c model file: magic 12345, expected 20240326"});
  write_bytes(p, llmc_header(20240520, 1, {5}));
  expect_error([&] { load_llmc_checkpoint(p); }, {"magic 20240520", "token file"});

  write_bytes(p, llmc_header(20240326, 5, {kT, kV, kL, kNH, kC, kVp}));
  expect_error(
      [&] { load_llmc_checkpoint(p); },
      {p, "bf16 llm.c checkpoints (version 5) are not supported yet, only version 3 (f32)"});
  write_bytes(p, llmc_header(20240326, 1, {kT, kV, kL, kNH, kC, kVp}));
  expect_error([&] { load_llmc_checkpoint(p); }, {p, "version 1", "only version 3"});

  write_bytes(p, llmc_header(20240326, 3, {kT, kV, kL, 3, kC, kVp}));
  expect_error([&] { load_llmc_checkpoint(p); }, {p, "heads 3 do not divide channels 8"});
  write_bytes(p, llmc_header(20240326, 3, {kT, kV, 0, kNH, kC, kVp}));
  expect_error([&] { load_llmc_checkpoint(p); }, {p, "layers is 0"});
  write_bytes(p, llmc_header(20240326, 3, {kT, 20, kL, kNH, kC, kVp}));
  expect_error([&] { load_llmc_checkpoint(p); }, {p, "padded vocab 16 is smaller than vocab 20"});
  // Huge fields must not overflow the size computation into a bogus match.
  write_bytes(p,
              llmc_header(20240326, 3, {INT32_MAX, INT32_MAX, INT32_MAX, 1, INT32_MAX, INT32_MAX}));
  expect_error([&] { load_llmc_checkpoint(p); }, {p, "is truncated"});

  // The tiny model holds 128 + 32 + 2 x 872 + 16 = 1920 floats, 7680 bytes after the header.
  std::string file = tiny_llmc_file();
  write_bytes(p, file.substr(0, file.size() - 4));
  expect_error([&] { load_llmc_checkpoint(p); },
               {p, "is truncated", "needs 7680 bytes", "the file holds 7676"});
  write_bytes(p, file + "x");
  expect_error([&] { load_llmc_checkpoint(p); }, {p, "has trailing bytes"});
}

TEST_F(WeightsTest, SavingChecksTheParameters) {
  write_bytes(path("tiny.bin"), tiny_llmc_file());
  GptWeights w = load_llmc_checkpoint(path("tiny.bin"));
  GptParams missing = w.params;
  missing.erase("blocks.1.mlp.fc.bias");
  expect_error([&] { save_llmc_checkpoint(path("m.bin"), w.config, missing); },
               {"m.bin", "parameter blocks.1.mlp.fc.bias is missing"});
  GptParams misshapen = w.params;
  misshapen["blocks.0.attn.qkv.weight"] = Tensor::zeros({8, 24});
  expect_error([&] { save_gpt2_safetensors(path("m.safetensors"), w.config, misshapen); },
               {"m.safetensors", "blocks.0.attn.qkv.weight has shape [8, 24], expected [24, 8]"});
  GptParams extra = w.params;
  extra["blocks.0.attn.mask"] = Tensor::zeros({4, 4});
  expect_error([&] { save_gpt_weights(path("e.bin"), w.config, extra); },
               {"unexpected parameter blocks.0.attn.mask"});
  EXPECT_FALSE(std::filesystem::exists(path("m.bin")));
}

// ---------------------------------------------------------------- safetensors

// A safetensors file by hand: the header JSON as text, then the data.
struct HandTensor {
  std::string name;
  std::string dtype;
  Shape shape;
  std::string data;
};

std::string safetensors_bytes(const std::vector<HandTensor>& tensors,
                              const std::string& metadata_json = "") {
  std::string json = "{";
  if (!metadata_json.empty()) json += "\"__metadata__\":" + metadata_json;
  std::string data;
  for (const HandTensor& t : tensors) {
    if (json.size() > 1) json += ",";
    json += "\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) json += (i ? "," : "") + std::to_string(t.shape[i]);
    json += "],\"data_offsets\":[" + std::to_string(data.size()) + "," +
            std::to_string(data.size() + t.data.size()) + "]}";
    data += t.data;
  }
  json += "}";
  std::string bytes;
  append(bytes, uint64_t(json.size()));
  return bytes + json + data;
}

std::string f32_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

TEST_F(WeightsTest, SafetensorsRoundTripEveryDtype) {
  std::map<std::string, Tensor> tensors;
  tensors["f32"] = Tensor::from_vector<float>({1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -0.5f}, {2, 3});
  tensors["bf16"] = Tensor::from_vector<float>({1.0f, -3.5f, 256.0f}, {3}).to(DType::kBF16);
  tensors["f16"] = Tensor::from_vector<float>({0.5f, 65504.0f}, {2, 1}).to(DType::kF16);
  tensors["i32"] = Tensor::from_vector<int32_t>({-7, 2147483647}, {2});
  tensors["i64"] = Tensor::from_vector<int64_t>({int64_t(1) << 40, -1}, {1, 2});
  tensors["u8"] = Tensor::from_vector<uint8_t>({0, 128, 255}, {3});
  tensors["scalar"] = Tensor::from_vector<float>({9.0f}, {});
  tensors["empty"] = Tensor::zeros({0, 3});
  tensors["view"] = Tensor::arange(6).reshape({2, 3}).transpose(0, 1);  // written contiguous
  write_safetensors(path("all.safetensors"), tensors, {{"format", "pt"}, {"note", "x\"y"}});

  SafetensorsFile f = read_safetensors(path("all.safetensors"));
  EXPECT_EQ(f.metadata, (std::map<std::string, std::string>{{"format", "pt"}, {"note", "x\"y"}}));
  ASSERT_EQ(f.tensors.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    const Tensor& r = f.tensors.at(name);
    EXPECT_EQ(r.shape(), t.shape()) << name;
    EXPECT_EQ(r.dtype(), t.dtype()) << name;
    Tensor c = t.contiguous();
    if (c.nbytes()) EXPECT_EQ(0, std::memcmp(r.data_ptr(), c.data_ptr(), c.nbytes())) << name;
  }
  EXPECT_EQ(f.tensors.at("view").to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));

  // The layout, read independently: header padded to 8 bytes; the data packed with no holes
  // (which the reference reader refuses), wider dtypes first and by name within a width, so every
  // tensor starts aligned to its dtype.
  std::string bytes = read_bytes(path("all.safetensors"));
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["bf16"]["dtype"], "BF16");
  EXPECT_EQ(header["i64"]["shape"], nlohmann::json::parse("[1, 2]"));
  EXPECT_EQ(header["scalar"]["shape"], nlohmann::json::array());
  std::vector<std::pair<std::string, Tensor>> order(tensors.begin(), tensors.end());
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return dtype_size(a.second.dtype()) > dtype_size(b.second.dtype());
  });
  uint64_t offset = 0;
  for (const auto& [name, t] : order) {
    EXPECT_EQ(header[name]["data_offsets"], nlohmann::json({offset, offset + t.nbytes()})) << name;
    EXPECT_EQ(offset % dtype_size(t.dtype()), 0u) << name << " is not aligned to its dtype";
    offset += t.nbytes();
  }
  EXPECT_EQ(bytes.size(), 8 + n + offset);
}

TEST_F(WeightsTest, SafetensorsByHandReads) {
  write_bytes(path("hand.safetensors"),
              safetensors_bytes({{"a", "F32", {2}, f32_bytes({1.0f, 2.0f})},
                                 {"b", "I32", {1}, std::string("\x05\x00\x00\x00", 4)}},
                                R"({"k":"v"})"));
  SafetensorsFile f = read_safetensors(path("hand.safetensors"));
  EXPECT_EQ(f.tensors.at("a").to_vector<float>(), (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(f.tensors.at("b").to_vector<int32_t>(), (std::vector<int32_t>{5}));
  EXPECT_EQ(f.metadata.at("k"), "v");
}

// A crafted header nesting 50,000 levels deep (it crashed the loaders with a stack overflow while
// printing the error) is refused by the parser's depth limit, naming it; 60 levels still read.
TEST_F(WeightsTest, SafetensorsDeepNestingIsRefusedNotACrash) {
  const std::string p = path("deep.safetensors");
  const int depth = 50000;
  write_bytes(p, safetensors_bytes({{"x", "F32", {1}, f32_bytes({1.0f})}},
                                   std::string(depth, '[') + std::string(depth, ']')));
  expect_error([&] { read_safetensors(p); }, {p, "more than 64 levels deep"});
  write_bytes(p, safetensors_bytes({{"x", "F32", {1}, f32_bytes({1.0f})}},
                                   "{\"a\":" + std::string(60, '[') + std::string(60, ']') + "}"));
  expect_error([&] { read_safetensors(p); }, {p, "__metadata__ value 'a' must be a string"});
  // A huge invalid value is cut in the message, not printed whole.
  write_bytes(p, safetensors_bytes({{"x", "F32", {1}, f32_bytes({1.0f})}},
                                   "{\"a\":\"" + std::string(100000, 'z') + "\"}"));
  (void)read_safetensors(p);  // a long string is a valid metadata value
}

// Sizes whose product overflows int64 are refused before anything is allocated.
TEST_F(WeightsTest, SafetensorsShapeThatOverflowsIsRefused) {
  const std::string p = path("huge.safetensors");
  write_bytes(p, safetensors_bytes({{"x", "F32", {int64_t(1) << 62, 8}, f32_bytes({1.0f})}}));
  try {
    (void)read_safetensors(p);
    ADD_FAILURE() << "a shape of 2^65 elements was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST_F(WeightsTest, SafetensorsBadInput) {
  const std::string p = path("bad.safetensors");
  auto write_header = [&](const std::string& json, const std::string& data) {
    std::string bytes;
    append(bytes, uint64_t(json.size()));
    write_bytes(p, bytes + json + data);
  };
  expect_error([&] { read_safetensors(path("gone.safetensors")); },
               {"cannot open safetensors file", "gone.safetensors"});
  write_bytes(p, "abc");
  expect_error([&] { read_safetensors(p); }, {p, "3 bytes, too short"});
  write_header("{}", "");
  write_bytes(p, read_bytes(p).substr(0, 9));  // header length 2, one byte of it
  expect_error([&] { read_safetensors(p); }, {p, "truncated", "header length 2"});
  write_header("{not json", "");
  expect_error([&] { read_safetensors(p); }, {p, "not valid JSON"});
  write_header("[1,2]", "");
  expect_error([&] { read_safetensors(p); }, {p, "must be a JSON object"});
  write_header(R"({"x":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", std::string(8, 0));
  expect_error([&] { read_safetensors(p); }, {p, "'x' has dtype F64", "not support"});
  write_header(R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,12]}})", std::string(12, 0));
  expect_error([&] { read_safetensors(p); },
               {p, "'x'", "span 12 bytes, but shape [4] F32 needs 16"});
  write_header(R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", std::string(10, 0));
  expect_error([&] { read_safetensors(p); }, {p, "'x'", "run past the end of the data (10 bytes"});
  write_header(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
               std::string(12, 0));
  expect_error([&] { read_safetensors(p); }, {p, "tensors 'x' [0, 8) and 'y' [4, 12) overlap"});
  write_header(R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", std::string(4, 0));
  expect_error([&] { read_safetensors(p); }, {p, "non-negative integer"});
  write_header(R"({"x":{"dtype":"F32","shape":[1]}})", std::string(4, 0));
  expect_error([&] { read_safetensors(p); }, {p, "has no \"data_offsets\""});
  write_header(R"({"__metadata__":{"n":1}})", "");
  expect_error([&] { read_safetensors(p); }, {p, "__metadata__ value 'n' must be a string"});
  std::string huge;
  append(huge, uint64_t(1) << 40);
  write_bytes(p, huge + "{}");
  expect_error([&] { read_safetensors(p); }, {p, "over the format's limit"});
}

// ---------------------------------------------------------------- GPT-2, Hugging Face names

// The twelve per-layer tensors: Hugging Face suffix, loom suffix, Hugging Face shape, and
// whether it is a Conv1D matrix (stored (in, out), transposed in loom).
struct HfTensor {
  const char* hf;
  const char* loom;
  Shape shape;
  bool conv1d;
};
const std::vector<HfTensor> kHfLayer = {
    {"ln_1.weight", "ln1.weight", {kC}, false},
    {"ln_1.bias", "ln1.bias", {kC}, false},
    {"attn.c_attn.weight", "attn.qkv.weight", {kC, 3 * kC}, true},
    {"attn.c_attn.bias", "attn.qkv.bias", {3 * kC}, false},
    {"attn.c_proj.weight", "attn.proj.weight", {kC, kC}, true},
    {"attn.c_proj.bias", "attn.proj.bias", {kC}, false},
    {"ln_2.weight", "ln2.weight", {kC}, false},
    {"ln_2.bias", "ln2.bias", {kC}, false},
    {"mlp.c_fc.weight", "mlp.fc.weight", {kC, 4 * kC}, true},
    {"mlp.c_fc.bias", "mlp.fc.bias", {4 * kC}, false},
    {"mlp.c_proj.weight", "mlp.proj.weight", {4 * kC, kC}, true},
    {"mlp.c_proj.bias", "mlp.proj.bias", {kC}, false},
};

// Element j of the k-th Hugging Face tensor.
float hf_value(int64_t k, int64_t j) { return float(k * 1000 + j); }

std::vector<float> hf_values(int64_t k, const Shape& shape) {
  std::vector<float> v(size_t(shape_numel(shape)));
  for (size_t j = 0; j < v.size(); ++j) v[j] = hf_value(k, int64_t(j));
  return v;
}

// (name without prefix, shape, k) of every GPT-2 parameter in the hand-built file.
struct HfEntry {
  std::string name;
  Shape shape;
  int64_t k;
};
std::vector<HfEntry> hf_entries() {
  std::vector<HfEntry> e = {{"wte.weight", {kV, kC}, 0}, {"wpe.weight", {kT, kC}, 1}};
  for (int64_t i = 0; i < kL; ++i)
    for (const HfTensor& t : kHfLayer)
      e.push_back({"h." + std::to_string(i) + "." + t.hf, t.shape, int64_t(e.size())});
  e.push_back({"ln_f.weight", {kC}, int64_t(e.size())});
  e.push_back({"ln_f.bias", {kC}, int64_t(e.size())});
  return e;
}

// A GPT2LMHeadModel-style file: "transformer." prefix, lm_head.weight, attn.bias mask buffers,
// no metadata.
std::string hf_gpt2_file() {
  std::vector<HandTensor> tensors;
  for (const HfEntry& e : hf_entries())
    tensors.push_back(
        {"transformer." + e.name, "F32", e.shape, f32_bytes(hf_values(e.k, e.shape))});
  tensors.insert(
      tensors.begin() + 5,
      {"transformer.h.0.attn.bias", "F32", {1, 1, kT, kT}, f32_bytes(std::vector<float>(16, 1))});
  tensors.push_back({"transformer.h.1.attn.masked_bias", "F32", {}, f32_bytes({-1e4f})});
  tensors.push_back({"lm_head.weight", "F32", {kV, kC}, f32_bytes(hf_values(0, {kV, kC}))});
  return safetensors_bytes(tensors);
}

TEST_F(WeightsTest, HuggingFaceGpt2LoadsTransposedAndPadded) {
  write_bytes(path("hf.safetensors"), hf_gpt2_file());
  GptWeights w = load_gpt2_safetensors(path("hf.safetensors"), /*heads_hint=*/kNH);
  EXPECT_EQ(w.config.layers, kL);
  EXPECT_EQ(w.config.channels, kC);
  EXPECT_EQ(w.config.vocab, kV);
  EXPECT_EQ(w.config.padded_vocab, 128);  // rounded up as llm.c pads 50257 to 50304
  EXPECT_EQ(w.config.max_seq_len, kT);
  EXPECT_EQ(w.config.heads, kNH);
  EXPECT_EQ(w.params.size(), 2u + 12u * kL + 2u);

  std::vector<float> wte = w.params.at("wte.weight").to_vector<float>();
  ASSERT_EQ(w.params.at("wte.weight").shape(), (Shape{128, kC}));
  for (int64_t j = 0; j < 128 * kC; ++j)
    ASSERT_EQ(wte[size_t(j)], j < kV * kC ? hf_value(0, j) : 0.0f) << "wte element " << j;
  EXPECT_EQ(w.params.at("wpe.weight").to_vector<float>(), hf_values(1, {kT, kC}));
  int64_t k = 2;
  for (int64_t i = 0; i < kL; ++i)
    for (const HfTensor& t : kHfLayer) {
      const std::string name = "blocks." + std::to_string(i) + "." + t.loom;
      const Tensor& p = w.params.at(name);
      std::vector<float> v = p.to_vector<float>();
      if (t.conv1d) {
        ASSERT_EQ(p.shape(), (Shape{t.shape[1], t.shape[0]})) << name;  // (out, in)
        for (int64_t o = 0; o < t.shape[1]; ++o)
          for (int64_t in = 0; in < t.shape[0]; ++in)
            ASSERT_EQ(v[size_t(o * t.shape[0] + in)], hf_value(k, in * t.shape[1] + o))
                << name << " [" << o << ", " << in << "]";
      } else {
        ASSERT_EQ(p.shape(), t.shape) << name;
        EXPECT_EQ(v, hf_values(k, t.shape)) << name;
      }
      ++k;
    }
  EXPECT_EQ(w.params.at("ln_f.bias").to_vector<float>(), hf_values(k + 1, {kC}));
  // Spelled out: loom's qkv.weight[20, 3] of layer 1 is Conv1D c_attn.weight[3, 20].
  EXPECT_EQ(w.params.at("blocks.1.attn.qkv.weight").to_vector<float>()[20 * 8 + 3],
            float(16 * 1000 + 3 * 24 + 20));
}

TEST_F(WeightsTest, HuggingFaceGpt2SavesBackInItsLayout) {
  write_bytes(path("hf.safetensors"), hf_gpt2_file());
  GptWeights w = load_gpt2_safetensors(path("hf.safetensors"), kNH);
  save_gpt2_safetensors(path("out.safetensors"), w.config, w.params);

  SafetensorsFile f = read_safetensors(path("out.safetensors"));
  std::vector<HfEntry> entries = hf_entries();
  ASSERT_EQ(f.tensors.size(), entries.size());  // no prefix, no lm_head, no mask buffers
  for (const HfEntry& e : entries) {
    ASSERT_TRUE(f.tensors.count(e.name)) << e.name;
    EXPECT_EQ(f.tensors.at(e.name).shape(), e.shape) << e.name;
    EXPECT_EQ(f.tensors.at(e.name).to_vector<float>(), hf_values(e.k, e.shape)) << e.name;
  }
  EXPECT_EQ(f.metadata.at("format"), "pt");
  EXPECT_EQ(f.metadata.at("n_head"), "2");
  EXPECT_EQ(f.metadata.at("n_layer"), "2");
  EXPECT_EQ(f.metadata.at("n_embd"), "8");
  EXPECT_EQ(f.metadata.at("vocab_size"), "10");

  // n_head is recorded now: no hint needed, and the reload is the same model.
  GptWeights again = load_gpt2_safetensors(path("out.safetensors"));
  EXPECT_EQ(again.config.str(), w.config.str());
  for (const auto& [name, t] : w.params)
    EXPECT_EQ(again.params.at(name).to_vector<float>(), t.to_vector<float>()) << name;
}

// A model with mixture-of-experts blocks (every 2nd block, 3 experts 12 wide, top-2): the
// experts are written as h.{i}.mlp.router.weight [E, C] and h.{i}.mlp.experts.{e}.c_fc.weight
// [C, H] (Conv1D: transposed) ..., with the moe_* metadata, and read back exactly, MoE options
// included; a file without moe_top_k is refused by name.
TEST_F(WeightsTest, MixtureOfExpertsSavesUnderHuggingFaceNamesAndLoadsBack) {
  GptConfig c;
  c.layers = kL;
  c.heads = kNH;
  c.channels = kC;
  c.vocab = kV;
  c.padded_vocab = kVp;
  c.max_seq_len = kT;
  nn::MoeOptions moe;
  moe.experts = 3;
  moe.top_k = 2;
  moe.every = 2;
  moe.hidden = 12;
  moe.capacity_factor = 1.25;
  GptParams params;
  uint64_t salt = 1;
  for (const GptParamSpec& spec : gpt_param_specs(c, moe))
    params[spec.name] = testing::random_tensor(spec.shape, salt++, -1.0f, 1.0f);
  params.at("wte.weight").narrow(0, kV, kVp - kV).zero_();  // padding rows: not in the file
  EXPECT_TRUE(params.count("blocks.0.mlp.experts.2.fc.weight"));
  EXPECT_FALSE(params.count("blocks.1.mlp.router.weight"));  // block 1 is dense
  save_gpt2_safetensors(path("moe.safetensors"), c, params, moe);

  SafetensorsFile f = read_safetensors(path("moe.safetensors"));
  EXPECT_EQ(f.tensors.at("h.0.mlp.router.weight").shape(), (Shape{3, kC}));
  EXPECT_EQ(f.tensors.at("h.0.mlp.experts.1.c_fc.weight").shape(), (Shape{kC, 12}));
  EXPECT_EQ(f.tensors.at("h.0.mlp.experts.1.c_fc.weight").to_vector<float>(),
            params.at("blocks.0.mlp.experts.1.fc.weight")
                .transpose(0, 1)
                .contiguous()
                .to_vector<float>());
  EXPECT_EQ(f.tensors.at("h.0.mlp.experts.1.c_proj.weight").shape(), (Shape{12, kC}));
  EXPECT_TRUE(f.tensors.count("h.1.mlp.c_fc.weight"));
  EXPECT_FALSE(f.tensors.count("h.0.mlp.c_fc.weight"));
  EXPECT_EQ(f.metadata.at("moe_top_k"), "2");
  EXPECT_EQ(f.metadata.at("moe_hidden"), "12");

  GptWeights back = load_gpt2_safetensors(path("moe.safetensors"));
  EXPECT_EQ(back.moe.experts, 3);
  EXPECT_EQ(back.moe.top_k, 2);
  EXPECT_EQ(back.moe.every, 2);
  EXPECT_EQ(back.moe.hidden, 12);
  EXPECT_EQ(back.moe.capacity_factor, 1.25);
  ASSERT_EQ(back.params.size(), params.size());
  for (const auto& [name, t] : params)
    EXPECT_EQ(back.params.at(name).to_vector<float>(), t.to_vector<float>()) << name;

  std::map<std::string, Tensor> tensors = f.tensors;
  std::map<std::string, std::string> meta = f.metadata;
  meta.erase("moe_top_k");
  write_safetensors(path("no_top_k.safetensors"), tensors, meta);
  expect_error([&] { load_gpt2_safetensors(path("no_top_k.safetensors")); },
               {"no_top_k.safetensors", "no moe_top_k metadata"});
  expect_error([&] { save_gpt_weights(path("moe.bin"), c, params, moe); },
               {"llm.c's format has no place for a mixture of experts"});
}

TEST_F(WeightsTest, HuggingFaceGpt2BadInput) {
  const std::string p = path("bad.safetensors");
  write_bytes(p, hf_gpt2_file());
  expect_error([&] { load_gpt2_safetensors(p); }, {p, "number of attention heads", "pass --heads"});
  expect_error([&] { load_gpt2_safetensors(p, 3); }, {p, "3 heads do not divide the 8 channels"});

  auto build = [&](const std::string& drop, const HandTensor* add, const std::string& meta) {
    std::vector<HandTensor> tensors;
    for (const HfEntry& e : hf_entries())
      if (e.name != drop)
        tensors.push_back({e.name, "F32", e.shape, f32_bytes(hf_values(e.k, e.shape))});
    if (add) tensors.push_back(*add);
    write_bytes(p, safetensors_bytes(tensors, meta));
  };
  build("h.1.mlp.c_fc.bias", nullptr, "");
  expect_error([&] { load_gpt2_safetensors(p, kNH); }, {p, "tensor h.1.mlp.c_fc.bias is missing"});

  HandTensor stray{"h.0.attn.rotary", "F32", {1}, f32_bytes({0})};
  build("", &stray, "");
  expect_error([&] { load_gpt2_safetensors(p, kNH); }, {p, "unexpected tensor h.0.attn.rotary"});

  HandTensor wrong{"h.0.attn.c_attn.weight", "F32", {3 * kC, kC}, f32_bytes(hf_values(0, {24, 8}))};
  build("h.0.attn.c_attn.weight", &wrong, "");
  expect_error([&] { load_gpt2_safetensors(p, kNH); },
               {p, "h.0.attn.c_attn.weight has shape [24, 8], expected [8, 24]"});

  build("", nullptr, R"({"n_head":"4"})");
  EXPECT_EQ(load_gpt2_safetensors(p).config.heads, 4);
  expect_error([&] { load_gpt2_safetensors(p, kNH); }, {p, "records n_head 4 but 2 heads"});
  build("", nullptr, R"({"n_head":"2","n_embd":"16"})");
  expect_error([&] { load_gpt2_safetensors(p); },
               {p, "metadata n_embd is 16 but the tensors say 8"});

  HandTensor ints{"wte.weight", "I32", {kV, kC}, std::string(size_t(kV * kC * 4), '\0')};
  build("wte.weight", &ints, "");
  expect_error([&] { load_gpt2_safetensors(p, kNH); }, {p, "wte.weight is i32"});

  HandTensor dup{"transformer.ln_f.bias", "F32", {kC}, f32_bytes(std::vector<float>(kC, 0))};
  build("", &dup, "");
  expect_error([&] { load_gpt2_safetensors(p, kNH); }, {p, "ln_f.bias appears both"});
}

TEST_F(WeightsTest, HalfPrecisionHuggingFaceFileLoadsAsF32) {
  // Small integers are exact in bf16, so the f32 result can be compared exactly.
  std::vector<HandTensor> tensors;
  for (const HfEntry& e : hf_entries()) {
    std::vector<float> v(size_t(shape_numel(e.shape)));
    for (size_t j = 0; j < v.size(); ++j) v[j] = float((e.k * 7 + int64_t(j)) % 200 - 100);
    Tensor bf = Tensor::from_vector(v, e.shape).to(DType::kBF16);
    tensors.push_back({e.name, "BF16", e.shape,
                       std::string(static_cast<const char*>(bf.data_ptr()), bf.nbytes())});
  }
  write_bytes(path("bf16.safetensors"), safetensors_bytes(tensors));
  GptWeights w = load_gpt2_safetensors(path("bf16.safetensors"), kNH);
  EXPECT_EQ(w.params.at("wpe.weight").dtype(), DType::kF32);
  EXPECT_EQ(w.params.at("wpe.weight").to_vector<float>()[5], float((1 * 7 + 5) % 200 - 100));
  // c_fc.weight of layer 0 is the 11th tensor (k = 10); loom [o, in] = hf [in, o].
  EXPECT_EQ(w.params.at("blocks.0.mlp.fc.weight").to_vector<float>()[3 * 8 + 2],
            float((10 * 7 + 2 * 32 + 3) % 200 - 100));
}

// ---------------------------------------------------------------- conversion, one entry point

TEST_F(WeightsTest, LlmcToSafetensorsAndBackPreservesEveryParameter) {
  write_bytes(path("tiny.bin"), tiny_llmc_file());
  GptWeights w = load_gpt_weights(path("tiny.bin"));
  save_gpt_weights(path("tiny.safetensors"), w.config, w.params);
  GptWeights s = load_gpt_weights(path("tiny.safetensors"));  // heads from metadata
  EXPECT_EQ(s.config.str(), w.config.str());                  // padded vocab 16 kept
  expect_tiny_llmc_params(s);
  save_gpt_weights(path("back.bin"), s.config, s.params);
  EXPECT_EQ(read_bytes(path("back.bin")), tiny_llmc_file());
}

TEST_F(WeightsTest, HuggingFaceToLlmcAndBackPreservesEveryParameter) {
  write_bytes(path("hf.safetensors"), hf_gpt2_file());
  GptWeights hf = load_gpt_weights(path("hf.safetensors"), kNH);
  save_gpt_weights(path("hf.bin"), hf.config, hf.params);
  GptWeights llmc = load_gpt_weights(path("hf.bin"), kNH);
  EXPECT_EQ(llmc.config.str(), hf.config.str());
  for (const auto& [name, t] : hf.params)
    EXPECT_EQ(llmc.params.at(name).to_vector<float>(), t.to_vector<float>()) << name;
}

// NaN or infinite weights are refused on load, naming the tensor and the first element, unless
// asked for; a finite file is unaffected.
TEST_F(WeightsTest, NonFiniteWeightsAreRefusedUnlessAllowed) {
  write_bytes(path("tiny.bin"), tiny_llmc_file());
  GptWeights w = load_gpt_weights(path("tiny.bin"));
  std::vector<float> v = w.params.at("ln_f.weight").to_vector<float>();
  v[1] = std::nanf("");
  v[3] = INFINITY;
  w.params["ln_f.weight"] = Tensor::from_vector<float>(v, w.params.at("ln_f.weight").shape());
  for (const char* name : {"nan.bin", "nan.safetensors"}) {
    save_gpt_weights(path(name), w.config, w.params);
    expect_error(
        [&] { load_gpt_weights(path(name), kNH); },
        {name, "tensor ln_f.weight holds 2 NaN or infinite value(s), the first at element 1"});
    const GptWeights allowed = load_gpt_weights(path(name), kNH, /*allow_nonfinite=*/true);
    EXPECT_TRUE(std::isnan(allowed.params.at("ln_f.weight").to_vector<float>()[1]));
  }
}

TEST_F(WeightsTest, LoadPicksTheFormatByContentSavePicksByExtension) {
  // Safetensors content under a .bin name still loads as safetensors.
  write_bytes(path("really_safetensors.bin"), hf_gpt2_file());
  EXPECT_EQ(load_gpt_weights(path("really_safetensors.bin"), kNH).config.layers, kL);

  write_token_file(path("tokens.bin"), {1, 2, 3});
  expect_error([&] { load_gpt_weights(path("tokens.bin")); },
               {"tokens.bin", "is an llm.c token file", "not model weights"});
  write_bytes(path("junk.pt"), "PK\x03\x04 this is a zip");
  expect_error([&] { load_gpt_weights(path("junk.pt")); },
               {"junk.pt", "neither an llm.c model file", "nor a safetensors file"});
  expect_error([&] { load_gpt_weights(path("absent.bin")); }, {"cannot open", "absent.bin"});

  write_bytes(path("tiny.bin"), tiny_llmc_file());
  expect_error([&] { load_gpt_weights(path("tiny.bin"), 4); },
               {"tiny.bin", "has 2 heads but 4 were asked for"});
  GptWeights w = load_gpt_weights(path("tiny.bin"), kNH);
  expect_error([&] { save_gpt_weights(path("model.pt"), w.config, w.params); },
               {"model.pt", "extension is '.pt'", "expected .bin (llm.c) or .safetensors"});
  save_gpt_weights(path("UPPER.SAFETENSORS"), w.config, w.params);
  EXPECT_EQ(load_gpt_weights(path("UPPER.SAFETENSORS")).config.str(), w.config.str());
}

}  // namespace
}  // namespace loom::io
