// Scratch vectors for the CPU kernels, 64-byte aligned like every tensor (core/allocator.cpp).
//
// Note [Aligned scratch]
// Eigen vectorises a reduction over a Map (sum, maxCoeff, a dot) from the first packet-aligned
// element: the elements before it are summed one by one, the rest in packets. A scratch row in a
// std::vector (malloc: 16-byte aligned, anywhere mod 64) therefore splits differently from one
// allocation to the next, and the sum's last bits with it: the same inputs gave different
// attention outputs depending on what the process had allocated before (found by
// examples/train_gpt.py against loom-gpt). Scratch the kernels reduce over lives in an
// AlignedVector, so its alignment, and the results, depend on the inputs alone.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>
#include <vector>

namespace loom::kernels::cpu {

template <typename T>
struct AlignedAllocator {
  using value_type = T;
  static constexpr std::size_t kAlignment = 64;

  AlignedAllocator() = default;
  template <typename U>
  AlignedAllocator(const AlignedAllocator<U>&) {}  // NOLINT: rebinding, as std::allocator

  T* allocate(std::size_t n) {
    // aligned_alloc needs a size that is a multiple of the alignment.
    const std::size_t bytes = (n * sizeof(T) + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, bytes == 0 ? kAlignment : bytes);
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t) { std::free(p); }

  template <typename U>
  bool operator==(const AlignedAllocator<U>&) const {
    return true;
  }
};

template <typename T>
using AlignedVector = std::vector<T, AlignedAllocator<T>>;

}  // namespace loom::kernels::cpu
