#include "common/progress.h"

#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace loom::cli {

std::string format_duration(double seconds) {
  char buf[32];
  if (seconds < 60) {
    std::snprintf(buf, sizeof buf, "%.1fs", seconds);
  } else if (seconds < 3600) {
    std::snprintf(buf, sizeof buf, "%dm%02ds", int(seconds) / 60, int(seconds) % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%dh%02dm", int(seconds) / 3600, (int(seconds) / 60) % 60);
  }
  return buf;
}

Progress::Progress(int64_t total_steps, const std::string& metrics_file,
                   const std::string& rate_unit, int64_t first_step)
    : total_(total_steps),
      first_(first_step),
      rate_unit_(rate_unit),
      terminal_(isatty(STDOUT_FILENO) != 0) {
  if (!metrics_file.empty()) {
    std::string kept;  // a resumed run's rows up to its first step
    if (first_step > 0) {
      std::ifstream in(metrics_file);
      for (std::string line; std::getline(in, line);) {
        const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
            j["step"].get<int64_t>() <= first_step)
          kept += line + "\n";
      }
    }
    metrics_.open(metrics_file, std::ios::out | std::ios::trunc);
    metrics_ << kept;
    LOOM_CHECK(metrics_.good(), "--metrics-file: cannot open '", metrics_file, "' for writing");
  }
}

void Progress::step(const StepMetrics& m) {
  const double eta =
      m.step > first_ ? m.elapsed_s / double(m.step - first_) * double(total_ - m.step) : 0.0;
  char grad[32] = "";
  if (m.grad_norm >= 0) std::snprintf(grad, sizeof grad, " | norm %.3f", m.grad_norm);
  char mfu[32] = "";
  if (m.mfu >= 0) std::snprintf(mfu, sizeof mfu, " | mfu %.1f%%", m.mfu * 100.0);
  char line[288];
  std::snprintf(line, sizeof line,
                "step %" PRId64 "/%" PRId64
                " | loss %.6f | lr %.3e%s | %.0f %s%s | %.1f ms | "
                "elapsed %s | eta %s",
                m.step, total_, m.loss, m.lr, grad, m.tokens_per_s, rate_unit_.c_str(), mfu,
                m.step_ms, format_duration(m.elapsed_s).c_str(), format_duration(eta).c_str());
  if (terminal_) {
    std::printf("\r\033[K%s", line);
    line_open_ = true;
    if (m.step == total_ || m.step % 50 == 0) flush_line();
  } else {
    std::printf("%s\n", line);
  }
  std::fflush(stdout);
  if (metrics_.is_open()) {
    nlohmann::json j = {{"step", m.step},
                        {"loss", m.loss},
                        {"lr", m.lr},
                        {"tokens_per_s", m.tokens_per_s},
                        {"elapsed_s", m.elapsed_s},
                        {"step_ms", m.step_ms}};
    if (m.grad_norm >= 0) j["grad_norm"] = m.grad_norm;
    if (m.comm_wait_ms >= 0) j["comm_wait_ms"] = m.comm_wait_ms;
    if (m.mfu >= 0) j["mfu"] = m.mfu;
    metrics_ << j.dump() << "\n";
    metrics_.flush();
  }
}

void Progress::event(int64_t step, const std::string& kind,
                     const std::map<std::string, double>& values) {
  flush_line();
  std::printf("%s at step %" PRId64, kind.c_str(), step);
  for (const auto& [k, v] : values) std::printf(" | %s %.6g", k.c_str(), v);
  std::printf("\n");
  std::fflush(stdout);
  if (metrics_.is_open()) {
    nlohmann::json j = {{"step", step}, {"event", kind}};
    for (const auto& [k, v] : values) j[k] = v;
    metrics_ << j.dump() << "\n";
    metrics_.flush();
  }
}

void Progress::flush_line() {
  if (line_open_) {
    std::printf("\n");
    line_open_ = false;
  }
}

}  // namespace loom::cli
