// Where a rank's tensors sit in the global ones, and the copy between two pieces of one global
// tensor that were cut differently (See Note [Checkpoint regions] in
// core/io/checkpoint_manifest.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/io/checkpoint_manifest.h"
#include "core/nn/init.h"

namespace loom::parallel::checkpoint {

// A local tensor (flattened, row-major) as consecutive parts, each a region of the global tensor.
struct Placement {
  struct Part {
    io::Region region;
    int64_t local_offset = 0;  // the part's first element in the flattened local tensor
  };
  Shape global_shape;
  std::vector<Part> parts;  // in local order, covering the local tensor without gaps

  // A whole tensor.
  static Placement whole(const Shape& shape);
  // A tensor-parallel shard (nn::ShardSpec): one box, or one per block of a blocked view
  // (attention's q, k and v). Throws for a cut whose pieces are not contiguous in the local
  // tensor (no loom layer makes one).
  static Placement of_shard(const nn::ShardSpec& spec);
  // Elements [begin, begin + numel) of the flattened local tensor (a ZeRO piece), with offsets
  // relative to `begin`.
  Placement slice(int64_t begin, int64_t numel) const;
  int64_t numel() const;
};

// Calls fn(src_index, dst_index, n) for every run of elements that regions `src` and `dst` of the
// same global tensor share, n elements consecutive in both; indices count from each region's
// first element. Runs come in dst order and are maximal: no run continues the one before it in
// both regions (a region shared whole is one run).
void for_each_overlap(const Shape& global_shape, const io::Region& src, const io::Region& dst,
                      const std::function<void(int64_t, int64_t, int64_t)>& fn);

}  // namespace loom::parallel::checkpoint
