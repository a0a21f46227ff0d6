// Autograd version counters (See Note [Version counter] in core/tensor.h): a tensor saved for
// backward and changed in place before that backward makes the backward raise, naming the op and
// the tensor, instead of giving wrong gradients. Unchanged graphs give their exact gradients, and
// every built-in op that saves tensors is covered by the loop over ops below.
#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "collectives/self_backend.h"
#include "core/autograd.h"
#include "core/embedding_bag.h"
#include "core/nn/linear.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "optimizer/sgd.h"
#include "parallel/zero.h"
#include "testing/files.h"

namespace loom {
namespace {

using testing::expect_error;

Tensor param(const std::vector<float>& values, const Shape& shape) {
  Tensor t = Tensor::from_vector(values, shape);
  t.set_requires_grad(true);
  return t;
}

// The probe: an optimizer step (under no_grad) between forward and backward changes the
// weight matmul saved; x.grad came out -9 instead of 1.
TEST(VersionCounter, OptimizerStepBetweenForwardAndBackwardRaises) {
  Tensor x = param({1.0f}, {1, 1});
  Tensor w = param({1.0f}, {1, 1});
  Tensor loss = sum(matmul(x, w));
  optim::SGD sgd({w}, {.lr = 1.0});
  w.set_grad(Tensor::full({1, 1}, 10.0));
  {
    NoGradGuard no_grad;
    sgd.step();  // w = 1 - 10 = -9
  }
  EXPECT_EQ(w.item(), -9.0);
  expect_error([&] { loss.backward(); },
               {"backward of matmul", "input 1 of matmul", "Tensor[1, 1] f32 cpu",
                "modified by an in-place operation after the forward saved it",
                "(version 1 then, 2 now)", "clone()", "after backward"});
  EXPECT_FALSE(x.grad().defined());
}

TEST(VersionCounter, UnmodifiedGraphGivesExactGradients) {
  Tensor x = param({1.0f, 2.0f}, {1, 2});
  Tensor w = param({3.0f, 4.0f, 5.0f, 6.0f}, {2, 2});
  Tensor y = mul(matmul(x, w), x);  // [x0 (3 x0 + 5 x1), x1 (4 x0 + 6 x1)] = [13, 32]
  sum(y).backward();
  // d/dx0 = 6 x0 + 5 x1 + 4 x1 = 24, d/dx1 = 5 x0 + 4 x0 + 12 x1 = 33
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{24.0f, 33.0f}));
  // d/dw[i][j] = x_i x_j
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{1.0f, 2.0f, 2.0f, 4.0f}));
}

TEST(VersionCounter, ModifyingATensorNotSavedIsFine) {
  Tensor a = param({1.0f, 2.0f}, {2});
  Tensor b = param({3.0f, 4.0f}, {2});
  Tensor s = softmax(a);  // saves its output, not its input
  Tensor loss = add(sum(add(a, b)), sum(s));
  {
    NoGradGuard no_grad;
    a.fill_(7.0f);  // add saves nothing, softmax only its output
    add_(b, Tensor::ones({2}));
  }
  loss.backward();
  // softmax sums to 1 whatever its input: its gradient is zero; add's is one.
  std::vector<float> ga = a.grad().to_vector<float>();
  EXPECT_NEAR(ga[0], 1.0f, 1e-6f);
  EXPECT_NEAR(ga[1], 1.0f, 1e-6f);
  EXPECT_EQ(b.grad().to_vector<float>(), (std::vector<float>{1.0f, 1.0f}));
}

TEST(VersionCounter, ViewsShareTheCounter) {
  // A write through a view of the saved tensor's storage invalidates it.
  Tensor x = param({1.0f, 2.0f}, {1, 2});
  Tensor w = param({1.0f, 2.0f, 3.0f, 4.0f}, {2, 2});
  Tensor loss = sum(matmul(x, w));
  const uint64_t before = w.storage()->version();
  {
    NoGradGuard no_grad;
    w.detach().narrow(0, 1, 1).fill_(0.0);
  }
  EXPECT_EQ(w.storage()->version(), before + 1);
  expect_error([&] { loss.backward(); }, {"input 1 of matmul", "Tensor[2, 2] f32 cpu"});

  // And a saved view (the transpose matmul keeps) is invalidated by a write to its base.
  Tensor base = param({1.0f, 2.0f, 3.0f, 4.0f}, {2, 2});
  Tensor wt = base.transpose(0, 1);
  Tensor loss2 = sum(matmul(x, wt));
  {
    NoGradGuard no_grad;
    scale_(base, 2.0);
  }
  expect_error([&] { loss2.backward(); }, {"input 1 of matmul"});
}

TEST(VersionCounter, SavedOutputModifiedRaises) {
  Tensor x = param({1.0f, 2.0f, 3.0f}, {3});
  Tensor y = sigmoid(x);
  Tensor loss = sum(mul(y, Tensor::full({3}, 2.0)));
  {
    NoGradGuard no_grad;
    Tensor(y.detach()).zero_();
  }
  expect_error([&] { loss.backward(); }, {"backward of sigmoid", "the output of sigmoid"});
}

TEST(VersionCounter, SetDataOnASavedTensorRaises) {
  // checkpoint keeps its inputs themselves: set_data re-points what it will recompute from.
  Tensor x = param({1.0f, 2.0f}, {2});
  auto fn = [](const std::vector<Tensor>& in) { return gelu(in[0]); };
  Tensor loss = sum(autograd::checkpoint(fn, {x}));
  x.set_data(Tensor::zeros({2}));
  expect_error([&] { loss.backward(); }, {"input 0 of checkpoint", "was given other memory"});

  // matmul keeps a view of the weight's memory at forward time: set_data leaves that memory (and
  // so the gradient) as the forward saw it.
  Tensor a = param({1.0f, 2.0f}, {1, 2});
  Tensor w = param({1.0f, 2.0f, 3.0f, 4.0f}, {2, 2});
  Tensor loss2 = sum(matmul(a, w));
  w.set_data(Tensor::zeros({2, 2}));
  loss2.backward();
  EXPECT_EQ(a.grad().to_vector<float>(), (std::vector<float>{3.0f, 7.0f}));
}

TEST(VersionCounter, ReleasedAndRematerializedStorageDoesNotBump) {
  // ZeRO-3 frees gathered parameters between forward and backward and gathers them again (See
  // Note [ZeRO-3 re-gathers]): release and materialize keep the version.
  Tensor w = param({1.0f, 2.0f}, {2});
  const uint64_t v = w.storage()->version();
  w.storage()->release();
  w.storage()->materialize();
  EXPECT_EQ(w.storage()->version(), v);
}

TEST(VersionCounter, InPlaceWritesBumpTheVersion) {
  Tensor t = Tensor::zeros({4});
  uint64_t v = t.storage()->version();
  auto bumped = [&] {
    const uint64_t now = t.storage()->version();
    const bool changed = now > v;
    v = now;
    return changed;
  };
  t.fill_(1.0);
  EXPECT_TRUE(bumped());
  t.zero_();
  EXPECT_TRUE(bumped());
  t.copy_(Tensor::ones({4}));
  EXPECT_TRUE(bumped());
  add_(t, Tensor::ones({4}));
  EXPECT_TRUE(bumped());
  scale_(t, 3.0);
  EXPECT_TRUE(bumped());
  const std::vector<float> host{1, 2, 3, 4};
  t.copy_from_host(host.data(), host.size() * sizeof(float));
  EXPECT_TRUE(bumped());
  Tensor p = t.detach();
  p.set_requires_grad(true);
  p.set_grad(Tensor::ones({4}));
  optim::SGD({p}, {.lr = 0.1}).step();
  EXPECT_TRUE(bumped());
  (void)t.narrow(0, 0, 2).contiguous();  // reads do not bump
  (void)sum(t);
  EXPECT_FALSE(bumped());
}

TEST(VersionCounter, CheckpointInputModifiedRaises) {
  Tensor x = param({1.0f, 2.0f}, {2});
  Tensor w = param({3.0f, 4.0f}, {2});
  auto fn = [&](const std::vector<Tensor>& in) { return mul(in[0], w); };
  Tensor loss = sum(autograd::checkpoint(fn, {x}));
  {
    NoGradGuard no_grad;
    x.fill_(0.0);
  }
  expect_error([&] { loss.backward(); }, {"backward of checkpoint", "input 0 of checkpoint"});

  // Unmodified, the recomputation gives the exact gradients.
  Tensor x2 = param({1.0f, 2.0f}, {2});
  sum(autograd::checkpoint(fn, {x2})).backward();
  EXPECT_EQ(x2.grad().to_vector<float>(), (std::vector<float>{3.0f, 4.0f}));
}

TEST(VersionCounter, ModificationAfterBackwardIsFine) {
  Tensor x = param({2.0f}, {1, 1});
  Tensor w = param({3.0f}, {1, 1});
  Tensor loss = sum(matmul(x, w));
  loss.backward();
  {
    NoGradGuard no_grad;
    add_(w, Tensor::ones({1, 1}));  // the optimizer step where it belongs
  }
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{3.0f}));
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{2.0f}));
}

// See Note [ZeRO-3 re-gathers]: the gathers before forward and again before backward write the
// buffer the saved weight views, and raise nothing; a changed shard does.
TEST(VersionCounter, Zero3RegathersAreFineButAChangedShardRaises) {
  nn::Linear model(3, 2);
  parallel::ZeroOptimizer opt(
      model, comm::make_self_communicator("world"), {.stage = 3}, [](std::vector<Tensor> p) {
        return std::make_unique<optim::SGD>(std::move(p), optim::SgdOptions{.lr = 0.1});
      });
  Tensor x = Tensor::ones({4, 3});
  x.set_requires_grad(true);  // so linear saves the weight (for x's gradient)
  for (int step = 0; step < 2; ++step) {
    opt.backward(sum(model(x)));
    opt.step();
    opt.zero_grad();
  }
  Tensor loss = sum(model(x));
  {
    NoGradGuard no_grad;
    for (size_t i = 0; i < opt.params().size(); ++i) {
      Tensor piece = opt.piece_values(i);
      add_(piece, Tensor::ones(piece.shape()));  // the shard changes between forward and backward
    }
  }
  expect_error([&] { opt.backward(loss); }, {"backward of linear", "input 1 of linear"});
}

// ---------------------------------------------------------------- every op that saves tensors

struct SavingOp {
  std::string node;  // the node's name, as the error gives it
  std::string role;  // which of its tensors the case modifies, as the error gives it
  std::function<std::vector<Tensor>()> inputs;
  std::function<Tensor(const std::vector<Tensor>&)> forward;  // to a scalar loss
  // Modifies (under no_grad) a tensor the op saved: by default input `modify` in place; or,
  // when set, `modify_output` receives the op's output.
  size_t modify = 0;
  bool modify_output = false;
};

Tensor leaf(const Shape& shape, float start = 0.5f) {
  std::vector<float> v(size_t(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = start + 0.25f * float(i % 7) - 0.1f * float(i % 3);
  return param(v, shape);
}

std::vector<SavingOp> saving_ops() {
  std::vector<SavingOp> ops;
  auto unary = [&](std::string name, std::function<Tensor(const Tensor&)> f, bool output = false) {
    ops.push_back({name, output ? "the output of " + name : "input 0 of " + name,
                   [] {
                     return std::vector<Tensor>{leaf({2, 3})};
                   },
                   [f](const std::vector<Tensor>& in) { return f(in[0]); }, 0, output});
  };
  unary("gelu", [](const Tensor& x) { return gelu(x); });
  unary("relu", [](const Tensor& x) { return relu(x); });
  unary(
      "sigmoid", [](const Tensor& x) { return sigmoid(x); }, true);
  unary(
      "softmax", [](const Tensor& x) { return softmax(x); }, true);
  ops.push_back({"mul", "input 1 of mul",
                 [] {
                   return std::vector<Tensor>{leaf({2, 3}), leaf({3})};
                 },
                 [](const std::vector<Tensor>& in) { return mul(in[0], in[1]); }, 1});
  ops.push_back({"matmul", "input 0 of matmul",
                 [] {
                   return std::vector<Tensor>{leaf({2, 3}), leaf({3, 2})};
                 },
                 [](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); }, 0});
  ops.push_back({"linear", "input 1 of linear",
                 [] {
                   return std::vector<Tensor>{leaf({2, 3}), leaf({4, 3}), leaf({4})};
                 },
                 [](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); }, 1});
  ops.push_back({"linear", "input 0 of linear",
                 [] {
                   return std::vector<Tensor>{leaf({2, 3}), leaf({4, 3})};
                 },
                 [](const std::vector<Tensor>& in) { return linear(in[0], in[1]); }, 0});
  ops.push_back({"layer_norm", "input 0 of layer_norm",
                 [] {
                   return std::vector<Tensor>{leaf({2, 4}), leaf({4}), leaf({4})};
                 },
                 [](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); }, 0});
  ops.push_back({"layer_norm", "input 1 of layer_norm",
                 [] {
                   return std::vector<Tensor>{leaf({2, 4}), leaf({4}), leaf({4})};
                 },
                 [](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); }, 1});
  for (size_t which : {0, 1, 2})
    ops.push_back({"scaled_dot_product_attention",
                   "input " + std::to_string(which) + " of scaled_dot_product_attention",
                   [] {
                     return std::vector<Tensor>{leaf({1, 2, 3, 4}), leaf({1, 2, 3, 4}, 0.1f),
                                                leaf({1, 2, 3, 4}, -0.3f)};
                   },
                   [](const std::vector<Tensor>& in) {
                     return scaled_dot_product_attention(in[0], in[1], in[2], true);
                   },
                   which});
  ops.push_back({"scaled_dot_product_attention", "the output of scaled_dot_product_attention",
                 [] {
                   return std::vector<Tensor>{leaf({1, 2, 3, 4}), leaf({1, 2, 3, 4}, 0.1f),
                                              leaf({1, 2, 3, 4}, -0.3f)};
                 },
                 [](const std::vector<Tensor>& in) {
                   return scaled_dot_product_attention(in[0], in[1], in[2], true);
                 },
                 0, true});
  ops.push_back({"dot_interaction", "input 0 of dot_interaction",
                 [] {
                   return std::vector<Tensor>{leaf({2, 3, 4})};
                 },
                 [](const std::vector<Tensor>& in) { return dot_interaction(in[0]); }, 0});
  ops.push_back({"cross_entropy", "input 0 of cross_entropy",
                 [] {
                   return std::vector<Tensor>{leaf({2, 3})};
                 },
                 [](const std::vector<Tensor>& in) {
                   return cross_entropy(in[0], Tensor::from_vector<int64_t>({2, 0}, {2}));
                 },
                 0});
  ops.push_back(
      {"binary_cross_entropy_with_logits", "input 1 of binary_cross_entropy_with_logits",
       [] {
         return std::vector<Tensor>{leaf({2, 3}),
                                    param({0.0f, 0.25f, 0.5f, 0.75f, 1.0f, 0.5f}, {2, 3})};
       },
       [](const std::vector<Tensor>& in) { return binary_cross_entropy_with_logits(in[0], in[1]); },
       1});
  ops.push_back({"checkpoint", "input 0 of checkpoint",
                 [] {
                   return std::vector<Tensor>{leaf({2, 3})};
                 },
                 [](const std::vector<Tensor>& in) {
                   return autograd::checkpoint(
                       [](const std::vector<Tensor>& x) { return gelu(x[0]); }, in);
                 },
                 0});
  return ops;
}

TEST(VersionCounter, EveryOpThatSavesTensorsChecksThem) {
  for (const SavingOp& op : saving_ops()) {
    SCOPED_TRACE(op.node + ", " + op.role);
    // Unmodified: backward runs.
    {
      std::vector<Tensor> in = op.inputs();
      Tensor out = op.forward(in);
      EXPECT_NO_THROW(sum(out).backward());
    }
    std::vector<Tensor> in = op.inputs();
    Tensor out = op.forward(in);
    Tensor loss = sum(out);
    {
      NoGradGuard no_grad;
      Tensor target = op.modify_output ? out.detach() : in[op.modify].detach();
      add_(target, Tensor::full(target.shape(), 0.5));
    }
    expect_error([&] { loss.backward(); }, {"backward of " + op.node, op.role});
  }
}

TEST(VersionCounter, IndicesSavedByEmbeddingAreChecked) {
  Tensor w = leaf({5, 3});
  Tensor idx = Tensor::from_vector<int64_t>({1, 4, 1}, {3});
  Tensor loss = sum(embedding(w, idx));
  {
    NoGradGuard no_grad;
    idx.fill_(0.0);
  }
  expect_error([&] { loss.backward(); }, {"backward of embedding", "Tensor[3] i64 cpu"});
  // The weight itself is not read by the backward: changing it is fine.
  Tensor loss2 = sum(embedding(w, Tensor::from_vector<int64_t>({1, 4, 1}, {3})));
  {
    NoGradGuard no_grad;
    w.fill_(2.0);
  }
  loss2.backward();
  EXPECT_EQ(w.grad().to_vector<float>()[3], 2.0f);  // row 1, looked up twice
}

TEST(VersionCounter, EmbeddingBagChecksIndicesAndTablesForPerSampleWeights) {
  EmbeddingBagLayout layout{{3, 2}, {4, 4}, {}};
  Tensor flat = Tensor::full({layout.total_elements()}, 0.5);
  Tensor t0 = flat.narrow(0, 0, 12).reshape({3, 4}).detach();
  Tensor t1 = flat.narrow(0, 12, 8).reshape({2, 4}).detach();
  t0.set_requires_grad(true);
  t1.set_requires_grad(true);
  Tensor indices = Tensor::from_vector<int64_t>({0, 2, 1}, {3});
  Tensor offsets = Tensor::from_vector<int64_t>({0, 2, 3}, {3});  // one bag per table, B = 1
  Tensor psw = param({1.0f, 2.0f, 3.0f}, {3});
  Tensor loss = sum(embedding_bag({t0, t1}, layout, indices, offsets, psw));
  {
    NoGradGuard no_grad;
    add_(t1, Tensor::ones({2, 4}));  // the per-sample weights' gradient reads the tables
  }
  // The tables are views of one buffer, which the backward saved whole.
  expect_error([&] { loss.backward(); }, {"backward of embedding_bag", "Tensor[20] f32 cpu"});

  Tensor loss2 = sum(embedding_bag({t0, t1}, layout, indices, offsets));
  {
    NoGradGuard no_grad;
    indices.fill_(0.0);
  }
  expect_error([&] { loss2.backward(); }, {"backward of embedding_bag", "Tensor[3] i64 cpu"});
}

}  // namespace
}  // namespace loom
