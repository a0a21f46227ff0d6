// The keys and values a GPT has already computed, so that generating one more token runs the
// model on that token alone (attention reads the cached keys and values of every earlier
// position) instead of on the whole sequence again.
//
// Per block, keys and values [capacity, B, H, D] in the model's dtype and device, allocated on the
// first forward_cached and written position by position; length() positions are filled.
// Positions come first so that the block a step writes is one contiguous copy (a strided write
// would scatter element by element); attention reads the filled prefix as [B, H, length, D]
// through transposed views. A GPT's learned positions stop at max_seq_len, so capacity is that,
// and a sequence that outgrows it is cut to its last max_seq_len tokens and run again from an
// empty cache (See generate.h).
#pragma once

#include <cstdint>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace loom::nn {

class KvCache {
 public:
  struct Layer {
    Tensor keys, values;  // [capacity, B, H, D]; undefined until the first forward_cached
    int64_t capacity = 0;
  };

  KvCache(int64_t layers, int64_t capacity) {
    LOOM_CHECK(layers > 0 && capacity > 0, "KvCache: layers (", layers, ") and capacity (",
               capacity, ") must be positive");
    layers_.resize(size_t(layers));
    for (Layer& l : layers_) l.capacity = capacity;
  }

  int64_t length() const { return length_; }
  int64_t capacity() const { return layers_.front().capacity; }
  size_t layers() const { return layers_.size(); }
  Layer& layer(size_t i) { return layers_.at(i); }
  // Forgets every position (the buffers stay allocated for the next prompt).
  void reset() { length_ = 0; }
  // Called by the model once every block has written `n` more positions.
  void advance(int64_t n) {
    LOOM_CHECK(n >= 0 && length_ + n <= capacity(), "KvCache: ", length_, " + ", n,
               " positions exceed the capacity ", capacity());
    length_ += n;
  }

 private:
  std::vector<Layer> layers_;  // each knows the capacity, for the attention that fills it
  int64_t length_ = 0;
};

}  // namespace loom::nn
