// In-place writes recorded by autograd (See Note [In-place ops and views] in core/autograd.h):
// a write of a tensor or of one of its views rebases the history as PyTorch does, so the
// gradients are those of the same computation written out of place (closed forms below), views
// made before a write rebuild their history from their root's, and what cannot be recorded (a
// leaf that requires grad, a view whose root was freed) is refused naming why.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "testing/files.h"

namespace loom {
namespace {

using autograd::assign_in_place;
using testing::expect_error;

Tensor param(const std::vector<float>& values, const Shape& shape) {
  Tensor t = Tensor::from_vector(values, shape);
  t.set_requires_grad(true);
  return t;
}

std::vector<float> grad_of(const Tensor& t) { return t.grad().to_vector<float>(); }

TEST(InPlace, WriteOfANonLeafRebasesItsHistory) {
  Tensor x = param({1, 2, 3}, {3});
  Tensor y = param({4, 5, 6}, {3});
  Tensor h = scale(x, 2.0);
  assign_in_place(h, add(h, y), "add_");  // h = 2x + y = [6, 9, 12]
  EXPECT_EQ(h.to_vector<float>(), (std::vector<float>{6, 9, 12}));
  EXPECT_FALSE(h.is_leaf());
  sum(mul(h, h)).backward();  // dL/dh = 2h; dL/dx = 4h, dL/dy = 2h
  EXPECT_EQ(grad_of(x), (std::vector<float>{24, 36, 48}));
  EXPECT_EQ(grad_of(y), (std::vector<float>{12, 18, 24}));
}

TEST(InPlace, ConstantWriteGivesTheOldHistoryZeroGradient) {
  Tensor x = param({1, 2}, {2});
  Tensor h = scale(x, 3.0);
  assign_in_place(h, Tensor::full({2}, 5.0), "fill_");
  EXPECT_TRUE(h.requires_grad());
  sum(mul(h, x)).backward();  // h is constant 5 now: dL/dx = h = 5 (and 0 through h)
  EXPECT_EQ(grad_of(x), (std::vector<float>{5, 5}));
}

TEST(InPlace, WriteThroughAViewRebasesTheRoot) {
  Tensor x = param({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor y = param({7, 8, 9}, {1, 3});
  Tensor h = scale(x, 1.0);
  Tensor row0 = h.narrow(0, 0, 1);
  assign_in_place(row0, y, "copy_");  // h = [y; x row 1]
  EXPECT_EQ(h.to_vector<float>(), (std::vector<float>{7, 8, 9, 4, 5, 6}));
  sum(mul(h, h)).backward();
  EXPECT_EQ(grad_of(x), (std::vector<float>{0, 0, 0, 8, 10, 12}));
  EXPECT_EQ(grad_of(y), (std::vector<float>{14, 16, 18}));
}

TEST(InPlace, ViewsMadeBeforeAWriteRebuildTheirHistory) {
  Tensor x = param({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor y = param({7, 8, 9}, {1, 3});
  Tensor h = scale(x, 1.0);
  Tensor column1 = h.narrow(1, 1, 1);  // [2, 5] now; its row 0 is written below
  Tensor row0 = h.narrow(0, 0, 1);
  assign_in_place(row0, mul(y, row0.clone()), "mul_");  // h row 0 = y * x row 0 = [7, 16, 27]
  EXPECT_EQ(column1.to_vector<float>(), (std::vector<float>{16, 5}));
  sum(column1).backward();  // d/dy = [0, x01, 0], d/dx = [0, y1, 0; 0, 1, 0]
  EXPECT_EQ(grad_of(y), (std::vector<float>{0, 2, 0}));
  EXPECT_EQ(grad_of(x), (std::vector<float>{0, 8, 0, 0, 1, 0}));
}

TEST(InPlace, WriteOfARootRebuildsItsViews) {
  Tensor x = param({1, 2, 3, 4}, {2, 2});
  Tensor y = param({10, 20, 30, 40}, {2, 2});
  Tensor h = scale(x, 1.0);
  Tensor transposed = h.transpose(0, 1);
  assign_in_place(h, mul(h.clone(), y), "mul_");  // h = x * y
  sum(mul(transposed, Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2}))).backward();
  // transposed[i][j] = h[j][i] weighted by w[i][j]: dL/dh[j][i] = w[i][j] = [[1, 3], [2, 4]]
  EXPECT_EQ(grad_of(x), (std::vector<float>{10, 60, 60, 160}));
  EXPECT_EQ(grad_of(y), (std::vector<float>{1, 6, 6, 16}));
}

TEST(InPlace, ABufferWithoutGradGainsTheValuesHistory) {
  Tensor y = param({3, 4}, {1, 2});
  Tensor buffer = Tensor::zeros({2, 2});
  Tensor row1 = buffer.narrow(0, 1, 1);
  assign_in_place(row1, scale(y, 2.0), "t[...] = value");
  EXPECT_TRUE(buffer.requires_grad());
  EXPECT_FALSE(buffer.is_leaf());
  sum(mul(buffer, buffer)).backward();  // buffer row 1 = 2y: dL/dy = 8y
  EXPECT_EQ(grad_of(y), (std::vector<float>{24, 32}));
}

TEST(InPlace, StridedViewWritesReachTheirPlaces) {
  Tensor x = param({1, 2, 3, 4, 5, 6}, {6});
  Tensor y = param({10, 20, 30}, {3});
  Tensor h = scale(x, 1.0);
  Tensor even = slice(h, 0, 0, 3, 2);
  assign_in_place(even, y, "t[::2] = value");
  EXPECT_EQ(h.to_vector<float>(), (std::vector<float>{10, 2, 20, 4, 30, 6}));
  sum(mul(h, Tensor::arange(6))).backward();
  EXPECT_EQ(grad_of(x), (std::vector<float>{0, 1, 0, 3, 0, 5}));
  EXPECT_EQ(grad_of(y), (std::vector<float>{0, 2, 4}));
}

TEST(InPlace, UnrecordedWritesStayPlainCopies) {
  Tensor x = param({1, 2}, {2});
  {
    NoGradGuard no_grad;
    assign_in_place(x, Tensor::full({2}, 7.0), "copy_");  // an optimizer-style update
  }
  EXPECT_TRUE(x.is_leaf());
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{7, 7}));
  Tensor counts = Tensor::zeros({2}, DType::kI64);
  assign_in_place(counts, Tensor::full({2}, 3.0), "copy_");  // integers: never recorded
  EXPECT_EQ(counts.to_vector<int64_t>(), (std::vector<int64_t>{3, 3}));
  EXPECT_FALSE(counts.requires_grad());
}

TEST(InPlace, RefusesWhatCannotBeRecorded) {
  Tensor x = param({1, 2, 3}, {3});
  expect_error([&] { assign_in_place(x, Tensor::zeros({3}), "add_"); },
               {"add_: Tensor[3] f32 cpu is a leaf that requires grad", "no_grad"});
  Tensor part = x.narrow(0, 0, 2);
  expect_error([&] { assign_in_place(part, Tensor::zeros({2}), "mul_"); },
               {"mul_:", "is a view of Tensor[3] f32 cpu, a leaf that requires grad"});
  Tensor h = scale(x, 1.0);
  expect_error([&] { assign_in_place(h, Tensor::zeros({2}), "copy_"); },
               {"copy_: a value of shape [2] cannot be written into Tensor[3] f32 cpu"});
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{1, 2, 3}));  // nothing was written
}

TEST(InPlace, SavedValuesWrittenLaterStillRaiseAtBackward) {
  Tensor x = param({1, 2}, {2});
  Tensor h = sigmoid(x);  // sigmoid keeps its output for backward
  assign_in_place(h, add(h, Tensor::ones({2})), "add_");
  expect_error([&] { sum(h).backward(); },
               {"backward of sigmoid", "modified by an in-place operation"});
}

TEST(InPlace, AStaleViewOfAFreedRootSaysSo) {
  Tensor x = param({1, 2, 3, 4}, {4});
  Tensor h = scale(x, 1.0);
  Tensor first = h.narrow(0, 0, 2);
  Tensor last = h.narrow(0, 2, 2);
  assign_in_place(first, Tensor::zeros({2}), "zero_");  // h's history rebased: `last` is stale
  h = Tensor();                                         // and its root gone
  expect_error([&] { (void)last.requires_grad(); },
               {"is a view of a tensor that was written in place", "has since been freed"});
}

TEST(InPlace, AViewWhoseRootWasFreedBecomesARoot) {
  Tensor x = param({1, 2, 3, 4}, {2, 2});
  Tensor h = scale(x, 1.0).reshape({4});  // the reshape's input is gone: nothing else sees h
  assign_in_place(h, mul(h.clone(), h.clone()), "mul_");
  sum(h).backward();
  EXPECT_EQ(grad_of(x), (std::vector<float>{2, 4, 6, 8}));
}

}  // namespace
}  // namespace loom
