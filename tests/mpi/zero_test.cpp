// ZeRO stages 1, 2 and 3 against the single-process run (the equivalence principle): 5 AdamW
// steps of a small GPT with the global batch split over the world, with and without gradient
// accumulation, one bucket or many, with activation checkpointing (stage 3), and with global-norm
// clipping, give the single-process losses and parameters within 1e-5 relative. Also: the
// optimizer state really is sharded, and so are stage 3's parameters.
#include <gtest/gtest.h>

#include "collectives/communicator.h"
#include "core/ops.h"
#include "dp_reference.h"
#include "optimizer/sgd.h"
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
                   double bucket_mb, double clip, bool checkpoint = false) {
  nn::GPT model(tiny_gpt_config(), nn::GptOptions{0.0, checkpoint});
  if (world->rank() == 0) model.init_parameters(kSeed);  // the wrapper broadcasts rank 0's values
  ZeroOptions o;
  o.stage = stage;
  o.grad_accum = grad_accum;
  o.bucket_mb = bucket_mb;
  ZeroOptimizer opt(model, world, o, adamw_factory());
  int steps = 0;
  return split_batch_run(
      *world, model, grad_accum, [&](const Tensor& loss) { opt.backward(loss); },
      [&] {
        if (clip > 0)
          EXPECT_GT(opt.clip_grad_norm(clip), clip) << "the test must exercise clipping";
        opt.step();
        opt.zero_grad();
        // Stage 3 keeps 1/N of the parameters between steps; the comparison reads them whole.
        if (++steps == kSteps) opt.gather_parameters();
      });
}

TEST(ZeRO, MatchesTheSingleProcessRun) {
  auto world = comm::world();
  const RunResult want = single_process_run();
  for (int stage : {1, 2, 3})
    for (int accum : {1, 2})
      for (double bucket_mb : {25.0, 0.002}) {
        if (stage == 3 && bucket_mb != 25.0) continue;  // stage 3 buckets by module
        SCOPED_TRACE(detail::str_cat(world->size(), " ranks, stage ", stage, ", grad_accum ", accum,
                                     ", buckets of ", bucket_mb, " MiB"));
        expect_same_run(zero_run(world, stage, accum, bucket_mb, 0), want, 1e-5);
      }
}

// Parameters some ranks (b: rank 0 only) or none (c) use, in a bucket each: stages 1 and 2 reduce
// zeros for what a rank did not use (stage 2 stages them when the bucket launches), so after SGD
// steps at lr 1 a has moved by the mean of the ranks' inputs, b by rank 0's over n, c not at all.
TEST(ZeRO, UnusedParametersReduceZeros) {
  auto world = comm::world();
  const int n = world->size(), r = world->rank();
  for (int stage : {1, 2})
    for (int accum : {1, 2}) {
      SCOPED_TRACE(detail::str_cat("stage ", stage, ", grad_accum ", accum));
      Branchy m;
      ZeroOptions o;
      o.stage = stage;
      o.grad_accum = accum;
      o.bucket_mb = 0.00001;  // a bucket per parameter
      ZeroOptimizer opt(m, world, o, [](std::vector<Tensor> params) {
        return std::make_unique<optim::SGD>(std::move(params), optim::SgdOptions{1.0});
      });
      const int steps = 2;
      for (int step = 0; step < steps; ++step) {
        for (int micro = 0; micro < accum; ++micro) {
          const Tensor x = branchy_input(r);
          Tensor loss = sum(mul(m.a, x));
          if (r == 0) loss = add(loss, sum(mul(m.b, x)));
          opt.backward(scale(loss, 1.0 / accum));
        }
        opt.step();
        opt.zero_grad();
      }
      const auto a = m.a.to_vector<float>(), b = m.b.to_vector<float>(), c = m.c.to_vector<float>();
      for (int k = 0; k < 4; ++k) {
        double mean = 0;
        for (int q = 0; q < n; ++q) mean += double(q + k + 1) / n;
        EXPECT_NEAR(a[k], 1.0 - steps * mean, 1e-5) << "a[" << k << "]";
        EXPECT_NEAR(b[k], 1.0 - steps * double(k + 1) / n, 1e-5) << "b[" << k << "]";
        EXPECT_EQ(c[k], 1.0f) << "c[" << k << "]";
      }
    }
}

TEST(ZeRO, ClipsTheGlobalNormOverAllShards) {
  auto world = comm::world();
  // 0.05 is well below this model's gradient norm, so every step clips.
  const RunResult want = single_process_run(0.05);
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE(detail::str_cat(world->size(), " ranks, stage ", stage));
    expect_same_run(zero_run(world, stage, 1, 0.002, 0.05), want, 1e-5);
  }
}

// Checkpointing recomputes each block inside backward: stage 3 gathers the block again for the
// recomputation, and the result is still the single-process one.
TEST(ZeRO, Stage3WithActivationCheckpointing) {
  auto world = comm::world();
  const RunResult want = single_process_run();
  for (int accum : {1, 2}) {
    SCOPED_TRACE(detail::str_cat(world->size(), " ranks, grad_accum ", accum));
    expect_same_run(zero_run(world, 3, accum, 25, 0, /*checkpoint=*/true), want, 1e-5);
  }
}

// Between steps a stage-3 rank holds only its shards: a parameter cannot be read (a clear
// error, not freed memory), the parameter bytes are 1/N of the model, and gather_parameters()
// makes the whole model readable again, equal on every rank.
TEST(ZeRO, Stage3ShardsTheParameters) {
  auto world = comm::world();
  const int n = world->size();
  nn::GPT model(tiny_gpt_config());
  model.init_parameters(kSeed);
  const RunResult initial{{}, parameter_values(model)};
  const int64_t numel = model.num_parameters();
  ZeroOptions o;
  o.stage = 3;
  ZeroOptimizer opt(model, world, o, adamw_factory());
  const Tensor wte = model.wte->weight;
  try {
    (void)wte.to_vector<float>();
    FAIL() << "reading a released ZeRO-3 parameter must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has been released"), std::string::npos) << e.what();
  }
  // One unit per block plus the root (embeddings, final LayerNorm), each padded to n.
  const size_t units = size_t(model.config().layers) + 1;
  ASSERT_EQ(opt.buckets().buckets().size(), units);
  const size_t shard_bytes = opt.memory().parameters;
  EXPECT_GE(shard_bytes, size_t(numel) * 4 / size_t(n));
  EXPECT_LE(shard_bytes, (size_t(numel) / size_t(n) + units) * 4);

  opt.gather_parameters();
  EXPECT_EQ(opt.memory().parameters, shard_bytes + opt.buckets().total_padded() * 4);
  expect_same_run(RunResult{{}, parameter_values(model)}, initial, 0);

  // Calling forward() directly skips the hooks that gather: an error once released.
  GlobalBatch b = global_batch(0, model.config().vocab);
  opt.backward(model.loss(b.rows(0, 2), b.target_rows(0, 2)));  // releases every unit
  EXPECT_EQ(opt.memory().parameters, shard_bytes);
  try {
    model.block(0).forward(Tensor::zeros({1, 2, model.config().channels}));
    FAIL() << "a block's forward() past the hooks must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("operator()"), std::string::npos) << e.what();
  }
}

// Hybrid sharding (MiCS / HSDP): the world's ranks in shard groups of 2 consecutive ranks, every
// state sharded inside a group and replicated across groups; the gradients averaged over both.
// Every stage gives the single-process run, with and without gradient accumulation and
// clipping, and the optimizer state per rank is that of a shard group of 2.
TEST(ZeRO, HybridShardingMatchesTheSingleProcessRun) {
  auto world = comm::world();
  const int n = world->size();
  if (n < 4 || n % 2 != 0) GTEST_SKIP() << "needs an even world of 4 ranks or more";
  const HybridGroups split = hybrid_groups(world, 2, "test");
  const RunResult want = single_process_run(), clipped = single_process_run(0.05);
  for (int stage : {1, 2, 3})
    for (int accum : {1, 2})
      for (double clip : {0.0, 0.05}) {
        SCOPED_TRACE(detail::str_cat(n, " ranks in groups of 2, stage ", stage, ", grad_accum ",
                                     accum, ", clip ", clip));
        nn::GPT model(tiny_gpt_config());
        if (world->rank() == 0) model.init_parameters(kSeed);  // the others get rank 0's values
        ZeroOptions o;
        o.stage = stage;
        o.grad_accum = accum;
        o.bucket_mb = 0.002;
        o.replicas = split.replicas;
        ZeroOptimizer opt(model, split.shards, o, adamw_factory());
        EXPECT_TRUE(opt.hybrid());
        EXPECT_EQ(opt.shard_group_size(), 2);
        int steps = 0;
        const RunResult got = split_batch_run(
            *world, model, accum, [&](const Tensor& loss) { opt.backward(loss); },
            [&] {
              if (clip > 0) EXPECT_GT(opt.clip_grad_norm(clip), clip);
              opt.step();
              opt.zero_grad();
              if (++steps == kSteps) opt.gather_parameters();
            });
        expect_same_run(got, clip > 0 ? clipped : want, 1e-5);
        // Half of every element's moments on each rank of a group of 2 (padding aside).
        int64_t mine = 0;
        for (const auto& [name, t] : opt.state()) mine += t.numel();
        EXPECT_GE(mine, model.num_parameters());  // 2 moments x numel / 2
        EXPECT_LE(mine, model.num_parameters() + 2 * int64_t(opt.buckets().buckets().size()));
        try {
          (void)opt.state_dict();
          ADD_FAILURE() << "a hybrid state_dict must be refused";
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("hybrid sharding"), std::string::npos);
        }
      }
}

// Own parameters (ZeroOptions::own_parameters, expert parallelism's experts): here every block's
// MLP, held whole by every rank and replicated over the whole world (own_replicas), so the sum
// over the replicas divided by the group's size is the average DDP and ZeRO give shared ones:
// the single-process run, with and without clipping (each own parameter counted once in the
// norm), at every stage. Their optimizer state is sharded over the replicas (each element's AdamW
// moments on exactly one rank, See Note [Own parameters sharded over their replicas]), at stage 3
// the parameters themselves too (gathered around each MLP), and planned_own_places (loom-ckpt
// check) is what each rank steps. state_dict() refuses them (checkpoints take them through
// parallel/checkpoint).
TEST(ZeRO, OwnParametersReducedOverTheirReplicasMatchTheSingleProcessRun) {
  auto world = comm::world();
  const RunResult want = single_process_run(), clipped = single_process_run(0.05);
  for (int stage : {1, 2, 3})
    for (double clip : {0.0, 0.05}) {
      SCOPED_TRACE(detail::str_cat(world->size(), " ranks, stage ", stage, ", clip ", clip));
      nn::GPT model(tiny_gpt_config());
      model.init_parameters(kSeed);  // own parameters are not broadcast: every rank draws them
      ZeroOptions o;
      o.stage = stage;
      o.bucket_mb = 0.002;
      o.own_parameters = [](const std::string& name) {
        return name.find(".mlp.") != std::string::npos;
      };
      o.own_replicas = world;
      // Stage 3 shards the MLPs themselves, gathered around each block's MLP.
      o.own_unit = [](const std::string& name) { return name.substr(0, name.find(".mlp.") + 4); };
      ZeroOptimizer opt(model, world, o, adamw_factory());
      // What loom-ckpt check plans for this rank is what it steps.
      const auto planned =
          ZeroOptimizer::planned_own_places(model, o, world->rank(), world->size());
      const auto running = opt.own_places();
      ASSERT_EQ(planned.size(), running.size());
      for (size_t i = 0; i < planned.size(); ++i) {
        EXPECT_EQ(planned[i].name, running[i].name) << i;
        EXPECT_EQ(planned[i].offset, running[i].offset) << i;
        EXPECT_EQ(planned[i].numel, running[i].numel) << i;
        EXPECT_EQ(planned[i].whole, running[i].whole) << i;
      }
      int steps = 0;
      const RunResult got = split_batch_run(
          *world, model, 1, [&](const Tensor& loss) { opt.backward(loss); },
          [&] {
            if (clip > 0) EXPECT_GT(opt.clip_grad_norm(clip), clip);
            opt.step();
            opt.zero_grad();
            if (++steps == kSteps) opt.gather_parameters();
          });
      expect_same_run(got, clip > 0 ? clipped : want, 1e-5);
      for (const auto& [name, p] : opt.named_parameters())
        EXPECT_EQ(name.find(".mlp."), std::string::npos) << name << " is own, not sharded";
      int64_t mine = 0, own_numel = 0;
      for (const auto& [name, t] : opt.state()) mine += t.numel();
      for (const auto& [name, p] : opt.own_parameters()) own_numel += p.numel();
      Tensor total = Tensor::full({1}, double(mine), DType::kI64);
      world->allreduce(total)->wait();
      EXPECT_EQ(total.item(), 2.0 * double(model.num_parameters()))
          << "every element's moments, own ones included, on exactly one rank";
      int64_t stepped_own = 0;
      for (const ZeroOptimizer::OwnPlace& place : opt.own_places()) stepped_own += place.numel;
      // 1/R of the own elements, each bucket padded (one bucket; stage 3: one per block's MLP).
      EXPECT_LE(stepped_own, own_numel / world->size() + model.config().layers)
          << "1/R of the own elements";
      try {
        (void)opt.state_dict();
        ADD_FAILURE() << "a state_dict with own parameters must be refused";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("own parameters"), std::string::npos) << e.what();
      }
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

// Steps [first, first + count) with the whole global batch split over the group's ranks.
void train_steps(comm::Communicator& group, nn::GPT& model, ZeroOptimizer& opt, int first,
                 int count) {
  const int64_t rows = kGlobalBatch / group.size();
  for (int s = first; s < first + count; ++s) {
    GlobalBatch b = global_batch(s, model.config().vocab);
    const int64_t row0 = int64_t(group.rank()) * rows;
    opt.backward(model.loss(b.rows(row0, rows), b.target_rows(row0, rows)));
    opt.step();
    opt.zero_grad();
  }
}

std::unique_ptr<ZeroOptimizer> make_zero(nn::GPT& model, std::shared_ptr<comm::Communicator> g,
                                         int stage, double bucket_mb = 0.002) {
  ZeroOptions o;
  o.stage = stage;
  o.bucket_mb = bucket_mb;
  return std::make_unique<ZeroOptimizer>(model, std::move(g), o, adamw_factory());
}

// planned_pieces, worked out without a group or moving anything (what loom-ckpt check uses), is
// exactly own_pieces() of the running optimizer, for every stage and a bucket size that splits
// parameters across buckets.
TEST(ZeRO, PlannedPiecesAreTheRunningOnes) {
  auto world = comm::world();
  for (int stage : {1, 2, 3}) {
    for (double bucket_mb : {0.002, 25.0}) {
      SCOPED_TRACE(detail::str_cat("stage ", stage, ", buckets ", bucket_mb, " MiB"));
      nn::GPT planned_model(tiny_gpt_config());
      ZeroOptions o;
      o.stage = stage;
      o.bucket_mb = bucket_mb;
      const std::vector<ShardPiece> planned =
          ZeroOptimizer::planned_pieces(planned_model, o, world->rank(), world->size());
      nn::GPT model(tiny_gpt_config());
      model.init_parameters(kSeed);
      ZeroOptimizer opt(model, world, o, adamw_factory());
      const std::vector<ShardPiece> own = opt.own_pieces();
      ASSERT_EQ(planned.size(), own.size());
      ASSERT_FALSE(own.empty());
      for (size_t i = 0; i < own.size(); ++i) {
        EXPECT_EQ(planned[i].bucket, own[i].bucket) << i;
        EXPECT_EQ(planned[i].param, own[i].param) << i;
        EXPECT_EQ(planned[i].param_offset, own[i].param_offset) << i;
        EXPECT_EQ(planned[i].shard_offset, own[i].shard_offset) << i;
        EXPECT_EQ(planned[i].numel, own[i].numel) << i;
      }
    }
  }
}

// A run checkpointed after 2 steps (each rank its own shard of the state; the model's weights
// whole, except in stage 3, whose parameter shards are in the state) and resumed by a fresh
// optimizer continues bit for bit as the run that never stopped.
TEST(ZeRO, ResumesBitExactlyFromASavedState) {
  auto world = comm::world();
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE(detail::str_cat(world->size(), " ranks, stage ", stage));
    nn::GPT a(tiny_gpt_config());
    a.init_parameters(kSeed);
    auto opt_a = make_zero(a, world, stage);
    train_steps(*world, a, *opt_a, 0, 2);
    const std::map<std::string, Tensor> saved = opt_a->state_dict();
    opt_a->gather_parameters();
    nn::StateDict weights;
    for (const auto& [name, t] : a.state_dict()) weights[name] = t.clone();
    train_steps(*world, a, *opt_a, 2, 3);
    opt_a->gather_parameters();

    nn::GPT b(tiny_gpt_config());
    if (stage < 3) b.load_state_dict(weights);  // stage 3 restores its shards from the state
    auto opt_b = make_zero(b, world, stage);
    opt_b->load_state_dict(saved);
    train_steps(*world, b, *opt_b, 2, 3);
    opt_b->gather_parameters();
    expect_same_run(RunResult{{}, parameter_values(b)}, RunResult{{}, parameter_values(a)}, 0);
  }
}

void expect_refused(ZeroOptimizer& opt, const std::map<std::string, Tensor>& state,
                    const std::string& message) {
  try {
    opt.load_state_dict(state);
    ADD_FAILURE() << "loading must throw: " << message;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
  }
}

// A sharded state only fits the group size, rank, stage and buckets it was saved with.
TEST(ZeRO, RefusesAStateSavedWithAnotherWorld) {
  auto world = comm::world();
  const int n = world->size(), r = world->rank();
  nn::GPT model(tiny_gpt_config());
  model.init_parameters(kSeed);
  auto opt = make_zero(model, world, 2);
  train_steps(*world, model, *opt, 0, 1);
  const std::map<std::string, Tensor> saved = opt->state_dict();

  std::map<std::string, Tensor> other = saved;
  other["zero.world_size"] = Tensor::from_vector(std::vector<int64_t>{n + 1}, {1});
  expect_refused(
      *opt, other,
      detail::str_cat("saved by rank ", r, " of ", n + 1, " ranks, but this group has ", n));
  auto stage1 = make_zero(model, world, 1);
  expect_refused(*stage1, saved, "saved by ZeRO stage 2, not 1");
  auto one_bucket = make_zero(model, world, 2, 25);
  expect_refused(*one_bucket, saved, "a different model or bucket size");
  if (n > 1) {  // a real group of another size: each rank on its own
    nn::GPT alone_model(tiny_gpt_config());
    auto alone = make_zero(alone_model, world->split(r, 0, "alone"), 2);
    expect_refused(*alone, saved,
                   detail::str_cat("saved by rank ", r, " of ", n, " ranks, but this group has 1"));
  }
  // A refused load changed nothing: the optimizer still saves what it saved.
  const std::map<std::string, Tensor> after = opt->state_dict();
  ASSERT_EQ(after.size(), saved.size());
  for (const auto& [key, t] : saved) {
    if (t.dtype() == DType::kI64)
      EXPECT_EQ(after.at(key).to_vector<int64_t>(), t.to_vector<int64_t>()) << key;
    else
      EXPECT_EQ(after.at(key).to_vector<float>(), t.to_vector<float>()) << key;
  }
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

// Parameter groups (torch.optim's weight-decay exclusion, and another lr and beta2): the
// matrices decay, the vectors (biases, LayerNorm) do not and step at a higher, changing
// learning rate. Every stage gives the single process's losses and parameters, with the two
// groups stepped by two optimizers there; the grouped state saves and loads bit for bit.
optim::AdamWOptions no_decay_adamw() {
  optim::AdamWOptions a = test_adamw();
  a.lr = 3e-3;
  a.beta2 = 0.99;
  a.weight_decay = 0.0;
  return a;
}

bool decays(const Tensor& p) { return p.dim() >= 2; }

// The no-decay group's learning rate at step s: a schedule of its own.
double no_decay_lr(int s) { return 3e-3 * double(s + 1) / kSteps; }

TEST(ZeRO, ParameterGroupsMatchTheSingleProcessRun) {
  auto world = comm::world();
  RunResult want;
  {
    nn::GPT model(tiny_gpt_config());
    model.init_parameters(kSeed);
    std::vector<Tensor> decay, no_decay;
    for (const auto& [name, p] : model.named_parameters())
      (decays(p) ? decay : no_decay).push_back(p);
    ASSERT_FALSE(decay.empty());
    ASSERT_FALSE(no_decay.empty());
    optim::AdamW a(decay, test_adamw()), b(no_decay, no_decay_adamw());
    for (int s = 0; s < kSteps; ++s) {
      GlobalBatch batch = global_batch(s, model.config().vocab);
      Tensor loss = model.loss(batch.inputs, batch.targets);
      loss.backward();
      b.set_lr(no_decay_lr(s));
      a.step();
      b.step();
      a.zero_grad();
      b.zero_grad();
      want.losses.push_back(loss.item());
    }
    want.params = parameter_values(model);
  }
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE(detail::str_cat(world->size(), " ranks, stage ", stage));
    nn::GPT model(tiny_gpt_config());
    if (world->rank() == 0) model.init_parameters(kSeed);
    ZeroParamGroup decay{{}, adamw_factory()};
    ZeroParamGroup no_decay{{}, [](std::vector<Tensor> params) {
                              return std::make_unique<optim::AdamW>(std::move(params),
                                                                    no_decay_adamw());
                            }};
    for (const auto& [name, p] : model.named_parameters())
      (decays(p) ? decay : no_decay).params.push_back(name);
    ZeroOptions o;
    o.stage = stage;
    o.bucket_mb = 0.002;  // many buckets: pieces of both groups on every rank
    ZeroOptimizer opt(model, world, o, {decay, no_decay});
    ASSERT_EQ(opt.group_count(), 2u);
    int steps = 0;
    const RunResult got = split_batch_run(
        *world, model, 1, [&](const Tensor& loss) { opt.backward(loss); },
        [&] {
          opt.group_optimizer(1).set_lr(no_decay_lr(steps));
          opt.step();
          opt.zero_grad();
          if (++steps == kSteps) opt.gather_parameters();
        });
    expect_same_run(got, want, 1e-5);
    // The grouped state round-trips: after loading what it saved, the state is the same.
    const std::map<std::string, Tensor> saved = opt.state_dict();
    opt.load_state_dict(saved);
    const std::map<std::string, Tensor> after = opt.state_dict();
    ASSERT_EQ(after.size(), saved.size());
    for (const auto& [key, t] : saved)
      if (t.dtype() == DType::kF32)
        EXPECT_EQ(after.at(key).to_vector<float>(), t.to_vector<float>()) << key;
  }
}

TEST(ZeRO, ParameterGroupsMustCoverEveryParameterOnce) {
  auto world = comm::world();
  nn::GPT model(tiny_gpt_config());
  std::vector<std::string> names;
  for (const auto& [name, p] : model.named_parameters()) names.push_back(name);
  auto expect_refused = [&](std::vector<ZeroParamGroup> groups, const std::string& part) {
    try {
      ZeroOptimizer opt(model, world, ZeroOptions{}, std::move(groups));
      ADD_FAILURE() << "expected an error containing '" << part << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  std::vector<std::string> all_but_last(names.begin(), names.end() - 1);
  expect_refused({{all_but_last, adamw_factory()}},
                 "parameter '" + names.back() + "' is in no parameter group");
  expect_refused({{names, adamw_factory()}, {{names[0]}, adamw_factory()}},
                 "parameter '" + names[0] + "' is in groups 0 and 1");
  std::vector<std::string> with_typo = names;
  with_typo.push_back("wte.wieght");
  expect_refused({{with_typo, adamw_factory()}}, "names 'wte.wieght', which is not a parameter");
}

}  // namespace
}  // namespace loom::parallel
