// Mailboxes in shared memory for a group whose ranks share one node: its signature exchanges
// rounds, and its point-to-point messages (collectives/pair_channels.h). See Note [Mailboxes in
// shared memory] in shared_mailbox.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace loom::comm {

// The shape of a segment: `ranks` ranks, each with `boxes` mailboxes (one per exchange round, or
// one per sending rank), each holding `slots` messages of at most `capacity` bytes: a sender may
// run `slots` messages ahead of its receiver.
struct MailboxLayout {
  int ranks = 0;
  int boxes = 0;
  size_t capacity = 0;
  int slots = 2;
};

class SharedMailboxes {
 public:
  static size_t segment_bytes(const MailboxLayout& layout);

  // The creator's side: a new segment named `name` (a POSIX shared-memory name, "/..."), its
  // memory reserved now (a full /dev/shm fails here, not later as SIGBUS), stamped with `cookie`.
  // Null, with `why` set, when it cannot be made.
  static std::unique_ptr<SharedMailboxes> create(const std::string& name, uint64_t cookie, int rank,
                                                 const MailboxLayout& layout, std::string& why);
  // Every other rank's side: the segment the creator made, if it holds `cookie` (another host's
  // /dev/shm, or a stale segment of that name, does not).
  static std::unique_ptr<SharedMailboxes> open(const std::string& name, uint64_t cookie, int rank,
                                               const MailboxLayout& layout, std::string& why);
  // Removes the name (the creator, once every rank has opened it); the mapping stays.
  static void unlink(const std::string& name);

  ~SharedMailboxes();
  SharedMailboxes(const SharedMailboxes&) = delete;
  SharedMailboxes& operator=(const SharedMailboxes&) = delete;

  size_t capacity() const { return layout_.capacity; }
  const MailboxLayout& layout() const { return layout_; }

  // Puts the next message (`bytes` <= capacity) into rank `to`'s mailbox `box`; false, with
  // nothing sent, while that mailbox still holds `slots` unread messages of this rank. Only one
  // rank sends into a mailbox.
  bool try_send(int to, int box, const void* message, size_t bytes);
  // The same with a message in two parts (a header, then a payload), each copied once.
  bool try_send(int to, int box, const void* head, size_t head_bytes, const void* body,
                size_t body_bytes);
  // The next message in this rank's mailbox `box`, or null until it has arrived. It stays valid,
  // and the sender's later messages wait, until release(box).
  const void* peek(int box) const;
  void release(int box);

 private:
  SharedMailboxes(void* base, size_t bytes, int rank, const MailboxLayout& layout);
  struct Box;
  Box& box_of(int rank, int box) const;
  char* slot(Box& b, uint64_t message) const;

  void* base_;
  size_t bytes_;
  int rank_;
  MailboxLayout layout_;
  size_t slot_stride_, box_stride_;
  // This rank's counts: per mailbox it sends into (ranks x boxes), the messages sent and the
  // latest count of them its receiver had read; per mailbox of its own, the messages received.
  std::vector<uint64_t> sent_, known_taken_, received_;
};

}  // namespace loom::comm
