// Signature checks (See Note [Collective signatures] in collectives/communicator.cpp): after many
// good collectives, a call that one rank makes differently (count, dtype, op, root, reduction,
// or the same-sized call from another line, as when two calls are swapped) raises CommError on
// every rank of the group, naming the ranks and their calls, before anything hangs or a wrong
// result is read; the group stays usable afterwards. On by default; LOOM_COMM_DEBUG=0 (or
// set_debug(false)) turns it off. Checked collectives are posted from a per-group queue (Note
// [The check queue]), so ranks may post nonblocking collectives on two groups in different
// orders, and a rank blocked on another group still posts a queued collective its peers wait for.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>

#include "collectives/communicator.h"

namespace loom::comm {
namespace {

std::shared_ptr<Communicator> debug_group() {
  auto world = comm::world();
  auto g = world->split(0, world->rank(), "debugged");
  g->set_debug(true);
  return g;
}

// Runs `call` on every rank; expects every rank to get CommError containing all of `parts`.
void expect_mismatch(Communicator& g, const std::function<void()>& call,
                     std::initializer_list<std::string> parts) {
  try {
    call();
    ADD_FAILURE() << "expected a CommError on rank " << g.rank();
  } catch (const CommError& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "message lacks '" << p << "': " << msg;
  }
}

TEST(CommDebug, GoodCollectivesPassAndMismatchesRaiseOnEveryRank) {
  auto g = debug_group();
  const int n = g->size(), r = g->rank(), last = n - 1;
  // Many good collectives first: the check must not get in their way.
  for (int i = 0; i < 20; ++i) {
    Tensor x = Tensor::full({16}, 1.0);
    g->allreduce_sync(x);
    EXPECT_EQ(x.to_vector<float>(), std::vector<float>(16, float(n)));
    Tensor b = Tensor::full({4}, r, DType::kI32);
    g->broadcast(b, {i % n})->wait();
    EXPECT_EQ(b.to_vector<int32_t>(), std::vector<int32_t>(4, i % n));
  }
  if (n == 1) GTEST_SKIP() << "one rank cannot disagree with itself";

  // Count: the last rank reduces fewer elements.
  expect_mismatch(
      *g,
      [&] {
        Tensor x = Tensor::ones({r == last ? 8 : 16});
        g->allreduce_sync(x);
      },
      {"disagree", "group 'debugged'", "count 16", "count 8", detail::str_cat(last, ": ")});
  // Dtype.
  expect_mismatch(*g,
                  [&] {
                    Tensor x = Tensor::ones({16}, r == 0 ? DType::kF16 : DType::kF32);
                    g->allreduce_sync(x);
                  },
                  {"rank 0: allreduce f16", "allreduce f32"});
  // Op: rank 0 broadcasts while the others allreduce.
  expect_mismatch(*g,
                  [&] {
                    Tensor x = Tensor::ones({16});
                    if (r == 0)
                      g->broadcast(x, {0})->wait();
                    else
                      g->allreduce_sync(x);
                  },
                  {"broadcast f32 count 16 root 0", "allreduce f32 count 16 sum"});
  // Root.
  expect_mismatch(*g,
                  [&] {
                    Tensor x = Tensor::ones({16});
                    g->broadcast(x, {r == last ? 0 : last})->wait();
                  },
                  {"root 0", detail::str_cat("root ", last)});
  // An all-to-all with explicit splits on rank 0, the equal form elsewhere: the equal form's
  // count is compared, the other has none (its sizes may differ by rank).
  expect_mismatch(*g,
                  [&] {
                    Tensor in = Tensor::ones({4 * n}), out = Tensor::zeros({4 * n});
                    AllToAllOptions o;
                    if (r == 0) o.input_splits = o.output_splits = std::vector<int64_t>(n, 4);
                    g->all_to_all(in, out, o)->wait();
                  },
                  {"rank 0: all_to_all f32 with splits at debug_test.cpp:",
                   detail::str_cat("all_to_all f32 count ", 4 * n, " at debug_test.cpp:")});
  // Reduction.
  expect_mismatch(*g,
                  [&] {
                    Tensor x = Tensor::ones({16});
                    g->allreduce_sync(x, r == 0 ? ReduceOp::kMax : ReduceOp::kSum);
                  },
                  {"max", "sum"});

  // The group is still in step.
  Tensor x = Tensor::full({3}, 2.0);
  g->allreduce_sync(x);
  EXPECT_EQ(x.to_vector<float>(), std::vector<float>(3, 2.0f * float(n)));
  g->barrier_sync();
}

// Two same-sized allreduces that the ranks make in swapped order raise on every rank naming
// both lines; the group stays in step.
TEST(CommDebug, SwappedSameSizeCallsRaiseNamingTheirLines) {
  auto g = debug_group();
  const int n = g->size(), r = g->rank();
  if (n == 1) GTEST_SKIP() << "one rank cannot disagree with itself";
  Tensor a = Tensor::full({8}, 1.0), b = Tensor::full({8}, 10.0);
  const int line_a = __LINE__ + 1;
  auto reduce_a = [&] { g->allreduce_sync(a); };
  const int line_b = __LINE__ + 1;
  auto reduce_b = [&] { g->allreduce_sync(b); };
  expect_mismatch(
      *g,
      [&] {
        if (r == 0) {
          reduce_a();
          reduce_b();
        } else {
          reduce_b();
          reduce_a();
        }
      },
      {"disagree on collective #", detail::str_cat("debug_test.cpp:", line_a),
       detail::str_cat("debug_test.cpp:", line_b), "rank 0: allreduce f32 count 8 sum"});
  // Still in step: a good call gives the closed form.
  Tensor x = Tensor::full({5}, 3.0);
  g->allreduce_sync(x);
  EXPECT_EQ(x.to_vector<float>(), std::vector<float>(5, 3.0f * float(n)));
}

// Without the check (LOOM_COMM_DEBUG=0, or set_debug(false)), the same swapped calls are not
// caught: each rank adds its a to the other's b, the silently wrong result the check exists to
// prevent (closed form for two ranks: 1 + 10 = 11 everywhere).
TEST(CommDebug, UncheckedSwappedCallsGoUnnoticed) {
  auto world = comm::world();
  auto g = world->split(0, world->rank(), "unchecked");
  if (const char* v = std::getenv("LOOM_COMM_DEBUG"); !v || std::string(v) != "0")
    EXPECT_TRUE(g->debug()) << "on by default";
  g->set_debug(false);
  const int n = g->size(), r = g->rank();
  if (n != 2) GTEST_SKIP() << "the closed form below is for two ranks";
  Tensor a = Tensor::full({8}, 1.0), b = Tensor::full({8}, 10.0);
  if (r == 0) {
    g->allreduce_sync(a);
    g->allreduce_sync(b);
  } else {
    g->allreduce_sync(b);
    g->allreduce_sync(a);
  }
  EXPECT_EQ(a.to_vector<float>(), std::vector<float>(8, 11.0f));
  EXPECT_EQ(b.to_vector<float>(), std::vector<float>(8, 11.0f));
}

// Unchecked, small collectives still travel in the check channel's exchange (Note [Carried when
// unchecked] in communicator.cpp): their results are the closed forms, and a call of another
// length on one rank raises on every rank, naming the calls, instead of reading a short message.
TEST(CommDebug, UncheckedSmallCollectivesAreRightAndALengthMismatchRaises) {
  auto world = comm::world();
  auto g = world->split(0, world->rank(), "unchecked small");
  const int n = g->size(), r = g->rank();
  if (n == 1) GTEST_SKIP() << "one rank exchanges nothing";
  g->set_debug(false);
  Tensor x = Tensor::full({7}, double(r + 1)), sum = Tensor::zeros({7});
  g->allreduce(x, sum)->wait();
  EXPECT_EQ(sum.to_vector<float>(), std::vector<float>(7, float(n * (n + 1) / 2)));
  Tensor blocks = Tensor::full({3 * int64_t(n)}, double(r + 1)), mine = Tensor::zeros({3});
  g->reduce_scatter(blocks, mine)->wait();
  EXPECT_EQ(mine.to_vector<float>(), std::vector<float>(3, float(n * (n + 1) / 2)));
  Tensor all = Tensor::zeros({2 * int64_t(n)});
  g->allgather(Tensor::full({2}, double(r)), all)->wait();
  for (int j = 0; j < n; ++j) {
    EXPECT_EQ(all.to_vector<float>()[size_t(2 * j)], float(j));
    EXPECT_EQ(all.to_vector<float>()[size_t(2 * j + 1)], float(j));
  }
  Tensor t = Tensor::ones({r == 0 ? 8 : 9});
  expect_mismatch(*g, [&] { g->allreduce(t)->wait(); },
                  {"disagree", "allreduce f32 count 8", "allreduce f32 count 9", "checks are off"});
  // The group goes on.
  Tensor y = Tensor::ones({5});
  g->allreduce(y)->wait();
  EXPECT_EQ(y.to_vector<float>(), std::vector<float>(5, float(n)));
}

// Two groups over the same ranks; even ranks post group A's allreduce first, odd ranks group B's,
// both nonblocking, and each waits in its own order. Legal (each group's own order agrees); a
// check that made posting wait for the peers would hang here until the timeout.
TEST(CommDebug, NonblockingCallsOnTwoGroupsInDifferentOrdersComplete) {
  auto world = comm::world();
  auto a = world->split(0, world->rank(), "a");
  auto b = world->split(0, world->rank(), "b");
  a->set_debug(true);
  b->set_debug(true);
  a->set_timeout_seconds(30);
  b->set_timeout_seconds(30);
  const int n = world->size(), r = world->rank();
  for (int round = 0; round < 3; ++round) {
    Tensor x = Tensor::full({64}, 1.0), y = Tensor::full({4}, double(r), DType::kI64);
    // Each call from one line on every rank (the symmetric collectives' signature has its line).
    auto post_x = [&] { return a->allreduce(x); };
    auto post_y = [&] { return b->allreduce(y, {ReduceOp::kMax}); };
    WorkPtr wx, wy;
    if (r % 2 == 0) {
      wx = post_x();
      wy = post_y();
      wx->wait();
      wy->wait();
    } else {
      wy = post_y();
      wx = post_x();
      wy->wait();
      wx->wait();
    }
    EXPECT_EQ(x.to_vector<float>(), std::vector<float>(64, float(n)));
    EXPECT_EQ(y.to_vector<int64_t>(), std::vector<int64_t>(4, n - 1));
  }
}

// Rank 0 posts an allreduce, does not wait on it, and waits to receive from rank 1 on another
// group; rank 1 sends only after its allreduce completed. Rank 0's queued allreduce must be
// posted while it waits for the message (as MPI's progress would have completed a posted one).
TEST(CommDebug, AQueuedCollectiveIsPostedWhileTheRankWaitsElsewhere) {
  auto world = comm::world();
  auto g = world->split(0, world->rank(), "queued");
  auto p2p = world->split(0, world->rank(), "p2p");
  g->set_debug(true);
  g->set_timeout_seconds(30);
  p2p->set_timeout_seconds(30);
  const int n = world->size(), r = world->rank();
  if (n == 1) GTEST_SKIP() << "needs two ranks";
  Tensor x = Tensor::full({16}, 2.0);
  Tensor token = Tensor::full({1}, 0.0);
  WorkPtr w = g->allreduce(x);  // one line for every rank
  if (r == 0) {
    p2p->recv(token, 1)->wait();
    w->wait();
    EXPECT_EQ(token.to_vector<float>(), std::vector<float>(1, 7.0f));
  } else {
    w->wait();
    if (r == 1) {
      token = Tensor::full({1}, 7.0);
      p2p->send(token, 0)->wait();
    }
  }
  EXPECT_EQ(x.to_vector<float>(), std::vector<float>(16, 2.0f * float(n)));
}

// A mismatch found while later calls are queued: every rank raises it from that call's wait
// (not from the next call, which a rank that found it early would then skip), the later calls
// still run in step, and turning the check off posts whatever is still queued first.
TEST(CommDebug, MismatchAmongQueuedCallsRaisesAndTheRestRun) {
  auto g = debug_group();
  const int n = g->size(), r = g->rank();
  if (n == 1) GTEST_SKIP() << "one rank cannot disagree with itself";
  Tensor bad = Tensor::ones({r == 0 ? 4 : 5});
  Tensor good = Tensor::full({6}, 3.0);
  WorkPtr wb = g->allreduce(bad);
  WorkPtr wg = g->allreduce(good);
  bool raised = false;
  try {
    wb->wait();
  } catch (const CommError& e) {
    raised = true;
    EXPECT_NE(std::string(e.what()).find("count 4"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(raised) << "rank " << r;
  wg->wait();
  EXPECT_EQ(good.to_vector<float>(), std::vector<float>(6, 3.0f * float(n)));
  // Queued calls, then the check turned off: they are posted first, in order.
  Tensor c = Tensor::full({2}, 1.0), d = Tensor::full({2}, 5.0);
  WorkPtr wc = g->allreduce(c), wd = g->allreduce(d);
  g->set_debug(false);
  Tensor e = Tensor::full({2}, 2.0);
  g->allreduce_sync(e);
  wc->wait();
  wd->wait();
  EXPECT_EQ(c.to_vector<float>(), std::vector<float>(2, float(n)));
  EXPECT_EQ(d.to_vector<float>(), std::vector<float>(2, 5.0f * float(n)));
  EXPECT_EQ(e.to_vector<float>(), std::vector<float>(2, 2.0f * float(n)));
}

// Small collectives travel inside their checks (Note [Small collectives in their check]): every
// rank gets the reduction in rank order, bit for bit ((x0 + x1) + x2 ... in f32; bf16 widened,
// summed and rounded once), a reduce_scatter its chunk of it, an allgather every input, whatever
// the group size; and a carried call against another call (a larger one that is not carried, an
// allgather, a barrier) still raises on every rank and writes no output.
TEST(CommDebug, SmallCollectivesInsideTheirChecks) {
  auto g = debug_group();
  const int n = g->size(), r = g->rank();
  const int64_t count = 31;  // reduce_scatter sends n x count f32: carried up to 8 ranks
  // Rank j's values: fractions whose sums round differently in different orders.
  auto values = [&](int j) {
    std::vector<float> v(size_t(count) * size_t(n));
    for (size_t i = 0; i < v.size(); ++i) v[i] = 1.0f / float(3 + 7 * j + int(i % 13)) + float(i);
    return v;
  };
  std::vector<float> in_order(size_t(count) * size_t(n)), bf16_order(in_order.size());
  for (int j = 0; j < n; ++j) {
    const std::vector<float> v = values(j);
    const std::vector<float> b = Tensor::from_vector<float>(v, {int64_t(v.size())})
                                     .to(DType::kBF16)
                                     .to(DType::kF32)
                                     .to_vector<float>();
    for (size_t i = 0; i < v.size(); ++i) {
      in_order[i] = j == 0 ? v[i] : in_order[i] + v[i];
      bf16_order[i] = j == 0 ? b[i] : bf16_order[i] + b[i];
    }
  }
  const std::vector<float> mine = values(r);
  Tensor x = Tensor::from_vector<float>({mine.begin(), mine.begin() + count}, {count});
  g->allreduce_sync(x);
  EXPECT_EQ(x.to_vector<float>(), std::vector<float>(in_order.begin(), in_order.begin() + count));

  Tensor h =
      Tensor::from_vector<float>({mine.begin(), mine.begin() + count}, {count}).to(DType::kBF16);
  g->allreduce_sync(h, ReduceOp::kAvg);
  std::vector<float> avg(bf16_order.begin(), bf16_order.begin() + count);
  for (float& a : avg) a /= float(n);
  EXPECT_EQ(
      h.to(DType::kF32).to_vector<float>(),
      Tensor::from_vector<float>(avg, {count}).to(DType::kBF16).to(DType::kF32).to_vector<float>());

  Tensor all = Tensor::from_vector<float>(mine, {count * n}), chunk = Tensor::zeros({count});
  g->reduce_scatter(all, chunk)->wait();
  EXPECT_EQ(chunk.to_vector<float>(),
            std::vector<float>(in_order.begin() + r * count, in_order.begin() + (r + 1) * count));

  Tensor one = Tensor::full({3}, float(r), DType::kI64),
         gathered = Tensor::zeros({3 * n}, DType::kI64);
  g->allgather(one, gathered)->wait();
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < 3; ++i) EXPECT_EQ(gathered.to_vector<int64_t>()[size_t(3 * j + i)], j);
  if (n == 1) return;

  // A carried call against calls that are not it: nothing written, every rank raises.
  const int last = n - 1;
  Tensor small = Tensor::full({16}, 5.0);
  expect_mismatch(*g,
                  [&] {
                    Tensor big = Tensor::ones({100000});  // 400 KB: not carried
                    if (r == last)
                      g->allreduce_sync(big);
                    else
                      g->allreduce_sync(small);
                  },
                  {"count 16", "count 100000"});
  EXPECT_EQ(small.to_vector<float>(), std::vector<float>(16, 5.0f));
  expect_mismatch(*g,
                  [&] {
                    Tensor out = Tensor::zeros({16 * n});
                    if (r == 0)
                      g->allgather(small, out)->wait();
                    else
                      g->allreduce_sync(small);
                  },
                  {"rank 0: allgather f32 count 16", "allreduce f32 count 16"});
  EXPECT_EQ(small.to_vector<float>(), std::vector<float>(16, 5.0f));
  expect_mismatch(*g,
                  [&] {
                    if (r == last)
                      g->barrier_sync();
                    else
                      g->allreduce_sync(small);
                  },
                  {"barrier", "allreduce f32 count 16"});
  EXPECT_EQ(small.to_vector<float>(), std::vector<float>(16, 5.0f));
  g->barrier_sync();
}

}  // namespace
}  // namespace loom::comm
