#include "parallel/pipeline/validator.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"

namespace loom::parallel::pipeline {
namespace {

// A message between neighbouring stages: activation from stage `from` to from + 1, or gradient
// from stage `from` to from - 1.
struct Message {
  bool gradient;
  int microbatch, pipeline, from;
};

struct Posted {
  int rank = -1, index = -1;
  double time = 0;
  bool sent = false, received = false;
};

// Which (microbatch, chunk) pairs of one rank an action kind has done: a flag per pair (the
// planner simulates thousands of schedules, so lookups are an index, not a tree search).
class Done {
 public:
  Done(int microbatches, int chunks) : chunks_(chunks), done_(size_t(microbatches * chunks), 0) {}
  bool count(const std::pair<int, int>& mc) const { return done_[index(mc)] != 0; }
  void insert(const std::pair<int, int>& mc) { done_[index(mc)] = 1; }

 private:
  size_t index(const std::pair<int, int>& mc) const {
    return size_t(mc.first * chunks_ + mc.second);
  }
  int chunks_;
  std::vector<char> done_;
};

class Simulator {
 public:
  Simulator(const Schedule& s, const CostModel& c) : s_(s), cost_(c) {
    const int r = s.ranks;
    pc_.assign(size_t(r), 0);
    clock_.assign(size_t(r), 0.0);
    const Done none(s.microbatches, s.chunks_per_rank());
    for (auto* done : {&f_, &b_, &w_, &ra_, &rg_, &has_w_}) done->assign(size_t(r), none);
    live_.assign(size_t(r), 0);
    stats_.resize(size_t(r));
    for (int rank = 0; rank < r; ++rank)
      for (const Action& a : s.actions[size_t(rank)])
        if (a.kind == ActionKind::kWeightGrad) has_w_[size_t(rank)].insert({a.microbatch, a.chunk});
    holder_.assign(size_t(s.pipelines * s.stages), -1);
    for (int rank = 0; rank < r; ++rank)
      for (const ChunkPlace& place : s.chunks[size_t(rank)])
        holder_[size_t(place.pipeline * s.stages + place.stage)] = rank;
    posted_.resize(size_t(2 * s.microbatches * s.pipelines * s.stages));
    scale_ = double(s.ranks) / double(s.stages);
  }

  Simulation run() {
    for (bool progress = true; progress;) {
      progress = false;
      for (int r = 0; r < s_.ranks; ++r)
        while (pc_[size_t(r)] < s_.actions[size_t(r)].size() && step(r)) progress = true;
    }
    for (int r = 0; r < s_.ranks; ++r)
      if (pc_[size_t(r)] < s_.actions[size_t(r)].size()) deadlock();
    for (const Posted& p : posted_)
      LOOM_CHECK(!p.sent || p.received, where(p.rank, p.index),
                 " sends a message no rank receives");
    Simulation sim;
    for (int r = 0; r < s_.ranks; ++r) sim.makespan = std::max(sim.makespan, clock_[size_t(r)]);
    for (int r = 0; r < s_.ranks; ++r) {
      RankStats& st = stats_[size_t(r)];
      st.finish = clock_[size_t(r)];
      st.bubble = sim.makespan > 0 ? 1.0 - st.busy / sim.makespan : 0.0;
    }
    sim.ranks = stats_;
    return sim;
  }

 private:
  static double extra(const std::vector<double>& per_stage, int stage) {
    return per_stage.empty() ? 0.0 : per_stage[size_t(stage)];
  }

  std::string where(int r, size_t i) const {
    return detail::str_cat("schedule '", s_.name, "': rank ", r, " action ", i, " (",
                           s_.actions[size_t(r)][i].str(), ")");
  }

  // The rank holding stage `stage` of `pipeline`, checked against the action's peer.
  void check_peer(int r, size_t i, const Action& a, int pipeline, int stage) const {
    LOOM_CHECK(stage >= 0 && stage < s_.stages, where(r, i), " has no stage ", stage,
               " to talk to (pipeline ", pipeline, " has stages 0..", s_.stages - 1, ")");
    const int holder = holder_[size_t(pipeline * s_.stages + stage)];
    if (a.peer != holder)
      fail(r, i,
           detail::str_cat("names rank ", a.peer, " but stage ", stage, " of pipeline ", pipeline,
                           " is on rank ", holder));
  }

  // Messages are built only for a failure: the planner validates thousands of schedules.
  void require(bool ok, int r, size_t i, const char* what) const {
    if (!ok) fail(r, i, what);
  }
  [[noreturn]] void fail(int r, size_t i, const std::string& what) const {
    LOOM_FAIL(where(r, i), " ", what);
  }

  // The message slot of (gradient, microbatch, pipeline, from).
  Posted& posted(const Message& m) {
    return posted_[size_t(
        ((int(m.gradient) * s_.microbatches + m.microbatch) * s_.pipelines + m.pipeline) *
            s_.stages +
        m.from)];
  }

  void compute(int r, double cost) {
    clock_[size_t(r)] += cost;
    stats_[size_t(r)].busy += cost;
  }

  void add_live(int r, int delta) {
    live_[size_t(r)] += delta;
    stats_[size_t(r)].peak_activations =
        std::max(stats_[size_t(r)].peak_activations, live_[size_t(r)]);
  }

  // Runs rank r's next action; false when it is a receive whose message has not been sent.
  bool step(int r) {
    const size_t i = pc_[size_t(r)];
    const Action& a = s_.actions[size_t(r)][i];
    const std::pair<int, int> mc{a.microbatch, a.chunk};
    if (a.kind == ActionKind::kGradSync) {
      const ChunkPlace& place = s_.chunks[size_t(r)][size_t(a.chunk)];
      for (int mb = 0; mb < s_.microbatches; ++mb) {
        if (s_.pipeline_of[size_t(mb)] != place.pipeline) continue;
        if (!b_[size_t(r)].count({mb, a.chunk}) ||
            (has_w_[size_t(r)].count({mb, a.chunk}) && !w_[size_t(r)].count({mb, a.chunk})))
          fail(r, i,
               detail::str_cat("comes before the backward of micro-batch ", mb, " on chunk ",
                               a.chunk, " is done"));
      }
      ++pc_[size_t(r)];
      return true;
    }
    const ChunkPlace& place = s_.chunks[size_t(r)][size_t(a.chunk)];
    const int last = s_.stages - 1;
    if (s_.pipeline_of[size_t(a.microbatch)] != place.pipeline)
      fail(r, i,
           detail::str_cat("runs micro-batch ", a.microbatch, " of pipeline ",
                           s_.pipeline_of[size_t(a.microbatch)], " on a chunk of pipeline ",
                           place.pipeline));
    switch (a.kind) {
      case ActionKind::kForward:
        require(place.stage == 0 || ra_[size_t(r)].count(mc), r, i,
                "has no input: no receive of its activation (RA) comes before it");
        require(!f_[size_t(r)].count(mc), r, i, "repeats a forward");
        compute(r, cost_.forward * scale_ + extra(cost_.stage_forward_extra, place.stage));
        f_[size_t(r)].insert(mc);
        add_live(r, 1);
        break;
      case ActionKind::kBackward:
        require(f_[size_t(r)].count(mc), r, i, "comes before its forward");
        require(place.stage == last || rg_[size_t(r)].count(mc), r, i,
                "has no output gradient: no receive of it (RG) comes before it");
        require(!b_[size_t(r)].count(mc), r, i, "repeats a backward");
        compute(r, cost_.backward * scale_ + extra(cost_.stage_backward_extra, place.stage));
        b_[size_t(r)].insert(mc);
        if (!has_w_[size_t(r)].count(mc)) add_live(r, -1);
        break;
      case ActionKind::kWeightGrad:
        require(b_[size_t(r)].count(mc), r, i, "comes before its backward");
        require(!w_[size_t(r)].count(mc), r, i, "repeats a weight gradient");
        compute(r, cost_.weight_grad * scale_);
        w_[size_t(r)].insert(mc);
        add_live(r, -1);
        break;
      case ActionKind::kSendActivation:
      case ActionKind::kSendGrad: {
        const bool grad = a.kind == ActionKind::kSendGrad;
        require(grad ? b_[size_t(r)].count(mc) : f_[size_t(r)].count(mc), r, i,
                grad ? "sends a gradient its backward has not produced yet"
                     : "sends an activation its forward has not produced yet");
        check_peer(r, i, a, place.pipeline, grad ? place.stage - 1 : place.stage + 1);
        Posted& p = posted(Message{grad, a.microbatch, place.pipeline, place.stage});
        require(!p.sent, r, i, "sends a message that was already sent");
        p = Posted{r, int(i), clock_[size_t(r)], true};
        break;
      }
      case ActionKind::kRecvActivation:
      case ActionKind::kRecvGrad: {
        const bool grad = a.kind == ActionKind::kRecvGrad;
        const int from = grad ? place.stage + 1 : place.stage - 1;
        check_peer(r, i, a, place.pipeline, from);
        Posted& p = posted(Message{grad, a.microbatch, place.pipeline, from});
        if (!p.sent) return false;  // blocked until the peer sends
        require(!p.received, r, i, "receives a message a second time");
        p.received = true;
        clock_[size_t(r)] = std::max(clock_[size_t(r)], p.time + cost_.transfer);
        (grad ? rg_ : ra_)[size_t(r)].insert(mc);
        break;
      }
      case ActionKind::kGradSync:
        break;
    }
    ++pc_[size_t(r)];
    return true;
  }

  // Every rank left is waiting on a receive: say where each stalls and what it waits for.
  [[noreturn]] void deadlock() const {
    std::string msg = detail::str_cat("schedule '", s_.name, "' deadlocks:");
    for (int r = 0; r < s_.ranks; ++r) {
      const size_t i = pc_[size_t(r)];
      if (i >= s_.actions[size_t(r)].size()) continue;
      const Action& a = s_.actions[size_t(r)][i];
      msg += detail::str_cat(" rank ", r, " stalls at action ", i, " (", a.str(), ")");
      // Where the peer would send it, if anywhere.
      const ChunkPlace& place = s_.chunks[size_t(r)][size_t(a.chunk)];
      const bool grad = a.kind == ActionKind::kRecvGrad;
      const ActionKind send = grad ? ActionKind::kSendGrad : ActionKind::kSendActivation;
      const int from = grad ? place.stage + 1 : place.stage - 1;
      int found = -1;
      if (a.peer >= 0 && a.peer < s_.ranks && from >= 0 && from < s_.stages) {
        const auto [holder, chunk] = s_.holder(place.pipeline, from);
        const auto& peer_actions = s_.actions[size_t(holder)];
        for (size_t k = 0; k < peer_actions.size(); ++k)
          if (peer_actions[k].kind == send && peer_actions[k].microbatch == a.microbatch &&
              peer_actions[k].chunk == chunk)
            found = int(k);
        msg += found >= 0 ? detail::str_cat(", which rank ", holder, " sends only at its action ",
                                            found, ";")
                          : detail::str_cat(", which no action of rank ", holder, " sends;");
      } else {
        msg += ";";
      }
    }
    if (!msg.empty() && msg.back() == ';') msg.back() = '.';
    LOOM_FAIL(msg);
  }

  const Schedule& s_;
  CostModel cost_;
  double scale_;
  std::vector<size_t> pc_;
  std::vector<double> clock_;
  std::vector<Done> f_, b_, w_, ra_, rg_, has_w_;
  std::vector<int> live_;
  std::vector<RankStats> stats_;
  std::vector<int> holder_;     // [pipeline * stages + stage]: the rank holding it
  std::vector<Posted> posted_;  // See posted()
};

}  // namespace

std::string Simulation::report() const {
  std::string out;
  char line[96];
  for (size_t r = 0; r < ranks.size(); ++r) {
    std::snprintf(line, sizeof line, "rank %zu bubble %.4f peak_activations %d\n", r,
                  ranks[r].bubble, ranks[r].peak_activations);
    out += line;
  }
  return out;
}

Simulation validate(const Schedule& schedule, const CostModel& cost) {
  LOOM_CHECK(cost.forward >= 0 && cost.backward >= 0 && cost.weight_grad >= 0 && cost.transfer >= 0,
             "validate: costs must be >= 0");
  check_well_formed(schedule);
  for (const auto* extra : {&cost.stage_forward_extra, &cost.stage_backward_extra}) {
    LOOM_CHECK(extra->empty() || extra->size() == size_t(schedule.stages),
               "validate: per-stage extra costs need one entry per stage (", schedule.stages,
               "), got ", extra->size());
    for (double x : *extra) LOOM_CHECK(x >= 0, "validate: costs must be >= 0");
  }
  return Simulator(schedule, cost).run();
}

}  // namespace loom::parallel::pipeline
