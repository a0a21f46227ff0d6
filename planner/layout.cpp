#include "planner/layout.h"

#include <cstdlib>
#include <sstream>

#include "core/error.h"

namespace loom::planner {

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "?";
}

Recompute parse_recompute(const std::string& name) {
  if (name == "none") return Recompute::kNone;
  if (name == "selective") return Recompute::kSelective;
  if (name == "full") return Recompute::kFull;
  LOOM_FAIL("planner: recompute must be none, selective or full, got '", name, "'");
}

std::string Layout::str() const {
  std::ostringstream s;
  s << "dp=" << dp << ",tp=" << tp << ",pp=" << pp << ",v=" << v << ",mb=" << mb
    << ",schedule=" << schedule << ",zero=" << zero << ",recompute=" << recompute_name(recompute)
    << ",sp=" << (sp ? 1 : 0);
  if (ep > 1) s << ",ep=" << ep;
  return s.str();
}

namespace {

int parse_int(const std::string& key, const std::string& value) {
  char* end = nullptr;
  const long n = std::strtol(value.c_str(), &end, 10);
  LOOM_CHECK(!value.empty() && *end == '\0' && n >= 0 && n <= (1L << 30), "planner: layout field '",
             key, "' must be a non-negative integer, got '", value, "'");
  return int(n);
}

}  // namespace

double expert_load(const Workload& w, const Layout& l) {
  if (!w.model.moe.enabled()) return 1.0;
  return w.model.rank_expert_load(l.ep, int64_t(l.dp) * l.microbatches(w));
}

Layout parse_layout(const std::string& text, int gpus) {
  Layout l;
  bool dp_given = false;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    LOOM_CHECK(eq != std::string::npos, "planner: layout item '", item,
               "' is not key=value (e.g. dp=2,tp=4,pp=2,mb=1,schedule=1f1b)");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "dp") {
      l.dp = parse_int(key, value);
      dp_given = true;
    } else if (key == "tp") {
      l.tp = parse_int(key, value);
    } else if (key == "pp") {
      l.pp = parse_int(key, value);
    } else if (key == "v") {
      l.v = parse_int(key, value);
    } else if (key == "mb") {
      l.mb = parse_int(key, value);
    } else if (key == "schedule") {
      l.schedule = value;
    } else if (key == "zero") {
      l.zero = parse_int(key, value);
    } else if (key == "recompute") {
      l.recompute = parse_recompute(value);
    } else if (key == "sp") {
      LOOM_CHECK(value == "0" || value == "1", "planner: sp must be 0 or 1, got '", value, "'");
      l.sp = value == "1";
    } else if (key == "ep") {
      l.ep = parse_int(key, value);
    } else {
      LOOM_FAIL("planner: unknown layout key '", key,
                "' (keys: dp, tp, pp, v, mb, schedule, zero, recompute, sp, ep)");
    }
  }
  LOOM_CHECK(l.tp >= 1 && l.pp >= 1 && l.v >= 1 && l.mb >= 1 && l.ep >= 1,
             "planner: tp, pp, v, mb and ep must be at least 1 in '", text, "'");
  if (!dp_given) l.dp = gpus / (l.tp * l.pp);
  return l;
}

std::string layout_problem(const Layout& l, const Workload& w, const Cluster& c) {
  std::ostringstream why;
  const auto& m = w.model;
  if (l.dp < 1 || l.tp < 1 || l.pp < 1 || l.v < 1 || l.mb < 1 || l.ep < 1)
    why << "dp, tp, pp, v, mb and ep must be at least 1";
  else if (l.gpus() != c.gpus)
    why << "dp * tp * pp = " << l.gpus() << ", not the " << c.gpus << " GPUs";
  else if (m.heads % l.tp != 0)
    why << "tp " << l.tp << " does not divide the " << m.heads << " heads";
  else if (m.key_value_heads() % l.tp != 0)
    why << "tp " << l.tp << " does not divide the " << m.key_value_heads() << " key/value heads";
  else if (l.sp && l.tp == 1)
    why << "sequence parallelism needs tp > 1";
  else if (l.zero < 0 || l.zero > 3)
    why << "ZeRO stage " << l.zero << " is not 0-3";
  else if (l.schedule != "gpipe" && l.schedule != "1f1b" && l.schedule != "interleaved" &&
           l.schedule != "chimera")
    why << "unknown schedule '" << l.schedule << "' (gpipe, 1f1b, interleaved, chimera)";
  else if (l.v != 1 && l.schedule != "interleaved")
    why << "v " << l.v << " > 1 needs the interleaved schedule";
  else if (l.schedule == "interleaved" && (l.v < 2 || l.pp < 2))
    why << "interleaved needs pp >= 2 and v >= 2";
  else if (m.layers % (int64_t(l.pp) * l.v) != 0)
    why << "pp * v = " << l.pp * l.v << " does not divide the " << m.layers << " layers";
  else if (w.global_batch % (int64_t(l.dp) * l.mb) != 0)
    why << "dp * mb = " << l.dp * l.mb << " does not divide the global batch " << w.global_batch;
  else if (l.schedule == "interleaved" && l.microbatches(w) % l.pp != 0)
    why << "interleaved needs the " << l.microbatches(w) << " micro-batches divisible by pp "
        << l.pp;
  else if (l.schedule == "chimera" && (l.pp % 2 != 0 || l.microbatches(w) % 2 != 0))
    why << "chimera needs an even pp and an even micro-batch count";
  else if (l.ep > 1 && !m.moe.enabled())
    why << "ep " << l.ep << " needs a mixture-of-experts model";
  else if (l.dp % l.ep != 0 || (m.moe.enabled() && m.moe.experts % l.ep != 0))
    why << "ep " << l.ep << " must divide dp " << l.dp << " and the " << m.moe.experts
        << " experts";
  return why.str();
}

}  // namespace loom::planner
