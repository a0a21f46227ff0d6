// What each rank keeps for training follows ZeRO's formulas, in bytes per parameter on N ranks
// with Adam and f32: replicated (DDP) 16, stage 1 8 + 8/N, stage 2 4 + 12/N, stage 3 16/N —
// measured with the CPU allocator's live-byte counter between steps (after zero_grad), within 5%
// (the buckets' padding to a multiple of N is the only departure). The wrappers' own breakdown must
// add up to the same measured figure.
#include <gtest/gtest.h>

#include "collectives/communicator.h"
#include "core/allocator.h"
#include "dp_reference.h"
#include "parallel/ddp.h"
#include "parallel/zero.h"

namespace loom::parallel {
namespace {

using namespace loom::testing;

GptConfig memory_test_config() {
  GptConfig c = tiny_gpt_config();
  c.channels = 64;
  c.heads = 4;
  c.vocab = 60;
  c.padded_vocab = 64;
  return c;
}

struct Measured {
  double bytes_per_param;      // allocator live-byte growth / parameters
  double breakdown_per_param;  // the wrapper's own account / parameters
};

Measured measure(int stage) {
  auto world = comm::world();
  Allocator& cpu = allocator_for(Device::cpu());
  const size_t before = cpu.live_bytes();
  nn::GPT model(memory_test_config());
  model.init_parameters(kSeed);
  const double numel = double(model.num_parameters());
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<optim::Optimizer> opt;
  ZeroOptimizer* zero = nullptr;
  if (stage == 0) {
    ddp = std::make_unique<DistributedDataParallel>(model, world);
    opt = std::make_unique<optim::AdamW>(model.parameters(), test_adamw());
  } else {
    ZeroOptions o;
    o.stage = stage;
    auto z = std::make_unique<ZeroOptimizer>(model, world, o, [](std::vector<Tensor> p) {
      return std::make_unique<optim::AdamW>(std::move(p), test_adamw());
    });
    zero = z.get();
    opt = std::move(z);
  }
  GlobalBatch b = global_batch(0, model.config().vocab);
  Tensor loss = model.loss(b.rows(0, 2), b.target_rows(0, 2));
  if (ddp) {
    ddp->backward(loss);
    ddp->finish();
  } else {
    zero->backward(loss);
  }
  opt->step();
  opt->zero_grad();
  loss = Tensor();
  b = GlobalBatch();
  const size_t live = cpu.live_bytes() - before;
  TrainingMemory m = ddp ? ddp->memory() : zero->memory();
  if (ddp) m.optimizer_state = opt->state_bytes();
  return Measured{double(live) / numel, double(m.total()) / numel};
}

TEST(ZeroMemory, FollowsTheZeroFormulas) {
  const double n = comm::world()->size();
  const double formula[4] = {16, 8 + 8 / n, 4 + 12 / n, 16 / n};
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE(detail::str_cat("stage ", stage, " on ", n, " ranks"));
    const Measured got = measure(stage);
    if (comm::world()->rank() == 0)
      std::printf("stage %d: %.3f bytes per parameter (formula %.3f)\n", stage, got.bytes_per_param,
                  formula[stage]);
    EXPECT_NEAR(got.bytes_per_param, formula[stage], 0.05 * formula[stage])
        << "allocator: " << got.bytes_per_param << " bytes per parameter";
    EXPECT_NEAR(got.breakdown_per_param, got.bytes_per_param, 0.01 * got.bytes_per_param)
        << "the wrapper's breakdown must account for what the allocator holds";
  }
}

}  // namespace
}  // namespace loom::parallel
