// Where each parameter sits in the flat buffers DDP and ZeRO reduce: parameters are taken in
// reverse registration order (the order backward produces their gradients, so the first bucket
// fills first) and packed into buckets of at most `bucket_bytes` (a parameter larger than that
// gets a bucket of its own). Each bucket is padded to a multiple of `pad_to` elements so it
// splits into equal shards, one per rank of the group (ZeRO); DDP pads to 1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace loom::parallel {

using NamedParams = std::vector<std::pair<std::string, Tensor>>;

struct BucketSlot {
  size_t param;    // index into the parameter list
  int64_t offset;  // first element in the bucket
  int64_t numel;
};

struct Bucket {
  std::vector<BucketSlot> slots;  // in the order their gradients are expected
  int64_t numel = 0;              // sum of the slots
  int64_t padded = 0;             // numel rounded up to pad_to
};

// The part of a parameter that falls in one rank's shard of a bucket: elements
// [param_offset, param_offset + numel) of the flattened parameter sit at [shard_offset, ...) of
// the shard.
struct ShardPiece {
  size_t bucket;
  size_t param;
  int64_t param_offset;
  int64_t shard_offset;
  int64_t numel;
};

class BucketPlan {
 public:
  // Throws for a non-positive bucket size or pad, or an f32 parameter list with holes.
  BucketPlan(const std::vector<Tensor>& params, size_t bucket_bytes, int64_t pad_to);
  // One bucket per group of parameter indices, in the order given (ZeRO-3: a bucket per
  // module). Every parameter must be in exactly one group; slots follow each group's order.
  BucketPlan(const std::vector<Tensor>& params, const std::vector<std::vector<size_t>>& groups,
             int64_t pad_to);

  const std::vector<Bucket>& buckets() const { return buckets_; }
  // bucket_of(param) and the slot within it.
  size_t bucket_of(size_t param) const { return where_[param].first; }
  const BucketSlot& slot_of(size_t param) const;
  int64_t pad_to() const { return pad_to_; }
  int64_t shard_numel(size_t bucket) const { return buckets_[bucket].padded / pad_to_; }
  // The pieces of shard `shard` (0 <= shard < pad_to) of every bucket, bucket by bucket.
  std::vector<ShardPiece> shard_pieces(int shard) const;
  int64_t total_padded() const;

 private:
  void add_bucket(Bucket bucket);

  std::vector<Bucket> buckets_;
  std::vector<std::pair<size_t, size_t>> where_;  // param -> (bucket, slot)
  int64_t pad_to_;
};

// Buckets that never span two units (a pipeline's chunks, which finish their backwards at
// different times): the units in ascending order, -1 last; within each, the unit's parameters in
// reverse registration order packed into buckets of at most `bucket_bytes` as BucketPlan packs
// them. unit_of[k] is parameter k's unit (>= -1). The groups for BucketPlan's second constructor.
std::vector<std::vector<size_t>> bucket_groups_by_unit(const std::vector<Tensor>& params,
                                                       const std::vector<int>& unit_of,
                                                       size_t bucket_bytes);

}  // namespace loom::parallel
