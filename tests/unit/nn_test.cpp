// nn modules: GPT parameter names, state dicts, deterministic init, modules against the ops,
// gradients by finite differences, checkpointing, dropout keys, and bad input.
#include <gtest/gtest.h>

#include <cmath>

#include "core/nn/nn.h"
#include "core/ops.h"
#include "testing/gradcheck.h"

namespace loom {
namespace {

using nn::GPT;
using nn::GptOptions;

GptConfig tiny_config() {
  GptConfig c;
  c.layers = 1;
  c.channels = 8;
  c.heads = 2;
  c.max_seq_len = 4;
  c.vocab = 11;
  c.padded_vocab = 16;
  return c;
}

Tensor tokens(const std::vector<int64_t>& v, const Shape& shape) {
  return Tensor::from_vector(v, shape);
}

template <typename F>
void expect_error(F&& f, const std::string& fragment) {
  try {
    f();
    ADD_FAILURE() << "expected loom::Error containing '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

// Replaces every parameter with uniform values in [-a, a] (keyed by name), so gradient checks
// see a model far from GPT-2 init, where every nonlinearity matters.
void randomise(nn::Module& m, uint64_t seed, double a) {
  for (auto& [name, t] : m.named_parameters()) {
    Tensor p = t;
    rng::fill_uniform(p, seed, name, -a, a);
  }
}

std::vector<Tensor> params_of(const nn::Module& m) { return m.parameters(); }

// ---------------------------------------------------------------- names and state dicts

TEST(Module, GptParameterNamesAreTheNotesList) {
  GptConfig c = tiny_config();
  c.layers = 2;
  GPT gpt(c);
  EXPECT_EQ(c.num_parameters(), gpt.num_parameters()) << "GptConfig::num_parameters' formula";
  std::vector<std::pair<std::string, Shape>> expected = {{"wte.weight", {16, 8}},
                                                         {"wpe.weight", {4, 8}}};
  for (int i = 0; i < 2; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    std::vector<std::pair<std::string, Shape>> block = {
        {b + "ln1.weight", {8}},          {b + "ln1.bias", {8}},
        {b + "attn.qkv.weight", {24, 8}}, {b + "attn.qkv.bias", {24}},
        {b + "attn.proj.weight", {8, 8}}, {b + "attn.proj.bias", {8}},
        {b + "ln2.weight", {8}},          {b + "ln2.bias", {8}},
        {b + "mlp.fc.weight", {32, 8}},   {b + "mlp.fc.bias", {32}},
        {b + "mlp.proj.weight", {8, 32}}, {b + "mlp.proj.bias", {8}}};
    expected.insert(expected.end(), block.begin(), block.end());
  }
  expected.push_back({"ln_f.weight", {8}});
  expected.push_back({"ln_f.bias", {8}});
  auto named = gpt.named_parameters();
  ASSERT_EQ(named.size(), expected.size());
  int64_t total = 0;
  for (size_t i = 0; i < named.size(); ++i) {
    EXPECT_EQ(named[i].first, expected[i].first) << "parameter " << i;
    EXPECT_EQ(named[i].second.shape(), expected[i].second) << named[i].first;
    EXPECT_TRUE(named[i].second.requires_grad()) << named[i].first;
    total += shape_numel(expected[i].second);
  }
  EXPECT_EQ(gpt.num_parameters(), total);
  EXPECT_EQ(gpt.parameters().size(), expected.size());
  EXPECT_EQ(gpt.block(1).attn->full_name(), "blocks.1.attn");
  EXPECT_EQ(gpt.block(1).attn->qkv->named_parameters()[0].first, "weight");  // relative names
  EXPECT_EQ(gpt.block(1).named_parameters()[2].first, "attn.qkv.weight");
}

TEST(Module, StateDictSharesStorageAndRoundTrips) {
  GPT a(tiny_config()), b(tiny_config());
  a.init_parameters(1);
  b.init_parameters(2);
  nn::StateDict sd = a.state_dict();
  ASSERT_EQ(sd.size(), a.named_parameters().size());
  EXPECT_EQ(sd.at("wpe.weight").storage(), a.wpe->weight.storage());  // shares storage

  Tensor before = b.wte->weight;  // the handle must stay the parameter
  nn::LoadResult r = b.load_state_dict(sd);
  EXPECT_TRUE(r.missing.empty() && r.unexpected.empty());
  EXPECT_TRUE(b.wte->weight.same_as(before));
  for (auto& [name, t] : b.named_parameters())
    EXPECT_EQ(t.to_vector<float>(), sd.at(name).to_vector<float>()) << name;
}

TEST(Module, LoadStateDictErrorsNameTheKeys) {
  GPT a(tiny_config()), b(tiny_config());
  a.init_parameters(1);
  b.init_parameters(2);
  const std::vector<float> b_wte = b.wte->weight.to_vector<float>();

  nn::StateDict missing = a.state_dict();
  missing.erase("blocks.0.ln2.bias");
  missing["extra.weight"] = Tensor::zeros({2});
  expect_error([&] { b.load_state_dict(missing); },
               "missing keys: blocks.0.ln2.bias; unexpected keys: extra.weight");
  EXPECT_EQ(b.wte->weight.to_vector<float>(), b_wte);  // a failed load copies nothing

  nn::LoadResult r = b.load_state_dict(missing, /*strict=*/false);
  EXPECT_EQ(r.missing, std::vector<std::string>{"blocks.0.ln2.bias"});
  EXPECT_EQ(r.unexpected, std::vector<std::string>{"extra.weight"});
  EXPECT_EQ(b.wte->weight.to_vector<float>(), a.wte->weight.to_vector<float>());

  nn::StateDict wrong = a.state_dict();
  wrong["blocks.0.attn.qkv.weight"] = Tensor::zeros({8, 24});
  expect_error([&] { b.load_state_dict(wrong, /*strict=*/false); },
               "'blocks.0.attn.qkv.weight' has shape [8, 24] in the state dict but [24, 8] in "
               "the module");
}

TEST(Module, TrainEvalZeroGradAndRegistrationChecks) {
  GPT gpt(tiny_config());
  EXPECT_TRUE(gpt.is_training());
  gpt.eval();
  EXPECT_FALSE(gpt.is_training());
  EXPECT_FALSE(gpt.block(0).mlp->drop->is_training());
  gpt.train();
  EXPECT_TRUE(gpt.block(0).attn->attn_drop->is_training());

  gpt.init_parameters(3);
  gpt.loss(tokens({1, 2, 3, 4}, {1, 4}), tokens({2, 3, 4, 5}, {1, 4})).backward();
  EXPECT_TRUE(gpt.ln_f->weight.grad().defined());
  gpt.zero_grad();
  for (auto& [name, t] : gpt.named_parameters()) EXPECT_FALSE(t.grad().defined()) << name;

  struct Twice : nn::Module {
    Twice() {
      register_parameter("w", {2}, nn::Init::zeros());
      register_parameter("w", {2}, nn::Init::zeros());
    }
  };
  expect_error([] { Twice t; }, "'w' is already a parameter");
  nn::Module bare;
  expect_error([&] { bare.forward(Tensor::zeros({1})); }, "has no forward(x)");
  auto shared = std::make_shared<nn::Linear>(2, 2);
  nn::ModuleList list;
  list.push_back(shared);
  nn::ModuleList other;
  expect_error([&] { other.push_back(shared); }, "already belongs to another module");
}

TEST(Module, AdoptedParametersAreTheGivenTensorsAndKeepTheirValues) {
  // What a module written in Python becomes for the C++ wrappers (python/src/nn.cpp).
  struct Adopting : nn::Module {
    explicit Adopting(const Tensor& w) {
      adopt_parameter("w", w);
      register_parameter("b", {2}, nn::Init::normal(1.0));
    }
    void adopt_again(const Tensor& t) { adopt_parameter("w", t); }
    void adopt_as(const std::string& name, const Tensor& t) { adopt_parameter(name, t); }
  };
  Tensor w = Tensor::from_vector(std::vector<float>{1.5f, -2.f}, {2});
  w.set_requires_grad(true);
  Adopting m(w);
  m.init_parameters(7);
  ASSERT_EQ(m.named_parameters().size(), 2u);
  EXPECT_TRUE(m.named_parameters()[0].second.same_as(w));
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{1.5f, -2.f}));     // left alone by init
  EXPECT_NE(m.named_parameters()[1].second.to_vector<float>()[0], 0.f);  // initialised
  expect_error([&] { m.adopt_again(w); }, "'w' is already a parameter");
  expect_error([&] { m.adopt_as("x", Tensor::zeros({2})); },
               "must be a leaf tensor that requires grad");
}

TEST(Module, HooksRunAroundForwardAlsoWhenCalledInHalves) {
  nn::Linear lin(2, 2);
  std::vector<std::string> calls;
  lin.add_forward_pre_hook([&](nn::Module&) { calls.push_back("pre"); });
  lin.add_forward_hook([&](nn::Module&, const Tensor& y) {
    calls.push_back("post");
    return scale(y, 2.0);
  });
  EXPECT_TRUE(lin.has_forward_hooks());
  const Tensor x = Tensor::ones({1, 2});
  const Tensor whole = lin(x);
  lin.run_forward_pre_hooks();
  const Tensor halves = lin.run_forward_hooks(lin.forward(x));
  EXPECT_EQ(calls, (std::vector<std::string>{"pre", "post", "pre", "post"}));
  EXPECT_EQ(whole.to_vector<float>(), halves.to_vector<float>());
  EXPECT_EQ(whole.to_vector<float>(), scale(lin.forward(x), 2.0).to_vector<float>());
}

// ---------------------------------------------------------------- init

TEST(Init, SameSeedSameValuesDifferentSeedDifferent) {
  GPT a(tiny_config()), b(tiny_config());
  a.init_parameters(5);
  b.init_parameters(5);
  for (auto& [name, t] : a.named_parameters())
    EXPECT_EQ(t.to_vector<float>(), b.state_dict().at(name).to_vector<float>()) << name;
  b.init_parameters(6);
  EXPECT_NE(a.wte->weight.to_vector<float>(), b.wte->weight.to_vector<float>());
}

// Values depend only on (seed, full name, index): not on construction order, on the rest of
// the model, or on whether the parameter is built whole or as a shard.
TEST(Init, ValuesAreIndependentOfConstructionOrderAndLayout) {
  GptConfig c2 = tiny_config(), c3 = tiny_config();
  c2.layers = 2;
  c3.layers = 3;
  GPT two(c2), three(c3);
  two.init_parameters(9);
  three.init_parameters(9);
  // The same name in a different model gets the same values (the residual projections differ
  // only because their std depends on the layer count).
  for (const char* name : {"wte.weight", "wpe.weight", "blocks.1.attn.qkv.weight",
                           "blocks.1.mlp.fc.weight", "blocks.0.ln1.weight"}) {
    EXPECT_EQ(two.state_dict().at(name).to_vector<float>(),
              three.state_dict().at(name).to_vector<float>())
        << name;
  }
  // A module built alone, given its place in the tree by name.
  nn::Linear qkv(8, 24);
  qkv.set_full_name("blocks.1.attn.qkv");
  qkv.init_parameters(9);
  EXPECT_EQ(qkv.weight.to_vector<float>(), two.block(1).attn->qkv->weight.to_vector<float>());

  // Children registered in the opposite order get the same values by name.
  struct Forward : nn::Module {
    std::shared_ptr<nn::Linear> a, b;
    Forward() {
      a = register_module("a", std::make_shared<nn::Linear>(3, 4));
      b = register_module("b", std::make_shared<nn::Linear>(4, 5));
    }
  };
  struct Backward : nn::Module {
    std::shared_ptr<nn::Linear> a, b;
    Backward() {
      b = register_module("b", std::make_shared<nn::Linear>(4, 5));
      a = register_module("a", std::make_shared<nn::Linear>(3, 4));
    }
  };
  Forward f;
  Backward r;
  f.init_parameters(4);
  r.init_parameters(4);
  EXPECT_EQ(f.a->weight.to_vector<float>(), r.a->weight.to_vector<float>());
  EXPECT_EQ(f.b->weight.to_vector<float>(), r.b->weight.to_vector<float>());

  // A vocab shard of wte (rows 8..15, straddling the padding at 11) generated alone.
  Tensor shard = Tensor::empty({8, 8});
  rng::Slice slice{{16, 8}, 0, 8};
  nn::init_tensor(shard, two.wte->parameter_init("weight"), 9, "wte.weight", &slice);
  EXPECT_EQ(shard.to_vector<float>(), two.wte->weight.narrow(0, 8, 8).to_vector<float>());
  // A column shard of a residual projection.
  Tensor cols = Tensor::empty({8, 16});
  rng::Slice col_slice{{8, 32}, 1, 16};
  const Tensor& proj = two.block(0).mlp->proj->weight;
  nn::init_tensor(cols, two.parameter_init("blocks.0.mlp.proj.weight"), 9,
                  "blocks.0.mlp.proj.weight", &col_slice);
  EXPECT_EQ(cols.to_vector<float>(), proj.narrow(1, 16, 16).to_vector<float>());
}

TEST(Init, Gpt2Statistics) {
  GptConfig c;
  c.layers = 8;
  c.channels = 128;
  c.heads = 4;
  c.max_seq_len = 64;
  c.vocab = 1000;
  c.padded_vocab = 1024;
  GPT gpt(c);
  gpt.init_parameters(11);
  auto stats = [](const std::vector<float>& v) {
    double s = 0, s2 = 0;
    for (float x : v) s += x, s2 += double(x) * x;
    const double mean = s / double(v.size());
    return std::make_pair(mean, std::sqrt(s2 / double(v.size()) - mean * mean));
  };
  // wte's real rows: 128000 draws, std within 2%.
  auto [m, s] = stats(gpt.wte->weight.narrow(0, 0, 1000).to_vector<float>());
  EXPECT_NEAR(m, 0.0, 0.001);
  EXPECT_NEAR(s, 0.02, 0.02 * 0.02);
  for (float x : gpt.wte->weight.narrow(0, 1000, 24).to_vector<float>()) ASSERT_EQ(x, 0.0f);
  // Residual projections: std 0.02 / sqrt(2 * layers) = 0.005, pooled over the 8 blocks
  // (8 * 2 * 65536 draws) so 2% is far outside sampling noise.
  std::vector<float> resid, fc;
  for (int64_t i = 0; i < c.layers; ++i) {
    for (const Tensor* t :
         {&gpt.block(size_t(i)).attn->proj->weight, &gpt.block(size_t(i)).mlp->proj->weight}) {
      auto v = t->to_vector<float>();
      resid.insert(resid.end(), v.begin(), v.end());
    }
    auto v = gpt.block(size_t(i)).mlp->fc->weight.to_vector<float>();
    fc.insert(fc.end(), v.begin(), v.end());
  }
  EXPECT_NEAR(stats(resid).second, 0.005, 0.005 * 0.02);
  EXPECT_NEAR(stats(fc).second, 0.02, 0.02 * 0.02);
  for (auto& [name, t] : gpt.named_parameters()) {
    const bool is_bias = name.size() > 5 && name.substr(name.size() - 5) == ".bias";
    const bool is_ln_weight = name.find("ln") != std::string::npos && !is_bias;
    if (!is_bias && !is_ln_weight) continue;
    const float want = is_ln_weight ? 1.0f : 0.0f;
    for (float x : t.to_vector<float>()) ASSERT_EQ(x, want) << name;
  }
}

// ---------------------------------------------------------------- modules vs ops

TEST(Modules, LinearLayerNormEmbeddingAreTheirOps) {
  Tensor x = testing::random_tensor({2, 3, 4}, 1);
  nn::Linear lin(4, 5);
  randomise(lin, 2, 0.5);
  EXPECT_EQ(lin.forward(x).to_vector<float>(), linear(x, lin.weight, lin.bias).to_vector<float>());
  nn::Linear no_bias(4, 5, /*bias=*/false);
  EXPECT_FALSE(no_bias.bias.defined());
  EXPECT_EQ(no_bias.named_parameters().size(), 1u);

  nn::LayerNorm ln(4);
  randomise(ln, 3, 0.5);
  EXPECT_EQ(ln.forward(x).to_vector<float>(),
            layer_norm(x, ln.weight, ln.bias, 1e-5).to_vector<float>());

  nn::Embedding emb(7, 4);
  emb.init_parameters(4);
  Tensor idx = tokens({0, 6, 3, 3}, {2, 2});
  Tensor e = emb.forward(idx);
  EXPECT_EQ(e.shape(), (Shape{2, 2, 4}));
  EXPECT_EQ(e.to_vector<float>(), embedding(emb.weight, idx).to_vector<float>());
}

// ---------------------------------------------------------------- gradients
//
// Finite differences in f32 with the checker's defaults (eps 1e-2, atol 1e-3, rtol 1e-2): the
// outputs are O(1), so f32 rounding in the difference quotient is ~1e-7 / 2e-2 = 5e-6, far
// below atol, and the O(eps^2) truncation error of central differences stays within rtol for
// these smooth functions (GELU, LayerNorm, softmax) at parameter scale 0.3.

TEST(Gradients, MlpByFiniteDifferences) {
  nn::MLP mlp(4);
  randomise(mlp, 1, 0.3);
  Tensor x = testing::random_tensor({2, 3, 4}, 2).set_requires_grad(true);
  std::vector<Tensor> inputs = params_of(mlp);
  inputs.push_back(x);
  testing::expect_gradients_match(
      [&](const std::vector<Tensor>& in) { return mlp.forward(in.back()); }, inputs);
}

TEST(Gradients, BlockByFiniteDifferences) {
  nn::Block block(8, 2);
  randomise(block, 3, 0.3);
  Tensor x = testing::random_tensor({2, 4, 8}, 4).set_requires_grad(true);
  std::vector<Tensor> inputs = params_of(block);
  inputs.push_back(x);
  testing::expect_gradients_match(
      [&](const std::vector<Tensor>& in) { return block.forward(in.back()); }, inputs);
}

TEST(Gradients, GptLossByFiniteDifferences) {
  GPT gpt(tiny_config());
  randomise(gpt, 5, 0.3);
  Tensor idx = tokens({1, 5, 10, 0, 3, 3, 7, 2}, {2, 4});
  Tensor targets = tokens({5, 10, 0, 4, 3, 7, 2, 9}, {2, 4});
  testing::expect_gradients_match(
      [&](const std::vector<Tensor>&) { return gpt.loss(idx, targets); }, params_of(gpt));
}

// With dropout active the function is still deterministic (the mask is fixed by the key), so
// finite differences check the explicit attention path with attention dropout as well.
TEST(Gradients, GptWithDropoutByFiniteDifferences) {
  GPT gpt(tiny_config(), GptOptions{.dropout = 0.2});
  randomise(gpt, 6, 0.3);
  nn::set_dropout_step(3);
  Tensor idx = tokens({1, 5, 10, 0, 3, 3, 7, 2}, {2, 4});
  Tensor targets = tokens({5, 10, 0, 4, 3, 7, 2, 9}, {2, 4});
  testing::expect_gradients_match(
      [&](const std::vector<Tensor>&) { return gpt.loss(idx, targets); }, params_of(gpt));
  nn::set_dropout_step(0);
}

TEST(Gradients, PaddedVocabularyGetsZeroGradient) {
  GPT gpt(tiny_config());
  gpt.init_parameters(7);
  {
    // Non-zero padding rows (as a foreign checkpoint might have) must still get no gradient.
    NoGradGuard no_grad;
    Tensor pad = gpt.wte->weight.narrow(0, 11, 5);
    pad.copy_(testing::random_tensor({5, 8}, 8));
  }
  gpt.loss(tokens({1, 5, 10, 0}, {1, 4}), tokens({5, 10, 0, 4}, {1, 4})).backward();
  std::vector<float> g = gpt.wte->weight.grad().to_vector<float>();
  for (int64_t r = 11; r < 16; ++r)
    for (int64_t c = 0; c < 8; ++c) ASSERT_EQ(g[size_t(r * 8 + c)], 0.0f) << "row " << r;
  double real = 0;
  for (int64_t i = 0; i < 11 * 8; ++i) real += std::fabs(g[size_t(i)]);
  EXPECT_GT(real, 0.0);
}

// ---------------------------------------------------------------- checkpointing

TEST(Checkpointing, SameLossAndGradientsBitForBit) {
  GptConfig c = tiny_config();
  c.layers = 3;
  for (double p : {0.0, 0.1}) {
    GPT plain(c, GptOptions{.dropout = p}), ckpt(c, GptOptions{.dropout = p, .checkpoint = true});
    plain.init_parameters(13);
    ckpt.init_parameters(13);
    Tensor idx = tokens({1, 5, 10, 0, 3, 3, 7, 2}, {2, 4});
    Tensor targets = tokens({5, 10, 0, 4, 3, 7, 2, 9}, {2, 4});
    nn::set_dropout_step(5);
    Tensor l1 = plain.loss(idx, targets);
    l1.backward();
    Tensor l2 = ckpt.loss(idx, targets);
    // The loop moving on before backward must not change the recomputed masks.
    nn::set_dropout_step(6);
    l2.backward();
    nn::set_dropout_step(0);
    EXPECT_EQ(l1.item(), l2.item()) << "p " << p;
    auto a = plain.named_parameters(), b = ckpt.named_parameters();
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_TRUE(b[i].second.grad().defined()) << b[i].first;
      EXPECT_EQ(a[i].second.grad().to_vector<float>(), b[i].second.grad().to_vector<float>())
          << a[i].first << " p " << p;
    }
  }
}

// ---------------------------------------------------------------- dropout

TEST(Dropout, SameStepSameMaskNextStepDifferentEvalIdentity) {
  auto parent = std::make_shared<nn::ModuleList>();
  auto d = std::make_shared<nn::Dropout>(0.5);
  auto other = std::make_shared<nn::Dropout>(0.5);
  parent->push_back(d);
  parent->push_back(other);
  Tensor x = Tensor::ones({1000});
  nn::set_dropout_seed(21);
  nn::set_dropout_step(1);
  std::vector<float> a = d->forward(x).to_vector<float>();
  std::vector<float> b = d->forward(x).to_vector<float>();
  EXPECT_EQ(a, b);
  int kept = 0;
  for (float v : a) {
    EXPECT_TRUE(v == 0.0f || v == 2.0f) << v;  // kept elements scaled by 1 / (1 - p)
    kept += v != 0.0f;
  }
  EXPECT_GT(kept, 400);  // ~500 of 1000
  EXPECT_LT(kept, 600);
  EXPECT_NE(other->forward(x).to_vector<float>(), a);  // another name, another stream
  nn::set_dropout_step(2);
  EXPECT_NE(d->forward(x).to_vector<float>(), a);
  {
    nn::DropoutStepGuard guard(1);
    EXPECT_EQ(d->forward(x).to_vector<float>(), a);
  }
  EXPECT_EQ(nn::dropout_step(), 2u);
  nn::set_dropout_seed(22);
  nn::set_dropout_step(1);
  EXPECT_NE(d->forward(x).to_vector<float>(), a);
  parent->eval();
  EXPECT_TRUE(d->forward(x).same_as(x));
  nn::set_dropout_seed(0);
  nn::set_dropout_step(0);
  expect_error([] { nn::Dropout bad(1.0); }, "p must be in [0, 1)");
}

// A batch split into parts (dp ranks, micro-batches) draws the whole batch's masks, also in a
// checkpointed recomputation run after the loop has moved on. See Note [Dropout keys].
TEST(Dropout, BatchPartsDrawTheWholeBatchMasks) {
  std::vector<std::vector<float>> plain_grads;  // without checkpointing
  for (bool checkpoint : {false, true}) {
    GPT gpt(tiny_config(), GptOptions{.dropout = 0.3, .checkpoint = checkpoint});
    gpt.init_parameters(17);
    Tensor idx = tokens({1, 5, 10, 0, 3, 3, 7, 2, 4, 4, 9, 1, 0, 2, 6, 8}, {4, 4});
    nn::set_dropout_seed(5);
    nn::set_dropout_step(2);
    const std::vector<float> whole = gpt.forward(idx).to_vector<float>();
    std::vector<float> parts;
    for (int64_t k = 0; k < 2; ++k) {
      nn::set_dropout_batch_part({k, 2});
      Tensor out = gpt.forward(idx.narrow(0, 2 * k, 2).contiguous());
      nn::set_dropout_batch_part({1, 4});  // moved on before the (recomputing) backward
      sum(out).backward();
      for (float v : out.to_vector<float>()) parts.push_back(v);
    }
    nn::set_dropout_batch_part({});
    ASSERT_EQ(parts.size(), whole.size());
    for (size_t i = 0; i < whole.size(); ++i)
      ASSERT_NEAR(parts[i], whole[i], 1e-5 * (1 + std::fabs(whole[i]))) << "at " << i;
    // The recomputation drew the forward's masks: the same gradients, bit for bit.
    const auto params = gpt.named_parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      if (!checkpoint)
        plain_grads.push_back(params[i].second.grad().to_vector<float>());
      else
        EXPECT_EQ(params[i].second.grad().to_vector<float>(), plain_grads[i]) << params[i].first;
    }
    nn::set_dropout_seed(0);
    nn::set_dropout_step(0);
  }
  expect_error([] { nn::set_dropout_batch_part({2, 2}); }, "part 2 of 2 is not a part");
}

// The explicit attention path (taken for attention dropout) computes what the fused op does.
TEST(Dropout, ExplicitAttentionPathMatchesFusedOp) {
  // p = 1e-9: the mask keeps an element unless its 24-bit uniform is exactly 0 (odds 2^-24 per
  // element; none of these 64 are), and the scale 1 / (1 - p) rounds to 1 in f32.
  nn::CausalSelfAttention attn(8, 2, 1e-9);
  randomise(attn, 9, 0.5);
  Tensor x = testing::random_tensor({2, 4, 8}, 10);
  Tensor explicit_path = attn.forward(x);
  attn.eval();
  Tensor fused = attn.forward(x);
  testing::expect_close(explicit_path, fused, 1e-6, 1e-5);
}

// ---------------------------------------------------------------- bad input

TEST(BadInput, ErrorsNameTheProblem) {
  GptConfig c = tiny_config();
  c.heads = 3;
  expect_error([&] { GPT gpt(c); }, "heads (3) must divide dim (8)");
  expect_error([] { nn::CausalSelfAttention a(8, 3); }, "heads (3) must divide dim (8)");

  GPT gpt(tiny_config());
  gpt.init_parameters(1);
  expect_error(
      [&] {
        gpt.forward(tokens({1, 2, 3, 4, 5}, {1, 5}));
      },
      "sequence length 5 exceeds max_seq_len 4");
  // 12 is a row of the padded wte but not a token.
  expect_error(
      [&] {
        gpt.forward(tokens({1, 12, 3, 4}, {2, 2}));
      },
      "token 12 at [0, 1] is outside the vocabulary [0, 11)");
  expect_error([&] { gpt.forward(tokens({-1, 2}, {1, 2})); }, "token -1");
  expect_error([&] { gpt.forward(Tensor::zeros({1, 2})); }, "i32 or i64 token ids, got f32");
  expect_error([&] { gpt.forward(tokens({1, 2}, {2})); }, "idx must be token ids [B, T], got [2]");
  expect_error(
      [&] {
        gpt.loss(tokens({1, 2}, {1, 2}), tokens({1, 2, 3}, {1, 3}));
      },
      "targets [1, 3] must have the shape of idx [1, 2]");
  expect_error([&] { gpt.loss(tokens({1, 2}, {1, 2}), tokens({1, 11}, {1, 2})); }, "11");
  expect_error(
      [&] {
        gpt.block(0).attn->forward(Tensor::zeros({1, 2, 6}));
      },
      "input must be [B, T, 8], got [1, 2, 6]");
}

// ---------------------------------------------------------------- weight tying

// A module whose forward would keep its own tensor: it must refuse a tie.
struct Holder : nn::Module {
  Holder() { w = register_parameter("w", {2}, nn::Init::zeros()); }
  Tensor w;
};

TEST(Module, TiedParametersAreOneTensorListedOnce) {
  auto root = std::make_shared<nn::ModuleList>();
  auto wte = std::make_shared<nn::Embedding>(5, 3);
  auto head = std::make_shared<nn::Linear>(3, 5, /*bias=*/false);
  root->push_back(wte);
  root->push_back(head);
  rng::fill_uniform(head->weight, 1, "head", -1.0, 1.0);
  wte->tie_parameter("weight", head->weight);
  EXPECT_EQ(wte->weight.impl(), head->weight.impl()) << "the member follows the tie";
  const auto named = root->named_parameters();
  ASSERT_EQ(named.size(), 1u) << "a tied tensor is listed once";
  EXPECT_EQ(named[0].first, "0.weight");
  // The lookup reads the shared tensor's rows.
  Tensor idx = Tensor::from_vector(std::vector<int64_t>{2, 4}, {2});
  const std::vector<float> w = head->weight.to_vector<float>();
  std::vector<float> rows(w.begin() + 6, w.begin() + 9);
  rows.insert(rows.end(), w.begin() + 12, w.begin() + 15);
  EXPECT_EQ(wte->forward(idx).to_vector<float>(), rows);
  // Both uses add into the one gradient: d/dW sum(head(wte(idx))) has the lookup's rows too.
  sum(head->forward(wte->forward(idx))).backward();
  ASSERT_TRUE(head->weight.grad().defined());
  // What cannot be tied says what and why.
  Tensor wide = Tensor::zeros({5, 4});
  wide.set_requires_grad(true);
  expect_error([&] { head->tie_parameter("weight", wide); }, "it cannot be tied to a [5, 4]");
  expect_error([&] { head->tie_parameter("bias", head->weight); }, "no parameter named 'bias'");
  Holder holder;
  Tensor two = Tensor::zeros({2});
  two.set_requires_grad(true);
  expect_error([&] { holder.tie_parameter("w", two); }, "cannot be shared with another module");
}

}  // namespace
}  // namespace loom
