// Gradients of parts (See Note [Gradients of parts] in core/autograd.h): narrow's gradient is
// added into its input's gathered gradient in place instead of as a zero-filled whole. The
// gradients are the closed forms of the same computation: a split whose parts are all used, one
// part used twice, a part beside the whole input, parts along an inner dim, a bf16 input, and a
// gradient the caller holds or that two slots share is never written (copied first).
#include <gtest/gtest.h>

#include <vector>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/tensor.h"

namespace loom {
namespace {

Tensor param(const std::vector<float>& values, const Shape& shape) {
  Tensor t = Tensor::from_vector(values, shape);
  t.set_requires_grad(true);
  return t;
}

Tensor values(const std::vector<float>& v, const Shape& shape) {
  return Tensor::from_vector(v, shape);
}

std::vector<float> grad_of(const Tensor& t) { return t.grad().to_vector<float>(); }

TEST(PartGradients, SplitPartsGatherIntoOneWhole) {
  Tensor x = param({1, 2, 3, 4, 5, 6}, {6});
  // L = 1*sum(x[0:2]) + 2*sum(x[2:5]) + 3*sum(x[5:6]): dL/dx = [1, 1, 2, 2, 2, 3]
  Tensor l = add(add(sum(narrow(x, 0, 0, 2)), scale(sum(narrow(x, 0, 2, 3)), 2.0)),
                 scale(sum(narrow(x, 0, 5, 1)), 3.0));
  l.backward();
  EXPECT_EQ(grad_of(x), (std::vector<float>{1, 1, 2, 2, 2, 3}));
}

TEST(PartGradients, UnusedPartsStayZeroAndOverlapsAdd) {
  Tensor x = param({1, 2, 3, 4, 5}, {5});
  // L = sum(x[1:3] * x[1:3]) + sum(x[2:4]): dL/dx = [0, 2*2, 2*3 + 1, 1, 0]
  Tensor a = narrow(x, 0, 1, 2);
  sum(add(sum(mul(a, a)), sum(narrow(x, 0, 2, 2)))).backward();
  EXPECT_EQ(grad_of(x), (std::vector<float>{0, 4, 7, 1, 0}));
}

TEST(PartGradients, APartBesideTheWholeInput) {
  Tensor x = param({1, 2, 3, 4}, {4});
  Tensor h = scale(x, 1.0);  // a non-leaf, so the part adds into mul's gradient of the whole
  // L = sum(h * h) + 5 * sum(h[1:3]): dL/dx = 2x + [0, 5, 5, 0]
  add(sum(mul(h, h)), scale(sum(narrow(h, 0, 1, 2)), 5.0)).backward();
  EXPECT_EQ(grad_of(x), (std::vector<float>{2, 9, 11, 8}));
}

TEST(PartGradients, PartsAlongAnInnerDim) {
  // x [2, 3], split along dim 1 into [2, 1] and [2, 2]; L = sum(q * w1) + sum(kv * w2)
  Tensor x = param({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor w1 = values({10, 20}, {2, 1});
  Tensor w2 = values({1, 2, 3, 4}, {2, 2});
  add(sum(mul(narrow(x, 1, 0, 1), w1)), sum(mul(narrow(x, 1, 1, 2), w2))).backward();
  EXPECT_EQ(grad_of(x), (std::vector<float>{10, 1, 2, 20, 3, 4}));
}

TEST(PartGradients, SharedGradientsAreCopiedNotWritten) {
  Tensor x = param({1, 2, 3}, {3}), x2 = param({4, 5, 6}, {3});
  Tensor h = scale(x, 1.0), w = scale(x2, 1.0);
  Tensor p = narrow(h, 0, 0, 2);  // made first, so its backward runs after add's
  Tensor z = add(h, w);           // add's backward hands one tensor to both h and w
  // L = sum(h + w) + 3 * sum(h[0:2]): the part must not write into the tensor w's gradient is.
  add(sum(z), scale(sum(p), 3.0)).backward();
  EXPECT_EQ(grad_of(x), (std::vector<float>{4, 4, 1}));
  EXPECT_EQ(grad_of(x2), (std::vector<float>{1, 1, 1}));
}

TEST(PartGradients, TheCallersGradientIsNotWritten) {
  Tensor x = param({1, 2, 3}, {3});
  Tensor y = scale(x, 1.0);
  Tensor part = narrow(y, 0, 1, 2);
  Tensor g_whole = values({1, 1, 1}, {3});
  Tensor g_part = values({10, 20}, {2});
  autograd::backward({y, part}, {g_whole, g_part});
  EXPECT_EQ(grad_of(x), (std::vector<float>{1, 11, 21}));
  EXPECT_EQ(g_whole.to_vector<float>(), (std::vector<float>{1, 1, 1}));  // still the caller's
}

TEST(PartGradients, LowPrecisionParts) {
  Tensor x = values({1, 2, 3, 4}, {4}).to(DType::kBF16);
  x.set_requires_grad(true);
  add(sum(narrow(x, 0, 0, 2)), scale(sum(narrow(x, 0, 1, 3)), 2.0)).backward();
  EXPECT_EQ(x.grad().dtype(), DType::kBF16);
  EXPECT_EQ(x.grad().to(DType::kF32).to_vector<float>(), (std::vector<float>{1, 3, 2, 2}));
}

}  // namespace
}  // namespace loom
