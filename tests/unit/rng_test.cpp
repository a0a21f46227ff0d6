// Counter-based init (core/rng.h): Philox known answers, slices equal the slice of the whole,
// names and seeds give independent streams, and the normal/uniform statistics are right.
#include <gtest/gtest.h>

#include <cmath>

#include "core/ops.h"
#include "core/rng.h"
#include "kernels/cpu/philox.h"

namespace loom {
namespace {

// Random123's known-answer vectors for Philox4x32-10 (kat_vectors), through our argument
// mapping: philox4x32(counter_lo, counter_hi, key) packs c0 = lo32(counter_lo),
// c1 = hi32(counter_lo), c2 = lo32(counter_hi), c3 = hi32(counter_hi), k0 = lo32(key),
// k1 = hi32(key).
TEST(Philox, MatchesRandom123KnownAnswers) {
  struct Kat {
    uint32_t ctr[4], key[2], out[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      // Digits of pi.
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) {
    const uint64_t lo = uint64_t(k.ctr[0]) | (uint64_t(k.ctr[1]) << 32);
    const uint64_t hi = uint64_t(k.ctr[2]) | (uint64_t(k.ctr[3]) << 32);
    const uint64_t key = uint64_t(k.key[0]) | (uint64_t(k.key[1]) << 32);
    philox::Block b = philox::philox4x32(lo, hi, key);
    for (int j = 0; j < 4; ++j) EXPECT_EQ(b.v[j], k.out[j]) << "word " << j;
    // element_block(key, stream, index) is philox4x32(index, stream, key).
    philox::Block e = philox::element_block(key, hi, lo);
    for (int j = 0; j < 4; ++j) EXPECT_EQ(e.v[j], k.out[j]) << "word " << j;
  }
}

// Pins the values loom produces for a named parameter, so a change to the mapping from
// (seed, name, index) to numbers (which would silently change every model's init) is caught.
TEST(Rng, ValuesAreAPureFunctionOfSeedNameAndIndex) {
  Tensor t = Tensor::empty({5});
  rng::fill_normal(t, 1234, "blocks.0.attn.qkv.weight", 0.0, 1.0);
  std::vector<float> v = t.to_vector<float>();
  const uint64_t stream = philox::hash_name("blocks.0.attn.qkv.weight");
  EXPECT_EQ(stream, rng::stream_of("blocks.0.attn.qkv.weight"));
  for (int i = 0; i < 5; ++i) {
    philox::Block b = philox::element_block(1234, stream, uint64_t(i));
    EXPECT_EQ(v[size_t(i)], 0.0f + 1.0f * philox::normal(b.v[0], b.v[1])) << "element " << i;
  }
  // FNV-1a 64 of "a" (the published test value), so the name -> stream mapping is pinned too.
  EXPECT_EQ(philox::hash_name("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(philox::hash_name(""), 0xcbf29ce484222325ull);
}

TEST(Rng, SliceAlongEachDimEqualsSliceOfWhole) {
  const Shape full{4, 6, 5};
  for (bool normal : {true, false}) {
    Tensor whole = Tensor::empty(full);
    if (normal)
      rng::fill_normal(whole, 7, "w", 0.1, 0.02);
    else
      rng::fill_uniform(whole, 7, "w", -0.5, 0.5);
    for (int64_t dim = 0; dim < 3; ++dim) {
      // Two shards covering the dim unevenly, and a one-wide slice in the middle.
      const int64_t n = full[size_t(dim)];
      const std::vector<std::pair<int64_t, int64_t>> ranges = {
          {0, n / 2}, {n / 2, n - n / 2}, {1, 1}};
      for (auto [start, len] : ranges) {
        Shape s = full;
        s[size_t(dim)] = len;
        Tensor part = Tensor::empty(s);
        rng::Slice slice{full, dim, start};
        if (normal)
          rng::fill_normal(part, slice, 7, "w", 0.1, 0.02);
        else
          rng::fill_uniform(part, slice, 7, "w", -0.5, 0.5);
        EXPECT_EQ(part.to_vector<float>(), whole.narrow(dim, start, len).to_vector<float>())
            << "dim " << dim << " start " << start << " len " << len;
      }
    }
  }
}

TEST(Rng, FillsNonContiguousAndLowPrecisionTensors) {
  Tensor whole = Tensor::empty({3, 4});
  rng::fill_normal(whole, 3, "p", 0.0, 1.0);
  // A transposed destination receives the same values in the tensor's own logical order.
  Tensor base = Tensor::empty({4, 3});
  Tensor t = base.transpose(0, 1);
  rng::fill_normal(t, 3, "p", 0.0, 1.0);
  EXPECT_EQ(t.to_vector<float>(), whole.to_vector<float>());
  // bf16: the f32 values rounded.
  Tensor b = Tensor::empty({3, 4}, DType::kBF16);
  rng::fill_normal(b, 3, "p", 0.0, 1.0);
  EXPECT_EQ(b.to(DType::kF32).to_vector<float>(),
            whole.to(DType::kBF16).to(DType::kF32).to_vector<float>());
}

TEST(Rng, DifferentNamesAndSeedsDiffer) {
  Tensor a = Tensor::empty({1000}), b = Tensor::empty({1000}), c = Tensor::empty({1000});
  rng::fill_normal(a, 1, "x.weight", 0.0, 1.0);
  rng::fill_normal(b, 1, "y.weight", 0.0, 1.0);
  rng::fill_normal(c, 2, "x.weight", 0.0, 1.0);
  std::vector<float> va = a.to_vector<float>(), vb = b.to_vector<float>(),
                     vc = c.to_vector<float>();
  int same_ab = 0, same_ac = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    same_ab += va[i] == vb[i];
    same_ac += va[i] == vc[i];
  }
  EXPECT_EQ(same_ab, 0);
  EXPECT_EQ(same_ac, 0);
}

TEST(Rng, NormalAndUniformStatistics) {
  const int64_t n = 100000;
  Tensor t = Tensor::empty({n});
  rng::fill_normal(t, 42, "stats", 0.0, 1.0);
  std::vector<float> v = t.to_vector<float>();
  double s = 0, s2 = 0;
  for (float x : v) s += x, s2 += double(x) * x;
  double mean = s / n, std = std::sqrt(s2 / n - mean * mean);
  // Standard errors at n = 1e5: 0.0032 for the mean, 0.0022 for the std; the bounds are ~3 and
  // ~9 of those.
  EXPECT_LT(std::fabs(mean), 0.01);
  EXPECT_LT(std::fabs(std - 1.0), 0.02);

  rng::fill_normal(t, 42, "stats2", 3.0, 0.02);
  v = t.to_vector<float>();
  s = s2 = 0;
  for (float x : v) s += x, s2 += double(x) * x;
  mean = s / n;
  std = std::sqrt(s2 / n - mean * mean);
  EXPECT_LT(std::fabs(mean - 3.0), 0.01 * 0.02 * 3);  // 3 standard errors of the mean
  EXPECT_LT(std::fabs(std / 0.02 - 1.0), 0.02);

  rng::fill_uniform(t, 42, "stats3", -1.0, 3.0);
  v = t.to_vector<float>();
  s = 0;
  float lo = 1e9f, hi = -1e9f;
  for (float x : v) s += x, lo = std::min(lo, x), hi = std::max(hi, x);
  EXPECT_GE(lo, -1.0f);
  EXPECT_LT(hi, 3.0f);
  EXPECT_LT(std::fabs(s / n - 1.0), 0.02);  // std of the mean: 4/sqrt(12 n) = 0.0037
}

TEST(Rng, BadSliceIsAClearError) {
  Tensor t = Tensor::empty({2, 3});
  try {
    rng::fill_normal(t, rng::Slice{{4, 3}, 0, 3}, 1, "w", 0.0, 1.0);
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a slice of 2 from 3 is outside dim 0 of size 4"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(rng::fill_normal(t, rng::Slice{{2, 4}, 0, 0}, 1, "w", 0.0, 1.0), Error);
  Tensor i = Tensor::empty({3}, DType::kI32);
  EXPECT_THROW(rng::fill_normal(i, 1, "w", 0.0, 1.0), Error);
}

}  // namespace
}  // namespace loom
