// Sharded embeddings against the single-process run (the equivalence principle): for every
// placement (table, row, column, data, mixed) and sum and mean pooling, each rank looks up its
// slice of a global batch (every rank builds the same global batch from a seed) and its output
// equals that slice of one nn::EmbeddingBagCollection's output on the whole batch; each shard's
// gradient equals its slice of the single-process gradient of the global-mean loss; after 3 SGD
// steps each shard equals its slice of the single-process table. All within 1e-5. The batches
// have empty bags, and table "b" has 3 rows (fewer than 4 ranks: some row shards are empty).
// Also: the fused optimizers (SGD, row-wise Adagrad, Adam: tables and their state), per-sample
// weights, and clear errors for bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <ostream>
#include <random>
#include <string>

#include "collectives/communicator.h"
#include "core/nn/embedding_bag_collection.h"
#include "core/ops.h"
#include "optimizer/sgd.h"
#include "parallel/sharded_embedding.h"

namespace loom::parallel {
namespace {

constexpr int64_t kLocalBags = 3;  // B per rank
constexpr uint64_t kSeed = 1234;
constexpr double kTol = 1e-5;

std::vector<nn::EmbeddingTableConfig> configs() {
  // Dims divide into multiples of 4 over 1, 2 and 4 ranks (column-wise).
  return {{"a", 10, 16}, {"b", 3, 16}, {"c", 20, 32}, {"d", 7, 16}};
}

struct Batch {
  std::vector<int64_t> indices, offsets;  // CSR feature-major
  std::vector<float> weights;             // one per index
};

// The global batch of step `step`: world * kLocalBags bags per table, lengths 0..4 (bag 0 of
// every table empty), the same on every rank.
Batch global_batch(int world, int step) {
  const auto cfg = configs();
  const int64_t bags = world * kLocalBags;
  std::mt19937_64 gen(kSeed + uint64_t(step));
  Batch b;
  b.offsets.push_back(0);
  for (const auto& t : cfg)
    for (int64_t k = 0; k < bags; ++k) {
      const int64_t n = k == 0 ? 0 : int64_t(gen() % 5);
      for (int64_t p = 0; p < n; ++p) {
        b.indices.push_back(int64_t(gen() % uint64_t(t.rows)));
        b.weights.push_back(float(gen() % 1000) / 500.0f - 1.0f);
      }
      b.offsets.push_back(int64_t(b.indices.size()));
    }
  return b;
}

// Rank r's bags [r * B, (r + 1) * B) of every table, rebased.
Batch local_slice(const Batch& g, int world, int rank) {
  const int64_t T = int64_t(configs().size()), bags = world * kLocalBags;
  Batch b;
  b.offsets.push_back(0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = rank * kLocalBags; k < (rank + 1) * kLocalBags; ++k) {
      for (int64_t p = g.offsets[size_t(t * bags + k)]; p < g.offsets[size_t(t * bags + k + 1)];
           ++p) {
        b.indices.push_back(g.indices[size_t(p)]);
        b.weights.push_back(g.weights[size_t(p)]);
      }
      b.offsets.push_back(int64_t(b.indices.size()));
    }
  return b;
}

Tensor i64(const std::vector<int64_t>& v) { return Tensor::from_vector(v, {int64_t(v.size())}); }
Tensor f32(const std::vector<float>& v) { return Tensor::from_vector(v, {int64_t(v.size())}); }

// The fixed random weights R of the loss mean over bags of sum(out * R): [bags, total_dim].
Tensor loss_weights(int64_t bags, int64_t total_dim) {
  std::mt19937_64 gen(99);
  std::vector<float> v(size_t(bags * total_dim));
  for (float& x : v) x = float(gen() % 2000) / 1000.0f - 1.0f;
  return Tensor::from_vector(v, {bags, total_dim});
}

double max_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  if (a.shape() != b.shape()) return 1e30;
  const std::vector<float> x = a.contiguous().to_vector<float>(),
                           y = b.contiguous().to_vector<float>();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(double(x[i]) - double(y[i])));
  return m;
}

// Each local parameter against its slice of the single-process tensor (value or gradient).
void expect_shards_match(const ShardedEmbeddingBagCollection& sharded,
                         const nn::EmbeddingBagCollection& full, bool grads, const char* what) {
  std::map<std::string, Tensor> ref;  // the parameters themselves, which hold the gradients
  for (const auto& [name, p] : full.named_parameters()) ref[name] = p;
  for (const auto& [name, p] : sharded.named_parameters()) {
    Tensor want = grads ? ref.at(name).grad() : ref.at(name);
    Tensor got = grads ? p.grad() : p;
    ASSERT_TRUE(want.defined() && got.defined()) << what << " " << name;
    if (const nn::ShardSpec* spec = sharded.parameter_shard(name))
      want = spec->slice_of(want.detach()).reshape(got.shape());
    EXPECT_LE(max_diff(got.detach(), want.detach()), kTol) << what << " of " << name;
  }
}

std::vector<EmbeddingPlacement> placements_for(const std::string& kind) {
  using S = EmbeddingSharding;
  if (kind == "mixed") return {{S::kTable}, {S::kRow}, {S::kColumn}, {S::kData}};
  S s = kind == "table"    ? S::kTable
        : kind == "row"    ? S::kRow
        : kind == "column" ? S::kColumn
                           : S::kData;
  return std::vector<EmbeddingPlacement>(configs().size(), EmbeddingPlacement{s});
}

struct Case {
  std::string placement;
  EmbeddingPooling pooling;
  bool weighted;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.placement << (c.pooling == EmbeddingPooling::kMean ? " mean" : " sum")
      << (c.weighted ? " weighted" : "");
}

class ShardedEmbeddingTest : public ::testing::TestWithParam<Case> {};

TEST_P(ShardedEmbeddingTest, MatchesSingleProcess) {
  const Case c = GetParam();
  auto world = comm::world();
  const int W = world->size(), r = world->rank();

  nn::EmbeddingBagCollectionOptions full_options;
  full_options.pooling = c.pooling;
  nn::EmbeddingBagCollection full(configs(), full_options);
  full.init_parameters(kSeed);
  ShardedEmbeddingOptions sharded_options;
  sharded_options.pooling = c.pooling;
  ShardedEmbeddingBagCollection sharded(configs(), placements_for(c.placement), world,
                                        sharded_options);
  sharded.init_parameters(kSeed);
  expect_shards_match(sharded, full, false, "init");

  optim::SgdOptions so;
  so.lr = 0.5;
  optim::SGD full_opt(full.parameters(), so);
  optim::SGD sharded_opt(sharded.parameters(), so);
  const int64_t total_dim = full.layout().total_dim(), bags = W * kLocalBags;
  const Tensor R = loss_weights(bags, total_dim);
  const Tensor R_local = R.narrow(0, r * kLocalBags, kLocalBags).contiguous();
  std::vector<Tensor> initial;  // the single-process tables, to show that training moved them
  for (const Tensor& p : full.parameters()) initial.push_back(p.detach().clone());

  for (int step = 0; step < 3; ++step) {
    const Batch g = global_batch(W, step), l = local_slice(g, W, r);
    Tensor out =
        full.lookup(i64(g.indices), i64(g.offsets), c.weighted ? f32(g.weights) : Tensor());
    scale(sum(mul(out, R)), 1.0 / double(bags)).backward();
    Tensor local =
        sharded.lookup(i64(l.indices), i64(l.offsets), c.weighted ? f32(l.weights) : Tensor());
    EXPECT_LE(max_diff(local.detach(), out.detach().narrow(0, r * kLocalBags, kLocalBags)), kTol)
        << "forward, step " << step;
    scale(sum(mul(local, R_local)), 1.0 / double(kLocalBags)).backward();
    sharded.finish_gradients();
    expect_shards_match(sharded, full, true, ("gradient, step " + std::to_string(step)).c_str());
    full_opt.step();
    sharded_opt.step();
    full_opt.zero_grad();
    sharded_opt.zero_grad();
  }
  expect_shards_match(sharded, full, false, "after 3 SGD steps");
  for (size_t t = 0; t < initial.size(); ++t)
    EXPECT_GT(max_diff(full.parameters()[t].detach(), initial[t]), 1e-3) << "table " << t;
}

// Fused optimizers (See Note [Sharded fused optimizers]): after 3 steps whose backwards update the
// tables in place, every shard and its optimizer state equal their slices of one
// nn::EmbeddingBagCollection with the same fused optimizer trained on the global batches.
struct FusedCase {
  std::string placement;
  EmbeddingOptimizer kind;
  EmbeddingPooling pooling;
  bool weighted;
};

void PrintTo(const FusedCase& c, std::ostream* os) {
  *os << c.placement << " optimizer " << int(c.kind)
      << (c.pooling == EmbeddingPooling::kMean ? " mean" : " sum")
      << (c.weighted ? " weighted" : "");
}

class ShardedEmbeddingFusedTest : public ::testing::TestWithParam<FusedCase> {};

TEST_P(ShardedEmbeddingFusedTest, MatchesSingleProcess) {
  const FusedCase c = GetParam();
  auto world = comm::world();
  const int W = world->size(), r = world->rank();
  kernels::EmbeddingOptimizerHyper h;
  h.kind = c.kind;
  h.lr = c.kind == EmbeddingOptimizer::kSgd ? 0.5f : 0.05f;
  h.weight_decay = 0.01f;
  nn::EmbeddingBagCollectionOptions full_options;
  full_options.pooling = c.pooling;
  full_options.fused = h;
  nn::EmbeddingBagCollection full(configs(), full_options);
  full.init_parameters(kSeed);
  ShardedEmbeddingOptions sharded_options;
  sharded_options.pooling = c.pooling;
  sharded_options.fused = h;
  ShardedEmbeddingBagCollection sharded(configs(), placements_for(c.placement), world,
                                        sharded_options);
  sharded.init_parameters(kSeed);
  std::vector<Tensor> initial;
  for (const Tensor& p : full.parameters()) initial.push_back(p.detach().clone());
  const int64_t total_dim = full.layout().total_dim(), bags = W * kLocalBags;
  const Tensor R = loss_weights(bags, total_dim);
  const Tensor R_local = R.narrow(0, r * kLocalBags, kLocalBags).contiguous();
  for (int step = 0; step < 3; ++step) {
    const Batch g = global_batch(W, step), l = local_slice(g, W, r);
    Tensor out =
        full.lookup(i64(g.indices), i64(g.offsets), c.weighted ? f32(g.weights) : Tensor());
    scale(sum(mul(out, R)), 1.0 / double(bags)).backward();
    Tensor local =
        sharded.lookup(i64(l.indices), i64(l.offsets), c.weighted ? f32(l.weights) : Tensor());
    EXPECT_LE(max_diff(local.detach(), out.detach().narrow(0, r * kLocalBags, kLocalBags)), kTol)
        << "forward, step " << step;
    scale(sum(mul(local, R_local)), 1.0 / double(kLocalBags)).backward();
    sharded.finish_gradients();  // nothing to do
    for (const Tensor& p : sharded.parameters()) EXPECT_FALSE(p.grad().defined());
  }
  expect_shards_match(sharded, full, false, "after 3 fused steps");
  EXPECT_EQ(sharded.fused_updates(), 3);
  const EmbeddingFusedOptimizer& f = *full.fused_optimizer();
  const EmbeddingBagLayout& L = full.layout();
  for (const EmbeddingTablePart& part : sharded.local_parts()) {
    const int64_t t = part.table, rows = L.rows(t), dim = L.dim(t);
    EXPECT_LE(max_diff(part.weight.detach(), full.weights()[size_t(t)]
                                                 .detach()
                                                 .narrow(0, part.row_start, part.rows)
                                                 .narrow(1, part.col_start, part.cols)),
              kTol)
        << "table " << t;
    if (c.kind == EmbeddingOptimizer::kRowwiseAdagrad) {
      ASSERT_TRUE(part.momentum1.defined());
      EXPECT_LE(max_diff(part.momentum1,
                         f.momentum1.narrow(0, L.row_offset(t) + part.row_start, part.rows)),
                kTol)
          << "accumulators of table " << t;
    }
    if (c.kind == EmbeddingOptimizer::kAdam) {
      for (const auto& [mine, theirs] :
           {std::pair{part.momentum1, f.momentum1}, std::pair{part.momentum2, f.momentum2}}) {
        ASSERT_TRUE(mine.defined());
        const Tensor want = theirs.narrow(0, L.weight_offset(t), rows * dim)
                                .reshape({rows, dim})
                                .narrow(0, part.row_start, part.rows)
                                .narrow(1, part.col_start, part.cols);
        EXPECT_LE(max_diff(mine, want), kTol) << "moments of table " << t;
      }
    }
  }
  for (size_t t = 0; t < initial.size(); ++t)
    EXPECT_GT(max_diff(full.parameters()[t].detach(), initial[t]), 1e-3) << "table " << t;
}

std::string fused_case_name(const ::testing::TestParamInfo<FusedCase>& info) {
  const char* kind = info.param.kind == EmbeddingOptimizer::kSgd              ? "sgd"
                     : info.param.kind == EmbeddingOptimizer::kRowwiseAdagrad ? "rowwise_adagrad"
                                                                              : "adam";
  return info.param.placement + "_" + kind +
         (info.param.pooling == EmbeddingPooling::kMean ? "_mean" : "_sum") +
         (info.param.weighted ? "_weighted" : "");
}

std::vector<FusedCase> fused_cases() {
  std::vector<FusedCase> out;
  for (const char* placement : {"table", "row", "column", "data", "mixed"})
    for (EmbeddingOptimizer kind :
         {EmbeddingOptimizer::kSgd, EmbeddingOptimizer::kRowwiseAdagrad, EmbeddingOptimizer::kAdam})
      out.push_back({placement, kind, EmbeddingPooling::kSum, false});
  out.push_back({"mixed", EmbeddingOptimizer::kRowwiseAdagrad, EmbeddingPooling::kMean, false});
  out.push_back({"mixed", EmbeddingOptimizer::kAdam, EmbeddingPooling::kSum, true});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Optimizers, ShardedEmbeddingFusedTest, ::testing::ValuesIn(fused_cases()),
                         fused_case_name);

// One lookup of the mixed placement (table, row, column, data) communicates as the header says.
TEST(ShardedEmbedding, MixedPlacementCollectives) {
  auto world = comm::world();
  const int W = world->size(), r = world->rank();
  ShardedEmbeddingBagCollection sharded(configs(), placements_for("mixed"), world);
  sharded.init_parameters(kSeed);
  const Batch l = local_slice(global_batch(W, 0), W, r);
  auto count = [&](const char* op) { return world->op_count(op); };
  const uint64_t a2a = count("all_to_all"), rs = count("reduce_scatter"), ag = count("allgather"),
                 ar = count("allreduce");
  Tensor out = sharded.lookup(i64(l.indices), i64(l.offsets));
  // Split sizes, lengths + indices, pooled blocks; row-wise partial sums.
  EXPECT_EQ(count("all_to_all") - a2a, 3u);
  EXPECT_EQ(count("reduce_scatter") - rs, 1u);
  sum(out).backward();
  EXPECT_EQ(count("all_to_all") - a2a, 4u);  // output gradients to the owners
  EXPECT_EQ(count("allgather") - ag, 1u);    // row-wise output gradients
  sharded.finish_gradients();
  EXPECT_EQ(count("allreduce") - ar, W > 1 ? 1u : 0u);  // data-parallel table "d"
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return info.param.placement + (info.param.pooling == EmbeddingPooling::kMean ? "_mean" : "_sum") +
         (info.param.weighted ? "_weighted" : "");
}

INSTANTIATE_TEST_SUITE_P(Placements, ShardedEmbeddingTest,
                         ::testing::Values(Case{"table", EmbeddingPooling::kSum, false},
                                           Case{"table", EmbeddingPooling::kMean, false},
                                           Case{"row", EmbeddingPooling::kSum, false},
                                           Case{"row", EmbeddingPooling::kMean, false},
                                           Case{"column", EmbeddingPooling::kSum, false},
                                           Case{"column", EmbeddingPooling::kMean, false},
                                           Case{"data", EmbeddingPooling::kSum, false},
                                           Case{"data", EmbeddingPooling::kMean, false},
                                           Case{"mixed", EmbeddingPooling::kSum, false},
                                           Case{"mixed", EmbeddingPooling::kMean, false},
                                           Case{"mixed", EmbeddingPooling::kSum, true}),
                         case_name);

TEST(ShardedEmbedding, GreedyTablePlacementBalances) {
  auto world = comm::world();
  const int W = world->size();
  // Sizes 8, 4, 2, 1 (x 100 rows x dim 4): largest first to the least loaded rank.
  std::vector<nn::EmbeddingTableConfig> cfg{
      {"p", 100, 4}, {"q", 800, 4}, {"r", 200, 4}, {"s", 400, 4}};
  ShardedEmbeddingBagCollection sharded(
      cfg, std::vector<EmbeddingPlacement>(4, {EmbeddingSharding::kTable}), world);
  const auto& p = sharded.placements();
  EXPECT_EQ(p[1].rank, 0);  // q, the largest
  EXPECT_EQ(p[3].rank, W > 1 ? 1 : 0);
  EXPECT_EQ(p[2].rank, W > 2 ? 2 : (W == 2 ? 1 : 0));
  // Every table has exactly one owner, and each rank registers only its own tables.
  int mine = 0;
  for (int t = 0; t < 4; ++t) mine += p[size_t(t)].rank == world->rank() ? 1 : 0;
  EXPECT_EQ(int64_t(sharded.parameters().size()), mine);
}

TEST(ShardedEmbedding, DifferentBatchSizesAreAnError) {
  auto world = comm::world();
  const int W = world->size(), r = world->rank();
  if (W == 1) GTEST_SKIP() << "needs two ranks";
  ShardedEmbeddingBagCollection sharded(configs(), placements_for("mixed"), world);
  const int64_t B = r == 0 ? 2 : 3, T = int64_t(configs().size());
  std::vector<int64_t> offsets(size_t(T * B + 1), 0);  // all bags empty
  try {
    sharded.lookup(i64({}), i64(offsets));
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("different batch sizes"), std::string::npos) << e.what();
  }
}

TEST(ShardedEmbedding, ColumnSplitNotMultipleOf4IsAnError) {
  auto world = comm::world();
  if (world->size() == 1) GTEST_SKIP() << "one rank never splits columns";
  // dim 4 over >= 2 ranks: parts of 2 or 1 columns.
  try {
    ShardedEmbeddingBagCollection sharded({{"x", 10, 4}}, {{EmbeddingSharding::kColumn}}, world);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiples of 4"), std::string::npos) << e.what();
  }
}

TEST(ShardedEmbedding, WrongPlacementCountIsAnError) {
  auto world = comm::world();
  try {
    ShardedEmbeddingBagCollection sharded(configs(), {{EmbeddingSharding::kRow}}, world);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1 placements for 4 tables"), std::string::npos)
        << e.what();
  }
}

TEST(ShardedEmbedding, TableOwnerOutOfRangeIsAnError) {
  auto world = comm::world();
  EXPECT_THROW(ShardedEmbeddingBagCollection(configs(),
                                             {{EmbeddingSharding::kTable, world->size()},
                                              {EmbeddingSharding::kData},
                                              {EmbeddingSharding::kData},
                                              {EmbeddingSharding::kData}},
                                             world),
               Error);
}

}  // namespace
}  // namespace loom::parallel
