#include "planner/search.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>

namespace loom::planner {

namespace {

std::vector<int> divisors(int64_t n, int64_t at_most) {
  std::vector<int> out;
  for (int64_t d = 1; d <= std::min(n, at_most); ++d)
    if (n % d == 0) out.push_back(int(d));
  return out;
}

// The expert-parallel degrees to try: 1 for a dense model, else every divisor of dp that divides
// the experts.
std::vector<int> expert_degrees(const TransformerShape& m, int dp) {
  if (!m.moe.enabled()) return {1};
  std::vector<int> out;
  for (int ep : divisors(dp, dp))
    if (m.moe.experts % ep == 0) out.push_back(ep);
  return out;
}

// The training state of the fullest rank, and the reserve: what any schedule needs at least.
bool state_overflows(const Workload& w, const Layout& l, const Cluster& c, const Execution& e) {
  for (int r : {0, l.pp - 1}) {
    const MemoryBreakdown mem = rank_memory(w, l, c, e, r, InFlight{});
    if (mem.total() - mem.activations > c.device.memory_bytes) return true;
  }
  return false;
}

struct Candidate {
  Layout layout;
  double bound = 0;
};

}  // namespace

SearchResult search(const Workload& w, const Cluster& c, const Execution& e,
                    const SearchOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  w.check();
  c.check();
  SearchResult res;
  res.fastest_oom.problem = "none";
  std::vector<Candidate> candidates;
  const TransformerShape& m = w.model;
  for (int tp : divisors(std::gcd<int64_t>(m.heads, c.gpus), c.gpus_per_node)) {
    for (int pp : divisors(c.gpus / tp, m.layers)) {
      if ((c.gpus / tp) % pp != 0) continue;
      const int dp = c.gpus / (tp * pp);
      for (int mb = 1; mb <= o.max_mb; mb *= 2) {
        if (w.global_batch % (int64_t(dp) * mb) != 0) continue;
        for (const std::string& schedule : o.schedules) {
          if (pp == 1 && schedule != "1f1b") continue;  // one stage: every schedule is 1f1b
          if (pp > 1 && !schedule_problem(e, schedule).empty()) continue;  // not the runtime's
          const int v_max = schedule == "interleaved" ? o.max_v : 1;
          for (int v = schedule == "interleaved" ? 2 : 1; v <= v_max; ++v) {
            for (int zero = 0; zero <= (dp > 1 ? 3 : 0); ++zero) {
              for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
                for (int sp = 0; sp <= (tp > 1 ? 1 : 0); ++sp) {
                  for (int ep : expert_degrees(m, dp)) {
                    Layout l;
                    l.dp = dp, l.tp = tp, l.pp = pp, l.v = v, l.mb = mb, l.schedule = schedule;
                    l.zero = zero, l.recompute = r, l.sp = sp == 1, l.ep = ep;
                    ++res.candidates;
                    if (!layout_problem(l, w, c).empty()) {
                      ++res.invalid;
                      continue;
                    }
                    if (o.unsupported && !o.unsupported(l).empty()) {
                      ++res.unsupported;
                      continue;
                    }
                    if (state_overflows(w, l, c, e)) {
                      ++res.oom;
                      res.any_oom = true;
                      continue;
                    }
                    candidates.push_back({l, step_lower_bound(w, l, c, e)});
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  std::sort(candidates.begin(), candidates.end(),
            [](const Candidate& a, const Candidate& b) { return a.bound < b.bound; });
  for (size_t i = 0; i < candidates.size(); ++i) {
    const Candidate& cand = candidates[i];
    if (int(res.ranked.size()) >= o.top && cand.bound >= res.ranked.back().step_s) {
      res.pruned += long(candidates.size() - i);
      break;
    }
    Prediction p = evaluate(w, cand.layout, c, e);
    ++res.simulated;
    if (p.oom) {
      ++res.oom;
      if (res.fastest_oom.problem == "none" || p.step_s < res.fastest_oom.step_s)
        res.fastest_oom = p;
      res.any_oom = true;
      continue;
    }
    auto at = std::upper_bound(
        res.ranked.begin(), res.ranked.end(), p,
        [](const Prediction& a, const Prediction& b) { return a.step_s < b.step_s; });
    res.ranked.insert(at, std::move(p));
    if (int(res.ranked.size()) > o.top) res.ranked.pop_back();
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return res;
}

std::string why_slower(const Prediction& best, const Prediction& other) {
  struct Part {
    const char* name;
    double delta;
  };
  const double bubble_best = best.bubble * best.pipeline_s;
  const double bubble_other = other.bubble * other.pipeline_s;
  const double busy_best = best.pipeline_s - bubble_best,
               busy_other = other.pipeline_s - bubble_other;
  const double rec_best = busy_best * best.actions.recompute /
                          std::max(1e-30, best.actions.forward + best.actions.backward);
  const double rec_other = busy_other * other.actions.recompute /
                           std::max(1e-30, other.actions.forward + other.actions.backward);
  const double dp_best = best.step.dp_exposed + best.step.tied_embedding;
  const double dp_other = other.step.dp_exposed + other.step.tied_embedding;
  std::vector<Part> parts = {
      {"pipeline bubble", bubble_other - bubble_best},
      {"data-parallel communication", dp_other - dp_best},
      {"recomputation", rec_other - rec_best},
      {"compute and tp communication", (busy_other - rec_other) - (busy_best - rec_best)},
      {"optimizer", other.step.optimizer - best.step.optimizer},
  };
  std::sort(parts.begin(), parts.end(),
            [](const Part& a, const Part& b) { return a.delta > b.delta; });
  char buf[256];
  std::snprintf(buf, sizeof buf, "+%.3f s: %s +%.3f s", other.step_s - best.step_s, parts[0].name,
                parts[0].delta);
  std::string out = buf;
  if (parts[1].delta > 0.1 * parts[0].delta) {
    std::snprintf(buf, sizeof buf, ", %s +%.3f s", parts[1].name, parts[1].delta);
    out += buf;
  }
  std::snprintf(buf, sizeof buf, " (bubble %.1f%% vs %.1f%%)", 100 * other.bubble,
                100 * best.bubble);
  return out + buf;
}

}  // namespace loom::planner
