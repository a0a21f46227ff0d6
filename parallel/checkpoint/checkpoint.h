// Distributed checkpoints of a training state: every rank saves the pieces it holds, in parallel,
// and any layout loads them back, each rank reading only the chunks it needs.
//
//   <dir>/step-00000100/manifest.json           the commit point (See Note [Durable commit])
//   <dir>/step-00000100/rank-00003.safetensors  rank 3's pieces
//   <dir>/latest                                "step-00000100"
//
// A layout describes its state as StatePieces (parallel/checkpoint/training_state.h builds them
// for modules, optimizers and ZeRO); save and load know nothing else of it. Pieces that several
// ranks hold identically (a replicated parameter under data parallelism, a tied embedding) are
// split between them, so each element is written once and every rank writes a share.
//
//   auto pieces = ...;                                  // this rank's state
//   checkpoint::save(dir, step, pieces, state_json, *world, {.keep_last = 3});
//   ...
//   const std::string path = checkpoint::latest_checkpoint(dir);   // "" when there is none
//   const io::CheckpointManifest m = checkpoint::read_manifest(path);
//   checkpoint::load(path, m, pieces, *world);          // fills each piece's tensor
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "core/io/checkpoint_manifest.h"
#include "core/tensor.h"

namespace loom::parallel::checkpoint {

// One piece of a rank's training state.
struct StatePiece {
  std::string name;    // global tensor name: "model.wte.weight", "optim.wte.weight.exp_avg"
  Shape global_shape;  // of the whole tensor
  io::Region region;   // which of its elements this piece holds
  // region.numel() elements on any device, contiguous. Saving reads them (a snapshot: save
  // copies before it returns); loading writes them, converting floating dtypes if the stored
  // one differs.
  Tensor data;
};

struct SaveOptions {
  int keep_last = 0;                         // after the commit, keep this many (0: keep all)
  uint64_t chunk_bytes = uint64_t(1) << 20;  // checksum granularity, and of partial reads
};

struct SaveResult {
  std::string path;          // the committed step directory
  uint64_t bytes = 0;        // this rank's data file
  uint64_t total_bytes = 0;  // every file of the checkpoint
  double seconds = 0;        // on this rank, from the call to the commit
};

// Collective over `group` (every rank that holds state). Writes step `step` under `dir` with the
// two-phase commit of Note [Durable commit]. `state` is the run's non-tensor state; each rank
// passes its own and they are merged (objects key by key; a key two ranks give different values
// is an error naming it). A failure on any rank (a full disk, a bad directory) is raised on every
// rank naming the rank, the phase and the reason; the previous checkpoint stays as it was.
SaveResult save(const std::string& dir, int64_t step, const std::vector<StatePiece>& pieces,
                const nlohmann::json& state, comm::Communicator& group,
                const SaveOptions& options = {});

struct SaveJob;

// Asynchronous saves: start() snapshots the pieces into host memory (the only copy this class
// holds: at most one save is in flight, so its memory is bounded by one rank's state, reported by
// snapshot_bytes()) and writes this rank's file on a background thread while training goes on.
// The snapshot's buffers are kept for the next save (the same pieces fit them again), so a save
// after the first copies into memory that is already there rather than page-faulting fresh
// memory; they are freed with the saver.
// Everything collective stays on the calling thread, in start(), poll() and wait(), which every
// rank of `group` must call at the same points (MPI is initialised for one thread at a time):
//
//   AsyncCheckpointer saver(world);
//   for (step ...) {
//     train_step();
//     if (auto r = saver.poll()) report(*r);                 // committed once all ranks wrote
//     if (step % every == 0) stall = saver.start(dir, step, pieces(), state);
//   }
//   saver.wait();                                            // commit the last one
//
// A save that fails raises on every rank from the poll() or wait() that finishes it. Dropping
// the saver with a save in flight leaves it uncommitted (never loaded; the next save removes it).
class AsyncCheckpointer {
 public:
  explicit AsyncCheckpointer(std::shared_ptr<comm::Communicator> group);
  ~AsyncCheckpointer();
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  // Waits for a save still in flight (committing it), copies `pieces` into the snapshot (from
  // any device, with a few threads), then plans and starts writing it. The pieces may be the live
  // tensors (TrainingState::save_pieces gives views): training may change them once start()
  // returns. Returns the seconds the caller was held up (the stall). Collective.
  double start(const std::string& dir, int64_t step, const std::vector<StatePiece>& pieces,
               const nlohmann::json& state, const SaveOptions& options = {});
  // Commits the save in flight if every rank has written its file (one small allreduce); the
  // result when it did. Collective.
  std::optional<SaveResult> poll();
  // Waits for the save in flight and commits it. Collective.
  std::optional<SaveResult> wait();
  bool in_flight() const { return job_ != nullptr; }
  uint64_t snapshot_bytes() const { return snapshot_bytes_; }

 private:
  std::shared_ptr<comm::Communicator> group_;
  std::unique_ptr<SaveJob> job_;
  std::thread writer_;
  std::atomic<bool> done_{false};
  uint64_t snapshot_bytes_ = 0;
  std::vector<Tensor> buffers_;  // the snapshot's host memory, kept between saves
};

// The step directory `latest` names in `dir`, or when it is missing or names a checkpoint that
// is not committed, the committed step directory with the highest step; "" when `dir` holds
// none.
std::string latest_checkpoint(const std::string& dir);
// The name `latest` in `dir` holds ("step-00000042"), "" when there is no such file.
std::string latest_pointer(const std::string& dir);
// Whether `dir` holds a committed checkpoint of step `step`.
bool has_checkpoint(const std::string& dir, int64_t step);
// Reads a committed checkpoint's manifest (a step directory; latest_checkpoint finds one in a
// root). Throws naming the directory when it has no committed manifest.
io::CheckpointManifest read_manifest(const std::string& path);

// What a rank wants to load, without the memory to put it in: a StatePiece's name, global shape
// and region, and the dtype it will be held in.
struct PieceRequest {
  std::string name;
  Shape global_shape;
  io::Region region;
  DType dtype = DType::kF32;
};
std::vector<PieceRequest> requests_of(const std::vector<StatePiece>& pieces);

// How a rank's load reads a checkpoint: the stored pieces it draws on, and for each the runs of
// checksum chunks to read and the copies out of them into the requests.
struct ReadPlan {
  struct Copy {
    size_t request;                   // index into the requests
    int64_t src_index, dst_index, n;  // elements, from each region's first
  };
  struct Source {
    std::string tensor;
    size_t piece = 0;  // index into the tensor's stored pieces
    std::vector<Copy> copies;
    std::vector<std::pair<uint64_t, uint64_t>> chunk_runs;  // [first, last] chunks to read
    uint64_t bytes = 0;                                     // those chunks' bytes
  };
  // The bytes [begin, end) that chunks first..last of stored piece `sp` hold, counted from the
  // piece's first byte (the last chunk may be short).
  static std::pair<uint64_t, uint64_t> chunk_span(const io::StoredPiece& sp, uint64_t first,
                                                  uint64_t last);
  std::vector<Source> sources;

  uint64_t bytes() const;  // read in all
  std::map<std::string, uint64_t> bytes_per_file(const io::CheckpointManifest& manifest) const;
};

// Plans a load from the manifest alone (reads nothing, communicates nothing): checks every
// request against it (a known tensor, the same global shape, a dtype it converts to, every
// element stored exactly once) and finds the chunks that hold it. Throws naming the checkpoint,
// the tensor and the region for any of those. `loom-ckpt check` plans other layouts' loads so.
ReadPlan plan_load(const std::string& path, const io::CheckpointManifest& manifest,
                   const std::vector<PieceRequest>& requests);

struct LoadStats {
  uint64_t bytes_read = 0;  // on this rank
  double seconds = 0;
};

// Fills every piece from the checkpoint: plans (plan_load), reads the chunks of the files that
// hold its elements, verifies their checksums and copies. Errors name the file, the tensor and
// this rank: a missing or truncated file, a checksum mismatch, and plan_load's. Collective over
// `group` only in that every rank learns whether all succeeded: a failure on one rank is raised on
// all, naming it.
LoadStats load(const std::string& path, const io::CheckpointManifest& manifest,
               const std::vector<StatePiece>& pieces, comm::Communicator& group);

// Whether every byte a load of `pieces` would read from `path` sits in this machine's page cache
// now (parallel/checkpoint/page_cache.cpp). Reads nothing, communicates nothing; false where it
// cannot tell (a missing file, a plan load would refuse).
bool in_page_cache(const std::string& path, const io::CheckpointManifest& manifest,
                   const std::vector<StatePiece>& pieces);

// Reads every chunk of every file of the checkpoint and checks its checksum and the file sizes.
// Throws naming the first damaged file and tensor. Local.
void verify(const std::string& path, const io::CheckpointManifest& manifest);

}  // namespace loom::parallel::checkpoint
