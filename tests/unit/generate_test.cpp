// GPT generation (core/nn/generate.h): the KV cache's logits against the full forward, greedy
// generation against recomputing the whole window each step (nanoGPT's loop, the cut past
// max_seq_len included), the sampling rule against its closed-form probabilities, seeds, bad
// input, and the CUDA run against the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/nn/nn.h"
#include "core/ops.h"
#include "core/rng.h"
#include "testing/device_buffer.h"
#include "testing/files.h"

namespace loom {
namespace {

using nn::GenerateOptions;
using nn::GPT;
using testing::expect_error;

GptConfig small_config() {
  GptConfig c;
  c.layers = 2;
  c.channels = 16;
  c.heads = 2;
  c.max_seq_len = 12;
  c.vocab = 11;
  c.padded_vocab = 16;
  return c;
}

// GPT-2 init gives nearly uniform logits; uniform weights in [-0.5, 0.5] give peaked ones, so the
// argmax is well separated and every layer matters.
std::unique_ptr<GPT> random_gpt(uint64_t seed) {
  auto gpt = std::make_unique<GPT>(small_config());
  for (auto& [name, t] : gpt->named_parameters()) {
    Tensor p = t;
    rng::fill_uniform(p, seed, name, -0.5, 0.5);
  }
  gpt->eval();
  return gpt;
}

Tensor prompt_tokens() {  // [2, 5]
  return Tensor::from_vector(std::vector<int64_t>{1, 4, 7, 2, 9, 3, 3, 0, 10, 5}, {2, 5});
}

float max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to(DType::kF32).to_vector<float>();
  const std::vector<float> y = b.to(DType::kF32).to_vector<float>();
  EXPECT_EQ(x.size(), y.size());
  float m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

// nanoGPT's loop without a cache: the whole window (the last max_seq_len tokens) through
// forward for every new token, argmax of the last position over the real vocabulary.
std::vector<int64_t> greedy_by_recomputing(GPT& gpt, std::vector<int64_t> seq, int64_t rows,
                                           int64_t new_tokens) {
  NoGradGuard no_grad;
  const GptConfig& c = gpt.config();
  int64_t length = int64_t(seq.size()) / rows;
  for (int64_t s = 0; s < new_tokens; ++s) {
    const int64_t n = std::min(length, c.max_seq_len);
    std::vector<int64_t> window(size_t(rows * n));
    for (int64_t b = 0; b < rows; ++b)
      std::copy_n(seq.begin() + b * length + (length - n), n, window.begin() + b * n);
    const std::vector<float> logits =
        gpt.forward(Tensor::from_vector(window, {rows, n})).to_vector<float>();
    std::vector<int64_t> next_seq;
    for (int64_t b = 0; b < rows; ++b) {
      const float* last = logits.data() + (b * n + n - 1) * c.padded_vocab;
      next_seq.insert(next_seq.end(), seq.begin() + b * length, seq.begin() + (b + 1) * length);
      next_seq.push_back(int64_t(std::max_element(last, last + c.vocab) - last));
    }
    seq = std::move(next_seq);
    ++length;
  }
  return seq;
}

// ---------------------------------------------------------------- the cache

TEST(KvCache, LogitsEqualTheFullForward) {
  auto gpt = random_gpt(5);
  NoGradGuard no_grad;
  const Tensor prompt = prompt_tokens();
  nn::KvCache cache = gpt->make_kv_cache();
  // The prompt on an empty cache is forward's own computation.
  const Tensor first = gpt->forward_cached(prompt, cache);
  EXPECT_EQ(max_abs_diff(first, gpt->forward(prompt)), 0.0f);
  EXPECT_EQ(cache.length(), 5);
  // Then one position at a time, and a chunk of three (the offset causal mask), each against the
  // last positions of forward over the whole sequence.
  std::vector<int64_t> seq = prompt.to_vector<int64_t>();
  int64_t length = 5;
  auto extend = [&](const std::vector<int64_t>& add_row0, const std::vector<int64_t>& add_row1) {
    const int64_t n = int64_t(add_row0.size());
    std::vector<int64_t> next, added;
    for (int64_t b = 0; b < 2; ++b) {
      const auto& add = b == 0 ? add_row0 : add_row1;
      next.insert(next.end(), seq.begin() + b * length, seq.begin() + (b + 1) * length);
      next.insert(next.end(), add.begin(), add.end());
      added.insert(added.end(), add.begin(), add.end());
    }
    seq = next;
    length += n;
    const Tensor cached = gpt->forward_cached(Tensor::from_vector(added, {2, n}), cache);
    const Tensor full = gpt->forward(Tensor::from_vector(seq, {2, length}));
    const float diff = max_abs_diff(cached, narrow(full, 1, length - n, n));
    // Composed attention against the fused op: the same function, rounded differently.
    EXPECT_LT(diff, 2e-5f) << "after " << length << " positions";
  };
  extend({6}, {8});
  extend({0}, {1});
  extend({3, 10, 2}, {4, 4, 9});
  extend({7}, {2});
  EXPECT_EQ(cache.length(), 11);
  expect_error(
      [&] {
        gpt->forward_cached(Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 4}, {2, 2}), cache);
      },
      {"exceed max_seq_len 12"});
  nn::KvCache foreign(3, 12);
  expect_error([&] { gpt->forward_cached(prompt, foreign); }, {"was not made for this model"});
}

// ---------------------------------------------------------------- greedy generation

TEST(Generate, GreedyEqualsRecomputingTheWindowEveryStep) {
  auto gpt = random_gpt(7);
  GenerateOptions o;
  o.max_new_tokens = 15;  // 5 + 15 = 20 > max_seq_len 12: the window is cut 8 times
  o.temperature = 0;
  const Tensor prompt = prompt_tokens();
  const Tensor out = nn::generate(*gpt, prompt, o);
  ASSERT_EQ(out.shape(), (Shape{2, 20}));
  EXPECT_EQ(out.dtype(), DType::kI64);
  const std::vector<int64_t> want = greedy_by_recomputing(*gpt, prompt.to_vector<int64_t>(), 2, 15);
  EXPECT_EQ(out.to_vector<int64_t>(), want);
  // top_k 1 is greedy at any temperature; an i32 prompt gives i32 tokens.
  o.temperature = 1.7;
  o.top_k = 1;
  const Tensor k1 = nn::generate(*gpt, prompt.to(DType::kI32), o);
  EXPECT_EQ(k1.dtype(), DType::kI32);
  EXPECT_EQ(k1.to(DType::kI64).to_vector<int64_t>(), want);
  // No new tokens: the prompt itself.
  o.max_new_tokens = 0;
  EXPECT_EQ(nn::generate(*gpt, prompt, o).to_vector<int64_t>(), prompt.to_vector<int64_t>());
}

TEST(Generate, APromptLongerThanTheWindowIsCut) {
  auto gpt = random_gpt(9);
  std::vector<int64_t> long_prompt;
  for (int64_t i = 0; i < 15; ++i) long_prompt.push_back((i * 7) % 11);
  GenerateOptions o;
  o.max_new_tokens = 4;
  o.temperature = 0;
  const Tensor out = nn::generate(*gpt, Tensor::from_vector(long_prompt, {1, 15}), o);
  EXPECT_EQ(out.to_vector<int64_t>(), greedy_by_recomputing(*gpt, long_prompt, 1, 4));
}

// ---------------------------------------------------------------- sampling

// Draws u on a uniform grid of n points: the inverse CDF then picks each token (i + 0.5)/n-many
// times within one of n p_i, whatever the order of the grid, so counts are closed-form.
std::vector<int64_t> counts_on_grid(const std::vector<float>& logits, double temperature,
                                    int64_t top_k, int64_t n) {
  std::vector<int64_t> counts(logits.size(), 0);
  for (int64_t i = 0; i < n; ++i)
    ++counts[size_t(nn::sample_token(logits.data(), int64_t(logits.size()), temperature, top_k,
                                     (double(i) + 0.5) / double(n)))];
  return counts;
}

std::vector<double> softmax_of(const std::vector<float>& logits, double temperature) {
  std::vector<double> p;
  double total = 0;
  for (float v : logits) total += std::exp(double(float(double(v) / temperature)));
  for (float v : logits) p.push_back(std::exp(double(float(double(v) / temperature))) / total);
  return p;
}

TEST(SampleToken, DrawsFollowTheSoftmaxOfTheScaledLogits) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -inf, 3.0f, -1.0f};
  const int64_t n = 100000;
  for (double temperature : {0.7, 1.0, 2.5}) {
    SCOPED_TRACE(temperature);
    const std::vector<double> p = softmax_of(logits, temperature);
    const std::vector<int64_t> counts = counts_on_grid(logits, temperature, 0, n);
    for (size_t i = 0; i < logits.size(); ++i)
      EXPECT_LE(std::abs(double(counts[i]) - double(n) * p[i]), 1.0) << "token " << i;
    EXPECT_EQ(counts[3], 0) << "a -inf logit is never drawn";
  }
  // top_k 2 keeps tokens 4 and 1 with their renormalised probabilities.
  const std::vector<int64_t> top2 = counts_on_grid(logits, 1.0, 2, n);
  const double p4 = 1.0 / (1.0 + std::exp(2.0 - 3.0));
  EXPECT_LE(std::abs(double(top2[4]) - double(n) * p4), 1.0);
  EXPECT_EQ(top2[1] + top2[4], n);
  // top_k keeps every value equal to the k-th largest (nanoGPT's `logits < v[:, [-1]]`).
  const std::vector<float> tied = {0.0f, 1.0f, 1.0f, 1.0f, -2.0f};
  const std::vector<int64_t> tied2 = counts_on_grid(tied, 1.0, 2, 3000);
  EXPECT_EQ(tied2[0] + tied2[4], 0);
  for (int i : {1, 2, 3}) EXPECT_EQ(tied2[size_t(i)], 1000);
  // Temperature 0: the argmax, the first of equal largest.
  EXPECT_EQ(nn::sample_token(tied.data(), 5, 0.0, 0, 0.99), 1);
  const std::vector<float> dead = {-inf, -inf};
  expect_error([&] { nn::sample_token(dead.data(), 2, 1.0, 0, 0.5); },
               {"every logit of a row is -inf"});
}

TEST(Generate, ASeedGivesTheSameTokensAndAnotherSeedOthers) {
  auto gpt = random_gpt(11);
  GenerateOptions o;
  o.max_new_tokens = 30;
  o.temperature = 1.5;  // flatter than the model's logits: many tokens are likely
  o.seed = 3;
  const Tensor prompt = prompt_tokens();
  const std::vector<int64_t> a = nn::generate(*gpt, prompt, o).to_vector<int64_t>();
  EXPECT_EQ(nn::generate(*gpt, prompt, o).to_vector<int64_t>(), a);
  o.seed = 4;
  EXPECT_NE(nn::generate(*gpt, prompt, o).to_vector<int64_t>(), a);
  o.seed = 3;
  o.top_k = 3;
  const std::vector<int64_t> k3 = nn::generate(*gpt, prompt, o).to_vector<int64_t>();
  // Every token drawn under top_k 3 is among the 3 largest logits at its step (checked by
  // running the window again, as the greedy reference does).
  NoGradGuard no_grad;
  const GptConfig& c = gpt->config();
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t t = 5; t < 35; ++t) {
      const int64_t n = std::min<int64_t>(t, c.max_seq_len);
      std::vector<int64_t> window(k3.begin() + b * 35 + (t - n), k3.begin() + b * 35 + t);
      const std::vector<float> logits =
          gpt->forward(Tensor::from_vector(window, {1, n})).to_vector<float>();
      const float* last = logits.data() + (n - 1) * c.padded_vocab;
      const float chosen = last[k3[size_t(b * 35 + t)]];
      const int64_t larger =
          std::count_if(last, last + c.vocab, [&](float v) { return v > chosen; });
      EXPECT_LT(larger, 3) << "row " << b << " position " << t;
    }
  }
}

TEST(Generate, BadInputIsAClearError) {
  auto gpt = random_gpt(1);
  GenerateOptions o;
  o.max_new_tokens = 2;
  const Tensor prompt = prompt_tokens();
  expect_error(
      [&] {
        nn::generate(*gpt, Tensor::from_vector(std::vector<int64_t>{1, 2}, {2}), o);
      },
      {"idx must be token ids [B, T]"});
  expect_error(
      [&] {
        nn::generate(*gpt, Tensor::zeros({1, 0}, DType::kI64), o);
      },
      {"with B, T >= 1"});
  expect_error([&] { nn::generate(*gpt, Tensor::zeros({1, 2}), o); }, {"must be i32 or i64"});
  expect_error(
      [&] {
        nn::generate(*gpt, Tensor::full({1, 2}, 11, DType::kI64), o);
      },
      {"outside the vocabulary [0, 11)"});
  GenerateOptions bad = o;
  bad.max_new_tokens = -1;
  expect_error([&] { nn::generate(*gpt, prompt, bad); }, {"max_new_tokens must be >= 0"});
  bad = o;
  bad.temperature = -0.5;
  expect_error([&] { nn::generate(*gpt, prompt, bad); }, {"temperature must be finite and >= 0"});
  bad.temperature = std::nan("");
  expect_error([&] { nn::generate(*gpt, prompt, bad); }, {"temperature must be finite and >= 0"});
  bad = o;
  bad.top_k = 12;
  expect_error([&] { nn::generate(*gpt, prompt, bad); }, {"top_k must be in [0, 11]"});
  // A model whose output is not finite says so instead of drawing from garbage.
  Tensor w = gpt->ln_f->weight;
  w.fill_(std::nan(""));
  expect_error([&] { nn::generate(*gpt, prompt, o); }, {"the model's output is not finite"});
}

// ---------------------------------------------------------------- CUDA

TEST(GenerateCuda, GreedyTokensAndCachedLogitsMatchTheCpu) {
  LOOM_SKIP_WITHOUT_CUDA();
  auto cpu = random_gpt(13);
  auto gpu = random_gpt(13);
  gpu->to(Device::cuda(0));
  GenerateOptions o;
  o.max_new_tokens = 15;
  o.temperature = 0;
  const Tensor prompt = prompt_tokens();
  const Tensor on_gpu = nn::generate(*gpu, prompt.to(Device::cuda(0)), o);
  EXPECT_TRUE(on_gpu.device().is_cuda());
  EXPECT_EQ(on_gpu.to(Device::cpu()).to_vector<int64_t>(),
            nn::generate(*cpu, prompt, o).to_vector<int64_t>());
  // Sampled tokens: the same draws on both devices (counter-based), so the same tokens unless a
  // draw lands within rounding of a boundary between two tokens.
  o.temperature = 1.0;
  o.seed = 21;
  EXPECT_EQ(
      nn::generate(*gpu, prompt.to(Device::cuda(0)), o).to(Device::cpu()).to_vector<int64_t>(),
      nn::generate(*cpu, prompt, o).to_vector<int64_t>());
  NoGradGuard no_grad;
  nn::KvCache cc = cpu->make_kv_cache(), gc = gpu->make_kv_cache();
  cpu->forward_cached(prompt, cc);
  gpu->forward_cached(prompt.to(Device::cuda(0)), gc);
  const Tensor next = Tensor::from_vector(std::vector<int64_t>{4, 6}, {2, 1});
  EXPECT_LT(max_abs_diff(gpu->forward_cached(next.to(Device::cuda(0)), gc).to(Device::cpu()),
                         cpu->forward_cached(next, cc)),
            2e-5f);
}

}  // namespace
}  // namespace loom
