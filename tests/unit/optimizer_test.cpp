// Optimizers against hand-computed updates (formulas written out below, in double) and against
// values printed by PyTorch 1.13's torch.optim; saving and loading their state (a resumed run
// continues bit for bit); clipping and learning-rate schedules.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>

#include "optimizer/adamw.h"
#include "optimizer/clip_grad.h"
#include "optimizer/grouped.h"
#include "optimizer/lr_schedule.h"
#include "optimizer/sgd.h"
#include "testing/files.h"
#include "testing/gradcheck.h"

namespace loom {
namespace {

using optim::AdamW;
using optim::AdamWOptions;
using optim::SGD;
using optim::SgdOptions;

const std::vector<double> kP0 = {1.0, -2.0, 0.5};
const std::vector<std::vector<double>> kGrads = {{0.1, -0.2, 0.3}, {-0.4, 0.5, 0.25}};

Tensor param(const std::vector<double>& v) {
  std::vector<float> f(v.begin(), v.end());
  Tensor t = Tensor::from_vector(f, {int64_t(f.size())});
  t.set_requires_grad(true);
  return t;
}

void set_grad(Tensor& p, const std::vector<double>& g) {
  std::vector<float> f(g.begin(), g.end());
  p.set_grad(Tensor::from_vector(f, p.shape()));
}

// The updates are computed in f32 by the kernels; 1e-6 absolute on values of order 1 is a few
// f32 ulps of accumulated rounding over two steps.
void expect_values(const Tensor& p, const std::vector<double>& expected, double tol = 1e-6) {
  std::vector<float> v = p.to_vector<float>();
  ASSERT_EQ(v.size(), expected.size());
  for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(v[i], expected[i], tol) << "element " << i;
}

TEST(SGD, PlainStepsAreLrTimesGradient) {
  Tensor p = param(kP0);
  SGD sgd({p}, SgdOptions{.lr = 0.1});
  std::vector<double> e = kP0;
  for (const auto& g : kGrads) {
    set_grad(p, g);
    sgd.step();
    for (size_t i = 0; i < 3; ++i) e[i] -= 0.1 * g[i];  // p -= lr * g
  }
  expect_values(p, e);
  EXPECT_TRUE(sgd.state().empty());  // no momentum, no state
}

TEST(SGD, MomentumAndCoupledWeightDecay) {
  const double lr = 0.1, mu = 0.9, wd = 0.01;
  Tensor p = param(kP0);
  SGD sgd({p}, SgdOptions{.lr = lr, .momentum = mu, .weight_decay = wd});
  std::vector<double> e = kP0, buf(3);
  for (size_t s = 0; s < kGrads.size(); ++s) {
    set_grad(p, kGrads[s]);
    sgd.step();
    for (size_t i = 0; i < 3; ++i) {
      const double g = kGrads[s][i] + wd * e[i];  // coupled decay: g += wd * p
      buf[i] = s == 0 ? g : mu * buf[i] + g;      // first step: buf = g
      e[i] -= lr * buf[i];                        // p -= lr * buf
    }
  }
  expect_values(p, e);
  // torch.optim.SGD([p], lr=0.1, momentum=0.9, weight_decay=0.01), same two gradients.
  expect_values(p, {1.01811099, -2.00622201, 0.416580498});
  auto state = sgd.state();
  ASSERT_EQ(state.size(), 1u);
  EXPECT_EQ(state[0].first, "0.momentum_buffer");
  expect_values(state[0].second, buf);
  EXPECT_EQ(sgd.state_bytes(), 3 * sizeof(float));
}

TEST(SGD, Nesterov) {
  const double lr = 0.1, mu = 0.9;
  Tensor p = param(kP0);
  SGD sgd({p}, SgdOptions{.lr = lr, .momentum = mu, .nesterov = true});
  std::vector<double> e = kP0, buf(3);
  for (size_t s = 0; s < kGrads.size(); ++s) {
    set_grad(p, kGrads[s]);
    sgd.step();
    for (size_t i = 0; i < 3; ++i) {
      const double g = kGrads[s][i];
      buf[i] = s == 0 ? g : mu * buf[i] + g;
      e[i] -= lr * (g + mu * buf[i]);  // nesterov: d = g + mu * buf
    }
  }
  expect_values(p, e);
  expect_values(p, {1.04890001, -2.04080009, 0.371199995});  // PyTorch, nesterov=True
}

TEST(AdamW, TwoStepsMatchTheFormula) {
  const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
  Tensor p = param(kP0);
  AdamW adam({p}, AdamWOptions{.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd});
  std::vector<double> e = kP0, m(3), v(3);
  for (size_t s = 0; s < kGrads.size(); ++s) {
    set_grad(p, kGrads[s]);
    adam.step();
    const double t = double(s + 1);
    for (size_t i = 0; i < 3; ++i) {
      const double g = kGrads[s][i];
      e[i] *= 1.0 - lr * wd;                // decoupled weight decay
      m[i] = b1 * m[i] + (1 - b1) * g;      // first moment
      v[i] = b2 * v[i] + (1 - b2) * g * g;  // second moment
      const double mhat = m[i] / (1 - std::pow(b1, t)), vhat = v[i] / (1 - std::pow(b2, t));
      e[i] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
  }
  expect_values(p, e);
  // torch.optim.AdamW([p], lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1).
  expect_values(p, {0.993606091, -1.99043429, 0.479098797});
  EXPECT_EQ(adam.step_count(0), 2);
  auto state = adam.state();
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state[0].first, "0.exp_avg");
  EXPECT_EQ(state[1].first, "0.exp_avg_sq");
  expect_values(state[0].second, m);
  expect_values(state[1].second, v, 1e-9);  // v is of order 1e-4
  EXPECT_EQ(adam.state_bytes(), 2 * 3 * sizeof(float));
}

TEST(AdamW, TenStepsMatchPyTorch) {
  // torch.optim.AdamW([p], lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05), the two
  // gradients alternating for ten steps; printed with %.9g.
  Tensor p = param(kP0);
  AdamW adam({p}, AdamWOptions{
                      .lr = 0.01, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.05});
  for (int s = 0; s < 10; ++s) {
    set_grad(p, kGrads[size_t(s % 2)]);
    adam.step();
  }
  expect_values(p, {1.0296433, -2.01295209, 0.398484468});
}

TEST(Optimizer, ParametersWithoutGradientAreSkipped) {
  Tensor a = param(kP0), b = param({5.0, 6.0});
  AdamW adam({a, b}, AdamWOptions{.lr = 0.01});
  set_grad(a, kGrads[0]);
  adam.step();
  expect_values(b, {5.0, 6.0}, 0.0);
  EXPECT_EQ(adam.step_count(0), 1);
  EXPECT_EQ(adam.step_count(1), 0);
  // b's first update then uses bias correction for t = 1, like a fresh optimizer's.
  Tensor fresh = param({5.0, 6.0});
  AdamW reference({fresh}, AdamWOptions{.lr = 0.01});
  set_grad(b, {0.3, -0.7});
  set_grad(fresh, {0.3, -0.7});
  a.zero_grad();
  std::vector<float> a_before = a.to_vector<float>();
  adam.step();
  reference.step();
  EXPECT_EQ(b.to_vector<float>(), fresh.to_vector<float>());
  EXPECT_EQ(a.to_vector<float>(), a_before);

  Tensor c = param(kP0);
  SGD sgd({c}, SgdOptions{.lr = 0.1, .momentum = 0.9});
  sgd.step();  // no gradient at all
  expect_values(c, kP0, 0.0);
}

TEST(Optimizer, ZeroGradDropsGradients) {
  Tensor a = param(kP0);
  SGD sgd({a}, SgdOptions{});
  set_grad(a, kGrads[0]);
  sgd.zero_grad();
  EXPECT_FALSE(a.grad().defined());
}

TEST(Optimizer, BadArgumentsAreClearErrors) {
  Tensor a = param(kP0);
  EXPECT_THROW(SGD({a}, SgdOptions{.lr = -1.0}), Error);
  EXPECT_THROW(SGD({a}, SgdOptions{.lr = 0.1, .nesterov = true}), Error);
  EXPECT_THROW(AdamW({a}, AdamWOptions{.beta1 = 1.0}), Error);
  EXPECT_THROW(AdamW({a, a}, AdamWOptions{}), Error);
  Tensor i = Tensor::zeros({3}, DType::kI32);
  try {
    AdamW bad({i}, AdamWOptions{});
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("AdamW: parameter 0"), std::string::npos) << e.what();
  }
  a.set_grad(Tensor::zeros({3}, DType::kI32));  // a gradient of the wrong dtype
  SGD sgd({a}, SgdOptions{});
  EXPECT_THROW(sgd.step(), Error);
}

// AdamW and SGD on CUDA parameters run the CUDA update kernels, which round like the CPU's
// (Note [Optimizer FMA contraction]): two steps give the CPU's values bit for bit.
TEST(Optimizer, CudaParametersStepLikeCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (bool adam : {true, false}) {
    SCOPED_TRACE(adam ? "AdamW" : "SGD");
    auto run = [&](Device device) {
      Tensor p = param(kP0).detach().to(device);
      p.set_requires_grad(true);
      AdamWOptions ao;
      ao.weight_decay = 0.1;
      SgdOptions so;
      so.lr = 0.1;
      so.momentum = 0.9;
      so.weight_decay = 0.01;
      std::unique_ptr<optim::Optimizer> opt;
      if (adam)
        opt = std::make_unique<AdamW>(std::vector<Tensor>{p}, ao);
      else
        opt = std::make_unique<SGD>(std::vector<Tensor>{p}, so);
      for (const std::vector<double>& g : kGrads) {
        std::vector<float> f(g.begin(), g.end());
        p.set_grad(Tensor::from_vector(f, p.shape()).to(device));
        opt->step();
      }
      return p.to(Device::cpu()).to_vector<float>();
    };
    EXPECT_EQ(run(Device::cuda()), run(Device::cpu()));
  }
}

// ---- state dicts: see Note [Optimizer state dict]

// Three parameters of different shapes, fixed values.
std::vector<Tensor> make_params() {
  std::vector<Tensor> out;
  uint64_t seed = 1;
  for (const Shape& shape : {Shape{3}, Shape{2, 4}, Shape{5}}) {
    Tensor t = testing::random_tensor(shape, seed++);
    t.set_requires_grad(true);
    out.push_back(t);
  }
  return out;
}

std::vector<Tensor> copy_params(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  for (const Tensor& p : params) {
    Tensor t = p.detach().clone();
    t.set_requires_grad(true);
    out.push_back(t);
  }
  return out;
}

// The gradients of step `s`, the same for every copy of the parameters.
void set_grads(std::vector<Tensor>& params, int s) {
  for (size_t i = 0; i < params.size(); ++i)
    params[i].set_grad(testing::random_tensor(params[i].shape(), 1000 + 10 * uint64_t(s) + i));
}

std::string host_bytes(const Tensor& t) {
  Tensor c = t.detach().contiguous();
  std::string out(c.nbytes(), '\0');
  c.copy_to_host(out.data(), out.size());
  return out;
}

// Same shape, dtype and bits (EXPECT_EQ on floats would take -0 for +0).
void expect_bit_identical(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  ASSERT_EQ(actual.dtype(), expected.dtype()) << what;
  const std::string a = host_bytes(actual), e = host_bytes(expected);
  const size_t width = dtype_size(actual.dtype());
  for (size_t k = 0; k < a.size(); k += width)
    if (a.compare(k, width, e, k, width) != 0) {
      ADD_FAILURE() << what << ": element " << k / width << " differs";
      return;
    }
}

void expect_same_state_dict(const std::map<std::string, Tensor>& actual,
                            const std::map<std::string, Tensor>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (const auto& [key, t] : expected) {
    ASSERT_EQ(actual.count(key), 1u) << key;
    expect_bit_identical(actual.at(key), t, key);
  }
}

using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;

// Steps `a` three times and loads its state into `b`, over copies of a's parameters; both then
// step twice with the same gradients. b must continue exactly as a does.
void expect_bit_exact_resume(const MakeOptimizer& make) {
  std::vector<Tensor> pa = make_params();
  std::unique_ptr<optim::Optimizer> a = make(pa);
  for (int s = 0; s < 3; ++s) {
    set_grads(pa, s);
    a->step();
  }
  const std::map<std::string, Tensor> saved = a->state_dict();
  std::vector<Tensor> pb = copy_params(pa);
  std::unique_ptr<optim::Optimizer> b = make(pb);
  b->load_state_dict(saved);
  expect_same_state_dict(b->state_dict(), saved);
  for (int s = 3; s < 5; ++s) {
    set_grads(pa, s);
    set_grads(pb, s);
    a->step();
    b->step();
  }
  for (size_t i = 0; i < pa.size(); ++i)
    expect_bit_identical(pb[i], pa[i], "parameter " + std::to_string(i));
  expect_same_state_dict(b->state_dict(), a->state_dict());
}

TEST(StateDict, AdamWResumesBitExactly) {
  expect_bit_exact_resume([](std::vector<Tensor> p) {
    return std::make_unique<AdamW>(std::move(p), AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
  });
}

TEST(StateDict, SgdWithMomentumResumesBitExactly) {
  // Dampening makes the first update (buf = g) differ from the later ones, so the loaded step
  // counts are exercised too.
  expect_bit_exact_resume([](std::vector<Tensor> p) {
    return std::make_unique<SGD>(
        std::move(p),
        SgdOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01});
  });
}

TEST(StateDict, HoldsTheStateAndTheStepCounts) {
  std::vector<Tensor> p = make_params();
  AdamW adam(p, AdamWOptions{});
  set_grads(p, 0);
  adam.step();
  p[1].zero_grad();  // parameter 1 skips the second step
  adam.step();
  std::map<std::string, Tensor> sd = adam.state_dict();
  std::vector<std::string> keys;
  for (const auto& [key, t] : sd) keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{"0.exp_avg", "0.exp_avg_sq", "0.step", "1.exp_avg",
                                            "1.exp_avg_sq", "1.step", "2.exp_avg", "2.exp_avg_sq",
                                            "2.step"}));
  EXPECT_EQ(sd.at("0.step").dtype(), DType::kI64);
  EXPECT_EQ(sd.at("0.step").shape(), (Shape{1}));
  EXPECT_EQ(sd.at("0.step").to_vector<int64_t>(), (std::vector<int64_t>{2}));
  EXPECT_EQ(sd.at("1.step").to_vector<int64_t>(), (std::vector<int64_t>{1}));
  EXPECT_EQ(adam.state().size(), 6u);  // the step counts are not state(): state_bytes is memory
  EXPECT_EQ(adam.state_bytes(), 2 * (3 + 8 + 5) * sizeof(float));

  // A copy: later steps leave it as it was.
  const std::string m0 = host_bytes(sd.at("0.exp_avg"));
  adam.step();
  EXPECT_EQ(host_bytes(sd.at("0.exp_avg")), m0);
  EXPECT_EQ(sd.at("0.step").to_vector<int64_t>(), (std::vector<int64_t>{2}));

  Tensor q = param(kP0);
  SGD plain({q}, SgdOptions{});  // no momentum: only the step count
  EXPECT_EQ(plain.state_dict().size(), 1u);
  EXPECT_EQ(plain.state_dict().count("0.step"), 1u);
}

TEST(StateDict, AdamWBiasCorrectionUsesTheLoadedStep) {
  const AdamWOptions options{.lr = 0.01, .weight_decay = 0.1};
  std::vector<Tensor> pa = make_params();
  AdamW a(pa, options);
  for (int s = 0; s < 3; ++s) {
    set_grads(pa, s);
    a.step();
  }
  std::map<std::string, Tensor> saved = a.state_dict();
  std::vector<Tensor> pb = copy_params(pa), pc = copy_params(pa);
  set_grads(pa, 3);
  a.step();

  AdamW b(pb, options);  // fresh: steps 0 until it loads
  b.load_state_dict(saved);
  for (size_t i = 0; i < pb.size(); ++i) EXPECT_EQ(b.step_count(i), 3) << i;
  set_grads(pb, 3);
  b.step();
  for (size_t i = 0; i < pb.size(); ++i) {
    EXPECT_EQ(b.step_count(i), 4) << i;
    expect_bit_identical(pb[i], pa[i], "parameter " + std::to_string(i));
  }

  // The same moments with step counts 0: the update corrects as for t = 1 and comes out
  // different, so the counts above are what made b agree.
  for (size_t i = 0; i < pc.size(); ++i)
    saved[std::to_string(i) + ".step"] = Tensor::from_vector(std::vector<int64_t>{0}, {1});
  AdamW c(pc, options);
  c.load_state_dict(saved);
  set_grads(pc, 3);
  c.step();
  EXPECT_NE(pc[0].to_vector<float>(), pa[0].to_vector<float>());
}

// `bad` is rejected with a message naming every one of `parts`, and the optimizer's state is
// untouched.
void expect_load_error(optim::Optimizer& opt, const std::map<std::string, Tensor>& bad,
                       std::initializer_list<std::string> parts) {
  const std::map<std::string, Tensor> before = opt.state_dict();
  testing::expect_error([&] { opt.load_state_dict(bad); }, parts);
  expect_same_state_dict(opt.state_dict(), before);
}

TEST(StateDict, BadStatesAreClearErrorsAndChangeNothing) {
  // Load a's state after 3 steps into b after 1: a partial copy would show in b's state.
  std::vector<Tensor> pa = make_params(), pb = copy_params(pa);
  AdamW a(pa, AdamWOptions{}), b(pb, AdamWOptions{});
  for (int s = 0; s < 3; ++s) {
    set_grads(pa, s);
    a.step();
  }
  set_grads(pb, 0);
  b.step();
  const std::map<std::string, Tensor> good = a.state_dict();

  std::map<std::string, Tensor> missing = good;
  missing.erase("1.exp_avg_sq");
  missing.erase("2.step");
  expect_load_error(b, missing, {"AdamW: load_state_dict", "missing 1.exp_avg_sq, 2.step"});

  std::map<std::string, Tensor> unexpected = good;
  unexpected["0.momentum_buffer"] = Tensor::zeros({3});
  unexpected["3.step"] = Tensor::from_vector(std::vector<int64_t>{3}, {1});
  expect_load_error(b, unexpected, {"unexpected 0.momentum_buffer, 3.step"});

  std::map<std::string, Tensor> shape = good;
  shape["1.exp_avg"] = Tensor::zeros({4, 2});
  expect_load_error(b, shape,
                    {"'1.exp_avg' has shape [4, 2]", "this optimizer's has shape [2, 4]"});

  std::map<std::string, Tensor> dtype = good;
  dtype["2.exp_avg_sq"] = Tensor::zeros({5}, DType::kI32);
  expect_load_error(b, dtype, {"'2.exp_avg_sq' is i32", "this optimizer's is f32"});

  std::map<std::string, Tensor> negative = good;  // checked last: every tensor before it is fine
  negative["2.step"] = Tensor::from_vector(std::vector<int64_t>{-1}, {1});
  expect_load_error(b, negative, {"'2.step' is -1"});

  std::map<std::string, Tensor> float_step = good;
  float_step["0.step"] = Tensor::full({1}, 3.0);
  expect_load_error(b, float_step, {"'0.step' is Tensor[1] f32", "one i64 value"});

  // Another optimizer's state: SGD with momentum has momentum buffers, not moments.
  std::vector<Tensor> pc = copy_params(pa);
  SGD sgd(pc, SgdOptions{.momentum = 0.9});
  expect_load_error(sgd, good,
                    {"SGD: load_state_dict", "missing 0.momentum_buffer, 1.momentum_buffer",
                     "unexpected 0.exp_avg, 0.exp_avg_sq, 1.exp_avg"});
}

// Parameter groups as one optimizer: each parameter steps as its group's optimizer alone would
// step it (an AdamW and an SGD here, the groups interleaved), state names count across groups,
// and a load one group refuses changes nothing in the groups before it.
TEST(GroupedOptimizer, StepsEachGroupAsItsOwnOptimizer) {
  std::vector<Tensor> p = make_params(), alone = copy_params(p);
  auto adamw = [](std::vector<Tensor> ps) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<AdamW>(std::move(ps), AdamWOptions{.lr = 0.01});
  };
  auto sgd = [](std::vector<Tensor> ps) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<SGD>(std::move(ps), SgdOptions{.lr = 0.1, .momentum = 0.9});
  };
  optim::GroupedOptimizer grouped(p, {1, 0, 1}, {adamw, sgd});
  ASSERT_EQ(grouped.group_count(), 2u);
  AdamW a({alone[1]}, AdamWOptions{.lr = 0.01});
  SGD b({alone[0], alone[2]}, SgdOptions{.lr = 0.1, .momentum = 0.9});
  for (int s = 0; s < 3; ++s) {
    set_grads(p, s);
    set_grads(alone, s);
    grouped.group(1).set_lr(0.1 / (s + 1));
    b.set_lr(0.1 / (s + 1));
    grouped.step();
    a.step();
    b.step();
  }
  for (size_t i = 0; i < p.size(); ++i)
    EXPECT_EQ(p[i].to_vector<float>(), alone[i].to_vector<float>()) << "parameter " << i;

  const std::map<std::string, Tensor> state = grouped.state_dict();
  EXPECT_EQ(state.at("1.exp_avg").to_vector<float>(),
            a.state_dict().at("0.exp_avg").to_vector<float>());
  EXPECT_EQ(state.at("2.momentum_buffer").to_vector<float>(),
            b.state_dict().at("1.momentum_buffer").to_vector<float>());
  EXPECT_EQ(state.count("0.step") + state.count("1.step") + state.count("2.step"), 3u);

  // Group 1 (SGD) refuses a state without its momentum buffers; group 0 must stay as it was.
  std::map<std::string, Tensor> bad = state;
  bad["1.exp_avg"] = Tensor::zeros(p[1].shape());
  bad.erase("0.momentum_buffer");
  try {
    grouped.load_state_dict(bad);
    ADD_FAILURE() << "a state without 0.momentum_buffer loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("momentum_buffer"), std::string::npos) << e.what();
  }
  EXPECT_EQ(grouped.state_dict().at("1.exp_avg").to_vector<float>(),
            state.at("1.exp_avg").to_vector<float>());
  expect_load_error(grouped, {{"7.step", Tensor::zeros({1})}}, {"parameter 7", "has 3"});
}

TEST(StateDict, AnOptimizerThatDoesNotImplementItSaysSo) {
  class Stateless : public optim::Optimizer {
   public:
    explicit Stateless(std::vector<Tensor> params)
        : Optimizer("Stateless", std::move(params), 0.1) {}
    void step() override {}
    std::vector<std::pair<std::string, Tensor>> state() const override { return {}; }
  };
  Stateless opt({param(kP0)});
  testing::expect_error([&] { opt.state_dict(); },
                        {"Stateless: this optimizer does not implement state_dict"});
  testing::expect_error([&] { opt.load_state_dict({}); },
                        {"Stateless: this optimizer does not implement load_state_dict"});
}

TEST(ClipGradNorm, ScalesToMaxNormAndReturnsTheNorm) {
  Tensor a = param({0.0, 0.0}), b = param({0.0}), c = param({1.0});
  set_grad(a, {3.0, 0.0});
  set_grad(b, {4.0});
  // c has no gradient and counts for nothing. Global norm sqrt(3^2 + 4^2) = 5.
  EXPECT_DOUBLE_EQ(optim::clip_grad_norm({a, b, c}, 10.0), 5.0);
  expect_values(a.grad(), {3.0, 0.0}, 0.0);  // 10 / 5 >= 1: untouched
  EXPECT_DOUBLE_EQ(optim::clip_grad_norm({a, b, c}, 1.0), 5.0);
  const double coef = 1.0 / (5.0 + 1e-6);  // PyTorch's max_norm / (norm + 1e-6)
  expect_values(a.grad(), {3.0 * coef, 0.0}, 1e-7);
  expect_values(b.grad(), {4.0 * coef}, 1e-7);
  EXPECT_FALSE(c.grad().defined());
  EXPECT_NEAR(optim::clip_grad_norm({a, b}, 100.0), 5.0 * coef, 1e-6);
  EXPECT_THROW(optim::clip_grad_norm({a}, 0.0), Error);
}

TEST(LrSchedule, WarmupThenCosineToMin) {
  auto s = optim::LrSchedule::cosine(1e-3, 1e-4, 10, 110);
  EXPECT_DOUBLE_EQ(s.lr(0), 1e-3 * 1 / 10);  // (step + 1) / warmup
  EXPECT_DOUBLE_EQ(s.lr(4), 1e-3 * 5 / 10);
  EXPECT_DOUBLE_EQ(s.lr(9), 1e-3);
  EXPECT_DOUBLE_EQ(s.lr(10), 1e-3);                 // cosine starts at max
  EXPECT_NEAR(s.lr(60), 1e-4 + 0.5 * 9e-4, 1e-15);  // halfway: cos(pi / 2) = 0
  EXPECT_NEAR(s.lr(35), 1e-4 + 0.5 * (1 + std::cos(M_PI * 0.25)) * 9e-4, 1e-15);
  EXPECT_DOUBLE_EQ(s.lr(110), 1e-4);  // reaches min at total_steps
  EXPECT_DOUBLE_EQ(s.lr(500), 1e-4);  // and stays
  for (int64_t k = 11; k <= 110; ++k) EXPECT_LE(s.lr(k), s.lr(k - 1)) << "step " << k;

  auto c = optim::LrSchedule::constant(3e-4, 4);
  EXPECT_DOUBLE_EQ(c.lr(0), 3e-4 / 4);
  EXPECT_DOUBLE_EQ(c.lr(3), 3e-4);
  EXPECT_DOUBLE_EQ(c.lr(1000), 3e-4);
  EXPECT_DOUBLE_EQ(optim::LrSchedule::constant(0.5).lr(0), 0.5);
  auto no_warmup = optim::LrSchedule::cosine(1.0, 0.0, 0, 4);
  EXPECT_DOUBLE_EQ(no_warmup.lr(0), 1.0);
  EXPECT_NEAR(no_warmup.lr(2), 0.5, 1e-15);
  EXPECT_THROW(optim::LrSchedule::cosine(1.0, 0.0, 10, 10), Error);
  EXPECT_THROW(optim::LrSchedule::cosine(1.0, 2.0, 0, 10), Error);
}

}  // namespace
}  // namespace loom
