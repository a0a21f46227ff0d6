// Mailboxes in shared memory (Note [Mailboxes in shared memory] in
// collectives/shared_mailbox.cpp), each "rank" a mapping of its own in this process: messages
// arrive whole and in order, a sender runs at most a mailbox's slots ahead of its receiver and
// counts each mailbox apart, the dissemination's rounds keep their messages apart across threads,
// and a segment that is not the group's is refused with the reason.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collectives/shared_mailbox.h"

namespace loom::comm {
namespace {

std::string unique_name(const char* what) {
  static int made = 0;
  return "/loom-test-" + std::to_string(getpid()) + "-" + what + "-" + std::to_string(made++);
}

// `n` ranks' mappings of one new segment, its name already removed.
std::vector<std::unique_ptr<SharedMailboxes>> group(const MailboxLayout& layout) {
  const std::string name = unique_name("group");
  const uint64_t cookie = 0x1234567890abcdefull;
  std::string why;
  std::vector<std::unique_ptr<SharedMailboxes>> ranks;
  ranks.push_back(SharedMailboxes::create(name, cookie, 0, layout, why));
  EXPECT_TRUE(ranks.back()) << why;
  for (int r = 1; r < layout.ranks; ++r) {
    ranks.push_back(SharedMailboxes::open(name, cookie, r, layout, why));
    EXPECT_TRUE(ranks.back()) << why;
  }
  SharedMailboxes::unlink(name);
  return ranks;
}

int64_t read_word(const void* message) {
  int64_t v = 0;
  std::memcpy(&v, message, sizeof v);
  return v;
}

TEST(SharedMailboxes, MessagesArriveInOrderAndASenderWaitsForRoom) {
  for (int slots : {2, 4}) {
    SCOPED_TRACE(slots);
    auto ranks = group({2, 1, 64, slots});
    ASSERT_TRUE(ranks[0] && ranks[1]);
    SharedMailboxes& sender = *ranks[0];
    SharedMailboxes& receiver = *ranks[1];
    EXPECT_EQ(receiver.peek(0), nullptr);  // nothing sent yet
    int64_t next = 1;
    for (int i = 0; i < slots; ++i, ++next) EXPECT_TRUE(sender.try_send(1, 0, &next, sizeof next));
    // Every slot holds an unread message: the next waits, and nothing of it is written.
    EXPECT_FALSE(sender.try_send(1, 0, &next, sizeof next));
    ASSERT_NE(receiver.peek(0), nullptr);
    EXPECT_EQ(read_word(receiver.peek(0)), 1);
    EXPECT_FALSE(sender.try_send(1, 0, &next, sizeof next));  // peeked is not read
    receiver.release(0);
    EXPECT_TRUE(sender.try_send(1, 0, &next, sizeof next));  // message 1's slot is free again
    for (int64_t expected = 2; expected <= next; ++expected) {
      ASSERT_NE(receiver.peek(0), nullptr) << expected;
      EXPECT_EQ(read_word(receiver.peek(0)), expected);
      receiver.release(0);
    }
    EXPECT_EQ(receiver.peek(0), nullptr);
    // Rank 0's own mailbox is untouched by rank 0's sends to rank 1.
    EXPECT_EQ(sender.peek(0), nullptr);
  }
}

// One mailbox per sending rank (the point-to-point layout): a rank sending to two ranks, and
// to itself, keeps a count per mailbox it sends into, so filling one does not hold the others.
TEST(SharedMailboxes, ASenderCountsEachMailboxItSendsInto) {
  auto ranks = group({3, 3, 64, 2});
  for (const auto& r : ranks) ASSERT_TRUE(r);
  SharedMailboxes& zero = *ranks[0];
  for (int64_t m = 1; m <= 2; ++m) {
    EXPECT_TRUE(zero.try_send(1, 0, &m, sizeof m));
    const int64_t to_two = 10 + m, to_self = 20 + m;
    EXPECT_TRUE(zero.try_send(2, 0, &to_two, sizeof to_two));
    EXPECT_TRUE(zero.try_send(0, 0, &to_self, sizeof to_self));
  }
  int64_t more = 3;
  EXPECT_FALSE(zero.try_send(1, 0, &more, sizeof more));  // rank 1's mailbox from 0 is full
  ranks[2]->release(0);  // rank 2 reads one: only its mailbox has room again
  EXPECT_FALSE(zero.try_send(1, 0, &more, sizeof more));
  EXPECT_TRUE(zero.try_send(2, 0, &more, sizeof more));
  // Rank 1 hears from rank 2 in another mailbox, untouched.
  const int64_t from_two = 99;
  EXPECT_TRUE(ranks[2]->try_send(1, 2, &from_two, sizeof from_two));
  ASSERT_NE(ranks[1]->peek(2), nullptr);
  EXPECT_EQ(read_word(ranks[1]->peek(2)), 99);
  for (int64_t expected : {1, 2}) {
    ASSERT_NE(ranks[1]->peek(0), nullptr);
    EXPECT_EQ(read_word(ranks[1]->peek(0)), expected);
    ranks[1]->release(0);
  }
  for (int64_t expected : {21, 22}) {
    ASSERT_NE(zero.peek(0), nullptr);
    EXPECT_EQ(read_word(zero.peek(0)), expected);
    zero.release(0);
  }
  for (int64_t expected : {12, 3}) {
    ASSERT_NE(ranks[2]->peek(0), nullptr);
    EXPECT_EQ(read_word(ranks[2]->peek(0)), expected);
    ranks[2]->release(0);
  }
  EXPECT_EQ(ranks[2]->peek(0), nullptr);
}

// The signature exchange's pattern on three ranks, one thread each: in round k rank r sends to
// r - 2^k and hears from r + 2^k (mod 3), messages of varying length, many times over; every
// message that arrives is the one its sender sent for that round and turn, whole.
TEST(SharedMailboxes, RoundsOfADisseminationAcrossThreads) {
  constexpr int kRanks = 3, kRounds = 2, kTurns = 20000;
  constexpr size_t kCapacity = 1024;
  auto ranks = group({kRanks, kRounds, kCapacity, 2});
  for (const auto& r : ranks) ASSERT_TRUE(r);
  std::atomic<int> wrong{0};
  auto run = [&](int rank) {
    SharedMailboxes& me = *ranks[size_t(rank)];
    std::vector<int64_t> message(kCapacity / sizeof(int64_t));
    for (int turn = 0; turn < kTurns; ++turn)
      for (int round = 0; round < kRounds; ++round) {
        const int step = 1 << round;
        const int to = (rank - step + kRanks) % kRanks, from = (rank + step) % kRanks;
        // Word 0: the length in words; every word: (sender, round, turn) and its place.
        const size_t words = 1 + size_t(turn * 7 + rank) % message.size();
        for (size_t w = 0; w < words; ++w)
          message[w] =
              (int64_t(rank) << 56) | (int64_t(round) << 48) | (int64_t(turn) << 16) | int64_t(w);
        message[0] = int64_t(words);
        while (!me.try_send(to, round, message.data(), words * sizeof(int64_t)))
          std::this_thread::yield();
        const void* in = nullptr;
        while (!(in = me.peek(round))) std::this_thread::yield();
        std::vector<int64_t> got(kCapacity / sizeof(int64_t));
        std::memcpy(got.data(), in, sizeof(int64_t));
        const size_t expected_words = 1 + size_t(turn * 7 + from) % message.size();
        if (size_t(got[0]) != expected_words) {
          ++wrong;
        } else {
          std::memcpy(got.data(), in, expected_words * sizeof(int64_t));
          for (size_t w = 1; w < expected_words; ++w)
            if (got[w] != ((int64_t(from) << 56) | (int64_t(round) << 48) | (int64_t(turn) << 16) |
                           int64_t(w)))
              ++wrong;
        }
        me.release(round);
      }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) threads.emplace_back(run, r);
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(SharedMailboxes, ASegmentThatIsNotTheGroupsIsRefused) {
  const std::string name = unique_name("refused");
  std::string why;
  auto made = SharedMailboxes::create(name, 42, 0, {2, 1, 128, 2}, why);
  ASSERT_TRUE(made) << why;
  EXPECT_FALSE(SharedMailboxes::create(name, 42, 0, {2, 1, 128, 2}, why));  // the name is taken
  EXPECT_NE(why.find("shm_open " + name), std::string::npos) << why;

  EXPECT_FALSE(SharedMailboxes::open(name, 43, 1, {2, 1, 128, 2}, why));  // another cookie
  EXPECT_NE(why.find("another group's segment"), std::string::npos) << why;

  EXPECT_FALSE(SharedMailboxes::open(name, 42, 1, {4, 2, 128, 2}, why));  // another layout
  EXPECT_NE(why.find("expected " + std::to_string(SharedMailboxes::segment_bytes({4, 2, 128, 2}))),
            std::string::npos)
      << why;

  SharedMailboxes::unlink(name);
  EXPECT_FALSE(SharedMailboxes::open(name, 42, 1, {2, 1, 128, 2}, why));  // gone
  EXPECT_NE(why.find("No such file"), std::string::npos) << why;
}

}  // namespace
}  // namespace loom::comm
