// `loom-ckpt check`: whether a checkpoint loads into a layout, worked out before launching it.
// Every rank of the target layout is planned in this process from the manifest alone, exactly as
// that rank's resume would plan it (gpt::planned_load builds the modules the rank holds over
// planning groups; checkpoint::plan_load finds the chunks), so the check proves that
//   - each rank finds every element it loads in exactly one stored piece, and
//   - the ranks together load every element of every tensor the resume needs,
// and gives the bytes each rank reads. Nothing is read but the manifest.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/io/checkpoint_manifest.h"
#include "gpt/gpt_options.h"

namespace loom::ckpt {

struct RankRead {
  int rank = 0;
  int pp = 0, dp = 0, tp = 0;  // its place in the mesh
  size_t tensors = 0;          // distinct tensors it loads from
  size_t pieces = 0;           // stored pieces it reads from
  size_t files = 0;            // data files it opens
  uint64_t elements = 0;       // it loads
  uint64_t bytes = 0;          // it reads (whole checksum chunks)
  // What it reads when ZeRO's parameters are read whole, from the page cache (Note [ZeRO's
  // parameters read whole when cached]); `bytes` where the layout never reads so.
  uint64_t whole_bytes = 0;
};

struct LayoutCheck {
  std::vector<RankRead> ranks;
  size_t tensors = 0;          // of the checkpoint the layout loads, each element at least once
  uint64_t elements = 0;       // of those tensors
  uint64_t element_loads = 0;  // over all ranks: elements * replication
  std::vector<std::string> unused;  // checkpoint tensors the layout does not load (see why())
  uint64_t bytes() const;
  uint64_t max_bytes() const;
  uint64_t whole_bytes() const;  // the same, with ZeRO's parameters read whole
  uint64_t max_whole_bytes() const;
};

// Plans every rank of the layout in `o` against the checkpoint (a loom-gpt one). Throws naming
// the rank and the reason when the layout cannot hold the model or a rank would find an element
// in no stored piece or in two, and naming the tensor when the ranks together leave elements of
// a needed tensor unloaded.
LayoutCheck check_layout(const std::string& path, const io::CheckpointManifest& manifest,
                         const gpt::GptOptions& o);

}  // namespace loom::ckpt
