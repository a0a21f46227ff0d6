// Pipeline schedules as data: the text form reads back what it wrote; parse and bookkeeping
// errors name the line, or the rank and action; every generated schedule completes under a small
// simulator of its own (blocking receives, buffered sends, unit costs) with the published step
// time; and the compute orders on the edge ranks match hand-written lists from the papers.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/generators.h"
#include "parallel/pipeline/schedule.h"
#include "testing/files.h"

namespace loom::parallel::pipeline {
namespace {

using loom::testing::expect_error;

// ------------------------------------------------------------------ a test-only simulator

// Runs every rank's list as the executor would: a send is posted and the rank goes on; a receive
// blocks until the matching send (same micro-batch, pipeline and stages, between the right ranks)
// was posted. F and B take one unit of time, messages none. Every action's inputs must be there
// when it runs. Returns "" and the makespan, or what went wrong.
struct SimResult {
  std::string error;
  int makespan = 0;
};

SimResult simulate(const Schedule& s) {
  SimResult res;
  std::map<std::pair<int, int>, int> rank_of;  // (pipeline, stage) -> rank
  for (int r = 0; r < s.ranks; ++r)
    for (const ChunkPlace& p : s.chunks[size_t(r)]) rank_of[{p.pipeline, p.stage}] = r;
  // (gradient?, micro-batch, pipeline, sending stage) -> (sender, receiver, time, received)
  struct Sent {
    int from, to, time;
    bool received = false;
  };
  std::map<std::tuple<bool, int, int, int>, Sent> sent;
  std::vector<size_t> pc(size_t(s.ranks), 0);
  std::vector<int> clock(size_t(s.ranks), 0);
  std::vector<std::set<std::tuple<ActionKind, int, int>>> done(size_t(s.ranks));
  const auto fail = [&](int r, size_t i, const std::string& what) {
    res.error = "rank " + std::to_string(r) + " action " + std::to_string(i) + " (" +
                s.actions[size_t(r)][i].str() + "): " + what;
  };
  // One step of rank r; false when blocked (or failed).
  const auto step = [&](int r) -> bool {
    const size_t i = pc[size_t(r)];
    const Action& a = s.actions[size_t(r)][i];
    auto& mine = done[size_t(r)];
    const ChunkPlace place = s.chunks[size_t(r)][size_t(a.chunk)];
    const bool first = place.stage == 0, last = place.stage == s.stages - 1;
    const auto has = [&](ActionKind k) { return mine.count({k, a.microbatch, a.chunk}) > 0; };
    switch (a.kind) {
      case ActionKind::kForward:
        if (!first && !has(ActionKind::kRecvActivation))
          return fail(r, i, "input not received"), false;
        if (has(ActionKind::kForward)) return fail(r, i, "second forward"), false;
        ++clock[size_t(r)];
        break;
      case ActionKind::kBackward:
        if (!has(ActionKind::kForward)) return fail(r, i, "before its forward"), false;
        if (!last && !has(ActionKind::kRecvGrad)) return fail(r, i, "gradient not received"), false;
        ++clock[size_t(r)];
        break;
      case ActionKind::kWeightGrad:
        if (!has(ActionKind::kBackward)) return fail(r, i, "before its backward"), false;
        ++clock[size_t(r)];
        break;
      case ActionKind::kSendActivation:
      case ActionKind::kSendGrad: {
        const bool grad = a.kind == ActionKind::kSendGrad;
        if (!has(grad ? ActionKind::kBackward : ActionKind::kForward))
          return fail(r, i, "sends what is not computed yet"), false;
        if (grad ? first : last) return fail(r, i, "no stage to send to"), false;
        const int to = rank_of.at({place.pipeline, place.stage + (grad ? -1 : 1)});
        if (a.peer != to) return fail(r, i, "the peer is rank " + std::to_string(to)), false;
        const auto key = std::make_tuple(grad, a.microbatch, place.pipeline, place.stage);
        if (sent.count(key)) return fail(r, i, "sent twice"), false;
        sent[key] = Sent{r, to, clock[size_t(r)]};
        break;
      }
      case ActionKind::kRecvActivation:
      case ActionKind::kRecvGrad: {
        const bool grad = a.kind == ActionKind::kRecvGrad;
        if (grad ? last : first) return fail(r, i, "no stage to receive from"), false;
        const int from_stage = place.stage + (grad ? 1 : -1);
        auto it = sent.find(std::make_tuple(grad, a.microbatch, place.pipeline, from_stage));
        if (it == sent.end()) return false;  // blocked
        if (it->second.from != a.peer || it->second.to != r || it->second.received)
          return fail(r, i, "does not match the send of rank " + std::to_string(it->second.from)),
                 false;
        it->second.received = true;
        clock[size_t(r)] = std::max(clock[size_t(r)], it->second.time);
        break;
      }
      case ActionKind::kGradSync:
        for (int mb = 0; mb < s.microbatches; ++mb)
          if (s.pipeline_of[size_t(mb)] == place.pipeline &&
              !mine.count({ActionKind::kBackward, mb, a.chunk}))
            return fail(r, i, "before the backward of mb " + std::to_string(mb)), false;
        break;
    }
    mine.insert({a.kind, a.microbatch, a.chunk});
    ++pc[size_t(r)];
    return true;
  };
  for (bool progress = true; progress && res.error.empty();) {
    progress = false;
    for (int r = 0; r < s.ranks && res.error.empty(); ++r)
      while (pc[size_t(r)] < s.actions[size_t(r)].size() && step(r)) progress = true;
  }
  if (!res.error.empty()) return res;
  for (int r = 0; r < s.ranks; ++r)
    if (pc[size_t(r)] < s.actions[size_t(r)].size())
      res.error += "deadlock: rank " + std::to_string(r) + " waits at " +
                   s.actions[size_t(r)][pc[size_t(r)]].str() + "; ";
  for (const auto& [key, m] : sent)
    if (!m.received)
      res.error += "a message from rank " + std::to_string(m.from) + " is never received; ";
  for (int t : clock) res.makespan = std::max(res.makespan, t);
  return res;
}

TEST(TestSimulator, CatchesADeadlockAndAMissingReceive) {
  Schedule s = one_f_one_b(2, 2);
  // Rank 0 waits for micro-batch 0's gradient before sending that micro-batch's activation.
  std::vector<Action>& a = s.actions[0];  // F0 SA0 F1 SA1 RG0 B0 RG1 B1 SYNC
  const Action sa0 = a[1];
  ASSERT_EQ(sa0, (Action{ActionKind::kSendActivation, 0, 0, 1}));
  a.insert(a.begin() + 5, sa0);  // after RG0
  a.erase(a.begin() + 1);
  const SimResult dead = simulate(s);
  EXPECT_NE(dead.error.find("deadlock: rank 0 waits at RG mb 0"), std::string::npos) << dead.error;
  Schedule t = one_f_one_b(2, 2);
  t.actions[1].erase(t.actions[1].begin());  // rank 1's first RA
  EXPECT_NE(simulate(t).error.find("input not received"), std::string::npos);
}

// ------------------------------------------------------------------ helpers

struct Case {
  std::string name;
  int ranks, microbatches, v;
};

// Every generator over the sizes of the issue, and a few uneven ones.
std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m : {p, 2 * p, 1, 3, 2 * p + 1}) {
      cases.push_back({"gpipe", p, m, 1});
      cases.push_back({"1f1b", p, m, 1});
    }
    for (int m : {p, 2 * p, 3 * p})
      for (int v : {1, 2, 3}) cases.push_back({"interleaved", p, m, v});
    if (p % 2 == 0)
      for (int m : {p, 2 * p, 3 * p, 2, p + 2}) cases.push_back({"chimera", p, m, 1});
  }
  return cases;
}

std::string label(const Case& c) {
  return c.name + " ranks " + std::to_string(c.ranks) + " microbatches " +
         std::to_string(c.microbatches) + " v " + std::to_string(c.v);
}

// "F0 F1 B0 ..." (with ".chunk" when ranks hold more than one chunk).
std::string compute_order(const Schedule& s, int rank) {
  std::string out;
  for (const Action& a : s.actions[size_t(rank)]) {
    if (a.kind != ActionKind::kForward && a.kind != ActionKind::kBackward) continue;
    if (!out.empty()) out += " ";
    out += action_token(a.kind) + std::to_string(a.microbatch);
    if (s.chunks_per_rank() > 1) out += "." + std::to_string(a.chunk);
  }
  return out;
}

std::string action_list(const Schedule& s, int rank) {
  std::string out;
  for (const Action& a : s.actions[size_t(rank)]) out += (out.empty() ? "" : "; ") + a.str();
  return out;
}

void expect_same(const Schedule& a, const Schedule& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.ranks, b.ranks);
  EXPECT_EQ(a.pipelines, b.pipelines);
  EXPECT_EQ(a.stages, b.stages);
  EXPECT_EQ(a.microbatches, b.microbatches);
  EXPECT_EQ(a.chunks, b.chunks);
  EXPECT_EQ(a.pipeline_of, b.pipeline_of);
  EXPECT_EQ(a.actions, b.actions);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

std::string join(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

// The 1-based number of the line equal to `line`.
int line_number(const std::vector<std::string>& lines, const std::string& line) {
  for (size_t k = 0; k < lines.size(); ++k)
    if (lines[k] == line) return int(k) + 1;
  ADD_FAILURE() << "no line '" << line << "'";
  return 0;
}

// ------------------------------------------------------------------ the text form

TEST(ScheduleText, RoundTripsEveryGenerator) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(label(c));
    const Schedule s = make_schedule(c.name, c.ranks, c.microbatches, c.v);
    const std::string text = format_schedule(s);
    const Schedule back = parse_schedule(text, "round-trip");
    expect_same(back, s);
    EXPECT_EQ(format_schedule(back), text);
  }
}

TEST(ScheduleText, ReadsCommentsBlankLinesAndItemsInAnyOrder) {
  const Schedule s = parse_schedule(
      "# a hand-written 1F1B on two ranks, one micro-batch\n"
      "\n"
      "schedule 1f1b microbatches 1 ranks 2 pipelines 1 stages 2   # keys in any order\n"
      "0 F 0 0\n"
      "0 SA 0 0 1\n"
      "   0 RG 0 0 1\r\n"
      "0 B 0 0\n"
      "0 SYNC 0\n"
      "1 RA 0 0 0\n"
      "1 F 0 0\n"
      "1 B 0 0\n"
      "1 SG 0 0 0\n"
      "1 SYNC 0\n"
      "chunk 1 0 0 1   # chunk lines may come after the actions\n"
      "chunk 0 0 0 0\n");
  expect_same(s, one_f_one_b(2, 1));
}

TEST(ScheduleText, FormatsOneLinePerItem) {
  const std::vector<std::string> lines = lines_of(format_schedule(chimera(2, 2)));
  const std::vector<std::string> items(lines.begin() + 1, lines.begin() + 8);
  EXPECT_EQ(items, (std::vector<std::string>{"schedule chimera stages 2 pipelines 2 ranks 2 "
                                             "microbatches 2",
                                             "chunk 0 0 0 0", "chunk 0 1 1 1", "chunk 1 0 0 1",
                                             "chunk 1 1 1 0", "mb 0 0", "mb 1 1"}));
  EXPECT_EQ(lines[9], "0 F 0 0");
  EXPECT_EQ(lines[10], "0 SA 0 0 1");
  EXPECT_EQ(line_number(lines, "0 SYNC 1"), 16);
}

TEST(ScheduleText, ParseErrorsNameTheLine) {
  const std::vector<std::string> base = lines_of(format_schedule(one_f_one_b(2, 2)));
  // Replaces line `from` by `to` (erases it when `to` is empty) and expects an error naming
  // `source:line` (0: no line) and the given parts.
  const auto expect_parse_error = [&](const std::string& from, const std::string& to, int line,
                                      std::initializer_list<std::string> parts) {
    SCOPED_TRACE("'" + from + "' -> '" + to + "'");
    std::vector<std::string> lines = base;
    const int k = line_number(lines, from) - 1;
    ASSERT_GE(k, 0);
    if (to.empty())
      lines.erase(lines.begin() + k);
    else
      lines[size_t(k)] = to;
    const std::string text = join(lines);
    expect_error([&] { parse_schedule(text, "mine.schedule"); }, parts);
    if (line > 0)
      expect_error([&] { parse_schedule(text, "mine.schedule"); },
                   {"mine.schedule:" + std::to_string(line) + ":"});
  };
  const int f1 = line_number(base, "0 F 1 0");
  expect_parse_error("0 F 1 0", "0 X 1 0", f1,
                     {"unknown action 'X'", "F, B, W, SA, RA, SG, RG or SYNC", "'0 X 1 0'"});
  expect_parse_error("0 F 1 0", "0 F 1", f1, {"missing field", "<rank> F <mb> <chunk>"});
  expect_parse_error("0 F 1 0", "0 F 1 0 7", f1, {"too many fields"});
  expect_parse_error("0 F 1 0", "0 F 2 0", f1, {"micro-batch 2 out of range [0, 2)"});
  expect_parse_error("0 F 1 0", "0 F one 0", f1, {"micro-batch 'one' is not an integer"});
  expect_parse_error("0 F 1 0", "0 F 1 1", f1,
                     {"chunk 1 out of range [0, 1) (rank 0 has 1 chunk line(s))"});
  expect_parse_error("0 F 1 0", "2 F 1 0", f1, {"rank 2 out of range [0, 2)"});
  expect_parse_error("0 SA 1 0 1", "0 SA 1 0", line_number(base, "0 SA 1 0 1"),
                     {"missing field", "<rank> SA <mb> <chunk> <peer>"});
  expect_parse_error("0 SA 1 0 1", "0 SA 1 0 5", line_number(base, "0 SA 1 0 1"),
                     {"peer 5 out of range [0, 2)"});
  expect_parse_error("0 F 1 0", "frobnicate 3", f1, {"unknown item 'frobnicate'"});
  // A chunk line missing: no line to name, the source and the missing line instead.
  expect_parse_error("chunk 1 0 0 1", "", 0, {"mine.schedule: ", "no 'chunk 1 0 "});
  expect_parse_error("chunk 1 0 0 1", "chunk 1 0 0 9", 4, {"stage 9 out of range [0, 2)"});
  expect_parse_error("chunk 1 0 0 1", "chunk 1 1 0 1", 4, {"rank 1 chunk 1", "no 'chunk 1 0 "});
  expect_parse_error("schedule 1f1b stages 2 pipelines 1 ranks 2 microbatches 2",
                     "schedule 1f1b stages 2 pipelines 1 ranks 2", 2,
                     {"expected 'schedule <name> stages <S> pipelines <P> ranks <R> "
                      "microbatches <M>'"});
  expect_parse_error("schedule 1f1b stages 2 pipelines 1 ranks 2 microbatches 2",
                     "schedule 1f1b stages 2 pipelines 1 ranks 0 microbatches 2", 2,
                     {"ranks 0 out of range"});
  // The bookkeeping checks name the line of the action too.
  expect_parse_error("1 B 1 0", "1 B 0 0", line_number(base, "1 B 1 0"),
                     {"rank 1 action", "a second B of micro-batch 0 on chunk 0"});
  expect_parse_error("1 B 1 0", "", 0, {"rank 1 has no B of micro-batch 1 on chunk 0"});
  expect_error([] { parse_schedule("# nothing\n", "empty.schedule"); },
               {"empty.schedule: no schedule in it"});
  expect_error([] { parse_schedule("0 F 0 0\n", "x"); }, {"x:1:", "expected 'schedule <name>"});
}

TEST(ScheduleText, TwoPipelinesNeedAnMbLinePerMicrobatch) {
  std::vector<std::string> lines = lines_of(format_schedule(chimera(2, 2)));
  lines.erase(lines.begin() + line_number(lines, "mb 1 1") - 1);
  expect_error([&] { parse_schedule(join(lines), "c"); }, {"c: no 'mb 1 <pipeline>' line"});
}

// ------------------------------------------------------------------ bookkeeping

TEST(CheckWellFormed, AcceptsEveryGeneratedSchedule) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(label(c));
    EXPECT_NO_THROW(check_well_formed(make_schedule(c.name, c.ranks, c.microbatches, c.v)));
  }
}

TEST(CheckWellFormed, NamesAMissingForward) {
  Schedule s = one_f_one_b(2, 2);
  auto& a = s.actions[0];
  a.erase(std::find(a.begin(), a.end(), Action{ActionKind::kForward, 1, 0}));
  expect_error(
      [&] { check_well_formed(s); },
      {"schedule '1f1b'", "rank 0 has no F of micro-batch 1 on chunk 0", "stage 0 of pipeline 0"});
}

TEST(CheckWellFormed, NamesADuplicateBackward) {
  Schedule s = one_f_one_b(2, 2);
  s.actions[1].push_back(Action{ActionKind::kBackward, 0, 0});
  const int i = int(s.actions[1].size()) - 1;
  expect_error([&] { check_well_formed(s); },
               {"schedule '1f1b': rank 1 action " + std::to_string(i), "(B mb 0 chunk 0)",
                "a second B of micro-batch 0 on chunk 0 (the first is action"});
}

TEST(CheckWellFormed, NamesAStageHeldTwice) {
  Schedule s = one_f_one_b(3, 3);
  s.chunks[2][0] = ChunkPlace{0, 1};
  expect_error([&] { check_well_formed(s); },
               {"stage 1 of pipeline 0 is held twice: by rank 1 chunk 0 and by rank 2 chunk 0"});
  s.chunks[2][0] = ChunkPlace{0, 3};
  expect_error([&] { check_well_formed(s); }, {"rank 2 chunk 0: stage 3 out of range [0, 3)"});
}

TEST(CheckWellFormed, NamesOtherBookkeepingErrors) {
  {
    Schedule s = interleaved(2, 2, 2);
    s.chunks[1].pop_back();
    expect_error([&] { check_well_formed(s); }, {"rank 1 holds 1 chunks but rank 0 holds 2"});
  }
  {
    Schedule s = chimera(2, 2);
    s.pipeline_of[1] = 0;  // micro-batch 1's actions sit on the up pipeline's chunks
    expect_error([&] { check_well_formed(s); },
                 {"micro-batch 1 runs through pipeline 0 but chunk 1"});
  }
  {
    Schedule s = gpipe(2, 2);
    s.actions[0][0].microbatch = 7;
    expect_error([&] { check_well_formed(s); },
                 {"rank 0 action 0", "micro-batch 7 out of range [0, 2)"});
  }
  {
    Schedule s = gpipe(2, 2);
    s.actions[1].push_back(Action{ActionKind::kGradSync, -1, 0});
    expect_error([&] { check_well_formed(s); }, {"a second SYNC of chunk 0"});
  }
  {
    Schedule s = gpipe(2, 2);
    s.name = "my schedule";
    expect_error([&] { check_well_formed(s); }, {"the name must be one word"});
  }
  {
    const Schedule s = gpipe(2, 2);
    expect_error([&] { s.holder(0, 2); }, {"no rank holds stage 2 of pipeline 0"});
    EXPECT_EQ(s.holder(0, 1), std::make_pair(1, 0));
  }
}

// ------------------------------------------------------------------ the generators

TEST(Generators, EveryScheduleCompletesInThePublishedTime) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(label(c));
    const Schedule s = make_schedule(c.name, c.ranks, c.microbatches, c.v);
    const SimResult sim = simulate(s);
    ASSERT_EQ(sim.error, "") << format_schedule(s);
    // With F = B = 1 per chunk and free messages: GPipe and 1F1B take 2 (m + p - 1); interleaving
    // keeps the bubble at 2 (p - 1) chunk steps while the work grows to 2 m v; Chimera's unit of
    // p micro-batches takes 3p - 2 and each further unit 2p more (p - 2 bubbles per unit).
    const int p = c.ranks, m = c.microbatches;
    if (c.name == "gpipe" || c.name == "1f1b") EXPECT_EQ(sim.makespan, 2 * (m + p - 1));
    if (c.name == "interleaved") EXPECT_EQ(sim.makespan, 2 * m * c.v + 2 * (p - 1));
    if (c.name == "chimera" && m % p == 0) EXPECT_EQ(sim.makespan, 2 * m + p - 2);
  }
}

TEST(Generators, PlaceMessagesBesideTheirComputeAndOneSyncAfterEachChunksLastBackward) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(label(c));
    const Schedule s = make_schedule(c.name, c.ranks, c.microbatches, c.v);
    for (int r = 0; r < s.ranks; ++r) {
      const std::vector<Action>& list = s.actions[size_t(r)];
      std::vector<int> last_b(size_t(s.chunks_per_rank()), -1), syncs(last_b.size(), 0);
      for (size_t i = 0; i < list.size(); ++i) {
        const Action& a = list[i];
        const ChunkPlace place = s.chunks[size_t(r)][size_t(a.chunk)];
        const bool first = place.stage == 0, last = place.stage == s.stages - 1;
        const auto at = [&](size_t k, ActionKind kind) {
          return k < list.size() && list[k].kind == kind && list[k].microbatch == a.microbatch &&
                 list[k].chunk == a.chunk;
        };
        if (a.kind == ActionKind::kForward) {
          EXPECT_EQ(!first, i > 0 && at(i - 1, ActionKind::kRecvActivation)) << r << " " << i;
          EXPECT_EQ(!last, at(i + 1, ActionKind::kSendActivation)) << r << " " << i;
        }
        if (a.kind == ActionKind::kBackward) {
          EXPECT_EQ(!last, i > 0 && at(i - 1, ActionKind::kRecvGrad)) << r << " " << i;
          EXPECT_EQ(!first, at(i + 1, ActionKind::kSendGrad)) << r << " " << i;
          last_b[size_t(a.chunk)] = int(i);
        }
        if (a.kind == ActionKind::kGradSync) {
          ++syncs[size_t(a.chunk)];
          // Right after the chunk's last B, or after that B's SG.
          const int b = last_b[size_t(a.chunk)];
          EXPECT_TRUE(b == int(i) - 1 ||
                      (b == int(i) - 2 && list[i - 1].kind == ActionKind::kSendGrad));
        }
      }
      for (int c2 = 0; c2 < s.chunks_per_rank(); ++c2) EXPECT_EQ(syncs[size_t(c2)], 1);
    }
  }
}

// Each rank receives from a peer in the order that peer sends to it, so an executor that matches
// point-to-point messages in order (NCCL has no tags) needs no more than the lists.
TEST(Generators, ReceiveFromEachPeerInTheOrderItSends) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(label(c));
    const Schedule s = make_schedule(c.name, c.ranks, c.microbatches, c.v);
    // (from, to) -> the messages (gradient?, micro-batch, pipeline, sending stage) in list order.
    std::map<std::pair<int, int>, std::vector<std::tuple<bool, int, int, int>>> sends, receives;
    for (int r = 0; r < s.ranks; ++r)
      for (const Action& a : s.actions[size_t(r)]) {
        const ChunkPlace p = s.chunks[size_t(r)][size_t(a.chunk)];
        if (a.kind == ActionKind::kSendActivation || a.kind == ActionKind::kSendGrad)
          sends[{r, a.peer}].emplace_back(a.kind == ActionKind::kSendGrad, a.microbatch, p.pipeline,
                                          p.stage);
        if (a.kind == ActionKind::kRecvActivation)
          receives[{a.peer, r}].emplace_back(false, a.microbatch, p.pipeline, p.stage - 1);
        if (a.kind == ActionKind::kRecvGrad)
          receives[{a.peer, r}].emplace_back(true, a.microbatch, p.pipeline, p.stage + 1);
      }
    EXPECT_EQ(sends, receives);
  }
}

TEST(Generators, OneFOneBOrders) {
  const Schedule s = one_f_one_b(4, 8);
  EXPECT_EQ(compute_order(s, 0), "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  EXPECT_EQ(compute_order(s, 1), "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
  EXPECT_EQ(compute_order(s, 3), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
  // Fewer micro-batches than the warm-up: all forwards first.
  EXPECT_EQ(compute_order(one_f_one_b(4, 2), 0), "F0 F1 B0 B1");
}

TEST(Generators, OneFOneBActionLists) {
  const Schedule s = one_f_one_b(2, 2);
  EXPECT_EQ(action_list(s, 0),
            "F mb 0 chunk 0; SA mb 0 chunk 0 -> rank 1; F mb 1 chunk 0; SA mb 1 chunk 0 -> rank 1; "
            "RG mb 0 chunk 0 <- rank 1; B mb 0 chunk 0; RG mb 1 chunk 0 <- rank 1; B mb 1 chunk 0; "
            "SYNC chunk 0");
  EXPECT_EQ(action_list(s, 1),
            "RA mb 0 chunk 0 <- rank 0; F mb 0 chunk 0; B mb 0 chunk 0; SG mb 0 chunk 0 -> rank 0; "
            "RA mb 1 chunk 0 <- rank 0; F mb 1 chunk 0; B mb 1 chunk 0; SG mb 1 chunk 0 -> rank 0; "
            "SYNC chunk 0");
}

TEST(Generators, GpipeOrders) {
  const Schedule s = gpipe(3, 3);
  for (int r : {0, 2}) EXPECT_EQ(compute_order(s, r), "F0 F1 F2 B2 B1 B0");
  EXPECT_EQ(action_list(gpipe(1, 2), 0),
            "F mb 0 chunk 0; F mb 1 chunk 0; B mb 1 chunk 0; B mb 0 chunk 0; SYNC chunk 0");
}

TEST(Generators, InterleavedOrdersFollowMegatron) {
  // p 2, v 2, m 4: rank 0 warms up with (2 - 0 - 1) * 2 + (2 - 1) * 2 = 4 forwards, rank 1 with 2;
  // micro-batches go through chunk 0 and then chunk 1 in groups of 2, backwards chunk 1 first.
  const Schedule s = interleaved(2, 4, 2);
  EXPECT_EQ(compute_order(s, 0),
            "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(compute_order(s, 1),
            "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
  // Rank 1's chunk 0 (stage 1) sends to rank 0's chunk 1 (stage 2).
  EXPECT_EQ(s.actions[1][2], (Action{ActionKind::kSendActivation, 0, 0, 0}));
  EXPECT_EQ(s.stages, 4);
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 2; ++c)
      EXPECT_EQ(s.chunks[size_t(r)][size_t(c)], (ChunkPlace{0, c * 2 + r}));
}

TEST(Generators, ChimeraOrdersFollowThePaper) {
  // Li & Hoefler, Figure 3 (D = 4, N = 4): micro-batches 0, 1 down (chunk 0), 2, 3 up (chunk 1).
  const Schedule s = chimera(4, 4);
  EXPECT_EQ(compute_order(s, 0), "F0.0 F1.0 F2.1 B2.1 F3.1 B3.1 B0.0 B1.0");
  EXPECT_EQ(compute_order(s, 1), "F0.0 F2.1 F1.0 F3.1 B2.1 B0.0 B3.1 B1.0");
  EXPECT_EQ(compute_order(s, 2), "F2.1 F0.0 F3.1 F1.0 B0.0 B2.1 B1.0 B3.1");
  EXPECT_EQ(compute_order(s, 3), "F2.1 F3.1 F0.0 B0.0 F1.0 B1.0 B2.1 B3.1");
  EXPECT_EQ(s.pipelines, 2);
  EXPECT_EQ(s.stages, 4);
  EXPECT_EQ(s.pipeline_of, (std::vector<int>{0, 0, 1, 1}));
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(s.chunks[size_t(r)], (std::vector<ChunkPlace>{{0, r}, {1, 3 - r}}));
  // Units of D micro-batches, half down and half up; a smaller last unit split the same way.
  EXPECT_EQ(chimera(4, 8).pipeline_of, (std::vector<int>{0, 0, 1, 1, 0, 0, 1, 1}));
  EXPECT_EQ(chimera(4, 6).pipeline_of, (std::vector<int>{0, 0, 1, 1, 0, 1}));
  EXPECT_EQ(chimera(4, 2).pipeline_of, (std::vector<int>{0, 1}));
}

TEST(Generators, ChimeraActionListsSyncEachReplicaAfterItsLastBackward) {
  // Rank 0 holds down stage 0 (chunk 0) and up stage 1 (chunk 1); rank 1 the other two.
  const Schedule s = chimera(2, 2);
  EXPECT_EQ(action_list(s, 0),
            "F mb 0 chunk 0; SA mb 0 chunk 0 -> rank 1; RA mb 1 chunk 1 <- rank 1; "
            "F mb 1 chunk 1; B mb 1 chunk 1; SG mb 1 chunk 1 -> rank 1; SYNC chunk 1; "
            "RG mb 0 chunk 0 <- rank 1; B mb 0 chunk 0; SYNC chunk 0");
  EXPECT_EQ(action_list(s, 1),
            "F mb 1 chunk 1; SA mb 1 chunk 1 -> rank 0; RA mb 0 chunk 0 <- rank 0; "
            "F mb 0 chunk 0; B mb 0 chunk 0; SG mb 0 chunk 0 -> rank 0; SYNC chunk 0; "
            "RG mb 1 chunk 1 <- rank 0; B mb 1 chunk 1; SYNC chunk 1");
}

TEST(Generators, MakeScheduleByName) {
  EXPECT_EQ(format_schedule(make_schedule("1f1b", 4, 8)), format_schedule(one_f_one_b(4, 8)));
  EXPECT_EQ(format_schedule(make_schedule("interleaved", 2, 4, 2)),
            format_schedule(interleaved(2, 4, 2)));
  EXPECT_EQ(make_schedule("gpipe", 2, 2).name, "gpipe");
  EXPECT_EQ(make_schedule("chimera", 2, 2).name, "chimera");
  expect_error([] { make_schedule("zigzag", 2, 2); },
               {"unknown schedule 'zigzag'", "gpipe, 1f1b, interleaved, chimera"});
  expect_error([] { make_schedule("1f1b", 2, 2, 2); },
               {"virtual_stages 2 given for '1f1b'", "only 'interleaved'"});
}

TEST(Generators, RefuseBadArguments) {
  expect_error([] { gpipe(0, 4); }, {"gpipe: ranks must be in [1, ", "got 0"});
  expect_error([] { gpipe(2, -1); }, {"gpipe: microbatches must be in [1, ", "got -1"});
  expect_error([] { one_f_one_b(2, 0); }, {"1f1b: microbatches", "got 0"});
  expect_error([] { interleaved(2, 4, 0); }, {"interleaved: virtual_stages", "got 0"});
  expect_error([] { interleaved(2, 1 << 20, 2); }, {"times virtual_stages (2) must be at most"});
  expect_error([] { interleaved(4, 6, 2); },
               {"interleaved: microbatches (6) must be a multiple of ranks (4)", "Megatron"});
  expect_error([] { chimera(3, 6); }, {"chimera: ranks (= stages) must be even, got 3"});
  expect_error([] { chimera(4, 5); }, {"chimera: microbatches must be even, got 5"});
  expect_error([] { chimera(0, 2); }, {"chimera: ranks must be in [1, "});
}

// ------------------------------------------------------------------ the executor's receives

bool is_compute(ActionKind k) {
  return k == ActionKind::kForward || k == ActionKind::kBackward || k == ActionKind::kWeightGrad;
}

TEST(ReceivePosts, PostsEachReceiveOneComputeBeforeItsPlace) {
  // 1f1b, 2 ranks, 4 micro-batches. Rank 1: RA 0, F 0, B 0, SG 0, RA 1, ...: RA 1 is posted
  // before B 0, so micro-batch 1's activation arrives while B 0 runs; RA 0 has no compute
  // before it and is posted in place. Rank 0: F 0, SA 0, F 1, SA 1, RG 0, B 0: RG 0 is posted
  // before F 1.
  const Schedule s = one_f_one_b(2, 4);
  const std::vector<Action>& r1 = s.actions[1];
  const std::vector<int> p1 = receive_posts(r1);
  ASSERT_EQ(r1[0].kind, ActionKind::kRecvActivation);
  EXPECT_EQ(p1[0], 0);
  ASSERT_EQ(r1[4].kind, ActionKind::kRecvActivation);
  ASSERT_EQ(r1[2].kind, ActionKind::kBackward);
  EXPECT_EQ(p1[4], 2);
  const std::vector<Action>& r0 = s.actions[0];
  const std::vector<int> p0 = receive_posts(r0);
  ASSERT_EQ(r0[4].kind, ActionKind::kRecvGrad);
  ASSERT_EQ(r0[2].kind, ActionKind::kForward);
  EXPECT_EQ(p0[4], 2);
  EXPECT_EQ(p0[0], -1);  // F: not a receive
}

TEST(ReceivePosts, NeverLaterThanTheReceiveNorMoreThanOneComputeEarlier) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(label(c));
    const Schedule s = make_schedule(c.name, c.ranks, c.microbatches, c.v);
    for (const std::vector<Action>& actions : s.actions) {
      const std::vector<int> post = receive_posts(actions);
      ASSERT_EQ(post.size(), actions.size());
      for (size_t i = 0; i < actions.size(); ++i) {
        const bool receive = actions[i].kind == ActionKind::kRecvActivation ||
                             actions[i].kind == ActionKind::kRecvGrad;
        if (!receive) {
          EXPECT_EQ(post[i], -1);
          continue;
        }
        ASSERT_GE(post[i], 0);
        ASSERT_LE(post[i], int(i));
        int computes_between = 0;  // computes from the post to the receive's own place
        for (int k = post[i]; k < int(i); ++k) computes_between += is_compute(actions[k].kind);
        EXPECT_LE(computes_between, 1);
        if (post[i] < int(i)) EXPECT_TRUE(is_compute(actions[size_t(post[i])].kind));
      }
    }
  }
}

// A huge or binary line is quoted as an excerpt (found by tests/robustness/replay.py: a
// 100,000-character first line made a 100,191-character error).
TEST(ScheduleText, ErrorsQuoteAnExcerptOfLongOrBinaryLines) {
  const std::string longline(100000, 'x');
  try {
    parse_schedule(longline + "\n", "long.schedule");
    ADD_FAILURE() << "a 100,000-character line parsed";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_LT(msg.size(), 600u) << msg.size() << " characters";
    EXPECT_NE(msg.find("long.schedule:1:"), std::string::npos) << msg;
    EXPECT_NE(msg.find("more bytes)"), std::string::npos) << msg;
  }
  expect_error([] { parse_schedule(std::string("sched\x01\xff ule\n"), "bin.schedule"); },
               {"bin.schedule:1:", "\\x01\\xFF"});
}

}  // namespace
}  // namespace loom::parallel::pipeline
