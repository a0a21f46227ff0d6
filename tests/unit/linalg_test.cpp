// matmul, linear, sum / mean and gelu on the CPU: values worked out by hand, a naive f64 reference
// for random odd-sized products, gradients against finite differences, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>

#include "core/ops.h"
#include "core/tensor.h"
#include "kernels/cuda/runtime.h"
#include "testing/gradcheck.h"

namespace loom {
namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

Tensor t(const std::vector<float>& v, const Shape& s) { return Tensor::from_vector(v, s); }
std::vector<float> values(const Tensor& x) { return x.to_vector<float>(); }

// A and B for the hand-worked product A B = [[58, 64], [139, 154]]:
//   58 = 1*7 + 2*9 + 3*11, 64 = 1*8 + 2*10 + 3*12, 139 = 4*7 + 5*9 + 6*11, 154 = 4*8 + 5*10 + 6*12.
const std::vector<float> kA = {1, 2, 3, 4, 5, 6};      // [2, 3]
const std::vector<float> kAt = {1, 4, 2, 5, 3, 6};     // A^T stored [3, 2]
const std::vector<float> kB = {7, 8, 9, 10, 11, 12};   // [3, 2]
const std::vector<float> kBt = {7, 9, 11, 8, 10, 12};  // B^T stored [2, 3]
const std::vector<float> kAB = {58, 64, 139, 154};     // [2, 2]

// ---------------------------------------------------------------- matmul values

TEST(Matmul, HandComputedProduct) {
  Tensor c = matmul(t(kA, {2, 3}), t(kB, {3, 2}));
  EXPECT_EQ(c.shape(), (Shape{2, 2}));
  EXPECT_EQ(values(c), kAB);
}

TEST(Matmul, EveryTransposeCombinationGivesTheSameProduct) {
  EXPECT_EQ(values(matmul(t(kA, {2, 3}), t(kB, {3, 2}), false, false)), kAB);
  EXPECT_EQ(values(matmul(t(kAt, {3, 2}), t(kB, {3, 2}), true, false)), kAB);
  EXPECT_EQ(values(matmul(t(kA, {2, 3}), t(kBt, {2, 3}), false, true)), kAB);
  EXPECT_EQ(values(matmul(t(kAt, {3, 2}), t(kBt, {2, 3}), true, true)), kAB);
}

TEST(Matmul, TransposedViewsAreUsedWithoutACopy) {
  // A^T stored [3, 2] and viewed back as A [2, 3]: the GEMM reads it with the flag flipped.
  Tensor a_view = t(kAt, {3, 2}).transpose(0, 1);
  Tensor b_view = t(kBt, {2, 3}).transpose(0, 1);
  ASSERT_FALSE(a_view.is_contiguous());
  Allocator& cpu = allocator_for(Device::cpu());
  const size_t before = cpu.live_bytes();
  cpu.reset_peak();
  Tensor c = matmul(a_view, b_view);
  // Only the [2, 2] result was allocated: no contiguous copy of either operand.
  EXPECT_EQ(cpu.peak_bytes(), before + 4 * sizeof(float));
  EXPECT_EQ(values(c), kAB);
  EXPECT_EQ(values(matmul(a_view, t(kB, {3, 2}).transpose(0, 1), false, true)), kAB);
  EXPECT_EQ(values(matmul(t(kA, {2, 3}).transpose(0, 1), b_view, true, false)), kAB);
}

TEST(Matmul, BatchedAWithSharedB) {
  // Entry 0 is A; entry 1 is [[1, 2, 0], [0, 1, 3]]: [1*7 + 2*9, 1*8 + 2*10] = [25, 28] and
  // [9 + 3*11, 10 + 3*12] = [42, 46].
  Tensor a = t({1, 2, 3, 4, 5, 6, 1, 2, 0, 0, 1, 3}, {2, 2, 3});
  const std::vector<float> expected = {58, 64, 139, 154, 25, 28, 42, 46};
  Tensor c = matmul(a, t(kB, {3, 2}));
  EXPECT_EQ(c.shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(values(c), expected);
  // The same with each entry of a stored transposed (the batched, not flattened, path).
  Tensor at = a.transpose(1, 2).contiguous();
  EXPECT_EQ(values(matmul(at, t(kB, {3, 2}), true, false)), expected);
  EXPECT_EQ(values(matmul(at, t(kBt, {2, 3}), true, true)), expected);
  EXPECT_EQ(values(matmul(a, t(kBt, {2, 3}), false, true)), expected);
}

TEST(Matmul, BatchedAAndB) {
  // Entry 1: [[1, 2, 0], [0, 1, 3]] x [[1, 0], [0, 1], [1, 1]] = [[1, 2], [3, 4]].
  Tensor a = t({1, 2, 3, 4, 5, 6, 1, 2, 0, 0, 1, 3}, {2, 2, 3});
  Tensor b = t({7, 8, 9, 10, 11, 12, 1, 0, 0, 1, 1, 1}, {2, 3, 2});
  const std::vector<float> expected = {58, 64, 139, 154, 1, 2, 3, 4};
  EXPECT_EQ(values(matmul(a, b)), expected);
  EXPECT_EQ(
      values(matmul(a.transpose(1, 2).contiguous(), b.transpose(1, 2).contiguous(), true, true)),
      expected);
}

// Row-major reference in f64 over logical (already transposed-away) operands.
std::vector<double> reference_matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  const std::vector<float> av = values(a), bv = values(b);
  const int64_t batch = a.numel() / (a.size(-1) * a.size(-2));
  const int64_t m = ta ? a.size(-1) : a.size(-2), k = ta ? a.size(-2) : a.size(-1);
  const int64_t n = tb ? b.size(-2) : b.size(-1);
  const bool shared = b.dim() == 2;
  std::vector<double> c(size_t(batch * m * n), 0.0);
  for (int64_t e = 0; e < batch; ++e)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0.0;
        for (int64_t p = 0; p < k; ++p) {
          const double x = av[size_t(e * m * k + (ta ? p * m + i : i * k + p))];
          const double y = bv[size_t((shared ? 0 : e * k * n) + (tb ? j * k + p : p * n + j))];
          acc += x * y;
        }
        c[size_t((e * m + i) * n + j)] = acc;
      }
  return c;
}

// f32 products of K terms in [-1, 1) differ from the f64 value by about sqrt(K) f32 roundings of
// terms up to 1; 1e-5 * K bounds that with room and is still far below any indexing mistake.
void expect_matches_reference(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  const std::vector<double> expected = reference_matmul(a, b, ta, tb);
  const std::vector<float> actual = values(matmul(a, b, ta, tb));
  ASSERT_EQ(actual.size(), expected.size());
  const double k = double(ta ? a.size(-2) : a.size(-1));
  int failures = 0;
  for (size_t i = 0; i < actual.size(); ++i)
    if (std::fabs(actual[i] - expected[i]) > 1e-5 * k && failures++ < 5)
      ADD_FAILURE() << "element " << i << ": " << actual[i] << " vs " << expected[i];
  EXPECT_EQ(failures, 0);
}

TEST(Matmul, OddSizesMatchAnF64Reference) {
  const int64_t m = 7, n = 33, k = 257;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "ta=" << ta << " tb=" << tb);
      Shape as = ta ? Shape{k, m} : Shape{m, k}, bs = tb ? Shape{n, k} : Shape{k, n};
      expect_matches_reference(testing::random_tensor(as, 1), testing::random_tensor(bs, 2), ta,
                               tb);
      // a with two leading dims, b shared and batched
      Shape as4 = {2, 3, as[0], as[1]};
      Shape bs4 = {2, 3, bs[0], bs[1]};
      expect_matches_reference(testing::random_tensor(as4, 3), testing::random_tensor(bs, 4), ta,
                               tb);
      expect_matches_reference(testing::random_tensor(as4, 5), testing::random_tensor(bs4, 6), ta,
                               tb);
    }
}

TEST(Matmul, EmptyInnerDimGivesZeros) {
  Tensor c = matmul(Tensor::empty({2, 0}), Tensor::empty({0, 3}));
  EXPECT_EQ(values(c), std::vector<float>(6, 0.0f));
}

// ---------------------------------------------------------------- linear values

// W = [[1, 0, 1], [0, 1, -1]], bias = [0.5, -1]: x W^T for x = A is
// [[1 + 3, 2 - 3], [4 + 6, 5 - 6]] = [[4, -1], [10, -1]].
const std::vector<float> kW = {1, 0, 1, 0, 1, -1};
const std::vector<float> kBias = {0.5f, -1};

TEST(Linear, HandComputedWithAndWithoutBias) {
  EXPECT_EQ(values(linear(t(kA, {2, 3}), t(kW, {2, 3}))), (std::vector<float>{4, -1, 10, -1}));
  Tensor y = linear(t(kA, {2, 3}), t(kW, {2, 3}), t(kBias, {2}));
  EXPECT_EQ(y.shape(), (Shape{2, 2}));
  EXPECT_EQ(values(y), (std::vector<float>{4.5f, -2, 10.5f, -2}));
}

TEST(Linear, LeadingDimsAreKept) {
  Tensor y = linear(t(kA, {2, 1, 3}), t(kW, {2, 3}), t(kBias, {2}));
  EXPECT_EQ(y.shape(), (Shape{2, 1, 2}));
  EXPECT_EQ(values(y), (std::vector<float>{4.5f, -2, 10.5f, -2}));
  Tensor v = linear(t({4, 5, 6}, {3}), t(kW, {2, 3}));  // a single vector
  EXPECT_EQ(v.shape(), (Shape{2}));
  EXPECT_EQ(values(v), (std::vector<float>{10, -1}));
}

TEST(Linear, NonContiguousInputIsHandled) {
  // x = A stored transposed, as a 2-D view (flag flip) and as a 3-D view (copied, then flattened).
  Tensor x2 = t(kAt, {3, 2}).transpose(0, 1);
  EXPECT_EQ(values(linear(x2, t(kW, {2, 3}), t(kBias, {2}))),
            (std::vector<float>{4.5f, -2, 10.5f, -2}));
  Tensor x3 = t(kAt, {3, 2, 1}).transpose(0, 2);  // [1, 2, 3]
  EXPECT_EQ(values(linear(x3, t(kW, {2, 3}), t(kBias, {2}))),
            (std::vector<float>{4.5f, -2, 10.5f, -2}));
}

// ---------------------------------------------------------------- sum / mean values

TEST(Reduce, SumAndMeanOfAllElements) {
  Tensor x = t(kA, {2, 3});
  Tensor s = sum(x), m = mean(x);
  EXPECT_EQ(s.shape(), Shape{});
  EXPECT_EQ(s.item(), 21.0);
  EXPECT_EQ(m.item(), 3.5);
}

TEST(Reduce, OverEachDimWithAndWithoutKeepdim) {
  Tensor x = t(kA, {2, 3});  // [[1, 2, 3], [4, 5, 6]]
  EXPECT_EQ(sum(x, 0).shape(), (Shape{3}));
  EXPECT_EQ(values(sum(x, 0)), (std::vector<float>{5, 7, 9}));
  EXPECT_EQ(values(sum(x, 1)), (std::vector<float>{6, 15}));
  EXPECT_EQ(values(sum(x, -1)), (std::vector<float>{6, 15}));
  EXPECT_EQ(sum(x, 0, true).shape(), (Shape{1, 3}));
  EXPECT_EQ(sum(x, 1, true).shape(), (Shape{2, 1}));
  EXPECT_EQ(values(sum(x, 1, true)), (std::vector<float>{6, 15}));
  EXPECT_EQ(values(mean(x, 0)), (std::vector<float>{2.5f, 3.5f, 4.5f}));
  EXPECT_EQ(values(mean(x, 1, true)), (std::vector<float>{2, 5}));
  EXPECT_EQ(mean(x, -2, true).shape(), (Shape{1, 3}));
}

TEST(Reduce, MiddleDimOfA3DTensor) {
  // x[o, r, i] = 12 o + 4 r + i; the sum over r < 3 is 36 o + 12 + 3 i.
  Tensor x = Tensor::arange(24).reshape({2, 3, 4});
  EXPECT_EQ(values(sum(x, 1)), (std::vector<float>{12, 15, 18, 21, 48, 51, 54, 57}));
  EXPECT_EQ(values(mean(x, 1, true)), (std::vector<float>{4, 5, 6, 7, 16, 17, 18, 19}));
  EXPECT_EQ(mean(x, 1, true).shape(), (Shape{2, 1, 4}));
  // a non-contiguous input: dims 0 and 2 swapped, then summed over the (now) last dim
  Tensor xt = x.transpose(0, 2);  // [4, 3, 2], xt[i, r, o] = x[o, r, i]
  EXPECT_EQ(values(sum(xt, 2)), values(sum(x, 0).transpose(0, 1).contiguous()));
}

TEST(Reduce, LongSumsKeepF32Accuracy) {
  // A million copies of 0.1f (= 0.100000001490116...): one-by-one f32 addition drifts to about
  // 100958; the true sum is 100000.00149.
  Tensor x = Tensor::full({1000000}, 0.1);
  EXPECT_NEAR(sum(x).item(), 100000.0015, 0.01);
  EXPECT_NEAR(sum(x.reshape({1000, 1000}), 0).to_vector<float>()[0], 100.0, 1e-4);
  EXPECT_NEAR(mean(x).item(), 0.1, 1e-8);
}

TEST(Reduce, EmptyReductions) {
  EXPECT_EQ(sum(Tensor::empty({0, 3})).item(), 0.0);
  EXPECT_TRUE(std::isnan(mean(Tensor::empty({0})).item()));  // 0 / 0, as in PyTorch
  EXPECT_EQ(values(sum(Tensor::empty({0, 3}), 0)), (std::vector<float>{0, 0, 0}));
}

// ---------------------------------------------------------------- gelu values

// f32 evaluates u = sqrt(2/pi) (x + 0.044715 x^3) with a few roundings of 6e-8 |u| each, and
// exp(-2u) turns an absolute error e in u into a relative error 2e; so 1e-6 for the rest of the
// arithmetic plus 5e-7 |u| (about four roundings) for that.
double gelu_rtol(double x) {
  return 1e-6 + 5e-7 * std::fabs(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x));
}

TEST(Gelu, KnownPoints) {
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) evaluated in f64.
  const std::vector<float> inputs = {0, 1, -1, 2, -3, 0.5f, -5};
  Tensor y = gelu(t(inputs, {7}));
  const std::vector<double> expected = {0.0,
                                        0.8411919906082768,
                                        -0.15880800939172324,
                                        1.954597694087775,
                                        -0.0036373920817729943,
                                        0.34571400982514394,
                                        -2.2917961972623857e-07};
  const std::vector<float> got = values(y);
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], expected[i], gelu_rtol(inputs[i]) * std::fabs(expected[i]))
        << "at element " << i;
}

TEST(Gelu, DenseSweepMatchesF64Formula) {
  // Forward and derivative on 16001 points of [-8, 8] against the formula in f64, with
  // 0.5 (1 + tanh(u)) evaluated as the identical 1 / (1 + exp(-2u)) because even in f64 the tanh
  // form cancels to 0 below x = -7. See gelu_rtol for the tolerance; the derivative crosses zero
  // near x = -0.75, where only an absolute bound means anything.
  const int64_t n = 16001;
  std::vector<float> xs(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) xs[size_t(i)] = -8.0f + 16.0f * float(i) / float(n - 1);
  Tensor x = t(xs, {n}).set_requires_grad(true);
  Tensor y = gelu(x);
  y.backward(Tensor::ones({n}));
  const std::vector<float> yv = values(y), dv = values(x.grad());
  int failures = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double v = xs[i], c = std::sqrt(2.0 / M_PI);
    const double u = c * (v + 0.044715 * v * v * v);
    const double s = 1.0 / (1.0 + std::exp(-2.0 * u));  // 0.5 (1 + tanh(u))
    const double want = v * s;
    // 0.5 (1 + tanh) + 0.5 x (1 - tanh^2) u', with 0.5 (1 - tanh^2) = 2 s (1 - s)
    const double dwant = s + 2.0 * v * s * (1.0 - s) * c * (1.0 + 3.0 * 0.044715 * v * v);
    if (std::fabs(yv[i] - want) > gelu_rtol(v) * std::fabs(want) && failures++ < 5)
      ADD_FAILURE() << "gelu(" << v << ") = " << yv[i] << ", expected " << want;
    if (std::fabs(dv[i] - dwant) > 1e-6 + gelu_rtol(v) * std::fabs(dwant) && failures++ < 5)
      ADD_FAILURE() << "gelu'(" << v << ") = " << dv[i] << ", expected " << dwant;
  }
  EXPECT_EQ(failures, 0);
}

TEST(Gelu, TailsSaturateWithoutNaN) {
  Tensor x = t({-100, -30, 30, 100}, {4}).set_requires_grad(true);
  Tensor y = gelu(x);
  y.backward(Tensor::ones({4}));
  EXPECT_EQ(values(y), (std::vector<float>{0, 0, 30, 100}));  // -0 == 0
  EXPECT_EQ(values(x.grad()), (std::vector<float>{0, 0, 1, 1}));
}

// ---------------------------------------------------------------- gradients

Tensor param(const Shape& s, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  return testing::random_tensor(s, seed, lo, hi).set_requires_grad(true);
}

TEST(MatmulGrad, EveryTransposeCombination) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "ta=" << ta << " tb=" << tb);
      Tensor a = param(ta ? Shape{4, 3} : Shape{3, 4}, 1);
      Tensor b = param(tb ? Shape{5, 4} : Shape{4, 5}, 2);
      testing::expect_gradients_match(
          [ta, tb](const std::vector<Tensor>& in) { return matmul(in[0], in[1], ta, tb); }, {a, b});
    }
}

TEST(MatmulGrad, BatchedAWithSharedBSumsBsGradient) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "ta=" << ta << " tb=" << tb);
      Tensor a = param(ta ? Shape{2, 3, 4, 3} : Shape{2, 3, 3, 4}, 3);
      Tensor b = param(tb ? Shape{5, 4} : Shape{4, 5}, 4);
      testing::expect_gradients_match(
          [ta, tb](const std::vector<Tensor>& in) { return matmul(in[0], in[1], ta, tb); }, {a, b});
    }
}

TEST(MatmulGrad, BatchedAAndB) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "ta=" << ta << " tb=" << tb);
      Tensor a = param(ta ? Shape{3, 4, 2} : Shape{3, 2, 4}, 5);
      Tensor b = param(tb ? Shape{3, 5, 4} : Shape{3, 4, 5}, 6);
      testing::expect_gradients_match(
          [ta, tb](const std::vector<Tensor>& in) { return matmul(in[0], in[1], ta, tb); }, {a, b});
    }
}

TEST(MatmulGrad, TransposedViewsAndOneSidedGradients) {
  // Operands reach the GEMM with flipped flags; their gradients must come back transposed.
  Tensor a = param({4, 3}, 7), b = param({5, 4}, 8);
  testing::expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        return matmul(in[0].transpose(0, 1), in[1].transpose(0, 1));
      },
      {a, b});
  Tensor fixed = testing::random_tensor({4, 5}, 9);  // only a's gradient is asked for
  testing::expect_gradients_match(
      [fixed](const std::vector<Tensor>& in) { return matmul(in[0], fixed, true, false); }, {a});
}

TEST(MatmulGrad, NonContiguousLeadingDimsAreCopied) {
  Tensor a = param({3, 2, 4}, 23), b = param({4, 5}, 24);
  testing::expect_gradients_match(
      [](const std::vector<Tensor>& in) { return matmul(in[0].transpose(0, 1), in[1]); }, {a, b});
}

TEST(LinearGrad, WithBiasAnd3DInput) {
  Tensor x = param({2, 3, 4}, 10), w = param({5, 4}, 11), bias = param({5}, 12);
  testing::expect_gradients_match(
      [](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); }, {x, w, bias});
}

TEST(LinearGrad, WithoutBiasAndWithATransposedWeightView) {
  Tensor x = param({3, 4}, 13), w = param({5, 4}, 14), wt = param({4, 5}, 15);
  testing::expect_gradients_match(
      [](const std::vector<Tensor>& in) { return linear(in[0], in[1]); }, {x, w});
  testing::expect_gradients_match(
      [](const std::vector<Tensor>& in) { return linear(in[0], in[1].transpose(0, 1)); }, {x, wt});
  Tensor xt = param({4, 3}, 25);  // x reaches the GEMM as a transposed operand
  testing::expect_gradients_match(
      [](const std::vector<Tensor>& in) { return linear(in[0].transpose(0, 1), in[1], in[2]); },
      {xt, w, param({5}, 26)});
}

TEST(ReduceGrad, AllElementsAndEachDim) {
  Tensor x = param({2, 3, 4}, 16);
  testing::expect_gradients_match([](const std::vector<Tensor>& in) { return sum(in[0]); }, {x});
  testing::expect_gradients_match([](const std::vector<Tensor>& in) { return mean(in[0]); }, {x});
  for (int64_t dim = -3; dim < 3; ++dim)
    for (bool keepdim : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "dim=" << dim << " keepdim=" << keepdim);
      testing::expect_gradients_match(
          [dim, keepdim](const std::vector<Tensor>& in) { return sum(in[0], dim, keepdim); }, {x});
      testing::expect_gradients_match(
          [dim, keepdim](const std::vector<Tensor>& in) { return mean(in[0], dim, keepdim); }, {x});
    }
}

// div: IEEE quotients (the same bits as a / b in C++), broadcasting either way round (a shorter
// dividend is spread to the divisor's shape first), and gradients against finite differences.
TEST(Div, QuotientsAndBroadcasting) {
  const std::vector<float> a = {1, -2, 3, 0, 7, -0.0f};
  const std::vector<float> b = {3, 7, -11};
  const Tensor q = div(t(a, {2, 3}), t(b, {3}));
  std::vector<float> want(6);
  for (size_t i = 0; i < 6; ++i) want[i] = a[i] / b[i % 3];
  EXPECT_EQ(values(q), want);
  const Tensor r = div(t(b, {3}), t(a, {2, 3}));  // the dividend is the short one
  for (size_t i = 0; i < 6; ++i) want[i] = b[i % 3] / a[i];
  const std::vector<float> got = values(r);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(std::memcmp(&got[i], &want[i], 4), 0) << i;  // +-inf
  EXPECT_EQ(r.shape(), (Shape{2, 3}));
}

TEST(DivGrad, MatchesFiniteDifferencesEitherWayRound) {
  // Divisors kept away from 0 (in [1, 2]): finite differences need a smooth quotient.
  Tensor x = param({3, 4}, 23), y = param({4}, 24, 1.0f, 2.0f), z = param({3, 4}, 25, 1.0f, 2.0f);
  auto f = [](const std::vector<Tensor>& in) { return div(in[0], in[1]); };
  testing::expect_gradients_match(f, {x, y});
  testing::expect_gradients_match(f, {y, z});
  testing::expect_gradients_match(f, {x, z});
}

TEST(GeluGrad, MatchesFiniteDifferences) {
  // [-4, 4) covers both tails and the minimum of gelu near x = -0.75.
  Tensor x = param({3, 41}, 17, -4.0f, 4.0f);
  testing::expect_gradients_match([](const std::vector<Tensor>& in) { return gelu(in[0]); }, {x});
}

TEST(Composite, MlpBlockGradients) {
  // linear -> gelu -> linear -> mean: the ops chained as in GPT's MLP.
  Tensor x = param({2, 3, 4}, 18), w1 = param({6, 4}, 19), b1 = param({6}, 20);
  Tensor w2 = param({4, 6}, 21), b2 = param({4}, 22);
  testing::expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        return mean(linear(gelu(linear(in[0], in[1], in[2])), in[3], in[4]), 1);
      },
      {x, w1, b1, w2, b2});
}

// ---------------------------------------------------------------- bad input

void expect_error(const std::function<void()>& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "expected loom::Error";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const std::string& needle : needles)
      EXPECT_NE(what.find(needle), std::string::npos) << "'" << needle << "' not in: " << what;
  }
}

TEST(LinalgErrors, MatmulInnerDims) {
  expect_error(
      [] {
        matmul(Tensor::zeros({2, 3}), Tensor::zeros({4, 5}));
      },
      {"matmul: inner dims differ: a is [2, 3] (K=3), b is [4, 5] (K=4)"});
  expect_error(
      [] {
        matmul(Tensor::zeros({2, 3}), Tensor::zeros({4, 3}), true, true);
      },
      {"matmul: inner dims differ", "(K=2)", "(K=3)"});
}

TEST(LinalgErrors, MatmulShapes) {
  expect_error([] { matmul(Tensor::zeros({3}), Tensor::zeros({3, 2})); }, {"matmul", "'a'", "[3]"});
  expect_error(
      [] {
        matmul(Tensor::zeros({2, 2, 3}), Tensor::zeros({3, 3, 2}));
      },
      {"matmul", "'b'", "[2, 2, 3]", "[3, 3, 2]"});
  expect_error([] { matmul(Tensor::zeros({2, 3}), Tensor::zeros({3})); }, {"matmul", "'b'"});
}

TEST(LinalgErrors, WrongDtype) {
  Tensor i32 = Tensor::zeros({2, 2}, DType::kI32);
  expect_error([&] { matmul(i32, Tensor::zeros({2, 2})); }, {"matmul", "'a'", "i32", "f32"});
  expect_error([&] { matmul(Tensor::zeros({2, 2}), i32); }, {"matmul", "'b'", "i32"});
  expect_error([&] { linear(Tensor::zeros({2, 2}), i32); }, {"linear", "'weight'", "i32"});
  expect_error(
      [&] {
        linear(Tensor::zeros({2, 2}), Tensor::zeros({2, 2}), i32.reshape({4}));
      },
      {"linear", "'bias'", "i32"});
  // sum of an integer tensor is an int64 count (core/ops/integer.cpp); mean is refused.
  EXPECT_EQ(sum(i32).dtype(), DType::kI64);
  expect_error([&] { mean(i32); }, {"mean", "'x'", "i32"});
  expect_error([&] { mean(i32, 0); }, {"mean", "'x'", "i32"});
  expect_error([] { gelu(Tensor::zeros({2}, DType::kI64)); }, {"gelu", "'x'", "i64"});
  // bf16 and f16 are computed in f32 (tests/unit/low_precision_test.cpp), but do not mix.
  expect_error([] { add(Tensor::zeros({2}, DType::kBF16), Tensor::zeros({2}, DType::kF16)); },
               {"add", "'a'", "bf16", "'b'", "f16"});
}

TEST(LinalgErrors, LinearShapes) {
  expect_error(
      [] {
        linear(Tensor::zeros({2, 3}), Tensor::zeros({4, 5}));
      },
      {"linear", "'x'", "3", "[4, 5]", "expects 5"});
  expect_error([] { linear(Tensor::zeros({2, 3}), Tensor::zeros({3})); }, {"linear", "'weight'"});
  expect_error(
      [] {
        linear(Tensor::zeros({2, 3}), Tensor::zeros({4, 3}), Tensor::zeros({3}));
      },
      {"linear", "'bias'", "[4]", "[3]"});
}

TEST(LinalgErrors, BadDim) {
  Tensor x = Tensor::zeros({2, 3});
  expect_error([&] { sum(x, 2); }, {"sum: dim 2 out of range"});
  expect_error([&] { mean(x, -3, true); }, {"mean: dim -3 out of range"});
}

TEST(LinalgErrors, MismatchedDevices) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: " << cuda_rt::no_gpu_reason();
  Tensor cpu = Tensor::zeros({2, 2});
  Tensor gpu = Tensor::zeros({2, 2}, DType::kF32, Device::cuda());
  expect_error([&] { matmul(cpu, gpu); }, {"matmul", "'a' is on cpu", "'b' is on cuda:0"});
  expect_error([&] { linear(gpu, cpu); }, {"linear", "'x' is on cuda:0", "'weight' is on cpu"});
  expect_error([&] { linear(gpu, gpu, Tensor::zeros({2})); }, {"linear", "'bias' is on cpu"});
}

}  // namespace
}  // namespace loom
