#include "collectives/shared_mailbox.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace loom::comm {

// Note [Mailboxes in shared memory]
// A small collective's time on one node is mostly the signature exchange's round trip (Note
// [Signature exchange], mpi_exchange.cpp), and Open MPI's shared-memory transport spends about
// twice what the memory needs on it: on a 2-vCPU Xeon VM two processes swapping 1 KiB through
// MPI_Irecv + MPI_Isend + MPI_Testall took 1.13-1.21 us, through a shared mapping with a flag per
// direction 0.59-0.62 us (4 KiB: 2.8-3.0 against 1.4-1.5 us; 3-5 runs of each, taken in turn). So a
// group whose ranks share a node runs its exchanges through mailboxes of its own, in one
// POSIX shared-memory segment its ranks map when the group is made.
//
// Each rank has one mailbox per round of the exchange: in round k it hears from one rank only,
// and sends to one rank only, in every exchange and both phases, so a mailbox is a
// single-producer, single-consumer queue and both sides can count its messages alike (a group's
// point-to-point messages use a segment of their own, one mailbox per sending rank: Note
// [Point-to-point through mailboxes], pair_channels.cpp). A mailbox is two counters on cache
// lines of their own (`posted`, written by the sender; `taken`, written by the receiver) and
// S message slots (the layout's `slots`); message m (counted from 1) goes to slot m % S. The
// sender copies message m into its slot once `taken` >= m - S (the receiver is done
// with the message that slot held), then stores `posted` = m with release order; the receiver
// sees `posted` >= m with acquire order, reads the message where it lies, and stores `taken` = m.
// Nothing blocks: a full mailbox makes the sender's poll return "not yet", and the exchange's
// wait keeps its deadline. The sender remembers the last `taken` it read, so it reads the
// receiver's line only when the slot may still be full (with two slots, about every other
// message).
//
// Two slots rather than one let a sender post its next exchange's message before the receiver
// has read the last one (one slot: 0.67-0.78 us per 1 KiB swap; two: 0.59-0.62). Every message
// fits: the channel's payload limit is the capacity, so no call, matching or not, sends more.
//
// The segment is reserved when it is made (posix_fallocate), so a full /dev/shm refuses the
// mailboxes then, and the group falls back to MPI's transport, instead of a SIGBUS on the first
// message. Its name is removed as soon as every rank has mapped it: nothing is left in /dev/shm
// by a job that dies later.

struct SharedMailboxes::Box {
  alignas(64) uint64_t posted;
  alignas(64) uint64_t taken;
  // The layout's slots of `capacity` bytes (rounded up to cache lines) follow.
};

namespace {

constexpr size_t kLine = 64;
constexpr size_t kHeader = kLine;  // the cookie, on a line of its own

size_t round_up(size_t bytes) { return (bytes + kLine - 1) / kLine * kLine; }

constexpr size_t kCounters = 2 * kLine;  // a Box: `posted` and `taken`, a line each

size_t box_stride(const MailboxLayout& layout) {
  return kCounters + size_t(layout.slots) * round_up(layout.capacity);
}

// The boxes one rank sends into or holds: every rank's, or its own.
size_t all_boxes(const MailboxLayout& layout) {
  return size_t(layout.ranks) * size_t(layout.boxes);
}

std::string errno_text(const char* what, const std::string& name, int err) {
  return std::string(what) + " " + name + ": " + std::strerror(err);
}

// Maps `fd` whole; null with `why` on failure.
void* map(int fd, size_t bytes, const std::string& name, std::string& why) {
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base != MAP_FAILED) return base;
  why = errno_text("mmap", name, errno);
  return nullptr;
}

uint64_t load_acquire(uint64_t& v) {
  return std::atomic_ref<uint64_t>(v).load(std::memory_order_acquire);
}
void store_release(uint64_t& v, uint64_t x) {
  std::atomic_ref<uint64_t>(v).store(x, std::memory_order_release);
}

}  // namespace

size_t SharedMailboxes::segment_bytes(const MailboxLayout& layout) {
  return kHeader + all_boxes(layout) * box_stride(layout);
}

SharedMailboxes::SharedMailboxes(void* base, size_t bytes, int rank, const MailboxLayout& layout)
    : base_(base),
      bytes_(bytes),
      rank_(rank),
      layout_(layout),
      slot_stride_(round_up(layout.capacity)),
      box_stride_(box_stride(layout)),
      sent_(all_boxes(layout), 0),
      known_taken_(all_boxes(layout), 0),
      received_(size_t(layout.boxes), 0) {}

SharedMailboxes::~SharedMailboxes() { munmap(base_, bytes_); }

std::unique_ptr<SharedMailboxes> SharedMailboxes::create(const std::string& name, uint64_t cookie,
                                                         int rank, const MailboxLayout& layout,
                                                         std::string& why) {
  LOOM_ASSERT(layout.ranks > 0 && layout.boxes > 0 && layout.slots > 0, "mailbox layout");
  const size_t bytes = segment_bytes(layout);
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    why = errno_text("shm_open", name, errno);
    return nullptr;
  }
  // posix_fallocate returns the error rather than setting errno.
  const int rc = ftruncate(fd, off_t(bytes)) != 0 ? errno : posix_fallocate(fd, 0, off_t(bytes));
  void* base = nullptr;
  if (rc != 0)
    why = errno_text("reserving", name, rc);
  else
    base = map(fd, bytes, name, why);
  close(fd);
  if (!base) {
    shm_unlink(name.c_str());
    return nullptr;
  }
  // A new segment reads as zeros: every counter starts at 0. The cookie goes last.
  store_release(*static_cast<uint64_t*>(base), cookie);
  return std::unique_ptr<SharedMailboxes>(new SharedMailboxes(base, bytes, rank, layout));
}

std::unique_ptr<SharedMailboxes> SharedMailboxes::open(const std::string& name, uint64_t cookie,
                                                       int rank, const MailboxLayout& layout,
                                                       std::string& why) {
  LOOM_ASSERT(layout.ranks > 0 && layout.boxes > 0 && layout.slots > 0, "mailbox layout");
  const size_t bytes = segment_bytes(layout);
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    why = errno_text("shm_open", name, errno);
    return nullptr;
  }
  struct stat st {};
  void* base = nullptr;
  if (fstat(fd, &st) != 0)
    why = errno_text("fstat", name, errno);
  else if (size_t(st.st_size) != bytes)
    why = name + " has " + std::to_string(st.st_size) + " bytes, expected " + std::to_string(bytes);
  else
    base = map(fd, bytes, name, why);
  close(fd);
  if (!base) return nullptr;
  if (load_acquire(*static_cast<uint64_t*>(base)) != cookie) {
    why = name + " is another group's segment";
    munmap(base, bytes);
    return nullptr;
  }
  return std::unique_ptr<SharedMailboxes>(new SharedMailboxes(base, bytes, rank, layout));
}

void SharedMailboxes::unlink(const std::string& name) { shm_unlink(name.c_str()); }

SharedMailboxes::Box& SharedMailboxes::box_of(int rank, int box) const {
  static_assert(sizeof(Box) == kCounters);
  char* at = static_cast<char*>(base_) + kHeader +
             (size_t(rank) * size_t(layout_.boxes) + size_t(box)) * box_stride_;
  return *reinterpret_cast<Box*>(at);
}

char* SharedMailboxes::slot(Box& b, uint64_t message) const {
  return reinterpret_cast<char*>(&b + 1) + (message % uint64_t(layout_.slots)) * slot_stride_;
}

bool SharedMailboxes::try_send(int to, int box, const void* message, size_t bytes) {
  return try_send(to, box, message, bytes, nullptr, 0);
}

bool SharedMailboxes::try_send(int to, int box, const void* head, size_t head_bytes,
                               const void* body, size_t body_bytes) {
  const size_t bytes = head_bytes + body_bytes;
  LOOM_ASSERT(bytes <= layout_.capacity, "a mailbox message of ", bytes, " bytes, capacity ",
              layout_.capacity);
  Box& b = box_of(to, box);
  const size_t mine = size_t(to) * size_t(layout_.boxes) + size_t(box);
  const uint64_t m = sent_[mine] + 1;
  const uint64_t slots = uint64_t(layout_.slots);
  uint64_t& known = known_taken_[mine];
  if (known + slots < m) {
    known = load_acquire(b.taken);
    if (known + slots < m) return false;
  }
  char* into = slot(b, m);
  std::memcpy(into, head, head_bytes);
  if (body_bytes > 0) std::memcpy(into + head_bytes, body, body_bytes);
  store_release(b.posted, m);
  sent_[mine] = m;
  return true;
}

const void* SharedMailboxes::peek(int box) const {
  Box& b = box_of(rank_, box);
  const uint64_t m = received_[size_t(box)] + 1;
  return load_acquire(b.posted) >= m ? slot(b, m) : nullptr;
}

void SharedMailboxes::release(int box) {
  store_release(box_of(rank_, box).taken, ++received_[size_t(box)]);
}

}  // namespace loom::comm
