// nn::MoE (core/nn/moe.h): one expert with top-1 is the dense MLP bit for bit; the forward, the
// capacity drops and both auxiliary losses against a reference written out here with loops in
// double; gradients against finite differences; a GPT with MoE blocks adds the auxiliary losses
// to its loss.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/autograd.h"
#include "core/nn/gpt.h"
#include "core/nn/moe.h"
#include "core/ops.h"
#include "testing/device_buffer.h"
#include "testing/gradcheck.h"

namespace loom::nn {
namespace {

using testing::random_tensor;

std::vector<float> values(const Tensor& t) { return t.contiguous().to_vector<float>(); }

// The parameter of `m` named `name`.
Tensor param(const Module& m, const std::string& name) {
  for (auto& [n, p] : m.named_parameters())
    if (n == name) return p;
  ADD_FAILURE() << "no parameter " << name;
  return Tensor();
}

TEST(MoE, OneExpertTopOneIsTheDenseMlpBitForBit) {
  const int64_t c = 8;
  MLP dense(c);
  dense.init_parameters(3);
  MoeOptions o;
  o.experts = 1;
  o.z_loss = 0;  // the z-loss would send a gradient through the router into x
  MoE moe(c, o);
  moe.init_parameters(4);
  // The expert's weights are the dense MLP's.
  for (const char* name : {"fc.weight", "fc.bias", "proj.weight", "proj.bias"}) {
    Tensor target = param(moe, std::string("experts.0.") + name);
    target.copy_(param(dense, name));
  }
  Tensor x1 = random_tensor({3, 5, c}, 11), x2 = x1.clone();
  x1.set_requires_grad(true);
  x2.set_requires_grad(true);
  Tensor w = random_tensor({3, 5, c}, 12);
  Tensor a = dense(x1), b = moe(x2);
  EXPECT_EQ(values(a), values(b));
  Tensor one = Tensor::ones({});
  autograd::backward({sum(mul(a, w))}, {one});
  autograd::backward({add(sum(mul(b, w)), moe.aux_loss())}, {one});
  EXPECT_EQ(values(x1.grad()), values(x2.grad()));
  for (const char* name : {"fc.weight", "fc.bias", "proj.weight", "proj.bias"})
    EXPECT_EQ(values(param(dense, name).grad()),
              values(param(moe, std::string("experts.0.") + name).grad()))
        << name;
  // One expert takes every token: f = P = 1, so the balance term is alpha exactly.
  EXPECT_FLOAT_EQ(float(moe.stats().aux_loss), float(o.aux_loss));
  EXPECT_EQ(moe.stats().load, std::vector<int64_t>{15});
  EXPECT_EQ(moe.stats().dropped, 0);
}

// The layer written out with loops in double: out, the load, the dropped count and both losses.
struct Reference {
  std::vector<double> out;
  std::vector<int64_t> load;
  int64_t dropped = 0;
  double balance = 0, z = 0;
};

double gelu(double v) {
  return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
}

Reference reference(MoE& moe, const Tensor& x) {
  const MoeOptions& o = moe.options();
  const int64_t c = x.size(-1), n = x.numel() / c, e_count = o.experts, k = o.top_k;
  const std::vector<float> xv = values(x), wr = values(moe.router->weight);
  Reference r;
  r.out.assign(size_t(n * c), 0);
  r.load.assign(size_t(e_count), 0);
  std::vector<std::vector<double>> p(static_cast<size_t>(n),
                                     std::vector<double>(static_cast<size_t>(e_count)));
  std::vector<int64_t> routed(static_cast<size_t>(e_count), 0);
  std::vector<std::vector<std::pair<int64_t, double>>> chosen(
      static_cast<size_t>(n));  // (expert, gate)
  for (int64_t t = 0; t < n; ++t) {
    std::vector<double> logit(static_cast<size_t>(e_count));
    for (int64_t e = 0; e < e_count; ++e)
      for (int64_t i = 0; i < c; ++i)
        logit[size_t(e)] += double(wr[size_t(e * c + i)]) * xv[size_t(t * c + i)];
    const double m = *std::max_element(logit.begin(), logit.end());
    double total = 0;
    for (double l : logit) total += std::exp(l - m);
    const double lse = m + std::log(total);
    r.z += lse * lse / double(n) * o.z_loss;
    for (int64_t e = 0; e < e_count; ++e)
      p[size_t(t)][size_t(e)] = std::exp(logit[size_t(e)] - lse);
    std::vector<int64_t> order(static_cast<size_t>(e_count));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return p[size_t(t)][size_t(a)] > p[size_t(t)][size_t(b)];
    });
    double kept = 0;
    for (int64_t j = 0; j < k; ++j) kept += p[size_t(t)][size_t(order[size_t(j)])];
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = order[size_t(j)];
      chosen[size_t(t)].push_back(
          {e, k > 1 ? p[size_t(t)][size_t(e)] / kept : p[size_t(t)][size_t(e)]});
      ++routed[size_t(e)];
    }
  }
  const auto capacity =
      o.capacity_factor > 0
          ? int64_t(std::ceil(double(k * n) * o.capacity_factor / double(e_count)))
          : n * k;
  for (int64_t e = 0; e < e_count; ++e) {
    auto find = [&](const std::string& name) {
      return values(param(*moe.experts, std::to_string(e) + "." + name));
    };
    const std::vector<float> w1 = find("fc.weight"), b1 = find("fc.bias"), w2 = find("proj.weight"),
                             b2 = find("proj.bias");
    for (int64_t t = 0; t < n; ++t)
      for (const auto& [ex, gate] : chosen[size_t(t)]) {
        if (ex != e) continue;
        if (r.load[size_t(e)] == capacity) {
          ++r.dropped;
          continue;
        }
        ++r.load[size_t(e)];
        std::vector<double> h(static_cast<size_t>(4 * c));
        for (int64_t j = 0; j < 4 * c; ++j) {
          double v = b1[size_t(j)];
          for (int64_t i = 0; i < c; ++i)
            v += double(w1[size_t(j * c + i)]) * xv[size_t(t * c + i)];
          h[size_t(j)] = gelu(v);
        }
        for (int64_t i = 0; i < c; ++i) {
          double v = b2[size_t(i)];
          for (int64_t j = 0; j < 4 * c; ++j) v += double(w2[size_t(i * 4 * c + j)]) * h[size_t(j)];
          r.out[size_t(t * c + i)] += gate * v;
        }
      }
  }
  for (int64_t e = 0; e < e_count; ++e) {
    double mean_p = 0;
    for (int64_t t = 0; t < n; ++t) mean_p += p[size_t(t)][size_t(e)] / double(n);
    r.balance += o.aux_loss * double(e_count) * double(routed[size_t(e)]) / double(n * k) * mean_p;
  }
  return r;
}

void expect_matches_reference(MoE& moe, const Tensor& x) {
  const Reference want = reference(moe, x);
  Tensor out = moe(x);
  const std::vector<float> got = values(out);
  ASSERT_EQ(got.size(), want.out.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want.out[i], 1e-5 * std::max(1.0, std::fabs(want.out[i]))) << i;
  EXPECT_EQ(moe.stats().load, want.load);
  EXPECT_EQ(moe.stats().dropped, want.dropped);
  EXPECT_NEAR(moe.stats().aux_loss, want.balance, 1e-6 * std::max(1.0, want.balance));
  EXPECT_NEAR(moe.stats().z_loss, want.z, 1e-6 * std::max(1.0, want.z));
  EXPECT_NEAR(moe.aux_loss().item(), want.balance + want.z,
              1e-6 * std::max(1.0, want.balance + want.z));
}

TEST(MoE, MatchesTheReferenceTopOneTopTwoAndCapacity) {
  const int64_t c = 6;
  for (int64_t k : {1, 2, 3}) {
    for (double capacity : {0.0, 1.0, 0.5}) {
      SCOPED_TRACE(::testing::Message() << "top_k " << k << " capacity " << capacity);
      MoeOptions o;
      o.experts = 4;
      o.top_k = k;
      o.capacity_factor = capacity;
      o.z_loss = 0.01;
      MoE moe(c, o);
      moe.init_parameters(uint64_t(20 + k));
      Tensor router = moe.router->weight;
      router.copy_(random_tensor({4, c}, 30 + uint64_t(k)));  // logits of order 1
      expect_matches_reference(moe, random_tensor({2, 7, c}, 40));
    }
  }
}

// Every token prefers expert 0: dropless, expert 0 takes all of them; with capacity, exactly
// the overflow is dropped (in token order), and the dropped tokens' outputs are zero.
TEST(MoE, ImbalanceDropsExactlyTheOverflow) {
  const int64_t c = 4, n = 10;
  MoeOptions o;
  o.experts = 4;
  o.capacity_factor = 1.0;  // ceil(1 * 10 * 1 / 4) = 3 slots
  MoE moe(c, o);
  moe.init_parameters(5);
  std::vector<float> w(static_cast<size_t>(4 * c), 0.0f);
  for (int64_t i = 0; i < c; ++i) w[size_t(i)] = 5.0f;  // expert 0's logit: 5 x sum(x)
  Tensor router = moe.router->weight;
  router.copy_(Tensor::from_vector(w, {4, c}));
  Tensor x = random_tensor({n, c}, 9, 0.1f, 1.0f);  // positive: expert 0 wins everywhere
  Tensor out = moe(x);
  EXPECT_EQ(moe.stats().load, (std::vector<int64_t>{3, 0, 0, 0}));
  EXPECT_EQ(moe.stats().dropped, n - 3);
  const std::vector<float> v = values(out);
  for (int64_t t = 3; t < n; ++t)
    for (int64_t i = 0; i < c; ++i) EXPECT_EQ(v[size_t(t * c + i)], 0.0f) << "token " << t;
  expect_matches_reference(moe, x);
  // Dropless: all ten on expert 0.
  o.capacity_factor = 0;
  MoE dropless(c, o);
  dropless.init_parameters(5);
  Tensor r2 = dropless.router->weight;
  r2.copy_(Tensor::from_vector(w, {4, c}));
  dropless(x);
  EXPECT_EQ(dropless.stats().load, (std::vector<int64_t>{n, 0, 0, 0}));
  EXPECT_EQ(dropless.stats().dropped, 0);
}

// Note [Dropless receive budget]: every token on expert 0, and a budget of 3.5 rows: the forward
// falls back to the cap 3 (declared in the stats), and is then the capacity-mode layer with 3
// slots bit for bit (outputs and gradients); within the budget, dropless is untouched.
TEST(MoE, DroplessOverItsReceiveBudgetFallsBackToTheLargestCapThatFits) {
  const int64_t c = 4, n = 10;
  std::vector<float> w(static_cast<size_t>(4 * c), 0.0f);
  for (int64_t i = 0; i < c; ++i) w[size_t(i)] = 5.0f;
  const Tensor x = random_tensor({n, c}, 9, 0.1f, 1.0f);
  auto run = [&](double capacity, double budget_mb, Tensor* x_grad) {
    MoeOptions o;
    o.experts = 4;
    o.capacity_factor = capacity;
    o.receive_budget_mb = budget_mb;
    auto moe = std::make_shared<MoE>(c, o);
    moe->init_parameters(5);
    Tensor router = moe->router->weight;
    router.copy_(Tensor::from_vector(w, {4, c}));
    Tensor xi = x.clone();
    xi.set_requires_grad(true);
    Tensor out = (*moe)(xi);
    sum(mul(out, out)).backward();
    *x_grad = xi.grad();
    return std::make_pair(moe, out);
  };
  const double row_mb = 22.0 * 4.0 * double(c) / (1024.0 * 1024.0);  // one row's activations
  Tensor g_budget, g_capacity, g_free;
  auto [fell_back, out_budget] = run(0.0, 3.5 * row_mb, &g_budget);
  EXPECT_EQ(fell_back->stats().budget_capacity, 3);
  EXPECT_EQ(fell_back->stats().load, (std::vector<int64_t>{3, 0, 0, 0}));
  EXPECT_EQ(fell_back->stats().dropped, n - 3);
  auto [capped, out_capacity] = run(1.0, 0.0, &g_capacity);  // ceil(10 / 4) = 3 slots
  EXPECT_EQ(capped->stats().budget_capacity, -1);            // capacity mode: no budget
  EXPECT_EQ(values(out_budget), values(out_capacity));
  EXPECT_EQ(values(g_budget), values(g_capacity));
  auto [fits, out_free] = run(0.0, 10.5 * row_mb, &g_free);  // all ten rows fit
  EXPECT_EQ(fits->stats().budget_capacity, -1);
  EXPECT_EQ(fits->stats().load, (std::vector<int64_t>{n, 0, 0, 0}));
  EXPECT_EQ(fits->stats().dropped, 0);
  // None (< 0) and the memory-derived default keep all ten rows here.
  for (double budget : {-1.0, 0.0})
    EXPECT_EQ(run(0.0, budget, &g_free).first->stats().dropped, 0) << "budget " << budget;
  EXPECT_EQ(moe_receive_budget_rows(1.0, 64, Device::cpu()), (1 << 20) / (22 * 4 * 64));
  EXPECT_EQ(moe_receive_budget_rows(-1.0, 64, Device::cpu()), -1);
  EXPECT_GT(moe_receive_budget_rows(0.0, 64, Device::cpu()), 0);  // a quarter of MemAvailable
}

// A bf16 layer routes in f32 (the same logits, loads and auxiliary losses as an f32 layer with
// the bf16 weights widened), runs its experts in bf16 and combines in f32: its output and input
// gradient are the f32 layer's within bf16's rounding.
TEST(MoE, Bf16RoutesInF32AndMatchesF32WithinRounding) {
  const int64_t c = 8, n = 12;
  MoeOptions o;
  o.experts = 4;
  o.top_k = 2;
  o.aux_loss = 0.1;
  o.z_loss = 0.01;
  MoE low(c, o), wide(c, o);
  low.init_parameters(3);
  Tensor router = low.router->weight;
  router.copy_(random_tensor({4, c}, 21, -1.0f, 1.0f));
  low.to(DType::kBF16);
  auto wide_params = wide.named_parameters();
  for (auto& [name, p] : low.named_parameters())
    for (auto& [wname, w] : wide_params)
      if (wname == name) w.copy_(p.to(DType::kF32));  // the bf16 values, widened
  const Tensor x = random_tensor({n, c}, 8, -1.0f, 1.0f).to(DType::kBF16).to(DType::kF32);
  Tensor x_low = x.to(DType::kBF16), x_wide = x.clone();
  x_low.set_requires_grad(true);
  x_wide.set_requires_grad(true);
  Tensor out_low = low(x_low), out_wide = wide(x_wide);
  EXPECT_EQ(out_low.dtype(), DType::kBF16);
  EXPECT_EQ(low.stats().load, wide.stats().load);
  EXPECT_EQ(low.aux_loss().dtype(), DType::kF32);
  EXPECT_EQ(low.aux_loss().item(), wide.aux_loss().item());  // the same f32 routing maths
  auto close = [](const Tensor& got, const Tensor& want, const char* what) {
    const std::vector<float> g = values(got.to(DType::kF32)), w = values(want);
    float scale = 0;
    for (float v : w) scale = std::max(scale, std::fabs(v));
    for (size_t i = 0; i < g.size(); ++i)  // bf16 keeps 8 bits: a few roundings of ~0.4%
      EXPECT_NEAR(g[i], w[i], 0.03f * scale) << what << "[" << i << "]";
  };
  close(out_low, out_wide, "output");
  sum(out_low.to(DType::kF32)).backward();
  sum(out_wide).backward();
  close(x_low.grad(), x_wide.grad(), "input gradient");
}

TEST(MoE, GradientsMatchFiniteDifferences) {
  const int64_t c = 4;
  MoeOptions o;
  o.experts = 3;
  o.top_k = 2;
  o.z_loss = 0.05;
  o.aux_loss = 0.1;
  MoE moe(c, o);
  moe.init_parameters(8);
  // The routing must not change within the finite-difference step: the first seeds at which
  // every token's k-th and (k+1)-th probabilities differ by more than 0.02 (a step of 1e-3 in one
  // element of x or of the router, values within [-1, 1], moves any probability by far less).
  Tensor x, router;
  bool clear = false;
  for (uint64_t seed = 13; seed < 200 && !clear; ++seed) {
    x = random_tensor({5, c}, seed);
    router = random_tensor({3, c}, seed + 1000);
    const std::vector<float> pv = values(softmax(matmul(x, router, false, true)));
    clear = true;
    for (int64_t t = 0; t < 5; ++t) {
      std::vector<float> row(pv.begin() + t * 3, pv.begin() + t * 3 + 3);
      std::sort(row.rbegin(), row.rend());
      clear = clear && row[1] - row[2] > 0.02f;
    }
  }
  ASSERT_TRUE(clear) << "no seed below 200 gives clear routing";
  auto run = [&](const std::vector<Tensor>& in) {
    moe.router->weight = in[1];
    return moe(in[0]);
  };
  testing::GradcheckOptions g;
  g.eps = 1e-3;
  x.set_requires_grad(true);
  router.set_requires_grad(true);
  testing::expect_gradients_match(run, {x, router}, g);
  auto aux = [&](const std::vector<Tensor>& in) {
    moe.router->weight = in[1];
    moe(in[0]);
    return moe.aux_loss().reshape({1});
  };
  testing::expect_gradients_match(aux, {x, router}, g);
}

// A GPT whose every MLP is a one-expert top-1 MoE (no z-loss) trains as the dense GPT: the same
// cross-entropy and the same gradients, bit for bit, from the same weights.
TEST(MoE, GptWithOneExpertPerBlockIsTheDenseGptBitForBit) {
  GptConfig config;
  config.vocab = 11;
  config.padded_vocab = 16;
  config.layers = 2;
  config.heads = 2;
  config.channels = 8;
  config.max_seq_len = 6;
  GPT dense(config);
  dense.init_parameters(3);
  GptOptions options;
  options.moe.experts = 1;
  options.moe.z_loss = 0;
  GPT moe(config, options);
  moe.init_parameters(4);
  auto moe_name =
      [](const std::string& dense_name) {  // blocks.i.mlp.fc -> blocks.i.mlp.experts.0.fc
        const size_t at = dense_name.find(".mlp.");
        return at == std::string::npos
                   ? dense_name
                   : dense_name.substr(0, at + 5) + "experts.0." + dense_name.substr(at + 5);
      };
  for (auto& [name, p] : dense.named_parameters()) {
    Tensor target = param(moe, moe_name(name));
    target.copy_(p);
  }
  std::vector<int64_t> ids(12), next(12);
  for (int64_t i = 0; i < 12; ++i)
    ids[size_t(i)] = (i * 7) % 11, next[size_t(i)] = (i * 3 + 1) % 11;
  Tensor idx = Tensor::from_vector(ids, {2, 6}), targets = Tensor::from_vector(next, {2, 6});
  Tensor a = dense.loss(idx, targets), b = moe.loss(idx, targets);
  EXPECT_EQ(float(a.item()), float(moe.last_lm_loss()));
  a.backward();
  b.backward();
  for (auto& [name, p] : dense.named_parameters())
    EXPECT_EQ(values(p.grad()), values(param(moe, moe_name(name)).grad())) << name;
}

// Note [A batch in micro-batches]: a batch forwarded in three parts after a routing pass gives
// the whole batch's outputs, auxiliary losses, loads, drops and gradients (capacity counted from
// the batch's first token, f_e over the whole batch), dropless and with capacity; afterwards the
// layer takes whole batches again. Without the routing pass a split batch with a load-balancing
// loss is refused; with aux_loss 0 it needs none.
TEST(MoE, ABatchInPartsAfterARoutingPassIsTheWholeBatch) {
  const int64_t c = 6, n = 12, parts = 3, rows = n / parts;
  for (double capacity : {0.0, 1.0}) {
    MoeOptions o;
    o.experts = 4;
    o.top_k = 2;
    o.capacity_factor = capacity;  // 1.0: ceil(2 x 12 / 4) = 6 slots per expert
    o.aux_loss = 0.05;
    o.z_loss = 0.01;
    MoE whole(c, o), split(c, o);
    whole.init_parameters(21);
    split.init_parameters(21);
    Tensor xa = random_tensor({n, c}, 22), xb = xa.clone();
    xa.set_requires_grad(true);
    xb.set_requires_grad(true);
    Tensor w = random_tensor({n, c}, 23);
    Tensor one = Tensor::ones({});
    Tensor out_a = whole(xa);
    const double aux_a = whole.aux_loss().item();
    autograd::backward({add(sum(mul(out_a, w)), whole.aux_loss())}, {one});

    split.begin_batch(parts, /*record=*/true);
    for (int64_t p = 0; p < parts; ++p) {  // the routing pass
      NoGradGuard no_grad;
      split(narrow(xb, 0, p * rows, rows));
      EXPECT_EQ(split.aux_loss().item(), 0.0);
    }
    std::vector<float> out_b;
    std::vector<int64_t> load(4, 0);
    int64_t dropped = 0;
    double aux_b = 0;
    for (int64_t p = 0; p < parts; ++p) {
      Tensor out = split(narrow(xb, 0, p * rows, rows));
      const std::vector<float> v = values(out);
      out_b.insert(out_b.end(), v.begin(), v.end());
      for (size_t e = 0; e < 4; ++e) load[e] += split.stats().load[e];
      dropped += split.stats().dropped;
      aux_b += split.aux_loss().item();
      autograd::backward({add(sum(mul(out, narrow(w, 0, p * rows, rows))), split.aux_loss())},
                         {one});
    }
    EXPECT_EQ(load, whole.stats().load);
    EXPECT_EQ(dropped, whole.stats().dropped);
    if (capacity > 0) EXPECT_GT(dropped, 0) << "the test needs an expert over its capacity";
    EXPECT_NEAR(aux_b, aux_a, 1e-6 * std::abs(aux_a));
    // The same rows through the same experts, whose matrix products run over other row counts
    // (Eigen may block them differently) and whose gradients sum in other groups: equal to f32
    // rounding.
    auto expect_near = [](const std::vector<float>& g, const std::vector<float>& v,
                          const std::string& what) {
      ASSERT_EQ(g.size(), v.size()) << what;
      for (size_t i = 0; i < g.size(); ++i)
        EXPECT_NEAR(g[i], v[i], 1e-5f * (1.0f + std::abs(v[i]))) << what << "[" << i << "]";
    };
    expect_near(out_b, values(out_a), "out");
    expect_near(values(xb.grad()), values(xa.grad()), "x.grad");
    for (auto& [name, p] : whole.named_parameters())
      expect_near(values(param(split, name).grad()), values(p.grad()), name + ".grad");
    // The batch is over: a whole batch again.
    EXPECT_EQ(values(split(xb.detach())), values(whole(xa.detach())));
  }
  MoeOptions o;
  o.experts = 4;
  o.capacity_factor = 1.0;
  MoE moe(c, o);
  moe.init_parameters(3);
  Tensor x = random_tensor({n, c}, 4);
  moe.begin_batch(2, /*record=*/false);
  try {
    moe(narrow(x, 0, 0, n / 2));
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("begin the batch with a routing pass"), std::string::npos)
        << e.what();
  }
  o.aux_loss = 0;  // nothing needs the whole batch's counts ahead: no routing pass
  MoE plain(c, o), parted(c, o);
  plain.init_parameters(3);
  parted.init_parameters(3);
  const std::vector<float> want = values(plain(x));
  parted.begin_batch(2, /*record=*/false);
  std::vector<float> got = values(parted(narrow(x, 0, 0, n / 2)));
  const std::vector<float> rest = values(parted(narrow(x, 0, n / 2, n / 2)));
  got.insert(got.end(), rest.begin(), rest.end());
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5f) << i;
  EXPECT_EQ(moe_begin_batch(parted, 1, false), 1);
}

// Chimera's two replicas of a layer with capacity: one replica's routing pass over every part
// (MoeBatchSplit::recorded_parts), then each replica's real pass of its own parts planned from
// those counts (plan_batch) drops what the whole batch drops, with the whole batch's outputs,
// loads and auxiliary loss.
TEST(MoE, ReplicasPlannedFromOneRoutingPassAreTheWholeBatch) {
  const int64_t c = 6, n = 16, parts = 4, rows = n / parts;
  MoeOptions o;
  o.experts = 4;
  o.top_k = 2;
  o.capacity_factor = 1.0;  // ceil(2 x 16 / 4) = 8 places per expert
  o.aux_loss = 0.05;
  o.z_loss = 0.01;
  MoE whole(c, o), first(c, o), second(c, o);
  for (MoE* m : {&whole, &first, &second}) m->init_parameters(31);
  const Tensor x = random_tensor({n, c}, 32);
  const std::vector<float> want = values(whole(x));
  ASSERT_GT(whole.stats().dropped, 0) << "the test needs an expert over its capacity";

  first.begin_batch(parts, /*record=*/true);
  for (int64_t p = 0; p < parts; ++p) {  // the routing pass, every part through one replica
    NoGradGuard no_grad;
    first(narrow(x, 0, p * rows, rows));
  }
  const std::vector<std::vector<int64_t>> counts = first.recorded_parts();
  ASSERT_EQ(int64_t(counts.size()), parts);
  std::vector<std::vector<int64_t>> places;
  std::vector<int64_t> before(4, 0);
  for (const std::vector<int64_t>& part : counts) {
    places.push_back(before);
    for (size_t e = 0; e < 4; ++e) before[e] += part[e];
  }
  const std::vector<int64_t> totals = first.recorded_batch();
  first.plan_batch(parts, totals, {places[0], places[1]});
  second.plan_batch(parts, totals, {places[2], places[3]});
  std::vector<float> got;
  std::vector<int64_t> load(4, 0);
  int64_t dropped = 0;
  double aux = 0;
  for (int64_t p = 0; p < parts; ++p) {
    MoE& replica = p < 2 ? first : second;
    const std::vector<float> v = values(replica(narrow(x, 0, p * rows, rows)));
    got.insert(got.end(), v.begin(), v.end());
    for (size_t e = 0; e < 4; ++e) load[e] += replica.stats().load[e];
    dropped += replica.stats().dropped;
    aux += replica.aux_loss().item();
  }
  EXPECT_EQ(load, whole.stats().load);
  EXPECT_EQ(dropped, whole.stats().dropped);
  EXPECT_NEAR(aux, whole.aux_loss().item(), 1e-6 * std::abs(whole.aux_loss().item()));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5f) << i;
  // Without a plan, a replica that sees some of the parts refuses capacity.
  MoE lone(c, o);
  lone.init_parameters(31);
  lone.begin_batch(parts, /*record=*/false, /*seen=*/2);
  try {
    lone(narrow(x, 0, 0, rows));
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("plan the batch"), std::string::npos) << e.what();
  }
}

// A GPT of 3 blocks of 8 channels over 11 tokens (padded to 16), 6 positions.
GptConfig tiny_gpt() {
  GptConfig config;
  config.vocab = 11;
  config.padded_vocab = 16;
  config.layers = 3;
  config.heads = 2;
  config.channels = 8;
  config.max_seq_len = 6;
  return config;
}

TEST(MoE, GptAddsTheAuxiliaryLosses) {
  const GptConfig config = tiny_gpt();
  GptOptions options;
  options.moe.experts = 4;
  options.moe.top_k = 2;
  options.moe.every = 2;  // blocks 0 and 2
  GPT gpt(config, options);
  gpt.init_parameters(1);
  ASSERT_EQ(gpt.moe_layers().size(), 2u);
  EXPECT_NE(gpt.block(0).moe, nullptr);
  EXPECT_NE(gpt.block(1).mlp, nullptr);
  EXPECT_NE(gpt.block(2).moe, nullptr);
  bool named = false;
  for (auto& [name, p] : gpt.named_parameters())
    named |= name == "blocks.2.mlp.experts.3.proj.bias";
  EXPECT_TRUE(named);
  std::vector<int64_t> ids(12), next(12);
  for (int64_t i = 0; i < 12; ++i) ids[size_t(i)] = i % 11, next[size_t(i)] = (i * 3) % 11;
  Tensor idx = Tensor::from_vector(ids, {2, 6}), targets = Tensor::from_vector(next, {2, 6});
  const double total = gpt.loss(idx, targets).item();
  double aux = 0;
  for (const MoeLayer* m : gpt.moe_layers()) aux += m->aux_loss().item();
  EXPECT_GT(aux, 0);
  EXPECT_NEAR(total, gpt.last_lm_loss() + aux, 1e-6);
  options.moe.top_k = 5;
  try {
    GPT bad(config, options);
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_k must be in [1, experts = 4]"), std::string::npos)
        << e.what();
  }
}

// Activation checkpointing of MoE blocks (Note [Checkpointed MoE blocks] in
// core/nn/block_checkpointing.h): with capacity drops, dropout and both auxiliary losses, and with
// the batch in two parts after a routing pass (Note [A batch in micro-batches]), the losses, every
// gradient (the routers' too, which only the auxiliary losses' gradient reaches through the
// recomputation) and the layers' statistics equal the run without checkpointing bit for bit: the
// recomputation replays each forward's routing and counts nothing again.
TEST(MoE, CheckpointedGptIsTheUncheckpointedGptBitForBit) {
  const GptConfig config = tiny_gpt();
  std::vector<int64_t> ids(24), next(24);
  for (int64_t i = 0; i < 24; ++i) ids[size_t(i)] = (i * 7) % 11, next[size_t(i)] = (i * 3) % 11;
  const Tensor idx = Tensor::from_vector(ids, {4, 6}), targets = Tensor::from_vector(next, {4, 6});
  for (int64_t parts : {1, 2}) {
    GptOptions options;
    options.dropout = 0.1;
    options.moe.experts = 4;
    options.moe.top_k = 2;
    options.moe.every = 2;  // blocks 0 and 2
    options.moe.capacity_factor = 1.0;
    options.moe.aux_loss = 0.05;
    options.moe.z_loss = 0.01;
    GPT plain(config, options);
    options.checkpoint = true;
    GPT checkpointed(config, options);
    plain.init_parameters(5);
    checkpointed.init_parameters(5);
    std::vector<double> losses[2];
    std::vector<int64_t> loads[2];
    int64_t dropped[2] = {0, 0};
    GPT* models[2] = {&plain, &checkpointed};
    for (int m = 0; m < 2; ++m) {
      GPT& gpt = *models[m];
      const int64_t rows = 4 / parts;
      if (parts > 1) {  // the routing pass, then the parts for real
        moe_begin_batch(gpt, parts, /*record=*/true);
        NoGradGuard no_grad;
        for (int64_t p = 0; p < parts; ++p) {
          DropoutStepGuard part(3, {p, parts});
          gpt(narrow(idx, 0, p * rows, rows));
        }
      }
      for (int64_t p = 0; p < parts; ++p) {
        DropoutStepGuard part(3, {p, parts});
        Tensor loss = gpt.loss(narrow(idx, 0, p * rows, rows), narrow(targets, 0, p * rows, rows));
        losses[m].push_back(loss.item());
        for (const MoeLayer* layer : gpt.moe_layers()) {
          loads[m].insert(loads[m].end(), layer->stats().load.begin(), layer->stats().load.end());
          dropped[m] += layer->stats().dropped;
        }
        loss.backward();
        // The recomputation in backward leaves the forward's statistics as they were.
        size_t at = loads[m].size();
        const std::vector<const MoeLayer*> layers = gpt.moe_layers();
        for (auto it = layers.rbegin(); it != layers.rend(); ++it) {
          const std::vector<int64_t>& load = (*it)->stats().load;
          at -= load.size();
          EXPECT_EQ(load, std::vector<int64_t>(loads[m].begin() + int64_t(at),
                                               loads[m].begin() + int64_t(at + load.size())))
              << "parts " << parts;
        }
      }
    }
    EXPECT_GT(dropped[0], 0) << "the test needs an expert over its capacity";
    EXPECT_EQ(losses[1], losses[0]) << "parts " << parts;
    EXPECT_EQ(loads[1], loads[0]) << "parts " << parts;
    EXPECT_EQ(dropped[1], dropped[0]) << "parts " << parts;
    for (auto& [name, p] : plain.named_parameters()) {
      ASSERT_TRUE(p.grad().defined()) << name;
      EXPECT_EQ(values(param(checkpointed, name).grad()), values(p.grad()))
          << name << " (parts " << parts << ")";
    }
  }
}

// The layer on a GPU (the router, the dispatch, the grouped GEMM of kernels/cuda/grouped_gemm.h,
// the combine) against the same layer on the CPU: the same routing and loads, outputs, losses and
// every gradient equal to f32 rounding (the GEMMs sum in other orders), and two GPU runs equal bit
// for bit (the combine adds in expert order, with no atomics).
TEST(MoECuda, MatchesTheCpuAndIsBitwiseDeterministic) {
  LOOM_SKIP_WITHOUT_CUDA();
  const int64_t c = 16, n = 40;
  for (double capacity : {0.0, 1.0}) {
    MoeOptions o;
    o.experts = 4;
    o.top_k = 2;
    o.capacity_factor = capacity;
    o.aux_loss = 0.05;
    o.z_loss = 0.01;
    MoE cpu(c, o), gpu(c, o);
    cpu.init_parameters(5);
    gpu.init_parameters(5);
    gpu.to(Device::cuda(0));
    const Tensor x = random_tensor({n, c}, 6), w = random_tensor({n, c}, 7);
    struct Run {
      std::vector<float> out, x_grad;
      std::vector<std::pair<std::string, std::vector<float>>> grads;
      MoeStats stats;
      double aux = 0;
    };
    auto run = [&](MoE& moe, Device device) {
      moe.zero_grad();
      Tensor xi = x.detach().to(device);
      xi.set_requires_grad(true);
      Tensor out = moe(xi);
      Run r;
      r.out = values(out.to(Device::cpu()));
      r.stats = moe.stats();
      r.aux = moe.aux_loss().item();
      autograd::backward({add(sum(mul(out, w.to(device))), moe.aux_loss())},
                         {Tensor::ones({}, DType::kF32, device)});
      r.x_grad = values(xi.grad().to(Device::cpu()));
      for (auto& [name, p] : moe.named_parameters())
        r.grads.emplace_back(name, values(p.grad().to(Device::cpu())));
      return r;
    };
    const Run want = run(cpu, Device::cpu()), got = run(gpu, Device::cuda(0));
    EXPECT_EQ(got.stats.load, want.stats.load) << "capacity " << capacity;
    EXPECT_EQ(got.stats.dropped, want.stats.dropped);
    if (capacity > 0) EXPECT_GT(want.stats.dropped, 0) << "the test needs an expert over capacity";
    EXPECT_NEAR(got.aux, want.aux, 1e-6 * (1 + std::abs(want.aux)));
    auto expect_near = [](const std::vector<float>& g, const std::vector<float>& v,
                          const std::string& what) {
      ASSERT_EQ(g.size(), v.size()) << what;
      for (size_t i = 0; i < g.size(); ++i)
        EXPECT_NEAR(g[i], v[i], 1e-5f * (1.0f + std::abs(v[i]))) << what << "[" << i << "]";
    };
    expect_near(got.out, want.out, "out");
    expect_near(got.x_grad, want.x_grad, "x.grad");
    ASSERT_EQ(got.grads.size(), want.grads.size());
    for (size_t i = 0; i < got.grads.size(); ++i)
      expect_near(got.grads[i].second, want.grads[i].second, got.grads[i].first + ".grad");
    const Run again = run(gpu, Device::cuda(0));
    EXPECT_EQ(again.out, got.out);
    EXPECT_EQ(again.x_grad, got.x_grad);
    for (size_t i = 0; i < got.grads.size(); ++i)
      EXPECT_EQ(again.grads[i].second, got.grads[i].second) << got.grads[i].first;
  }
}

// bf16 experts on a GPU against bf16 experts on the CPU: the routing is f32 on both (the same
// loads), the expert GEMMs round their bf16 products in other orders.
TEST(MoECuda, Bf16MatchesTheCpuWithinRounding) {
  LOOM_SKIP_WITHOUT_CUDA();
  const int64_t c = 16, n = 24;
  MoeOptions o;
  o.experts = 4;
  o.top_k = 2;
  MoE cpu(c, o), gpu(c, o);
  cpu.init_parameters(8);
  gpu.init_parameters(8);
  cpu.to(DType::kBF16);
  gpu.to(DType::kBF16);
  gpu.to(Device::cuda(0));
  const Tensor x = random_tensor({n, c}, 9, -1.0f, 1.0f).to(DType::kBF16);
  const std::vector<float> want = values(cpu(x).to(DType::kF32));
  const std::vector<float> got =
      values(gpu(x.to(Device::cuda(0))).to(DType::kF32).to(Device::cpu()));
  EXPECT_EQ(gpu.stats().load, cpu.stats().load);
  float scale = 0;
  for (float v : want) scale = std::max(scale, std::fabs(v));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)  // bf16 keeps 8 bits: a few roundings of ~0.4%
    EXPECT_NEAR(got[i], want[i], 0.03f * scale) << i;
}

}  // namespace
}  // namespace loom::nn
