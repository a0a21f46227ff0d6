#include "core/caching_allocator.h"

#include <utility>

#include "core/error.h"

namespace loom {

namespace {

constexpr size_t kSmallLimit = size_t(1) << 20;  // 1 MiB
constexpr size_t kSmallUnit = 512;
constexpr size_t kLargeUnit = size_t(128) << 10;  // 128 KiB

std::string mib(size_t bytes) { return detail::str_cat(double(bytes) / double(1 << 20), " MiB"); }

}  // namespace

CachingAllocator::CachingAllocator(std::unique_ptr<BlockSource> source)
    : source_(std::move(source)) {}

// The process-wide allocators are never destroyed (allocator_for); a test's own instance returns
// its blocks here. Blocks still in use are left to their owners' deallocate, which must not come.
CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cached_locked();
}

size_t CachingAllocator::round_size(size_t nbytes) {
  const size_t unit = nbytes < kSmallLimit ? kSmallUnit : kLargeUnit;
  return (nbytes + unit - 1) / unit * unit;
}

void* CachingAllocator::raw_allocate(size_t nbytes) {
  const size_t size = round_size(nbytes);
  std::lock_guard<std::mutex> lock(mutex_);
  // The smallest cached block that fits, if it wastes at most a quarter of the request.
  const size_t unit = size < kSmallLimit ? kSmallUnit : kLargeUnit;
  auto it = cached_.lower_bound(size);
  if (it != cached_.end() && it->first - size <= size / 4 + unit) {
    void* p = it->second;
    cached_bytes_ -= it->first;
    cached_.erase(it);
    return p;
  }
  void* p = source_->allocate(size);
  const size_t cached_before = cached_bytes_;
  if (p == nullptr && !cached_.empty()) {
    release_cached_locked();
    p = source_->allocate(size);
  }
  LOOM_CHECK(p != nullptr, source_->name(), " out of memory: tried to allocate ", nbytes,
             " bytes (", mib(nbytes), "); the device has ", mib(source_->free_bytes()),
             " free; loom holds ", mib(live_bytes()), " in live tensors, and returned its ",
             mib(cached_before), " of cached blocks before retrying");
  block_size_.emplace(p, size);
  reserved_ += size;
  ++source_allocations_;
  return p;
}

void CachingAllocator::raw_deallocate(void* ptr, size_t) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = block_size_.find(ptr);
  LOOM_CHECK(it != block_size_.end(), source_->name(),
             " allocator: freeing a pointer it did not allocate");
  cached_.emplace(it->second, ptr);
  cached_bytes_ += it->second;
}

void CachingAllocator::release_cached_locked() {
  for (const auto& [size, ptr] : cached_) {
    source_->free(ptr);
    block_size_.erase(ptr);
    reserved_ -= size;
  }
  cached_.clear();
  cached_bytes_ = 0;
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cached_locked();
}

size_t CachingAllocator::reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reserved_;
}

size_t CachingAllocator::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cached_bytes_;
}

int64_t CachingAllocator::source_allocations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return source_allocations_;
}

}  // namespace loom
