// Mixed-precision training pieces against closed forms: the loss scaler's backoff and growth,
// f32 master weights that keep updates a bf16 parameter would round away, and a step with an
// inf gradient that changes nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "optimizer/loss_scaler.h"
#include "optimizer/mixed_precision.h"
#include "optimizer/sgd.h"

namespace loom {
namespace {

using optim::LossScaler;
using optim::LossScalerOptions;

TEST(LossScaler, BacksOffOnEveryBadStepAndGrowsAfterAnIntervalOfGoodOnes) {
  LossScalerOptions o;
  o.init_scale = 1024;
  o.growth_interval = 3;
  LossScaler s(o);
  s.update(true);
  EXPECT_EQ(s.scale(), 512);
  EXPECT_TRUE(s.last_step_skipped());
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 512) << "2 good steps of an interval of 3";
  s.update(true);  // resets the run of good steps
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 256);
  s.update(false);
  EXPECT_EQ(s.scale(), 512);
  EXPECT_EQ(s.skipped_steps(), 2);
  EXPECT_FALSE(s.last_step_skipped());
}

TEST(LossScaler, NoneKeepsScaleOneButCountsSkips) {
  LossScaler s = LossScaler::none();
  s.update(true);
  for (int i = 0; i < 5000; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_EQ(s.skipped_steps(), 1);
  EXPECT_EQ(s.str(), "none");
}

TEST(LossScaler, RejectsBadOptions) {
  LossScalerOptions o;
  o.init_scale = 0;
  EXPECT_THROW(LossScaler{o}, Error);
  o = {};
  o.backoff_factor = 1.5;
  EXPECT_THROW(LossScaler{o}, Error);
}

Tensor bf16_param(const std::vector<float>& v) {
  Tensor t = Tensor::from_vector(v, {int64_t(v.size())}).to(DType::kBF16);
  t.set_requires_grad(true);
  return t;
}

optim::OptimizerFactory sgd(double lr) {
  return [lr](std::vector<Tensor> p) {
    optim::SgdOptions o;
    o.lr = lr;
    return std::make_unique<optim::SGD>(std::move(p), o);
  };
}

// 1.0 - 1e-3 is 1.0 in bf16 (8 significant bits: the next value below 1 is 1 - 2^-8), so plain
// bf16 SGD would never move; the f32 master moves by 1e-3 a step and after 8 steps rounds to a
// new bf16 value.
TEST(MixedPrecision, MastersKeepUpdatesBf16WouldLose) {
  Tensor p = bf16_param({1.0f});
  LossScalerOptions so;
  so.init_scale = 1024;
  so.dynamic = false;
  optim::MixedPrecisionOptimizer opt({p}, sgd(1e-3), LossScaler(so));
  float master = 1.0f;
  for (int step = 0; step < 8; ++step) {
    // The gradient of (scale * loss) with dloss/dp = 1: 1024, exact in bf16.
    p.set_grad(Tensor::full({1}, 1024.0, DType::kBF16));
    opt.step();
    opt.zero_grad();
    master -= 1e-3f;
    EXPECT_FLOAT_EQ(opt.inner().params()[0].item(), master) << "step " << step;
    EXPECT_EQ(p.item(), double(Tensor::full({1}, master).to(DType::kBF16).item()))
        << "the parameter is the rounded master";
  }
  EXPECT_LT(p.item(), 1.0) << "eight updates of 1e-3 reach the next bf16 value below 1";
}

TEST(MixedPrecision, AnInfGradientSkipsTheStepAndBacksOff) {
  Tensor a = bf16_param({0.5f, -1.0f}), b = bf16_param({2.0f});
  optim::MixedPrecisionOptimizer opt({a, b}, sgd(0.1), LossScaler());
  const double scale = opt.scaler().scale();
  EXPECT_EQ(scale, 65536.0);
  a.set_grad(Tensor::full({2}, 1.0, DType::kBF16));
  b.set_grad(Tensor::full({1}, std::numeric_limits<double>::infinity(), DType::kBF16));
  EXPECT_FALSE(opt.unscale_gradients());
  EXPECT_FALSE(std::isfinite(opt.clip_grad_norm(1.0)));
  opt.step();
  opt.zero_grad();
  EXPECT_EQ(a.detach().to(DType::kF32).to_vector<float>(), (std::vector<float>{0.5f, -1.0f}))
      << "nothing changed";
  EXPECT_EQ(b.item(), 2.0);
  EXPECT_EQ(opt.inner().params()[0].to_vector<float>(), (std::vector<float>{0.5f, -1.0f}));
  EXPECT_EQ(opt.scaler().scale(), scale / 2);
  EXPECT_EQ(opt.scaler().skipped_steps(), 1);

  // The next good step divides by the new scale: gradient 32768 * 0.25 means 0.25.
  a.set_grad(Tensor::full({2}, 32768.0 * 0.25, DType::kBF16));
  b.set_grad(Tensor::full({1}, 0.0, DType::kBF16));
  opt.step();
  // The master moves in f32 (0.5 - 0.1 * 0.25); the parameter is its bf16 rounding.
  const float want = 0.5f - 0.1f * 0.25f;
  EXPECT_EQ(opt.inner().params()[0].to_vector<float>()[0], want);
  EXPECT_EQ(a.detach().to(DType::kF32).to_vector<float>()[0],
            float(Tensor::full({1}, want).to(DType::kBF16).item()));
  EXPECT_EQ(opt.scaler().skipped_steps(), 1);
}

// Expert parallelism: another rank found an inf in gradients this rank never sees. The agreement
// says so, and this rank skips too (its own gradients finite), as every rank must.
TEST(MixedPrecision, TheSkipAgreementSkipsWhenAnotherRankFoundAnInf) {
  Tensor p = bf16_param({0.5f});
  optim::MixedPrecisionOptimizer opt({p}, sgd(0.1), LossScaler());
  std::vector<bool> asked;
  bool other_rank_found = true;
  opt.set_skip_agreement([&](bool found) {
    asked.push_back(found);
    return found || other_rank_found;
  });
  p.set_grad(Tensor::full({1}, 65536.0, DType::kBF16));
  EXPECT_FALSE(opt.unscale_gradients());
  opt.step();
  opt.zero_grad();
  EXPECT_EQ(asked, std::vector<bool>{false}) << "asked once, with this rank's finite answer";
  EXPECT_EQ(p.item(), 0.5) << "skipped: nothing changed";
  EXPECT_EQ(opt.scaler().skipped_steps(), 1);
  EXPECT_EQ(opt.scaler().scale(), 32768.0);
  other_rank_found = false;  // every rank finite: the step runs
  p.set_grad(Tensor::full({1}, 32768.0, DType::kBF16));
  opt.step();
  EXPECT_FLOAT_EQ(opt.inner().params()[0].item(), 0.4f);
  EXPECT_EQ(opt.scaler().skipped_steps(), 1);
}

}  // namespace
}  // namespace loom
