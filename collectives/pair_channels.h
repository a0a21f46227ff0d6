// Point-to-point messages between the ranks of a group inside one node, through mailboxes in
// shared memory: a small message travels in its mailbox, a larger one announces itself there and
// its bytes follow through the caller's transport. Matching is MPI's (by sender and tag, in the
// order receives are posted). See Note [Point-to-point through mailboxes] in pair_channels.cpp.
// Knows no MPI and no Tensor: the backend (mpi_point_to_point.cpp) moves announced bytes and owns
// the buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "collectives/shared_mailbox.h"

namespace loom::comm {

class PairChannels {
 public:
  // Slots per mailbox: a sender may run this many chunks ahead of its receiver.
  static constexpr int kSlots = 4;
  // The bytes of a message one slot carries (the first also carries its header).
  static constexpr size_t kChunkBytes = 16 * 1024;
  // The largest message carried in its mailbox, in chunks; a larger one is announced.
  static constexpr size_t kInlineBytes = kSlots * kChunkBytes;
  // The largest group given channels: the segment grows with the square of the ranks
  // (kSlots x 16 KiB per ordered pair: 4 MiB at 8 ranks).
  static constexpr int kMaxRanks = 8;
  // The segment of a group of `n` ranks: one mailbox per sending rank.
  static MailboxLayout layout(int n);

  // What became of a receive.
  enum class Arrival {
    kWaiting,    // no message yet
    kDelivered,  // its bytes are in the buffer (when `got` == the bytes expected)
    kAnnounced,  // a larger message of `got` bytes whose bytes follow through the transport
  };

  // A receive waiting for its message; the engine fills it in as the message arrives.
  struct Receive {
    int peer = 0, tag = 0;
    void* data = nullptr;
    size_t bytes = 0;  // expected
    Arrival arrival = Arrival::kWaiting;
    size_t got = 0;  // the message's bytes, once it arrived
  };

  // A send waiting for room in its mailbox.
  struct Send {
    int peer = 0, tag = 0;
    const void* data = nullptr;
    size_t bytes = 0;
    bool in_mailbox = false;  // sent whole (an announced one: its announcement)
    size_t put = 0;           // bytes in the mailbox so far
    bool started = false;     // its first chunk (with the header) is in the mailbox
  };

  // `boxes`: the group's segment, of layout(n).
  PairChannels(std::unique_ptr<SharedMailboxes> boxes, int rank, int n);

  // Sends `bytes` from `data` to `peer` under `tag`: in the mailbox when bytes <= kInlineBytes,
  // else its announcement only (the caller sends the bytes, under `tag`, through the transport).
  // Null once it is in the mailbox (the buffer may be reused); else a record that progress()
  // sends, in order behind this rank's earlier sends to `peer`, while the buffer stays alive.
  std::shared_ptr<Send> send(int peer, int tag, const void* data, size_t bytes);

  // Posts a receive of `bytes` into `data` from `peer` under `tag`. It matches the first message
  // from `peer` with `tag` that no earlier receive matched. Returns kDelivered or kAnnounced (with
  // `got`) when that message is here already, and then `pending` stays null; else kWaiting, and
  // `pending` is the record progress() fills in (the buffer stays alive until then, or until
  // cancel()).
  Arrival receive(int peer, int tag, void* data, size_t bytes, size_t& got,
                  std::shared_ptr<Receive>& pending);

  // Sends what has room, and hands every message that arrived to its receive (or keeps it, a
  // copy, until one is posted). Never blocks.
  void progress();

  // Forgets a receive or send still waiting (its work was abandoned): nothing is written to its
  // buffer, nothing read from it.
  void cancel(const std::shared_ptr<Receive>& r);
  void cancel(const std::shared_ptr<Send>& s);

 private:
  struct Header;
  // A message that arrived before its receive was posted.
  struct Unexpected {
    int tag;
    bool announced;
    size_t bytes;
    std::vector<char> data;  // an inline message's bytes
    bool whole;              // every chunk arrived
  };
  // A message in chunks whose later chunks are still to come (one per peer at most: its chunks
  // follow each other in the mailbox).
  struct Partial {
    bool active = false;
    char* into = nullptr;  // where its bytes go (null: a receive of another length, skipped)
    size_t received = 0, total = 0;
    std::shared_ptr<Receive> receive;  // its receive, if one matched it
    bool kept = false;                 // else kept: unexpected_[peer].back() (else cancelled)
  };

  // Puts what has room of `s` into its mailbox: whether all of it is there.
  bool try_put(Send& s);
  // Takes `peer`'s next chunk in the mailbox: a message's first goes to the first posted receive
  // with its tag, or is kept; false when there is none.
  bool take_arrival(int peer);
  void take_arrivals(int peer);
  // A message in chunks came whole.
  void completed(int peer);
  // The first receive posted for `peer` with `tag` that no message matched yet, or the end of
  // posted_[peer].
  std::deque<std::shared_ptr<Receive>>::iterator first_posted(int peer, int tag);
  // Hands the message under `header` (its bytes at `payload`, whole) to `r`.
  static void deliver(Receive& r, const Header& header, const void* payload);

  std::unique_ptr<SharedMailboxes> boxes_;
  int rank_, n_;
  // Per peer: sends waiting for room, in order; receives posted and not matched, in order;
  // messages that arrived unmatched, in order.
  std::vector<std::deque<std::shared_ptr<Send>>> waiting_sends_;
  std::vector<std::deque<std::shared_ptr<Receive>>> posted_;
  std::vector<std::deque<Unexpected>> unexpected_;
  std::vector<Partial> partial_;
  bool any_waiting_sends_ = false;
};

}  // namespace loom::comm
