// The caching rules of core/caching_allocator.h on a fake block source (host memory with a byte
// budget), so they are checked without a GPU: reuse after free, the size rounding and the waste
// bound, the out-of-memory retry after emptying the cache, the error's contents, and that a warm
// loop stops asking the source for memory.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "core/allocator.h"
#include "core/caching_allocator.h"
#include "core/error.h"

namespace loom {
namespace {

// Host blocks up to a budget; counts calls and remembers what is outstanding.
struct FakeSource final : BlockSource {
  size_t budget = size_t(1) << 30;
  size_t used = 0;
  int allocs = 0, frees = 0;
  std::set<void*> outstanding;
  std::vector<size_t> sizes;

  void* allocate(size_t nbytes) override {
    if (used + nbytes > budget) return nullptr;
    void* p = std::malloc(nbytes);
    used += nbytes;
    ++allocs;
    sizes.push_back(nbytes);
    outstanding.insert(p);
    sizes_of[p] = nbytes;
    return p;
  }
  void free(void* p) override {
    EXPECT_EQ(outstanding.erase(p), 1u) << "freed a block twice or one it never gave";
    used -= sizes_of[p];
    ++frees;
    std::free(p);
  }
  size_t free_bytes() override { return budget - used; }
  std::string name() const override { return "fake:0"; }
  std::map<void*, size_t> sizes_of;
};

struct Fixture {
  FakeSource* source = new FakeSource;
  CachingAllocator alloc{std::unique_ptr<BlockSource>(source)};
};

TEST(CachingAllocator, RoundsSmallTo512AndLargeTo128KiB) {
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(512), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::round_size((1 << 20) - 1), size_t(1) << 20);
  EXPECT_EQ(CachingAllocator::round_size((1 << 20) + 1), (size_t(1) << 20) + (128 << 10));
}

TEST(CachingAllocator, FreedBlockIsReusedWithoutAskingTheSource) {
  Fixture f;
  void* a = f.alloc.allocate(1000);
  f.alloc.deallocate(a, 1000);
  EXPECT_EQ(f.alloc.cached_bytes(), 1024u);
  void* b = f.alloc.allocate(1000);
  EXPECT_EQ(a, b);
  EXPECT_EQ(f.source->allocs, 1);
  EXPECT_EQ(f.alloc.cached_bytes(), 0u);
  EXPECT_EQ(f.alloc.live_bytes(), 1000u);
  EXPECT_EQ(f.alloc.reserved_bytes(), 1024u);
  f.alloc.deallocate(b, 1000);
}

TEST(CachingAllocator, DoesNotHandOutABlockWastingMoreThanAQuarter) {
  Fixture f;
  const size_t big = size_t(8) << 20, small = size_t(2) << 20;
  void* a = f.alloc.allocate(big);
  f.alloc.deallocate(a, big);
  void* b = f.alloc.allocate(small);  // 8 MiB for 2 MiB would waste 6 MiB
  EXPECT_NE(a, b);
  EXPECT_EQ(f.source->allocs, 2);
  void* c = f.alloc.allocate(big - (512 << 10));  // within a quarter: reuses the 8 MiB block
  EXPECT_EQ(a, c);
  EXPECT_EQ(f.source->allocs, 2);
  f.alloc.deallocate(b, small);
  f.alloc.deallocate(c, big - (512 << 10));
}

TEST(CachingAllocator, AWarmLoopStopsAllocatingFromTheSource) {
  Fixture f;
  const std::vector<size_t> step = {4096, 3 << 20, 777, 3 << 20, 10 << 20, 64};
  int64_t after_first = 0;
  for (int s = 0; s < 5; ++s) {
    std::vector<void*> held;
    for (size_t n : step) held.push_back(f.alloc.allocate(n));
    for (size_t i = 0; i < step.size(); ++i) f.alloc.deallocate(held[i], step[i]);
    if (s == 0) after_first = f.alloc.source_allocations();
  }
  EXPECT_EQ(f.alloc.source_allocations(), after_first);
  EXPECT_EQ(f.source->allocs, int(step.size()));
  EXPECT_EQ(f.alloc.live_bytes(), 0u);
}

TEST(CachingAllocator, OutOfMemoryEmptiesTheCacheAndRetries) {
  Fixture f;
  f.source->budget = size_t(10) << 20;
  void* a = f.alloc.allocate(size_t(6) << 20);
  f.alloc.deallocate(a, size_t(6) << 20);       // cached, holding 6 of the 10 MiB
  void* b = f.alloc.allocate(size_t(9) << 20);  // fits only once the cache is returned
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(f.source->frees, 1);
  EXPECT_EQ(f.alloc.cached_bytes(), 0u);
  f.alloc.deallocate(b, size_t(9) << 20);
}

TEST(CachingAllocator, OutOfMemoryNamesTheRequestAndTheFreeBytes) {
  Fixture f;
  f.source->budget = size_t(4) << 20;
  void* a = f.alloc.allocate(size_t(3) << 20);
  try {
    f.alloc.allocate(size_t(2) << 20);
    FAIL() << "expected an out-of-memory error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("fake:0 out of memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find("2097152 bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("1 MiB free"), std::string::npos) << msg;
    EXPECT_NE(msg.find("3 MiB in live tensors"), std::string::npos) << msg;
  }
  f.alloc.deallocate(a, size_t(3) << 20);
}

TEST(CachingAllocator, EmptyCacheReturnsOnlyFreeBlocks) {
  Fixture f;
  void* a = f.alloc.allocate(5000);
  void* b = f.alloc.allocate(7000);
  f.alloc.deallocate(a, 5000);
  f.alloc.empty_cache();
  EXPECT_EQ(f.source->frees, 1);
  EXPECT_EQ(f.alloc.cached_bytes(), 0u);
  EXPECT_EQ(f.alloc.reserved_bytes(), CachingAllocator::round_size(7000));
  f.alloc.deallocate(b, 7000);
}

TEST(CachingAllocator, FreeingAForeignPointerIsAnError) {
  Fixture f;
  int x = 0;
  EXPECT_THROW(f.alloc.deallocate(&x, 4), Error);
}

TEST(CachingAllocator, HostAllocatorReportsNoCache) {
  Allocator& cpu = allocator_for(Device::cpu());
  EXPECT_EQ(cpu.cached_bytes(), 0u);
  EXPECT_EQ(cpu.source_allocations(), -1);
  cpu.empty_cache();  // a no-op, not an error
}

}  // namespace
}  // namespace loom
