// The planner's mixture-of-experts model (planner/workload.h MoeShape, Layout::ep) against closed
// forms and loom's own MoE GPT: the parameter count is nn::GPT's with MoE blocks, element for
// element; a rank holds experts / ep experts and ZeRO shards their state over their replicas;
// the model FLOPs count top_k experts per token; a MoE layer's all-to-alls are the alpha-beta
// exchange of its routed rows; the search chooses ep when the experts do not fit otherwise.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/nn/gpt.h"
#include "parallel/pipeline/generators.h"
#include "parallel/pipeline/validator.h"
#include "planner/search.h"
#include "testing/files.h"

namespace loom::planner {
namespace {

using loom::testing::expect_error;

TransformerShape moe_shape(int64_t layers, int64_t hidden, int64_t heads, int64_t seq,
                           int64_t vocab, MoeShape moe) {
  TransformerShape m{layers, hidden, heads, seq, vocab, {}};
  m.moe = moe;
  return m;
}

// The planner's count is loom's MoE GPT's: dense blocks 12h^2 + 13h, MoE blocks the attention
// and LayerNorms, a bias-free router and the experts (2hf + f + h each).
TEST(PlannerMoe, ParametersAreTheMoeGptsElementForElement) {
  for (const MoeShape moe : {MoeShape{4, 2, 2, 48}, MoeShape{8, 1, 1, 0}, MoeShape{3, 3, 3, 20}}) {
    GptConfig config;
    config.max_seq_len = 16;
    config.vocab = config.padded_vocab = 64;
    config.layers = 5;
    config.heads = 2;
    config.channels = 32;
    nn::GptOptions o;
    o.moe.experts = moe.experts;
    o.moe.top_k = moe.top_k;
    o.moe.every = moe.every;
    o.moe.hidden = moe.expert_hidden;
    const nn::GPT gpt(config, o);
    int64_t elements = 0;
    for (const Tensor& p : gpt.parameters()) elements += p.numel();
    const TransformerShape m = moe_shape(5, 32, 2, 16, 64, moe);
    EXPECT_EQ(m.parameters(), double(elements)) << m.str();
    EXPECT_EQ(m.moe_layers(), int64_t(gpt.moe_layers().size())) << m.str();
  }
}

// Each token runs through top_k experts: a top-1 MoE layer of 4h-wide experts costs a dense
// layer's FLOPs plus its router's (2 s h E); top-2 adds one more MLP (16 s h^2).
TEST(PlannerMoe, ModelFlopsCountTheExpertsATokenVisits) {
  const double s = 2048, h = 4096, E = 8;
  const TransformerShape top1 = moe_shape(4, 4096, 32, 2048, 32000, {8, 1, 1, 0});
  const TransformerShape top2 = moe_shape(4, 4096, 32, 2048, 32000, {8, 2, 1, 0});
  EXPECT_DOUBLE_EQ(top1.moe_layer_forward_flops(), top1.layer_forward_flops() + 2 * s * h * E);
  EXPECT_DOUBLE_EQ(top2.moe_layer_forward_flops(), top1.moe_layer_forward_flops() + 16 * s * h * h);
  // every 2 of 4 layers: layers 0 and 2.
  const TransformerShape half = moe_shape(4, 4096, 32, 2048, 32000, {8, 2, 2, 0});
  EXPECT_DOUBLE_EQ(half.layers_forward_flops(),
                   2 * half.layer_forward_flops() + 2 * half.moe_layer_forward_flops());
}

// A rank holds experts / ep of its MoE layers' experts; ZeRO divides the experts' optimizer
// state over their dp / ep replicas (stage 3 their weights too without pipelines) and the rest
// over dp; their gradients stay whole, and over 2+ replicas the reduced shards are kept beside
// them (what loom-gpt's ZeroOptimizer::memory reports).
TEST(PlannerMoe, ExpertStateSplitsOverEpAndItsReplicas) {
  const Workload w{moe_shape(4, 1024, 16, 1024, 32000, {8, 2, 1, 0}), 64};
  const Cluster c = cluster_preset("h100-sxm", 8, 8);
  const Execution e = execution_preset("loom");  // 2-byte weights and gradients, 12 of state
  const double h = 1024, expert = 2 * h * 4096 + 4096 + h;
  Layout l;
  l.dp = 8;
  for (int ep : {1, 2, 4, 8}) {
    l.ep = ep;
    const double experts = 4 * (8.0 / ep) * expert;
    ASSERT_DOUBLE_EQ(rank_expert_parameters(w.model, l, 0), experts) << "ep " << ep;
    const double dense = rank_parameters(w.model, l, 0) - experts;
    // Everything but the experts: the model less its 32 experts.
    ASSERT_DOUBLE_EQ(dense, w.model.parameters() - 4 * 8 * expert);
    const double replicas = 8.0 / ep;
    for (int zero = 0; zero <= 3; ++zero) {
      l.zero = zero;
      const MemoryBreakdown m = rank_memory(w, l, c, e, 0, InFlight{1, 0});
      EXPECT_DOUBLE_EQ(m.parameters,
                       2 * dense / (zero >= 3 ? 8 : 1) + 2 * experts / (zero >= 3 ? replicas : 1));
      EXPECT_DOUBLE_EQ(m.gradients,
                       2 * dense / (zero >= 2 ? 8 : 1) +
                           2 * experts * (zero >= 1 && replicas > 1 ? 1 + 1 / replicas : 1));
      EXPECT_DOUBLE_EQ(m.optimizer_state,
                       12 * (dense / (zero >= 1 ? 8 : 1) + experts / (zero >= 1 ? replicas : 1)));
      // Stage 3 gathers the last block and the one before it (MoE blocks here: their attention,
      // norms and router) and the rest's unit (embeddings, final norm: what the layers leave),
      // held from the output layer's backward on. Sharded experts are gathered apart, inside
      // their layer's backward: a moment's, not in `gathered`.
      const double rest = dense - 4 * moe_layer_rank_parameters(w.model, 1);
      EXPECT_DOUBLE_EQ(m.gathered,
                       zero < 3 ? 0.0 : 2 * (2 * moe_layer_rank_parameters(w.model, 1) + rest));
    }
    l.zero = 0;
  }
  // With pipelines stage 3 keeps the experts whole (loom's pipelines do).
  l.dp = 4, l.pp = 2, l.ep = 2, l.zero = 3;
  const double experts = 2 * 4 * expert;  // 2 MoE layers of 4 local experts on each rank
  ASSERT_DOUBLE_EQ(rank_expert_parameters(w.model, l, 0), experts);
  const MemoryBreakdown m = rank_memory(w, l, c, e, 0, InFlight{1, 0});
  EXPECT_DOUBLE_EQ(m.parameters, 2 * (rank_parameters(w.model, l, 0) - experts) / 4 + 2 * experts);
}

// ZeRO-3 without pipelines gathers each MoE layer's local experts over their dp / ep replicas with
// the rest, for the forward and again for the backward: its per-micro-batch traffic grows by that
// all-gather (ring, intra-node) twice; with ep = dp (one replica) there is nothing to gather.
TEST(PlannerMoe, ZeroThreeGathersTheExpertsOverTheirReplicas) {
  const Workload w{moe_shape(4, 1024, 16, 1024, 32000, {8, 2, 2, 0}), 64};
  const Cluster c = cluster_preset("h100-sxm", 8, 8);
  const Execution e = execution_preset("loom");
  const Layout l = parse_layout("dp=8,mb=2,zero=3,ep=2", 8);
  Layout whole = l;
  whole.ep = 8;  // each expert on one rank: nothing to gather
  const double bytes = 2 * (8.0 / 2) * w.model.expert_parameters() * e.param_bytes;  // 2 layers
  const double gather = 3 * (c.intra.latency_s + bytes / (4 * c.intra.bandwidth));   // R = 4
  const ActionCosts with = action_costs(w, l, c, e), without = action_costs(w, whole, c, e);
  // The dense part's gathers and scatters are the same in both layouts.
  EXPECT_NEAR(with.zero_comm - without.zero_comm, 2 * gather, 1e-12);
}

// Inside one node, a MoE layer's forward and backward each send its k b s h routed rows out and
// back over the ep group (n - 1 exchanges of a 1/n share at the intra-node rate), after the
// routing counts (an all-gather of experts + 1 counts over dp, an all-to-all of experts counts
// over ep); with ep 1 only the counts' all-gather remains (loom's MoE under dp gathers them).
// Per micro-batch on one rank's layers.
TEST(PlannerMoe, AllToAllsAreTheRoutedRowsOverTheGroup) {
  const Workload w{moe_shape(4, 1024, 16, 1024, 32000, {8, 2, 2, 0}), 64};
  const Cluster c = cluster_preset("h100-sxm", 8, 8);
  const Execution e = execution_preset("loom");
  const double gather = 7 * (c.intra.latency_s + 8.0 * 9 * 8 / (8 * c.intra.bandwidth));
  Layout l;
  l.dp = 8, l.mb = 2;
  EXPECT_NEAR(action_costs(w, l, c, e).ep_comm, 2 * gather, 1e-15);  // layers 0 and 2
  l.ep = 4;
  const double rows = 2.0 * 2 * 1024 * 1024 * e.activation_bytes;  // k b s h
  const double a2a = 3 * (c.intra.latency_s + rows / (4 * c.intra.bandwidth));
  const double counts = gather + 3 * (c.intra.latency_s + 8.0 * 8 / (4 * c.intra.bandwidth));
  // Each MoE layer: 2 exchanges forward after the counts, 2 backward.
  EXPECT_NEAR(action_costs(w, l, c, e).ep_comm, 2 * (4 * a2a + counts), 1e-15);
}

// An unbalanced router (MoeShape::load): the busiest rank's experts receive `load` times the
// balanced rows, so its expert activations (the row and the hidden before and after GELU) and
// its all-to-alls grow by that factor, and nothing else. Capped by what routing can send one
// rank (min(experts / ep, top_k) rows per token of each of ep ranks; without ep every row is
// local) and by a capacity factor c: an expert takes c times its share of the whole batch (dp
// ranks' micro-batches), all of which one forward of the rank's ep group may bring, c dp m / ep.
TEST(PlannerMoe, UnbalancedRoutingScalesTheBusiestRanksRows) {
  const Execution e = execution_preset("loom");
  const int mb = 2;
  const TransformerShape balanced = moe_shape(4, 1024, 16, 1024, 32000, {8, 2, 2, 512});
  TransformerShape busy = balanced;
  busy.moe.load = 1.5;
  EXPECT_EQ(busy.rank_expert_load(1, 8), 1.0);
  EXPECT_EQ(busy.rank_expert_load(4, 8), 1.5);
  busy.moe.load = 7;
  EXPECT_EQ(busy.rank_expert_load(4, 8), 4.0);  // 2 of a token's rows from each of 4 ranks: 8 / 2
  EXPECT_EQ(busy.rank_expert_load(8, 8), 4.0);  // 1 row each from 8 ranks
  TransformerShape capped = balanced;
  capped.moe.capacity_factor = 1.25;
  capped.moe.load = default_moe_load(1.25);  // the worst case the capacity allows
  EXPECT_EQ(capped.rank_expert_load(4, 4), 1.25);
  EXPECT_EQ(capped.rank_expert_load(4, 8), 2.5);  // half the batch's ranks feed its experts
  EXPECT_EQ(capped.rank_expert_load(2, 8), 2.0);  // routing's own cap
  EXPECT_EQ(capped.rank_expert_load(1, 8), 1.0);
  capped.moe.load = 1.1;
  EXPECT_EQ(capped.rank_expert_load(4, 8), 1.1);  // a given load below the cap
  EXPECT_EQ(default_moe_load(0), 1.0);            // dropless: balanced unless given
  capped.moe.load = default_moe_load(1.25);
  Layout two_parts;  // dp 4 x 2 micro-batches of 8: capacity over 8 parts
  two_parts.dp = 4, two_parts.mb = 8, two_parts.ep = 4;
  EXPECT_EQ(expert_load({capped, 64}, two_parts), 2.5);
  two_parts.ep = 2;  // 5 by the capacity, but routing sends at most 2
  EXPECT_EQ(expert_load({capped, 64}, two_parts), 2.0);
  EXPECT_EQ(expert_load({moe_shape(4, 1024, 16, 1024, 32000, {}), 64}, two_parts), 1.0);

  busy.moe.load = 1.5;
  const double rows = 1024.0 * mb * 2;                             // s b k
  const double per_row = (1024.0 + 2 * 512) * e.activation_bytes;  // h + 2f
  for (double load : {1.0, 1.5, 4.0})
    EXPECT_DOUBLE_EQ(
        moe_layer_activation_bytes(balanced, mb, 1, false, load, Recompute::kNone, e) -
            moe_layer_activation_bytes(balanced, mb, 1, false, 1.0, Recompute::kNone, e),
        (load - 1.0) * rows * per_row)
        << "load " << load;
  const Cluster c = cluster_preset("h100-sxm", 8, 8);
  Layout l;
  l.dp = 8, l.mb = mb, l.ep = 4;
  const ActionCosts a = action_costs({balanced, 64}, l, c, e);
  const ActionCosts b = action_costs({busy, 64}, l, c, e);
  EXPECT_GT(b.forward, a.forward);
  const double row_bytes = rows * 1024 * e.activation_bytes;  // k b s h
  auto a2a = [&](double bytes) {
    return 3 * (c.intra.latency_s + bytes / (4 * c.intra.bandwidth));
  };
  EXPECT_NEAR(b.ep_comm - a.ep_comm, 2 * 4 * (a2a(1.5 * row_bytes) - a2a(row_bytes)), 1e-15);
  busy.moe.load = 0.5;
  expect_error([&] { busy.check(); }, {"MoE load (0.5) must be >= 1"});
  busy.moe.load = 1.25;
  EXPECT_NE(busy.str().find("width 512 load 1.25"), std::string::npos) << busy.str();
  capped.moe.load = default_moe_load(1.25);
  EXPECT_NE(capped.str().find("width 512 capacity 1.25"), std::string::npos) << capped.str();
  capped.moe.capacity_factor = -1;
  expect_error([&] { capped.check(); }, {"MoE capacity factor (-1) must be >= 0"});
}

// A MoE model whose expert gradients alone fill more than a GPU (16 layers of 64 experts 6144
// wide: 5.2e10 expert parameters, 103 GB of 16-bit gradients, which stay whole): without
// pipelines, which would split the layers, only layouts that split the experts over ep fit, so
// every plan the search ranks has ep > 1; a dense model is never given an ep.
TEST(PlannerMoe, SearchSplitsExpertsThatDoNotFit) {
  const Workload w{moe_shape(16, 4096, 32, 2048, 32000, {64, 2, 1, 6144}), 64};
  const Cluster c = cluster_preset("h100-sxm", 16, 8);
  ASSERT_GT(2 * 16 * 64 * w.model.expert_parameters(), c.device.memory_bytes);
  SearchOptions o;
  o.unsupported = [](const Layout& l) { return l.pp > 1 ? "a pipeline" : ""; };
  const SearchResult r = search(w, c, execution_preset("loom"), o);
  ASSERT_FALSE(r.ranked.empty());
  for (const Prediction& p : r.ranked) {
    EXPECT_GT(p.layout.ep, 1) << p.layout.str();
    EXPECT_FALSE(p.oom) << p.layout.str();
  }
  Layout l;
  l.dp = 16, l.zero = 3;
  EXPECT_TRUE(evaluate(w, l, c, execution_preset("loom")).oom);
  const Workload dense{moe_shape(16, 4096, 32, 2048, 32000, {}), 64};
  for (const Prediction& p : search(dense, c, execution_preset("loom"), {}).ranked)
    EXPECT_EQ(p.layout.ep, 1) << p.layout.str();
}

// loom routes a micro-batched MoE batch once without gradients first (its load-balancing loss is
// the whole batch's): m forwards before the training pass on one stage, (m + p - 1) chunk
// forwards and sends through a pipeline; none without the loss, without micro-batches, or for
// Megatron (each micro-batch balanced alone).
TEST(PlannerMoe, RoutingPassIsAForwardOfEveryMicroBatch) {
  Workload w{moe_shape(4, 1024, 16, 1024, 32000, {8, 2, 2, 0}), 64};
  const Cluster c = cluster_preset("h100-sxm", 8, 8);
  const Execution e = execution_preset("loom");
  Layout l;
  l.dp = 8, l.mb = 2;  // 4 micro-batches
  Prediction p = evaluate(w, l, c, e);
  const ActionCosts& a = p.actions;
  EXPECT_NEAR(p.routing_s, 4 * (a.forward + a.embed_forward + a.head_forward), 1e-15);
  EXPECT_NEAR(p.step_s, p.routing_s + p.pipeline_s + p.step.dp_exposed + p.step.optimizer,
              1e-12 * p.step_s);
  l.mb = 8;  // one micro-batch: no pass
  EXPECT_EQ(evaluate(w, l, c, e).routing_s, 0.0);
  l.dp = 4, l.pp = 2, l.mb = 4;  // 4 micro-batches through 2 stages
  p = evaluate(w, l, c, e);
  EXPECT_NEAR(p.routing_s,
              5 * (p.actions.forward + p.actions.p2p) +
                  4 * (p.actions.embed_forward + p.actions.head_forward),
              1e-15);
  EXPECT_EQ(evaluate(w, l, c, execution_preset("megatron")).routing_s, 0.0);
  w.model.moe.balance_loss = false;
  EXPECT_EQ(evaluate(w, l, c, e).routing_s, 0.0);
}

// Note [MoE layers per stage]: 4 layers with a MoE MLP every 4th put the one MoE layer on the
// first of 2 stages. The pipeline is the validator's run with each stage's own layers: stage 0
// one dense and one MoE layer (and the embedding), stage 1 two dense (and the head), built here
// from a dense model's layer costs and moe_layer_costs. The old average (half a MoE layer on
// each stage) predicted the pipeline shorter than that.
TEST(PlannerMoe, EachStageCostsItsOwnMoeLayers) {
  namespace pl = parallel::pipeline;
  const MoeShape moe{8, 2, 4, 0};
  const Workload w{moe_shape(4, 1024, 16, 1024, 1024, moe), 64};
  const Workload dense{moe_shape(4, 1024, 16, 1024, 1024, {}), 64};
  const Cluster c = cluster_preset("h100-sxm", 8, 8);
  const Execution e = execution_preset("loom");
  ASSERT_TRUE(w.model.is_moe_layer(0));
  ASSERT_EQ(w.model.moe_layers(), 1);
  for (const char* schedule : {"gpipe", "1f1b"}) {
    Layout l;
    l.dp = 4, l.pp = 2, l.mb = 4, l.schedule = schedule;  // 4 micro-batches
    const Prediction p = evaluate(w, l, c, e);
    ASSERT_TRUE(p.problem.empty()) << p.problem;
    const ActionCosts& a = p.actions;
    const ActionCosts d = action_costs(dense, l, c, e);
    const double fd = d.forward / 2, bd = d.backward / 2;                  // one dense layer
    const MoeLayerCosts ml = moe_layer_costs(w.model, l, c, e, 0.0, 1.0);  // balanced
    pl::CostModel stages;
    stages.forward = stages.backward = stages.weight_grad = 0;
    stages.transfer = a.p2p;
    stages.stage_forward_extra = {fd + ml.forward + a.embed_forward, 2 * fd + a.head_forward};
    stages.stage_backward_extra = {bd + ml.backward + a.embed_backward, 2 * bd + a.head_backward};
    const pl::Schedule s = pl::make_schedule(schedule, 2, 4, 1);
    const double expected = pl::validate(s, stages).makespan;
    EXPECT_NEAR(p.pipeline_s, expected, 1e-12 * expected) << schedule;
    pl::CostModel average;
    average.forward = a.forward, average.backward = a.backward, average.weight_grad = 0;
    average.transfer = a.p2p;
    average.stage_forward_extra = {a.embed_forward, a.head_forward};
    average.stage_backward_extra = {a.embed_backward, a.head_backward};
    EXPECT_GT(p.pipeline_s, 1.01 * pl::validate(s, average).makespan) << schedule;
  }
}

TEST(PlannerMoe, LayoutsParseAndRefuseBadEp) {
  const Workload w{moe_shape(4, 1024, 16, 1024, 32000, {6, 2, 1, 0}), 64};
  const Cluster c = cluster_preset("h100-sxm", 8, 8);
  const Layout l = parse_layout("dp=8,ep=2,zero=1", 8);
  EXPECT_EQ(l.ep, 2);
  EXPECT_EQ(l.str(), "dp=8,tp=1,pp=1,v=1,mb=1,schedule=1f1b,zero=1,recompute=none,sp=0,ep=2");
  EXPECT_EQ(parse_layout(l.str(), 8).str(), l.str());
  EXPECT_EQ(layout_problem(l, w, c), "");
  EXPECT_EQ(layout_problem(parse_layout("dp=8,ep=4", 8), w, c),
            "ep 4 must divide dp 8 and the 6 experts");
  EXPECT_EQ(layout_problem(parse_layout("dp=8,ep=2", 8),
                           Workload{moe_shape(4, 1024, 16, 1024, 32000, {}), 64}, c),
            "ep 2 needs a mixture-of-experts model");
  expect_error([] { parse_layout("dp=8,ep=0", 8); }, {"ep must be at least 1"});
  TransformerShape bad = moe_shape(4, 1024, 16, 1024, 32000, {4, 5, 1, 0});
  expect_error([&] { bad.check(); }, {"top_k (5) must be in [1, experts (4)]"});
}

}  // namespace
}  // namespace loom::planner
