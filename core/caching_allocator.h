// A caching allocator: freed blocks are kept for reuse instead of returned to their source, so a
// training loop that frees and reallocates the same buffers every step stops calling the source
// (cudaMalloc / cudaFree) after its first step. Used for CUDA devices (allocator_for); the block
// source is an interface so the caching rules are tested on the host without a GPU.
//
// Note [Caching allocator]
// - Sizes are rounded up (512 bytes under 1 MiB, 128 KiB above) so that buffers whose sizes differ
//   by a few bytes share blocks.
// - A request takes the smallest cached block that fits, if that block wastes at most a quarter of
//   the request (plus one rounding unit); otherwise the source is asked for a new block. Blocks are
//   never split: a training step asks for the same sizes every step, so exact reuse is the common
//   case, and unsplit blocks keep the code small and fragmentation visible in reserved_bytes().
// - When the source is out of memory, every cached block is returned to it and the request is
//   tried once more; failing that, loom::Error names the device, the request, the source's free
//   bytes and what loom holds (live and cached).
// - Streams: loom runs every kernel of a device on its one compute stream, so a block freed on the
//   host and handed out again is used only by kernels queued after those that used it before.
//   Buffers a communication stream uses are held by their collective's Work until the compute
//   stream has waited for it (collectives/nccl_backend.cpp), so they are not freed early either.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/allocator.h"

namespace loom {

// Where a caching allocator's blocks come from.
class BlockSource {
 public:
  virtual ~BlockSource() = default;
  // A new block of nbytes, or nullptr when the source is out of memory (other failures throw).
  virtual void* allocate(size_t nbytes) = 0;
  virtual void free(void* ptr) = 0;
  // Bytes the source could still hand out, for the out-of-memory message.
  virtual size_t free_bytes() = 0;
  // Names the source in errors: "cuda:0".
  virtual std::string name() const = 0;
};

class CachingAllocator final : public Allocator {
 public:
  explicit CachingAllocator(std::unique_ptr<BlockSource> source);
  ~CachingAllocator() override;

  // Returns every cached (free) block to the source. Blocks in use are not touched.
  void empty_cache() override;
  // Bytes of blocks held from the source, in use or cached; and of the cached ones alone.
  size_t reserved_bytes() const override;
  size_t cached_bytes() const override;
  // How many blocks were ever taken from the source: constant over steps once a loop is warm.
  int64_t source_allocations() const override;

  static size_t round_size(size_t nbytes);

 protected:
  void* raw_allocate(size_t nbytes) override;
  void raw_deallocate(void* ptr, size_t nbytes) override;

 private:
  void release_cached_locked();

  std::unique_ptr<BlockSource> source_;
  mutable std::mutex mutex_;
  std::multimap<size_t, void*> cached_;           // free blocks by size
  std::unordered_map<void*, size_t> block_size_;  // every block held, in use or cached
  size_t reserved_ = 0;
  size_t cached_bytes_ = 0;
  int64_t source_allocations_ = 0;
};

}  // namespace loom
