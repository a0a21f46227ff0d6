// The progress hook of Note [Progress during compute] (core/progress.cpp): autograd runs it as ops
// record their nodes (and in a checkpointed block's unrecorded forward) and between backward nodes,
// on the installing thread only, at most every kProgressIntervalSeconds, never inside itself.
#include "core/progress.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/tensor.h"

namespace loom {
namespace {

int g_calls = 0;
void count_call() { ++g_calls; }

// A hook that itself runs an op that records a node: were the hook re-entered, it would recurse.
void record_inside() {
  ++g_calls;
  Tensor x = Tensor::full({2}, 1.0f, DType::kF32).set_requires_grad(true);
  Tensor y = mul(x, x);
  (void)y;
}

// Longer than kProgressIntervalSeconds, so the next op finds the hook due.
void pause() { std::this_thread::sleep_for(std::chrono::microseconds(500)); }

class ProgressHookTest : public ::testing::Test {
 protected:
  void SetUp() override { g_calls = 0; }
  void TearDown() override { set_progress_hook(nullptr); }
};

TEST_F(ProgressHookTest, RecordingOpsRunTheHookWhenDue) {
  Tensor x = Tensor::full({4}, 2.0f, DType::kF32).set_requires_grad(true);
  Tensor y = mul(x, x);  // no hook yet
  EXPECT_EQ(g_calls, 0);
  set_progress_hook(&count_call);
  for (int i = 0; i < 3; ++i) {
    pause();
    y = mul(y, x);
  }
  EXPECT_EQ(g_calls, 3);
  // Ops that record nothing (no input needs a gradient) do not run it.
  pause();
  Tensor z = mul(Tensor::full({4}, 1.0f, DType::kF32), Tensor::full({4}, 3.0f, DType::kF32));
  EXPECT_EQ(g_calls, 3);
  EXPECT_FLOAT_EQ(z.to_vector<float>()[0], 3.0f);
  set_progress_hook(nullptr);
  pause();
  y = mul(y, x);
  EXPECT_EQ(g_calls, 3);
}

TEST_F(ProgressHookTest, BackwardRunsTheHookBetweenNodes) {
  Tensor x = Tensor::full({4}, 2.0f, DType::kF32).set_requires_grad(true);
  Tensor y = x;
  for (int i = 0; i < 10; ++i) y = mul(y, x);
  set_progress_hook(&count_call);
  pause();
  autograd::backward({sum(y)}, {Tensor::full({}, 1.0f, DType::kF32)});
  EXPECT_GE(g_calls, 1);
  // The gradient is unchanged by the hook: d/dx x^11 = 11 x^10.
  EXPECT_FLOAT_EQ(x.grad().to_vector<float>()[0], 11.0f * 1024.0f);
}

// A checkpointed block's first forward records nothing, but its ops run the hook as the
// recomputation's do; ops under a plain no-grad guard still do not.
TEST_F(ProgressHookTest, CheckpointedForwardRunsTheHook) {
  Tensor x = Tensor::full({4}, 2.0f, DType::kF32).set_requires_grad(true);
  auto block = [](const std::vector<Tensor>& in) {
    Tensor y = in[0];
    for (int i = 0; i < 3; ++i) {
      pause();
      y = mul(y, in[0]);
    }
    return y;
  };
  set_progress_hook(&count_call);
  Tensor y = autograd::checkpoint(block, {x});
  const int after_forward = g_calls;
  EXPECT_GE(after_forward, 3);  // (checkpoint's own record may find it due too)
  {
    NoGradGuard no_grad;
    Tensor z = block({x});
    EXPECT_EQ(g_calls, after_forward);
  }
  // The backward recomputes (3 recording ops) and runs its nodes: the gradient is x^4's.
  autograd::backward({sum(y)}, {Tensor::full({}, 1.0f, DType::kF32)});
  EXPECT_GE(g_calls, after_forward + 4);  // the first node, then 3 recorded ops
  EXPECT_FLOAT_EQ(x.grad().to_vector<float>()[0], 4.0f * 8.0f);
}

TEST_F(ProgressHookTest, RunsAtMostOncePerInterval) {
  set_progress_hook(&count_call);
  Tensor x = Tensor::full({4}, 1.0f, DType::kF32).set_requires_grad(true);
  const auto start = std::chrono::steady_clock::now();
  Tensor y = x;
  for (int i = 0; i < 2000; ++i) y = add(y, x);
  const double span =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(g_calls, 1);  // the first op finds it due
  EXPECT_LE(g_calls, int(span / kProgressIntervalSeconds) + 1) << "over " << span << " s";
}

TEST_F(ProgressHookTest, OnlyTheInstallingThreadRunsIt) {
  set_progress_hook(&count_call);
  std::thread other([] {
    Tensor x = Tensor::full({4}, 1.0f, DType::kF32).set_requires_grad(true);
    Tensor y = x;
    for (int i = 0; i < 3; ++i) {
      pause();
      y = mul(y, x);
    }
  });
  other.join();
  EXPECT_EQ(g_calls, 0);
}

TEST_F(ProgressHookTest, IsNeverReentered) {
  set_progress_hook(&record_inside);
  Tensor x = Tensor::full({4}, 1.0f, DType::kF32).set_requires_grad(true);
  pause();
  Tensor y = mul(x, x);
  EXPECT_EQ(g_calls, 1);  // the op inside the hook found it running
  pause();
  y = mul(y, x);
  EXPECT_EQ(g_calls, 2);
}

}  // namespace
}  // namespace loom
