// The CUDA loss and lookup kernels against their CPU twins: fused softmax-cross-entropy
// (kernels/cuda/cross_entropy.h), the stages of vocab-parallel cross-entropy
// (kernels/cuda/vocab_parallel_cross_entropy.h) and the embedding lookup
// (kernels/cuda/embedding.h). The same random inputs (fixed seeds) go through both sides and every
// output element is compared. Skips without a GPU, and when loom was built without CUDA.
//
// Tolerances (f32 arithmetic on both sides; only the order of additions and the exp
// implementations differ):
// - a log-sum-exp (lse) within 1e-5 * (1 + |lse|): the sum of exponentials agrees to ~1e-7
//   relative, which moves its log by ~1e-7, and f32 rounding of lse adds half an ulp of |lse|;
// - a loss sum within 1e-5 times the sum of |lse| + |target logit| over counted rows (the sum of
//   |terms|); counts exactly;
// - a sum of exponentials within 1e-5 relative (all terms are positive);
// - a gradient element within 1e-5 * mag, mag = |softmax * scale| (+ |scale| at the target):
//   the backward is fed the CPU's lse, so only expf's last bits differ;
// - bf16 gradients: the GPU rounds its f32 gradient once, the expected value is the CPU's f32
//   gradient rounded once; two f32 values within 1e-5 * mag can round to neighbouring bf16 values,
//   one bf16 ulp apart, and a bf16 ulp is at most 2^-7 of the value (8 significant bits), so
//   (2^-7 + 1e-5) * mag;
// - the embedding lookup exactly (a copy), and its backward bit for bit: the CPU and the GPU add
//   the same f32 values in the same order (Note [Deterministic CUDA embedding lookup backward]);
// - the mean and gradient-scale helpers exactly against the same formula in double on the host.
// Padded columns and ignored rows must be exactly zero. Where determinism is promised, two runs
// must give the same bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/vocab_parallel_cross_entropy.h"
#include "kernels/cuda/runtime.h"
#include "kernels/numeric.h"
#include "testing/device_buffer.h"

#if LOOM_WITH_CUDA
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/vocab_parallel_cross_entropy.h"
#endif

namespace loom::kernels {
namespace {

#if !LOOM_WITH_CUDA

TEST(CudaLoss, NeedsCuda) {
  GTEST_SKIP() << "loom was built without CUDA (LOOM_WITH_CUDA=0): no CUDA kernels to test";
}

#else

constexpr cuda::Stream kStream = nullptr;  // the legacy default stream: ordered with the copies
constexpr double kRtol = 1e-5;
constexpr double kBf16Rtol = 1.0 / 128 + kRtol;  // one bf16 ulp (2^-7 of the value) + f32's
constexpr double kTiny = 1e-30;                  // absolute floor (exp's denormal results)

// ---------------------------------------------------------------- device memory

using Buffer = ::loom::testing::DeviceBuffer;

// ---------------------------------------------------------------- values

template <typename T>
constexpr bool kIsBf16 = std::is_same_v<T, BFloat16>;

template <typename T>
const char* type_name() {
  if constexpr (kIsBf16<T>) return "bf16";
  if constexpr (std::is_same_v<T, float>) return "f32";
  if constexpr (std::is_same_v<T, int32_t>) return "int32";
  return "int64";
}

float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

// v in T (bf16: rounded to nearest even).
template <typename T>
std::vector<T> to_type(const std::vector<float>& v) {
  std::vector<T> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if constexpr (kIsBf16<T>)
      out[i] = float_to_bf16(v[i]);
    else
      out[i] = v[i];
  }
  return out;
}

template <typename T>
std::vector<float> to_f32(const std::vector<T>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if constexpr (kIsBf16<T>)
      out[i] = bf16_to_float(v[i]);
    else
      out[i] = float(v[i]);
  }
  return out;
}

template <typename I>
std::vector<I> to_index(const std::vector<int64_t>& v) {
  return std::vector<I>(v.begin(), v.end());
}

std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> value(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = value(gen);
  return v;
}

// Where element i of a [rows, cols] array is, for messages.
std::function<std::string(size_t)> at_row_col(int64_t cols) {
  return [cols](size_t i) {
    const int64_t c = cols > 0 ? cols : 1;
    return "[" + std::to_string(int64_t(i) / c) + ", " + std::to_string(int64_t(i) % c) + "]";
  };
}
std::string at_index(size_t i) { return "[" + std::to_string(i) + "]"; }

// Counts the i with |got - want| > tol[i] (NaN counts); reports the first five.
int64_t count_mismatches(const std::vector<float>& got, const std::vector<float>& want,
                         const std::vector<double>& tol,
                         const std::function<std::string(size_t)>& where, const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  if (got.size() != want.size()) return 1;
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double diff = std::fabs(double(got[i]) - double(want[i]));
    if (!(diff <= tol[i]) && bad++ < 5)
      ADD_FAILURE() << what << where(i) << ": cuda " << got[i] << ", cpu " << want[i] << " (diff "
                    << diff << ", tolerance " << tol[i] << ")";
  }
  return bad;
}

// Counts the elements whose bytes differ; reports the first five.
template <typename T>
int64_t count_bit_differences(const std::vector<T>& got, const std::vector<T>& want,
                              const std::function<std::string(size_t)>& where,
                              const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  if (got.size() != want.size()) return 1;
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && bad++ < 5) {
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
        ADD_FAILURE() << what << where(i) << ": " << got[i] << " vs " << want[i]
                      << " (bits differ)";
      else
        ADD_FAILURE() << what << where(i) << ": bits differ";
    }
  return bad;
}

// lse tolerance: see the top of the file.
std::vector<double> lse_tolerance(const std::vector<float>& lse) {
  std::vector<double> tol(lse.size());
  for (size_t r = 0; r < lse.size(); ++r) tol[r] = kRtol * (1.0 + std::fabs(double(lse[r])));
  return tol;
}

// The gradient's tolerance for rows of logits x [rows, cols] (f32 values as the kernels read
// them), the CPU's lse, targets (local column = target - offset) and scale; 0 where the gradient
// must be exactly 0.
std::vector<double> grad_tolerance(const std::vector<float>& x, const std::vector<int64_t>& targets,
                                   const std::vector<float>& lse, float scale, int64_t rows,
                                   int64_t cols, int64_t classes, int64_t offset,
                                   int64_t ignore_index, double rtol) {
  std::vector<double> tol(x.size(), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[size_t(r)] == ignore_index) continue;
    for (int64_t c = 0; c < classes; ++c) {
      double mag = std::fabs(std::exp(double(x[size_t(r * cols + c)]) - double(lse[size_t(r)])) *
                             double(scale));
      if (c == targets[size_t(r)] - offset) mag += std::fabs(double(scale));
      tol[size_t(r * cols + c)] = rtol * mag + kTiny;
    }
  }
  return tol;
}

// ---------------------------------------------------------------- cross-entropy

struct CeCase {
  int64_t rows = 1, cols = 1, classes = 1;
  int64_t ignore_index = -100;
  double ignored = 0.2;  // the fraction of rows whose target is ignore_index
  uint64_t seed = 1;
};

std::string describe(const CeCase& k) {
  return "rows " + std::to_string(k.rows) + " cols " + std::to_string(k.cols) + " classes " +
         std::to_string(k.classes) + " ignore_index " + std::to_string(k.ignore_index) +
         " ignored " + std::to_string(k.ignored) + " seed " + std::to_string(k.seed);
}

// Logits with a random offset per row (so the max subtraction matters) and spread 4; padded
// columns hold huge values a kernel must not read as classes. bf16: rounded, as the kernels read.
std::vector<float> random_logits(int64_t rows, int64_t cols, int64_t classes, uint64_t seed,
                                 bool bf16) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> offset(-20.0f, 20.0f), spread(-4.0f, 4.0f);
  std::vector<float> x(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float o = offset(gen);
    for (int64_t c = 0; c < cols; ++c) {
      const float v = c < classes ? o + spread(gen) : 1000.0f + spread(gen);
      x[size_t(r * cols + c)] = bf16 ? round_bf16(v) : v;
    }
  }
  return x;
}

std::vector<int64_t> random_targets(int64_t rows, int64_t lo, int64_t hi, int64_t ignore_index,
                                    double ignored, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int64_t> target(lo, hi - 1);
  std::bernoulli_distribution skip(ignored);
  std::vector<int64_t> t(static_cast<size_t>(rows));
  for (int64_t& v : t) v = skip(gen) || hi <= lo ? ignore_index : target(gen);
  return t;
}

// What the CUDA forward wrote.
struct CeForward {
  std::vector<float> lse;
  double loss_sum = 0.0;
  int64_t count = 0;
  float mean = 0.0f;
};

template <typename T, typename I>
CeForward run_cuda_forward(const Buffer& logits, const Buffer& targets,
                           const cpu::CrossEntropyShape& shape) {
  Buffer lse(size_t(shape.rows) * sizeof(float)), sum(sizeof(double)), count(sizeof(int64_t)),
      mean(sizeof(float));
  lse.poison();
  sum.poison();
  count.poison();
  mean.poison();
  cuda::cross_entropy_forward(logits.as<T>(), targets.as<I>(), lse.as<float>(), shape,
                              sum.as<double>(), count.as<int64_t>(), kStream);
  cuda::cross_entropy_mean(sum.as<double>(), count.as<int64_t>(), mean.as<float>(), kStream);
  CeForward f;
  f.lse = lse.read<float>(size_t(shape.rows));
  f.loss_sum = sum.read_one<double>();
  f.count = count.read_one<int64_t>();
  f.mean = mean.read_one<float>();
  return f;
}

template <typename T, typename I>
std::vector<T> run_cuda_backward(const Buffer& logits, const Buffer& targets, const Buffer& lse,
                                 const Buffer& scale, const cpu::CrossEntropyShape& shape) {
  const size_t n = size_t(shape.rows * shape.cols);
  Buffer d(n * sizeof(T));
  d.poison();
  cuda::cross_entropy_backward(logits.as<T>(), targets.as<I>(), lse.as<float>(), scale.as<float>(),
                               d.as<T>(), shape, kStream);
  return d.read<T>(n);
}

// The host's formulas for the two helpers (cross_entropy.h).
float host_mean(double sum, int64_t count) { return count > 0 ? float(sum / double(count)) : 0.0f; }
float host_grad_scale(float grad, int64_t count) {
  return count > 0 ? float(double(grad) / double(count)) : 0.0f;
}

template <typename T, typename I>
void check_cross_entropy(const CeCase& k) {
  const std::string label =
      describe(k) + " logits " + type_name<T>() + " targets " + type_name<I>();
  SCOPED_TRACE(label);
  const cpu::CrossEntropyShape shape{k.rows, k.cols, k.classes, k.ignore_index};
  const std::vector<float> x = random_logits(k.rows, k.cols, k.classes, k.seed, kIsBf16<T>);
  const std::vector<int64_t> t64 =
      random_targets(k.rows, 0, k.classes, k.ignore_index, k.ignored, k.seed + 1);
  const std::vector<I> t = to_index<I>(t64);

  // CPU, f32 on the values the GPU reads.
  std::vector<float> cpu_lse(size_t(k.rows));
  int64_t cpu_count = -1;
  const double cpu_sum =
      cpu::cross_entropy_forward(x.data(), t.data(), cpu_lse.data(), shape, &cpu_count);

  // Forward.
  const Buffer dx(to_type<T>(x)), dt(t);
  const CeForward gpu = run_cuda_forward<T, I>(dx, dt, shape);
  EXPECT_EQ(count_mismatches(gpu.lse, cpu_lse, lse_tolerance(cpu_lse), at_index, "lse"), 0);
  ASSERT_EQ(gpu.count, cpu_count) << "counted rows";
  double mag = 0.0;
  for (int64_t r = 0; r < k.rows; ++r)
    if (t64[size_t(r)] != k.ignore_index)
      mag += std::fabs(double(cpu_lse[size_t(r)])) +
             std::fabs(double(x[size_t(r * k.cols + t64[size_t(r)])]));
  EXPECT_LE(std::fabs(gpu.loss_sum - cpu_sum), kRtol * mag + kTiny)
      << "loss sum: cuda " << gpu.loss_sum << ", cpu " << cpu_sum << " (sum of |terms| " << mag
      << ")";
  EXPECT_EQ(gpu.mean, host_mean(gpu.loss_sum, gpu.count))
      << "cross_entropy_mean of " << gpu.loss_sum << " / " << gpu.count;
  if (cpu_count == 0) {
    EXPECT_EQ(gpu.loss_sum, 0.0);
    EXPECT_EQ(gpu.mean, 0.0f);
  }

  // The same bits on a second run.
  const CeForward again = run_cuda_forward<T, I>(dx, dt, shape);
  EXPECT_EQ(count_bit_differences(again.lse, gpu.lse, at_index, "lse, second run"), 0);
  EXPECT_EQ(std::memcmp(&again.loss_sum, &gpu.loss_sum, sizeof(double)), 0)
      << "loss sum, second run: " << again.loss_sum << " vs " << gpu.loss_sum;

  // Backward, from the CPU's lse (so only the backward is compared) and a device scale.
  const float grad_loss = 0.75f;
  Buffer grad(std::vector<float>{grad_loss}), dcount(std::vector<int64_t>{gpu.count}),
      scale(sizeof(float));
  scale.poison();
  cuda::cross_entropy_grad_scale(grad.as<float>(), dcount.as<int64_t>(), scale.as<float>(),
                                 kStream);
  const float s = scale.read_one<float>();
  ASSERT_EQ(s, host_grad_scale(grad_loss, gpu.count)) << "cross_entropy_grad_scale";

  std::vector<float> cpu_d(x.size());
  cpu::cross_entropy_backward(x.data(), t.data(), cpu_lse.data(), s, cpu_d.data(), shape);
  if constexpr (kIsBf16<T>)
    for (float& v : cpu_d) v = round_bf16(v);
  const Buffer dlse(cpu_lse);
  const std::vector<T> gpu_d = run_cuda_backward<T, I>(dx, dt, dlse, scale, shape);
  const std::vector<double> tol = grad_tolerance(x, t64, cpu_lse, s, k.rows, k.cols, k.classes, 0,
                                                 k.ignore_index, kIsBf16<T> ? kBf16Rtol : kRtol);
  EXPECT_EQ(count_mismatches(to_f32(gpu_d), cpu_d, tol, at_row_col(k.cols), "dlogits"), 0);
  const std::vector<T> gpu_d2 = run_cuda_backward<T, I>(dx, dt, dlse, scale, shape);
  EXPECT_EQ(count_bit_differences(gpu_d2, gpu_d, at_row_col(k.cols), "dlogits, second run"), 0);
}

template <typename T>
void check_cross_entropy_both_index_types(const CeCase& k) {
  check_cross_entropy<T, int32_t>(k);
  CeCase k64 = k;
  ++k64.seed;
  check_cross_entropy<T, int64_t>(k64);
}

// Shapes: tiny, odd, not multiples of 32, padded (classes < cols), GPT-2's padded vocabulary, more
// rows than the summing block has threads, more rows than the grid has blocks.
std::vector<CeCase> cross_entropy_cases() {
  std::vector<CeCase> cases;
  const int64_t shapes[][3] = {{1, 1, 1},         {3, 17, 17},    {5, 32, 31},
                               {17, 127, 100},    {33, 769, 769}, {7, 1000, 999},
                               {4, 50304, 50257}, {1500, 67, 64}, {70000, 3, 3}};
  uint64_t seed = 100;
  for (const auto& s : shapes) {
    CeCase k;
    k.rows = s[0];
    k.cols = s[1];
    k.classes = s[2];
    k.seed = seed += 10;
    cases.push_back(k);
  }
  return cases;
}

TEST(CudaCrossEntropy, MatchesCpuF32) {
  LOOM_SKIP_WITHOUT_CUDA();
  for (const CeCase& k : cross_entropy_cases()) check_cross_entropy_both_index_types<float>(k);
}

TEST(CudaCrossEntropy, MatchesCpuBf16) {
  LOOM_SKIP_WITHOUT_CUDA();
  for (const CeCase& k : cross_entropy_cases()) check_cross_entropy_both_index_types<BFloat16>(k);
}

TEST(CudaCrossEntropy, IgnoredRows) {
  LOOM_SKIP_WITHOUT_CUDA();
  CeCase k;
  k.rows = 40;
  k.cols = 50;
  k.classes = 45;
  k.seed = 7;
  // No row ignored; most rows ignored; an ignore_index that is also a class id.
  for (double ignored : {0.0, 0.9}) {
    k.ignored = ignored;
    check_cross_entropy_both_index_types<float>(k);
  }
  k.ignored = 0.3;
  k.ignore_index = 2;
  check_cross_entropy_both_index_types<float>(k);
  check_cross_entropy_both_index_types<BFloat16>(k);
}

TEST(CudaCrossEntropy, AllRowsIgnoredGiveZeroLossAndGradient) {
  LOOM_SKIP_WITHOUT_CUDA();
  CeCase k;
  k.rows = 9;
  k.cols = 33;
  k.classes = 30;
  k.ignored = 1.0;
  check_cross_entropy_both_index_types<float>(k);  // checks count 0, sum 0, mean 0, scale 0
  check_cross_entropy_both_index_types<BFloat16>(k);
}

TEST(CudaCrossEntropy, NoRowsWritesZeroSlots) {
  LOOM_SKIP_WITHOUT_CUDA();
  const cpu::CrossEntropyShape shape{0, 5, 5, -100};
  Buffer logits(0), targets(0), lse(0), sum(sizeof(double)), count(sizeof(int64_t)), dlogits(0),
      scale(std::vector<float>{1.0f});
  sum.poison();
  count.poison();
  cuda::cross_entropy_forward(logits.as<float>(), targets.as<int32_t>(), lse.as<float>(), shape,
                              sum.as<double>(), count.as<int64_t>(), kStream);
  EXPECT_EQ(sum.read_one<double>(), 0.0);
  EXPECT_EQ(count.read_one<int64_t>(), 0);
  cuda::cross_entropy_backward(logits.as<float>(), targets.as<int32_t>(), lse.as<float>(),
                               scale.as<float>(), dlogits.as<float>(), shape, kStream);
  cuda_rt::synchronize(0);
}

TEST(CudaCrossEntropy, HelpersFollowTheCpuFormulas) {
  LOOM_SKIP_WITHOUT_CUDA();
  const std::pair<double, int64_t> sums[] = {
      {0.0, 0}, {5.0, 0}, {10.75, 3}, {1e7 / 3.0, 7}, {-2.5, 1}};
  for (const auto& [sum, count] : sums) {
    Buffer dsum(std::vector<double>{sum}), dcount(std::vector<int64_t>{count}), out(sizeof(float));
    out.poison();
    cuda::cross_entropy_mean(dsum.as<double>(), dcount.as<int64_t>(), out.as<float>(), kStream);
    EXPECT_EQ(out.read_one<float>(), host_mean(sum, count)) << sum << " / " << count;
    Buffer dgrad(std::vector<float>{float(sum)});
    out.poison();
    cuda::cross_entropy_grad_scale(dgrad.as<float>(), dcount.as<int64_t>(), out.as<float>(),
                                   kStream);
    EXPECT_EQ(out.read_one<float>(), host_grad_scale(float(sum), count)) << sum << " / " << count;
  }
}

TEST(CudaCrossEntropy, RejectsMoreClassesThanColumns) {
  LOOM_SKIP_WITHOUT_CUDA();
  const cpu::CrossEntropyShape shape{2, 4, 5, -100};
  Buffer logits(8 * sizeof(float)), targets(2 * sizeof(int64_t)), lse(2 * sizeof(float)),
      sum(sizeof(double)), count(sizeof(int64_t));
  try {
    cuda::cross_entropy_forward(logits.as<float>(), targets.as<int64_t>(), lse.as<float>(), shape,
                                sum.as<double>(), count.as<int64_t>(), kStream);
    ADD_FAILURE() << "num_classes 5 > cols 4 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_classes"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------- vocab-parallel cross-entropy

struct VpCase {
  int64_t rows = 1, vocab = 1, ranks = 1, cols = 1;  // cols per rank; cols * ranks >= vocab
  int64_t ignore_index = -100;
  double ignored = 0.2;
  uint64_t seed = 1;
};

std::string describe(const VpCase& k) {
  return "rows " + std::to_string(k.rows) + " vocab " + std::to_string(k.vocab) + " ranks " +
         std::to_string(k.ranks) + " cols " + std::to_string(k.cols) + " seed " +
         std::to_string(k.seed);
}

// Each stage on every rank's shard, CUDA against CPU on the same inputs; the allreduces between
// the stages are done on the host with the CPU's values, so every stage is compared alone.
template <typename T, typename I>
void check_vocab_parallel(const VpCase& k) {
  SCOPED_TRACE(describe(k) + " logits " + type_name<T>() + " targets " + type_name<I>());
  const int64_t full = k.cols * k.ranks;
  const std::vector<float> x = random_logits(k.rows, full, k.vocab, k.seed, kIsBf16<T>);
  const std::vector<int64_t> t64 =
      random_targets(k.rows, 0, k.vocab, k.ignore_index, k.ignored, k.seed + 1);
  const std::vector<I> t = to_index<I>(t64);
  const Buffer dt(t);
  const size_t rows = size_t(k.rows);

  std::vector<cpu::VocabParallelCrossEntropyShape> shapes;
  std::vector<std::vector<float> > shards;
  for (int64_t q = 0; q < k.ranks; ++q) {
    cpu::VocabParallelCrossEntropyShape s;
    s.rows = k.rows;
    s.cols = k.cols;
    s.start = q * k.cols;
    s.local_classes = std::clamp<int64_t>(k.vocab - s.start, 0, k.cols);
    s.ignore_index = k.ignore_index;
    shapes.push_back(s);
    std::vector<float> shard(size_t(k.rows * k.cols));
    for (int64_t r = 0; r < k.rows; ++r)
      for (int64_t c = 0; c < k.cols; ++c)
        shard[size_t(r * k.cols + c)] = x[size_t(r * full + s.start + c)];
    shards.push_back(std::move(shard));
  }

  // Stage 1: local stats and target logits.
  std::vector<std::vector<float> > local_max(size_t(k.ranks));
  std::vector<std::vector<double> > local_sum(size_t(k.ranks));
  std::vector<float> row_max(rows, -std::numeric_limits<float>::infinity());
  std::vector<float> target_logit(rows, 0.0f);
  std::vector<Buffer> dshards;
  dshards.reserve(size_t(k.ranks));
  for (int64_t q = 0; q < k.ranks; ++q) {
    SCOPED_TRACE("rank " + std::to_string(q));
    const auto& s = shapes[size_t(q)];
    const std::vector<float>& xs = shards[size_t(q)];
    std::vector<float>& m = local_max[size_t(q)];
    std::vector<double>& e = local_sum[size_t(q)];
    m.resize(rows);
    e.resize(rows);
    std::vector<float> tl(rows);
    cpu::vocab_parallel_cross_entropy_local_stats(xs.data(), t.data(), m.data(), e.data(), s);
    cpu::vocab_parallel_cross_entropy_target_logit(xs.data(), t.data(), tl.data(), s);

    dshards.emplace_back(to_type<T>(xs));
    const Buffer& dx = dshards.back();
    Buffer dm(rows * sizeof(float)), de(rows * sizeof(double)), dtl(rows * sizeof(float));
    dm.poison();
    de.poison();
    dtl.poison();
    cuda::vocab_parallel_cross_entropy_local_stats(dx.as<T>(), dt.as<I>(), dm.as<float>(),
                                                   de.as<double>(), s, kStream);
    cuda::vocab_parallel_cross_entropy_target_logit(dx.as<T>(), dt.as<I>(), dtl.as<float>(), s,
                                                    kStream);
    // The max is exact (no rounding), and so is picking the target's logit.
    EXPECT_EQ(count_bit_differences(dm.read<float>(rows), m, at_index, "local_max"), 0);
    EXPECT_EQ(count_bit_differences(dtl.read<float>(rows), tl, at_index, "target_logit"), 0);
    const std::vector<double> ge = de.read<double>(rows);
    int64_t bad = 0;
    for (size_t r = 0; r < rows; ++r)
      if (!(std::fabs(ge[r] - e[r]) <= kRtol * std::fabs(e[r])) && bad++ < 5)
        ADD_FAILURE() << "local_sum_exp[" << r << "]: cuda " << ge[r] << ", cpu " << e[r];
    EXPECT_EQ(bad, 0);
    // Determinism.
    Buffer de2(rows * sizeof(double));
    cuda::vocab_parallel_cross_entropy_local_stats(dx.as<T>(), dt.as<I>(), dm.as<float>(),
                                                   de2.as<double>(), s, kStream);
    EXPECT_EQ(count_bit_differences(de2.read<double>(rows), ge, at_index, "local_sum_exp, rerun"),
              0);
    // allreduce(max), allreduce(sum), in rank order.
    for (size_t r = 0; r < rows; ++r) {
      row_max[r] = std::max(row_max[r], m[r]);
      target_logit[r] += tl[r];
    }
  }

  // Stage 2: rescale, then allreduce(sum).
  std::vector<float> sum_exp(rows, 0.0f);
  const Buffer drow_max(row_max);
  for (int64_t q = 0; q < k.ranks; ++q) {
    SCOPED_TRACE("rank " + std::to_string(q));
    std::vector<float> se(rows);
    cpu::vocab_parallel_cross_entropy_rescale_sum_exp(local_max[size_t(q)].data(),
                                                      local_sum[size_t(q)].data(), row_max.data(),
                                                      se.data(), k.rows);
    const Buffer dm(local_max[size_t(q)]), de(local_sum[size_t(q)]);
    Buffer dse(rows * sizeof(float));
    dse.poison();
    cuda::vocab_parallel_cross_entropy_rescale_sum_exp(
        dm.as<float>(), de.as<double>(), drow_max.as<float>(), dse.as<float>(), k.rows, kStream);
    std::vector<double> tol(rows);
    for (size_t r = 0; r < rows; ++r) tol[r] = kRtol * std::fabs(double(se[r]));
    EXPECT_EQ(count_mismatches(dse.read<float>(rows), se, tol, at_index, "sum_exp"), 0);
    for (size_t r = 0; r < rows; ++r) sum_exp[r] += se[r];
  }

  // Stage 3: the loss (the same on every rank).
  std::vector<float> lse(rows);
  int64_t cpu_count = -1;
  const double cpu_sum = cpu::vocab_parallel_cross_entropy_loss(t.data(), row_max.data(),
                                                                sum_exp.data(), target_logit.data(),
                                                                lse.data(), shapes[0], &cpu_count);
  {
    const Buffer dse(sum_exp), dtl(target_logit);
    Buffer dlse(rows * sizeof(float)), dsum(sizeof(double)), dcount(sizeof(int64_t));
    dlse.poison();
    dsum.poison();
    dcount.poison();
    cuda::vocab_parallel_cross_entropy_loss(dt.as<I>(), drow_max.as<float>(), dse.as<float>(),
                                            dtl.as<float>(), dlse.as<float>(), shapes[0],
                                            dsum.as<double>(), dcount.as<int64_t>(), kStream);
    EXPECT_EQ(count_mismatches(dlse.read<float>(rows), lse, lse_tolerance(lse), at_index, "lse"),
              0);
    EXPECT_EQ(dcount.read_one<int64_t>(), cpu_count) << "counted rows";
    double mag = 0.0;
    for (size_t r = 0; r < rows; ++r)
      if (t64[r] != k.ignore_index)
        mag += std::fabs(double(lse[r])) + std::fabs(double(target_logit[r]));
    const double gpu_sum = dsum.read_one<double>();
    EXPECT_LE(std::fabs(gpu_sum - cpu_sum), kRtol * mag + kTiny)
        << "loss sum: cuda " << gpu_sum << ", cpu " << cpu_sum;
    Buffer dsum2(sizeof(double));
    cuda::vocab_parallel_cross_entropy_loss(dt.as<I>(), drow_max.as<float>(), dse.as<float>(),
                                            dtl.as<float>(), dlse.as<float>(), shapes[0],
                                            dsum2.as<double>(), dcount.as<int64_t>(), kStream);
    const double gpu_sum2 = dsum2.read_one<double>();
    EXPECT_EQ(std::memcmp(&gpu_sum, &gpu_sum2, sizeof(double)), 0)
        << "loss sum, second run: " << gpu_sum2 << " vs " << gpu_sum;
  }

  // Backward on every rank, from the CPU's lse.
  const float s = host_grad_scale(1.0f, cpu_count);
  const Buffer dlse(lse), dscale(std::vector<float>{s});
  for (int64_t q = 0; q < k.ranks; ++q) {
    SCOPED_TRACE("rank " + std::to_string(q));
    const auto& sh = shapes[size_t(q)];
    const std::vector<float>& xs = shards[size_t(q)];
    std::vector<float> cpu_d(xs.size());
    cpu::vocab_parallel_cross_entropy_backward(xs.data(), t.data(), lse.data(), s, cpu_d.data(),
                                               sh);
    if constexpr (kIsBf16<T>)
      for (float& v : cpu_d) v = round_bf16(v);
    Buffer dd(xs.size() * sizeof(T));
    dd.poison();
    cuda::vocab_parallel_cross_entropy_backward(dshards[size_t(q)].as<T>(), dt.as<I>(),
                                                dlse.as<float>(), dscale.as<float>(), dd.as<T>(),
                                                sh, kStream);
    const std::vector<double> tol =
        grad_tolerance(xs, t64, lse, s, k.rows, k.cols, sh.local_classes, sh.start, k.ignore_index,
                       kIsBf16<T> ? kBf16Rtol : kRtol);
    EXPECT_EQ(
        count_mismatches(to_f32(dd.read<T>(xs.size())), cpu_d, tol, at_row_col(k.cols), "dlogits"),
        0);
  }
}

// Shapes: one rank holding everything, splits with padding, a rank with a few classes and one
// with none, GPT-2's padded vocabulary on two ranks, many rows.
std::vector<VpCase> vocab_parallel_cases() {
  const int64_t shapes[][4] = {// rows, vocab, ranks, cols
                               {1, 1, 1, 1},     {5, 17, 1, 17},   {9, 100, 4, 25},
                               {13, 10, 4, 4},   {6, 769, 3, 300}, {3, 50257, 2, 25152},
                               {1200, 64, 2, 33}};
  std::vector<VpCase> cases;
  uint64_t seed = 500;
  for (const auto& s : shapes) {
    VpCase k;
    k.rows = s[0];
    k.vocab = s[1];
    k.ranks = s[2];
    k.cols = s[3];
    k.seed = seed += 10;
    cases.push_back(k);
  }
  return cases;
}

TEST(CudaVocabParallelCrossEntropy, StagesMatchCpuF32) {
  LOOM_SKIP_WITHOUT_CUDA();
  for (const VpCase& k : vocab_parallel_cases()) {
    check_vocab_parallel<float, int32_t>(k);
    check_vocab_parallel<float, int64_t>(k);
  }
}

TEST(CudaVocabParallelCrossEntropy, StagesMatchCpuBf16) {
  LOOM_SKIP_WITHOUT_CUDA();
  for (const VpCase& k : vocab_parallel_cases()) {
    check_vocab_parallel<BFloat16, int64_t>(k);
    check_vocab_parallel<BFloat16, int32_t>(k);
  }
}

TEST(CudaVocabParallelCrossEntropy, IgnoredRows) {
  LOOM_SKIP_WITHOUT_CUDA();
  VpCase k;
  k.rows = 30;
  k.vocab = 40;
  k.ranks = 3;
  k.cols = 14;
  for (double ignored : {0.9, 1.0}) {
    k.ignored = ignored;
    check_vocab_parallel<float, int64_t>(k);
  }
  k.ignored = 0.3;
  k.ignore_index = 20;  // a vocabulary id held by rank 1
  check_vocab_parallel<float, int32_t>(k);
}

TEST(CudaVocabParallelCrossEntropy, NoRows) {
  LOOM_SKIP_WITHOUT_CUDA();
  cpu::VocabParallelCrossEntropyShape s;
  s.rows = 0;
  s.cols = 4;
  s.local_classes = 4;
  Buffer none(0), sum(sizeof(double)), count(sizeof(int64_t)), scale(std::vector<float>{1.0f});
  sum.poison();
  count.poison();
  cuda::vocab_parallel_cross_entropy_local_stats(none.as<float>(), none.as<int32_t>(),
                                                 none.as<float>(), none.as<double>(), s, kStream);
  cuda::vocab_parallel_cross_entropy_target_logit(none.as<float>(), none.as<int32_t>(),
                                                  none.as<float>(), s, kStream);
  cuda::vocab_parallel_cross_entropy_rescale_sum_exp(
      none.as<float>(), none.as<double>(), none.as<float>(), none.as<float>(), 0, kStream);
  cuda::vocab_parallel_cross_entropy_loss(none.as<int32_t>(), none.as<float>(), none.as<float>(),
                                          none.as<float>(), none.as<float>(), s, sum.as<double>(),
                                          count.as<int64_t>(), kStream);
  cuda::vocab_parallel_cross_entropy_backward(none.as<float>(), none.as<int32_t>(),
                                              none.as<float>(), scale.as<float>(), none.as<float>(),
                                              s, kStream);
  EXPECT_EQ(sum.read_one<double>(), 0.0);
  EXPECT_EQ(count.read_one<int64_t>(), 0);
}

TEST(CudaVocabParallelCrossEntropy, RejectsMoreClassesThanColumns) {
  LOOM_SKIP_WITHOUT_CUDA();
  cpu::VocabParallelCrossEntropyShape s;
  s.rows = 2;
  s.cols = 4;
  s.local_classes = 6;
  Buffer logits(8 * sizeof(float)), targets(2 * sizeof(int32_t)), m(2 * sizeof(float)),
      e(2 * sizeof(double));
  try {
    cuda::vocab_parallel_cross_entropy_local_stats(logits.as<float>(), targets.as<int32_t>(),
                                                   m.as<float>(), e.as<double>(), s, kStream);
    ADD_FAILURE() << "local_classes 6 > cols 4 was accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("local_classes"), std::string::npos) << err.what();
  }
}

// ---------------------------------------------------------------- embedding

enum class Pattern { kUniform, kOneRow, kHotRow };

const char* pattern_name(Pattern p) {
  return p == Pattern::kUniform ? "uniform" : p == Pattern::kOneRow ? "one row" : "hot row";
}

// n indices into [0, vocab): uniform; all the same row; or half of them one hot row.
std::vector<int64_t> random_indices(int64_t n, int64_t vocab, Pattern p, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int64_t> row(0, vocab - 1);
  const int64_t hot = row(gen);
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t& i : v) {
    if (p == Pattern::kOneRow || (p == Pattern::kHotRow && gen() % 2 == 0))
      i = hot;
    else
      i = row(gen);
  }
  return v;
}

template <typename T, typename I>
void check_embedding(int64_t n, int64_t vocab, int64_t cols, Pattern p, uint64_t seed) {
  SCOPED_TRACE("n " + std::to_string(n) + " vocab " + std::to_string(vocab) + " cols " +
               std::to_string(cols) + " " + pattern_name(p) + " seed " + std::to_string(seed) +
               " " + type_name<T>() + " " + type_name<I>());
  const std::vector<int64_t> idx64 = random_indices(n, vocab, p, seed);
  const std::vector<I> idx = to_index<I>(idx64);
  const Buffer didx(idx);

  // Forward: a copy, so exactly the weight's rows (bf16: the same bits).
  const std::vector<T> weight = to_type<T>(random_floats(size_t(vocab * cols), seed + 1));
  std::vector<T> want(size_t(n * cols));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < cols; ++c)
      want[size_t(i * cols + c)] = weight[size_t(idx64[size_t(i)] * cols + c)];
  if constexpr (std::is_same_v<T, float>) {  // the CPU twin agrees with that
    std::vector<float> cpu_out(want.size());
    cpu::embedding_forward(weight.data(), idx.data(), cpu_out.data(), n, cols);
    ASSERT_EQ(count_bit_differences(cpu_out, want, at_row_col(cols), "cpu out"), 0);
  }
  const Buffer dweight(weight);
  Buffer out(want.size() * sizeof(T));
  out.poison();
  cuda::embedding_forward(dweight.as<T>(), didx.as<I>(), out.as<T>(), n, cols, kStream);
  EXPECT_EQ(count_bit_differences(out.read<T>(want.size()), want, at_row_col(cols), "out"), 0);

  // Backward: bit for bit the CPU's on the same f32 values (bf16 dout converted exactly).
  const std::vector<T> dout = to_type<T>(random_floats(size_t(n * cols), seed + 2));
  const std::vector<float> dout32 = to_f32(dout);
  std::vector<float> cpu_dw(size_t(vocab * cols));
  cpu::embedding_backward(dout32.data(), idx.data(), cpu_dw.data(), n, vocab, cols);
  const Buffer ddout(dout);
  const size_t ws_bytes = cuda::embedding_backward_workspace_bytes(n, vocab);
  if (n == 0) EXPECT_EQ(ws_bytes, 0u);
  Buffer ws(ws_bytes), dw(cpu_dw.size() * sizeof(float));
  dw.poison();
  cuda::embedding_backward(ddout.as<T>(), didx.as<I>(), dw.as<float>(), n, vocab, cols,
                           ws.as<void>(), ws_bytes, kStream);
  const std::vector<float> gpu_dw = dw.read<float>(cpu_dw.size());
  EXPECT_EQ(count_bit_differences(gpu_dw, cpu_dw, at_row_col(cols), "dweight"), 0);
  dw.poison();
  cuda::embedding_backward(ddout.as<T>(), didx.as<I>(), dw.as<float>(), n, vocab, cols,
                           ws.as<void>(), ws_bytes, kStream);
  EXPECT_EQ(count_bit_differences(dw.read<float>(cpu_dw.size()), gpu_dw, at_row_col(cols),
                                  "dweight, second run"),
            0);
}

template <typename T>
void check_embedding_cases() {
  // n, vocab, cols: vocab 1, cols 1, odd and non-multiple-of-32 widths, more rows than lookups
  // (most rows zero), GPT-2's shapes, many lookups.
  const int64_t shapes[][3] = {{1, 1, 1},         {7, 1, 5},        {17, 5, 3},
                               {100, 13, 33},     {300, 1000, 129}, {1000, 50, 769},
                               {2048, 50304, 64}, {20000, 300, 17}};
  uint64_t seed = 900;
  for (const auto& s : shapes)
    for (Pattern p : {Pattern::kUniform, Pattern::kOneRow, Pattern::kHotRow}) {
      seed += 10;
      if (seed % 20 == 0)
        check_embedding<T, int32_t>(s[0], s[1], s[2], p, seed);
      else
        check_embedding<T, int64_t>(s[0], s[1], s[2], p, seed);
    }
}

TEST(CudaEmbedding, MatchesCpuF32) {
  LOOM_SKIP_WITHOUT_CUDA();
  check_embedding_cases<float>();
}

TEST(CudaEmbedding, MatchesCpuBf16) {
  LOOM_SKIP_WITHOUT_CUDA();
  check_embedding_cases<BFloat16>();
}

TEST(CudaEmbedding, ManyLookupsOfOneRow) {
  LOOM_SKIP_WITHOUT_CUDA();
  // One run of 50000 positions, summed in order per column; the other rows zero.
  check_embedding<float, int32_t>(50000, 3, 40, Pattern::kOneRow, 31);
  check_embedding<float, int64_t>(30000, 2, 1, Pattern::kHotRow, 32);
}

TEST(CudaEmbedding, NoLookups) {
  LOOM_SKIP_WITHOUT_CUDA();
  // Forward: nothing launched; backward: every row of dweight zero (checked against the CPU).
  check_embedding<float, int64_t>(0, 6, 5, Pattern::kUniform, 41);
  check_embedding<BFloat16, int32_t>(0, 1, 3, Pattern::kUniform, 42);
}

TEST(CudaEmbedding, RejectsTooSmallWorkspace) {
  LOOM_SKIP_WITHOUT_CUDA();
  const int64_t n = 100, vocab = 10, cols = 4;
  const Buffer idx(random_indices(n, vocab, Pattern::kUniform, 5));
  Buffer dout(size_t(n * cols) * sizeof(float)), dw(size_t(vocab * cols) * sizeof(float));
  const size_t need = cuda::embedding_backward_workspace_bytes(n, vocab);
  ASSERT_GT(need, 0u);
  Buffer ws(need);
  try {
    cuda::embedding_backward(dout.as<float>(), idx.as<int64_t>(), dw.as<float>(), n, vocab, cols,
                             ws.as<void>(), need - 1, kStream);
    ADD_FAILURE() << "a workspace of " << need - 1 << " bytes was accepted (needs " << need << ")";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("workspace"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(need)), std::string::npos) << msg;
  }
  try {
    cuda::embedding_backward(dout.as<float>(), idx.as<int64_t>(), dw.as<float>(), n, vocab, cols,
                             nullptr, 0, kStream);
    ADD_FAILURE() << "a null workspace was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("workspace"), std::string::npos) << e.what();
  }
}

TEST(CudaEmbedding, RejectsMoreThanInt32Lookups) {
  LOOM_SKIP_WITHOUT_CUDA();
  for (const auto& [n, vocab] : {std::pair<int64_t, int64_t>{int64_t(1) << 31, 10},
                                 std::pair<int64_t, int64_t>{10, int64_t(1) << 32}}) {
    try {
      (void)cuda::embedding_backward_workspace_bytes(n, vocab);
      ADD_FAILURE() << n << " lookups into " << vocab << " rows were accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("at most 2^31-1"), std::string::npos) << e.what();
    }
  }
}

#endif  // LOOM_WITH_CUDA

}  // namespace
}  // namespace loom::kernels
