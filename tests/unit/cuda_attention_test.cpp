// The CUDA attention kernels (kernels/cuda/attention.h) against their CPU twins
// (kernels/cpu/attention.h): the same random inputs (fixed seeds) through both, forward (out, lse)
// and backward (dq, dk, dv), causal and not, every element compared. Head dims straddle the
// kernels' 32 / 64 / 128 buckets and sequence lengths their 32-row tiles. Skips without a GPU,
// and when loom was built without CUDA; the argument checks run on the host and need no GPU.
//
// Tolerance, f32. Both sides compute the same sums in different orders, so each output is
// compared with 1e-5 times the sum of |terms| that make it (`magnitudes` below, in f64):
//   out[i,c]: sum_j p_ij |v_jc|;   dv[j,c]: sum_i p_ij |dout_ic|;
//   dq[i,c]: scale sum_j p_ij (|dP|_ij + |delta|_i) |k_jc|, and dk likewise over i with |q_ic|,
// where |dP|_ij = sum_c |dout_ic v_jc| and |delta|_i = sum_c |dout_ic out_ic|. The probabilities
// themselves carry a relative error of about f32 eps times the score's sum of |terms| (at most
// sqrt(d) <= 11.4 for inputs in [-1, 1]), i.e. < 1e-6: inside the same bound. lse[i] is compared
// with 1e-5 (|lse_i| + max_j scale sum_c |q_ic k_jc|), the scale of its rounding error.
//
// Tolerance, bf16. The bf16 kernels read the same bf16 values the CPU reference gets as f32 (q, k,
// v, dout rounded; out rounded from the CPU's forward before the backward) and compute in f32, so
// before the final rounding the two agree within the f32 bound above; rounding both to bf16 (8
// significant bits) can then put them one bf16 step apart, at most 2^-7 of the value. So:
// |got - want| <= 2e-5 * magnitude + 1.01 * 2^-7 * |want|. lse is f32 in both and uses the f32
// bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/runtime.h"
#include "kernels/numeric.h"
#include "testing/device_buffer.h"

#if LOOM_WITH_CUDA
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_gemm.h"
#endif

namespace loom::kernels {
namespace {

#if !LOOM_WITH_CUDA

TEST(AttentionCuda, NeedsCuda) {
  GTEST_SKIP() << "loom was built without CUDA (LOOM_WITH_CUDA=0): no CUDA kernels to test";
}

#else

constexpr cuda::Stream kStream = nullptr;  // the legacy default stream: ordered with the copies
constexpr double kRtol = 1e-5;
constexpr double kBf16Step = 1.0 / 128;  // 2^-7: the largest relative gap between bf16 neighbours

// ---------------------------------------------------------------- device memory

using Buffer = ::loom::testing::DeviceBuffer;

// ---------------------------------------------------------------- inputs and references

struct Shape {
  int64_t bh = 1, t = 1, d = 1;
  bool causal = false;
  size_t elems() const { return size_t(bh * t * d); }
  size_t rows() const { return size_t(bh * t); }
  std::string str() const {
    return "bh " + std::to_string(bh) + " t " + std::to_string(t) + " d " + std::to_string(d) +
           (causal ? " causal" : "");
  }
};

enum class DType { kF32, kBF16 };

// Which CUDA implementation runs: the flash kernels (attention.h) or GEMM attention
// (attention_gemm.h), with a workspace for heads_per_pass heads (0: all heads in one pass).
struct Path {
  bool gemm = false;
  int64_t heads_per_pass = 0;
  std::string str() const {
    return gemm ? "gemm, " + std::to_string(heads_per_pass) + " heads per pass" : "flash";
  }
};
const Path kFlash{};
const Path kGemm{true, 0};
const char* dtype_name(DType t) { return t == DType::kF32 ? "f32" : "bf16"; }

float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }
std::vector<float> round_bf16(std::vector<float> v) {
  for (float& x : v) x = round_bf16(x);
  return v;
}
std::vector<BFloat16> to_bf16(const std::vector<float>& v) {
  std::vector<BFloat16> h(v.size());
  for (size_t e = 0; e < v.size(); ++e) h[e] = float_to_bf16(v[e]);
  return h;
}
std::vector<float> from_bf16(const std::vector<BFloat16>& h) {
  std::vector<float> v(h.size());
  for (size_t e = 0; e < h.size(); ++e) v[e] = bf16_to_float(h[e]);
  return v;
}

std::vector<float> random_floats(size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = value(gen);
  return v;
}

// The inputs of one case, as the kernels see them (bf16 cases: already bf16 values).
struct Inputs {
  std::vector<float> q, k, v, dout;
};

Inputs random_inputs(const Shape& s, DType dtype, uint64_t seed) {
  Inputs in{random_floats(s.elems(), seed), random_floats(s.elems(), seed + 1),
            random_floats(s.elems(), seed + 2), random_floats(s.elems(), seed + 3)};
  if (dtype == DType::kBF16) {
    in.q = round_bf16(in.q);
    in.k = round_bf16(in.k);
    in.v = round_bf16(in.v);
    in.dout = round_bf16(in.dout);
  }
  return in;
}

// Everything both sides produce for one case. The backward runs on the CPU forward's out (bf16:
// rounded, as the bf16 backward stores it) and lse, so it is compared on equal inputs.
struct Results {
  std::vector<float> out, lse, dq, dk, dv;
};

// The CPU reference; bf16: outputs rounded to bf16 (lse stays f32). out_for_backward gets the
// out the backward ran on.
Results run_cpu(const Inputs& in, const Shape& s, DType dtype,
                std::vector<float>* out_for_backward) {
  Results r;
  r.out.assign(s.elems(), 0.0f);
  r.lse.assign(s.rows(), 0.0f);
  cpu::attention_forward(in.q.data(), in.k.data(), in.v.data(), r.out.data(), r.lse.data(), s.bh,
                         s.t, s.d, s.causal);
  if (dtype == DType::kBF16) r.out = round_bf16(r.out);
  *out_for_backward = r.out;
  r.dq.assign(s.elems(), 0.0f);
  r.dk.assign(s.elems(), 0.0f);
  r.dv.assign(s.elems(), 0.0f);
  cpu::attention_backward(in.q.data(), in.k.data(), in.v.data(), r.out.data(), r.lse.data(),
                          in.dout.data(), r.dq.data(), r.dk.data(), r.dv.data(), s.bh, s.t, s.d,
                          s.causal);
  if (dtype == DType::kBF16) {
    r.dq = round_bf16(r.dq);
    r.dk = round_bf16(r.dk);
    r.dv = round_bf16(r.dv);
  }
  return r;
}

// T = float or BFloat16: the kernels' storage type.
template <typename T>
std::vector<T> to_storage(const std::vector<float>& v) {
  if constexpr (std::is_same_v<T, float>)
    return v;
  else
    return to_bf16(v);
}
template <typename T>
std::vector<float> from_storage(const std::vector<T>& v) {
  if constexpr (std::is_same_v<T, float>)
    return v;
  else
    return from_bf16(v);
}

// The CUDA kernels on the same inputs; the backward gets the CPU's out and lse.
template <typename T>
Results run_gpu(const Inputs& in, const Shape& s, const std::vector<float>& cpu_out,
                const std::vector<float>& cpu_lse, const Path& path = kFlash) {
  const size_t n = s.elems(), rows = s.rows();
  Buffer q(to_storage<T>(in.q)), k(to_storage<T>(in.k)), v(to_storage<T>(in.v));
  Buffer dout(to_storage<T>(in.dout)), saved_out(to_storage<T>(cpu_out)), saved_lse(cpu_lse);
  Buffer out(n * sizeof(T)), lse(rows * sizeof(float));
  Buffer dq(n * sizeof(T)), dk(n * sizeof(T)), dv(n * sizeof(T));
  constexpr bool bf16 = std::is_same_v<T, BFloat16>;
  // The backward's workspace for the path's heads per pass (the forward fits in it too).
  const int64_t heads = path.heads_per_pass > 0 ? path.heads_per_pass : s.bh;
  Buffer workspace(path.gemm ? cuda::attention_gemm_workspace_bytes(heads, s.t, s.d, bf16, true)
                             : cuda::attention_backward_workspace_bytes(s.bh, s.t, s.d));
  for (Buffer* b : {&out, &lse, &dq, &dk, &dv, &workspace}) b->poison();

  if (path.gemm) {
    cuda::attention_gemm_forward(q.as<T>(), k.as<T>(), v.as<T>(), out.as<T>(), lse.as<float>(),
                                 s.bh, s.t, s.d, s.causal, workspace.as<void>(), workspace.bytes(),
                                 kStream);
    cuda::attention_gemm_backward(q.as<T>(), k.as<T>(), v.as<T>(), saved_out.as<T>(),
                                  saved_lse.as<float>(), dout.as<T>(), dq.as<T>(), dk.as<T>(),
                                  dv.as<T>(), s.bh, s.t, s.d, s.causal, workspace.as<void>(),
                                  workspace.bytes(), kStream);
  } else {
    cuda::attention_forward(q.as<T>(), k.as<T>(), v.as<T>(), out.as<T>(), lse.as<float>(), s.bh,
                            s.t, s.d, s.causal, kStream);
    cuda::attention_backward(q.as<T>(), k.as<T>(), v.as<T>(), saved_out.as<T>(),
                             saved_lse.as<float>(), dout.as<T>(), dq.as<T>(), dk.as<T>(),
                             dv.as<T>(), s.bh, s.t, s.d, s.causal, workspace.as<void>(),
                             workspace.bytes(), kStream);
  }
  cuda_rt::synchronize(0);
  Results r;
  r.out = from_storage(out.read<T>(n));
  r.lse = lse.read<float>(rows);
  r.dq = from_storage(dq.read<T>(n));
  r.dk = from_storage(dk.read<T>(n));
  r.dv = from_storage(dv.read<T>(n));
  return r;
}

// Sums of |terms| (f64) of every output: the scale of its rounding error (see the top of the
// file). out is the out the backward ran on.
Results magnitudes(const Inputs& in, const std::vector<float>& out, const Shape& s) {
  const int64_t t = s.t, d = s.d;
  const double scale = d > 0 ? 1.0 / std::sqrt(double(d)) : 1.0;
  Results m;
  m.out.assign(s.elems(), 0.0);
  m.lse.assign(s.rows(), 0.0);
  m.dq.assign(s.elems(), 0.0);
  m.dk.assign(s.elems(), 0.0);
  m.dv.assign(s.elems(), 0.0);
  std::vector<double> p(size_t(t * t)), dsabs(size_t(t * t));
  for (int64_t h = 0; h < s.bh; ++h) {
    const size_t base = size_t(h * t * d);
    auto at = [&](const std::vector<float>& x, int64_t row, int64_t c) {
      return double(x[base + size_t(row * d + c)]);
    };
    for (int64_t i = 0; i < t; ++i) {
      const int64_t keys = s.causal ? i + 1 : t;
      std::vector<double> sc(static_cast<size_t>(keys));
      double max_s = -INFINITY, max_abs = 0.0;
      for (int64_t j = 0; j < keys; ++j) {
        double dot = 0.0, abs = 0.0;
        for (int64_t c = 0; c < d; ++c) {
          dot += at(in.q, i, c) * at(in.k, j, c);
          abs += std::fabs(at(in.q, i, c) * at(in.k, j, c));
        }
        sc[size_t(j)] = scale * dot;
        max_s = std::max(max_s, sc[size_t(j)]);
        max_abs = std::max(max_abs, scale * abs);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < keys; ++j) sum += std::exp(sc[size_t(j)] - max_s);
      const double lse = max_s + std::log(sum);
      m.lse[size_t(h * t + i)] = float(std::fabs(lse) + max_abs);
      double delta_abs = 0.0;
      for (int64_t c = 0; c < d; ++c) delta_abs += std::fabs(at(in.dout, i, c) * at(out, i, c));
      for (int64_t j = 0; j < t; ++j) {
        const size_t ij = size_t(i * t + j);
        p[ij] = j < keys ? std::exp(sc[size_t(j)] - lse) : 0.0;
        double dp_abs = 0.0;
        for (int64_t c = 0; c < d; ++c) dp_abs += std::fabs(at(in.dout, i, c) * at(in.v, j, c));
        dsabs[ij] = p[ij] * (dp_abs + delta_abs);
      }
    }
    for (int64_t r = 0; r < t; ++r)
      for (int64_t c = 0; c < d; ++c) {
        double o = 0.0, dq = 0.0, dk = 0.0, dv = 0.0;
        for (int64_t x = 0; x < t; ++x) {
          o += p[size_t(r * t + x)] * std::fabs(at(in.v, x, c));
          dq += dsabs[size_t(r * t + x)] * std::fabs(at(in.k, x, c));
          dk += dsabs[size_t(x * t + r)] * std::fabs(at(in.q, x, c));
          dv += p[size_t(x * t + r)] * std::fabs(at(in.dout, x, c));
        }
        const size_t e = base + size_t(r * d + c);
        m.out[e] = float(o);
        m.dq[e] = float(scale * dq);
        m.dk[e] = float(scale * dk);
        m.dv[e] = float(dv);
      }
  }
  return m;
}

// Mismatches of got against want; reports the first few with their (head, row, column).
// cols = 1 for lse.
int64_t count_mismatches(const std::vector<float>& got, const std::vector<float>& want,
                         const std::vector<float>& mag, double step, const Shape& s, int64_t cols,
                         const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  if (got.size() != want.size()) return 1;
  int64_t bad = 0;
  for (size_t e = 0; e < got.size(); ++e) {
    const double tol = (step > 0 ? 2 * kRtol : kRtol) * (double(mag[e]) + 1e-6) +
                       1.01 * step * std::fabs(double(want[e]));
    const double diff = std::fabs(double(got[e]) - double(want[e]));
    if (!(diff <= tol) && bad++ < 5) {
      const int64_t row = int64_t(e) / cols;
      ADD_FAILURE() << what << " [" << s.str() << "] element " << e << " = (head " << row / s.t
                    << ", row " << row % s.t << ", col " << int64_t(e) % cols << "): cuda "
                    << got[e] << ", cpu " << want[e] << ", |diff| " << diff << " > tol " << tol
                    << " (magnitude " << mag[e] << ")";
    }
  }
  return bad;
}

void expect_matches_cpu(const Shape& s, DType dtype, uint64_t seed, const Path& path = kFlash) {
  const std::string label = std::string(dtype_name(dtype)) + " " + s.str() + " " + path.str();
  SCOPED_TRACE(label);
  const Inputs in = random_inputs(s, dtype, seed);
  std::vector<float> saved_out;
  const Results cpu = run_cpu(in, s, dtype, &saved_out);
  const Results gpu = dtype == DType::kF32 ? run_gpu<float>(in, s, saved_out, cpu.lse, path)
                                           : run_gpu<BFloat16>(in, s, saved_out, cpu.lse, path);
  const Results mag = magnitudes(in, saved_out, s);
  const double step = dtype == DType::kBF16 ? kBf16Step : 0.0;
  EXPECT_EQ(count_mismatches(gpu.out, cpu.out, mag.out, step, s, s.d, "out"), 0);
  EXPECT_EQ(count_mismatches(gpu.lse, cpu.lse, mag.lse, 0.0, s, 1, "lse"), 0);
  EXPECT_EQ(count_mismatches(gpu.dq, cpu.dq, mag.dq, step, s, s.d, "dq"), 0);
  EXPECT_EQ(count_mismatches(gpu.dk, cpu.dk, mag.dk, step, s, s.d, "dk"), 0);
  EXPECT_EQ(count_mismatches(gpu.dv, cpu.dv, mag.dv, step, s, s.d, "dv"), 0);
}

// Sequence lengths around the 32-row tiles, head dims around the 32 / 64 / 128 buckets.
const int64_t kLengths[] = {1, 5, 63, 64, 65, 200};
const int64_t kHeadDims[] = {1, 3, 33, 64, 100, 128};

void sweep(DType dtype, const Path& path = kFlash) {
  uint64_t seed = dtype == DType::kF32 ? 100 : 200;
  for (int64_t t : kLengths)
    for (int64_t d : kHeadDims)
      for (bool causal : {false, true}) {
        ++seed;
        expect_matches_cpu(Shape{int64_t(1 + seed % 3), t, d, causal}, dtype, seed * 10, path);
      }
}

// ---------------------------------------------------------------- tests

TEST(AttentionCuda, F32MatchesCpu) {
  LOOM_SKIP_WITHOUT_CUDA();
  sweep(DType::kF32);
}

TEST(AttentionCuda, Bf16MatchesCpu) {
  LOOM_SKIP_WITHOUT_CUDA();
  sweep(DType::kBF16);
}

TEST(AttentionCuda, ManyHeadsAndTiles) {
  LOOM_SKIP_WITHOUT_CUDA();
  // GPT-2's head dim, 24 heads of 300 rows: hundreds of blocks, a ragged last tile.
  for (bool causal : {false, true}) {
    expect_matches_cpu(Shape{24, 300, 64, causal}, DType::kF32, 7000 + causal);
    expect_matches_cpu(Shape{24, 300, 64, causal}, DType::kBF16, 7100 + causal);
  }
  expect_matches_cpu(Shape{5, 513, 17, true}, DType::kF32, 7200);
}

// GEMM attention (kernels/cuda/attention_gemm.h) through the same sweep and tolerances.
TEST(AttentionCuda, GemmF32MatchesCpu) {
  LOOM_SKIP_WITHOUT_CUDA();
  sweep(DType::kF32, kGemm);
}

TEST(AttentionCuda, GemmBf16MatchesCpu) {
  LOOM_SKIP_WITHOUT_CUDA();
  sweep(DType::kBF16, kGemm);
}

TEST(AttentionCuda, GemmPassesBlocksAndLargeHeadDims) {
  LOOM_SKIP_WITHOUT_CUDA();
  // 24 heads in passes of 5 (the last one short); T 1000 causal: 7 row blocks of 142-143 rows;
  // T 300 causal: 2 blocks; d 200: past the flash kernels' 128, which GEMM attention has no
  // limit on.
  for (bool causal : {false, true}) {
    expect_matches_cpu(Shape{24, 300, 64, causal}, DType::kF32, 7300 + causal, Path{true, 5});
    expect_matches_cpu(Shape{24, 300, 64, causal}, DType::kBF16, 7400 + causal, Path{true, 5});
  }
  expect_matches_cpu(Shape{3, 1000, 64, true}, DType::kF32, 7500, Path{true, 2});
  expect_matches_cpu(Shape{3, 1000, 64, true}, DType::kBF16, 7501, kGemm);
  expect_matches_cpu(Shape{2, 300, 200, true}, DType::kF32, 7502, Path{true, 1});
  expect_matches_cpu(Shape{2, 300, 200, false}, DType::kBF16, 7503, kGemm);
}

TEST(AttentionCuda, BitIdenticalOverTwoRuns) {
  LOOM_SKIP_WITHOUT_CUDA();
  for (const Shape& s : {Shape{3, 200, 64, true}, Shape{2, 65, 100, false}, Shape{4, 97, 33, true},
                         Shape{3, 600, 64, true}})
    for (DType dtype : {DType::kF32, DType::kBF16})
      for (const Path& path : {kFlash, kGemm, Path{true, 2}}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + s.str() + " " + path.str());
        const Inputs in = random_inputs(s, dtype, 9000);
        std::vector<float> saved_out;
        const Results cpu = run_cpu(in, s, dtype, &saved_out);
        auto run = [&] {
          return dtype == DType::kF32 ? run_gpu<float>(in, s, saved_out, cpu.lse, path)
                                      : run_gpu<BFloat16>(in, s, saved_out, cpu.lse, path);
        };
        const Results a = run(), b = run();
        auto same_bits = [](const std::vector<float>& x, const std::vector<float>& y) {
          return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * 4) == 0;
        };
        EXPECT_TRUE(same_bits(a.out, b.out)) << "out";
        EXPECT_TRUE(same_bits(a.lse, b.lse)) << "lse";
        EXPECT_TRUE(same_bits(a.dq, b.dq)) << "dq";
        EXPECT_TRUE(same_bits(a.dk, b.dk)) << "dk";
        EXPECT_TRUE(same_bits(a.dv, b.dv)) << "dv";
      }
}

TEST(AttentionCuda, Bf16OutputsRoundToNearestEven) {
  LOOM_SKIP_WITHOUT_CUDA();
  // q = 0 and two keys: both probabilities are exactly 1/2 on both sides, so out = (v0 + v1) / 2
  // is exact in f32 and only the final rounding to bf16 remains. v = +-m * 2^e (m in [128, 255],
  // e in [-8, -1]) is bf16-exact; the sums carry up to 16 bits, and ties are frequent, so a
  // truncating or round-half-up store fails here where the tolerance above lets it pass.
  const Shape s{3, 2, 77, false};
  std::mt19937_64 gen(31337);
  std::vector<float> v(s.elems());
  for (float& x : v)
    x = float(gen() % 2 ? 1 : -1) * float(128 + gen() % 128) *
        std::ldexp(1.0f, -8 - int(gen() % 8));
  const std::vector<float> q(s.elems(), 0.0f), k = round_bf16(random_floats(s.elems(), 5));
  std::vector<float> want(s.elems()), lse(s.rows());
  cpu::attention_forward(q.data(), k.data(), v.data(), want.data(), lse.data(), s.bh, s.t, s.d,
                         s.causal);
  Buffer q_dev(to_bf16(q)), k_dev(to_bf16(k)), v_dev(to_bf16(v));
  Buffer out(s.elems() * sizeof(BFloat16)), dlse(s.rows() * sizeof(float));
  out.poison();
  cuda::attention_forward(q_dev.as<BFloat16>(), k_dev.as<BFloat16>(), v_dev.as<BFloat16>(),
                          out.as<BFloat16>(), dlse.as<float>(), s.bh, s.t, s.d, s.causal, kStream);
  const std::vector<BFloat16> got = out.read<BFloat16>(s.elems());
  int64_t bad = 0, rounded = 0;
  for (size_t e = 0; e < got.size(); ++e) {
    const BFloat16 w = float_to_bf16(want[e]);
    rounded += bf16_to_float(w) != want[e];
    if (got[e].bits != w.bits && bad++ < 5)
      ADD_FAILURE() << "out element " << e << ": cuda bf16 bits 0x" << std::hex << got[e].bits
                    << ", want 0x" << w.bits << std::dec << " (f32 value " << want[e] << ")";
  }
  EXPECT_EQ(bad, 0);
  EXPECT_GT(rounded, int64_t(got.size() / 4)) << "the case should need rounding often";
}

TEST(AttentionCuda, HeadDimZeroGivesLogOfVisibleKeys) {
  LOOM_SKIP_WITHOUT_CUDA();
  // No dot products: every score is 0, so lse = log(visible keys), as on the CPU; no out to write.
  for (bool causal : {false, true}) {
    const Shape s{2, 40, 0, causal};
    std::vector<float> want(s.rows());
    for (size_t r = 0; r < s.rows(); ++r)
      want[r] = std::log(float(causal ? int64_t(r) % s.t + 1 : s.t));
    Buffer lse(s.rows() * sizeof(float)), dummy(16);
    lse.poison();
    cuda::attention_forward(dummy.as<float>(), dummy.as<float>(), dummy.as<float>(),
                            dummy.as<float>(), lse.as<float>(), s.bh, s.t, 0, causal, kStream);
    const std::vector<float> got = lse.read<float>(s.rows());
    EXPECT_EQ(count_mismatches(got, want, want, 0.0, s, 1, "lse, d = 0"), 0);
  }
}

TEST(AttentionCuda, GemmHeadDimZeroGivesLogOfVisibleKeys) {
  LOOM_SKIP_WITHOUT_CUDA();
  for (bool causal : {false, true}) {
    const Shape s{2, 300, 0, causal};  // causal: 2 row blocks
    std::vector<float> want(s.rows());
    for (size_t r = 0; r < s.rows(); ++r)
      want[r] = std::log(float(causal ? int64_t(r) % s.t + 1 : s.t));
    Buffer lse(s.rows() * sizeof(float)), dummy(16);
    Buffer workspace(cuda::attention_gemm_workspace_bytes(s.bh, s.t, 0, false, false));
    lse.poison();
    workspace.poison();
    cuda::attention_gemm_forward(dummy.as<float>(), dummy.as<float>(), dummy.as<float>(),
                                 dummy.as<float>(), lse.as<float>(), s.bh, s.t, 0, causal,
                                 workspace.as<void>(), workspace.bytes(), kStream);
    const std::vector<float> got = lse.read<float>(s.rows());
    EXPECT_EQ(count_mismatches(got, want, want, 0.0, s, 1, "lse, d = 0"), 0);
  }
}

// The argument checks run on the host before anything touches the device: no GPU needed.

// Runs f, expects a loom::Error whose message holds every string of `parts`.
template <typename F>
void expect_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no loom::Error thrown; expected one naming " << parts.front();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& part : parts)
      EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
  }
}

TEST(AttentionCuda, RejectsTooLargeHeadDim) {
  const int64_t max_d = cuda::attention_max_head_dim();
  EXPECT_GE(max_d, 128);
  const int64_t d = max_d + 1;
  const std::vector<std::string> parts = {"d = " + std::to_string(d), std::to_string(max_d)};
  const float* f = nullptr;
  const BFloat16* h = nullptr;
  expect_error([&] { cuda::attention_forward(f, f, f, nullptr, nullptr, 2, 8, d, true, kStream); },
               parts);
  expect_error([&] { cuda::attention_forward(h, h, h, nullptr, nullptr, 2, 8, d, false, kStream); },
               parts);
  const size_t ws = cuda::attention_backward_workspace_bytes(2, 8, d);
  expect_error(
      [&] {
        cuda::attention_backward(f, f, f, f, nullptr, f, nullptr, nullptr, nullptr, 2, 8, d, true,
                                 nullptr, ws, kStream);
      },
      parts);
  expect_error(
      [&] {
        cuda::attention_backward(h, h, h, h, nullptr, h, nullptr, nullptr, nullptr, 2, 8, d, false,
                                 nullptr, ws, kStream);
      },
      parts);
}

TEST(AttentionCuda, RejectsTooSmallWorkspace) {
  const int64_t bh = 3, t = 70, d = 64;
  const size_t need = cuda::attention_backward_workspace_bytes(bh, t, d);
  EXPECT_GE(need, size_t(bh * t) * sizeof(float));
  const float* f = nullptr;
  alignas(16) static char scratch[16];
  expect_error(
      [&] {
        cuda::attention_backward(f, f, f, f, nullptr, f, nullptr, nullptr, nullptr, bh, t, d, false,
                                 scratch, need - 4, kStream);
      },
      {"workspace", std::to_string(need - 4), std::to_string(need)});
  expect_error(
      [&] {
        cuda::attention_backward(f, f, f, f, nullptr, f, nullptr, nullptr, nullptr, bh, t, d, false,
                                 nullptr, need, kStream);
      },
      {"workspace", std::to_string(need)});
}

TEST(AttentionCuda, GemmWorkspaceArithmetic) {
  // Per head: T^2 floats of scores (twice in the backward) and, for bf16, 2 (7) f32 copies of
  // [T, D]; each region rounded up to 256 bytes.
  const int64_t t = 70, d = 33;
  EXPECT_EQ(cuda::attention_gemm_workspace_bytes(1, t, d, false, false), 19712u);  // 19600 -> 256s
  EXPECT_EQ(cuda::attention_gemm_workspace_bytes(3, t, d, false, true), 2 * 58880u);
  EXPECT_EQ(cuda::attention_gemm_workspace_bytes(3, t, d, true, true),
            2 * 58880u + 7 * 27904u);  // 3 * 70 * 33 * 4 = 27720 -> 27904
  EXPECT_EQ(cuda::attention_gemm_workspace_bytes(3, t, d, true, false), 58880u + 2 * 27904u);
  for (bool bf16 : {false, true})
    for (bool backward : {false, true}) {
      const size_t three = cuda::attention_gemm_workspace_bytes(3, t, d, bf16, backward);
      EXPECT_EQ(cuda::attention_gemm_heads_per_pass(10, t, d, bf16, backward, three), 3);
      EXPECT_EQ(cuda::attention_gemm_heads_per_pass(10, t, d, bf16, backward, three - 1), 2);
      EXPECT_EQ(cuda::attention_gemm_heads_per_pass(2, t, d, bf16, backward, three), 2);
      const size_t one = cuda::attention_gemm_workspace_bytes(1, t, d, bf16, backward);
      EXPECT_EQ(cuda::attention_gemm_heads_per_pass(10, t, d, bf16, backward, one - 1), 0);
    }
  // A sequence whose scores could not fit any memory: 0 heads, no overflow.
  EXPECT_EQ(
      cuda::attention_gemm_heads_per_pass(8, int64_t(1) << 40, 64, true, true, size_t(1) << 40), 0);
  expect_error([] { cuda::attention_gemm_workspace_bytes(1, int64_t(1) << 40, 64, true, true); },
               {"overflows"});
}

TEST(AttentionCuda, GemmRejectsTooSmallWorkspace) {
  const int64_t bh = 3, t = 70, d = 64;
  const float* f = nullptr;
  const BFloat16* h = nullptr;
  alignas(16) static char scratch[16];
  const size_t fwd = cuda::attention_gemm_workspace_bytes(1, t, d, false, false);
  expect_error(
      [&] {
        cuda::attention_gemm_forward(f, f, f, nullptr, nullptr, bh, t, d, true, scratch, fwd - 1,
                                     kStream);
      },
      {"attention_gemm_forward", "workspace", std::to_string(fwd - 1), std::to_string(fwd)});
  const size_t bwd = cuda::attention_gemm_workspace_bytes(1, t, d, true, true);
  expect_error(
      [&] {
        cuda::attention_gemm_backward(h, h, h, h, nullptr, h, nullptr, nullptr, nullptr, bh, t, d,
                                      false, scratch, bwd - 1, kStream);
      },
      {"attention_gemm_backward", "workspace", std::to_string(bwd - 1), std::to_string(bwd)});
  expect_error(
      [&] {
        cuda::attention_gemm_backward(f, f, f, f, nullptr, f, nullptr, nullptr, nullptr, bh, t, d,
                                      false, nullptr, bwd, kStream);
      },
      {"attention_gemm_backward", "workspace is null"});
}

TEST(AttentionCuda, EmptyInputsDoNothing) {
  // Nothing to compute: returns before touching the device (no GPU needed), pointers unused.
  const float* f = nullptr;
  for (const Shape& s : {Shape{0, 5, 8}, Shape{3, 0, 8}}) {
    EXPECT_EQ(cuda::attention_backward_workspace_bytes(s.bh, s.t, s.d), 0u);
    cuda::attention_forward(f, f, f, nullptr, nullptr, s.bh, s.t, s.d, true, kStream);
    cuda::attention_backward(f, f, f, f, nullptr, f, nullptr, nullptr, nullptr, s.bh, s.t, s.d,
                             true, nullptr, 0, kStream);
    EXPECT_EQ(cuda::attention_gemm_heads_per_pass(s.bh, s.t, s.d, false, true, size_t(1) << 30), 0);
    cuda::attention_gemm_forward(f, f, f, nullptr, nullptr, s.bh, s.t, s.d, true, nullptr, 0,
                                 kStream);
    cuda::attention_gemm_backward(f, f, f, f, nullptr, f, nullptr, nullptr, nullptr, s.bh, s.t, s.d,
                                  true, nullptr, 0, kStream);
  }
}

#endif  // LOOM_WITH_CUDA

}  // namespace
}  // namespace loom::kernels
