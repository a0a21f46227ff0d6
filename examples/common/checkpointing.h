// The checkpoint flags of loom's training programs (--checkpoint-dir, --save-every, --keep-last,
// --async-save, --resume, --resume-from) and what they do around a training loop: find the
// checkpoint to resume from, save every N steps and at the end, in place or in the background.
//
//   cli::declare_checkpoint_flags(flags);
//   const cli::CheckpointOptions co = cli::read_checkpoint_flags(flags, "loom-dlrm");
//   const std::optional<cli::ResumePoint> resume = cli::find_resume_point(co);  // may print
//   ... build the model; if (resume) load it and go on from resume->manifest.step ...
//   cli::CheckpointSaver saver(co, world, first_step, [&](nlohmann::json& state) { ... });
//   for (...) { ...; saver.after_step(steps_done, progress); }
//   saver.at_end(steps_done, progress);
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "common/flags.h"
#include "common/progress.h"
#include "core/io/checkpoint_manifest.h"
#include "parallel/checkpoint/checkpoint.h"

namespace loom::cli {

struct CheckpointOptions {
  std::string dir;  // --checkpoint-dir; empty: no checkpoints
  int64_t save_every = 0;
  int64_t keep_last = 0;
  bool async_save = false;
  bool resume = false;
  std::string resume_from;
};

// Declares the six flags on `flags`.
void declare_checkpoint_flags(Flags& flags);
// Reads and checks them (--save-every and --keep-last >= 0; --save-every, --keep-last,
// --async-save and --resume need --checkpoint-dir; --resume or --resume-from, not both). Errors
// start with "<program>: " and name the flag.
CheckpointOptions read_checkpoint_flags(const Flags& flags, const std::string& program);

struct ResumePoint {
  std::string path;  // the step directory
  io::CheckpointManifest manifest;
};

// The checkpoint --resume-from names, or with --resume the latest committed one in
// --checkpoint-dir; with --resume and none there yet, prints "checkpoint: none in DIR yet;
// starting at step 0" and returns nullopt (so one command line both starts and continues a run).
std::optional<ResumePoint> find_resume_point(const CheckpointOptions& o);

// Saves the training state with --checkpoint-dir: every --save-every steps and at the end of the
// run, printing "checkpoint: saved step N to PATH (X MB in Y s)" and recording a "checkpoint"
// event in the metrics (with "stall_s", what training waited). With --async-save the state is
// snapshotted and written in the background (parallel::checkpoint::AsyncCheckpointer): a
// "checkpoint_started" event has the stall and the snapshot's size, and the commit is reported
// at a later step. `collect` gives this rank's pieces (views of the live state suffice) and fills
// its part of the run state. Every call is collective over `group` when checkpoints are on, and
// does nothing otherwise.
class CheckpointSaver {
 public:
  using Collect = std::function<std::vector<parallel::checkpoint::StatePiece>(nlohmann::json&)>;
  CheckpointSaver(CheckpointOptions options, std::shared_ptr<comm::Communicator> group,
                  int64_t first_step, Collect collect);

  // After step `steps_done` (1-based count): saves when --save-every divides it.
  void after_step(int64_t steps_done, Progress& progress);
  // At the end: saves step `steps_done` unless it was just saved or the directory already holds
  // it (a resumed run that trained no further), and waits for a save in the background.
  void at_end(int64_t steps_done, Progress& progress);

 private:
  void save(int64_t steps_done, Progress& progress);
  void report(const parallel::checkpoint::SaveResult& r, int64_t step, Progress& progress,
              double stall_s);
  // Commits a background save once every rank has written it (or waits for it).
  void finish_background(Progress& progress, bool wait);

  CheckpointOptions options_;
  std::shared_ptr<comm::Communicator> group_;
  Collect collect_;
  int64_t last_saved_ = -1;
  parallel::checkpoint::AsyncCheckpointer async_;
  int64_t saving_step_ = -1;  // of the background save in flight
};

}  // namespace loom::cli
