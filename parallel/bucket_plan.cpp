#include "parallel/bucket_plan.h"

#include <algorithm>
#include <cstdint>

namespace loom::parallel {

BucketPlan::BucketPlan(const std::vector<Tensor>& params, size_t bucket_bytes, int64_t pad_to)
    : where_(params.size()), pad_to_(pad_to) {
  LOOM_CHECK(bucket_bytes > 0, "BucketPlan: bucket size must be positive");
  LOOM_CHECK(pad_to > 0, "BucketPlan: pad_to must be positive, got ", pad_to);
  Bucket current;
  size_t current_bytes = 0;
  for (size_t k = params.size(); k-- > 0;) {
    const Tensor& p = params[k];
    LOOM_CHECK(p.defined(), "BucketPlan: parameter ", k, " is undefined");
    const size_t bytes = p.nbytes();
    if (!current.slots.empty() && current_bytes + bytes > bucket_bytes) {
      add_bucket(std::move(current));
      current = Bucket();
      current_bytes = 0;
    }
    current.slots.push_back(BucketSlot{k, current.numel, p.numel()});
    current.numel += p.numel();
    current_bytes += bytes;
  }
  if (!current.slots.empty()) add_bucket(std::move(current));
}

BucketPlan::BucketPlan(const std::vector<Tensor>& params,
                       const std::vector<std::vector<size_t>>& groups, int64_t pad_to)
    : where_(params.size(), {SIZE_MAX, 0}), pad_to_(pad_to) {
  LOOM_CHECK(pad_to > 0, "BucketPlan: pad_to must be positive, got ", pad_to);
  for (const std::vector<size_t>& group : groups) {
    LOOM_CHECK(!group.empty(), "BucketPlan: an empty parameter group");
    Bucket bucket;
    for (size_t k : group) {
      LOOM_CHECK(k < params.size(), "BucketPlan: parameter index ", k, " out of range (",
                 params.size(), " parameters)");
      LOOM_CHECK(params[k].defined(), "BucketPlan: parameter ", k, " is undefined");
      LOOM_CHECK(where_[k].first == SIZE_MAX, "BucketPlan: parameter ", k, " is in two groups");
      where_[k].first = 0;  // claimed; add_bucket sets the real place
      bucket.slots.push_back(BucketSlot{k, bucket.numel, params[k].numel()});
      bucket.numel += params[k].numel();
    }
    add_bucket(std::move(bucket));
  }
  for (size_t k = 0; k < params.size(); ++k)
    LOOM_CHECK(where_[k].first != SIZE_MAX, "BucketPlan: parameter ", k, " is in no group");
}

// Pads `bucket` so it splits into pad_to equal shards and records where its parameters sit.
void BucketPlan::add_bucket(Bucket bucket) {
  bucket.padded = (bucket.numel + pad_to_ - 1) / pad_to_ * pad_to_;
  if (bucket.padded == 0) bucket.padded = pad_to_;  // every bucket has a shard on each rank
  for (size_t s = 0; s < bucket.slots.size(); ++s)
    where_[bucket.slots[s].param] = {buckets_.size(), s};
  buckets_.push_back(std::move(bucket));
}

const BucketSlot& BucketPlan::slot_of(size_t param) const {
  const auto& [b, s] = where_.at(param);
  return buckets_[b].slots[s];
}

std::vector<ShardPiece> BucketPlan::shard_pieces(int shard) const {
  LOOM_CHECK(shard >= 0 && shard < pad_to_, "BucketPlan::shard_pieces: shard ", shard,
             " outside [0, ", pad_to_, ")");
  std::vector<ShardPiece> pieces;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const int64_t size = shard_numel(b);
    const int64_t lo = shard * size, hi = lo + size;
    for (const BucketSlot& s : buckets_[b].slots) {
      const int64_t a = std::max(lo, s.offset), e = std::min(hi, s.offset + s.numel);
      if (a < e) pieces.push_back(ShardPiece{b, s.param, a - s.offset, a - lo, e - a});
    }
  }
  return pieces;
}

std::vector<std::vector<size_t>> bucket_groups_by_unit(const std::vector<Tensor>& params,
                                                       const std::vector<int>& unit_of,
                                                       size_t bucket_bytes) {
  LOOM_CHECK(bucket_bytes > 0, "BucketPlan: bucket size must be positive");
  LOOM_CHECK(unit_of.size() == params.size(), "BucketPlan: ", unit_of.size(), " units for ",
             params.size(), " parameters");
  std::vector<int> units(unit_of.begin(), unit_of.end());
  std::sort(units.begin(), units.end(),
            [](int a, int b) { return (a < 0) != (b < 0) ? b < 0 : a < b; });
  units.erase(std::unique(units.begin(), units.end()), units.end());
  std::vector<std::vector<size_t>> groups;
  for (int unit : units) {
    LOOM_CHECK(unit >= -1, "BucketPlan: unit ", unit, " (units are >= 0, or -1)");
    std::vector<size_t> current;
    size_t current_bytes = 0;
    for (size_t k = params.size(); k-- > 0;) {
      if (unit_of[k] != unit) continue;
      LOOM_CHECK(params[k].defined(), "BucketPlan: parameter ", k, " is undefined");
      const size_t bytes = params[k].nbytes();
      if (!current.empty() && current_bytes + bytes > bucket_bytes) {
        groups.push_back(std::move(current));
        current.clear();
        current_bytes = 0;
      }
      current.push_back(k);
      current_bytes += bytes;
    }
    if (!current.empty()) groups.push_back(std::move(current));
  }
  return groups;
}

int64_t BucketPlan::total_padded() const {
  int64_t total = 0;
  for (const Bucket& b : buckets_) total += b.padded;
  return total;
}

}  // namespace loom::parallel
