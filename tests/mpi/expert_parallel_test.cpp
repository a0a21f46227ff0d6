// Expert parallelism (parallel/expert_parallel.h) against one process: every rank also runs the
// single-process nn::MoE on the whole batch (the same weights: init_parameters draws by name),
// then checks its own rows of the output and of the input's gradient, the experts it holds and
// their gradients, and, summed over the ranks, the router's gradient; averaged, the auxiliary
// losses. Dropless and with capacity (the same assignments dropped as one process drops), top-1 and
// top-2, 4 and 8 experts over every rank.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/nn/moe.h"
#include "core/ops.h"
#include "parallel/expert_parallel.h"

namespace loom::parallel {
namespace {

// Deterministic values in [-1, 1) of a given shape.
Tensor values_of(const Shape& shape, uint64_t salt) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = float(double((i * 2654435761u + salt * 40503u) % 2000) / 1000.0 - 1.0);
  return Tensor::from_vector(v, shape);
}

Tensor param(const nn::Module& m, const std::string& name) {
  for (auto& [n, p] : m.named_parameters())
    if (n == name) return p;
  ADD_FAILURE() << "no parameter " << name;
  return Tensor();
}

void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<float> g = got.contiguous().to_vector<float>();
  const std::vector<float> w = want.contiguous().to_vector<float>();
  int bad = 0;
  for (size_t i = 0; i < g.size(); ++i)
    if (!(std::fabs(g[i] - w[i]) <= 1e-5 * std::max(1.0f, std::fabs(w[i]))) && bad++ < 3)
      ADD_FAILURE() << what << "[" << i << "]: " << g[i] << " vs one process " << w[i];
}

void check_against_one_process(int64_t experts, int64_t top_k, double capacity) {
  auto world = comm::world();
  const int size = world->size(), rank = world->rank();
  if (experts % size != 0) GTEST_SKIP() << experts << " experts over " << size << " ranks";
  SCOPED_TRACE(::testing::Message() << experts << " experts, top-" << top_k << ", capacity "
                                    << capacity << ", " << size << " ranks");
  const int64_t c = 6, per_rank = 5, n = per_rank * size;
  nn::MoeOptions o;
  o.experts = experts;
  o.top_k = top_k;
  o.capacity_factor = capacity;
  o.aux_loss = 0.1;
  o.z_loss = 0.01;
  nn::MoE one(c, o);
  one.init_parameters(42);
  ExpertParallelMoE ep(c, o, world, world);
  ep.init_parameters(42);
  // Router weights of order 1 (the init's 0.02 would route nearly at random).
  Tensor router = values_of({experts, c}, 7);
  Tensor r1 = param(one, "router.weight"), r2 = param(ep, "router.weight");
  r1.copy_(router);
  r2.copy_(router);
  for (int64_t e = ep.first_expert(); e < ep.first_expert() + ep.local_experts(); ++e)
    for (const char* w : {"fc.weight", "fc.bias", "proj.weight", "proj.bias"}) {
      const std::string name = "experts." + std::to_string(e) + "." + w;
      EXPECT_EQ(param(ep, name).to_vector<float>(), param(one, name).to_vector<float>()) << name;
    }

  Tensor x_all = values_of({n, c}, 3), proj = values_of({n, c}, 5);
  Tensor x_one = x_all.clone(), x_mine = x_all.narrow(0, rank * per_rank, per_rank).clone();
  x_one.set_requires_grad(true);
  x_mine.set_requires_grad(true);
  Tensor out_one = one(x_one);
  Tensor out_mine = ep(x_mine);
  expect_close(out_mine, out_one.narrow(0, rank * per_rank, per_rank), "output");
  EXPECT_EQ(ep.stats().load, one.stats().load);
  EXPECT_EQ(ep.stats().dropped, one.stats().dropped);
  EXPECT_EQ(ep.stats().tokens, n);

  // The ranks' losses here add up to one process's (sums over their rows), so each rank adds
  // its share of the auxiliary losses: its term (aux_loss()) over the group's size.
  Tensor one_loss = add(sum(mul(out_one, proj)), one.aux_loss());
  Tensor my_loss = add(sum(mul(out_mine, proj.narrow(0, rank * per_rank, per_rank).contiguous())),
                       scale(ep.aux_loss(), 1.0 / double(world->size())));
  Tensor terms = Tensor::from_vector(std::vector<float>{float(ep.aux_loss().item())}, {1});
  world->allreduce_sync(terms, comm::ReduceOp::kAvg);
  EXPECT_NEAR(terms.item(), one.aux_loss().item(), 1e-6 * std::max(1.0, one.aux_loss().item()))
      << "the mean of the ranks' auxiliary loss terms is one process's losses";
  one_loss.backward();
  my_loss.backward();
  expect_close(x_mine.grad(), x_one.grad().narrow(0, rank * per_rank, per_rank), "input gradient");
  Tensor router_grad = param(ep, "router.weight").grad().clone();
  world->allreduce(router_grad)->wait();
  expect_close(router_grad, param(one, "router.weight").grad(), "router gradient (summed)");
  for (int64_t e = ep.first_expert(); e < ep.first_expert() + ep.local_experts(); ++e)
    for (const char* w : {"fc.weight", "fc.bias", "proj.weight", "proj.bias"}) {
      const std::string name = "experts." + std::to_string(e) + "." + w;
      const Tensor want = param(one, name).grad();
      const Tensor got = param(ep, name).grad();
      ASSERT_EQ(want.defined(), got.defined()) << name;
      if (want.defined()) expect_close(got, want, name + " gradient");
    }
}

TEST(ExpertParallel, DroplessTopOne) { check_against_one_process(4, 1, 0); }
TEST(ExpertParallel, DroplessTopTwo) { check_against_one_process(4, 2, 0); }
TEST(ExpertParallel, CapacityDropsWhatOneProcessDrops) {
  check_against_one_process(4, 2, 0.5);
  check_against_one_process(8, 1, 1.0);
}
TEST(ExpertParallel, EightExperts) { check_against_one_process(8, 2, 0); }

// Note [Dropless receive budget]: every token routed to expert 0 and a budget of 7.5 rows. The
// rank holding expert 0 would receive every rank's rows, so every rank falls back to the cap 7,
// as one process with the same budget does: the same outputs, gradients and drops.
TEST(ExpertParallel, OverTheReceiveBudgetEveryRankFallsBackAsOneProcess) {
  auto world = comm::world();
  const int size = world->size(), rank = world->rank();
  const int64_t c = 4, per_rank = 5, n = per_rank * size, experts = 2 * size;
  nn::MoeOptions o;
  o.experts = experts;
  o.receive_budget_mb = 7.5 * 22.0 * 4.0 * double(c) / (1024.0 * 1024.0);
  nn::MoE one(c, o);
  one.init_parameters(42);
  ExpertParallelMoE ep(c, o, world, world);
  ep.init_parameters(42);
  std::vector<float> w(static_cast<size_t>(experts * c), 0.0f);
  for (int64_t i = 0; i < c; ++i) w[size_t(i)] = 5.0f;  // expert 0's logit: 5 x sum(x)
  for (Tensor r : {param(one, "router.weight"), param(ep, "router.weight")})
    r.copy_(Tensor::from_vector(w, {experts, c}));
  Tensor x_all = add(scale(values_of({n, c}, 3), 0.4), Tensor::full({n, c}, 0.6));  // > 0
  Tensor x_one = x_all.clone(), x_mine = x_all.narrow(0, rank * per_rank, per_rank).clone();
  x_one.set_requires_grad(true);
  x_mine.set_requires_grad(true);
  Tensor out_one = one(x_one), out_mine = ep(x_mine);
  const int64_t cap = std::min<int64_t>(7, n);
  EXPECT_EQ(one.stats().budget_capacity, n > 7 ? cap : -1);
  EXPECT_EQ(ep.stats().budget_capacity, one.stats().budget_capacity);
  EXPECT_EQ(ep.stats().load, one.stats().load);
  EXPECT_EQ(ep.stats().dropped, n - cap);
  expect_close(out_mine, out_one.narrow(0, rank * per_rank, per_rank), "output");
  sum(mul(out_one, out_one)).backward();
  sum(mul(out_mine, out_mine)).backward();
  expect_close(x_mine.grad(), x_one.grad().narrow(0, rank * per_rank, per_rank), "input gradient");
  if (ep.first_expert() == 0)
    expect_close(param(ep, "experts.0.fc.weight").grad(), param(one, "experts.0.fc.weight").grad(),
                 "expert 0's gradient");
}

TEST(ExpertParallel, ExpertsMustSplitEvenly) {
  auto world = comm::world();
  if (world->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  nn::MoeOptions o;
  o.experts = world->size() + 1;
  try {
    ExpertParallelMoE ep(4, o, world, world);
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("do not split evenly"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::parallel
