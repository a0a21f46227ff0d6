// Integer arithmetic and sums (core/ops/integer.cpp, Note [Integer operands]): Python's floor
// division and remainder signs, wrapping, broadcasting, promotion with floating tensors, i64
// sums, zero divisors; and the CUDA kernels against the CPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/ops.h"
#include "testing/device_buffer.h"
#include "testing/files.h"

namespace loom {
namespace {

Tensor i64(const std::vector<int64_t>& v, const Shape& shape) {
  return Tensor::from_vector(v, shape);
}

// Python's a // b and a % b, spelled out independently of the kernels.
int64_t py_floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
int64_t py_mod(int64_t a, int64_t b) { return a - py_floordiv(a, b) * b; }

TEST(Integer, ArithmeticFollowsPython) {
  const std::vector<int64_t> av = {-7, -3, 0, 2, 5, 9, -9, 8};
  const std::vector<int64_t> bv = {2, -2, 3, -3, 4, -4, 7, 5};
  const Tensor a = i64(av, {8}), b = i64(bv, {8});
  const auto sum_v = add(a, b).to_vector<int64_t>();
  const auto dif_v = sub(a, b).to_vector<int64_t>();
  const auto mul_v = mul(a, b).to_vector<int64_t>();
  const auto div_v = floor_divide(a, b).to_vector<int64_t>();
  const auto mod_v = remainder(a, b).to_vector<int64_t>();
  for (size_t i = 0; i < av.size(); ++i) {
    EXPECT_EQ(sum_v[i], av[i] + bv[i]);
    EXPECT_EQ(dif_v[i], av[i] - bv[i]);
    EXPECT_EQ(mul_v[i], av[i] * bv[i]);
    EXPECT_EQ(div_v[i], py_floordiv(av[i], bv[i])) << av[i] << " // " << bv[i];
    EXPECT_EQ(mod_v[i], py_mod(av[i], bv[i])) << av[i] << " % " << bv[i];
  }
  EXPECT_EQ(add(a, b).dtype(), DType::kI64);
  // Wrapping in the type's width, as PyTorch's integer tensors.
  const Tensor big = i64({std::numeric_limits<int64_t>::max()}, {1});
  EXPECT_EQ(add(big, i64({1}, {1})).to_vector<int64_t>()[0], std::numeric_limits<int64_t>::min());
  const Tensor bytes = Tensor::from_vector(std::vector<uint8_t>{250, 3}, {2});
  EXPECT_EQ(add(bytes, Tensor::from_vector(std::vector<uint8_t>{10, 4}, {2})).to_vector<uint8_t>(),
            (std::vector<uint8_t>{4, 7}));
  EXPECT_EQ(scale(bytes, -1.0).to_vector<uint8_t>(), (std::vector<uint8_t>{6, 253}));
  // Broadcasting either way round, and a shorter dividend.
  const Tensor m = i64({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(sub(i64({10, 20, 30}, {3}), m).to_vector<int64_t>(),
            (std::vector<int64_t>{9, 18, 27, 6, 15, 24}));
  EXPECT_EQ(floor_divide(i64({7}, {1}), m).to_vector<int64_t>(),
            (std::vector<int64_t>{7, 3, 2, 1, 1, 1}));
  EXPECT_EQ(mul(i64({2, 3}, {2, 1}), i64({1, 10, 100}, {1, 3})).to_vector<int64_t>(),
            (std::vector<int64_t>{2, 20, 200, 3, 30, 300}));
}

TEST(Integer, PromotionSumsAndErrors) {
  const Tensor a = i64({1, 2, 3, 4}, {2, 2});
  // With a floating tensor: computed in the floating dtype.
  const Tensor f = add(Tensor::full({2, 2}, 0.5), a);
  EXPECT_EQ(f.dtype(), DType::kF32);
  EXPECT_EQ(f.to_vector<float>(), (std::vector<float>{1.5f, 2.5f, 3.5f, 4.5f}));
  EXPECT_EQ(div(a, i64({2}, {1})).to_vector<float>(), (std::vector<float>{0.5f, 1, 1.5f, 2}));
  EXPECT_EQ(scale(a, 0.5).dtype(), DType::kF32);
  EXPECT_EQ(scale(a, 3.0).to_vector<int64_t>(), (std::vector<int64_t>{3, 6, 9, 12}));
  // Sums are i64: of a mask, of a dim, with keepdim.
  const Tensor mask = compare(a, Tensor::scalar(2.0, DType::kI64), Compare::kGt);
  EXPECT_EQ(sum(mask).dtype(), DType::kI64);
  EXPECT_EQ(sum(mask).to_vector<int64_t>(), (std::vector<int64_t>{2}));
  EXPECT_EQ(sum(a, 0).to_vector<int64_t>(), (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(sum(a, -1, true).shape(), (Shape{2, 1}));
  EXPECT_EQ(sum(a, -1, true).to_vector<int64_t>(), (std::vector<int64_t>{3, 7}));
  EXPECT_EQ(sum(Tensor::zeros({0}, DType::kI32)).to_vector<int64_t>(), (std::vector<int64_t>{0}));
  // A zero divisor and floating floor division are errors naming what is wrong.
  testing::expect_error(
      [&] {
        remainder(a, i64({1, 0}, {2}));
      },
      {"remainder: integer division by zero"});
  EXPECT_THROW(floor_divide(Tensor::ones({2}), Tensor::ones({2})), Error);
}

TEST(IntegerCuda, KernelsMatchTheCpu) {
  LOOM_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::cuda(0);
  std::vector<int64_t> av(70007), bv(70007);
  for (size_t i = 0; i < av.size(); ++i) {
    av[i] = int64_t(i * 2654435761u % 2001) - 1000;
    bv[i] = int64_t(i * 40503u % 37) - 18;
    if (bv[i] == 0) bv[i] = 5;
  }
  const Tensor a = i64(av, {70007}), b = i64(bv, {70007});
  for (auto f : {&add, &sub, &mul, &floor_divide, &remainder}) {
    EXPECT_EQ(f(a.to(gpu), b.to(gpu)).to(Device::cpu()).to_vector<int64_t>(),
              f(a, b).to_vector<int64_t>());
  }
  const Tensor a32 = a.to(DType::kI32).reshape({7, 10001});
  EXPECT_EQ(sum(a32.to(gpu), 1).to(Device::cpu()).to_vector<int64_t>(),
            sum(a32, 1).to_vector<int64_t>());
  EXPECT_EQ(sum(a.to(gpu)).to(Device::cpu()).to_vector<int64_t>(), sum(a).to_vector<int64_t>());
  const Tensor mask = compare(a, Tensor::scalar(0.0, DType::kI64), Compare::kGt);
  EXPECT_EQ(sum(mask.to(gpu)).to(Device::cpu()).to_vector<int64_t>(),
            sum(mask).to_vector<int64_t>());
  const Tensor bytes = a.to(DType::kU8);
  EXPECT_EQ(add(bytes.to(gpu), bytes.to(gpu)).to(Device::cpu()).to_vector<uint8_t>(),
            add(bytes, bytes).to_vector<uint8_t>());
  EXPECT_EQ(where(mask.to(gpu), a.to(gpu), b.to(gpu)).to(Device::cpu()).to_vector<int64_t>(),
            where(mask, a, b).to_vector<int64_t>());
}

// where with integer operands picks the values exactly, in the promoted dtype (i32 with i64:
// i64; an integer beside a float: the float's dtype).
TEST(Integer, WhereFollowsTorch) {
  const Tensor a = i64({-3, 7, 2147483647LL * 4, 0}, {4});
  const Tensor b = i64({5, -9, 1, -2147483648LL * 3}, {4});
  const Tensor mask = compare(a, b, Compare::kGt);
  EXPECT_EQ(where(mask, a, b).to_vector<int64_t>(),
            (std::vector<int64_t>{5, 7, 2147483647LL * 4, 0}));
  const Tensor b32 = Tensor::from_vector<int32_t>({5, -9, 1, -6}, {4});
  const Tensor picked = where(mask, a, b32);
  EXPECT_EQ(picked.dtype(), DType::kI64);
  EXPECT_EQ(picked.to_vector<int64_t>(), (std::vector<int64_t>{5, 7, 2147483647LL * 4, 0}));
  const Tensor f = where(mask, a.to(DType::kI32), Tensor::full({4}, 0.5));
  EXPECT_EQ(f.dtype(), DType::kF32);
  EXPECT_EQ(f.to_vector<float>()[0], 0.5f);
}

// ---------------------------------------------------------------- bool

std::vector<uint8_t> bytes_of(const Tensor& b) {
  EXPECT_EQ(b.dtype(), DType::kBool);
  return b.to(Device::cpu()).to(DType::kU8).to_vector<uint8_t>();
}

// Conversions to bool are "not zero" (as C++'s and PyTorch's: NaN is true, -0 false, 256 true);
// from bool, 0 and 1.
TEST(Bool, ConversionsAreNotZero) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor f = Tensor::from_vector<float>({0.0f, -0.0f, 0.5f, -2.0f, nan}, {5});
  EXPECT_EQ(bytes_of(f.to(DType::kBool)), (std::vector<uint8_t>{0, 0, 1, 1, 1}));
  EXPECT_EQ(bytes_of(i64({0, 256, -1}, {3}).to(DType::kBool)), (std::vector<uint8_t>{0, 1, 1}));
  EXPECT_EQ(bytes_of(f.to(DType::kBF16).to(DType::kBool)), (std::vector<uint8_t>{0, 0, 1, 1, 1}));
  const Tensor b = f.to(DType::kBool);
  EXPECT_EQ(b.to(DType::kF32).to_vector<float>(), (std::vector<float>{0, 0, 1, 1, 1}));
  EXPECT_EQ(b.to(DType::kI64).to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 1, 1, 1}));
  EXPECT_EQ(std::string(dtype_name(DType::kBool)), "bool");
  EXPECT_EQ(parse_dtype("bool"), DType::kBool);
  EXPECT_EQ(dtype_size(DType::kBool), 1u);
  EXPECT_FALSE(is_floating(DType::kBool));
}

// Arithmetic as PyTorch's: two bools add as or and multiply as and (sub is refused); a bool
// beside another integer is its 0 / 1, beside a float the float's; sums count (i64); a bool
// scaled by an integer is i64; where picks bools as bools.
TEST(Bool, ArithmeticAndSumsFollowTorch) {
  const Tensor x = i64({0, 1, 0, 1}, {4}).to(DType::kBool);
  const Tensor y = i64({0, 0, 1, 1}, {4}).to(DType::kBool);
  EXPECT_EQ(bytes_of(add(x, y)), (std::vector<uint8_t>{0, 1, 1, 1}));
  EXPECT_EQ(bytes_of(mul(x, y)), (std::vector<uint8_t>{0, 0, 0, 1}));
  testing::expect_error([&] { sub(x, y); }, {"sub", "two bool tensors", "logical_xor"});
  const Tensor n = Tensor::from_vector<int32_t>({5, 5, 5, 5}, {4});
  EXPECT_EQ(add(x, n).dtype(), DType::kI32);
  EXPECT_EQ(add(x, n).to_vector<int32_t>(), (std::vector<int32_t>{5, 6, 5, 6}));
  EXPECT_EQ(mul(x, Tensor::full({4}, 2.5)).to_vector<float>(),
            (std::vector<float>{0, 2.5, 0, 2.5}));
  EXPECT_EQ(sum(x).dtype(), DType::kI64);
  EXPECT_EQ(sum(x).to_vector<int64_t>(), (std::vector<int64_t>{2}));
  EXPECT_EQ(sum(x.reshape({2, 2}), 0).to_vector<int64_t>(), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(scale(x, 3.0).dtype(), DType::kI64);
  EXPECT_EQ(scale(x, 3.0).to_vector<int64_t>(), (std::vector<int64_t>{0, 3, 0, 3}));
  EXPECT_EQ(bytes_of(where(y, x, y)), (std::vector<uint8_t>{0, 0, 0, 1}));
  EXPECT_EQ(where(x, n, i64({-1, -1, -1, -1}, {4})).to_vector<int64_t>(),
            (std::vector<int64_t>{-1, 5, -1, 5}));
  EXPECT_EQ(masked_fill(Tensor::zeros({4}), x, 7.0).to_vector<float>(),
            (std::vector<float>{0, 7, 0, 7}));
}

TEST(Bool, CudaMatchesCpu) {
  LOOM_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::cuda(0);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> v(5000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = i % 3 == 0 ? 0.0f : float(int(i % 7) - 3) * 0.25f;
  v[11] = nan;
  v[12] = -0.0f;
  const Tensor f = Tensor::from_vector(v, {5000});
  for (DType from : {DType::kF32, DType::kBF16, DType::kI64, DType::kU8}) {
    const Tensor x = f.to(from);
    EXPECT_EQ(bytes_of(x.to(gpu).to(DType::kBool)), bytes_of(x.to(DType::kBool)))
        << dtype_name(from);
  }
  const Tensor b = f.to(DType::kBool);
  EXPECT_EQ(b.to(gpu).to(DType::kF32).to(Device::cpu()).to_vector<float>(),
            b.to(DType::kF32).to_vector<float>());
  EXPECT_EQ(sum(b.to(gpu)).to(Device::cpu()).to_vector<int64_t>(), sum(b).to_vector<int64_t>());
  EXPECT_EQ(bytes_of(add(b.to(gpu), b.to(gpu))), bytes_of(add(b, b)));
}

}  // namespace
}  // namespace loom
