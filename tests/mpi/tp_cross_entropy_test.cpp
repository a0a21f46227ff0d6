// Vocab-parallel cross-entropy against the single-process run (the equivalence principle): every
// rank builds the same full logits [N, Vp] from a fixed seed, takes its columns, and the loss and
// its slice of the gradient must equal core's cross_entropy on the full logits (within 1e-6
// relative in f32; within one bf16/f16 step of the gradient in low precision), on every rank count.
// Also: exactly 3 allreduces per call and none in backward; bad arguments and ranks that disagree
// are errors naming what was wrong, raised before any collective could hang.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "core/ops.h"
#include "core/rng.h"
#include "parallel/tensor_parallel/vocab_parallel_cross_entropy.h"

namespace loom::parallel {
namespace {

constexpr uint64_t kSeed = 1234;
constexpr int64_t kRows = 37;

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// The full logits [rows, padded]: mean + std * N(0, 1), the same on every rank.
std::vector<float> full_logits(int64_t rows, int64_t padded, double mean, double std,
                               uint64_t seed = kSeed) {
  Tensor t = Tensor::empty({rows, padded});
  rng::fill_normal(t, seed, "tp_cross_entropy.logits", mean, std);
  return t.to_vector<float>();
}

// Targets for `rows` rows over `vocab` classes split into `ranks` shards of `local` columns:
// rows 0-5 sit where shards meet (the first and last class, the first column of the last shard
// that holds classes, both sides of the middle boundary), row 6 and every 5th row are ignored,
// the rest spread by a simple LCG.
std::vector<int64_t> make_targets(int64_t rows, int64_t vocab, int64_t ranks, int64_t local,
                                  int64_t ignore_index) {
  std::vector<int64_t> t(static_cast<size_t>(rows));
  uint64_t s = 88172645463325252ull;
  for (int64_t r = 0; r < rows; ++r) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    t[size_t(r)] = int64_t((s >> 33) % uint64_t(vocab));
    if (r % 5 == 4) t[size_t(r)] = ignore_index;
  }
  const int64_t last_with_classes = (vocab - 1) / local;  // the rank that holds class vocab - 1
  const int64_t middle = std::min(vocab - 1, (ranks / 2) * local);
  const int64_t special[] = {
      0,           vocab - 1, last_with_classes * local, middle, std::max<int64_t>(middle - 1, 0),
      ignore_index};
  for (int64_t r = 0; r < std::min<int64_t>(rows, 6); ++r) t[size_t(r)] = special[r];
  return t;
}

Tensor targets_tensor(const std::vector<int64_t>& t, DType dtype) {
  Tensor i64 = Tensor::from_vector(t, {int64_t(t.size())});
  if (dtype == DType::kI64) return i64;
  std::vector<int32_t> t32(t.begin(), t.end());
  return Tensor::from_vector(t32, {int64_t(t.size())});
}

struct Problem {
  std::vector<float> logits;  // [rows, padded], f32 values (rounded to `dtype` before use)
  int64_t rows = 0;
  int64_t padded = 0;  // Vp: a multiple of the group size, >= vocab
  int64_t vocab = 0;
  Tensor targets;
  int64_t ignore_index = -100;
  DType dtype = DType::kF32;
};

struct Result {
  double loss = 0;
  Tensor grad;  // f32: [rows, padded] for the reference, [rows, V_local] for a rank
};

Tensor logits_tensor(const Problem& p) {
  return Tensor::from_vector(p.logits, {p.rows, p.padded}).to(p.dtype).detach();
}

// core's cross_entropy on the full logits, in one process.
Result single_process(const Problem& p) {
  Tensor logits = logits_tensor(p);
  logits.set_requires_grad(true);
  Tensor loss = cross_entropy(logits, p.targets, {p.ignore_index, p.vocab});
  loss.backward();
  EXPECT_EQ(logits.grad().dtype(), p.dtype);
  return {loss.item(), logits.grad().to(DType::kF32)};
}

// This rank's columns through vocab_parallel_cross_entropy, counting the collectives on `tp`.
Result tensor_parallel(const Problem& p, const std::shared_ptr<comm::Communicator>& tp) {
  const int64_t local = p.padded / tp->size();
  Tensor logits = logits_tensor(p).narrow(1, tp->rank() * local, local).contiguous().detach();
  logits.set_requires_grad(true);
  const uint64_t allreduces = tp->op_count("allreduce"), collectives = tp->sequence_number();
  Tensor loss = vocab_parallel_cross_entropy(logits, p.targets, tp, p.vocab, p.ignore_index);
  EXPECT_EQ(tp->op_count("allreduce") - allreduces, 3u) << "forward: exactly 3 allreduces";
  EXPECT_EQ(tp->sequence_number() - collectives, 3u) << "forward: no other collective";
  EXPECT_EQ(loss.dim(), 0) << "the loss is a scalar";
  EXPECT_EQ(loss.dtype(), DType::kF32) << "the loss is f32 whatever the logits' dtype";
  loss.backward();
  EXPECT_EQ(tp->sequence_number() - collectives, 3u) << "backward is local";
  EXPECT_EQ(logits.grad().dtype(), p.dtype) << "the gradient comes back in the logits' dtype";
  return {loss.item(), logits.grad().to(DType::kF32)};
}

// Every rank of `tp` holds bit-for-bit the same loss.
void expect_same_loss_on_every_rank(double loss, const std::shared_ptr<comm::Communicator>& tp) {
  Tensor v = Tensor::from_vector<float>({float(loss), -float(loss)}, {2});
  tp->allreduce_sync(v, comm::ReduceOp::kMax);
  const std::vector<float> r = v.to_vector<float>();
  EXPECT_EQ(r[0], -r[1]) << "the loss differs across the ranks of '" << tp->name() << "': from "
                         << -r[1] << " to " << r[0];
}

// Loss within 1e-6 relative; the rank's gradient columns equal the reference's within
// `grad_rtol` relative to their max-norm (f32), or element by element within `elem_rtol` of
// each value (low precision, where two f32 gradients may round to neighbouring values).
//
// Why 1e-6 holds for the gradient: both ops save each row's log-sum-exp in f32 and recompute the
// softmax from it. Summed in another order, a row's lse may round to the neighbouring f32, which
// moves that row's softmax by one ulp of lse relative: about 4.8e-7 for the lse in [4, 8) of most
// cases here (the largest difference seen), but 1e-3 for the lse near 1e4 of the large-logit case,
// which passes because no row's lse lands on the other side of a rounding boundary.
void expect_matches(const Problem& p, const std::shared_ptr<comm::Communicator>& tp,
                    double grad_rtol = 1e-6, double elem_rtol = 0) {
  const Result want = single_process(p);
  const Result got = tensor_parallel(p, tp);
  EXPECT_TRUE(std::isfinite(got.loss));
  EXPECT_LE(std::abs(got.loss - want.loss), 1e-6 * std::abs(want.loss))
      << "loss " << got.loss << " vs single-process " << want.loss;
  expect_same_loss_on_every_rank(got.loss, tp);

  const int64_t local = p.padded / tp->size(), start = tp->rank() * local;
  const std::vector<float> g = got.grad.to_vector<float>();
  const std::vector<float> ref = want.grad.narrow(1, start, local).to_vector<float>();
  ASSERT_EQ(g.size(), ref.size());
  double norm = 0, worst = 0;
  int64_t wrong = 0, worst_at = -1;
  const std::vector<int64_t> targets = p.targets.to(DType::kI64).to_vector<int64_t>();
  for (size_t i = 0; i < g.size(); ++i) norm = std::max(norm, std::abs(double(ref[i])));
  for (size_t i = 0; i < g.size(); ++i) {
    const double d = std::abs(double(g[i]) - double(ref[i]));
    if (d > worst) worst = d, worst_at = int64_t(i);
    const bool ok =
        elem_rtol > 0 ? d <= elem_rtol * std::abs(double(ref[i])) : d <= grad_rtol * norm;
    wrong += ok ? 0 : 1;
    // Padding columns and ignored rows: exactly zero.
    const int64_t r = int64_t(i) / local, c = start + int64_t(i) % local;
    if (c >= p.vocab || targets[size_t(r)] == p.ignore_index)
      EXPECT_EQ(g[i], 0.0f) << "row " << r << " col " << c;
  }
  EXPECT_EQ(wrong, 0) << wrong << " of " << g.size() << " gradient elements differ; worst " << worst
                      << " at row " << worst_at / local << ", column " << start + worst_at % local
                      << " (max-norm " << norm << ")";
}

Problem make_problem(int64_t vocab, int64_t padded, int64_t ranks, double mean = 0, double std = 2,
                     DType targets_dtype = DType::kI64, int64_t ignore_index = -100) {
  Problem p;
  p.rows = kRows;
  p.padded = padded;
  p.vocab = vocab;
  p.ignore_index = ignore_index;
  p.logits = full_logits(kRows, padded, mean, std);
  p.targets = targets_tensor(make_targets(kRows, vocab, ranks, padded / ranks, ignore_index),
                             targets_dtype);
  return p;
}

// A vocabulary of 257 (prime: never divisible) padded to a multiple of the group size, to that
// plus one column per rank, to 260 and 264 where they divide, and to a multiple of 64 * ranks
// (Megatron's make-vocab-size-divisible-by), where on 8 ranks the last three hold only padding.
TEST(VocabParallelCrossEntropy, PaddedVocabMatchesTheSingleProcessLoss) {
  auto world = comm::world();
  const int64_t n = world->size(), vocab = 257;
  std::vector<int64_t> paddings = {round_up(vocab, n), round_up(vocab, n) + n,
                                   round_up(vocab, 64 * n)};
  for (int64_t v : {260, 264})
    if (v % n == 0) paddings.push_back(v);
  std::sort(paddings.begin(), paddings.end());
  paddings.erase(std::unique(paddings.begin(), paddings.end()), paddings.end());
  for (int64_t padded : paddings) {
    SCOPED_TRACE(detail::str_cat(n, " ranks, vocab ", vocab, " padded to ", padded));
    expect_matches(make_problem(vocab, padded, n), world);
  }
}

// No padding; i32 targets and another ignore_index.
TEST(VocabParallelCrossEntropy, DivisibleVocabMatchesTheSingleProcessLoss) {
  auto world = comm::world();
  const int64_t n = world->size(), vocab = 37 * n;
  for (DType targets_dtype : {DType::kI64, DType::kI32}) {
    SCOPED_TRACE(
        detail::str_cat(n, " ranks, vocab ", vocab, ", targets ", dtype_name(targets_dtype)));
    expect_matches(make_problem(vocab, vocab, n, 0, 2, targets_dtype, -1), world);
  }
}

// Logits around 1e4 (exp would overflow without the max subtracted), a row around -1e4 (would
// underflow to 0), and outliers: a row's max on another rank than its target, on the target
// itself, and on the last rank holding classes.
TEST(VocabParallelCrossEntropy, LargeLogitsSubtractTheGlobalRowMax) {
  auto world = comm::world();
  const int64_t n = world->size(), vocab = 257, padded = round_up(vocab, n);
  Problem p = make_problem(vocab, padded, n, 1e4, 3);
  const std::vector<int64_t> t = p.targets.to_vector<int64_t>();
  auto at = [&](int64_t r, int64_t c) -> float& { return p.logits[size_t(r * padded + c)]; };
  for (int64_t c = 0; c < padded; ++c) at(7, c) -= 2e4f;  // row 7 around -1e4
  at(8, (t[8] + vocab / 2) % vocab) += 40;                // max far from the target
  at(9, t[9]) += 40;                                      // max on the target
  at(10, vocab - 1) += 25;                                // max on the last class
  at(11, 0) += 1e3f;                                      // one huge outlier
  for (int64_t r = 12; r < kRows; r += 3) at(r, (r * 31) % vocab) += float(5 * (r % 7));
  SCOPED_TRACE(detail::str_cat(n, " ranks, logits around 1e4"));
  expect_matches(p, world);
}

// Every target on the last rank that holds classes (its class columns only).
TEST(VocabParallelCrossEntropy, TargetsOnTheLastRank) {
  auto world = comm::world();
  const int64_t n = world->size(), vocab = 257, padded = round_up(vocab, n), local = padded / n;
  Problem p = make_problem(vocab, padded, n);
  const int64_t first = (vocab - 1) / local * local;  // the last shard's first column
  std::vector<int64_t> t(static_cast<size_t>(kRows));
  for (int64_t r = 0; r < kRows; ++r) t[size_t(r)] = first + r % (vocab - first);
  p.targets = targets_tensor(t, DType::kI64);
  SCOPED_TRACE(detail::str_cat(n, " ranks, targets in [", first, ", ", vocab, ")"));
  expect_matches(p, world);
}

// All rows ignored: loss 0 and zero gradients (core's convention), still 3 allreduces.
TEST(VocabParallelCrossEntropy, AllRowsIgnored) {
  auto world = comm::world();
  const int64_t n = world->size(), vocab = 257, padded = round_up(vocab, n);
  Problem p = make_problem(vocab, padded, n);
  p.targets = Tensor::full({kRows}, double(p.ignore_index), DType::kI64);
  const Result got = tensor_parallel(p, world);
  EXPECT_EQ(got.loss, 0.0);
  for (float g : got.grad.to_vector<float>()) ASSERT_EQ(g, 0.0f);
  EXPECT_EQ(single_process(p).loss, 0.0);
}

// An empty batch (N = 0): loss 0, like core's op; the three allreduces still run (of no rows).
TEST(VocabParallelCrossEntropy, EmptyBatch) {
  auto world = comm::world();
  const int64_t n = world->size(), vocab = 257, padded = round_up(vocab, n);
  Problem p = make_problem(vocab, padded, n);
  p.rows = 0;
  p.logits.clear();
  p.targets = Tensor::empty({0}, DType::kI64);
  const Result got = tensor_parallel(p, world);
  EXPECT_EQ(got.loss, 0.0);
  EXPECT_EQ(got.grad.numel(), 0);
  EXPECT_EQ(single_process(p).loss, 0.0);
}

// bf16 and f16 logits against core's op on the same low-precision logits: both compute in f32
// on the same upcast values, so the f32 loss agrees within 1e-6 relative; the f32 gradients agree
// within 1e-6 and are then rounded to the logits' dtype, where two such values can land one
// step apart: each element within one step of bf16 (2^-7 relative) or f16 (2^-10 relative).
TEST(VocabParallelCrossEntropy, LowPrecisionLogitsMatchTheSingleProcessOp) {
  auto world = comm::world();
  const int64_t n = world->size(), vocab = 257;
  for (auto [dtype, step] : {std::pair{DType::kBF16, 0x1p-7}, std::pair{DType::kF16, 0x1p-10}}) {
    for (int64_t padded : {round_up(vocab, n), round_up(vocab, 64 * n)}) {
      SCOPED_TRACE(detail::str_cat(n, " ranks, ", dtype_name(dtype), " logits, vocab ", vocab,
                                   " padded to ", padded));
      Problem p = make_problem(vocab, padded, n);
      p.dtype = dtype;
      expect_matches(p, world, 0, step);
    }
  }
}

// A tp group that is not the world: the world split into groups of 2 (of 1 on an odd world),
// each with its own data, as the tp groups of a [dp][tp] mesh. Only the group communicates.
TEST(VocabParallelCrossEntropy, WorksOnATensorParallelSubGroup) {
  auto world = comm::world();
  const int group_size = world->size() % 2 == 0 ? 2 : 1;
  const int group = world->rank() / group_size;
  auto tp = world->split(group, world->rank(), "tp");
  ASSERT_EQ(tp->size(), group_size);
  const int64_t vocab = 257, padded = round_up(vocab, group_size);
  Problem p = make_problem(vocab, padded, group_size);
  p.logits = full_logits(kRows, padded, 0, 2, kSeed + uint64_t(group));
  const uint64_t world_collectives = world->sequence_number();
  SCOPED_TRACE(detail::str_cat("tp group ", group, " of size ", group_size));
  expect_matches(p, tp);
  EXPECT_EQ(world->sequence_number(), world_collectives) << "nothing on the world";
}

// Runs `f` and expects a loom::Error whose message contains every one of `needles`, and that
// no collective was started on `tp` (so a rank's mistake can never leave the others waiting).
template <typename F>
void expect_error(const std::shared_ptr<comm::Communicator>& tp, F&& f,
                  const std::vector<std::string>& needles, uint64_t collectives = 0) {
  const uint64_t before = tp->sequence_number();
  try {
    f();
    ADD_FAILURE() << "expected an error mentioning '" << needles.front() << "'";
  } catch (const Error& e) {
    for (const std::string& s : needles)
      EXPECT_NE(std::string(e.what()).find(s), std::string::npos)
          << "'" << s << "' missing from: " << e.what();
  }
  EXPECT_EQ(tp->sequence_number() - before, collectives);
}

TEST(VocabParallelCrossEntropy, BadArgumentsAreNamedErrors) {
  auto world = comm::world();
  const int64_t n = world->size(), vocab = 257, padded = round_up(vocab, 8 * n), local = padded / n;
  const Problem p = make_problem(vocab, padded, n);
  const Tensor logits = logits_tensor(p).narrow(1, world->rank() * local, local).contiguous();
  auto call = [&](const Tensor& l, const Tensor& t, int64_t v) {
    return vocab_parallel_cross_entropy(l, t, world, v, p.ignore_index);
  };
  std::vector<int64_t> t = p.targets.to_vector<int64_t>();

  t[3] = vocab;  // a padding column, not a class
  expect_error(world, [&] { call(logits, targets_tensor(t, DType::kI64), vocab); },
               {"vocab_parallel_cross_entropy", "target 257 at row 3", "[0, 257)", "-100"});
  t[3] = -5;
  expect_error(world, [&] { call(logits, targets_tensor(t, DType::kI32), vocab); },
               {"target -5 at row 3", "not ignore_index"});
  // The logits' columns times the group size must cover the vocabulary.
  const int64_t too_big = local * n + 1;
  expect_error(world, [&] { call(logits, p.targets, too_big); },
               {detail::str_cat("vocab ", too_big, " is larger than the full logits"),
                detail::str_cat(local, " columns on each of the ", n, " ranks"),
                detail::str_cat("ceil(vocab / ", n, ") = ", local + 1)});
  expect_error(world, [&] { call(logits, p.targets, 0); }, {"vocab must be at least 1, got 0"});
  // Shapes and dtypes.
  expect_error(world, [&] { call(logits, p.targets.narrow(0, 0, kRows - 1), vocab); },
               {"'targets' must have shape [37]", "got [36]"});
  expect_error(world,
               [&] {
                 call(logits.reshape({1, kRows, local}), p.targets, vocab);
               },
               {"'logits' must be 2-D", detail::str_cat("[1, 37, ", local, "]")});
  expect_error(world, [&] { call(logits, p.targets.to(DType::kF32), vocab); },
               {"'targets' has dtype f32, expected i32 or i64"});
  expect_error(world, [&] { call(logits.to(DType::kI64), p.targets, vocab); },
               {"'logits' has dtype i64"});
  expect_error(world, [&] { vocab_parallel_cross_entropy(logits, p.targets, nullptr, vocab); },
               {"'tp' is null"});
}

// Ranks that pass different targets or different numbers of columns would each compute a
// different, silently wrong loss; instead every rank raises the same error after the first
// allreduce, which carries the check.
TEST(VocabParallelCrossEntropy, RanksThatDisagreeAreAnErrorOnEveryRank) {
  auto world = comm::world();
  if (world->size() == 1) GTEST_SKIP() << "needs 2 or more ranks";
  const int64_t n = world->size(), vocab = 257, padded = round_up(vocab, n) + n, local = padded / n;
  const Problem p = make_problem(vocab, padded, n);
  Tensor logits = logits_tensor(p).narrow(1, world->rank() * local, local).contiguous();

  std::vector<int64_t> t = p.targets.to_vector<int64_t>();
  if (world->rank() == n - 1) t[10] = (t[10] + 1) % vocab;
  expect_error(
      world,
      [&] { vocab_parallel_cross_entropy(logits, targets_tensor(t, DType::kI64), world, vocab); },
      {"ranks of group 'world' pass different targets"}, 1);

  if (world->rank() == 0) logits = logits_tensor(p).narrow(1, 0, local + 1).contiguous();
  expect_error(
      world, [&] { vocab_parallel_cross_entropy(logits, p.targets, world, vocab); },
      {"pass different numbers of logits columns (V_local)",
       detail::str_cat("(this rank: ", world->rank() == 0 ? local + 1 : local, ")")},
      1);
}

// Ranks that pass different N make the allreduces themselves differ: the collective checks (on
// unless LOOM_COMM_DEBUG=0) report it on every rank before anything hangs (without them, MPI's
// behaviour is undefined).
TEST(VocabParallelCrossEntropy, DifferentRowCountsAreCaughtInDebugMode) {
  auto world = comm::world();
  if (world->size() == 1) GTEST_SKIP() << "needs 2 or more ranks";
  const int64_t n = world->size(), vocab = 257, padded = round_up(vocab, n), local = padded / n;
  const Problem p = make_problem(vocab, padded, n);
  const int64_t rows = world->rank() == 0 ? kRows - 1 : kRows;
  const Tensor logits =
      logits_tensor(p).narrow(0, 0, rows).narrow(1, world->rank() * local, local).contiguous();
  const Tensor targets = p.targets.narrow(0, 0, rows).contiguous();
  const bool debug = world->debug();
  world->set_debug(true);
  expect_error(
      world, [&] { vocab_parallel_cross_entropy(logits, targets, world, vocab); },
      {"LOOM_COMM_DEBUG", "disagree on collective", detail::str_cat("count ", kRows - 1 + 8),
       detail::str_cat("count ", kRows + 8)},
      1);
  world->set_debug(debug);
}

}  // namespace
}  // namespace loom::parallel
