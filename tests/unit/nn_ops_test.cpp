// Neural-network ops on the CPU: softmax, layer_norm, scaled_dot_product_attention,
// cross_entropy, embedding, dropout. Each op gets hand-computed values, a reference or
// finite-difference check of every differentiable input, and its argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/ops.h"
#include "core/tensor.h"
#include "kernels/cpu/philox.h"
#include "testing/gradcheck.h"

namespace loom {
namespace {

using testing::expect_close;
using testing::expect_gradients_match;
using testing::random_tensor;

// Runs fn, which must throw loom::Error, and checks the message contains every fragment.
void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> fragments) {
  try {
    fn();
    ADD_FAILURE() << "expected loom::Error containing '" << *fragments.begin() << "'";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const std::string& f : fragments)
      EXPECT_NE(what.find(f), std::string::npos) << "'" << f << "' not in: " << what;
  }
}

Tensor leaf(const Shape& shape, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  return random_tensor(shape, seed, lo, hi).set_requires_grad(true);
}

// ---------------------------------------------------------------- softmax

TEST(Softmax, HandComputedValues) {
  const float ln2 = std::log(2.0f);
  // The second row would overflow exp without the max subtracted first. 1000 + ln2 rounds to a
  // float whose distance d from 1000 is not ln2 exactly, so its expected row uses d.
  const float big = 1000.0f + ln2;
  const double d = double(big) - 1000.0;
  Tensor x = Tensor::from_vector<float>({0.0f, ln2, 1000.0f, big}, {2, 2});
  const float lo = float(1 / (1 + std::exp(d))), hi = float(std::exp(d) / (1 + std::exp(d)));
  expect_close(softmax(x), Tensor::from_vector<float>({1 / 3.f, 2 / 3.f, lo, hi}, {2, 2}), 1e-6,
               1e-6);
}

TEST(Softmax, NonContiguousInputEqualsItsCopy) {
  Tensor x = random_tensor({4, 6}, 1, -3, 3).transpose(0, 1);
  expect_close(softmax(x), softmax(x.contiguous()), 0, 0);
}

TEST(Softmax, GradientMatchesFiniteDifferences) {
  expect_gradients_match([](const std::vector<Tensor>& in) { return softmax(in[0]); },
                         {leaf({3, 2, 5}, 2, -2, 2)});
}

TEST(Softmax, BadInputNamesTheOp) {
  expect_error([] { softmax(Tensor::zeros({2, 3}, DType::kI32)); }, {"softmax", "'x'", "f32"});
  expect_error([] { softmax(Tensor::scalar(1.0)); }, {"softmax", "at least 1 dim"});
  expect_error([] { softmax(Tensor()); }, {"softmax", "undefined"});
}

// ---------------------------------------------------------------- layer_norm

TEST(LayerNorm, HandComputedValues) {
  // mean 2, biased variance 2/3: (x - 2) / sqrt(2/3) = [-1.2247, 0, 1.2247].
  Tensor x = Tensor::from_vector<float>({1, 2, 3}, {1, 3});
  const float a = std::sqrt(1.5f);
  expect_close(layer_norm(x, Tensor(), Tensor(), 0.0),
               Tensor::from_vector<float>({-a, 0, a}, {1, 3}), 1e-6, 1e-6);
  Tensor w = Tensor::from_vector<float>({2, 3, 4}, {3});
  Tensor b = Tensor::from_vector<float>({0.5f, -1, 1}, {3});
  expect_close(layer_norm(x, w, b, 0.0),
               Tensor::from_vector<float>({-2 * a + 0.5f, -1, 4 * a + 1}, {1, 3}), 1e-6, 1e-6);
  // weight only and bias only
  expect_close(layer_norm(x, w, Tensor(), 0.0),
               Tensor::from_vector<float>({-2 * a, 0, 4 * a}, {1, 3}), 1e-6, 1e-6);
  expect_close(layer_norm(x, Tensor(), b, 0.0),
               Tensor::from_vector<float>({-a + 0.5f, -1, a + 1}, {1, 3}), 1e-6, 1e-6);
}

TEST(LayerNorm, EpsEntersTheVariance) {
  // Constant rows have variance 0: the output is 0 / sqrt(eps) = 0, not NaN.
  Tensor x = Tensor::full({2, 4}, 3.0);
  expect_close(layer_norm(x, Tensor(), Tensor(), 1e-5), Tensor::zeros({2, 4}), 0, 0);
  Tensor y = Tensor::from_vector<float>({0, 2}, {1, 2});  // variance 1
  const float s = 1.0f / std::sqrt(1.0f + 0.25f);
  expect_close(layer_norm(y, Tensor(), Tensor(), 0.25), Tensor::from_vector<float>({-s, s}, {1, 2}),
               1e-6, 1e-6);
}

TEST(LayerNorm, GradientsMatchFiniteDifferences) {
  Tensor x = leaf({2, 3, 6}, 3, -2, 2), w = leaf({6}, 4, 0.5, 1.5), b = leaf({6}, 5);
  expect_gradients_match(
      [](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2], 1e-5); },
      {x, w, b});
  // Without affine parameters, and with only one of them needing a gradient.
  expect_gradients_match(
      [](const std::vector<Tensor>& in) { return layer_norm(in[0], Tensor(), Tensor(), 1e-5); },
      {leaf({4, 5}, 6, -2, 2)});
  Tensor frozen_x = random_tensor({3, 5}, 7, -2, 2);
  expect_gradients_match(
      [&](const std::vector<Tensor>& in) { return layer_norm(frozen_x, in[0], Tensor(), 1e-5); },
      {leaf({5}, 8)});
}

TEST(LayerNorm, ParameterGradientsSumOverManyRows) {
  // 70 rows spans several of the kernel's row chunks; compare with a double-precision sum.
  const int64_t rows = 70, cols = 8;
  Tensor x = random_tensor({rows, cols}, 9, -2, 2), g = random_tensor({rows, cols}, 10);
  Tensor w = leaf({cols}, 11, 0.5, 1.5), b = leaf({cols}, 12);
  layer_norm(x, w, b, 1e-5).backward(g);
  std::vector<float> xv = x.to_vector<float>(), gv = g.to_vector<float>();
  std::vector<float> dw(cols), db(cols);
  std::vector<double> acc_w(cols, 0.0), acc_b(cols, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < cols; ++c) mean += xv[r * cols + c];
    mean /= cols;
    for (int64_t c = 0; c < cols; ++c) var += std::pow(xv[r * cols + c] - mean, 2);
    const double rstd = 1.0 / std::sqrt(var / cols + 1e-5);
    for (int64_t c = 0; c < cols; ++c) {
      acc_w[c] += gv[r * cols + c] * (xv[r * cols + c] - mean) * rstd;
      acc_b[c] += gv[r * cols + c];
    }
  }
  for (int64_t c = 0; c < cols; ++c) dw[c] = float(acc_w[c]), db[c] = float(acc_b[c]);
  expect_close(w.grad(), Tensor::from_vector(dw, {cols}), 1e-5, 1e-5);
  expect_close(b.grad(), Tensor::from_vector(db, {cols}), 1e-5, 1e-5);
}

TEST(LayerNorm, BadInputNamesTheOp) {
  Tensor x = Tensor::zeros({2, 4});
  expect_error([&] { layer_norm(x, Tensor::ones({3}), Tensor()); },
               {"layer_norm", "'weight'", "[4]", "[3]"});
  expect_error([&] { layer_norm(x, Tensor(), Tensor::zeros({4}, DType::kI32)); },
               {"layer_norm", "'bias'", "f32"});
  expect_error([&] { layer_norm(x.to(DType::kF16), Tensor::ones({4}, DType::kBF16), Tensor()); },
               {"layer_norm", "'x'", "f16", "'weight'", "bf16"});
  expect_error([&] { layer_norm(x, Tensor(), Tensor(), -1.0); }, {"layer_norm", "eps"});
}

// ---------------------------------------------------------------- attention

// softmax(q k^T / sqrt(D)) v by explicit loops in double.
Tensor naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  const int64_t bh = q.size(0) * q.size(1), t = q.size(2), d = q.size(3);
  std::vector<float> qv = q.to_vector<float>(), kv = k.to_vector<float>(),
                     vv = v.to_vector<float>(), out(qv.size());
  for (int64_t h = 0; h < bh; ++h) {
    const int64_t base = h * t * d;
    for (int64_t i = 0; i < t; ++i) {
      const int64_t keys = causal ? i + 1 : t;
      std::vector<double> s(static_cast<size_t>(keys));
      double m = -INFINITY, sum = 0;
      for (int64_t j = 0; j < keys; ++j) {
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += double(qv[base + i * d + c]) * kv[base + j * d + c];
        s[j] = dot / std::sqrt(double(d));
        m = std::max(m, s[j]);
      }
      for (int64_t j = 0; j < keys; ++j) sum += (s[j] = std::exp(s[j] - m));
      for (int64_t c = 0; c < d; ++c) {
        double o = 0;
        for (int64_t j = 0; j < keys; ++j) o += s[j] / sum * vv[base + j * d + c];
        out[base + i * d + c] = float(o);
      }
    }
  }
  return Tensor::from_vector(out, q.shape());
}

TEST(Attention, ResultsDoNotDependOnWhatWasAllocatedBefore) {
  // See Note [Aligned scratch] (kernels/cpu/aligned_buffer.h): the kernels' scratch rows were
  // std::vectors, so Eigen's row reductions split at a heap-dependent point and the last bits
  // of the output changed with the allocation history. Forward and backward must be bitwise
  // equal whatever sits on the heap.
  const Tensor q = random_tensor({2, 4, 33, 16}, 40), k = random_tensor({2, 4, 33, 16}, 41);
  const Tensor v = random_tensor({2, 4, 33, 16}, 42), g = random_tensor({2, 4, 33, 16}, 43);
  std::vector<std::vector<float>> results;
  std::vector<std::vector<char>> heap;
  for (int trial = 0; trial < 8; ++trial) {
    heap.emplace_back(size_t(8 + 24 * trial));  // shifts where the next malloc lands
    Tensor qq = q.clone().set_requires_grad(true), kk = k.clone().set_requires_grad(true);
    Tensor vv = v.clone().set_requires_grad(true);
    Tensor y = scaled_dot_product_attention(qq, kk, vv, true);
    sum(mul(y, g)).backward();
    std::vector<float> r = y.detach().to_vector<float>();
    for (const Tensor& t : {qq.grad(), kk.grad(), vv.grad()}) {
      const std::vector<float> part = t.to_vector<float>();
      r.insert(r.end(), part.begin(), part.end());
    }
    results.push_back(std::move(r));
  }
  for (size_t t = 1; t < results.size(); ++t) EXPECT_EQ(results[t], results[0]) << "trial " << t;
}

TEST(Attention, SingleTokenReturnsV) {
  Tensor q = random_tensor({2, 3, 1, 4}, 20), k = random_tensor({2, 3, 1, 4}, 21);
  Tensor v = random_tensor({2, 3, 1, 4}, 22);
  expect_close(scaled_dot_product_attention(q, k, v, true), v, 0, 1e-6);
  expect_close(scaled_dot_product_attention(q, k, v, false), v, 0, 1e-6);
}

TEST(Attention, CausalFirstPositionReturnsFirstValue) {
  Tensor q = random_tensor({2, 2, 5, 3}, 23, -3, 3), k = random_tensor({2, 2, 5, 3}, 24, -3, 3);
  Tensor v = random_tensor({2, 2, 5, 3}, 25);
  Tensor out = scaled_dot_product_attention(q, k, v, true);
  expect_close(out.narrow(2, 0, 1), v.narrow(2, 0, 1), 0, 1e-6);
}

TEST(Attention, MatchesNaiveReference) {
  // T = 77 spans several query blocks, the last one partial; D = 8.
  for (bool causal : {true, false}) {
    for (int64_t t : {1, 5, 32, 77}) {
      SCOPED_TRACE("causal " + std::to_string(causal) + " T " + std::to_string(t));
      Tensor q = random_tensor({2, 3, t, 8}, 26, -2, 2), k = random_tensor({2, 3, t, 8}, 27, -2, 2);
      Tensor v = random_tensor({2, 3, t, 8}, 28);
      expect_close(scaled_dot_product_attention(q, k, v, causal), naive_attention(q, k, v, causal),
                   1e-5, 1e-5);
    }
  }
}

TEST(Attention, NonContiguousInputsEqualTheirCopies) {
  // q, k, v as a transpose of [B, T, H, D], as a model produces them from one projection.
  Tensor q = random_tensor({2, 6, 3, 4}, 29).transpose(1, 2);
  Tensor k = random_tensor({2, 6, 3, 4}, 30).transpose(1, 2);
  Tensor v = random_tensor({2, 6, 3, 4}, 31).transpose(1, 2);
  expect_close(scaled_dot_product_attention(q, k, v),
               naive_attention(q.contiguous(), k.contiguous(), v.contiguous(), true), 1e-5, 1e-5);
}

TEST(Attention, GradientsMatchFiniteDifferences) {
  for (bool causal : {true, false}) {
    SCOPED_TRACE("causal " + std::to_string(causal));
    expect_gradients_match(
        [causal](const std::vector<Tensor>& in) {
          return scaled_dot_product_attention(in[0], in[1], in[2], causal);
        },
        {leaf({2, 2, 5, 4}, 32, -2, 2), leaf({2, 2, 5, 4}, 33, -2, 2), leaf({2, 2, 5, 4}, 34)});
  }
  // Several query blocks, the last partial, so the blocked backward's accumulation into dK and
  // dV across blocks is exercised.
  expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        return scaled_dot_product_attention(in[0], in[1], in[2], true);
      },
      {leaf({1, 1, 70, 2}, 35, -2, 2), leaf({1, 1, 70, 2}, 36, -2, 2), leaf({1, 1, 70, 2}, 37)});
}

TEST(Attention, BadInputNamesTheOp) {
  Tensor q = Tensor::zeros({1, 2, 3, 4});
  expect_error(
      [&] {
        scaled_dot_product_attention(Tensor::zeros({2, 3, 4}), q, q);
      },
      {"scaled_dot_product_attention", "'q'", "4-D", "[2, 3, 4]"});
  expect_error(
      [&] {
        scaled_dot_product_attention(q, Tensor::zeros({1, 2, 5, 4}), q);
      },
      {"scaled_dot_product_attention", "'k'", "[1, 2, 5, 4]", "[1, 2, 3, 4]"});
  expect_error(
      [&] {
        scaled_dot_product_attention(q, q, Tensor::zeros({1, 2, 3, 4}, DType::kI64));
      },
      {"scaled_dot_product_attention", "'v'", "f32"});
}

// ---------------------------------------------------------------- cross_entropy

// Mean over non-ignored rows of lse - x[target] over the first `classes` columns, in double.
double naive_cross_entropy(const Tensor& logits, const std::vector<int64_t>& targets,
                           int64_t classes, int64_t ignore_index = -100) {
  const int64_t cols = logits.size(1);
  std::vector<float> x = logits.to_vector<float>();
  double total = 0;
  int64_t count = 0;
  for (size_t r = 0; r < targets.size(); ++r) {
    if (targets[r] == ignore_index) continue;
    double m = -INFINITY, sum = 0;
    for (int64_t c = 0; c < classes; ++c) m = std::max(m, double(x[r * cols + c]));
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(double(x[r * cols + c]) - m);
    total += m + std::log(sum) - x[r * cols + targets[r]];
    ++count;
  }
  return count ? total / count : 0.0;
}

TEST(CrossEntropy, UniformLogitsGiveLogV) {
  for (int64_t v : {2, 7, 50257}) {
    Tensor logits = Tensor::full({3, v}, 0.25);
    Tensor t32 = Tensor::from_vector<int32_t>({0, 1, int32_t(v - 1)}, {3});
    Tensor t64 = Tensor::from_vector<int64_t>({1, 0, v - 1}, {3});
    EXPECT_EQ(cross_entropy(logits, t32).shape(), Shape{});
    EXPECT_NEAR(cross_entropy(logits, t32).item(), std::log(double(v)), 1e-6 * std::log(double(v)));
    EXPECT_NEAR(cross_entropy(logits, t64).item(), std::log(double(v)), 1e-6 * std::log(double(v)));
  }
}

TEST(CrossEntropy, HandComputedValue) {
  // softmax([0, ln2]) = [1/3, 2/3]: target 1 costs -ln(2/3), target 0 costs ln 3.
  Tensor logits = Tensor::from_vector<float>({0, std::log(2.0f), 0, std::log(2.0f)}, {2, 2});
  Tensor t = Tensor::from_vector<int64_t>({1, 0}, {2});
  EXPECT_NEAR(cross_entropy(logits, t).item(), (-std::log(2.0 / 3) + std::log(3.0)) / 2, 1e-6);
}

TEST(CrossEntropy, MatchesDoubleReferenceOnGptSizedLogits) {
  // GPT-2's vocabulary; logits of the spread a trained model produces.
  const int64_t rows = 48, v = 50257;
  Tensor logits = random_tensor({rows, v}, 40, -8, 8);
  std::vector<int64_t> targets(rows);
  for (int64_t r = 0; r < rows; ++r) targets[r] = (r * 7919) % v;
  const double expected = naive_cross_entropy(logits, targets, v);
  const double actual = cross_entropy(logits, Tensor::from_vector(targets, {rows})).item();
  EXPECT_NEAR(actual, expected, 1e-6 * expected);
}

TEST(CrossEntropy, GradientMatchesFiniteDifferences) {
  Tensor t = Tensor::from_vector<int32_t>({3, 0, -100, 6, 2}, {5});
  expect_gradients_match([&](const std::vector<Tensor>& in) { return cross_entropy(in[0], t); },
                         {leaf({5, 7}, 41, -2, 2)});
  CrossEntropyOptions padded;
  padded.num_classes = 7;
  expect_gradients_match(
      [&](const std::vector<Tensor>& in) { return cross_entropy(in[0], t, padded); },
      {leaf({5, 9}, 42, -2, 2)});
}

TEST(CrossEntropy, GradientIsSoftmaxMinusOneHotOverCount) {
  Tensor logits =
      Tensor::from_vector<float>({0, std::log(2.0f), 5, 5}, {2, 2}).set_requires_grad(true);
  Tensor t = Tensor::from_vector<int64_t>({1, -100}, {2});
  cross_entropy(logits, t).backward(Tensor::scalar(3.0));
  // One counted row: 3 * ([1/3, 2/3] - [0, 1]); the ignored row gets nothing.
  expect_close(logits.grad(), Tensor::from_vector<float>({1, -1, 0, 0}, {2, 2}), 1e-6, 1e-6);
}

TEST(CrossEntropy, PaddedVocabularyEqualsUnpadded) {
  const int64_t rows = 6, v = 10, padded_v = 16;
  Tensor base = random_tensor({rows, v}, 43, -3, 3);
  // Large filler in the pad columns: it would dominate the softmax if it were counted.
  Tensor filler = random_tensor({rows, padded_v - v}, 44, 20, 30);
  Tensor padded = cat({base, filler}, 1).detach().set_requires_grad(true);
  Tensor unpadded = base.detach().clone().set_requires_grad(true);
  Tensor t = Tensor::from_vector<int64_t>({0, 9, 3, -100, 5, 9}, {rows});
  CrossEntropyOptions options;
  options.num_classes = v;
  Tensor lp = cross_entropy(padded, t, options), lu = cross_entropy(unpadded, t);
  // The same arithmetic on the same columns: bit-for-bit equal.
  EXPECT_EQ(lp.item(), lu.item());
  lp.backward();
  lu.backward();
  expect_close(padded.grad().narrow(1, 0, v), unpadded.grad(), 0, 0);
  expect_close(padded.grad().narrow(1, v, padded_v - v), Tensor::zeros({rows, padded_v - v}), 0, 0);
}

TEST(CrossEntropy, IgnoredRowsCountForNothing) {
  Tensor logits = random_tensor({5, 4}, 45, -2, 2);
  Tensor t = Tensor::from_vector<int32_t>({1, 7, 3, 7, 0}, {5});
  CrossEntropyOptions options;
  options.ignore_index = 7;
  EXPECT_NEAR(cross_entropy(logits, t, options).item(),
              naive_cross_entropy(logits, {1, 7, 3, 7, 0}, 4, 7), 1e-6);
  // Equal to the loss over the kept rows alone.
  Tensor kept = cat({logits.narrow(0, 0, 1), logits.narrow(0, 2, 1), logits.narrow(0, 4, 1)}, 0);
  EXPECT_NEAR(cross_entropy(logits, t, options).item(),
              cross_entropy(kept, Tensor::from_vector<int32_t>({1, 3, 0}, {3})).item(), 1e-6);
}

TEST(CrossEntropy, AllRowsIgnoredGivesZeroLossAndZeroGradient) {
  Tensor logits = leaf({3, 4}, 46);
  Tensor t = Tensor::from_vector<int64_t>({-100, -100, -100}, {3});
  Tensor loss = cross_entropy(logits, t);
  EXPECT_EQ(loss.item(), 0.0);
  loss.backward();
  expect_close(logits.grad(), Tensor::zeros({3, 4}), 0, 0);
}

TEST(CrossEntropy, BadInputNamesTheOp) {
  Tensor logits = Tensor::zeros({3, 5});
  expect_error(
      [&] {
        cross_entropy(logits, Tensor::from_vector<int64_t>({0, 5, 1}, {3}));
      },
      {"cross_entropy", "target 5", "row 1", "[0, 5)"});
  expect_error(
      [&] {
        cross_entropy(logits, Tensor::from_vector<int32_t>({0, 1, -1}, {3}));
      },
      {"cross_entropy", "target -1", "row 2"});
  CrossEntropyOptions padded;
  padded.num_classes = 4;
  expect_error(
      [&] {
        cross_entropy(logits, Tensor::from_vector<int64_t>({4, 0, 1}, {3}), padded);
      },
      {"cross_entropy", "target 4", "row 0", "[0, 4)"});
  padded.num_classes = 6;
  expect_error(
      [&] {
        cross_entropy(logits, Tensor::from_vector<int64_t>({0, 0, 1}, {3}), padded);
      },
      {"cross_entropy", "num_classes 6"});
  expect_error([&] { cross_entropy(logits, Tensor::zeros({3})); },
               {"cross_entropy", "'targets'", "i32 or i64"});
  expect_error(
      [&] {
        cross_entropy(logits, Tensor::from_vector<int64_t>({0, 1}, {2}));
      },
      {"cross_entropy", "'targets'", "[3]", "[2]"});
  expect_error([&] { cross_entropy(Tensor::zeros({3}), Tensor::from_vector<int64_t>({0}, {1})); },
               {"cross_entropy", "'logits'", "2-D"});
}

// ---------------------------------------------------------------- embedding

TEST(Embedding, PicksRows) {
  Tensor w = Tensor::from_vector<float>({0, 1, 10, 11, 20, 21, 30, 31}, {4, 2});
  Tensor idx = Tensor::from_vector<int64_t>({3, 0, 3, 1, 2, 2}, {2, 3});
  Tensor out = embedding(w, idx);
  EXPECT_EQ(out.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(out.to_vector<float>(),
            (std::vector<float>{30, 31, 0, 1, 30, 31, 10, 11, 20, 21, 20, 21}));
  Tensor idx32 = Tensor::from_vector<int32_t>({2}, {1});
  EXPECT_EQ(embedding(w, idx32).to_vector<float>(), (std::vector<float>{20, 21}));
}

TEST(Embedding, BackwardScatterAddsRepeatedIndices) {
  Tensor w = Tensor::zeros({5, 2}).set_requires_grad(true);
  Tensor idx = Tensor::from_vector<int32_t>({1, 3, 1, 1}, {4});
  Tensor g = Tensor::from_vector<float>({1, 2, 10, 20, 100, 200, 1000, 2000}, {4, 2});
  embedding(w, idx).backward(g);
  EXPECT_EQ(w.grad().to_vector<float>(),
            (std::vector<float>{0, 0, 1101, 2202, 0, 0, 10, 20, 0, 0}));
}

TEST(Embedding, GradientMatchesFiniteDifferences) {
  Tensor idx = Tensor::from_vector<int64_t>({2, 0, 2, 5, 1, 2}, {3, 2});
  expect_gradients_match([&](const std::vector<Tensor>& in) { return embedding(in[0], idx); },
                         {leaf({6, 3}, 50)});
}

TEST(Embedding, BadInputNamesTheOp) {
  Tensor w = Tensor::zeros({4, 3});
  expect_error(
      [&] {
        embedding(w, Tensor::from_vector<int64_t>({0, 1, 2, 4}, {2, 2}));
      },
      {"embedding", "index 4", "position [1, 1]", "[0, 4)"});
  expect_error([&] { embedding(w, Tensor::from_vector<int32_t>({-1}, {1})); },
               {"embedding", "index -1", "position [0]"});
  expect_error([&] { embedding(w, Tensor::zeros({2})); }, {"embedding", "'indices'", "i32 or i64"});
  expect_error([&] { embedding(Tensor::zeros({4}), Tensor::from_vector<int64_t>({0}, {1})); },
               {"embedding", "'weight'", "2-D"});
}

// ---------------------------------------------------------------- index_add_rows

TEST(IndexAddRows, AddsRowsAtIndicesRepeatedOnesSummedFirst) {
  Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor idx = Tensor::from_vector<int64_t>({2, 0, 2}, {3});
  Tensor src = Tensor::from_vector<float>({10, 20, 100, 200, 1000, 2000}, {3, 2});
  // Row 2 receives 10 + 1000 and row 0 100; row 1 is x's.
  EXPECT_EQ(index_add_rows(x, idx, src).to_vector<float>(),
            (std::vector<float>{101, 202, 3, 4, 1015, 2026}));
  // indices of any shape: src is indices' shape plus x's width.
  Tensor idx2 = Tensor::from_vector<int32_t>({1, 1, 0, 2}, {2, 2});
  Tensor src2 = Tensor::from_vector<float>({1, 1, 2, 2, 3, 3, 4, 4}, {2, 2, 2});
  EXPECT_EQ(index_add_rows(Tensor::zeros({3, 2}), idx2, src2).to_vector<float>(),
            (std::vector<float>{3, 3, 3, 3, 4, 4}));
}

TEST(IndexAddRows, GradientsAreTheGradientAndItsRows) {
  Tensor x = Tensor::zeros({4, 2}).set_requires_grad(true);
  Tensor src = Tensor::zeros({3, 2}).set_requires_grad(true);
  Tensor idx = Tensor::from_vector<int64_t>({3, 1, 3}, {3});
  Tensor g = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2});
  index_add_rows(x, idx, src).backward(g);
  EXPECT_EQ(x.grad().to_vector<float>(), g.to_vector<float>());
  EXPECT_EQ(src.grad().to_vector<float>(), (std::vector<float>{7, 8, 3, 4, 7, 8}));
  Tensor idx2 = Tensor::from_vector<int64_t>({2, 0, 2, 5, 1, 2}, {3, 2});
  expect_gradients_match(
      [&](const std::vector<Tensor>& in) { return index_add_rows(in[0], idx2, in[1]); },
      {leaf({6, 3}, 51), leaf({3, 2, 3}, 52)});
}

TEST(IndexAddRows, BadInputNamesTheOp) {
  Tensor x = Tensor::zeros({4, 3});
  expect_error(
      [&] {
        index_add_rows(x, Tensor::from_vector<int64_t>({0, 4}, {2}), Tensor::zeros({2, 3}));
      },
      {"index_add_rows", "index 4", "position [1]", "[0, 4)", "x has 4 rows"});
  expect_error(
      [&] {
        index_add_rows(x, Tensor::from_vector<int64_t>({0, 1}, {2}), Tensor::zeros({2, 4}));
      },
      {"index_add_rows", "src is [2, 4]", "need [2, 3]"});
  expect_error(
      [&] {
        index_add_rows(x, Tensor::zeros({2}), Tensor::zeros({2, 3}));
      },
      {"index_add_rows", "'indices'", "i32 or i64"});
}

// ---------------------------------------------------------------- put_

TEST(Put, WritesPlacesOfAViewInAnyDtype) {
  Tensor x = Tensor::from_vector<float>({0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor col = x.narrow(1, 1, 2);  // [[1, 2], [4, 5]], not contiguous
  put_(col, Tensor::from_vector<int64_t>({3, 0}, {2}), Tensor::from_vector<float>({-5, -1}, {2}));
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{0, -1, 2, 3, 4, -5}));
  Tensor ids = Tensor::from_vector<int64_t>({1, 2, 3}, {3});
  put_(ids, Tensor::from_vector<int64_t>({1}, {1}),
       Tensor::full({1}, 1099511627777.0, DType::kI64));
  EXPECT_EQ(ids.to_vector<int64_t>(), (std::vector<int64_t>{1, 1099511627777LL, 3}));
}

TEST(Put, RefusesRepeatsAndStrayPlacesWritingNothing) {
  Tensor x = Tensor::zeros({4});
  expect_error(
      [&] {
        put_(x, Tensor::from_vector<int64_t>({1, 1}, {2}), Tensor::ones({2}));
      },
      {"put_", "place 1", "written twice"});
  expect_error([&] { put_(x, Tensor::from_vector<int64_t>({4}, {1}), Tensor::ones({1})); },
               {"put_", "position 4", "[0, 4)"});
  expect_error([&] { put_(x, Tensor::from_vector<int64_t>({0}, {1}), Tensor::ones({2})); },
               {"put_", "2 values for 1 positions"});
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{0, 0, 0, 0}));
  Tensor w = Tensor::zeros({2}).set_requires_grad(true);
  expect_error([&] { put_(w, Tensor::from_vector<int64_t>({0}, {1}), Tensor::ones({1})); },
               {"put_", "requires grad"});
}

// ---------------------------------------------------------------- dropout

TEST(Dropout, SameKeySameMaskOtherOffsetOtherMask) {
  Tensor x = Tensor::ones({1000});
  DropoutKey key{1234, 5, 0};
  std::vector<float> a = dropout(x, 0.5, true, key).to_vector<float>();
  EXPECT_EQ(dropout(x, 0.5, true, key).to_vector<float>(), a);
  DropoutKey shifted = key;
  shifted.offset = 1000;
  EXPECT_NE(dropout(x, 0.5, true, shifted).to_vector<float>(), a);
  DropoutKey other_stream = key;
  other_stream.stream = 6;
  EXPECT_NE(dropout(x, 0.5, true, other_stream).to_vector<float>(), a);
}

TEST(Dropout, MaskIsTheCounterFormulaAndSlicesCompose) {
  const int64_t n = 300;
  const double p = 0.3;
  Tensor x = random_tensor({n}, 60, 1, 2);  // nonzero, so a zero output means dropped
  DropoutKey key{99, 7, 1000};
  std::vector<float> xv = x.to_vector<float>(), y = dropout(x, p, true, key).to_vector<float>();
  const float scale = 1.0f / (1.0f - float(p));
  for (int64_t i = 0; i < n; ++i) {
    const bool keep =
        philox::uniform01(philox::element_block(99, 7, 1000 + uint64_t(i)).v[0]) >= float(p);
    EXPECT_EQ(y[i], keep ? xv[i] * scale : 0.0f) << "element " << i;
  }
  // The tail of x with the offset advanced gets the tail of the mask: a shard's mask is the
  // slice of the whole tensor's.
  DropoutKey tail_key{99, 7, 1000 + 100};
  std::vector<float> tail =
      dropout(x.narrow(0, 100, n - 100), p, true, tail_key).to_vector<float>();
  EXPECT_EQ(tail, std::vector<float>(y.begin() + 100, y.end()));
}

// A part of a tensor along any dim (a tp rank's heads, an sp rank's positions) gets the mask of
// its place in the whole, forward and backward.
TEST(Dropout, PartsTakeTheirPlaceInTheWholeMask) {
  Tensor x = random_tensor({2, 6, 3, 5}, 63, 1, 2);
  const DropoutKey whole_key{11, 3, 4096};
  Tensor whole = dropout(x, 0.5, true, whole_key);
  for (int64_t dim : {0, 1, 3}) {
    const int64_t parts = dim == 3 ? 5 : 2, len = x.size(dim) / parts;
    for (int64_t part = 0; part < parts; ++part) {
      DropoutKey key = whole_key;
      key.part_dim = dim;
      key.part = part;
      key.parts = parts;
      Tensor xp = x.narrow(dim, part * len, len).contiguous().set_requires_grad(true);
      Tensor y = dropout(xp, 0.5, true, key);
      EXPECT_EQ(y.to_vector<float>(), whole.narrow(dim, part * len, len).to_vector<float>())
          << "dim " << dim << " part " << part;
      y.backward(Tensor::ones(y.shape()));
      Tensor g = xp.grad();
      for (size_t i = 0; i < g.to_vector<float>().size(); ++i)
        EXPECT_EQ(g.to_vector<float>()[i] == 0.0f, y.to_vector<float>()[i] == 0.0f);
    }
  }
  DropoutKey bad = whole_key;
  bad.parts = 2;
  bad.part = 2;
  expect_error([&] { dropout(x, 0.5, true, bad); }, {"dropout", "part 2 of 2"});
}

// A batch part (a dp rank's or a micro-batch's rows) combined with a part along another dim
// (a tp rank's heads) gets the mask of its place in the whole.
TEST(Dropout, BatchPartsCombineWithPartsAlongAnotherDim) {
  Tensor x = random_tensor({4, 6, 3, 5}, 64, 1, 2);
  const DropoutKey whole_key{12, 5, 8192};
  Tensor whole = dropout(x, 0.5, true, whole_key);
  for (int64_t dim : {-1, 1, 3}) {  // -1: no other part
    const int64_t parts = dim == 3 ? 5 : dim == 1 ? 2 : 1;
    const int64_t len = dim < 0 ? 0 : x.size(dim) / parts;
    for (int64_t batch_part = 0; batch_part < 2; ++batch_part)
      for (int64_t part = 0; part < parts; ++part) {
        DropoutKey key = whole_key;
        key.batch_part = batch_part;
        key.batch_parts = 2;
        Tensor xp = x.narrow(0, batch_part * 2, 2);
        Tensor want = whole.narrow(0, batch_part * 2, 2);
        if (dim > 0) {
          key.part_dim = dim;
          key.part = part;
          key.parts = parts;
          xp = xp.narrow(dim, part * len, len);
          want = want.narrow(dim, part * len, len);
        }
        EXPECT_EQ(dropout(xp.contiguous(), 0.5, true, key).to_vector<float>(),
                  want.to_vector<float>())
            << "dim " << dim << " batch part " << batch_part << " part " << part;
      }
  }
  DropoutKey bad = whole_key;
  bad.batch_parts = 2;
  bad.batch_part = 2;
  expect_error([&] { dropout(x, 0.5, true, bad); }, {"dropout", "batch part 2 of 2"});
  bad.batch_part = 1;
  bad.parts = 2;
  bad.part_dim = 0;
  expect_error([&] { dropout(x, 0.5, true, bad); }, {"dropout", "batch part 1 of 2", "dim 0"});
}

TEST(Dropout, KeptFractionIsNearOneMinusP) {
  const int64_t n = 100000;
  for (double p : {0.1, 0.5, 0.9}) {
    std::vector<float> y = dropout(Tensor::ones({n}), p, true, {3, 0, 0}).to_vector<float>();
    int64_t kept = 0;
    for (float v : y) kept += v != 0.0f;
    EXPECT_NEAR(double(kept) / n, 1.0 - p, 0.01) << "p " << p;
  }
}

TEST(Dropout, IdentityWhenEvaluatingOrPIsZero) {
  Tensor x = random_tensor({4, 5}, 61);
  EXPECT_TRUE(dropout(x, 0.0, true, {1, 2, 3}).same_as(x));
  EXPECT_TRUE(dropout(x, 0.5, false, {1, 2, 3}).same_as(x));
}

TEST(Dropout, GradientAppliesTheSameMask) {
  DropoutKey key{5, 1, 17};
  expect_gradients_match(
      [&](const std::vector<Tensor>& in) { return dropout(in[0], 0.4, true, key); },
      {leaf({4, 6}, 62)});
  Tensor x = leaf({1000}, 63, 1, 2);
  Tensor y = dropout(x, 0.4, true, key);
  y.backward(Tensor::ones({1000}));
  std::vector<float> yv = y.to_vector<float>(), gv = x.grad().to_vector<float>();
  for (size_t i = 0; i < yv.size(); ++i)
    EXPECT_EQ(gv[i], yv[i] == 0.0f ? 0.0f : 1.0f / 0.6f) << "element " << i;
}

TEST(Dropout, BadInputNamesTheOp) {
  Tensor x = Tensor::ones({4});
  expect_error([&] { dropout(x, 1.0, true, {}); }, {"dropout", "[0, 1)", "1"});
  expect_error([&] { dropout(x, -0.1, true, {}); }, {"dropout", "[0, 1)", "-0.1"});
  expect_error([&] { dropout(Tensor::zeros({4}, DType::kI32), 0.5, true, {}); },
               {"dropout", "'x'", "f32"});
}

// ---------------------------------------------------------------- determinism

#ifdef _OPENMP
// fn() run with `threads` OpenMP threads.
template <typename F>
auto with_threads(int threads, F fn) {
  const int previous = omp_get_max_threads();
  omp_set_num_threads(threads);
  auto result = fn();
  omp_set_num_threads(previous);
  return result;
}

// Gradients that sum over rows (layer_norm's parameters, embedding's scatter-add) and the loss
// mean are promised bit-for-bit equal whatever the thread count. Sizes are above the kernels'
// thresholds for going parallel.
TEST(NnOpsDeterminism, ResultsDoNotDependOnTheThreadCount) {
  Tensor x = random_tensor({300, 128}, 70, -2, 2), g = random_tensor({300, 128}, 71);
  std::vector<int64_t> iv(300), tv(300);
  for (int64_t i = 0; i < 300; ++i) {
    iv[i] = (i * 37) % 40;  // 40 rows of 600, each named several times
    tv[i] = i % 7 == 0 ? -100 : (i * 11) % 128;
  }
  Tensor idx = Tensor::from_vector(iv, {300}), targets = Tensor::from_vector(tv, {300});
  auto run = [&] {
    Tensor xi = x.detach().clone().set_requires_grad(true);
    Tensor w = random_tensor({128}, 72).set_requires_grad(true);
    Tensor b = random_tensor({128}, 73).set_requires_grad(true);
    layer_norm(xi, w, b, 1e-5).backward(g);
    Tensor table = random_tensor({600, 128}, 74).set_requires_grad(true);
    embedding(table, idx).backward(g);
    Tensor logits = x.detach().clone().set_requires_grad(true);
    Tensor loss = cross_entropy(logits, targets);
    loss.backward();
    return std::vector<std::vector<float>>{
        xi.grad().to_vector<float>(), w.grad().to_vector<float>(),
        b.grad().to_vector<float>(),  table.grad().to_vector<float>(),
        {float(loss.item())},         logits.grad().to_vector<float>()};
  };
  const auto one = with_threads(1, run);
  for (int threads : {2, 3}) EXPECT_EQ(with_threads(threads, run), one) << threads << " threads";
}
#endif

}  // namespace
}  // namespace loom
