// compare() (core/ops.h): eq ne lt le gt ge into u8 tensors, against values worked out by hand
// and a plain loop, with broadcasting either way round, NaN, every dtype it takes, and bad input.
// On CUDA (when there is a GPU) the same cases against the CPU, element for element.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/ops.h"
#include "core/tensor.h"
#include "kernels/cuda/runtime.h"
#include "testing/files.h"  // expect_error

namespace loom {
namespace {

const Compare kAll[] = {Compare::kEq, Compare::kNe, Compare::kLt,
                        Compare::kLe, Compare::kGt, Compare::kGe};

template <typename T>
bool holds(T x, T y, Compare op) {
  switch (op) {
    case Compare::kEq:
      return x == y;
    case Compare::kNe:
      return x != y;
    case Compare::kLt:
      return x < y;
    case Compare::kLe:
      return x <= y;
    case Compare::kGt:
      return x > y;
    case Compare::kGe:
      return x >= y;
  }
  return false;
}

// A bool result's bytes (every one 0 or 1).
std::vector<uint8_t> bits(const Tensor& x) {
  EXPECT_EQ(x.dtype(), DType::kBool);
  return x.to(Device::cpu()).to(DType::kU8).to_vector<uint8_t>();
}

TEST(Compare, HandWorkedValues) {
  const Tensor a = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor b = Tensor::from_vector(std::vector<float>{2, 2, 7}, {3});
  const Tensor eq = compare(a, b, Compare::kEq);
  EXPECT_EQ(eq.dtype(), DType::kBool);
  EXPECT_EQ(eq.shape(), (Shape{2, 3}));
  EXPECT_EQ(bits(eq), (std::vector<uint8_t>{0, 1, 0, 0, 0, 0}));
  EXPECT_EQ(bits(compare(a, b, Compare::kLt)), (std::vector<uint8_t>{1, 0, 1, 0, 0, 1}));
  EXPECT_EQ(bits(compare(a, b, Compare::kGe)), (std::vector<uint8_t>{0, 1, 0, 1, 1, 0}));
  // The shorter operand first: b < a is a > b, element for element.
  EXPECT_EQ(bits(compare(b, a, Compare::kLt)), bits(compare(a, b, Compare::kGt)));
  EXPECT_EQ(bits(compare(b, a, Compare::kLe)), bits(compare(a, b, Compare::kGe)));
  // A 0-d operand broadcasts to everything.
  EXPECT_EQ(bits(compare(a, Tensor::scalar(3.0), Compare::kLe)),
            (std::vector<uint8_t>{1, 1, 1, 0, 0, 0}));
}

// Every comparison against a plain loop, on f32 (NaN and infinities among the values), i32 and i64
// (values past 2^53, where an f64 round trip would merge them), with b the whole shape, a suffix,
// and a 0-d scalar, either way round.
TEST(Compare, EveryOpAndDtypeAgainstALoop) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = INFINITY;
  const std::vector<float> fa = {1, nan, -inf, 0, -0.0f, 2, inf, 3, nan, -1, 5, 2};
  const std::vector<float> fb = {1, 2, nan, -0.0f, 0, 2};
  const int64_t big = (int64_t(1) << 60) + 1;
  const std::vector<int64_t> la = {big, big - 1, -big, 0, 7, big + 2};
  const std::vector<int64_t> lb = {big, big};
  const std::vector<int32_t> ia = {5, -3, 2147483647, 0, -2147483647 - 1, 5};
  const std::vector<int32_t> ib = {5, 0, 2147483647};
  auto check = [](auto av, const Shape& as, auto bv, const Shape& bs) {
    const Tensor a = Tensor::from_vector(av, as), b = Tensor::from_vector(bv, bs);
    for (Compare op : kAll) {
      for (bool swap : {false, true}) {
        const Tensor got = swap ? compare(b, a, op) : compare(a, b, op);
        const std::vector<uint8_t> g = bits(got);
        ASSERT_EQ(g.size(), av.size());
        for (size_t i = 0; i < av.size(); ++i) {
          const auto x = av[i], y = bv[i % bv.size()];
          const bool want = swap ? holds(y, x, op) : holds(x, y, op);
          EXPECT_EQ(g[i], uint8_t(want)) << "element " << i << " op " << int(op) << " swapped "
                                         << swap << ": " << x << " vs " << y;
        }
      }
    }
  };
  check(fa, Shape{2, 6}, fb, Shape{6});
  check(fa, Shape{12}, fa, Shape{12});
  check(fa, Shape{3, 4}, std::vector<float>{2}, Shape{});
  check(la, Shape{3, 2}, lb, Shape{2});
  check(ia, Shape{2, 3}, ib, Shape{3});
}

TEST(Compare, LowPrecisionComparesValues) {
  // bf16 holds 1 + 2^-7 and 1 + 2^-6 exactly; they compare as the values they are.
  const std::vector<float> v = {1.0f, 1.0078125f, 1.015625f};
  const Tensor a = Tensor::from_vector(v, {3}).to(DType::kBF16);
  const Tensor b = Tensor::scalar(1.0078125, DType::kBF16, Device::cpu());
  EXPECT_EQ(bits(compare(a, b, Compare::kLt)), (std::vector<uint8_t>{1, 0, 0}));
  EXPECT_EQ(bits(compare(a, b, Compare::kEq)), (std::vector<uint8_t>{0, 1, 0}));
}

TEST(Compare, EmptyAndNoAutograd) {
  EXPECT_EQ(compare(Tensor::zeros({0, 3}), Tensor::zeros({3}), Compare::kEq).shape(),
            (Shape{0, 3}));
  Tensor x = Tensor::ones({4});
  x.set_requires_grad(true);
  const Tensor c = compare(x, Tensor::zeros({4}), Compare::kGt);
  EXPECT_FALSE(c.requires_grad());
  EXPECT_EQ(bits(c), (std::vector<uint8_t>{1, 1, 1, 1}));
}

TEST(Compare, MasksCompareAsU8) {
  const Tensor mask = Tensor::from_vector(std::vector<uint8_t>{0, 1, 2, 0}, {2, 2});
  EXPECT_EQ(bits(compare(mask, Tensor::zeros({}, DType::kU8), Compare::kEq)),
            (std::vector<uint8_t>{1, 0, 0, 1}));
  EXPECT_EQ(bits(compare(mask, Tensor::full({2}, 1.0, DType::kU8), Compare::kGe)),
            (std::vector<uint8_t>{0, 1, 1, 0}));
}

TEST(Compare, MixedDtypesArePromotedAsPyTorchs) {
  // An integer and a float meet in the float's dtype: 2.5 > 2 although 2.5 truncated is not.
  const Tensor f = Tensor::from_vector<float>({2.5f, -1.0f, 3.0f}, {3});
  const Tensor i = Tensor::from_vector<int64_t>({2, -1, 4}, {3});
  EXPECT_EQ(bits(compare(f, i, Compare::kGt)), (std::vector<uint8_t>{1, 0, 0}));
  EXPECT_EQ(bits(compare(i, f, Compare::kEq)), (std::vector<uint8_t>{0, 1, 0}));
  // Integers (u8, bool, i32) meet in i64: 200 u8 is not -56.
  const Tensor u = Tensor::from_vector(std::vector<uint8_t>{200, 0, 1}, {3});
  const Tensor s = Tensor::from_vector<int32_t>({-56, 0, 1}, {3});
  EXPECT_EQ(bits(compare(u, s, Compare::kEq)), (std::vector<uint8_t>{0, 1, 1}));
  const Tensor b = compare(s, Tensor::zeros({3}, DType::kI32), Compare::kNe);  // {1, 0, 1}
  EXPECT_EQ(bits(compare(b, s, Compare::kEq)), (std::vector<uint8_t>{0, 1, 1}));
  EXPECT_EQ(bits(compare(b, b, Compare::kEq)), (std::vector<uint8_t>{1, 1, 1}));
}

TEST(Compare, BadInputIsAClearError) {
  testing::expect_error(
      [] {
        compare(Tensor::zeros({2, 3}), Tensor::zeros({2}), Compare::kLt);
      },
      {"compare", "[2, 3]", "[2]", "do not broadcast"});
  testing::expect_error([] { compare(Tensor(), Tensor::zeros({2}), Compare::kEq); },
                        {"compare", "'a'"});
}

TEST(Compare, CudaMatchesCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device (or loom built without CUDA)";
  const Device gpu = Device::cuda(0);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> fa(3000), fb(1000);
  for (size_t i = 0; i < fa.size(); ++i) fa[i] = float(int(i * 7919 % 13) - 6) * 0.5f;
  for (size_t i = 0; i < fb.size(); ++i) fb[i] = float(int(i * 104729 % 11) - 5) * 0.5f;
  fa[17] = nan;
  fb[3] = nan;
  std::vector<int64_t> la(fa.begin(), fa.end()), lb(fb.begin(), fb.end());
  std::vector<int32_t> ia(fa.begin(), fa.end()), ib(fb.begin(), fb.end());
  la[5] = int64_t(1) << 61;
  lb[5] = (int64_t(1) << 61) + 1;
  const std::vector<std::pair<Tensor, Tensor>> pairs = {
      {Tensor::from_vector(fa, {3, 1000}), Tensor::from_vector(fb, {1000})},
      {Tensor::from_vector(la, {3, 1000}), Tensor::from_vector(lb, {1000})},
      {Tensor::from_vector(ia, {3, 1000}), Tensor::from_vector(ib, {1000})}};
  for (const auto& [a, b] : pairs)
    for (Compare op : kAll)
      for (bool swap : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(a.dtype()) << " op " << int(op) << (swap ? " swapped" : ""));
        const Tensor cpu = swap ? compare(b, a, op) : compare(a, b, op);
        const Tensor ag = a.to(gpu), bg = b.to(gpu);
        const Tensor cuda = swap ? compare(bg, ag, op) : compare(ag, bg, op);
        EXPECT_TRUE(cuda.device().is_cuda());
        EXPECT_EQ(bits(cuda), bits(cpu));
      }
}

}  // namespace
}  // namespace loom
