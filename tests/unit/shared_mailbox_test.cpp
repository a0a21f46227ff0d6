// Mailboxes in shared memory (Note [Mailboxes in shared memory] in
// collectives/shared_mailbox.cpp), each "rank" a mapping of its own in this process: messages
// arrive whole and in order, a sender runs at most kSlots messages ahead of its receiver, the
// dissemination's rounds keep their messages apart across threads, and a segment that is not the
// group's is refused with the reason.
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
std::vector<std::unique_ptr<SharedMailboxes>> group(int n, int rounds, size_t capacity) {
  const std::string name = unique_name("group");
  const uint64_t cookie = 0x1234567890abcdefull;
  std::string why;
  std::vector<std::unique_ptr<SharedMailboxes>> ranks;
  ranks.push_back(SharedMailboxes::create(name, cookie, 0, n, rounds, capacity, why));
  EXPECT_TRUE(ranks.back()) << why;
  for (int r = 1; r < n; ++r) {
    ranks.push_back(SharedMailboxes::open(name, cookie, r, n, rounds, capacity, why));
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
  auto ranks = group(2, 1, 64);
  ASSERT_TRUE(ranks[0] && ranks[1]);
  SharedMailboxes& sender = *ranks[0];
  SharedMailboxes& receiver = *ranks[1];
  EXPECT_EQ(receiver.peek(0), nullptr);  // nothing sent yet
  int64_t next = 1;
  for (int i = 0; i < SharedMailboxes::kSlots; ++i, ++next)
    EXPECT_TRUE(sender.try_send(1, 0, &next, sizeof next));
  // Both slots hold unread messages: the next waits, and nothing of it is written.
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

// The signature exchange's pattern on three ranks, one thread each: in round k rank r sends to
// r - 2^k and hears from r + 2^k (mod 3), messages of varying length, many times over; every
// message that arrives is the one its sender sent for that round and turn, whole.
TEST(SharedMailboxes, RoundsOfADisseminationAcrossThreads) {
  constexpr int kRanks = 3, kRounds = 2, kTurns = 20000;
  constexpr size_t kCapacity = 1024;
  auto ranks = group(kRanks, kRounds, kCapacity);
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
  auto made = SharedMailboxes::create(name, 42, 0, 2, 1, 128, why);
  ASSERT_TRUE(made) << why;
  EXPECT_FALSE(SharedMailboxes::create(name, 42, 0, 2, 1, 128, why));  // the name is taken
  EXPECT_NE(why.find("shm_open " + name), std::string::npos) << why;

  EXPECT_FALSE(SharedMailboxes::open(name, 43, 1, 2, 1, 128, why));  // another cookie
  EXPECT_NE(why.find("another group's segment"), std::string::npos) << why;

  EXPECT_FALSE(SharedMailboxes::open(name, 42, 1, 4, 2, 128, why));  // another layout
  EXPECT_NE(why.find("expected " + std::to_string(SharedMailboxes::segment_bytes(4, 2, 128))),
            std::string::npos)
      << why;

  SharedMailboxes::unlink(name);
  EXPECT_FALSE(SharedMailboxes::open(name, 42, 1, 2, 1, 128, why));  // gone
  EXPECT_NE(why.find("No such file"), std::string::npos) << why;
}

}  // namespace
}  // namespace loom::comm
