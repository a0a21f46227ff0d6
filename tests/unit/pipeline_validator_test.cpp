// The schedule validator against the published figures (unit costs): GPipe and 1F1B leave a
// bubble of (p-1)/(m+p-1) on every rank; GPipe keeps m micro-batches' activations, 1F1B at most p
// on the first stage; interleaving with v chunks divides the bubble time by v; Chimera's bubble
// and activation balance are the paper's. And schedules that break a rule or deadlock are
// refused with the rank and action.
#include <gtest/gtest.h>

#include "parallel/pipeline/generators.h"
#include "parallel/pipeline/validator.h"
#include "testing/files.h"

namespace loom::parallel::pipeline {
namespace {

using loom::testing::expect_error;

double gpipe_bubble(int p, int m) { return double(p - 1) / double(m + p - 1); }

TEST(Validator, GpipeAnd1f1bHaveThePublishedBubble) {
  for (int p : {2, 4, 8})
    for (int m : {p, 2 * p, 3 * p + 1}) {
      for (const Schedule& s : {gpipe(p, m), one_f_one_b(p, m)}) {
        SCOPED_TRACE(s.name + " p " + std::to_string(p) + " m " + std::to_string(m));
        const Simulation sim = validate(s);
        EXPECT_DOUBLE_EQ(sim.makespan, 2.0 * (m + p - 1));
        for (const RankStats& r : sim.ranks) EXPECT_NEAR(r.bubble, gpipe_bubble(p, m), 1e-12);
      }
    }
}

TEST(Validator, GpipeKeepsEveryActivation1f1bAtMostP) {
  for (int p : {2, 4, 8})
    for (int m : {p, 2 * p, 3 * p + 1}) {
      SCOPED_TRACE("p " + std::to_string(p) + " m " + std::to_string(m));
      const Simulation g = validate(gpipe(p, m)), f = validate(one_f_one_b(p, m));
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(g.ranks[size_t(r)].peak_activations, m);
        EXPECT_EQ(f.ranks[size_t(r)].peak_activations, std::min(m, p - r));
      }
    }
}

TEST(Validator, InterleavingDividesTheBubbleByV) {
  for (int p : {2, 4})
    for (int v : {2, 3})
      for (int m : {p, 2 * p}) {
        SCOPED_TRACE("p " + std::to_string(p) + " v " + std::to_string(v) + " m " +
                     std::to_string(m));
        const Simulation sim = validate(interleaved(p, m, v));
        // Each chunk costs 1/v of a rank's share: the ideal step is m (F + B) = 2m, and the
        // bubble time (p - 1) * 2 / v instead of 1F1B's (p - 1) * 2.
        const double bubble_time = 2.0 * (p - 1) / v;
        EXPECT_NEAR(sim.makespan, 2.0 * m + bubble_time, 1e-9);
        for (const RankStats& r : sim.ranks)
          EXPECT_NEAR(r.bubble, bubble_time / (2.0 * m + bubble_time), 1e-9);
      }
}

// Li & Hoefler (SC'21), Table 1: Chimera's bubble ratio is (D-2)/(2N+D-2) with D stages and N
// micro-batches, and each worker keeps between D/2+1 and D micro-batches' activations (the two
// pipelines balance what 1F1B piles onto its first stage: here stage 0 of the down pipeline and
// the last of the up one share a rank).
TEST(Validator, ChimeraHasThePapersBubbleAndActivationBalance) {
  for (int d : {2, 4, 8})
    for (int n : {d, 2 * d}) {
      SCOPED_TRACE("D " + std::to_string(d) + " N " + std::to_string(n));
      const Simulation sim = validate(chimera(d, n));
      EXPECT_DOUBLE_EQ(sim.makespan, 2.0 * n + d - 2);
      for (int r = 0; r < d; ++r) {
        const RankStats& st = sim.ranks[size_t(r)];
        EXPECT_NEAR(st.bubble, double(d - 2) / double(2 * n + d - 2), 1e-12);
        EXPECT_GE(st.peak_activations, d / 2 + 1);
        EXPECT_LE(st.peak_activations, d);
        EXPECT_EQ(st.peak_activations, sim.ranks[size_t(d - 1 - r)].peak_activations)
            << "rank " << r << " and its mirror " << d - 1 - r;
      }
    }
}

// Per-stage extras (a GPT's embedding on the first stage, logits and loss on the last): with
// forward and backward 1, the last stage's extra x_f + x_b lies on the critical path of every
// micro-batch in 1F1B's steady state, GPipe's last stage runs all m forwards and backwards:
// makespan 2(m + p - 1) + m (x_f + x_b) for both, and the refusal of a wrongly sized list.
TEST(Validator, StageExtrasAddToTheirStagesCriticalPath) {
  const int p = 4, m = 8;
  const double xf = 0.5, xb = 0.25;
  CostModel cost;
  cost.stage_forward_extra.assign(size_t(p), 0.0);
  cost.stage_backward_extra.assign(size_t(p), 0.0);
  cost.stage_forward_extra.back() = xf;
  cost.stage_backward_extra.back() = xb;
  for (const Schedule& s : {gpipe(p, m), one_f_one_b(p, m)}) {
    SCOPED_TRACE(s.name);
    const Simulation sim = validate(s, cost);
    EXPECT_DOUBLE_EQ(sim.makespan, 2.0 * (m + p - 1) + m * (xf + xb));
    EXPECT_DOUBLE_EQ(sim.ranks.back().busy, m * (2.0 + xf + xb));
    EXPECT_DOUBLE_EQ(sim.ranks.front().busy, m * 2.0);
  }
  cost.stage_forward_extra.pop_back();
  expect_error([&] { validate(one_f_one_b(p, m), cost); }, {"one entry per stage (4), got 3"});
}

TEST(Validator, ReportHasOneLinePerRank) {
  const Simulation sim = validate(one_f_one_b(4, 8));
  EXPECT_EQ(sim.report(),
            "rank 0 bubble 0.2727 peak_activations 4\n"
            "rank 1 bubble 0.2727 peak_activations 3\n"
            "rank 2 bubble 0.2727 peak_activations 2\n"
            "rank 3 bubble 0.2727 peak_activations 1\n");
}

// A hand-written 2-rank schedule, then broken in each of the ways the validator must catch.
Schedule two_ranks() {
  return parse_schedule(
      "schedule manual stages 2 pipelines 1 ranks 2 microbatches 1\n"
      "chunk 0 0 0 0\n"
      "chunk 1 0 0 1\n"
      "0 F 0 0\n"
      "0 SA 0 0 1\n"
      "0 RG 0 0 1\n"
      "0 B 0 0\n"
      "0 SYNC 0\n"
      "1 RA 0 0 0\n"
      "1 F 0 0\n"
      "1 B 0 0\n"
      "1 SG 0 0 0\n"
      "1 SYNC 0\n");
}

TEST(Validator, AcceptsAHandWrittenSchedule) {
  const Simulation sim = validate(two_ranks());
  EXPECT_DOUBLE_EQ(sim.makespan, 4.0);
  EXPECT_NEAR(sim.ranks[0].bubble, 0.5, 1e-12);
}

TEST(Validator, RefusesADeadlockNamingWhereEachRankStalls) {
  Schedule s = two_ranks();
  // Rank 0 now waits for the gradient before sending the activation it depends on.
  std::swap(s.actions[0][1], s.actions[0][2]);  // rank 0: F, RG, SA, B
  expect_error([&] { validate(s); },
               {"deadlocks", "rank 0 stalls at action 1", "rank 1 stalls at action 0",
                "which rank 0 sends only at its action 2"});
}

TEST(Validator, RefusesAMissingReceive) {
  Schedule s = two_ranks();
  s.actions[1].erase(s.actions[1].begin());  // no RA before rank 1's forward
  expect_error([&] { validate(s); }, {"rank 1 action 0", "F mb 0 chunk 0", "no receive"});
}

TEST(Validator, RefusesAReceiveFromTheWrongRank) {
  Schedule s = two_ranks();
  s.actions[1][0].peer = 1;
  expect_error([&] { validate(s); }, {"rank 1 action 0", "names rank 1", "is on rank 0"});
}

TEST(Validator, RefusesASecondSendOfOneMessage) {
  Schedule s = two_ranks();
  s.actions[0].insert(s.actions[0].begin() + 2, Action{ActionKind::kSendActivation, 0, 0, 1});
  expect_error([&] { validate(s); }, {"rank 0 action 2", "already sent"});
}

TEST(Validator, RefusesASyncBeforeTheLastBackward) {
  Schedule s = two_ranks();
  std::swap(s.actions[1][2], s.actions[1][4]);  // rank 1: RA, F, SYNC, SG, B
  expect_error([&] { validate(s); }, {"rank 1 action 2", "SYNC", "before the backward"});
}

}  // namespace
}  // namespace loom::parallel::pipeline
