// Pipeline parallelism against the single-process run (the equivalence principle): a small GPT
// cut into stages over the world's ranks (pp 2 and 4), trained 5 AdamW steps with each schedule
// (GPipe, 1F1B, interleaved with v = 2, Chimera: two replicas of the model in opposite
// directions whose stage pairs sum their gradients) and m in {pp, 2 pp} micro-batches, gives the
// single-process per-step losses, and every parameter every rank holds equals the single-process
// parameter of that name, within 1e-5 (AdamW: of the model's scale, See the tolerance note in
// tests/mpi/tp_test.cpp — micro-batching sums each gradient in another order, and AdamW turns the
// last bits of a cancelling sum into up to ~1e-4 of a step; SGD is compared per tensor).
#include <gtest/gtest.h>

#include <set>

#include "collectives/communicator.h"
#include "core/ops.h"
#include "dp_reference.h"
#include "optimizer/sgd.h"
#include "parallel/mesh.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/generators.h"
#include "parallel/pipeline/gpt_stage.h"
#include "parallel/tensor_parallel/tp_state.h"
#include "parallel/zero.h"

namespace loom::parallel::pipeline {
namespace {

using namespace loom::testing;

GptConfig pp_config() {
  GptConfig c = tiny_gpt_config();
  c.layers = 8;  // 2 blocks per chunk at pp 4 x v 2
  return c;
}

constexpr int64_t kRows = 8;

// One rank's part of a pipeline run: its stages, the executor, the optimizer.
enum class Opt { kAdamW, kSgd };

std::unique_ptr<optim::Optimizer> make_optimizer(Opt which, std::vector<Tensor> params) {
  if (which == Opt::kAdamW) return test_adamw_over(std::move(params));
  optim::SgdOptions o;
  o.lr = 0.1;
  o.momentum = 0.9;
  return std::make_unique<optim::SGD>(std::move(params), o);
}

// 3D: with a tp group each stage is tensor-parallel; with a dp group each chunk's gradients are
// averaged over it after its SYNC (after Chimera's replica sum), and wte's after the tied sum.
struct PipelineRank {
  PipelineRank(const Schedule& s, const std::shared_ptr<comm::Communicator>& pp, Opt which,
               std::shared_ptr<comm::Communicator> tp = nullptr,
               std::shared_ptr<comm::Communicator> dp = nullptr, bool zero1 = false)
      : tp_(tp), dp_(dp), zero1_(zero1) {
    const int rank = pp->rank();
    // Chimera's replica pairs sum their gradients; dp averages them unless ZeRO-1 reduces them.
    const auto pairs = replica_pairs(s, *pp);
    std::vector<StageChunk> chunks;
    std::vector<Tensor> params;
    for (const ChunkPlace& place : s.chunks[size_t(rank)]) {
      auto stage = std::make_shared<GptStage>(pp_config(), place.stage, s.stages, 0.0, tp);
      stage->init_parameters(kSeed);
      for (const Tensor& p : stage->parameters()) params.push_back(p);
      chunks.push_back(stage_chunk(stage, pairs[size_t(place.stage)], zero1 ? nullptr : dp));
      stages.push_back(std::move(stage));
    }
    // The ranks holding a copy of wte (the first and the last stage) sum its gradients.
    embedding = embedding_group(s, *pp);
    const int64_t rows = kRows / dp_size() / s.microbatches;
    executor = std::make_unique<PipelineExecutor>(s, pp, std::move(chunks),
                                                  Shape{rows, 8, pp_config().channels});
    if (!zero1) {
      opt = make_optimizer(which, params);
      return;
    }
    auto set = std::make_shared<StageSet>();
    for (const auto& st : stages) set->add(st);
    stage_set = set;
    ZeroOptions z;
    z.stage = 1;
    z.external_backward = true;
    z.tp = tp;
    z.pp = pp;
    opt = std::make_unique<ZeroOptimizer>(*set, dp, z, [which](std::vector<Tensor> p) {
      return make_optimizer(which, std::move(p));
    });
  }

  int dp_size() const { return dp_ ? dp_->size() : 1; }

  double step(int s) {
    const Schedule& sch = executor->schedule();
    GlobalBatch b = global_batch(s, pp_config().vocab);
    const int64_t per_dp = kRows / dp_size(), rows = per_dp / sch.microbatches;
    const int64_t first = (dp_ ? dp_->rank() : 0) * per_dp;
    std::vector<Tensor> tokens, targets;
    for (int mb = 0; mb < sch.microbatches; ++mb) {
      tokens.push_back(b.rows(first + mb * rows, rows));
      targets.push_back(b.target_rows(first + mb * rows, rows));
    }
    const double local = executor->run(tokens, targets);
    std::vector<GptStage*> mine;
    for (auto& st : stages) mine.push_back(st.get());
    sync_tied_embedding(mine, embedding.get());
    if (dp_size() > 1 && !zero1_)
      for (GptStage* st : mine)
        if (st->wte) {
          Tensor g = st->wte_weight().grad();
          dp_->allreduce(g, {comm::ReduceOp::kAvg})->wait();
        }
    opt->step();
    opt->zero_grad();
    Tensor loss = Tensor::full({1}, executor->mean_loss(local), DType::kF32);
    if (dp_) dp_->allreduce(loss, {comm::ReduceOp::kAvg})->wait();
    return loss.item();
  }

  // This rank's parameters, whole (gathered over tp), by name; a second copy of wte skipped.
  std::vector<std::pair<std::string, std::vector<float>>> whole_parameters() const {
    std::vector<std::pair<std::string, std::vector<float>>> out;
    std::set<std::string> seen;
    for (const auto& st : stages) {
      nn::StateDict whole = tp_ ? parallel::gather_full_state(*st, *tp_) : st->state_dict();
      for (const auto& [name, t] : whole) {
        if (!seen.insert(name).second) continue;
        Tensor v = name == "wte.weight" ? t.narrow(0, 0, pp_config().padded_vocab) : t;
        out.emplace_back(name, v.contiguous().to_vector<float>());
      }
    }
    return out;
  }

  std::shared_ptr<comm::Communicator> tp_, dp_;
  bool zero1_;
  std::shared_ptr<StageSet> stage_set;
  std::vector<std::shared_ptr<GptStage>> stages;
  std::shared_ptr<comm::Communicator> embedding;
  std::unique_ptr<PipelineExecutor> executor;
  std::unique_ptr<optim::Optimizer> opt;
};

RunResult single_process(Opt which) {
  nn::GPT model(pp_config());
  model.init_parameters(kSeed);
  auto opt = make_optimizer(which, model.parameters());
  RunResult r;
  for (int s = 0; s < kSteps; ++s) {
    GlobalBatch b = global_batch(s, pp_config().vocab);
    Tensor loss = model.loss(b.rows(0, kRows), b.target_rows(0, kRows));
    loss.backward();
    opt->step();
    opt->zero_grad();
    r.losses.push_back(loss.item());
  }
  r.params = parameter_values(model);
  return r;
}

// This rank's parameters against the single-process ones of the same names, and every name held
// by some rank.
void expect_matches(const PipelineRank& pr, const RunResult& got_losses, const RunResult& want,
                    comm::Communicator& pp, Scale by) {
  RunResult got{got_losses.losses, pr.whole_parameters()}, want_mine{want.losses, {}};
  std::set<std::string> seen;
  for (const auto& [name, v] : got.params) {
    seen.insert(name);
    for (const auto& [n, w] : want.params)
      if (n == name) want_mine.params.emplace_back(n, w);
  }
  std::sort(got.params.begin(), got.params.end());
  std::sort(want_mine.params.begin(), want_mine.params.end());
  expect_same_run(got, want_mine, 1e-5, by);
  // Coverage: each single-process parameter is held by at least one rank.
  std::vector<int32_t> held(want.params.size(), 0);
  for (size_t i = 0; i < want.params.size(); ++i) held[i] = seen.count(want.params[i].first);
  Tensor h = Tensor::from_vector(held, {int64_t(held.size())});
  pp.allreduce(h)->wait();
  const std::vector<int32_t> total = h.to_vector<int32_t>();
  for (size_t i = 0; i < total.size(); ++i)
    EXPECT_GE(total[i], 1) << want.params[i].first << " is held by no rank";
}

TEST(Pipeline, EverySchedulesMatchesTheSingleProcessRun) {
  auto world = comm::world();
  const int p = world->size();
  if (p == 1 || p == 8 || kRows % (2 * p) != 0)
    GTEST_SKIP() << "pp " << p << ": needs 2 or 4 ranks";
  for (Opt which : {Opt::kAdamW, Opt::kSgd}) {
    const RunResult want = single_process(which);
    for (const std::string name : {"gpipe", "1f1b", "interleaved", "chimera"})
      for (int m : {p, 2 * p}) {
        SCOPED_TRACE(detail::str_cat(name, ", pp ", p, ", ", m, " micro-batches, ",
                                     which == Opt::kSgd ? "SGD" : "AdamW"));
        const Schedule s = make_schedule(name, p, m, name == "interleaved" ? 2 : 1);
        PipelineRank pr(s, world, which);
        RunResult got;
        for (int step = 0; step < kSteps; ++step) got.losses.push_back(pr.step(step));
        expect_matches(pr, got, want, *world, which == Opt::kSgd ? Scale::kTensor : Scale::kModel);
      }
  }
}

// 3D: dp 2 x tp 2 x pp 2 on 8 ranks, every schedule, with the dp average or ZeRO-1 (its
// reducer taking the gradients the executor accumulated), against one process.
TEST(Pipeline, ThreeDimensionalRunsMatchTheSingleProcessRun) {
  auto world = comm::world();
  if (world->size() != 8) GTEST_SKIP() << "dp 2 x tp 2 x pp 2 needs 8 ranks";
  parallel::DeviceMesh mesh(world, 2, 2, 2);
  for (Opt which : {Opt::kAdamW, Opt::kSgd}) {
    const RunResult want = single_process(which);
    for (bool zero1 : {false, true})
      for (const std::string name : {"gpipe", "1f1b", "interleaved", "chimera"}) {
        SCOPED_TRACE(detail::str_cat(name, ", dp 2 x tp 2 x pp 2, ",
                                     which == Opt::kSgd ? "SGD" : "AdamW",
                                     zero1 ? ", ZeRO-1" : ""));
        const Schedule s = make_schedule(name, 2, 2, name == "interleaved" ? 2 : 1);
        PipelineRank pr(s, mesh.pp_ptr(), which, mesh.tp_ptr(), mesh.dp_ptr(), zero1);
        RunResult got;
        for (int step = 0; step < kSteps; ++step) got.losses.push_back(pr.step(step));
        expect_matches(pr, got, want, mesh.pp(),
                       which == Opt::kSgd ? Scale::kTensor : Scale::kModel);
      }
  }
}

// Note [Stage partition]: a large vocabulary moves blocks off the last stage; a small one keeps
// the even split.
TEST(Pipeline, StagesBalanceTheHeadsCost) {
  GptConfig gpt2;  // 12 layers, dim 768, 50304 rows, seq 1024: the head costs ~4.4 blocks
  const std::vector<double> costs = stage_costs(gpt2, 4);
  std::vector<int64_t> counts;
  for (int s = 0; s < 4; ++s) counts.push_back(stage_layers(gpt2, s, 4).second);
  // The last stage keeps one block; the first takes the 3 (it also embeds).
  EXPECT_EQ(counts, (std::vector<int64_t>{3, 4, 4, 1}));
  EXPECT_NEAR(costs[3], 1 + (768.0 * 50304 + 3 * 50304) / (12.0 * 768 * 768 + 2 * 1024 * 768),
              1e-9);
  EXPECT_LT(*std::max_element(costs.begin(), costs.end()), 3.0 + 4.4)
      << "better than the even split's last stage";
  GptConfig small = pp_config();  // vocab 32: even
  for (int s = 0; s < 4; ++s)
    EXPECT_EQ(stage_layers(small, s, 4), stage_layers(small.layers, s, 4));
}

TEST(Pipeline, StageLayersSplitEvenly) {
  EXPECT_EQ(stage_layers(8, 0, 3), (std::pair<int64_t, int64_t>{0, 3}));
  EXPECT_EQ(stage_layers(8, 1, 3), (std::pair<int64_t, int64_t>{3, 3}));
  EXPECT_EQ(stage_layers(8, 2, 3), (std::pair<int64_t, int64_t>{6, 2}));
  try {
    stage_layers(2, 0, 4);
    FAIL() << "2 blocks over 4 stages must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("2 blocks cannot be split into 4 stages"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace loom::parallel::pipeline
