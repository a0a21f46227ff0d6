#include <gtest/gtest.h>

#include <limits>
#include <utility>
#include <vector>

#include "core/ops.h"
#include "core/tensor.h"
#include "testing/gradcheck.h"

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

// copy_ into views: a transposed 2-D view, a narrowed block of a 3-D tensor seen through two
// transposes (the KV cache's write), a column with a stride, each of every element size; the
// elements outside the view keep their values. On `device`; the expected values are built on
// the host by index arithmetic.
void expect_copy_into_views(Device device) {
  for (DType dt : {DType::kU8, DType::kBF16, DType::kF32, DType::kI64}) {
    SCOPED_TRACE(dtype_name(dt));
    // [4, 3] base; destination = base.transpose(0, 1) ([3, 4]).
    Tensor base = Tensor::arange(12).reshape({4, 3}).to(dt).to(device);
    Tensor src =
        add(Tensor::arange(12), Tensor::full({12}, 100.0)).reshape({3, 4}).to(dt).to(device);
    base.transpose(0, 1).copy_(src);
    std::vector<float> want(12);
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 4; ++j) want[size_t(j * 3 + i)] = float(100 + i * 4 + j);
    EXPECT_EQ(base.to(DType::kF32).to_vector<float>(), want);

    // [5, 2, 3] base; rows 1..3 along dim 0, seen as [2, 3, 3] through transposes.
    Tensor cube = Tensor::zeros({5, 2, 3}, dt, device);
    Tensor block = cube.narrow(0, 1, 3).transpose(0, 1).transpose(1, 2);  // [2, 3, 3]
    Tensor values = Tensor::arange(18).reshape({2, 3, 3}).to(dt).to(device);
    block.copy_(values);
    std::vector<float> cube_want(30, 0.0f);
    for (int a = 0; a < 2; ++a)      // block dim 0 = cube dim 1
      for (int b = 0; b < 3; ++b)    // block dim 1 = cube dim 2
        for (int c = 0; c < 3; ++c)  // block dim 2 = cube dim 0 - 1
          cube_want[size_t((c + 1) * 6 + a * 3 + b)] = float(a * 9 + b * 3 + c);
    EXPECT_EQ(cube.to(DType::kF32).to_vector<float>(), cube_want);

    // One column of [3, 4]: a stride of 4 in the only dim after narrowing.
    Tensor grid = Tensor::zeros({3, 4}, dt, device);
    grid.narrow(1, 2, 1).copy_(Tensor::full({3, 1}, 7.0, dt, device));
    EXPECT_EQ(grid.to(DType::kF32).to_vector<float>(),
              (std::vector<float>{0, 0, 7, 0, 0, 0, 7, 0, 0, 0, 7, 0}));
    // A source on the other device.
    grid.narrow(1, 0, 1).copy_(Tensor::full({3, 1}, 5.0, dt));
    EXPECT_EQ(grid.to(DType::kF32).to_vector<float>(),
              (std::vector<float>{5, 0, 7, 0, 5, 0, 7, 0, 5, 0, 7, 0}));
  }
}

TEST(Tensor, CopyIntoANonContiguousView) { expect_copy_into_views(Device::cpu()); }

TEST(Tensor, CudaCopyIntoANonContiguousView) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  expect_copy_into_views(Device::cuda(0));
}

// slice with a step is a view (PyTorch's t[a:b:step]); its gradient lands on the taken places,
// on the CPU and (when there is one) on a GPU; out-of-range slices are errors naming the dim.
void expect_slice_with_step(Device device) {
  Tensor x = Tensor::arange(20).reshape({4, 5}).to(device);
  x.set_requires_grad(true);
  Tensor s = slice(x, 1, 1, 2, 3);  // columns 1 and 4
  EXPECT_EQ(s.shape(), (Shape{4, 2}));
  EXPECT_EQ(s.strides(), (Shape{5, 3}));
  EXPECT_EQ(s.data_ptr(), static_cast<char*>(x.data_ptr()) + sizeof(float));
  EXPECT_EQ(s.to(Device::cpu()).to_vector<float>(),
            (std::vector<float>{1, 4, 6, 9, 11, 14, 16, 19}));
  sum(s).backward();
  std::vector<float> want(20, 0.0f);
  for (int r = 0; r < 4; ++r) want[size_t(r * 5 + 1)] = want[size_t(r * 5 + 4)] = 1.0f;
  EXPECT_EQ(x.grad().to(Device::cpu()).to_vector<float>(), want);
}

TEST(Tensor, SliceWithAStepIsAView) {
  expect_slice_with_step(Device::cpu());
  if (cuda_available()) expect_slice_with_step(Device::cuda(0));
  const Tensor x = Tensor::zeros({4, 5});
  EXPECT_EQ(slice(x, 1, 5, 0, 2).numel(), 0);
  try {
    slice(x, 1, 1, 3, 2);  // 1, 3, 5: past the end
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 elements from 1 with step 2 outside dim 1 of size 5"),
              std::string::npos)
        << e.what();
  }
}

TEST(Tensor, ViewOfANonContiguousTensorWhereTheStridesAllow) {
  // A part of a split along the last dim (nanoGPT's q.view(B, T, nh, hs)): [2, 3, 4] with
  // strides [36, 12, 1] viewed as [2, 3, 2, 2] shares memory with strides [36, 12, 2, 1].
  Tensor x = Tensor::arange(72).reshape({2, 3, 12});
  Tensor part = split(x, {4, 4, 4}, 2)[1];
  Tensor v = view(part, {2, 3, 2, 2});
  EXPECT_EQ(v.strides(), (Shape{36, 12, 2, 1}));
  EXPECT_EQ(v.data_ptr(), part.data_ptr());
  EXPECT_EQ(v.to_vector<float>(), part.contiguous().to_vector<float>());
  // Merging dims that are not evenly spaced has no view.
  try {
    view(part, {2, 12});
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no view of the tensor [2, 3, 4] (strides [36, 12, 1]) "
                                         "has the shape [2, 12]"),
              std::string::npos)
        << e.what();
  }
  // The transpose of a matrix viewed with a trailing 1 and a -1 (a size-1 dim's stride is
  // never stepped, so only the others are checked).
  Tensor t = Tensor::arange(6).reshape({2, 3}).transpose(0, 1);
  Tensor tv = view(t, {3, -1, 1});
  EXPECT_EQ(tv.shape(), (Shape{3, 2, 1}));
  EXPECT_EQ(tv.strides()[0], 1);
  EXPECT_EQ(tv.strides()[1], 3);
  EXPECT_EQ(tv.to_vector<float>(), t.contiguous().to_vector<float>());
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

// See Note [External storage]: a tensor over memory loom does not own (a numpy array's buffer).
TEST(Tensor, FromExternalSharesMemoryKeepsItsOwnerAndIsNotCounted) {
  auto buffer = std::make_shared<std::vector<float>>(std::vector<float>{1, 2, 3, 4, 5, 6});
  std::weak_ptr<std::vector<float>> alive = buffer;
  Allocator& a = allocator_for(Device::cpu());
  size_t before = a.live_bytes();
  {
    // The transpose of a row-major [2, 3]: shape [3, 2], strides (1, 3) in elements.
    Tensor t = Tensor::from_external(buffer->data(), {3, 2}, {1, 3}, DType::kF32, buffer);
    buffer.reset();  // the tensor alone keeps the memory alive now
    EXPECT_FALSE(alive.expired());
    EXPECT_EQ(a.live_bytes(), before);  // external bytes are not loom's
    EXPECT_FALSE(t.is_contiguous());
    EXPECT_TRUE(t.storage()->external());
    EXPECT_EQ(t.storage()->nbytes(), 6 * sizeof(float));
    EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
    // Writes through either side are seen by the other: no copy was made.
    alive.lock()->at(1) = 20;
    EXPECT_EQ(t.narrow(0, 1, 1).to_vector<float>(), (std::vector<float>{20, 5}));
    Tensor view = t.narrow(1, 1, 1);  // views share the external storage and its owner
    Tensor c = t.contiguous();        // a copy is loom's memory and is counted
    EXPECT_EQ(a.live_bytes(), before + 6 * sizeof(float));
    EXPECT_FALSE(c.storage()->external());
    t = Tensor();
    EXPECT_FALSE(alive.expired());  // `view` still uses it
    EXPECT_EQ(view.to_vector<float>(), (std::vector<float>{4, 5, 6}));
  }
  EXPECT_TRUE(alive.expired());  // the last tensor gone, the owner is dropped
  EXPECT_EQ(a.live_bytes(), before);
}

TEST(Tensor, FromExternalDifferentiatesAndRejectsBadInput) {
  std::vector<float> values{1, 2, 3};
  Tensor x =
      Tensor::from_external(values.data(), {3}, {1}, DType::kF32, nullptr).set_requires_grad(true);
  loom::sum(loom::mul(x, x)).backward();
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{2, 4, 6}));
  EXPECT_THROW(Tensor::from_external(values.data(), {3}, {}, DType::kF32, nullptr), Error);
  EXPECT_THROW(Tensor::from_external(values.data(), {3}, {-1}, DType::kF32, nullptr), Error);
  EXPECT_THROW(Tensor::from_external(nullptr, {3}, {1}, DType::kF32, nullptr), Error);
  EXPECT_EQ(Tensor::from_external(nullptr, {0, 4}, {4, 1}, DType::kF32, nullptr).numel(), 0);
  // ZeRO-3's release/materialize would free or replace memory loom does not own.
  try {
    x.storage()->release();
    FAIL() << "release() of external storage did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("external memory"), std::string::npos) << e.what();
  }
  EXPECT_THROW(x.storage()->materialize(), Error);
  EXPECT_FALSE(x.storage()->released());
}

TEST(Tensor, DtypeConversionRoundsToNearestEven) {
  Tensor t = Tensor::from_vector<float>({1.0f, 1.00390625f, -2.5f, 65504.0f}, {4});
  Tensor b = t.to(DType::kBF16);
  EXPECT_EQ(b.dtype(), DType::kBF16);
  // 1 + 2^-8 is halfway between two bf16 values; ties go to the even one, 1.0.
  EXPECT_EQ(b.to(DType::kF32).to_vector<float>(),
            (std::vector<float>{1.0f, 1.0f, -2.5f, 65536.0f}));
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

TEST(Tensor, CudaTensorWithoutAGpuIsAClearError) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present: this checks the error without one";
  try {
    Tensor::zeros({2}, DType::kF32, Device::cuda(0));
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cuda:0"), std::string::npos) << msg;
    EXPECT_TRUE(msg.find("device(s) present") != std::string::npos ||
                msg.find("without CUDA") != std::string::npos)
        << msg;
  }
  EXPECT_THROW(Device::parse("gpu:0"), Error);
  EXPECT_EQ(Device::parse("cuda:3"), Device::cuda(3));
}

TEST(Tensor, InPlaceDeviceMoveIsForLeavesOnly) {
  Tensor a = Tensor::from_vector<float>({1, 2}, {2}).set_requires_grad(true);
  a.to_(Device::cpu());  // already there: nothing changes
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{1, 2}));
  EXPECT_TRUE(a.requires_grad());
  Tensor b = mul(a, a);
  try {
    b.to_(Device::cpu());
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("only leaf tensors move in place"), std::string::npos)
        << e.what();
  }
  if (!cuda_available()) EXPECT_THROW(a.to_(Device::cuda(0)), Error);
}

TEST(Autograd, AddMulChainRule) {
  Tensor a = Tensor::from_vector<float>({1, 2, 3}, {3}).set_requires_grad(true);
  Tensor b = Tensor::from_vector<float>({4, 5, 6}, {3}).set_requires_grad(true);
  Tensor y = mul(add(a, b), a);  // (a + b) * a: d/da = 2a + b, d/db = a
  y.backward(Tensor::ones({3}));
  EXPECT_EQ(a.grad().to_vector<float>(), (std::vector<float>{6, 9, 12}));
  EXPECT_EQ(b.grad().to_vector<float>(), (std::vector<float>{1, 2, 3}));
}

TEST(Autograd, ShapeOpsMatchFiniteDifferences) {
  Tensor a = testing::random_tensor({2, 3, 4}, 1).set_requires_grad(true);
  Tensor b = testing::random_tensor({2, 2, 4}, 2).set_requires_grad(true);
  testing::expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        Tensor c = cat({in[0], in[1]}, 1);             // [2, 5, 4]
        Tensor t = c.transpose(0, 2).narrow(1, 1, 3);  // [4, 3, 2]
        std::vector<Tensor> parts = split(t.reshape({4, 6}), {2, 4}, 1);
        return mul(parts[1], parts[1]);  // [4, 4]
      },
      {a, b});
}

TEST(Autograd, BroadcastGradientSumsLeadingDims) {
  Tensor x = testing::random_tensor({3, 4}, 3).set_requires_grad(true);
  Tensor bias = testing::random_tensor({4}, 4).set_requires_grad(true);
  testing::expect_gradients_match(
      [](const std::vector<Tensor>& in) { return mul(sub(in[1], in[0]), add(in[0], in[1])); },
      {x, bias});
}

TEST(Autograd, GradReadyHookFiresOnceWithTheCompleteGradient) {
  Tensor w = Tensor::from_vector<float>({2}, {1}).set_requires_grad(true);
  int calls = 0;
  std::vector<float> seen;
  w.register_grad_ready_hook([&](const Tensor& p) {
    ++calls;
    seen = p.grad().to_vector<float>();
  });
  Tensor y = add(mul(w, w), scale(w, 3.0));  // dy/dw = 2w + 3 = 7, reached over three paths
  y.backward(Tensor::ones({1}));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, (std::vector<float>{7}));
}

TEST(Autograd, GradientsAccumulateAcrossBackwards) {
  Tensor w = Tensor::from_vector<float>({1, 2}, {2}).set_requires_grad(true);
  scale(w, 2.0).backward(Tensor::ones({2}));
  scale(w, 3.0).backward(Tensor::ones({2}));
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{5, 5}));
}

TEST(Autograd, MultiOutputBackwardForAPipelineStage) {
  Tensor x = Tensor::from_vector<float>({1, 2}, {2}).set_requires_grad(true);
  Tensor y1 = scale(x, 2.0), y2 = mul(x, x);
  autograd::backward({y1, y2}, {Tensor::ones({2}), Tensor::from_vector<float>({10, 100}, {2})});
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{2 + 20, 2 + 400}));
}

TEST(Autograd, NoGradGuardRecordsNothing) {
  Tensor x = Tensor::ones({2}).set_requires_grad(true);
  NoGradGuard guard;
  Tensor y = mul(x, x);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_THROW(y.backward(Tensor::ones({2})), Error);
}

TEST(Autograd, CheckpointGivesTheSameGradients) {
  Tensor x1 = testing::random_tensor({5}, 5).set_requires_grad(true);
  Tensor x2 = x1.detach().clone().set_requires_grad(true);
  Tensor w1 = testing::random_tensor({5}, 6).set_requires_grad(true);
  Tensor w2 = w1.detach().clone().set_requires_grad(true);
  auto region = [](const Tensor& x, const Tensor& w) { return mul(mul(x, w), add(x, w)); };
  region(x1, w1).backward(Tensor::ones({5}));
  Tensor y =
      autograd::checkpoint([&](const std::vector<Tensor>& in) { return region(in[0], w2); }, {x2});
  EXPECT_EQ(y.grad_fn()->name(), "checkpoint");
  y.backward(Tensor::ones({5}));
  EXPECT_EQ(x2.grad().to_vector<float>(), x1.grad().to_vector<float>());
  EXPECT_EQ(w2.grad().to_vector<float>(), w1.grad().to_vector<float>());
}

TEST(Autograd, SecondBackwardThroughFreedGraphIsAnError) {
  Tensor x = Tensor::ones({2}).set_requires_grad(true);
  Tensor y = mul(x, x);
  y.backward(Tensor::ones({2}));
  EXPECT_THROW(y.backward(Tensor::ones({2})), Error);
}

// An element count past int64 (the loom.zeros(2**62 + 1, 4)) is an error, never a small
// allocation under a huge shape; so are byte counts past it, and views reaching past it. A zero
// size makes any other sizes legal (no elements).
TEST(Tensor, ShapesThatOverflowAreRefused) {
  const int64_t big = (int64_t(1) << 62) + 1;
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{
           {big, 4}, {big, 2, 2}, {int64_t(1) << 32, int64_t(1) << 32}}) {
    try {
      (void)Tensor::empty(shape);
      ADD_FAILURE() << shape_str(shape) << " was allocated";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("more elements than an int64 counts"), std::string::npos)
          << e.what();
    }
  }
  // 2^61 f32 elements count, but their bytes do not.
  EXPECT_THROW((void)Tensor::empty({int64_t(1) << 61}, DType::kF32), Error);
  EXPECT_EQ(Tensor::empty({0, big, big}).numel(), 0);
  float x = 0;
  EXPECT_THROW((void)Tensor::from_external(&x, {2, 2}, {int64_t(1) << 62, int64_t(1) << 62},
                                           DType::kF32, nullptr),
               Error);
}

// A narrow whose start + length overflows int64 is refused, never a view outside the storage
// (found by tests/robustness/replay.py: narrow(0, 2^63 - 1, 2) of 5 elements viewed the element
// before the data, and fill_ on it corrupted the heap).
TEST(Tensor, NarrowRangesThatOverflowAreRefused) {
  const Tensor x = Tensor::zeros({5});
  const int64_t max = std::numeric_limits<int64_t>::max();
  for (const auto& [start, length] : std::vector<std::pair<int64_t, int64_t>>{
           {max, 2}, {int64_t(1) << 62, int64_t(1) << 62}, {2, max}, {6, 0}, {5, 1}}) {
    EXPECT_THROW((void)narrow(x, 0, start, length), Error) << start << ", " << length;
  }
  EXPECT_EQ(narrow(x, 0, 5, 0).numel(), 0);  // an empty range at the end is fine
  EXPECT_EQ(narrow(x, 0, 1, 4).numel(), 4);
}

}  // namespace
}  // namespace loom
