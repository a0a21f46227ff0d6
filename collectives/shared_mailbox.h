// Mailboxes in shared memory for the signature exchanges of a group whose ranks share one node.
// See Note [Mailboxes in shared memory] in shared_mailbox.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace loom::comm {

class SharedMailboxes {
 public:
  // Messages in flight per mailbox: a sender may run this many messages ahead of its receiver.
  static constexpr int kSlots = 2;

  // `n` ranks, each with one mailbox per round (`rounds`), each message at most `capacity` bytes.
  static size_t segment_bytes(int n, int rounds, size_t capacity);

  // The creator's side: a new segment named `name` (a POSIX shared-memory name, "/..."), its
  // memory reserved now (a full /dev/shm fails here, not later as SIGBUS), stamped with `cookie`.
  // Null, with `why` set, when it cannot be made.
  static std::unique_ptr<SharedMailboxes> create(const std::string& name, uint64_t cookie, int rank,
                                                 int n, int rounds, size_t capacity,
                                                 std::string& why);
  // Every other rank's side: the segment the creator made, if it holds `cookie` (another host's
  // /dev/shm, or a stale segment of that name, does not).
  static std::unique_ptr<SharedMailboxes> open(const std::string& name, uint64_t cookie, int rank,
                                               int n, int rounds, size_t capacity,
                                               std::string& why);
  // Removes the name (the creator, once every rank has opened it); the mapping stays.
  static void unlink(const std::string& name);

  ~SharedMailboxes();
  SharedMailboxes(const SharedMailboxes&) = delete;
  SharedMailboxes& operator=(const SharedMailboxes&) = delete;

  size_t capacity() const { return capacity_; }

  // Puts the next message of `round` (`bytes` <= capacity) into rank `to`'s mailbox for that
  // round; false, with nothing sent, while `to` still holds kSlots unread messages of this rank.
  bool try_send(int to, int round, const void* message, size_t bytes);
  // This rank's next message of `round`, or null until it has arrived. It stays valid, and the
  // sender's later messages wait, until release(round).
  const void* peek(int round) const;
  void release(int round);

 private:
  SharedMailboxes(void* base, size_t bytes, int rank, int rounds, size_t capacity);
  struct Box;
  Box& box(int rank, int round) const;
  char* slot(Box& b, uint64_t message) const;

  void* base_;
  size_t bytes_;
  int rank_, rounds_;
  size_t capacity_, box_stride_;
  // This rank's counts per round (in round k it sends to one rank and receives from one): the
  // messages sent and received, and the latest count of its messages the receiver had read.
  std::vector<uint64_t> sent_, received_, known_taken_;
};

}  // namespace loom::comm
