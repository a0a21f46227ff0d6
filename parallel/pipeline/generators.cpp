// The published schedules as action lists. Each generator writes the order of the compute actions
// on every rank; assemble() adds the messages and the gradient syncs by one rule:
//
// Note [Placing sends and receives]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A receive goes immediately before the compute that needs it (RA before F of a non-first stage,
// RG before B of a non-last stage); a send goes immediately after the compute that produces it (SA
// after F of a non-last stage, SG after B of a non-first stage). The last stage's B needs only its
// own F: the loss is computed there. SYNC of a chunk follows its last B of the step (and that B's
// SG, so the gradient to the previous stage leaves first).
//
// Why this cannot deadlock: sends are posted and left in flight, so a rank waits only at a
// receive, and only for data its next compute needs anyway. The lists therefore complete exactly
// when the compute orders do, and each compute order below is a valid pipeline order (the
// schedule's own). A receive placed earlier gains nothing: the rank would only wait sooner, and
// hold back the sends listed after it, which is how a deadlock starts. So in 1F1B's steady state
// rank r lists RA(i + w) F(i + w) SA(i + w) RG(i) B(i) SG(i): the activation leaves before the
// rank waits for the gradient. A message is known by (micro-batch, chunk, peer); besides, every
// generated list receives from each peer in the order that peer sends (the unit test checks it),
// so an executor that matches messages between two ranks in order, without tags, works too.
#include "parallel/pipeline/generators.h"

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

#include "core/error.h"

namespace loom::parallel::pipeline {
namespace {

constexpr int kMaxCount = 1 << 20;  // as check_well_formed's bound

struct Compute {
  bool forward;
  int microbatch;
  int chunk;
};

void check_count(const char* op, const char* what, int n) {
  LOOM_CHECK(n >= 1 && n <= kMaxCount, op, ": ", what, " must be in [1, ", kMaxCount, "], got ", n);
}

// A schedule's sizes, every micro-batch on pipeline 0, no chunks and no actions yet.
Schedule skeleton(const char* name, int ranks, int pipelines, int stages, int microbatches) {
  Schedule s;
  s.name = name;
  s.ranks = ranks;
  s.pipelines = pipelines;
  s.stages = stages;
  s.microbatches = microbatches;
  s.chunks.assign(size_t(ranks), {});
  s.pipeline_of.assign(size_t(microbatches), 0);
  s.actions.assign(size_t(ranks), {});
  return s;
}

// Adds the messages and SYNCs to each rank's compute order (See Note [Placing sends and
// receives]).
Schedule assemble(Schedule s, const std::vector<std::vector<Compute>>& order) {
  LOOM_ASSERT(int(order.size()) == s.ranks);
  const int last_stage = s.stages - 1;
  for (int r = 0; r < s.ranks; ++r) {
    const std::vector<Compute>& ops = order[size_t(r)];
    std::vector<size_t> last_b(s.chunks[size_t(r)].size(), ops.size());
    for (size_t i = 0; i < ops.size(); ++i)
      if (!ops[i].forward) last_b[size_t(ops[i].chunk)] = i;
    std::vector<Action>& out = s.actions[size_t(r)];
    for (size_t i = 0; i < ops.size(); ++i) {
      const Compute& op = ops[i];
      const ChunkPlace place = s.chunks[size_t(r)][size_t(op.chunk)];
      const auto rank_of = [&](int stage) { return s.holder(place.pipeline, stage).first; };
      const int mb = op.microbatch, c = op.chunk;
      if (op.forward) {
        if (place.stage > 0)
          out.push_back({ActionKind::kRecvActivation, mb, c, rank_of(place.stage - 1)});
        out.push_back({ActionKind::kForward, mb, c});
        if (place.stage < last_stage)
          out.push_back({ActionKind::kSendActivation, mb, c, rank_of(place.stage + 1)});
      } else {
        if (place.stage < last_stage)
          out.push_back({ActionKind::kRecvGrad, mb, c, rank_of(place.stage + 1)});
        out.push_back({ActionKind::kBackward, mb, c});
        if (place.stage > 0)
          out.push_back({ActionKind::kSendGrad, mb, c, rank_of(place.stage - 1)});
        if (i == last_b[size_t(c)]) out.push_back({ActionKind::kGradSync, -1, c});
      }
    }
  }
  check_well_formed(s);
  return s;
}

// One pipeline of `ranks` stages, rank r holding stage r.
Schedule one_stage_per_rank(const char* name, int ranks, int microbatches) {
  Schedule s = skeleton(name, ranks, 1, ranks, microbatches);
  for (int r = 0; r < ranks; ++r) s.chunks[size_t(r)] = {ChunkPlace{0, r}};
  return s;
}

}  // namespace

Schedule gpipe(int ranks, int microbatches) {
  check_count("gpipe", "ranks", ranks);
  check_count("gpipe", "microbatches", microbatches);
  // Backwards in reverse order, as in GPipe's figure: the last forward's activations are the
  // freshest, and the first rank frees its activations last-in first-out.
  std::vector<std::vector<Compute>> order(static_cast<size_t>(ranks));
  for (auto& ops : order) {
    for (int mb = 0; mb < microbatches; ++mb) ops.push_back({true, mb, 0});
    for (int mb = microbatches - 1; mb >= 0; --mb) ops.push_back({false, mb, 0});
  }
  return assemble(one_stage_per_rank("gpipe", ranks, microbatches), order);
}

Schedule one_f_one_b(int ranks, int microbatches) {
  check_count("1f1b", "ranks", ranks);
  check_count("1f1b", "microbatches", microbatches);
  std::vector<std::vector<Compute>> order(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    auto& ops = order[size_t(r)];
    const int warmup = std::min(ranks - r - 1, microbatches);
    for (int mb = 0; mb < warmup; ++mb) ops.push_back({true, mb, 0});
    for (int mb = 0; mb + warmup < microbatches; ++mb) {
      ops.push_back({true, mb + warmup, 0});
      ops.push_back({false, mb, 0});
    }
    for (int mb = microbatches - warmup; mb < microbatches; ++mb) ops.push_back({false, mb, 0});
  }
  return assemble(one_stage_per_rank("1f1b", ranks, microbatches), order);
}

Schedule interleaved(int ranks, int microbatches, int virtual_stages) {
  check_count("interleaved", "ranks", ranks);
  check_count("interleaved", "microbatches", microbatches);
  LOOM_CHECK(virtual_stages >= 1 && virtual_stages <= kMaxCount / ranks,
             "interleaved: virtual_stages (chunks per rank) must be in [1, ", kMaxCount / ranks,
             "], got ", virtual_stages);
  LOOM_CHECK(int64_t(microbatches) * virtual_stages <= kMaxCount, "interleaved: microbatches (",
             microbatches, ") times virtual_stages (", virtual_stages, ") must be at most ",
             kMaxCount);
  LOOM_CHECK(microbatches % ranks == 0, "interleaved: microbatches (", microbatches,
             ") must be a multiple of ranks (", ranks,
             "): Megatron-LM's interleaved schedule runs the micro-batches through the chunks in "
             "groups of `ranks`");
  const int p = ranks, v = virtual_stages, m = microbatches;
  Schedule s = skeleton("interleaved", p, 1, p * v, m);
  for (int r = 0; r < p; ++r)
    for (int c = 0; c < v; ++c) s.chunks[size_t(r)].push_back(ChunkPlace{0, c * p + r});

  // Megatron-LM (megatron/core/pipeline_parallel/schedules.py, get_schedule_table with
  // microbatch_group_size_per_vp_stage = p): the k-th forward of a rank is micro-batch
  // g * p + (k mod p) of group g = k / (p v), on chunk (k mod p v) / p; the k-th backward takes
  // the same micro-batch on the chunks in reverse.
  const auto table = [&](int k, bool forward) {
    const int group = k / (p * v), in_group = k % (p * v);
    const int chunk = in_group / p;
    return Compute{forward, group * p + in_group % p, forward ? chunk : v - 1 - chunk};
  };
  const int total = m * v;
  std::vector<std::vector<Compute>> order(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) {
    auto& ops = order[size_t(r)];
    const int warmup = std::min((p - r - 1) * 2 + (v - 1) * p, total);
    for (int k = 0; k < warmup; ++k) ops.push_back(table(k, true));
    for (int k = 0; k + warmup < total; ++k) {
      ops.push_back(table(k + warmup, true));
      ops.push_back(table(k, false));
    }
    for (int k = total - warmup; k < total; ++k) ops.push_back(table(k, false));
  }
  return assemble(std::move(s), order);
}

Schedule chimera(int ranks, int microbatches) {
  check_count("chimera", "ranks", ranks);
  check_count("chimera", "microbatches", microbatches);
  LOOM_CHECK(ranks % 2 == 0, "chimera: ranks (= stages) must be even, got ", ranks,
             ": the down and up pipelines share the ranks without conflicts only for an even "
             "number of stages (Li & Hoefler, SC'21)");
  LOOM_CHECK(microbatches % 2 == 0, "chimera: microbatches must be even, got ", microbatches,
             ": they are split evenly between the down and the up pipeline");
  const int d = ranks, m = microbatches;
  Schedule s = skeleton("chimera", d, 2, d, m);
  for (int r = 0; r < d; ++r) s.chunks[size_t(r)] = {ChunkPlace{0, r}, ChunkPlace{1, d - 1 - r}};

  // The paper's basic unit takes d micro-batches: the first half down (pipeline 0, stage s on rank
  // s), the second half up (pipeline 1, stage s on rank d-1-s); a last, smaller unit splits what
  // is left the same way. In time slots where F and B take one slot each, the k-th micro-batch of
  // a pipeline in a unit runs F on stage s at slot 2k + s and B at slot 2k + 2d - 1 - s (1F1B,
  // one micro-batch entering every other slot), and unit u is shifted by 2d slots: the time-slot
  // model of the authors' schedule generator. On rank r the down pipeline's F and the up
  // pipeline's B fall on slots of r's parity, the other two on the other parity, and with d even
  // no two meet, so each rank runs its actions in slot order. Every dependency lies at an earlier
  // slot, so the order is a valid one whatever the real costs.
  std::vector<std::vector<std::tuple<int, Compute>>> slotted(static_cast<size_t>(d));
  for (int mb = 0; mb < m; ++mb) {
    const int unit = mb / d, in_unit = mb % d;
    const int half = std::min(d, m - unit * d) / 2;
    const int pipeline = in_unit < half ? 0 : 1;
    const int k = in_unit - pipeline * half;
    s.pipeline_of[size_t(mb)] = pipeline;
    const int base = unit * 2 * d;
    for (int stage = 0; stage < d; ++stage) {
      const int r = pipeline == 0 ? stage : d - 1 - stage;
      slotted[size_t(r)].emplace_back(base + 2 * k + stage, Compute{true, mb, pipeline});
      slotted[size_t(r)].emplace_back(base + 2 * k + 2 * d - 1 - stage,
                                      Compute{false, mb, pipeline});
    }
  }
  std::vector<std::vector<Compute>> order(static_cast<size_t>(d));
  for (int r = 0; r < d; ++r) {
    auto& ops = slotted[size_t(r)];
    std::sort(ops.begin(), ops.end(),
              [](const auto& a, const auto& b) { return std::get<0>(a) < std::get<0>(b); });
    for (size_t i = 0; i < ops.size(); ++i) {
      LOOM_ASSERT(i == 0 || std::get<0>(ops[i - 1]) < std::get<0>(ops[i]),
                  "chimera: two actions in slot ", std::get<0>(ops[i]), " on rank ", r);
      order[size_t(r)].push_back(std::get<1>(ops[i]));
    }
  }
  return assemble(std::move(s), order);
}

Schedule make_schedule(const std::string& name, int ranks, int microbatches, int virtual_stages) {
  LOOM_CHECK(virtual_stages == 1 || name == "interleaved", "make_schedule: virtual_stages ",
             virtual_stages, " given for '", name,
             "'; only 'interleaved' has more than one chunk per rank");
  if (name == "gpipe") return gpipe(ranks, microbatches);
  if (name == "1f1b") return one_f_one_b(ranks, microbatches);
  if (name == "interleaved") return interleaved(ranks, microbatches, virtual_stages);
  if (name == "chimera") return chimera(ranks, microbatches);
  LOOM_FAIL("make_schedule: unknown schedule '", name,
            "' (choices: gpipe, 1f1b, interleaved, chimera)");
}

}  // namespace loom::parallel::pipeline
