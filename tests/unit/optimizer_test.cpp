// Optimizers against hand-computed updates (formulas written out below, in double) and against
// values printed by PyTorch 1.13's torch.optim, plus clipping and learning-rate schedules.
#include <gtest/gtest.h>

#include <cmath>

#include "optimizer/adamw.h"
#include "optimizer/clip_grad.h"
#include "optimizer/lr_schedule.h"
#include "optimizer/sgd.h"

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

TEST(Optimizer, CudaParametersAreRefusedClearly) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: the CUDA refusal cannot be exercised";
  Tensor p = param(kP0).detach().to(Device::cuda());
  p.set_requires_grad(true);
  p.set_grad(Tensor::ones({3}, DType::kF32, Device::cuda()));
  AdamW adam({p}, AdamWOptions{});
  try {
    adam.step();
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("AdamW: CUDA kernel not implemented yet"),
              std::string::npos)
        << e.what();
  }
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
