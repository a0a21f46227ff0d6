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

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
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

// The step directory `latest` names in `dir`, or when it is missing or names a checkpoint that
// is not committed, the committed step directory with the highest step; "" when `dir` holds
// none.
std::string latest_checkpoint(const std::string& dir);
// Whether `dir` holds a committed checkpoint of step `step`.
bool has_checkpoint(const std::string& dir, int64_t step);
// Reads a committed checkpoint's manifest (a step directory; latest_checkpoint finds one in a
// root). Throws naming the directory when it has no committed manifest.
io::CheckpointManifest read_manifest(const std::string& path);

// Fills every piece from the checkpoint: checks each against the manifest (known tensor, same
// global shape), reads the chunks of the files that hold its elements, verifies their checksums
// and copies. Errors name the file, the tensor and this rank: a missing or truncated file, a
// checksum mismatch, an element that no stored piece holds or that two hold. Collective over
// `group` only in that every rank learns whether all succeeded: a failure on one rank is raised on
// all, naming it.
void load(const std::string& path, const io::CheckpointManifest& manifest,
          const std::vector<StatePiece>& pieces, comm::Communicator& group);

// Reads every chunk of every file of the checkpoint and checks its checksum and the file sizes.
// Throws naming the first damaged file and tensor. Local.
void verify(const std::string& path, const io::CheckpointManifest& manifest);

}  // namespace loom::parallel::checkpoint
