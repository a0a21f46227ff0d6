// main() of the multi-rank test binaries: joins the world (MPI under mpirun, `self` alone) before
// GoogleTest runs, and lets only rank 0 print GoogleTest's progress so the log stays readable;
// a failure on any rank still prints there and makes that rank, and so mpirun, exit non-zero.
#include <gtest/gtest.h>

#include <cstdio>

#include "collectives/communicator.h"

namespace {

// Prints each failed assertion of a rank other than 0, prefixed with the rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_,
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto world = loom::comm::world();
  if (world->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(world->rank()));
  }
  int result = RUN_ALL_TESTS();
  // Every rank must agree: a rank whose tests failed makes all report failure.
  loom::Tensor flag = loom::Tensor::full({1}, result != 0 ? 1.0 : 0.0, loom::DType::kI32);
  world->allreduce_sync(flag, loom::comm::ReduceOp::kMax);
  return flag.item() != 0 ? 1 : 0;
}
