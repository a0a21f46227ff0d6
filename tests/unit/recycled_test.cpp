// Recycled blocks (Note [Recycled blocks] in collectives/recycled.cpp): an object made after
// another of its size class was freed on the same thread takes that block, objects keep their
// values, a block freed on another thread is that thread's to hand out. Under AddressSanitizer
// nothing is recycled, and the reuse checks are skipped.
#include <gtest/gtest.h>

#include <array>
#include <memory>
#include <thread>
#include <vector>

#include "collectives/recycled.h"

namespace loom::comm {
namespace {

struct Counted {
  static int live;
  std::array<int64_t, 20> values{};
  explicit Counted(int64_t v) {
    values.fill(v);
    ++live;
  }
  ~Counted() { --live; }
};
int Counted::live = 0;

TEST(Recycled, ObjectsAreConstructedDestroyedAndKeepTheirValues) {
  std::vector<std::shared_ptr<Counted>> objects;
  for (int64_t v = 0; v < 100; ++v) objects.push_back(make_recycled<Counted>(v));
  EXPECT_EQ(Counted::live, 100);
  for (int64_t v = 0; v < 100; ++v)
    for (int64_t x : objects[size_t(v)]->values) ASSERT_EQ(x, v);
  objects.resize(50);
  EXPECT_EQ(Counted::live, 50);
  for (int64_t v = 100; v < 150; ++v) objects.push_back(make_recycled<Counted>(v));
  for (size_t i = 0; i < objects.size(); ++i)
    for (int64_t x : objects[i]->values) ASSERT_EQ(x, i < 50 ? int64_t(i) : int64_t(i) + 50);
  objects.clear();
  EXPECT_EQ(Counted::live, 0);
}

TEST(Recycled, AFreedBlockIsTheNextObjectsOfItsSize) {
  if (!recycling::recycles()) GTEST_SKIP() << "nothing is recycled under AddressSanitizer";
  const void* first = make_recycled<Counted>(1).get();  // freed at the end of the statement
  auto again = make_recycled<Counted>(2);
  EXPECT_EQ(again.get(), first);
  EXPECT_EQ(again->values[19], 2);
}

TEST(Recycled, ABlockFreedOnAnotherThreadIsThatThreads) {
  if (!recycling::recycles()) GTEST_SKIP() << "nothing is recycled under AddressSanitizer";
  auto made_here = make_recycled<Counted>(3);
  const void* block = made_here.get();
  const void* reused_there = nullptr;
  std::thread([&] {
    made_here.reset();  // onto this thread's list
    reused_there = make_recycled<Counted>(4).get();
  }).join();
  EXPECT_EQ(reused_there, block);
  EXPECT_EQ(Counted::live, 0);
}

}  // namespace
}  // namespace loom::comm
