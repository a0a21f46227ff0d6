#include "parallel/pipeline/trace.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "core/error.h"

namespace loom::parallel::pipeline {
namespace {

constexpr int kFields = 6;  // kind, microbatch, chunk, peer, start, end

const char* category(ActionKind k) {
  switch (k) {
    case ActionKind::kForward:
      return "forward";
    case ActionKind::kBackward:
      return "backward";
    case ActionKind::kWeightGrad:
      return "weight_grad";
    case ActionKind::kSendActivation:
    case ActionKind::kSendGrad:
      return "send";
    case ActionKind::kRecvActivation:
    case ActionKind::kRecvGrad:
      return "recv_wait";
    case ActionKind::kGradSync:
      return "grad_sync";
  }
  return "other";
}

bool is_compute(ActionKind k) {
  return k == ActionKind::kForward || k == ActionKind::kBackward || k == ActionKind::kWeightGrad;
}

}  // namespace

Timelines gather_timelines(const std::vector<TimedAction>& mine, comm::Communicator& group) {
  const int n = group.size();
  Tensor count = Tensor::full({1}, double(mine.size()), DType::kI64);
  Tensor counts = Tensor::empty({n}, DType::kI64);
  group.allgather(count, counts)->wait();
  const std::vector<int64_t> c = counts.to_vector<int64_t>();
  const int64_t most = *std::max_element(c.begin(), c.end());
  // Times travel as f32 microseconds since this rank's first span (exact enough within a step),
  // and each rank's origin as whole microseconds (i64), so the ranks line up on one clock.
  double origin = std::numeric_limits<double>::max();
  for (const TimedAction& t : mine) origin = std::min(origin, t.start);
  std::vector<float> packed(size_t(most * kFields), 0.0f);
  for (size_t i = 0; i < mine.size(); ++i) {
    const TimedAction& t = mine[i];
    float* f = &packed[i * kFields];
    f[0] = float(int(t.action.kind));
    f[1] = float(t.action.microbatch);
    f[2] = float(t.action.chunk);
    f[3] = float(t.action.peer);
    const double base_us = double(int64_t(origin * 1e6)) * 1e-6;  // what the i64 origin says
    f[4] = float((t.start - base_us) * 1e6);
    f[5] = float((t.end - base_us) * 1e6);
  }
  Tensor all = Tensor::empty({n * most * kFields});
  group.allgather(Tensor::from_vector(packed, {most * kFields}), all)->wait();
  // Each rank's origin, as whole microseconds in two i32 halves of an i64.
  Tensor mine_origin =
      Tensor::full({1}, mine.empty() ? 0.0 : double(int64_t(origin * 1e6)), DType::kI64);
  Tensor origins = Tensor::empty({n}, DType::kI64);
  group.allgather(mine_origin, origins)->wait();
  const std::vector<int64_t> o = origins.to_vector<int64_t>();
  int64_t base = std::numeric_limits<int64_t>::max();
  for (int r = 0; r < n; ++r)
    if (c[size_t(r)] > 0) base = std::min(base, o[size_t(r)]);
  const std::vector<float> v = all.to_vector<float>();
  Timelines out(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < c[size_t(r)]; ++i) {
      const float* f = &v[size_t((r * most + i) * kFields)];
      const double shift = double(o[size_t(r)] - base);
      Action a{ActionKind(int(f[0])), int(f[1]), int(f[2]), int(f[3])};
      out[size_t(r)].push_back(TimedAction{a, (shift + f[4]) * 1e-6, (shift + f[5]) * 1e-6});
    }
  return out;
}

std::vector<double> measured_bubbles(const Timelines& step) {
  double first = std::numeric_limits<double>::max(), last = std::numeric_limits<double>::lowest();
  for (const auto& rank : step)
    for (const TimedAction& t : rank)
      first = std::min(first, t.start), last = std::max(last, t.end);
  std::vector<double> out;
  for (const auto& rank : step) {
    double busy = 0;
    for (const TimedAction& t : rank)
      if (is_compute(t.action.kind)) busy += t.end - t.start;
    out.push_back(last > first ? 1.0 - busy / (last - first) : 0.0);
  }
  return out;
}

void ChromeTrace::add_step(int64_t step, const Timelines& timelines) {
  steps_.emplace_back(step, timelines);
}

std::string ChromeTrace::json() const {
  double origin = std::numeric_limits<double>::max();
  size_t ranks = 0;
  for (const auto& [step, t] : steps_) {
    ranks = std::max(ranks, t.size());
    for (const auto& rank : t)
      for (const TimedAction& a : rank) origin = std::min(origin, a.start);
  }
  std::string out = "{\"traceEvents\": [\n";
  char buf[320];
  bool first = true;
  auto emit = [&](const char* text) {
    if (!first) out += ",\n";
    out += text;
    first = false;
  };
  for (size_t r = 0; r < ranks; ++r) {
    std::snprintf(buf, sizeof buf,
                  "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %zu, "
                  "\"args\": {\"name\": \"pipeline rank %zu\"}}",
                  r, r);
    emit(buf);
  }
  for (const auto& [step, t] : steps_)
    for (size_t r = 0; r < t.size(); ++r)
      for (const TimedAction& a : t[r]) {
        std::snprintf(
            buf, sizeof buf,
            "{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": 0, \"tid\": %zu, "
            "\"ts\": %.3f, \"dur\": %.3f, \"args\": {\"step\": %lld}}",
            a.action.str().c_str(), category(a.action.kind), r, (a.start - origin) * 1e6,
            (a.end - a.start) * 1e6, (long long)step);
        emit(buf);
      }
  out += "\n], \"displayTimeUnit\": \"ms\"}\n";
  return out;
}

void ChromeTrace::write(const std::string& path) const {
  std::FILE* f = std::fopen(path.c_str(), "w");
  LOOM_CHECK(f != nullptr, "trace: cannot write ", path);
  const std::string text = json();
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  LOOM_CHECK(std::fclose(f) == 0 && ok, "trace: writing ", path, " failed");
}

}  // namespace loom::parallel::pipeline
