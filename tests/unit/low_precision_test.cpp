// bf16 and f16 through every op and module. Note [Low-precision compute] defines the result of an
// op on bf16/f16 inputs as the f32 op on the same values rounded to that dtype, and an input's
// gradient as the f32 gradient rounded to the input's dtype, so the op tests compare exactly
// (inputs are drawn representable in the low-precision dtype). The GPT tests compare the loss of
// a model cast with Module::to against the f32 model within a tolerance derived from the format.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/nn/nn.h"
#include "core/ops.h"
#include "testing/files.h"
#include "testing/gradcheck.h"

namespace loom {
namespace {

using testing::expect_error;
using testing::random_tensor;

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

std::vector<float> values(const Tensor& t) { return t.detach().to(DType::kF32).to_vector<float>(); }

// Uniform values in [lo, hi) rounded to `dtype`, held in f32 (so exactly representable in both).
Tensor representable(const Shape& shape, uint64_t seed, DType dtype, float lo = -1.0f,
                     float hi = 1.0f) {
  return random_tensor(shape, seed, lo, hi).to(dtype).to(DType::kF32);
}

// One floating input of an op under test: its f32 value (representable in the dtype tested) and
// whether the op gets it in the low-precision dtype (true) or in f32 (a mixed call).
struct Input {
  Tensor value;
  bool low = true;
};

// The definition, checked exactly: fn on the inputs (the `low` ones in `dtype`) has dtype
// `out_dtype` and the values of fn on the f32 inputs rounded to `out_dtype`; after a backward
// from the same upstream gradient, every input's gradient has that input's dtype and the values
// of the f32 gradient rounded to it.
void expect_matches_f32(const Fn& fn, const std::vector<Input>& inputs, DType dtype,
                        DType out_dtype) {
  std::vector<Tensor> ref, low;
  for (const Input& in : inputs) {
    Tensor r = in.value.to(dtype).to(DType::kF32);  // a fresh leaf, representable in dtype
    r.set_requires_grad(true);
    Tensor l = in.low ? r.detach().to(dtype) : r.detach().clone();
    l.set_requires_grad(true);
    ref.push_back(r);
    low.push_back(l);
  }
  Tensor out_ref = fn(ref), out = fn(low);
  ASSERT_EQ(out.dtype(), out_dtype) << out.str();
  ASSERT_EQ(out.shape(), out_ref.shape());
  EXPECT_EQ(values(out), values(out_ref.to(out_dtype)));

  Tensor g = random_tensor(out.shape(), 99).to(out_dtype);  // the same upstream gradient
  out_ref.backward(g.to(DType::kF32));
  out.backward(g);
  for (size_t i = 0; i < low.size(); ++i) {
    SCOPED_TRACE("input " + std::to_string(i));
    ASSERT_TRUE(low[i].grad().defined());
    EXPECT_EQ(low[i].grad().dtype(), low[i].dtype());
    EXPECT_EQ(values(low[i].grad()), values(ref[i].grad().to(low[i].dtype())));
  }
}

std::vector<Input> all_low(const std::vector<Tensor>& values) {
  std::vector<Input> in;
  for (const Tensor& v : values) in.push_back({v, true});
  return in;
}

class LowPrecision : public ::testing::TestWithParam<DType> {
 protected:
  DType dt() const { return GetParam(); }
  // Input i of a test: values in [-1, 1) representable in the dtype under test.
  Tensor in(const Shape& shape, uint64_t seed) const { return representable(shape, seed, dt()); }
  void check(const Fn& fn, const std::vector<Tensor>& inputs) const {
    expect_matches_f32(fn, all_low(inputs), dt(), dt());
  }
};

// ---------------------------------------------------------------- elementwise

TEST_P(LowPrecision, AddSubMul) {
  for (auto op : {add, sub, mul}) {
    check([&](const std::vector<Tensor>& x) { return op(x[0], x[1]); },
          {in({3, 4}, 1), in({3, 4}, 2)});
    // broadcast over leading dims, the shorter operand on either side
    check([&](const std::vector<Tensor>& x) { return op(x[0], x[1]); },
          {in({2, 3, 4}, 3), in({4}, 4)});
    check([&](const std::vector<Tensor>& x) { return op(x[0], x[1]); },
          {in({3, 4}, 5), in({2, 3, 4}, 6)});
    // mixed: an f32 operand keeps an f32 gradient, the result is low precision
    expect_matches_f32([&](const std::vector<Tensor>& x) { return op(x[0], x[1]); },
                       {{in({2, 3, 4}, 7), true}, {in({4}, 8), false}}, dt(), dt());
    expect_matches_f32([&](const std::vector<Tensor>& x) { return op(x[0], x[1]); },
                       {{in({3, 4}, 9), false}, {in({3, 4}, 10), true}}, dt(), dt());
  }
}

TEST_P(LowPrecision, ScaleAndGelu) {
  check([](const std::vector<Tensor>& x) { return scale(x[0], 0.37); }, {in({5, 3}, 11)});
  check([](const std::vector<Tensor>& x) { return gelu(x[0]); },
        {representable({4, 6}, 12, dt(), -4.0f, 4.0f)});
}

// ---------------------------------------------------------------- reductions

TEST_P(LowPrecision, SumAndMean) {
  // The whole-tensor forms round their f32 result to the input's dtype like every other op.
  check([](const std::vector<Tensor>& x) { return sum(x[0]); }, {in({7, 9}, 13)});
  check([](const std::vector<Tensor>& x) { return mean(x[0]); }, {in({7, 9}, 14)});
  check([](const std::vector<Tensor>& x) { return sum(x[0], 1); }, {in({3, 5, 4}, 15)});
  check([](const std::vector<Tensor>& x) { return mean(x[0], -1, true); }, {in({3, 5, 4}, 16)});
}

// ---------------------------------------------------------------- linear algebra

TEST_P(LowPrecision, Matmul) {
  auto mm = [](bool ta, bool tb) {
    return [ta, tb](const std::vector<Tensor>& x) { return matmul(x[0], x[1], ta, tb); };
  };
  check(mm(false, false), {in({2, 3, 4}, 21), in({4, 5}, 22)});  // shared b
  check(mm(false, true), {in({2, 3, 4}, 23), in({5, 4}, 24)});
  check(mm(true, false), {in({2, 4, 3}, 25), in({4, 5}, 26)});
  check(mm(true, true), {in({2, 4, 3}, 27), in({2, 5, 4}, 28)});  // batched b
  // a transposed view (the k^T of attention)
  check([](const std::vector<Tensor>& x) { return matmul(x[0], transpose(x[1], -1, -2)); },
        {in({2, 3, 4}, 29), in({2, 5, 4}, 30)});
  expect_matches_f32(mm(false, false), {{in({3, 4}, 31), true}, {in({4, 2}, 32), false}}, dt(),
                     dt());
}

TEST_P(LowPrecision, Linear) {
  check([](const std::vector<Tensor>& x) { return linear(x[0], x[1], x[2]); },
        {in({2, 3, 4}, 41), in({5, 4}, 42), in({5}, 43)});
  check([](const std::vector<Tensor>& x) { return linear(x[0], x[1]); },
        {in({3, 4}, 44), in({5, 4}, 45)});
  // bf16 activations against f32 weight and bias (f32 master parameters used directly)
  expect_matches_f32([](const std::vector<Tensor>& x) { return linear(x[0], x[1], x[2]); },
                     {{in({2, 3, 4}, 46), true}, {in({5, 4}, 47), false}, {in({5}, 48), false}},
                     dt(), dt());
}

// ---------------------------------------------------------------- neural-network functions

TEST_P(LowPrecision, Softmax) {
  check([](const std::vector<Tensor>& x) { return softmax(x[0]); },
        {representable({3, 2, 7}, 51, dt(), -3.0f, 3.0f)});
}

TEST_P(LowPrecision, LayerNorm) {
  check([](const std::vector<Tensor>& x) { return layer_norm(x[0], x[1], x[2]); },
        {in({2, 3, 8}, 52), in({8}, 53), in({8}, 54)});
  check([](const std::vector<Tensor>& x) { return layer_norm(x[0], Tensor(), Tensor()); },
        {in({4, 8}, 55)});
  expect_matches_f32([](const std::vector<Tensor>& x) { return layer_norm(x[0], x[1], x[2]); },
                     {{in({2, 8}, 56), true}, {in({8}, 57), false}, {in({8}, 58), false}}, dt(),
                     dt());
}

TEST_P(LowPrecision, ScaledDotProductAttention) {
  for (bool causal : {true, false}) {
    check(
        [causal](const std::vector<Tensor>& x) {
          return scaled_dot_product_attention(x[0], x[1], x[2], causal);
        },
        {in({2, 2, 5, 4}, 61), in({2, 2, 5, 4}, 62), in({2, 2, 5, 4}, 63)});
  }
}

TEST_P(LowPrecision, CrossEntropyReturnsAnF32Loss) {
  const Tensor targets = Tensor::from_vector<int64_t>({0, 5, -100, 2, 4, 1}, {6});
  CrossEntropyOptions options;
  options.num_classes = 6;
  const Fn fn = [&](const std::vector<Tensor>& x) { return cross_entropy(x[0], targets, options); };
  // The loss stays f32 (out_dtype); the logits' gradient comes back in the logits' dtype.
  expect_matches_f32(fn, {{representable({6, 8}, 64, dt(), -3.0f, 3.0f), true}}, dt(), DType::kF32);
  EXPECT_EQ(targets.dtype(), DType::kI64);
}

TEST_P(LowPrecision, Embedding) {
  for (DType index : {DType::kI32, DType::kI64}) {
    const Tensor idx = Tensor::from_vector<int64_t>({3, 0, 3, 5, 1, 3}, {2, 3}).to(index);
    // the gradient scatter-adds row 3 three times, in f32, then rounds
    check([&](const std::vector<Tensor>& x) { return embedding(x[0], idx); }, {in({6, 4}, 71)});
  }
}

TEST_P(LowPrecision, Dropout) {
  const DropoutKey key{5, 2, 17};
  check([&](const std::vector<Tensor>& x) { return dropout(x[0], 0.3, true, key); },
        {in({4, 9}, 72)});
  // the identity cases return the input itself, still low precision
  Tensor x = in({3}, 73).to(dt());
  EXPECT_TRUE(dropout(x, 0.3, false, key).same_as(x));
  EXPECT_TRUE(dropout(x, 0.0, true, key).same_as(x));
}

// ---------------------------------------------------------------- shape ops

TEST_P(LowPrecision, ViewsAreDtypeAgnostic) {
  Tensor x = in({2, 3, 4}, 81).to(dt());
  for (const Tensor& v : {reshape(x, {6, 4}), transpose(x, 0, 2), narrow(x, 1, 1, 2)}) {
    EXPECT_EQ(v.dtype(), dt());
    EXPECT_EQ(v.storage(), x.storage()) << "a view must not copy";
  }
  EXPECT_EQ(values(transpose(x, 0, 2).contiguous()),
            values(transpose(x.to(DType::kF32), 0, 2).contiguous()));
  // values and gradients through each view (and a reshape of a non-contiguous view, which copies)
  check([](const std::vector<Tensor>& t) { return reshape(t[0], {4, -1}); }, {in({2, 3, 4}, 82)});
  check([](const std::vector<Tensor>& t) { return transpose(t[0], 0, 2); }, {in({2, 3, 4}, 83)});
  check(
      [](const std::vector<Tensor>& t) {
        return reshape(transpose(t[0], 0, 1), {12, 2});
      },
      {in({2, 3, 4}, 84)});
  check([](const std::vector<Tensor>& t) { return narrow(t[0], 2, 1, 2); }, {in({2, 3, 4}, 85)});
  check(
      [](const std::vector<Tensor>& t) {
        std::vector<Tensor> p = split(t[0], {1, 3}, 2);
        return cat({p[1], p[0]}, 2);  // cat of one dtype: a byte copy
      },
      {in({2, 3, 4}, 86)});
  check(
      [](const std::vector<Tensor>& t) {
        std::vector<Tensor> c = chunk(t[0], 3, 1);
        return cat({c[2], c[0]}, 1);
      },
      {in({2, 3, 4}, 87)});
}

TEST_P(LowPrecision, CatOfMixedDtypes) {
  const Fn fn = [](const std::vector<Tensor>& x) { return cat({x[0], x[1], x[2]}, 1); };
  expect_matches_f32(fn, {{in({2, 3}, 88), true}, {in({2, 1}, 89), false}, {in({2, 2}, 90), true}},
                     dt(), dt());
  expect_matches_f32(fn, {{in({2, 3}, 91), false}, {in({2, 1}, 92), true}, {in({2, 2}, 93), false}},
                     dt(), dt());
}

// ---------------------------------------------------------------- in-place and no-autograd ops

TEST_P(LowPrecision, AddInPlaceRoundsBackIntoX) {
  const Tensor xv = in({5, 3}, 101), yv = in({5, 3}, 102);
  Tensor expected = xv.clone();
  add_(expected, yv, -0.7);  // in f32
  for (bool y_low : {true, false}) {
    Tensor x = xv.to(dt());
    const void* memory = x.data_ptr();
    add_(x, y_low ? yv.to(dt()) : yv, -0.7);
    EXPECT_EQ(x.dtype(), dt());
    EXPECT_EQ(x.data_ptr(), memory) << "add_ must write into x";
    EXPECT_EQ(values(x), values(expected.to(dt()))) << "y low: " << y_low;
  }
  // an f32 x stays f32 and takes the bf16/f16 y as its f32 values
  Tensor x32 = xv.clone();
  add_(x32, yv.to(dt()), -0.7);
  EXPECT_EQ(x32.dtype(), DType::kF32);
  EXPECT_EQ(values(x32), values(expected));
}

TEST_P(LowPrecision, ScaleInPlaceAndSumOfSquares) {
  const Tensor xv = in({4, 6}, 103);
  Tensor expected = xv.clone();
  scale_(expected, 0.3);
  Tensor x = xv.to(dt());
  scale_(x, 0.3);
  EXPECT_EQ(x.dtype(), dt());
  EXPECT_EQ(values(x), values(expected.to(dt())));
  EXPECT_EQ(sum_of_squares(xv.to(dt())), sum_of_squares(xv));  // the upcast is exact
}

// ---------------------------------------------------------------- autograd and tensors

TEST_P(LowPrecision, GradientAccumulatesIntoALowPrecisionLeaf) {
  const Tensor av = in({6}, 111), bv = in({6}, 112), wv = in({6}, 113);
  Tensor w = wv.to(dt()).set_requires_grad(true);
  // w is used twice: the engine sums its two (rounded) gradients a and b in dt.
  Tensor loss = add(sum(mul(w, av)), sum(mul(w, bv)));
  loss.backward();
  const Tensor once = add(av.to(dt()), bv.to(dt()));
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().dtype(), dt());
  EXPECT_EQ(values(w.grad()), values(once));
  // a second backward accumulates into the existing gradient (AccumulateGrad's add_)
  add(sum(mul(w, av)), sum(mul(w, bv))).backward();
  EXPECT_EQ(w.grad().dtype(), dt());
  EXPECT_EQ(values(w.grad()), values(add(once, once)));
}

TEST_P(LowPrecision, CreationFillAndCopy) {
  const float third = float(1.0 / 3.0);
  const float rounded = values(Tensor::full({1}, third).to(dt()))[0];
  EXPECT_NE(rounded, third);  // a value the format must round
  EXPECT_EQ(values(Tensor::zeros({3}, dt())), std::vector<float>(3, 0.0f));
  EXPECT_EQ(values(Tensor::ones({2}, dt())), std::vector<float>(2, 1.0f));
  EXPECT_EQ(values(Tensor::full({2, 2}, 1.0 / 3.0, dt())), std::vector<float>(4, rounded));
  Tensor t = Tensor::empty({4}, dt());
  t.fill_(-2.5);
  EXPECT_EQ(values(t), std::vector<float>(4, -2.5f));
  EXPECT_EQ(Tensor::scalar(1.0 / 3.0, dt()).item(), double(rounded));
  // copy_ into a non-contiguous destination of the same dtype
  Tensor src = in({3, 2}, 114).to(dt());
  Tensor dst = Tensor::zeros({2, 3}, dt());
  Tensor dst_t = transpose(dst, 0, 1);
  dst_t.copy_(src);
  EXPECT_EQ(values(dst), values(transpose(src, 0, 1).contiguous()));
}

TEST_P(LowPrecision, F32InputsTakeTheF32Path) {
  Tensor a = Tensor::ones({3}).set_requires_grad(true);
  EXPECT_EQ(add(a, a).grad_fn()->name(), "add");  // no conversions recorded
  Tensor b = Tensor::ones({3}, dt()).set_requires_grad(true);
  EXPECT_EQ(add(b, b).grad_fn()->name(), "to_dtype");  // the rounding of the f32 result
}

// ---------------------------------------------------------------- errors

TEST(LowPrecisionErrors, Bf16WithF16NamesTheOpAndBothDtypes) {
  const Tensor h = Tensor::zeros({2, 2}, DType::kBF16), f = Tensor::zeros({2, 2}, DType::kF16);
  const Tensor x = Tensor::zeros({2, 2});
  expect_error([&] { add(h, f); }, {"add", "'a'", "bf16", "'b'", "f16", "do not mix"});
  EXPECT_EQ(mul(x, f).dtype(), DType::kF16);  // f32 with either is fine
  expect_error([&] { matmul(f, h); }, {"matmul", "'a'", "f16", "'b'", "bf16"});
  expect_error([&] { linear(h, x, Tensor::zeros({2}, DType::kF16)); },
               {"linear", "'x'", "bf16", "'bias'", "f16"});
  expect_error([&] { layer_norm(h, Tensor(), Tensor::zeros({2}, DType::kF16)); },
               {"layer_norm", "'x'", "'bias'", "bf16", "f16"});
  expect_error(
      [&] {
        scaled_dot_product_attention(Tensor::zeros({1, 1, 2, 2}, DType::kF16),
                                     Tensor::zeros({1, 1, 2, 2}),
                                     Tensor::zeros({1, 1, 2, 2}, DType::kBF16));
      },
      {"scaled_dot_product_attention", "'q'", "f16", "'v'", "bf16"});
  expect_error([&] { cat({h, x, f}, 0); }, {"cat", "'xs[0]'", "bf16", "'xs[2]'", "f16"});
  Tensor dst = h.clone();
  expect_error([&] { add_(dst, f); }, {"add_", "'x'", "bf16", "'y'", "f16"});
}

TEST(LowPrecisionErrors, IntegerInputsPromoteOrAreRefused) {
  const Tensor i = Tensor::full({2, 2}, 3.0, DType::kI32), h = Tensor::zeros({2, 2}, DType::kBF16);
  // add promotes the integer operand to bf16 (Note [Integer operands]); cat and add_ refuse.
  const Tensor sum = add(h, i);
  EXPECT_EQ(sum.dtype(), DType::kBF16);
  EXPECT_EQ(sum.to(DType::kF32).to_vector<float>(), (std::vector<float>{3, 3, 3, 3}));
  expect_error([&] { cat({h, i}, 0); }, {"cat", "'xs[1]'", "i32"});
  Tensor dst = h.clone();
  expect_error([&] { add_(dst, i); }, {"add_", "'y'", "i32"});
}

// ---------------------------------------------------------------- Module::to

GptConfig tiny_gpt_config() {  // as tests/mpi/dp_reference.h
  GptConfig c;
  c.max_seq_len = 8;
  c.vocab = 29;
  c.padded_vocab = 32;
  c.layers = 2;
  c.heads = 2;
  c.channels = 16;
  return c;
}

// [2, 8] token ids and their next-token targets.
std::pair<Tensor, Tensor> token_batch() {
  std::vector<int64_t> idx, tgt;
  for (int64_t i = 0; i < 16; ++i) {
    idx.push_back((7 * i + 3) % 29);
    tgt.push_back((7 * i + 10) % 29);
  }
  return {Tensor::from_vector(idx, {2, 8}), Tensor::from_vector(tgt, {2, 8})};
}

TEST_P(LowPrecision, ModuleToCastsAGptInPlace) {
  nn::GPT model(tiny_gpt_config());
  model.init_parameters(1234);
  const auto before = model.named_parameters();
  auto [idx, tgt] = token_batch();
  model.loss(idx, tgt).backward();  // a gradient to be dropped
  const std::vector<float> wte_f32 = values(model.wte->weight);

  model.to(dt());
  const auto after = model.named_parameters();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    SCOPED_TRACE(after[i].first);
    EXPECT_EQ(after[i].first, before[i].first);
    EXPECT_TRUE(after[i].second.same_as(before[i].second)) << "the parameter must stay the same";
    EXPECT_EQ(before[i].second.dtype(), dt());  // so a handle taken earlier sees the cast
    EXPECT_TRUE(after[i].second.requires_grad());
    EXPECT_TRUE(after[i].second.is_leaf());
    EXPECT_FALSE(after[i].second.grad().defined()) << "the f32 gradient must be dropped";
  }
  EXPECT_EQ(values(model.wte->weight), values(Tensor::from_vector(wte_f32, {32, 16}).to(dt())));

  Tensor loss = model.loss(idx, tgt);
  EXPECT_EQ(loss.dtype(), DType::kF32);  // cross_entropy's loss stays f32
  loss.backward();
  for (const auto& [name, p] : model.named_parameters()) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(p.grad().defined());
    EXPECT_EQ(p.grad().dtype(), dt());
  }

  // Against the f32 model. bf16 keeps 8 significant bits, so one rounding is a relative error of
  // at most u = 2^-9 (f16: 11 bits, u = 2^-12). The parameters and every op's result are rounded;
  // these errors are independent and do not add up to their count, and we allow 4u relative to
  // the largest logit for the logits (observed: about 2u) and 4u of the loss for the loss (observed
  // far less: at initialisation the logits are small and the loss, near ln(29), hardly depends
  // on them).
  const double u = std::ldexp(1.0, dt() == DType::kBF16 ? -9 : -12);
  nn::GPT reference(tiny_gpt_config());
  reference.init_parameters(1234);
  const std::vector<float> logits_f32 = values(reference(idx)), logits = values(model(idx));
  float largest = 0.0f, error = 0.0f;
  for (size_t i = 0; i < logits.size(); ++i) {
    largest = std::max(largest, std::abs(logits_f32[i]));
    error = std::max(error, std::abs(logits[i] - logits_f32[i]));
  }
  EXPECT_LE(error, 4.0 * u * largest);
  EXPECT_GT(error, 0.0f) << "the low-precision model computed in f32?";
  const double loss_f32 = reference.loss(idx, tgt).item();
  EXPECT_NEAR(loss.item(), loss_f32, 4.0 * u * loss_f32);
}

TEST_P(LowPrecision, ModuleToWithDropoutAndCheckpointing) {
  // Dropout > 0 takes attention's unfused path: bf16 scores plus an f32 causal mask (mixed).
  nn::GptOptions options;
  options.dropout = 0.1;
  options.checkpoint = true;
  nn::GPT model(tiny_gpt_config(), options);
  model.init_parameters(1234);
  model.to(dt());
  auto [idx, tgt] = token_batch();
  Tensor loss = model.loss(idx, tgt);
  EXPECT_TRUE(std::isfinite(loss.item()));
  loss.backward();
  for (const auto& [name, p] : model.named_parameters()) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(p.grad().defined());
    EXPECT_EQ(p.grad().dtype(), dt());
  }
}

TEST_P(LowPrecision, ModuleToRoundTripsAndRefusesIntegers) {
  nn::GPT model(tiny_gpt_config());
  model.init_parameters(1234);
  model.to(dt());
  const std::vector<float> low = values(model.wte->weight);
  expect_error([&] { model.to(DType::kI32); }, {"Module::to", "i32", "not floating"});
  EXPECT_EQ(model.wte->weight.dtype(), dt()) << "a refused cast must change nothing";
  model.to(DType::kF32);
  EXPECT_EQ(model.wte->weight.dtype(), DType::kF32);
  EXPECT_EQ(values(model.wte->weight), low);  // widening is exact
}

TEST(LowPrecisionErrors, TensorToInPlaceOnlyForFloatingLeaves) {
  Tensor i = Tensor::zeros({2}, DType::kI32);
  expect_error([&] { i.to_(DType::kBF16); }, {"Tensor::to_", "floating"});
  Tensor a = Tensor::ones({2}).set_requires_grad(true);
  Tensor b = scale(a, 2.0);
  expect_error([&] { b.to_(DType::kBF16); }, {"Tensor::to_", "scale", "leaf"});
}

INSTANTIATE_TEST_SUITE_P(Bf16AndF16, LowPrecision, ::testing::Values(DType::kBF16, DType::kF16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(dtype_name(info.param));
                         });

}  // namespace
}  // namespace loom
