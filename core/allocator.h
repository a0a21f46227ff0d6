// One Allocator per device, with live and peak byte counters. Tests assert memory use with the
// counters (ZeRO's savings are shown with them), so every tensor byte goes through here. CUDA
// devices get a caching allocator (core/caching_allocator.h): the cache queries below report it;
// for the host they report nothing cached (glibc keeps freed blocks: see allocator.cpp).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/device.h"

namespace loom {

class Allocator {
 public:
  virtual ~Allocator() = default;

  void* allocate(size_t nbytes);
  void deallocate(void* ptr, size_t nbytes);

  size_t live_bytes() const { return live_.load(); }
  size_t peak_bytes() const { return peak_.load(); }
  void reset_peak() { peak_.store(live_.load()); }

  // Returns cached free blocks to the system (torch.cuda.empty_cache); no-op without a cache.
  virtual void empty_cache() {}
  // Bytes held from the system (in use or cached), of those the cached ones, and how many blocks
  // were ever requested from the system. Without a cache: live bytes, 0, and -1 (not counted).
  virtual size_t reserved_bytes() const { return live_bytes(); }
  virtual size_t cached_bytes() const { return 0; }
  virtual int64_t source_allocations() const { return -1; }

 protected:
  virtual void* raw_allocate(size_t nbytes) = 0;
  virtual void raw_deallocate(void* ptr, size_t nbytes) = 0;

 private:
  std::atomic<size_t> live_{0};
  std::atomic<size_t> peak_{0};
};

// The process-wide allocator of a device (created on first use, never destroyed).
Allocator& allocator_for(Device device);

}  // namespace loom
