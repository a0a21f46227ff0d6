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
// [Signature exchange], mpi_backend.cpp), and Open MPI's shared-memory transport spends about
// twice what the memory needs on it: on a 2-vCPU Xeon VM two processes swapping 1 KiB through
// MPI_Irecv + MPI_Isend + MPI_Testall took 1.13-1.21 us, through a shared mapping with a flag per
// direction 0.59-0.62 us (4 KiB: 2.8-3.0 against 1.4-1.5 us; 3-5 runs of each, taken in turn). So a
// group whose ranks share a node runs its exchanges through mailboxes of its own, in one
// POSIX shared-memory segment its ranks map when the group is made.
//
// Each rank has one mailbox per round of the exchange: in round k it hears from one rank only,
// and sends to one rank only, in every exchange and both phases, so a mailbox is a
// single-producer, single-consumer queue and both sides can count its messages alike. A mailbox
// is two counters on cache lines of their own (`posted`, written by the sender; `taken`, written
// by the receiver) and kSlots message slots; message m (counted from 1) goes to slot m % kSlots.
// The sender copies message m into its slot once `taken` >= m - kSlots (the receiver is done
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
  // kSlots slots of capacity_ bytes (rounded up to cache lines) follow.
};

namespace {

constexpr size_t kLine = 64;
constexpr size_t kHeader = kLine;  // the cookie, on a line of its own

size_t round_up(size_t bytes) { return (bytes + kLine - 1) / kLine * kLine; }

constexpr size_t kCounters = 2 * kLine;  // a Box: `posted` and `taken`, a line each

size_t box_stride(size_t capacity) {
  return kCounters + SharedMailboxes::kSlots * round_up(capacity);
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

size_t SharedMailboxes::segment_bytes(int n, int rounds, size_t capacity) {
  return kHeader + size_t(n) * size_t(rounds) * box_stride(capacity);
}

SharedMailboxes::SharedMailboxes(void* base, size_t bytes, int rank, int rounds, size_t capacity)
    : base_(base),
      bytes_(bytes),
      rank_(rank),
      rounds_(rounds),
      capacity_(capacity),
      box_stride_(box_stride(capacity)),
      sent_(size_t(rounds), 0),
      received_(size_t(rounds), 0),
      known_taken_(size_t(rounds), 0) {}

SharedMailboxes::~SharedMailboxes() { munmap(base_, bytes_); }

std::unique_ptr<SharedMailboxes> SharedMailboxes::create(const std::string& name, uint64_t cookie,
                                                         int rank, int n, int rounds,
                                                         size_t capacity, std::string& why) {
  const size_t bytes = segment_bytes(n, rounds, capacity);
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
  return std::unique_ptr<SharedMailboxes>(new SharedMailboxes(base, bytes, rank, rounds, capacity));
}

std::unique_ptr<SharedMailboxes> SharedMailboxes::open(const std::string& name, uint64_t cookie,
                                                       int rank, int n, int rounds, size_t capacity,
                                                       std::string& why) {
  const size_t bytes = segment_bytes(n, rounds, capacity);
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
  return std::unique_ptr<SharedMailboxes>(new SharedMailboxes(base, bytes, rank, rounds, capacity));
}

void SharedMailboxes::unlink(const std::string& name) { shm_unlink(name.c_str()); }

SharedMailboxes::Box& SharedMailboxes::box(int rank, int round) const {
  static_assert(sizeof(Box) == kCounters);
  char* at = static_cast<char*>(base_) + kHeader +
             (size_t(rank) * size_t(rounds_) + size_t(round)) * box_stride_;
  return *reinterpret_cast<Box*>(at);
}

char* SharedMailboxes::slot(Box& b, uint64_t message) const {
  return reinterpret_cast<char*>(&b + 1) + (message % kSlots) * round_up(capacity_);
}

bool SharedMailboxes::try_send(int to, int round, const void* message, size_t bytes) {
  LOOM_ASSERT(bytes <= capacity_, "a mailbox message of ", bytes, " bytes, capacity ", capacity_);
  Box& b = box(to, round);
  const uint64_t m = sent_[size_t(round)] + 1;
  uint64_t& known = known_taken_[size_t(round)];
  if (known + kSlots < m) {
    known = load_acquire(b.taken);
    if (known + kSlots < m) return false;
  }
  std::memcpy(slot(b, m), message, bytes);
  store_release(b.posted, m);
  sent_[size_t(round)] = m;
  return true;
}

const void* SharedMailboxes::peek(int round) const {
  Box& b = box(rank_, round);
  const uint64_t m = received_[size_t(round)] + 1;
  return load_acquire(b.posted) >= m ? slot(b, m) : nullptr;
}

void SharedMailboxes::release(int round) {
  store_release(box(rank_, round).taken, ++received_[size_t(round)]);
}

}  // namespace loom::comm
