#include <gtest/gtest.h>

#include "core/ops.h"
#include "core/tensor.h"

namespace loom {
namespace {

TEST(Tensor, FromVectorRoundTrip) {
  Tensor t = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(t.strides(), (Shape{3, 1}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
}

TEST(Tensor, TransposeIsAViewAndContiguousCopies) {
  Tensor t = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor tt = t.transpose(0, 1);
  EXPECT_EQ(tt.shape(), (Shape{3, 2}));
  EXPECT_FALSE(tt.is_contiguous());
  EXPECT_EQ(tt.storage(), t.storage());
  EXPECT_EQ(tt.to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  Tensor c = tt.contiguous();
  EXPECT_NE(c.storage(), t.storage());
  EXPECT_TRUE(c.is_contiguous());
}

TEST(Tensor, NarrowSharesStorageWithOffset) {
  Tensor t = Tensor::arange(12).reshape({3, 4});
  Tensor n = t.narrow(1, 1, 2);
  EXPECT_EQ(n.offset(), 1);
  EXPECT_EQ(n.to_vector<float>(), (std::vector<float>{1, 2, 5, 6, 9, 10}));
}

TEST(Tensor, AllocatorCountsLiveAndPeakBytes) {
  Allocator& a = allocator_for(Device::cpu());
  size_t before = a.live_bytes();
  a.reset_peak();
  {
    Tensor t = Tensor::empty({1000}, DType::kF32);
    EXPECT_EQ(a.live_bytes(), before + 4000);
  }
  EXPECT_EQ(a.live_bytes(), before);
  EXPECT_EQ(a.peak_bytes(), before + 4000);
}

TEST(Tensor, DtypeConversionRoundsToNearestEven) {
  Tensor t = Tensor::from_vector<float>({1.0f, 1.00390625f, -2.5f, 65504.0f}, {4});
  Tensor b = t.to(DType::kBF16);
  EXPECT_EQ(b.dtype(), DType::kBF16);
  // 1 + 2^-8 is halfway between two bf16 values; ties go to the even one, 1.0.
  EXPECT_EQ(b.to(DType::kF32).to_vector<float>(), (std::vector<float>{1.0f, 1.0f, -2.5f, 65536.0f}));
  Tensor h = t.to(DType::kF16);
  EXPECT_EQ(h.to(DType::kF32).to_vector<float>(),
            (std::vector<float>{1.0f, 1.00390625f, -2.5f, 65504.0f}));
}

TEST(Tensor, BadInputIsAClearError) {
  Tensor t = Tensor::zeros({2, 3});
  EXPECT_THROW(t.reshape({4, 2}), Error);
  EXPECT_THROW(t.narrow(1, 2, 2), Error);
  EXPECT_THROW(t.data<int32_t>(), Error);
  try {
    t.reshape({4, 2});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("reshape"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[rank "), std::string::npos) << e.what();
  }
}

TEST(Autograd, AddMulChainRule) {
  Tensor a = Tensor::from_vector<float>({1, 2, 3}, {3}).set_requires_grad(true);
  Tensor b = Tensor::from_vector<float>({4, 5, 6}, {3}).set_requires_grad(true);
  Tensor y = mul(add(a, b), a);  // (a + b) * a: d/da = 2a + b, d/db = a
  y.backward(Tensor::ones({3}));
  EXPECT_EQ(a.grad().to_vector<float>(), (std::vector<float>{6, 9, 12}));
  EXPECT_EQ(b.grad().to_vector<float>(), (std::vector<float>{1, 2, 3}));
}

}  // namespace
}  // namespace loom
