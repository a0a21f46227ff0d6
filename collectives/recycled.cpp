#include "collectives/recycled.h"

#include <array>

namespace loom::comm::recycling {

// Note [Recycled blocks]
// A small collective makes three objects per call (its entry in the check queue, the Work the
// caller holds, its signature exchange) and frees them when the caller drops the Work. malloc and
// free were about 600 of the ~3,300 instructions loom spent beyond MPI's on a 1 KiB allreduce on
// two ranks (callgrind). Those objects come from here instead: each thread keeps up to kKept
// freed blocks per size class (multiples of 64 bytes up to 1 KiB) and hands them out again, a few
// instructions each. A block freed on another thread than the one that made it joins that thread's
// lists, which is safe: every block is plain operator new memory. When a thread ends its lists are
// freed, and later frees on it (statics destroyed at exit) go straight to operator delete. Under
// AddressSanitizer nothing is recycled, so a use after free is still caught.
namespace {

constexpr size_t kGranule = 64;
constexpr size_t kClasses = 16;  // blocks of 64 to 1024 bytes
constexpr int kKept = 16;        // per class and thread

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kRecycle = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kRecycle = false;
#else
constexpr bool kRecycle = true;
#endif
#else
constexpr bool kRecycle = true;
#endif

struct FreeBlock {
  FreeBlock* next;
};

// Trivially destructible, so valid until the thread's storage goes: frees made after the
// Closer below ran find `closed` set.
struct FreeLists {
  std::array<FreeBlock*, kClasses> head;
  std::array<int, kClasses> count;
  bool registered;
  bool closed;
};
thread_local FreeLists t_lists{};

struct Closer {
  bool armed = false;  // written once per thread, which constructs the thread's Closer
  ~Closer() {
    t_lists.closed = true;
    for (size_t c = 0; c < kClasses; ++c)
      while (FreeBlock* b = t_lists.head[c]) {
        t_lists.head[c] = b->next;
        ::operator delete(b);
      }
  }
};
thread_local Closer t_closer;

// The class of a block of `bytes`, or kClasses when it is too large to keep.
size_t class_of(size_t bytes) { return bytes == 0 ? 0 : (bytes - 1) / kGranule; }

}  // namespace

bool recycles() { return kRecycle; }

void* recycled_allocate(size_t bytes) {
  const size_t c = class_of(bytes);
  if (!kRecycle || c >= kClasses) return ::operator new(bytes);
  if (FreeBlock* b = t_lists.head[c]) {
    t_lists.head[c] = b->next;
    --t_lists.count[c];
    return b;
  }
  return ::operator new((c + 1) * kGranule);  // any request of the class fits it
}

void recycled_free(void* block, size_t bytes) noexcept {
  const size_t c = class_of(bytes);
  if (!kRecycle || c >= kClasses || t_lists.closed || t_lists.count[c] >= kKept) {
    ::operator delete(block);
    return;
  }
  if (!t_lists.registered) {  // the thread's first kept block: its Closer will free the lists
    t_lists.registered = true;
    t_closer.armed = true;
  }
  auto* b = static_cast<FreeBlock*>(block);
  b->next = t_lists.head[c];
  t_lists.head[c] = b;
  ++t_lists.count[c];
}

}  // namespace loom::comm::recycling
