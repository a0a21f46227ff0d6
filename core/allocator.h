// One Allocator per device, with live and peak byte counters. Tests assert memory use with the
// counters (ZeRO's savings are shown with them), so every tensor byte goes through here.
#pragma once

#include <atomic>
#include <cstddef>

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
