// ZeRO stages 1 and 2 against the single-process run (the equivalence principle): 5 AdamW steps
// of a small GPT with the global batch split over the world, with and without gradient
// accumulation, one bucket or many, and with global-norm clipping, give the single-process
// losses and parameters within 1e-5 relative. Also: the optimizer state really is sharded.
#include <gtest/gtest.h>

#include "collectives/communicator.h"
#include "core/ops.h"
#include "dp_reference.h"
#include "parallel/zero.h"

namespace loom::parallel {
namespace {

using namespace loom::testing;

OptimizerFactory adamw_factory() {
  return [](std::vector<Tensor> params) {
    return std::make_unique<optim::AdamW>(std::move(params), test_adamw());
  };
}

RunResult zero_run(const std::shared_ptr<comm::Communicator>& world, int stage, int grad_accum,
                   double bucket_mb, double clip) {
  nn::GPT model(tiny_gpt_config());
  if (world->rank() == 0) model.init_parameters(kSeed);  // the wrapper broadcasts rank 0's values
  ZeroOptions o;
  o.stage = stage;
  o.grad_accum = grad_accum;
  o.bucket_mb = bucket_mb;
  ZeroOptimizer opt(model, world, o, adamw_factory());
  return split_batch_run(
      *world, model, grad_accum, [&](const Tensor& loss) { opt.backward(loss); },
      [&] {
        if (clip > 0)
          EXPECT_GT(opt.clip_grad_norm(clip), clip) << "the test must exercise clipping";
        opt.step();
        opt.zero_grad();
      });
}

TEST(ZeRO, MatchesTheSingleProcessRun) {
  auto world = comm::world();
  const RunResult want = single_process_run();
  for (int stage : {1, 2})
    for (int accum : {1, 2})
      for (double bucket_mb : {25.0, 0.002}) {
        SCOPED_TRACE(detail::str_cat(world->size(), " ranks, stage ", stage, ", grad_accum ", accum,
                                     ", buckets of ", bucket_mb, " MiB"));
        expect_same_run(zero_run(world, stage, accum, bucket_mb, 0), want, 1e-5);
      }
}

TEST(ZeRO, ClipsTheGlobalNormOverAllShards) {
  auto world = comm::world();
  // 0.05 is well below this model's gradient norm, so every step clips.
  const RunResult want = single_process_run(0.05);
  for (int stage : {1, 2}) {
    SCOPED_TRACE(detail::str_cat(world->size(), " ranks, stage ", stage));
    expect_same_run(zero_run(world, stage, 1, 0.002, 0.05), want, 1e-5);
  }
}

TEST(ZeRO, OptimizerStateIsSharded) {
  auto world = comm::world();
  const int n = world->size();
  nn::GPT model(tiny_gpt_config());
  model.init_parameters(kSeed);
  const int64_t numel = model.num_parameters();
  ZeroOptions o;
  o.bucket_mb = 0.002;
  ZeroOptimizer opt(model, world, o, adamw_factory());
  GlobalBatch b = global_batch(0, model.config().vocab);
  opt.backward(model.loss(b.rows(0, 2), b.target_rows(0, 2)));
  opt.step();
  // AdamW keeps two f32 moments per element of the pieces it owns: padding aside, 1/n of all.
  int64_t mine = 0;
  for (const auto& [name, t] : opt.state()) mine += t.numel();
  Tensor total = Tensor::full({1}, double(mine), DType::kI64);
  world->allreduce(total)->wait();
  EXPECT_EQ(total.item(), 2.0 * double(numel)) << "every element's moments, on exactly one rank";
  EXPECT_LE(mine, 2 * (numel / n + int64_t(opt.buckets().buckets().size())));
}

TEST(ZeRO, StepWithoutBackwardIsAnError) {
  auto world = comm::world();
  nn::GPT model(tiny_gpt_config());
  ZeroOptimizer opt(model, world, ZeroOptions{2, 25, 2}, adamw_factory());
  try {
    opt.step();
    FAIL() << "step() before any backward must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("after 0 of 2 micro-batches"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace loom::parallel
