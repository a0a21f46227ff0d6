// The ops DLRM needs beside the embedding bags: relu, sigmoid, binary_cross_entropy_with_logits
// and dot_interaction. Each gets hand-computed values, a finite-difference check of its gradients,
// its argument errors, and the low-precision rule (Note [Low-precision compute]).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/ops.h"
#include "core/tensor.h"
#include "testing/files.h"
#include "testing/gradcheck.h"

namespace loom {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::expect_gradients_match;
using testing::random_tensor;

Tensor leaf(const Shape& shape, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  return random_tensor(shape, seed, lo, hi).set_requires_grad(true);
}

// Values with |x| in [0.2, 2): finite differences of relu are exact there (no kink within eps).
Tensor away_from_zero(const Shape& shape, uint64_t seed) {
  std::vector<float> v = random_tensor(shape, seed, 0.2f, 2.0f).to_vector<float>();
  for (size_t i = 0; i < v.size(); i += 2) v[i] = -v[i];
  return Tensor::from_vector(v, shape).set_requires_grad(true);
}

// op(x) for x in `dtype` equals op(x in f32) rounded to `dtype`, and so does the gradient.
void expect_low_precision_rule(const std::function<Tensor(const Tensor&)>& op, const Tensor& x32,
                               DType dtype) {
  Tensor ref = x32.to(dtype).to(DType::kF32).set_requires_grad(true);
  Tensor low = ref.detach().to(dtype).set_requires_grad(true);
  Tensor out_ref = op(ref), out = op(low);
  ASSERT_EQ(out.dtype(), dtype);
  EXPECT_EQ(out.to(DType::kF32).to_vector<float>(),
            out_ref.to(dtype).to(DType::kF32).to_vector<float>());
  Tensor g = random_tensor(out.shape(), 5).to(dtype);
  out_ref.backward(g.to(DType::kF32));
  out.backward(g);
  ASSERT_EQ(low.grad().dtype(), dtype);
  EXPECT_EQ(low.grad().to(DType::kF32).to_vector<float>(),
            ref.grad().to(dtype).to(DType::kF32).to_vector<float>());
}

// ---------------------------------------------------------------- relu

TEST(Relu, HandComputedValuesAndGradient) {
  Tensor x = Tensor::from_vector<float>({-2, -0.5f, 0, 0.5f, 3, -1e-30f}, {2, 3});
  x.set_requires_grad(true);
  Tensor y = relu(x);
  EXPECT_EQ(y.shape(), (Shape{2, 3}));
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{0, 0, 0, 0.5f, 3, 0}));
  y.backward(Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}));
  // gradient 0 at x == 0 (PyTorch's convention)
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{0, 0, 0, 4, 5, 0}));
}

TEST(Relu, GradientMatchesFiniteDifferences) {
  expect_gradients_match([](const std::vector<Tensor>& in) { return relu(in[0]); },
                         {away_from_zero({3, 7}, 1)});
}

TEST(Relu, NonContiguousInputEqualsItsCopy) {
  Tensor x = random_tensor({4, 6}, 2).transpose(0, 1);
  EXPECT_EQ(relu(x).to_vector<float>(), relu(x.contiguous()).to_vector<float>());
}

// ---------------------------------------------------------------- sigmoid

TEST(Sigmoid, HandComputedValues) {
  const float ln3 = std::log(3.0f);
  Tensor x = Tensor::from_vector<float>({0, ln3, -ln3, 100, -100, -20}, {6});
  std::vector<float> y = sigmoid(x).to_vector<float>();
  EXPECT_FLOAT_EQ(y[0], 0.5f);
  EXPECT_FLOAT_EQ(y[1], 0.75f);
  EXPECT_FLOAT_EQ(y[2], 0.25f);
  EXPECT_EQ(y[3], 1.0f);
  EXPECT_EQ(y[4], 0.0f);  // exp(100) overflows to inf: 1 / inf, no NaN
  // A small result keeps its relative precision (no 1 - (1 - p) cancellation).
  EXPECT_NEAR(y[5], 2.0611536e-9f, 2.0611536e-9f * 1e-6f);
}

TEST(Sigmoid, GradientIsYTimesOneMinusYAndMatchesFiniteDifferences) {
  Tensor x = Tensor::from_vector<float>({0, std::log(3.0f)}, {2}).set_requires_grad(true);
  sigmoid(x).backward(Tensor::ones({2}));
  expect_close(x.grad(), Tensor::from_vector<float>({0.25f, 0.1875f}, {2}), 1e-7, 1e-6);
  expect_gradients_match([](const std::vector<Tensor>& in) { return sigmoid(in[0]); },
                         {leaf({2, 3, 4}, 3, -4, 4)});
}

// ---------------------------------------------------------------- binary_cross_entropy_with_logits

// -(y log p + (1 - y) log(1 - p)) in double, averaged.
double naive_bce(const std::vector<float>& x, const std::vector<float>& y) {
  double total = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double p = 1.0 / (1.0 + std::exp(-double(x[i])));
    total += -(y[i] * std::log(p) + (1.0 - y[i]) * std::log1p(-p));
  }
  return total / double(x.size());
}

TEST(BinaryCrossEntropy, HandComputedValue) {
  // log 2 (p = 1/2, y = 1), log 4/3 twice (p = 3/4, y = 1 and p = 1/4, y = 0), and a soft target.
  const float ln3 = std::log(3.0f);
  const std::vector<float> x = {0, ln3, -ln3, 2}, y = {1, 1, 0, 0.25f};
  const double p = 1.0 / (1.0 + std::exp(-2.0));
  const double expected =
      (std::log(2.0) + 2 * std::log(4.0 / 3.0) - (0.25 * std::log(p) + 0.75 * std::log(1 - p))) / 4;
  Tensor loss =
      binary_cross_entropy_with_logits(Tensor::from_vector(x, {4}), Tensor::from_vector(y, {4}));
  EXPECT_EQ(loss.shape(), Shape{});
  EXPECT_EQ(loss.dtype(), DType::kF32);
  EXPECT_NEAR(loss.item(), expected, 1e-6);
}

TEST(BinaryCrossEntropy, MatchesDoubleReference) {
  Tensor x = random_tensor({64, 1}, 10, -6, 6), y = random_tensor({64, 1}, 11, 0, 1);
  EXPECT_NEAR(binary_cross_entropy_with_logits(x, y).item(),
              naive_bce(x.to_vector<float>(), y.to_vector<float>()), 1e-6);
}

TEST(BinaryCrossEntropy, StaysFiniteForLargeLogits) {
  // log(sigmoid(-100)) would be log(0) in f32; the stable form gives 100 exactly.
  Tensor x = Tensor::from_vector<float>({100, -100, 100, -100}, {4});
  Tensor y = Tensor::from_vector<float>({0, 1, 1, 0}, {4});
  EXPECT_NEAR(binary_cross_entropy_with_logits(x, y).item(), (100.0 + 100.0) / 4, 1e-9);
}

TEST(BinaryCrossEntropy, GradientIsSigmoidMinusTargetOverCount) {
  const float ln3 = std::log(3.0f);
  Tensor x = Tensor::from_vector<float>({0, ln3, -ln3, 50}, {2, 2}).set_requires_grad(true);
  Tensor y = Tensor::from_vector<float>({1, 0, 0.5f, 1}, {2, 2});
  binary_cross_entropy_with_logits(x, y).backward();
  expect_close(x.grad(), Tensor::from_vector<float>({-0.125f, 0.1875f, -0.0625f, 0}, {2, 2}), 1e-7,
               1e-6);
  // An upstream gradient scales it.
  x.zero_grad();
  scale(binary_cross_entropy_with_logits(x, y), 2.0).backward();
  expect_close(x.grad(), Tensor::from_vector<float>({-0.25f, 0.375f, -0.125f, 0}, {2, 2}), 1e-7,
               1e-6);
}

TEST(BinaryCrossEntropy, GradientsMatchFiniteDifferences) {
  expect_gradients_match(
      [](const std::vector<Tensor>& in) { return binary_cross_entropy_with_logits(in[0], in[1]); },
      {leaf({3, 5}, 12, -3, 3), leaf({3, 5}, 13, 0.1f, 0.9f)}, {1e-2, 1e-4, 1e-2});
  // Targets that need no gradient get none.
  Tensor x = leaf({4}, 14), y = random_tensor({4}, 15, 0, 1);
  binary_cross_entropy_with_logits(x, y).backward();
  EXPECT_TRUE(x.grad().defined());
  EXPECT_FALSE(y.grad().defined());
}

TEST(BinaryCrossEntropy, NoElementsGivesZeroLossAndGradient) {
  Tensor x = Tensor::zeros({0, 1}).set_requires_grad(true);
  Tensor loss = binary_cross_entropy_with_logits(x, Tensor::zeros({0, 1}));
  EXPECT_EQ(loss.item(), 0.0);
  loss.backward();
  EXPECT_EQ(x.grad().shape(), (Shape{0, 1}));
}

TEST(BinaryCrossEntropy, BadInputNamesTheOp) {
  const std::string op = "binary_cross_entropy_with_logits";
  Tensor x = Tensor::zeros({4, 1});
  expect_error([&] { binary_cross_entropy_with_logits(x, Tensor::zeros({4})); },
               {op, "'targets'", "[4, 1]", "[4]"});
  expect_error(
      [&] {
        binary_cross_entropy_with_logits(x, Tensor::from_vector<float>({0, 1, 1.5f, 0}, {4, 1}));
      },
      {op, "'targets'", "[0, 1]", "1.5", "index 2"});
  expect_error(
      [&] {
        binary_cross_entropy_with_logits(x, Tensor::from_vector<float>({0, -1, 1, 0}, {4, 1}));
      },
      {op, "'targets'", "-1", "index 1"});
  expect_error(
      [&] {
        binary_cross_entropy_with_logits(x, Tensor::zeros({4, 1}, DType::kI64));
      },
      {op, "'targets'", "i64"});
  expect_error(
      [&] {
        binary_cross_entropy_with_logits(Tensor::zeros({4, 1}, DType::kI32), x);
      },
      {op, "'logits'", "i32"});
  expect_error([&] { binary_cross_entropy_with_logits(Tensor(), x); },
               {op, "'logits'", "undefined"});
  expect_error(
      [&] {
        binary_cross_entropy_with_logits(x.to(DType::kBF16), Tensor::zeros({4, 1}, DType::kF16));
      },
      {op, "'logits'", "bf16", "'targets'", "f16"});
}

TEST(BinaryCrossEntropy, LowPrecisionLogitsGiveAnF32Loss) {
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    Tensor x32 = random_tensor({6, 1}, 16, -3, 3).to(dtype).to(DType::kF32);
    Tensor y = Tensor::from_vector<float>({1, 0, 1, 1, 0, 0}, {6, 1});
    Tensor ref = x32.clone().set_requires_grad(true), low = x32.to(dtype).set_requires_grad(true);
    Tensor loss_ref = binary_cross_entropy_with_logits(ref, y);
    Tensor loss = binary_cross_entropy_with_logits(low, y);
    EXPECT_EQ(loss.dtype(), DType::kF32);
    EXPECT_EQ(loss.item(), loss_ref.item());
    loss_ref.backward();
    loss.backward();
    ASSERT_EQ(low.grad().dtype(), dtype);
    EXPECT_EQ(low.grad().to(DType::kF32).to_vector<float>(),
              ref.grad().to(dtype).to(DType::kF32).to_vector<float>());
  }
}

// ---------------------------------------------------------------- dot_interaction

// The documented order by explicit loops in double: i ascending, j < i ascending.
Tensor naive_dot_interaction(const Tensor& x) {
  const int64_t b = x.size(0), f = x.size(1), d = x.size(2);
  std::vector<float> xv = x.to_vector<float>(), out;
  for (int64_t s = 0; s < b; ++s)
    for (int64_t i = 0; i < f; ++i)
      for (int64_t j = 0; j < i; ++j) {
        double dot = 0;
        for (int64_t c = 0; c < d; ++c)
          dot += double(xv[(s * f + i) * d + c]) * double(xv[(s * f + j) * d + c]);
        out.push_back(float(dot));
      }
  return Tensor::from_vector(out, {b, f * (f - 1) / 2});
}

TEST(DotInteraction, HandComputedValues) {
  // x = [[1, 2], [3, 4], [5, 6]]: (1,0) 3 + 8, (2,0) 5 + 12, (2,1) 15 + 24.
  Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6, 1, 0, 0, 1, 1, 1}, {2, 3, 2});
  Tensor out = dot_interaction(x);
  EXPECT_EQ(out.shape(), (Shape{2, 3}));
  EXPECT_EQ(out.to_vector<float>(), (std::vector<float>{11, 17, 39, 0, 1, 1}));
}

TEST(DotInteraction, MatchesNaiveReferenceAndMatmulLowerTriangle) {
  // D = 19 and 7 leave tails after the kernel's 8 lanes; F = 27 is DLRM's Criteo count.
  for (Shape shape : {Shape{3, 5, 7}, Shape{2, 27, 19}, Shape{4, 2, 16}}) {
    Tensor x = random_tensor(shape, 20, -2, 2);
    Tensor out = dot_interaction(x);
    expect_close(out, naive_dot_interaction(x), 1e-5, 1e-5);
    // The same numbers as the batched matmul x x^T, lower triangle read row by row.
    std::vector<float> z = matmul(x, x, false, true).to_vector<float>(), tri;
    const int64_t b = shape[0], f = shape[1];
    for (int64_t s = 0; s < b; ++s)
      for (int64_t i = 0; i < f; ++i)
        for (int64_t j = 0; j < i; ++j) tri.push_back(z[size_t((s * f + i) * f + j)]);
    expect_close(out, Tensor::from_vector(tri, out.shape()), 1e-5, 1e-5);
  }
}

TEST(DotInteraction, GradientMatchesFiniteDifferences) {
  expect_gradients_match([](const std::vector<Tensor>& in) { return dot_interaction(in[0]); },
                         {leaf({2, 4, 3}, 21)});
  expect_gradients_match([](const std::vector<Tensor>& in) { return dot_interaction(in[0]); },
                         {leaf({1, 6, 11}, 22)});
}

TEST(DotInteraction, GradientOfTheSumIsTwiceTheOtherFeatures) {
  // d/dx_i of sum over pairs <x_i, x_j> is the sum of the other feature vectors.
  Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {1, 3, 2}).set_requires_grad(true);
  dot_interaction(x).backward(Tensor::ones({1, 3}));
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{8, 10, 6, 8, 4, 6}));
}

TEST(DotInteraction, NonContiguousInputEqualsItsCopy) {
  Tensor x = random_tensor({3, 4, 5}, 23).transpose(1, 2);  // [3, 5, 4]
  EXPECT_EQ(dot_interaction(x).to_vector<float>(),
            dot_interaction(x.contiguous()).to_vector<float>());
}

TEST(DotInteraction, OneFeatureGivesNoPairs) {
  Tensor out = dot_interaction(Tensor::ones({4, 1, 8}));
  EXPECT_EQ(out.shape(), (Shape{4, 0}));
}

TEST(DotInteraction, BadInputNamesTheOp) {
  expect_error(
      [] {
        dot_interaction(Tensor::zeros({4, 8}));
      },
      {"dot_interaction", "'features'", "3-D [B, F, D]", "[4, 8]"});
  expect_error(
      [] {
        dot_interaction(Tensor::zeros({2, 3, 4}, DType::kI64));
      },
      {"dot_interaction", "'features'", "i64", "f32"});
  expect_error([] { dot_interaction(Tensor()); }, {"dot_interaction", "undefined"});
}

// ---------------------------------------------------------------- shared rules

TEST(DlrmOps, LowPrecisionFollowsTheF32OpRounded) {
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    expect_low_precision_rule([](const Tensor& x) { return relu(x); }, random_tensor({5, 4}, 30),
                              dtype);
    expect_low_precision_rule([](const Tensor& x) { return sigmoid(x); },
                              random_tensor({5, 4}, 31, -4, 4), dtype);
    expect_low_precision_rule([](const Tensor& x) { return dot_interaction(x); },
                              random_tensor({2, 4, 8}, 32), dtype);
  }
}

TEST(DlrmOps, BadDtypeNamesTheOp) {
  expect_error([] { relu(Tensor::zeros({2}, DType::kI32)); }, {"relu", "'x'", "i32"});
  expect_error([] { sigmoid(Tensor::zeros({2}, DType::kI64)); }, {"sigmoid", "'x'", "i64"});
  expect_error([] { relu(Tensor()); }, {"relu", "undefined"});
}

#ifdef _OPENMP
// The forward sums and the backward's accumulations run in a fixed order: the same bits whatever
// the thread count (sizes above the kernels' thresholds for going parallel).
TEST(DlrmOps, ResultsDoNotDependOnTheThreadCount) {
  Tensor feats = random_tensor({256, 9, 32}, 40), g = random_tensor({256, 36}, 41);
  Tensor logits = random_tensor({70000}, 42, -5, 5), targets = random_tensor({70000}, 43, 0, 1);
  auto run = [&] {
    Tensor f = feats.clone().set_requires_grad(true);
    dot_interaction(f).backward(g);
    Tensor x = logits.clone().set_requires_grad(true);
    Tensor loss = binary_cross_entropy_with_logits(x, targets);
    loss.backward();
    return std::vector<std::vector<float>>{dot_interaction(feats).to_vector<float>(),
                                           f.grad().to_vector<float>(),
                                           {float(loss.item())},
                                           x.grad().to_vector<float>()};
  };
  const int previous = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto one = run();
  for (int threads : {2, 3}) {
    omp_set_num_threads(threads);
    EXPECT_EQ(run(), one) << threads << " threads";
  }
  omp_set_num_threads(previous);
}
#endif

}  // namespace
}  // namespace loom
