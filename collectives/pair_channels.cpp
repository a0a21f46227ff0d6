#include "collectives/pair_channels.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace loom::comm {

// Note [Point-to-point through mailboxes]
// A small send and receive through Open MPI's shared-memory transport cost about twice what the
// memory needs (Note [Mailboxes in shared memory], shared_mailbox.cpp): loom's 1 KiB ping-pong
// ran at 0.84-0.95 of raw MPI_Send/MPI_Recv's on the 2-vCPU Xeon VM with all of loom's own cost
// trimmed (Note [A single message's cost], mpi_point_to_point.cpp). So a group inside one node of
// at most kMaxRanks ranks carries its point-to-point messages through a segment of its own: rank r
// has one mailbox per sending rank (itself included), so each mailbox is a single-producer,
// single-consumer queue of kSlots messages.
//
// Every message from one rank to another goes into their mailbox, in the order sent: a message of
// at most kInlineBytes (kSlots chunks) whole, a header with its tag and length, then its bytes in
// chunks of kChunkBytes, one per slot (the receiver copies each out as the sender fills the
// next); a larger one as the header alone, its bytes following through MPI under the same tag on
// the group's communicator. One ordered stream per pair is what keeps MPI's matching rule (a
// receive matches the first message from its peer with its tag that no earlier receive matched):
// the receiver learns of every message in its sender's order, whichever way its bytes travel, and
// posts the MPI receive for an announced message only when its header is matched, so MPI's own
// order on one tag, which the sender's MPI sends keep, pairs them alike. A message that no posted
// receive matches is copied out of its slot (an announced one: its header) and kept until one is,
// as MPI keeps an unexpected message; so a sender never waits on a receive its peer has not posted
// as long as the peer's rank makes any progress (every loom wait and test steps the waiting
// point-to-point works, and each step takes every mailbox's arrivals).
//
// Because the header carries the sender's length, a receive of another length is an error naming
// both, for small messages and large (an announced message of another length is still received,
// into scratch, so its sender completes, as a truncated MPI message does).
//
// Groups of more than kMaxRanks ranks, groups across nodes, and LOOM_SHM_EXCHANGE=0 keep MPI's
// transport for every message: a group uses channels on every rank or on none (the segment is
// made collectively), since a message through a mailbox would never match a receive through MPI.

struct PairChannels::Header {
  int32_t tag;
  uint32_t announced;  // 1: the bytes follow through the transport
  uint64_t bytes;
};

MailboxLayout PairChannels::layout(int n) {
  return MailboxLayout{n, n, sizeof(Header) + kChunkBytes, kSlots};
}

namespace {
// The chunks a message of `bytes` travels in (an announced one: its header, in one).
size_t chunks(size_t bytes) {
  return bytes > PairChannels::kInlineBytes
             ? 1
             : std::max<size_t>(
                   1, (bytes + PairChannels::kChunkBytes - 1) / PairChannels::kChunkBytes);
}
}  // namespace

PairChannels::PairChannels(std::unique_ptr<SharedMailboxes> boxes, int rank, int n)
    : boxes_(std::move(boxes)),
      rank_(rank),
      n_(n),
      waiting_sends_(size_t(n)),
      posted_(size_t(n)),
      unexpected_(size_t(n)),
      partial_(size_t(n)) {
  LOOM_ASSERT(boxes_ && boxes_->layout().ranks == n && boxes_->layout().boxes == n &&
                  boxes_->capacity() >= sizeof(Header) + kChunkBytes,
              "point-to-point channels over a segment of another layout");
}

bool PairChannels::try_put(Send& s) {
  const bool announced = s.bytes > kInlineBytes;
  const char* data = static_cast<const char*>(s.data);
  if (!s.started) {
    const Header header{int32_t(s.tag), announced ? 1u : 0u, uint64_t(s.bytes)};
    const size_t first = announced ? 0 : std::min(s.bytes, kChunkBytes);
    if (!boxes_->try_send(s.peer, rank_, &header, sizeof header, data, first)) return false;
    s.started = true;
    s.put = first;
  }
  while (!announced && s.put < s.bytes) {
    const size_t next = std::min(s.bytes - s.put, kChunkBytes);
    if (!boxes_->try_send(s.peer, rank_, data + s.put, next)) return false;
    s.put += next;
  }
  return true;
}

std::shared_ptr<PairChannels::Send> PairChannels::send(int peer, int tag, const void* data,
                                                       size_t bytes) {
  Send s{peer, tag, data, bytes, false, 0, false};
  std::deque<std::shared_ptr<Send>>& queue = waiting_sends_[size_t(peer)];
  if (queue.empty() && try_put(s)) return nullptr;
  // Its mailbox is full (or earlier sends wait): room comes as the peer takes its arrivals, which
  // may need this rank's own (a send to itself), so take them before waiting.
  take_arrivals(rank_);
  if (queue.empty() && try_put(s)) return nullptr;
  queue.push_back(std::make_shared<Send>(s));
  any_waiting_sends_ = true;
  return queue.back();
}

void PairChannels::deliver(Receive& r, const Header& header, const void* payload) {
  r.got = size_t(header.bytes);
  if (header.announced) {
    r.arrival = Arrival::kAnnounced;
    return;
  }
  if (r.got == r.bytes && r.bytes > 0) std::memcpy(r.data, payload, r.bytes);
  r.arrival = Arrival::kDelivered;
}

PairChannels::Arrival PairChannels::receive(int peer, int tag, void* data, size_t bytes,
                                            size_t& got, std::shared_ptr<Receive>& pending) {
  pending = nullptr;
  Receive r{peer, tag, data, bytes, Arrival::kWaiting, 0};
  std::deque<std::shared_ptr<Receive>>& posted = posted_[size_t(peer)];
  const bool earlier = first_posted(peer, tag) != posted.end();
  bool in_chunks = false;  // its message is here, in chunks: taken below, as a posted receive's
  if (!earlier) {
    // The oldest kept message with this tag, else the mailbox's next ones in order.
    std::deque<Unexpected>& kept = unexpected_[size_t(peer)];
    const auto it =
        std::find_if(kept.begin(), kept.end(), [&](const Unexpected& u) { return u.tag == tag; });
    if (it != kept.end() && it->whole) {
      const Header header{int32_t(it->tag), it->announced ? 1u : 0u, uint64_t(it->bytes)};
      deliver(r, header, it->data.data());
      kept.erase(it);
      got = r.got;
      return r.arrival;
    }
    // A kept message still arriving is delivered to the receive posted below once whole.
    const bool arriving = it != kept.end();  // (taking arrivals below moves kept's end)
    while (!arriving && !in_chunks) {
      const void* message = boxes_->peek(peer);
      if (!message) break;
      Header header{};
      if (!partial_[size_t(peer)].active) std::memcpy(&header, message, sizeof header);
      if (partial_[size_t(peer)].active || header.tag != tag) {
        take_arrival(peer);  // an earlier message's chunk, an earlier receive's, or kept
        continue;
      }
      if (!header.announced && header.bytes > kChunkBytes) {
        in_chunks = true;
        break;
      }
      deliver(r, header, static_cast<const char*>(message) + sizeof header);
      boxes_->release(peer);
      got = r.got;
      return r.arrival;
    }
  }
  pending = std::make_shared<Receive>(r);
  posted.push_back(pending);
  if (in_chunks) take_arrivals(peer);
  if (pending->arrival == Arrival::kWaiting) return Arrival::kWaiting;
  got = pending->got;
  const Arrival arrival = pending->arrival;
  pending = nullptr;
  return arrival;
}

std::deque<std::shared_ptr<PairChannels::Receive>>::iterator PairChannels::first_posted(int peer,
                                                                                        int tag) {
  std::deque<std::shared_ptr<Receive>>& posted = posted_[size_t(peer)];
  return std::find_if(posted.begin(), posted.end(),
                      [tag](const std::shared_ptr<Receive>& r) { return r->tag == tag; });
}

bool PairChannels::take_arrival(int peer) {
  const void* message = boxes_->peek(peer);
  if (!message) return false;
  Partial& partial = partial_[size_t(peer)];
  if (partial.active) {  // the next chunk of a message under way
    const size_t bytes = std::min(kChunkBytes, partial.total - partial.received);
    if (partial.into) std::memcpy(partial.into + partial.received, message, bytes);
    partial.received += bytes;
    boxes_->release(peer);
    if (partial.received == partial.total) completed(peer);
    return true;
  }
  Header header{};
  std::memcpy(&header, message, sizeof header);
  const char* payload = static_cast<const char*>(message) + sizeof header;
  const size_t bytes = size_t(header.bytes);
  std::deque<std::shared_ptr<Receive>>& posted = posted_[size_t(peer)];
  const auto it = first_posted(peer, header.tag);
  if (header.announced || chunks(bytes) == 1) {
    if (it != posted.end()) {
      deliver(**it, header, payload);
      posted.erase(it);
    } else {
      Unexpected u{header.tag, header.announced != 0, bytes, {}, true};
      if (!u.announced) u.data.assign(payload, payload + bytes);
      unexpected_[size_t(peer)].push_back(std::move(u));
    }
    boxes_->release(peer);
    return true;
  }
  // The first of several chunks: the rest follow into the receive's buffer, or a kept copy.
  partial = Partial{true, nullptr, 0, bytes, nullptr, false};
  if (it != posted.end()) {
    partial.receive = *it;
    posted.erase(it);
    if (partial.receive->bytes == bytes) partial.into = static_cast<char*>(partial.receive->data);
  } else {
    unexpected_[size_t(peer)].push_back(
        Unexpected{header.tag, false, bytes, std::vector<char>(bytes), false});
    partial.into = unexpected_[size_t(peer)].back().data.data();
    partial.kept = true;
  }
  partial.received = std::min(bytes, kChunkBytes);
  if (partial.into) std::memcpy(partial.into, payload, partial.received);
  boxes_->release(peer);
  return true;
}

void PairChannels::completed(int peer) {
  Partial& partial = partial_[size_t(peer)];
  partial.active = false;
  if (partial.receive) {
    partial.receive->got = partial.total;
    partial.receive->arrival = Arrival::kDelivered;
    partial.receive = nullptr;
    return;
  }
  if (!partial.kept) return;  // its receive was cancelled
  // A kept message: a receive posted while it arrived takes it now.
  std::deque<Unexpected>& kept = unexpected_[size_t(peer)];
  kept.back().whole = true;
  std::deque<std::shared_ptr<Receive>>& posted = posted_[size_t(peer)];
  const auto it = first_posted(peer, kept.back().tag);
  if (it == posted.end()) return;
  const Header header{kept.back().tag, 0u, uint64_t(kept.back().bytes)};
  deliver(**it, header, kept.back().data.data());
  posted.erase(it);
  kept.pop_back();
}

void PairChannels::take_arrivals(int peer) {
  while (take_arrival(peer)) {
  }
}

void PairChannels::progress() {
  for (int peer = 0; peer < n_; ++peer) take_arrivals(peer);
  if (!any_waiting_sends_) return;
  any_waiting_sends_ = false;
  for (std::deque<std::shared_ptr<Send>>& queue : waiting_sends_) {
    while (!queue.empty() && try_put(*queue.front())) {
      queue.front()->in_mailbox = true;
      queue.pop_front();
    }
    any_waiting_sends_ = any_waiting_sends_ || !queue.empty();
  }
}

void PairChannels::cancel(const std::shared_ptr<Receive>& r) {
  std::deque<std::shared_ptr<Receive>>& posted = posted_[size_t(r->peer)];
  posted.erase(std::remove(posted.begin(), posted.end(), r), posted.end());
  Partial& partial = partial_[size_t(r->peer)];
  if (partial.receive == r) {  // its message's later chunks are skipped
    partial.into = nullptr;
    partial.receive = nullptr;
  }
}

void PairChannels::cancel(const std::shared_ptr<Send>& s) {
  // One already partly in its mailbox goes on (its receiver expects its remaining chunks), from
  // a buffer the caller keeps (Note [Abandoned operations]); only one not started is dropped.
  if (s->started) return;
  std::deque<std::shared_ptr<Send>>& queue = waiting_sends_[size_t(s->peer)];
  queue.erase(std::remove(queue.begin(), queue.end(), s), queue.end());
}

}  // namespace loom::comm
