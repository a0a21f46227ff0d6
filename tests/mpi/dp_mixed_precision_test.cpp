// Mixed precision under data parallelism. bf16 and f16 models with f32 master weights, over DDP
// (stage 0) and ZeRO 1, 2 and 3, with and without gradient accumulation, against the
// single-process run in the same dtype and against the f32 run; and f16 with an overflow injected
// on one rank, which every rank must skip.
#include <gtest/gtest.h>

#include <limits>

#include "collectives/communicator.h"
#include "core/ops.h"
#include "dp_reference.h"
#include "parallel/ddp.h"
#include "parallel/zero.h"

namespace loom::parallel {
namespace {

using namespace loom::testing;

// One data-parallel training setup in a low-precision dtype: DDP with MixedPrecisionOptimizer
// (stage 0) or ZeRO, which keeps its own f32 masters.
struct LowPrecisionTrainer {
  LowPrecisionTrainer(nn::GPT& model, std::shared_ptr<comm::Communicator> world, int stage,
                      int grad_accum) {
    if (stage == 0) {
      DdpOptions d;
      d.grad_accum = grad_accum;
      d.bucket_mb = 0.002;
      ddp = std::make_unique<DistributedDataParallel>(model, world, d);
      const DType dtype = model.parameters()[0].dtype();
      auto mp = std::make_unique<optim::MixedPrecisionOptimizer>(
          model.parameters(), test_adamw_over,
          dtype == DType::kF16 ? optim::LossScaler() : optim::LossScaler::none());
      mixed = mp.get();
      opt = std::move(mp);
    } else {
      ZeroOptions z;
      z.stage = stage;
      z.grad_accum = grad_accum;
      z.bucket_mb = 0.002;
      auto zo = std::make_unique<ZeroOptimizer>(model, world, z, test_adamw_over);
      zero = zo.get();
      opt = std::move(zo);
    }
  }
  void backward(const Tensor& loss) {
    if (zero)
      zero->backward(loss);
    else
      ddp->backward(mixed->scale_loss(loss));
  }
  void step(double clip = 0) {
    if (ddp) ddp->finish();
    if (clip > 0) {
      const double norm = zero ? zero->clip_grad_norm(clip) : mixed->clip_grad_norm(clip);
      EXPECT_GT(norm, clip) << "the test must exercise clipping";
    }
    opt->step();
    opt->zero_grad();
  }
  const optim::LossScaler& scaler() const { return zero ? zero->scaler() : mixed->scaler(); }
  void gather() {
    if (zero) zero->gather_parameters();
  }

  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<optim::Optimizer> opt;
  optim::MixedPrecisionOptimizer* mixed = nullptr;
  ZeroOptimizer* zero = nullptr;
};

RunResult low_precision_run(const std::shared_ptr<comm::Communicator>& world, DType dtype,
                            int stage, int grad_accum, double clip = 0) {
  nn::GPT model(tiny_gpt_config());
  model.init_parameters(kSeed);
  model.to(dtype);
  LowPrecisionTrainer t(model, world, stage, grad_accum);
  int steps = 0;
  return split_batch_run(
      *world, model, grad_accum, [&](const Tensor& loss) { t.backward(loss); },
      [&] {
        t.step(clip);
        if (++steps == kSteps) t.gather();
      });
}

// Tolerances. A data-parallel low-precision run is not bit-identical to the single-process run in
// the same dtype: each rank's (and each micro-batch's) gradient is rounded to bf16 (8 significant
// bits) before the sum, where one process rounds the whole sum once, so gradients differ by up to
// ~2^-8 relative. Two effects follow, and the bound on each parameter tensor is their sum:
//  - a master weight a hair apart can round to the neighbouring bf16 value: 2^-7 of the tensor's
//    scale (f16, 11 bits: 2^-10);
//  - AdamW moves each element by about lr * m / sqrt(v), which is +-lr whatever the gradient's
//    size, so an element whose true gradient is below the rounding of the sum (the key third of
//    attn.qkv.bias, See dp_reference.h; small biases) can step the other way: lr per step, and
//    it happens in few steps out of 5, so 2 * lr in all.
// The loss compares within 2e-3 relative (f16 5e-4). Against f32 the low-precision model itself
// differs (rounded weights and activations): the same bounds with 1e-2 of scale and 4e-3 loss.
struct Tolerance {
  double params_rel, loss_rel;
};
constexpr double kAdamSignFlips = 2 * 1e-3;  // 2 * test_adamw().lr
Tolerance same_dtype_tolerance(DType dtype) {
  return dtype == DType::kBF16 ? Tolerance{1.0 / 128, 2e-3} : Tolerance{1.0 / 1024, 5e-4};
}

void expect_close_run(const RunResult& got, const RunResult& want, Tolerance tol) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t s = 0; s < want.losses.size(); ++s)
    EXPECT_NEAR(got.losses[s], want.losses[s], tol.loss_rel * std::abs(want.losses[s]))
        << "step " << s;
  ASSERT_EQ(got.params.size(), want.params.size());
  for (size_t i = 0; i < want.params.size(); ++i) {
    const auto& [name, w] = want.params[i];
    const auto& g = got.params[i].second;
    ASSERT_EQ(g.size(), w.size()) << name;
    double scale = 0, err = 0;
    for (size_t k = 0; k < w.size(); ++k) {
      scale = std::max(scale, double(std::abs(w[k])));
      err = std::max(err, double(std::abs(g[k] - w[k])));
    }
    EXPECT_LE(err, tol.params_rel * scale + kAdamSignFlips)
        << name << ": max difference " << err << ", max |value| " << scale;
  }
}

TEST(MixedPrecision, Bf16AndF16MatchTheSingleProcessRunInTheirDtype) {
  auto world = comm::world();
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    const RunResult want = single_process_run(0, dtype);
    for (int stage : {0, 1, 2, 3})
      for (int accum : {1, 2}) {
        SCOPED_TRACE(detail::str_cat(world->size(), " ranks, ", dtype_name(dtype), ", stage ",
                                     stage, ", grad_accum ", accum));
        expect_close_run(low_precision_run(world, dtype, stage, accum), want,
                         same_dtype_tolerance(dtype));
      }
  }
}

// Clipping works on the unscaled f32 master gradients, whose global norm each wrapper takes over
// whatever it holds (whole gradients, or shards summed over the group).
TEST(MixedPrecision, ClipsTheGlobalNormInBf16UnderEverySharding) {
  auto world = comm::world();
  const RunResult want = single_process_run(0.05, DType::kBF16);
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE(detail::str_cat(world->size(), " ranks, bf16, stage ", stage));
    expect_close_run(low_precision_run(world, DType::kBF16, stage, 1, 0.05), want,
                     same_dtype_tolerance(DType::kBF16));
  }
}

TEST(MixedPrecision, Bf16StaysCloseToF32) {
  const RunResult f32 = single_process_run();
  const RunResult bf16 = single_process_run(0, DType::kBF16);
  expect_close_run(bf16, f32, Tolerance{1e-2, 4e-3});
}

// Step 2's loss on the last rank is multiplied by 1e30: its f16 gradients overflow to inf. Every
// rank must skip exactly that step — parameters and optimizer state bit-for-bit unchanged, the
// scale halved, one skip counted — and the next step trains again.
TEST(MixedPrecision, AnF16OverflowOnOneRankSkipsTheStepOnEveryRank) {
  auto world = comm::world();
  const int n = world->size();
  constexpr int kBadStep = 2;
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE(detail::str_cat(n, " ranks, stage ", stage));
    nn::GPT model(tiny_gpt_config());
    model.init_parameters(kSeed);
    model.to(DType::kF16);
    LowPrecisionTrainer t(model, world, stage, 1);
    const double initial_scale = t.scaler().scale();
    const int64_t rows = kGlobalBatch / n;
    std::vector<std::pair<std::string, std::vector<float>>> before_params;
    std::map<std::string, Tensor> before_state;
    for (int s = 0; s < 4; ++s) {
      GlobalBatch b = global_batch(s, model.config().vocab);
      const int64_t first = int64_t(world->rank()) * rows;
      Tensor loss = model.loss(b.rows(first, rows), b.target_rows(first, rows));
      if (s == kBadStep && world->rank() == n - 1) loss = scale(loss, 1e30);
      if (s == kBadStep) {
        t.gather();
        before_params = parameter_values(model);
        before_state = t.opt->state_dict();
      }
      t.backward(loss);
      t.step();
      t.gather();
      if (s == kBadStep) {
        EXPECT_TRUE(t.scaler().last_step_skipped());
        expect_same_run(RunResult{{}, parameter_values(model)}, RunResult{{}, before_params}, 0);
        const std::map<std::string, Tensor> after = t.opt->state_dict();
        ASSERT_EQ(after.size(), before_state.size());
        for (const auto& [key, v] : before_state) {
          if (v.dtype() == DType::kI64)
            EXPECT_EQ(after.at(key).to_vector<int64_t>(), v.to_vector<int64_t>()) << key;
          else
            EXPECT_EQ(after.at(key).to(DType::kF32).to_vector<float>(),
                      v.to(DType::kF32).to_vector<float>())
                << key;
        }
      } else {
        EXPECT_FALSE(t.scaler().last_step_skipped()) << "step " << s;
      }
    }
    EXPECT_EQ(t.scaler().skipped_steps(), 1);
    EXPECT_EQ(t.scaler().scale(), initial_scale / 2);
    // The step after the skip trained: the parameters moved.
    double moved = 0;
    const auto after = parameter_values(model);
    for (size_t i = 0; i < after.size(); ++i)
      for (size_t k = 0; k < after[i].second.size(); ++k)
        moved = std::max(moved, double(std::abs(after[i].second[k] - before_params[i].second[k])));
    EXPECT_GT(moved, 0.0);
  }
}

}  // namespace
}  // namespace loom::parallel
