// Per-step progress output shared by loom's programs: one line per step (step, loss, lr,
// tokens/s, elapsed, ETA) on stdout, and optionally one JSON object per step in a metrics file
// (`--metrics-file`). On a terminal the line is redrawn in place and kept every `keep_every`
// steps; otherwise every step is a plain line, so logs stay greppable.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

namespace loom::cli {

struct StepMetrics {
  int64_t step = 0;  // 1-based
  double loss = 0;
  double lr = 0;
  double tokens_per_s = 0;  // samples per second: tokens for GPT, examples for DLRM
  double elapsed_s = 0;
  double step_ms = 0;
  double grad_norm = -1;     // < 0: not computed
  double comm_wait_ms = -1;  // < 0: no data-parallel reduction; else the time waited for it
  // The least of comm_wait_ms over the data-parallel ranks (< 0: not known): the wait of the rank
  // that finished its backward last, which no other rank's lateness lengthens.
  double comm_wait_least_ms = -1;
  double mfu = -1;  // < 0: not known (CPU, or a GPU without a peak); else a fraction
  // A program's own measures: appended to the line, and (a JSON object's text) merged into the
  // metrics record. Empty: none.
  std::string line_extra;
  std::string metrics_extra;
};

class Progress {
 public:
  // `rate_unit` names what tokens_per_s counts in the printed line ("tok/s", or "ex/s" for a
  // model whose samples are not tokens); the metrics file keeps the key tokens_per_s.
  // `first_step`: the steps already done (a resumed run). The metrics file then keeps its rows
  // up to that step, drops the later ones (the run that wrote them is being redone) and appends.
  Progress(int64_t total_steps, const std::string& metrics_file,
           const std::string& rate_unit = "tok/s", int64_t first_step = 0);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Prints the line for a finished step and appends its JSON record.
  void step(const StepMetrics& m);
  // A free-form record (e.g. an evaluation): printed as "key value" pairs and appended to the
  // metrics file as one JSON object with the step.
  void event(int64_t step, const std::string& kind, const std::map<std::string, double>& values);
  // Ends an in-place terminal line before other output.
  void flush_line();

 private:
  int64_t total_;
  int64_t first_;
  std::string rate_unit_;
  bool terminal_;
  bool line_open_ = false;
  // The metrics file (-1: none). Every row is written whole or not at all: a failed write (a full
  // disk) truncates the file back to its last complete row and raises naming the file, the row
  // and the system's reason.
  int metrics_fd_ = -1;
  std::string metrics_path_;
  uint64_t metrics_bytes_ = 0;  // complete rows so far
  int64_t metrics_rows_ = 0;
  void write_row(const std::string& row, int64_t step);  // one row, or a resumed run's kept rows
};

std::string format_duration(double seconds);  // "1m05s", "3.2s"

}  // namespace loom::cli
