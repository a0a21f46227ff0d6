// DistributedDataParallel against the single-process run (the equivalence principle): a small
// GPT trained for 5 AdamW steps with the global batch split over every rank of the world, with
// and without gradient accumulation and with buckets small enough that many reductions overlap
// backward, gives the single-process losses and parameters within 1e-5 relative. Also: unused
// parameters, and the misuse errors.
#include <gtest/gtest.h>

#include "collectives/communicator.h"
#include "core/ops.h"
#include "dp_reference.h"
#include "parallel/ddp.h"

namespace loom::parallel {
namespace {

using namespace loom::testing;

RunResult ddp_run(const std::shared_ptr<comm::Communicator>& world, int grad_accum,
                  double bucket_mb) {
  nn::GPT model(tiny_gpt_config());
  // Only rank 0 initialises: DDP must broadcast its values to the others.
  if (world->rank() == 0) model.init_parameters(kSeed);
  DdpOptions o;
  o.grad_accum = grad_accum;
  o.bucket_mb = bucket_mb;
  DistributedDataParallel ddp(model, world, o);
  optim::AdamW opt(model.parameters(), test_adamw());
  return split_batch_run(
      *world, model, grad_accum, [&](const Tensor& loss) { ddp.backward(loss); },
      [&] {
        ddp.finish();
        opt.step();
        opt.zero_grad();
      });
}

TEST(DDP, MatchesTheSingleProcessRun) {
  auto world = comm::world();
  const RunResult want = single_process_run();
  for (int accum : {1, 2}) {
    for (double bucket_mb : {25.0, 0.002}) {  // one bucket; ~1 parameter tensor per bucket
      SCOPED_TRACE(detail::str_cat(world->size(), " ranks, grad_accum ", accum, ", buckets of ",
                                   bucket_mb, " MiB"));
      expect_same_run(ddp_run(world, accum, bucket_mb), want, 1e-5);
    }
  }
}

TEST(DDP, SmallBucketsFollowReverseRegistrationOrder) {
  nn::GPT model(tiny_gpt_config());
  auto world = comm::world();
  DistributedDataParallel ddp(model, world, DdpOptions{0.002});
  const auto& buckets = ddp.buckets().buckets();
  ASSERT_GT(buckets.size(), 4u);
  const size_t n = model.parameters().size();
  // The first slot of the first bucket is the last parameter; order descends throughout.
  size_t expected = n;
  for (const Bucket& b : buckets)
    for (const BucketSlot& s : b.slots) EXPECT_EQ(s.param, --expected);
  EXPECT_EQ(expected, 0u);
}

TEST(DDP, UnusedParametersReduceWithoutHanging) {
  auto world = comm::world();
  const int n = world->size(), r = world->rank();
  Branchy m;
  DistributedDataParallel ddp(m, world, DdpOptions{0.00001});  // a bucket per parameter
  for (int step = 0; step < 2; ++step) {
    // loss = sum(a * x) (+ sum(b * x) on rank 0): d/da = x_r, d/db = x_0 on rank 0 only.
    Tensor x = branchy_input(r);
    Tensor loss = sum(mul(m.a, x));
    if (r == 0) loss = add(loss, sum(mul(m.b, x)));
    ddp.backward(loss);
    ddp.finish();
    std::vector<float> want_a(4, 0), want_b(4);
    for (int k = 0; k < 4; ++k) {
      for (int q = 0; q < n; ++q) want_a[k] += float(q + k + 1) / float(n);
      want_b[k] = float(k + 1) / float(n);
    }
    ASSERT_TRUE(m.a.grad().defined());
    ASSERT_TRUE(m.b.grad().defined()) << "used on rank 0, so every rank gets its average";
    EXPECT_FALSE(m.c.grad().defined()) << "used by no rank: no gradient, as in one process";
    auto ga = m.a.grad().to_vector<float>(), gb = m.b.grad().to_vector<float>();
    for (int k = 0; k < 4; ++k) {
      EXPECT_NEAR(ga[k], want_a[k], 1e-6);
      EXPECT_NEAR(gb[k], want_b[k], 1e-6);
    }
    m.zero_grad();
  }
}

TEST(DDP, GradientAccumulationMisuseIsAnError) {
  auto world = comm::world();
  Branchy m;
  DistributedDataParallel ddp(m, world, DdpOptions{25, 2});
  ddp.backward(sum(m.a));
  try {
    ddp.finish();
    FAIL() << "finish() after 1 of 2 micro-batches must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("finish() after 1 of 2 micro-batches"), std::string::npos)
        << e.what();
  }
  ddp.backward(sum(m.a));
  try {
    ddp.backward(sum(m.a));
    FAIL() << "a third backward in a step of 2 must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("micro-batch 3 but a step has 2"), std::string::npos)
        << e.what();
  }
  ddp.finish();
  try {
    sum(m.a).backward();
    FAIL() << "loss.backward() past the wrapper must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside backward(loss)"), std::string::npos) << e.what();
  }
}

TEST(DDP, ReplicasThatDifferAreRefused) {
  auto world = comm::world();
  if (world->size() < 2) GTEST_SKIP() << "needs two ranks";
  {
    nn::GPT model(tiny_gpt_config());
    model.init_parameters(kSeed + uint64_t(world->rank() == 1));  // rank 1 differs
    DdpOptions o;
    o.check_replicas = true;
    try {
      DistributedDataParallel ddp(model, world, o);
      FAIL() << "differing replicas must be refused on every rank";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("differs across the replicas"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("rank(s) 1"), std::string::npos) << e.what();
    }
  }
  {
    GptConfig c = tiny_gpt_config();
    if (world->rank() == 1) c.layers = 1;  // a different model altogether
    nn::GPT model(c);
    try {
      DistributedDataParallel ddp(model, world);
      FAIL() << "a different model on one rank must be refused on every rank";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("every rank must build the same model"),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace loom::parallel
