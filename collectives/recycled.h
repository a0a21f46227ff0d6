// Objects a collective makes and drops on every call, allocated from blocks this thread freed
// before. See Note [Recycled blocks] in recycled.cpp.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <utility>

namespace loom::comm {

namespace recycling {
void* recycled_allocate(size_t bytes);
void recycled_free(void* block, size_t bytes) noexcept;
// False under AddressSanitizer, where every block is a plain allocation.
bool recycles();
}  // namespace recycling

// An allocator for std::allocate_shared: the object and its control block in one recycled block.
template <typename T>
struct RecyclingAllocator {
  using value_type = T;
  static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__,
                "recycled blocks have operator new's alignment");

  RecyclingAllocator() = default;
  template <typename U>
  RecyclingAllocator(const RecyclingAllocator<U>&) {}  // NOLINT: rebinding is implicit

  T* allocate(size_t n) { return static_cast<T*>(recycling::recycled_allocate(n * sizeof(T))); }
  void deallocate(T* p, size_t n) noexcept { recycling::recycled_free(p, n * sizeof(T)); }

  template <typename U>
  bool operator==(const RecyclingAllocator<U>&) const {
    return true;
  }
};

// std::make_shared, from recycled blocks.
template <typename T, typename... Args>
std::shared_ptr<T> make_recycled(Args&&... args) {
  return std::allocate_shared<T>(RecyclingAllocator<T>(), std::forward<Args>(args)...);
}

}  // namespace loom::comm
