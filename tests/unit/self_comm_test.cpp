// The self backend alone: a group of one rank, no MPI. Every collective over one rank is a copy
// (sum, avg, max and min of one value are the value), so every output must equal its input bit
// for bit, in every dtype; a send to itself is matched by a later recv with the same tag, and a
// recv with no send before it is a clear error (it would wait forever).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/self_backend.h"
#include "core/dispatch.h"
#include "core/tensor.h"
#include "testing/files.h"

namespace loom::comm {
namespace {

const DType kDTypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kI64};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};

// n distinct values in dtype dt (including negatives and, for floats, fractions).
Tensor values(DType dt, int64_t n, int salt = 0) {
  Tensor f = Tensor::empty({n});
  float* p = f.data<float>();
  for (int64_t i = 0; i < n; ++i) p[i] = float((i * 37 + salt) % 201 - 100) * 0.5f;
  return dt == DType::kF32 ? f : f.to(dt);
}

// Bit-for-bit equality of two tensors' elements (any dtype).
bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.numel() != b.numel()) return false;
  std::vector<char> x(a.nbytes()), y(b.nbytes());
  a.contiguous().copy_to_host(x.data(), x.size());
  b.contiguous().copy_to_host(y.data(), y.size());
  return x == y;
}

TEST(SelfComm, IsAGroupOfOne) {
  auto comm = make_self_communicator("solo");
  EXPECT_STREQ(comm->backend(), "self");
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->name(), "solo");
}

TEST(SelfComm, ReductionsCopyInEveryDtypeAndOp) {
  auto comm = make_self_communicator("solo");
  for (DType dt : kDTypes)
    for (ReduceOp op : kOps)
      for (int64_t n : {0, 1, 7, 1009}) {
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(dt) << " " << reduce_op_name(op) << " n=" << n);
        Tensor in = values(dt, n), out = Tensor::zeros({n}, dt);
        WorkPtr w = comm->allreduce(in, out, AllreduceOptions{op});
        EXPECT_TRUE(w->test());  // complete at once
        w->wait();
        EXPECT_TRUE(same_bits(out, in));
        Tensor t = values(dt, n);
        comm->allreduce(t, AllreduceOptions{op})->wait();
        EXPECT_TRUE(same_bits(t, in));
        Tensor rs = Tensor::zeros({n}, dt);
        comm->reduce_scatter(in, rs, ReduceScatterOptions{op})->wait();
        EXPECT_TRUE(same_bits(rs, in));
        Tensor red = Tensor::zeros({n}, dt);
        comm->reduce(in, red, ReduceOptions{op, 0})->wait();
        EXPECT_TRUE(same_bits(red, in));
      }
}

TEST(SelfComm, DataMovementCopiesInEveryDtype) {
  auto comm = make_self_communicator("solo");
  for (DType dt : kDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor in = values(dt, 6).reshape({2, 3});
    Tensor gathered = Tensor::zeros({2, 3}, dt);
    comm->allgather(in, gathered)->wait();
    EXPECT_TRUE(same_bits(gathered, in));
    Tensor b = values(dt, 9);
    comm->broadcast(b, BroadcastOptions{0})->wait();
    EXPECT_TRUE(same_bits(b, values(dt, 9)));
    Tensor a2a = Tensor::zeros({2, 3}, dt);
    comm->all_to_all(in, a2a)->wait();
    EXPECT_TRUE(same_bits(a2a, in));
    Tensor flat = values(dt, 5), a2av = Tensor::zeros({5}, dt);
    comm->all_to_all(flat, a2av, AllToAllOptions{{5}, {5}})->wait();
    EXPECT_TRUE(same_bits(a2av, flat));
  }
  comm->barrier_sync();
}

TEST(SelfComm, SendToSelfThenRecvMatchesByTag) {
  auto comm = make_self_communicator("solo");
  for (DType dt : kDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor a = values(dt, 7, 1), b = values(dt, 7, 2);
    comm->send(a, 0, PointToPointOptions{1})->wait();
    comm->send(b, 0, PointToPointOptions{2})->wait();
    a.fill_(0);  // the message was taken at send time, not aliased
    Tensor got_b = Tensor::zeros({7}, dt), got_a = Tensor::zeros({7}, dt);
    comm->recv(got_b, 0, PointToPointOptions{2})->wait();
    comm->recv(got_a, 0, PointToPointOptions{1})->wait();
    EXPECT_TRUE(same_bits(got_a, values(dt, 7, 1)));
    EXPECT_TRUE(same_bits(got_b, b));
  }
  // Both halves of a self-exchange in one batch, the recv listed first.
  Tensor out = values(DType::kF32, 4), in = Tensor::zeros({4});
  comm->batch_p2p({P2POp{P2POp::Kind::kRecv, in, 0, 3}, P2POp{P2POp::Kind::kSend, out, 0, 3}})
      ->wait();
  EXPECT_TRUE(same_bits(in, out));
}

TEST(SelfComm, RecvWithoutSendIsAClearError) {
  auto comm = make_self_communicator("solo");
  Tensor t = Tensor::zeros({4});
  testing::expect_error([&] { comm->recv(t, 0, PointToPointOptions{7}); },
                        {"group 'solo'", "recv", "tag 7", "no matching send"});
  // A send of another size is an error too, not a partial copy.
  comm->send(Tensor::ones({3}), 0)->wait();
  testing::expect_error([&] { comm->recv(t, 0); }, {"recv", "matched a send"});
}

TEST(SelfComm, SplitGivesAGroupOfOne) {
  auto comm = make_self_communicator("world");
  auto sub = comm->split(3, 0, "tp.0");
  EXPECT_STREQ(sub->backend(), "self");
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(sub->rank(), 0);
  EXPECT_EQ(sub->name(), "tp.0");
  EXPECT_EQ(comm->op_count("split"), 1u);
  Tensor t = values(DType::kBF16, 5);
  sub->allreduce_sync(t, ReduceOp::kAvg);
  EXPECT_TRUE(same_bits(t, values(DType::kBF16, 5)));
  EXPECT_EQ(sub->sequence_number(), 1u);
  EXPECT_EQ(comm->sequence_number(), 1u);  // the split itself
}

TEST(SelfComm, ArgumentChecksStillApply) {
  auto comm = make_self_communicator("solo");
  Tensor f3 = Tensor::zeros({3}), f4 = Tensor::zeros({4}), i3 = Tensor::zeros({3}, DType::kI32);
  testing::expect_error([&] { comm->allreduce(f3, f4); }, {"allreduce", "3", "4"});
  testing::expect_error([&] { comm->allgather(f3, i3); }, {"allgather", "f32", "i32"});
  testing::expect_error([&] { comm->broadcast(f3, BroadcastOptions{1}); }, {"broadcast", "root 1"});
  testing::expect_error([&] { comm->send(f3, 1); }, {"send", "peer 1"});
  EXPECT_EQ(comm->sequence_number(), 0u);
}

TEST(SelfComm, WorldAloneIsSelf) {
  if (launched_by_mpi()) GTEST_SKIP() << "started by an MPI launcher";
  auto w = world();
  EXPECT_STREQ(w->backend(), "self");
  EXPECT_EQ(w->size(), 1);
  EXPECT_EQ(w->name(), "world");
}

}  // namespace
}  // namespace loom::comm
