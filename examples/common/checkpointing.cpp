// See common/checkpointing.h.
#include "common/checkpointing.h"

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <map>

#include "core/error.h"

namespace loom::cli {

void declare_checkpoint_flags(Flags& f) {
  f.add_string("checkpoint-dir", "",
               "save the whole training state (weights, optimizer, data position) here: "
               "DIR/step-N/, every --save-every steps and at the end; any layout can resume it");
  f.add_int("save-every", 0, "with --checkpoint-dir: save every N steps (0: only at the end)");
  f.add_int("keep-last", 0, "with --checkpoint-dir: keep the newest K checkpoints (0: keep all)");
  f.add_bool("async-save",
             "with --checkpoint-dir: snapshot the state into host memory and write it in the "
             "background while training goes on (one save in flight at a time)");
  f.add_bool("resume",
             "continue from the latest committed checkpoint in --checkpoint-dir (saved on any "
             "layout); start from step 0 when there is none yet");
  f.add_string("resume-from", "",
               "continue from this checkpoint (a DIR/step-N directory, saved on any layout)");
}

CheckpointOptions read_checkpoint_flags(const Flags& f, const std::string& program) {
  CheckpointOptions o;
  o.dir = f.get_string("checkpoint-dir");
  o.save_every = f.get_int("save-every");
  o.keep_last = f.get_int("keep-last");
  o.async_save = f.get_bool("async-save");
  o.resume = f.get_bool("resume");
  o.resume_from = f.get_string("resume-from");
  LOOM_CHECK(o.save_every >= 0, program, ": --save-every must be >= 0, got ", o.save_every);
  LOOM_CHECK(o.keep_last >= 0, program, ": --keep-last must be >= 0, got ", o.keep_last);
  for (const char* flag : {"save-every", "keep-last", "async-save", "resume"})
    LOOM_CHECK(!f.was_set(flag) || !o.dir.empty(), program, ": --", flag,
               " needs --checkpoint-dir");
  LOOM_CHECK(!(o.resume && !o.resume_from.empty()), program,
             ": give --resume (the latest in --checkpoint-dir) or --resume-from PATH, not both");
  return o;
}

std::optional<ResumePoint> find_resume_point(const CheckpointOptions& o) {
  std::string path = o.resume_from;
  if (o.resume) {
    path = parallel::checkpoint::latest_checkpoint(o.dir);
    // `latest` is written only after the checkpoint it names is committed: naming anything else
    // means damage (a deleted manifest or directory), never a fresh start.
    const std::string pointer = parallel::checkpoint::latest_pointer(o.dir);
    if (path.empty() && !pointer.empty())
      LOOM_FAIL("--resume: ", o.dir, "/latest names ", pointer,
                ", which is not a committed checkpoint (no manifest.json in it), and ", o.dir,
                " holds no other; resuming would silently start over. Restore it, --resume-from "
                "another checkpoint, or point --checkpoint-dir elsewhere to start a new run");
    if (path.empty()) {
      std::printf("checkpoint: none in %s yet; starting at step 0\n", o.dir.c_str());
      return std::nullopt;
    }
    const bool names_path =
        path.size() > pointer.size() &&
        path.compare(path.size() - pointer.size(), pointer.size(), pointer) == 0;
    if (!pointer.empty() && !names_path)
      std::printf(
          "checkpoint: %s/latest names %s, which is not a committed checkpoint; resuming from "
          "the newest one that is, %s\n",
          o.dir.c_str(), pointer.c_str(), path.c_str());
  }
  if (path.empty()) return std::nullopt;
  return ResumePoint{path, parallel::checkpoint::read_manifest(path)};
}

CheckpointSaver::CheckpointSaver(CheckpointOptions options,
                                 std::shared_ptr<comm::Communicator> group, int64_t first_step,
                                 Collect collect)
    : options_(std::move(options)), group_(group), collect_(std::move(collect)), async_(group) {
  if (!options_.dir.empty() && parallel::checkpoint::has_checkpoint(options_.dir, first_step))
    last_saved_ = first_step;
}

void CheckpointSaver::after_step(int64_t steps_done, Progress& progress) {
  if (async_.in_flight()) finish_background(progress, /*wait=*/false);
  if (!options_.dir.empty() && options_.save_every > 0 && steps_done % options_.save_every == 0)
    save(steps_done, progress);
}

void CheckpointSaver::at_end(int64_t steps_done, Progress& progress) {
  if (!options_.dir.empty() && last_saved_ != steps_done) save(steps_done, progress);
  finish_background(progress, /*wait=*/true);
}

void CheckpointSaver::save(int64_t steps_done, Progress& progress) {
  const auto start = std::chrono::steady_clock::now();
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  nlohmann::json state = nlohmann::json::object();
  const std::vector<parallel::checkpoint::StatePiece> pieces = collect_(state);
  parallel::checkpoint::SaveOptions so;
  so.keep_last = int(options_.keep_last);
  last_saved_ = steps_done;
  if (!options_.async_save) {
    const parallel::checkpoint::SaveResult r =
        parallel::checkpoint::save(options_.dir, steps_done, pieces, state, *group_, so);
    report(r, steps_done, progress, seconds());
    return;
  }
  finish_background(progress, /*wait=*/true);  // at most one save in flight
  async_.start(options_.dir, steps_done, pieces, state, so);
  saving_step_ = steps_done;
  progress.event(steps_done, "checkpoint_started",
                 {{"stall_s", seconds()}, {"snapshot_bytes", double(async_.snapshot_bytes())}});
}

void CheckpointSaver::finish_background(Progress& progress, bool wait) {
  const std::optional<parallel::checkpoint::SaveResult> r = wait ? async_.wait() : async_.poll();
  if (r) report(*r, saving_step_, progress, -1);
}

void CheckpointSaver::report(const parallel::checkpoint::SaveResult& r, int64_t step,
                             Progress& progress, double stall_s) {
  progress.flush_line();
  std::printf("checkpoint: saved step %" PRId64 " to %s (%.1f MB in %.2f s%s)\n", step,
              r.path.c_str(), double(r.total_bytes) / 1e6, r.seconds,
              stall_s < 0 ? ", in the background" : "");
  std::map<std::string, double> values{{"save_s", r.seconds}, {"bytes", double(r.total_bytes)}};
  if (stall_s >= 0) values["stall_s"] = stall_s;
  progress.event(step, "checkpoint", values);
}

}  // namespace loom::cli
