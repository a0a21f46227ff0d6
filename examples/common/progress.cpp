#include "common/progress.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace loom::cli {

std::string format_duration(double seconds) {
  // An ETA of a run with --steps near 2^63 is astronomically long: say so rather than convert it
  // to an integer that cannot hold it.
  if (!(seconds >= 0)) seconds = 0;
  if (seconds >= 3600.0 * 1e6) return ">1000000h";
  const int64_t s = int64_t(seconds);
  char buf[48];
  if (seconds < 60) {
    std::snprintf(buf, sizeof buf, "%.1fs", seconds);
  } else if (seconds < 3600) {
    std::snprintf(buf, sizeof buf, "%" PRId64 "m%02" PRId64 "s", s / 60, s % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%" PRId64 "h%02" PRId64 "m", s / 3600, (s / 60) % 60);
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
    metrics_fd_ = ::open(metrics_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    LOOM_CHECK(metrics_fd_ >= 0, "--metrics-file: cannot open '", metrics_file,
               "' for writing: ", std::strerror(errno));
    metrics_path_ = metrics_file;
    if (!kept.empty()) write_row(kept, first_step);
  }
}

Progress::~Progress() {
  if (metrics_fd_ >= 0) ::close(metrics_fd_);
}

void Progress::write_row(const std::string& row, int64_t step) {
  size_t done = 0;
  while (done < row.size()) {
    const ssize_t n = ::write(metrics_fd_, row.data() + done, row.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      // Keep the file a sequence of whole rows: drop the part of this one that was written.
      if (::ftruncate(metrics_fd_, off_t(metrics_bytes_)) == 0)
        ::lseek(metrics_fd_, off_t(metrics_bytes_), SEEK_SET);
      LOOM_FAIL("--metrics-file '", metrics_path_, "': cannot write the row of step ", step, " (",
                metrics_rows_, " rows written before it): ", std::strerror(err));
    }
    done += size_t(n);
  }
  metrics_bytes_ += row.size();
  metrics_rows_ += int64_t(std::count(row.begin(), row.end(), '\n'));
}

void Progress::step(const StepMetrics& m) {
  const double eta =
      m.step > first_ ? m.elapsed_s / double(m.step - first_) * double(total_ - m.step) : 0.0;
  char grad[32] = "";
  if (m.grad_norm >= 0) std::snprintf(grad, sizeof grad, " | norm %.3f", m.grad_norm);
  char mfu[32] = "";
  if (m.mfu >= 0) std::snprintf(mfu, sizeof mfu, " | mfu %.1f%%", m.mfu * 100.0);
  char fixed[288];
  std::snprintf(fixed, sizeof fixed,
                "step %" PRId64 "/%" PRId64
                " | loss %.6f | lr %.3e%s | %.0f %s%s | %.1f ms | "
                "elapsed %s | eta %s",
                m.step, total_, m.loss, m.lr, grad, m.tokens_per_s, rate_unit_.c_str(), mfu,
                m.step_ms, format_duration(m.elapsed_s).c_str(), format_duration(eta).c_str());
  const std::string line_text =
      m.line_extra.empty() ? std::string(fixed) : std::string(fixed) + " | " + m.line_extra;
  const char* line = line_text.c_str();
  if (terminal_) {
    std::printf("\r\033[K%s", line);
    line_open_ = true;
    if (m.step == total_ || m.step % 50 == 0) flush_line();
  } else {
    std::printf("%s\n", line);
  }
  std::fflush(stdout);
  if (metrics_fd_ >= 0) {
    nlohmann::json j = {{"step", m.step},
                        {"loss", m.loss},
                        {"lr", m.lr},
                        {"tokens_per_s", m.tokens_per_s},
                        {"elapsed_s", m.elapsed_s},
                        {"step_ms", m.step_ms}};
    if (m.grad_norm >= 0) j["grad_norm"] = m.grad_norm;
    if (m.comm_wait_ms >= 0) j["comm_wait_ms"] = m.comm_wait_ms;
    if (m.comm_wait_least_ms >= 0) j["comm_wait_least_ms"] = m.comm_wait_least_ms;
    if (m.mfu >= 0) j["mfu"] = m.mfu;
    if (!m.metrics_extra.empty()) j.update(nlohmann::json::parse(m.metrics_extra));
    write_row(j.dump() + "\n", m.step);
  }
}

void Progress::event(int64_t step, const std::string& kind,
                     const std::map<std::string, double>& values) {
  flush_line();
  std::printf("%s at step %" PRId64, kind.c_str(), step);
  for (const auto& [k, v] : values) std::printf(" | %s %.6g", k.c_str(), v);
  std::printf("\n");
  std::fflush(stdout);
  if (metrics_fd_ >= 0) {
    nlohmann::json j = {{"step", step}, {"event", kind}};
    for (const auto& [k, v] : values) j[k] = v;
    write_row(j.dump() + "\n", step);
  }
}

void Progress::flush_line() {
  if (line_open_) {
    std::printf("\n");
    line_open_ = false;
  }
}

}  // namespace loom::cli
