// Point-to-point channels over mailboxes in shared memory (Note [Point-to-point through
// mailboxes] in collectives/pair_channels.cpp), each "rank" a mapping of its own in this process:
// MPI's matching (by peer and tag, in the order receives are posted) across messages kept because
// no receive was posted yet, a sender more than a mailbox's slots ahead, small messages whole and
// larger ones announced with their length, another length reported and never written, sends to
// oneself, and cancelled receives and sends.
#include "collectives/pair_channels.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace loom::comm {
namespace {

using Arrival = PairChannels::Arrival;

std::vector<std::unique_ptr<PairChannels>> channels(int n) {
  static int made = 0;
  const std::string name =
      "/loom-test-" + std::to_string(getpid()) + "-channels-" + std::to_string(made++);
  std::string why;
  std::vector<std::unique_ptr<PairChannels>> ranks;
  for (int r = 0; r < n; ++r) {
    auto boxes = r == 0 ? SharedMailboxes::create(name, 7, r, PairChannels::layout(n), why)
                        : SharedMailboxes::open(name, 7, r, PairChannels::layout(n), why);
    EXPECT_TRUE(boxes) << why;
    if (!boxes) return {};
    ranks.push_back(std::make_unique<PairChannels>(std::move(boxes), r, n));
  }
  SharedMailboxes::unlink(name);
  return ranks;
}

std::vector<int32_t> words(int32_t first, size_t count) {
  std::vector<int32_t> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = first + int32_t(i);
  return v;
}

constexpr size_t kSmallWords = 64;  // 256 bytes: inline
constexpr size_t kLargeWords = PairChannels::kInlineBytes / sizeof(int32_t) + 1;  // announced

// A send that does not fit its mailbox yet goes out as progress() finds room, in order.
void send_all(PairChannels& from, PairChannels& to, int peer, int tag, const void* data,
              size_t bytes) {
  auto waiting = from.send(peer, tag, data, bytes);
  while (waiting && !waiting->in_mailbox) {
    to.progress();  // the receiver takes its arrivals, keeping what no receive matches
    from.progress();
  }
}

TEST(PairChannels, TagsMatchInPostOrderAcrossKeptMessages) {
  auto ranks = channels(2);
  ASSERT_EQ(ranks.size(), 2u);
  PairChannels& zero = *ranks[0];
  PairChannels& one = *ranks[1];
  // Three times a mailbox's slots of messages, tags 0..n-1, before rank 1 posts any receive.
  constexpr int kMessages = 3 * PairChannels::kSlots;
  std::vector<std::vector<int32_t>> sent;
  for (int tag = 0; tag < kMessages; ++tag) sent.push_back(words(1000 * tag, kSmallWords));
  for (int tag = 0; tag < kMessages; ++tag)
    send_all(zero, one, 1, tag, sent[size_t(tag)].data(), kSmallWords * sizeof(int32_t));
  // Received in the reverse order of their tags: each gets its own message.
  for (int tag = kMessages - 1; tag >= 0; --tag) {
    std::vector<int32_t> got(kSmallWords, -1);
    size_t length = 0;
    std::shared_ptr<PairChannels::Receive> pending;
    EXPECT_EQ(one.receive(0, tag, got.data(), got.size() * sizeof(int32_t), length, pending),
              Arrival::kDelivered);
    EXPECT_EQ(pending, nullptr);
    EXPECT_EQ(length, kSmallWords * sizeof(int32_t));
    EXPECT_EQ(got, sent[size_t(tag)]) << "tag " << tag;
  }
}

TEST(PairChannels, ReceivesOfOneTagMatchInTheOrderPosted) {
  auto ranks = channels(3);
  ASSERT_EQ(ranks.size(), 3u);
  PairChannels& two = *ranks[2];
  // Rank 2 posts three receives from rank 0 under tag 5 and one from rank 1, before any send.
  std::vector<std::vector<int32_t>> got(4, std::vector<int32_t>(kSmallWords, -1));
  std::vector<std::shared_ptr<PairChannels::Receive>> pending(4);
  size_t length = 0;
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(two.receive(0, 5, got[size_t(i)].data(), kSmallWords * 4, length, pending[size_t(i)]),
              Arrival::kWaiting);
  EXPECT_EQ(two.receive(1, 5, got[3].data(), kSmallWords * 4, length, pending[3]),
            Arrival::kWaiting);
  // Rank 1's message, then rank 0's three, a large one (announced) in the middle.
  const auto from_one = words(-50, kSmallWords);
  send_all(*ranks[1], two, 2, 5, from_one.data(), kSmallWords * 4);
  const auto first = words(100, kSmallWords), third = words(300, kSmallWords);
  const auto large = words(200, kLargeWords);
  send_all(*ranks[0], two, 2, 5, first.data(), kSmallWords * 4);
  send_all(*ranks[0], two, 2, 5, large.data(), kLargeWords * 4);
  send_all(*ranks[0], two, 2, 5, third.data(), kSmallWords * 4);
  two.progress();
  EXPECT_EQ(pending[0]->arrival, Arrival::kDelivered);
  EXPECT_EQ(got[0], first);
  // The second receive expected a small message: it learns the large one's length, nothing
  // written.
  EXPECT_EQ(pending[1]->arrival, Arrival::kAnnounced);
  EXPECT_EQ(pending[1]->got, kLargeWords * 4);
  EXPECT_EQ(got[1], std::vector<int32_t>(kSmallWords, -1));
  EXPECT_EQ(pending[2]->arrival, Arrival::kDelivered);
  EXPECT_EQ(got[2], third);
  EXPECT_EQ(pending[3]->arrival, Arrival::kDelivered);
  EXPECT_EQ(got[3], from_one);
}

TEST(PairChannels, AnotherLengthIsReportedAndNotWritten) {
  auto ranks = channels(2);
  ASSERT_EQ(ranks.size(), 2u);
  const auto ten = words(1, 10);
  send_all(*ranks[0], *ranks[1], 1, 0, ten.data(), 10 * 4);
  send_all(*ranks[0], *ranks[1], 1, 0, ten.data(), 10 * 4);
  std::vector<int32_t> twenty(20, -1), five(5, -1);
  size_t length = 0;
  std::shared_ptr<PairChannels::Receive> pending;
  EXPECT_EQ(ranks[1]->receive(0, 0, twenty.data(), 20 * 4, length, pending), Arrival::kDelivered);
  EXPECT_EQ(length, 10u * 4);
  EXPECT_EQ(twenty, std::vector<int32_t>(20, -1));
  EXPECT_EQ(ranks[1]->receive(0, 0, five.data(), 5 * 4, length, pending), Arrival::kDelivered);
  EXPECT_EQ(length, 10u * 4);
  EXPECT_EQ(five, std::vector<int32_t>(5, -1));
}

TEST(PairChannels, ARankSendsToItselfPastItsSlotsAndCancels) {
  auto ranks = channels(2);
  ASSERT_EQ(ranks.size(), 2u);
  PairChannels& me = *ranks[0];
  constexpr int kMessages = 2 * PairChannels::kSlots + 1;
  std::vector<std::vector<int32_t>> sent;
  for (int i = 0; i < kMessages; ++i) sent.push_back(words(10 * i, kSmallWords));
  // Its own mailbox fills; each further send takes its arrivals first, so none waits.
  for (int i = 0; i < kMessages; ++i)
    EXPECT_EQ(me.send(0, 1, sent[size_t(i)].data(), kSmallWords * 4), nullptr) << i;
  for (int i = 0; i < kMessages; ++i) {
    std::vector<int32_t> got(kSmallWords, -1);
    size_t length = 0;
    std::shared_ptr<PairChannels::Receive> pending;
    EXPECT_EQ(me.receive(0, 1, got.data(), kSmallWords * 4, length, pending), Arrival::kDelivered);
    EXPECT_EQ(got, sent[size_t(i)]) << i;
  }
  // A cancelled receive is never written; the message goes to the next receive posted.
  std::vector<int32_t> cancelled(kSmallWords, -1), next(kSmallWords, -1);
  size_t length = 0;
  std::shared_ptr<PairChannels::Receive> pending;
  EXPECT_EQ(ranks[1]->receive(0, 2, cancelled.data(), kSmallWords * 4, length, pending),
            Arrival::kWaiting);
  ranks[1]->cancel(pending);
  send_all(me, *ranks[1], 1, 2, sent[0].data(), kSmallWords * 4);
  ranks[1]->progress();
  EXPECT_EQ(cancelled, std::vector<int32_t>(kSmallWords, -1));
  EXPECT_EQ(ranks[1]->receive(0, 2, next.data(), kSmallWords * 4, length, pending),
            Arrival::kDelivered);
  EXPECT_EQ(next, sent[0]);
  // A cancelled send that waited for room never goes.
  for (int i = 0; i < PairChannels::kSlots; ++i)
    EXPECT_EQ(me.send(1, 3, sent[1].data(), kSmallWords * 4), nullptr);
  auto waiting = me.send(1, 3, sent[2].data(), kSmallWords * 4);
  ASSERT_NE(waiting, nullptr);
  me.cancel(waiting);
  for (int i = 0; i < PairChannels::kSlots + 1; ++i) {
    ranks[1]->progress();
    me.progress();
  }
  EXPECT_FALSE(waiting->in_mailbox);
  for (int i = 0; i < PairChannels::kSlots; ++i) {
    std::vector<int32_t> got(kSmallWords, -1);
    EXPECT_EQ(ranks[1]->receive(0, 3, got.data(), kSmallWords * 4, length, pending),
              Arrival::kDelivered);
    EXPECT_EQ(got, sent[1]);
  }
  EXPECT_EQ(ranks[1]->receive(0, 3, next.data(), kSmallWords * 4, length, pending),
            Arrival::kWaiting);
}

// Messages of several chunks: one kept while its chunks arrive goes to a receive posted
// meanwhile, once whole; one of another length than its receive is reported and skipped; a
// receive cancelled while its chunks arrive leaves the next message to the next receive.
TEST(PairChannels, MessagesInChunksArriveWhole) {
  auto ranks = channels(2);
  ASSERT_EQ(ranks.size(), 2u);
  PairChannels& zero = *ranks[0];
  PairChannels& one = *ranks[1];
  const size_t chunk_words = PairChannels::kChunkBytes / 4;
  const auto two_chunks = words(1, chunk_words + 10);
  const auto four_chunks = words(-7, 4 * chunk_words - 3);
  EXPECT_EQ(zero.send(1, 1, two_chunks.data(), two_chunks.size() * 4), nullptr);
  // Two of its four chunks fit beside the first message's two.
  auto waiting = zero.send(1, 2, four_chunks.data(), four_chunks.size() * 4);
  ASSERT_NE(waiting, nullptr);
  one.progress();  // keeps the first message whole, the second's first two chunks
  std::vector<int32_t> got_four(four_chunks.size(), 0);
  size_t length = 0;
  std::shared_ptr<PairChannels::Receive> pending;
  EXPECT_EQ(one.receive(0, 2, got_four.data(), got_four.size() * 4, length, pending),
            Arrival::kWaiting);
  ASSERT_NE(pending, nullptr);
  zero.progress();  // the last two chunks
  EXPECT_TRUE(waiting->in_mailbox);
  one.progress();
  EXPECT_EQ(pending->arrival, Arrival::kDelivered);
  EXPECT_EQ(pending->got, four_chunks.size() * 4);
  EXPECT_EQ(got_four, four_chunks);
  std::vector<int32_t> got_two(two_chunks.size(), 0);
  EXPECT_EQ(one.receive(0, 1, got_two.data(), got_two.size() * 4, length, pending),
            Arrival::kDelivered);
  EXPECT_EQ(got_two, two_chunks);

  // Another length: the receive learns it, its buffer untouched; the next message is right.
  std::vector<int32_t> short_buffer(chunk_words, -1);
  EXPECT_EQ(one.receive(0, 3, short_buffer.data(), short_buffer.size() * 4, length, pending),
            Arrival::kWaiting);
  send_all(zero, one, 1, 3, four_chunks.data(), four_chunks.size() * 4);
  one.progress();
  EXPECT_EQ(pending->arrival, Arrival::kDelivered);
  EXPECT_EQ(pending->got, four_chunks.size() * 4);
  EXPECT_EQ(short_buffer, std::vector<int32_t>(chunk_words, -1));

  // Cancelled while its chunks arrive: the rest are skipped, not written.
  std::vector<int32_t> cancelled(four_chunks.size(), 0);
  EXPECT_EQ(one.receive(0, 4, cancelled.data(), cancelled.size() * 4, length, pending),
            Arrival::kWaiting);
  std::shared_ptr<PairChannels::Receive> first = pending;
  std::vector<int32_t> second(four_chunks.size(), 0);
  EXPECT_EQ(one.receive(0, 4, second.data(), second.size() * 4, length, pending),
            Arrival::kWaiting);
  EXPECT_EQ(zero.send(1, 4, two_chunks.data(), two_chunks.size() * 4), nullptr);
  waiting = zero.send(1, 4, four_chunks.data(), four_chunks.size() * 4);
  one.progress();  // the two-chunk message goes to the first receive: another length
  EXPECT_EQ(first->arrival, Arrival::kDelivered);
  EXPECT_EQ(first->got, two_chunks.size() * 4);
  // The four-chunk message has begun arriving for `second`: two chunks in; cancel it.
  one.cancel(pending);
  send_all(zero, one, 1, 4, two_chunks.data(), 0);  // then an empty message
  for (int i = 0; i < 4; ++i) {
    zero.progress();
    one.progress();
  }
  for (size_t i = 0; i < second.size(); ++i)
    ASSERT_EQ(second[i], i < 2 * chunk_words ? four_chunks[i] : 0) << i;
  EXPECT_EQ(cancelled, std::vector<int32_t>(four_chunks.size(), 0));
  EXPECT_EQ(pending->arrival, Arrival::kWaiting);  // cancelled: never delivered
  std::vector<int32_t> empty;
  EXPECT_EQ(one.receive(0, 4, empty.data(), 0, length, pending), Arrival::kDelivered);
  EXPECT_EQ(length, 0u);
}

// Two threads swap many messages of varying length and tag both ways, each receiving in an order
// of its own: every message arrives whole, to the receive its tag and order name.
TEST(PairChannels, TwoThreadsSwapMessagesOfEveryLength) {
  auto ranks = channels(2);
  ASSERT_EQ(ranks.size(), 2u);
  constexpr int kTurns = 3000;
  std::atomic<int> wrong{0};
  auto run = [&](int rank) {
    PairChannels& me = *ranks[size_t(rank)];
    const int peer = 1 - rank;
    for (int turn = 0; turn < kTurns; ++turn) {
      // Two messages per turn, tags 2 turn and 2 turn + 1; received second tag first.
      const size_t count = 1 + size_t(turn * 37 + rank) % (PairChannels::kInlineBytes / 4);
      std::vector<int32_t> a = words(turn * 10 + rank, count), b = words(-turn, count / 2 + 1);
      std::vector<std::shared_ptr<PairChannels::Send>> sends = {
          me.send(peer, 2 * turn, a.data(), a.size() * 4),
          me.send(peer, 2 * turn + 1, b.data(), b.size() * 4)};
      const size_t peer_count = 1 + size_t(turn * 37 + peer) % (PairChannels::kInlineBytes / 4);
      std::vector<int32_t> got_a(peer_count), got_b(peer_count / 2 + 1);
      std::shared_ptr<PairChannels::Receive> ra, rb;
      size_t length = 0;
      me.receive(peer, 2 * turn + 1, got_b.data(), got_b.size() * 4, length, rb);
      me.receive(peer, 2 * turn, got_a.data(), got_a.size() * 4, length, ra);
      auto done = [&] {
        for (const auto& s : sends)
          if (s && !s->in_mailbox) return false;
        return (!ra || ra->arrival != Arrival::kWaiting) &&
               (!rb || rb->arrival != Arrival::kWaiting);
      };
      while (!done()) {
        me.progress();
        std::this_thread::yield();
      }
      if (got_a != words(turn * 10 + peer, peer_count)) ++wrong;
      if (got_b != words(-turn, peer_count / 2 + 1)) ++wrong;
    }
  };
  std::thread other(run, 1);
  run(0);
  other.join();
  EXPECT_EQ(wrong.load(), 0);
}

}  // namespace
}  // namespace loom::comm
