#include "core/allocator.h"

#include <malloc.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

#include "core/caching_allocator.h"
#include "core/error.h"
#include "kernels/cuda/runtime.h"

namespace loom {

void* Allocator::allocate(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  void* p = raw_allocate(nbytes);
  size_t live = live_.fetch_add(nbytes) + nbytes;
  size_t peak = peak_.load();
  while (live > peak && !peak_.compare_exchange_weak(peak, live)) {
  }
  return p;
}

void Allocator::deallocate(void* ptr, size_t nbytes) {
  if (ptr == nullptr) return;
  raw_deallocate(ptr, nbytes);
  live_.fetch_sub(nbytes);
}

namespace {

// 64-byte aligned host memory: a cache line, and enough for any vector load.
//
// A training step frees and reallocates the same large activation and gradient buffers every
// step. glibc serves large blocks with mmap and gives them back on free, so each step would
// page-fault every buffer in again (measured: half of cross-entropy's time at GPT-2 vocab). Raising
// the mmap and trim thresholds keeps freed blocks in the heap for reuse; the process's footprint
// stays at its peak, as with PyTorch's caching allocators.
class CpuAllocator final : public Allocator {
 public:
  CpuAllocator() {
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }

 protected:
  void* raw_allocate(size_t nbytes) override {
    size_t rounded = (nbytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    LOOM_CHECK(p != nullptr, "cpu allocator: out of memory allocating ", nbytes, " bytes");
    return p;
  }
  void raw_deallocate(void* ptr, size_t) override { std::free(ptr); }
};

// Device memory for the caching allocator (Note [Caching allocator]).
class CudaBlockSource final : public BlockSource {
 public:
  explicit CudaBlockSource(int device) : device_(device) {}
  void* allocate(size_t nbytes) override { return cuda_rt::try_malloc_device(device_, nbytes); }
  void free(void* ptr) override { cuda_rt::free_device(device_, ptr); }
  size_t free_bytes() override { return cuda_rt::device_free_bytes(device_); }
  std::string name() const override { return Device::cuda(device_).str(); }

 private:
  int device_;
};

}  // namespace

// Never destroyed (leaked on purpose, so not function-local statics with destructors): tensors
// are still freed during exit, e.g. the buffers of abandoned MPI operations in the MPI backend's
// exit handler, which can run after the destructors of statics constructed later than the
// handler was registered.
Allocator& allocator_for(Device device) {
  static auto* cpu = new CpuAllocator();
  if (device.is_cpu()) return *cpu;
  static std::mutex mu;
  static auto* cuda = new std::vector<std::unique_ptr<CachingAllocator>>();
  std::lock_guard<std::mutex> lock(mu);
  LOOM_CHECK(device.index >= 0 && device.index < 1024, "allocator: bad device ", device.str());
  if (cuda->size() <= size_t(device.index)) cuda->resize(device.index + 1);
  auto& slot = (*cuda)[device.index];
  if (!slot)
    slot = std::make_unique<CachingAllocator>(std::make_unique<CudaBlockSource>(device.index));
  return *slot;
}

}  // namespace loom
