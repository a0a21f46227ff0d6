// Elementwise math (exp log sqrt rsqrt abs neg tanh sin cos, pow, clamp), where / masked_fill and
// numpy broadcasting with expand (core/ops.h): values against the C library and hand-worked
// results, gradients against central differences and closed forms, bad input named. On CUDA
// (when there is a GPU) every op against the CPU, forward and backward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "core/ops.h"
#include "core/tensor.h"
#include "kernels/cuda/runtime.h"
#include "testing/device_buffer.h"
#include "testing/files.h"  // expect_error
#include "testing/gradcheck.h"

namespace loom {
namespace {

using testing::random_tensor;
using Values = std::vector<float>;

Values values(const Tensor& t) { return t.detach().to(Device::cpu()).to_vector<float>(); }

const Unary kUnaries[] = {Unary::kExp,   Unary::kLog,  Unary::kSqrt,  Unary::kRsqrt,
                          Unary::kAbs,   Unary::kNeg,  Unary::kTanh,  Unary::kSin,
                          Unary::kCos,   Unary::kErf,  Unary::kLog1p, Unary::kExpm1,
                          Unary::kFloor, Unary::kCeil, Unary::kRound, Unary::kTrunc};

float reference(Unary op, float x) {
  switch (op) {
    case Unary::kExp:
      return std::exp(x);
    case Unary::kLog:
      return std::log(x);
    case Unary::kSqrt:
      return std::sqrt(x);
    case Unary::kRsqrt:
      return 1.0f / std::sqrt(x);
    case Unary::kAbs:
      return std::fabs(x);
    case Unary::kNeg:
      return -x;
    case Unary::kTanh:
      return std::tanh(x);
    case Unary::kSin:
      return std::sin(x);
    case Unary::kCos:
      return std::cos(x);
    case Unary::kErf:
      return std::erf(x);
    case Unary::kLog1p:
      return std::log1p(x);
    case Unary::kExpm1:
      return std::expm1(x);
    case Unary::kFloor:
      return std::floor(x);
    case Unary::kCeil:
      return std::ceil(x);
    case Unary::kRound:
      return std::nearbyint(x);
    case Unary::kTrunc:
      return std::trunc(x);
  }
  return 0.0f;
}

bool positive_only(Unary op) {
  return op == Unary::kLog || op == Unary::kSqrt || op == Unary::kRsqrt || op == Unary::kLog1p;
}

TEST(Unary, ValuesMatchTheCLibrary) {
  for (Unary op : kUnaries) {
    SCOPED_TRACE(int(op));
    const Tensor x = positive_only(op) ? random_tensor({5, 7}, 3, 0.1f, 4.0f)
                                       : random_tensor({5, 7}, 3, -3.0f, 3.0f);
    const Values in = values(x), out = values(unary(x, op));
    ASSERT_EQ(out.size(), in.size());
    for (size_t i = 0; i < in.size(); ++i) EXPECT_EQ(out[i], reference(op, in[i])) << in[i];
  }
  // Hand-worked points and C's domain rules.
  const Tensor p = Tensor::from_vector(Values{0.0f, 1.0f, 4.0f}, {3});
  EXPECT_EQ(values(unary(p, Unary::kExp)), (Values{1.0f, std::exp(1.0f), std::exp(4.0f)}));
  EXPECT_EQ(values(unary(p, Unary::kSqrt)), (Values{0.0f, 1.0f, 2.0f}));
  EXPECT_EQ(values(unary(p, Unary::kRsqrt))[2], 0.5f);
  const Values logs =
      values(unary(Tensor::from_vector(Values{-1.0f, 0.0f, 1.0f}, {3}), Unary::kLog));
  EXPECT_TRUE(std::isnan(logs[0]));
  EXPECT_EQ(logs[1], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(logs[2], 0.0f);
}

TEST(Unary, GradientsMatchFiniteDifferences) {
  for (Unary op : kUnaries) {
    SCOPED_TRACE(int(op));
    Tensor x = positive_only(op) ? random_tensor({4, 3}, 5, 0.5f, 2.0f)
                                 : random_tensor({4, 3}, 5, -2.0f, 2.0f);
    if (op == Unary::kAbs)  // away from the kink at 0
      x = Tensor::from_vector(Values{-1.5f, -0.7f, -0.3f, 0.4f, 0.9f, 1.7f}, {2, 3});
    x.set_requires_grad(true);
    testing::expect_gradients_match([op](const std::vector<Tensor>& v) { return unary(v[0], op); },
                                    {x});
  }
}

// round is half to even (torch.round); the rounding functions keep an integer tensor as it is.
TEST(Unary, RoundingHalvesAndIntegers) {
  const Tensor halves = Tensor::from_vector(Values{-2.5f, -1.5f, -0.5f, 0.5f, 1.5f, 2.5f}, {6});
  EXPECT_EQ(values(unary(halves, Unary::kRound)), (Values{-2.0f, -2.0f, -0.0f, 0.0f, 2.0f, 2.0f}));
  EXPECT_EQ(values(unary(halves, Unary::kFloor)), (Values{-3.0f, -2.0f, -1.0f, 0.0f, 1.0f, 2.0f}));
  EXPECT_EQ(values(unary(halves, Unary::kCeil)), (Values{-2.0f, -1.0f, -0.0f, 1.0f, 2.0f, 3.0f}));
  EXPECT_EQ(values(unary(halves, Unary::kTrunc)), (Values{-2.0f, -1.0f, -0.0f, 0.0f, 1.0f, 2.0f}));
  const Tensor ints = Tensor::from_vector<int64_t>({-3, 0, 7}, {3});
  for (Unary op : {Unary::kFloor, Unary::kCeil, Unary::kRound, Unary::kTrunc}) {
    const Tensor r = unary(ints, op);
    EXPECT_EQ(r.dtype(), DType::kI64);
    EXPECT_EQ(r.to_vector<int64_t>(), (std::vector<int64_t>{-3, 0, 7}));
  }
}

TEST(Unary, AbsSlopeIsZeroAtZero) {
  Tensor x = Tensor::from_vector(Values{-2.0f, 0.0f, 3.0f}, {3});
  x.set_requires_grad(true);
  sum(unary(x, Unary::kAbs)).backward();
  EXPECT_EQ(values(x.grad()), (Values{-1.0f, 0.0f, 1.0f}));  // PyTorch's sign(x)
}

TEST(Pow, ValuesAndGradient) {
  Tensor x = Tensor::from_vector(Values{1.0f, 2.0f, 3.0f, 0.5f}, {2, 2});
  x.set_requires_grad(true);
  Tensor y = pow(x, 3.0);
  EXPECT_EQ(values(y), (Values{1.0f, 8.0f, 27.0f, 0.125f}));
  sum(y).backward();
  EXPECT_EQ(values(x.grad()), (Values{3.0f, 12.0f, 27.0f, 0.75f}));  // 3 x^2
  Tensor z = random_tensor({3, 5}, 9, 0.5f, 2.0f);
  z.set_requires_grad(true);
  testing::expect_gradients_match([](const std::vector<Tensor>& v) { return pow(v[0], -1.5); },
                                  {z});
  // x ** 0 is 1 with slope 0 everywhere, 0 included (as PyTorch).
  Tensor w = Tensor::from_vector(Values{0.0f, 2.0f}, {2});
  w.set_requires_grad(true);
  sum(pow(w, 0.0)).backward();
  EXPECT_EQ(values(w.grad()), (Values{0.0f, 0.0f}));
}

TEST(Clamp, ValuesBoundsAndGradient) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = Tensor::from_vector(Values{-3.0f, -1.0f, 0.0f, 1.0f, 2.5f, nan}, {6});
  x.set_requires_grad(true);
  Tensor y = clamp(x, -1.0, 1.0);
  const Values v = values(y);
  EXPECT_EQ(Values(v.begin(), v.end() - 1), (Values{-1.0f, -1.0f, 0.0f, 1.0f, 1.0f}));
  EXPECT_TRUE(std::isnan(v[5]));  // NaN stays NaN
  sum(y).backward();
  // The gradient passes where lo <= x <= hi, the bounds included (PyTorch's rule).
  EXPECT_EQ(values(x.grad()), (Values{0.0f, 1.0f, 1.0f, 1.0f, 0.0f, 0.0f}));
  // One-sided, and lo > hi gives hi.
  const Tensor t = Tensor::from_vector(Values{-2.0f, 5.0f}, {2});
  EXPECT_EQ(values(clamp(t, nan, 0.0)), (Values{-2.0f, 0.0f}));
  EXPECT_EQ(values(clamp(t, 0.0, nan)), (Values{0.0f, 5.0f}));
  EXPECT_EQ(values(clamp(t, 2.0, 1.0)), (Values{1.0f, 1.0f}));
  testing::expect_error([&] { clamp(t, nan, nan); }, {"at least one of min and max"});
}

TEST(Broadcast, ExpandCopiesAndSumsTheGradientBack) {
  Tensor x = Tensor::from_vector(Values{1.0f, 2.0f, 3.0f}, {3, 1});
  x.set_requires_grad(true);
  Tensor y = expand(x, {2, 3, 4});
  EXPECT_EQ(y.shape(), (Shape{2, 3, 4}));
  EXPECT_TRUE(y.is_contiguous());
  const Values v = values(y);
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 4; ++j) EXPECT_EQ(v[size_t(b * 12 + i * 4 + j)], float(i + 1));
  Tensor g = random_tensor({2, 3, 4}, 4);
  y.backward(g);
  const Values gv = values(g), xg = values(x.grad());
  for (int i = 0; i < 3; ++i) {
    double want = 0;
    for (int b = 0; b < 2; ++b)
      for (int j = 0; j < 4; ++j) want += gv[size_t(b * 12 + i * 4 + j)];
    EXPECT_NEAR(xg[size_t(i)], want, 1e-5);
  }
  testing::expect_error([&] { expand(x, {2, 2}); }, {"cannot expand"});
  testing::expect_error([&] { expand(x, {3}); }, {"fewer dims"});
}

TEST(Broadcast, BinaryOpsFollowNumpy) {
  // [2, 3] - [2, 1]: a row mean subtracted (the case that used to raise).
  Tensor a = Tensor::from_vector(Values{1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor m = Tensor::from_vector(Values{10, 20}, {2, 1});
  a.set_requires_grad(true);
  m.set_requires_grad(true);
  Tensor d = sub(a, m);
  EXPECT_EQ(values(d), (Values{-9, -8, -7, -16, -15, -14}));
  sum(d).backward();
  EXPECT_EQ(values(a.grad()), (Values{1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(values(m.grad()), (Values{-3, -3}));
  // [3, 1] * [1, 4] -> [3, 4]: an outer product, and the shorter operand first.
  const Tensor c = Tensor::from_vector(Values{1, 2, 3}, {3, 1});
  const Tensor r = Tensor::from_vector(Values{1, 10, 100, 1000}, {1, 4});
  const Values outer = values(mul(c, r));
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j)
      EXPECT_EQ(outer[size_t(i * 4 + j)], float(i + 1) * std::pow(10.0f, float(j)));
  EXPECT_EQ(div(Tensor::from_vector(Values{4}, {1, 1, 1}), c).shape(), (Shape{1, 3, 1}));
  // Comparisons broadcast alike.
  EXPECT_EQ(compare(c, r, Compare::kGt).shape(), (Shape{3, 4}));
  // Gradients of both operands through a general broadcast.
  Tensor p = random_tensor({2, 1, 3}, 11), q = random_tensor({4, 1}, 12, 1.0f, 2.0f);
  p.set_requires_grad(true);
  q.set_requires_grad(true);
  testing::expect_gradients_match([](const std::vector<Tensor>& v) { return div(v[0], v[1]); },
                                  {p, q});
  testing::expect_error([&] { add(a, Tensor::zeros({3, 2})); }, {"do not broadcast"});
}

TEST(Where, SelectsAndRoutesGradients) {
  const Tensor cond =
      compare(Tensor::from_vector(Values{-1, 2, -3, 4}, {2, 2}), Tensor::scalar(0.0), Compare::kGt);
  Tensor a = Tensor::from_vector(Values{1, 2, 3, 4}, {2, 2});
  Tensor b = Tensor::from_vector(Values{10, 20}, {2});  // broadcast over rows
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  Tensor y = where(cond, a, b);
  EXPECT_EQ(values(y), (Values{10, 2, 10, 4}));
  sum(y).backward();
  EXPECT_EQ(values(a.grad()), (Values{0, 1, 0, 1}));
  EXPECT_EQ(values(b.grad()), (Values{2, 0}));
  Tensor x = Tensor::from_vector(Values{1, 2, 3, 4}, {2, 2});
  x.set_requires_grad(true);
  const Tensor mask = Tensor::from_vector(std::vector<uint8_t>{1, 0}, {2});
  Tensor f = masked_fill(x, mask, -5.0);
  EXPECT_EQ(values(f), (Values{-5, 2, -5, 4}));
  sum(f).backward();
  EXPECT_EQ(values(x.grad()), (Values{0, 1, 0, 1}));
  testing::expect_error([&] { where(a, a, b); }, {"expected bool", "or u8"});
  testing::expect_error(
      [&] {
        masked_fill(x, Tensor::zeros({2, 2, 2}, DType::kU8), 0.0);
      },
      {"does not broadcast to x's shape"});
}

TEST(MathLowPrecision, Bf16IsTheF32ResultRounded) {
  const Tensor x = random_tensor({3, 4}, 21, 0.5f, 2.0f);
  const Tensor h = x.to(DType::kBF16);
  for (Unary op : kUnaries) {
    const Tensor got = unary(h, op), want = unary(h.to(DType::kF32), op).to(DType::kBF16);
    EXPECT_EQ(got.dtype(), DType::kBF16);
    EXPECT_EQ(values(got.to(DType::kF32)), values(want.to(DType::kF32)));
  }
  EXPECT_EQ(values(pow(h, 2.0).to(DType::kF32)),
            values(pow(h.to(DType::kF32), 2.0).to(DType::kBF16).to(DType::kF32)));
}

TEST(Extreme, MaxMinValuesIndicesAndGradient) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // [2, 3]: ties go to the first index; a NaN wins.
  Tensor x = Tensor::from_vector(Values{1, 5, 5, 2, nan, 0}, {2, 3});
  x.set_requires_grad(true);
  ValuesIndices mx = max_dim(x, 1);
  const Values v = values(mx.values);
  EXPECT_EQ(v[0], 5.0f);
  EXPECT_TRUE(std::isnan(v[1]));
  EXPECT_EQ(mx.indices.dtype(), DType::kI64);
  EXPECT_EQ(mx.indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 1}));
  sum(mx.values).backward();
  EXPECT_EQ(values(x.grad()), (Values{0, 1, 0, 0, 1, 0}));
  ValuesIndices mn = min_dim(Tensor::from_vector(Values{3, 1, 2, 0, 1, 0}, {2, 3}), 0, true);
  EXPECT_EQ(mn.values.shape(), (Shape{1, 3}));
  EXPECT_EQ(values(mn.values), (Values{0, 1, 0}));
  EXPECT_EQ(mn.indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 1}));  // ties: first
  // Over a middle dim, against a plain loop.
  Tensor r = random_tensor({3, 5, 4}, 51);
  const Values rv = values(r);
  ValuesIndices m1 = max_dim(r, 1);
  const Values m1v = values(m1.values);
  const std::vector<int64_t> m1i = m1.indices.to_vector<int64_t>();
  for (int o = 0; o < 3; ++o)
    for (int i = 0; i < 4; ++i) {
      int best = 0;
      for (int k = 1; k < 5; ++k)
        if (rv[size_t(o * 20 + k * 4 + i)] > rv[size_t(o * 20 + best * 4 + i)]) best = k;
      EXPECT_EQ(m1i[size_t(o * 4 + i)], best);
      EXPECT_EQ(m1v[size_t(o * 4 + i)], rv[size_t(o * 20 + best * 4 + i)]);
    }
  testing::expect_error([&] { max_dim(Tensor::zeros({2, 0}), 1); }, {"is empty"});
  testing::expect_error([&] { max_dim(Tensor::scalar(1.0), 0); }, {"0-d tensor"});
}

TEST(TopK, SortedValuesTiesNanAndGradient) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = Tensor::from_vector(Values{1, 5, 3, 5, 2}, {5});
  x.set_requires_grad(true);
  ValuesIndices t = topk(x, 3);
  EXPECT_EQ(values(t.values), (Values{5, 5, 3}));
  EXPECT_EQ(t.indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 3, 2}));  // ties: lower first
  sum(mul(t.values, Tensor::from_vector(Values{10, 20, 30}, {3}))).backward();
  EXPECT_EQ(values(x.grad()), (Values{0, 10, 30, 20, 0}));
  ValuesIndices s = topk(x.detach(), 2, 0, false);
  EXPECT_EQ(values(s.values), (Values{1, 2}));
  EXPECT_EQ(s.indices.to_vector<int64_t>(), (std::vector<int64_t>{0, 4}));
  // NaN is the largest value: first when largest, last otherwise.
  const Tensor n = Tensor::from_vector(Values{1, nan, 3}, {3});
  EXPECT_EQ(topk(n, 2).indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(topk(n, 3, 0, false).indices.to_vector<int64_t>(), (std::vector<int64_t>{0, 2, 1}));
  // Along each dim of a 3-D tensor, against sorting each column.
  const Tensor r = random_tensor({4, 6, 5}, 52);
  const Values rv = values(r);
  const int64_t strides[] = {30, 5, 1};
  for (int64_t dim = 0; dim < 3; ++dim) {
    const int64_t k = 3;
    ValuesIndices top = topk(r, k, dim);
    Shape expect_shape = r.shape();
    expect_shape[size_t(dim)] = k;
    ASSERT_EQ(top.values.shape(), expect_shape);
    const Values tv = values(top.values);
    const std::vector<int64_t> ti = top.indices.to_vector<int64_t>();
    // Walk every output place (a, b, c) and check it is the column's j-th largest.
    Shape s = expect_shape;
    for (int64_t a = 0; a < s[0]; ++a)
      for (int64_t b = 0; b < s[1]; ++b)
        for (int64_t c = 0; c < s[2]; ++c) {
          const int64_t place[] = {a, b, c};
          const int64_t j = place[dim];
          int64_t base = 0;
          for (int64_t d = 0; d < 3; ++d) base += d == dim ? 0 : place[d] * strides[d];
          Values column;
          for (int64_t q = 0; q < r.size(dim); ++q)
            column.push_back(rv[size_t(base + q * strides[dim])]);
          Values sorted = column;
          std::sort(sorted.begin(), sorted.end(), std::greater<float>());
          const size_t out = size_t((a * s[1] + b) * s[2] + c);
          EXPECT_EQ(tv[out], sorted[size_t(j)]);
          EXPECT_EQ(column[size_t(ti[out])], tv[out]);
        }
  }
  EXPECT_EQ(topk(r, 0, 1).values.shape(), (Shape{4, 0, 5}));
  testing::expect_error([&] { topk(r, 7, 1); }, {"topk", "k = 7", "size 6"});
  testing::expect_error([&] { topk(r, 1, 3); }, {"topk"});
}

// ---------------------------------------------------------------- CUDA against the CPU

// The op on CUDA and on the CPU, forward and backward with one random output gradient. The math
// functions come from two libraries (CUDA's and the host's), which round differently in the last
// bits: 4 ulp-scale relative tolerance, documented in kernels/math.h.
void expect_cuda_matches_cpu(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                             const std::vector<Tensor>& inputs, double rtol = 1e-6) {
  std::vector<Tensor> outs, grads;
  for (Device device : {Device::cuda(0), Device::cpu()}) {
    std::vector<Tensor> leaves;
    for (const Tensor& x : inputs) {
      Tensor leaf = x.detach().clone().to(device);
      leaf.set_requires_grad(true);
      leaves.push_back(leaf);
    }
    Tensor out = f(leaves);
    out.backward(random_tensor(out.shape(), 77).to(device));
    outs.push_back(out.detach().to(Device::cpu()));
    for (const Tensor& leaf : leaves) grads.push_back(leaf.grad().to(Device::cpu()));
  }
  testing::expect_close(outs[0], outs[1], 1e-6, rtol);
  const size_t n = inputs.size();
  for (size_t i = 0; i < n; ++i) testing::expect_close(grads[i], grads[n + i], 1e-6, rtol);
}

TEST(CudaMath, EveryOpAgainstTheCpu) {
  LOOM_SKIP_WITHOUT_CUDA();
  for (int64_t n : {1, 7, 1000, 70001}) {
    for (Unary op : kUnaries) {
      SCOPED_TRACE(int(op));
      const Tensor x = positive_only(op) ? random_tensor({n}, 31, 0.1f, 4.0f)
                                         : random_tensor({n}, 31, -3.0f, 3.0f);
      expect_cuda_matches_cpu([op](const std::vector<Tensor>& v) { return unary(v[0], op); }, {x},
                              4e-7);
    }
    const Tensor x = random_tensor({n}, 32, 0.1f, 3.0f);
    expect_cuda_matches_cpu([](const std::vector<Tensor>& v) { return pow(v[0], 2.5); }, {x}, 4e-7);
    expect_cuda_matches_cpu([](const std::vector<Tensor>& v) { return clamp(v[0], 0.5, 2.0); }, {x},
                            0.0);
  }
  const Tensor a = random_tensor({33, 7}, 41), b = random_tensor({7}, 42);
  expect_cuda_matches_cpu(
      [](const std::vector<Tensor>& v) {
        return where(compare(v[0], Tensor::scalar(0.0, DType::kF32, v[0].device()), Compare::kGt),
                     v[0], v[1]);
      },
      {a, b}, 0.0);
  for (int64_t dim : {0, 1, 2}) {
    const Tensor r = random_tensor({33, 70, 5}, 45);
    expect_cuda_matches_cpu(
        [dim](const std::vector<Tensor>& v) { return max_dim(v[0], dim).values; }, {r}, 0.0);
    expect_cuda_matches_cpu(
        [dim](const std::vector<Tensor>& v) { return min_dim(v[0], dim).values; }, {r}, 0.0);
    EXPECT_EQ(max_dim(r.to(Device::cuda(0)), dim).indices.to(Device::cpu()).to_vector<int64_t>(),
              max_dim(r, dim).indices.to_vector<int64_t>());
  }
  for (int64_t dim : {0, 1, 2}) {
    // Ties and NaN too: the order rule is kernels/extreme.h's on both sides.
    Tensor r = random_tensor({9, 70, 5}, 46);
    Values v = values(r);
    v[3] = v[8] = v[13];
    r = Tensor::from_vector(v, r.shape());
    v[20] = std::numeric_limits<float>::quiet_NaN();  // indices only: expect_close fails on NaN
    const Tensor with_nan = Tensor::from_vector(v, r.shape());
    for (bool largest : {true, false}) {
      expect_cuda_matches_cpu(
          [dim, largest](const std::vector<Tensor>& in) {
            return topk(in[0], 4, dim, largest).values;
          },
          {r}, 0.0);
      EXPECT_EQ(topk(with_nan.to(Device::cuda(0)), 4, dim, largest)
                    .indices.to(Device::cpu())
                    .to_vector<int64_t>(),
                topk(with_nan, 4, dim, largest).indices.to_vector<int64_t>());
    }
  }
  const Tensor c = random_tensor({5, 1, 7}, 43), d = random_tensor({3, 1}, 44, 1.0f, 2.0f);
  expect_cuda_matches_cpu([](const std::vector<Tensor>& v) { return div(v[0], v[1]); }, {c, d},
                          1e-6);
}

}  // namespace
}  // namespace loom
