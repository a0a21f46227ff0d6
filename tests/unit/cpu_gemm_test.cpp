// The CPU GEMM (kernels/cpu/gemm.h) and its packed kernel (Note [A packed GEMM]): every transpose
// combination, alpha and beta, edge tiles, k across several k-blocks, n across column blocks and
// padded leading dimensions against a product summed in double; beta == 0 never reads C (NaN
// garbage stays out); and the kernel's bits depend on an element's row and column alone: the same
// with 1 and 2 threads, for a block of rows computed alone, and with the operands moved in memory.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_packed.h"

namespace loom::kernels::cpu {
namespace {

struct Shape {
  bool trans_a, trans_b;
  int64_t m, n, k;
  int64_t pad;  // extra elements per stored row
};

struct Problem {
  Shape s;
  int64_t lda, ldb, ldc;
  std::vector<float> a, b, c;

  Problem(const Shape& shape, uint32_t seed) : s(shape) {
    const int64_t a_rows = s.trans_a ? s.k : s.m, a_cols = s.trans_a ? s.m : s.k;
    const int64_t b_rows = s.trans_b ? s.n : s.k, b_cols = s.trans_b ? s.k : s.n;
    lda = a_cols + s.pad;
    ldb = b_cols + s.pad;
    ldc = s.n + s.pad;
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    a.resize(size_t(a_rows * lda));
    b.resize(size_t(b_rows * ldb));
    c.resize(size_t(s.m * ldc));
    for (float& x : a) x = u(gen);
    for (float& x : b) x = u(gen);
    for (float& x : c) x = u(gen);
  }
  double op_a(int64_t i, int64_t p) const {
    return s.trans_a ? a[size_t(p * lda + i)] : a[size_t(i * lda + p)];
  }
  double op_b(int64_t p, int64_t j) const {
    return s.trans_b ? b[size_t(j * ldb + p)] : b[size_t(p * ldb + j)];
  }
};

using Gemm = void (*)(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                      const float*, int64_t, float, float*, int64_t);

// C = alpha op(A) op(B) + beta C against the double sum: each product's rounding is at most
// 2^-24 of |a||b|, so the error is bounded by k * 2^-23 * sum |a b| (and beta C's own rounding).
void expect_matches_double(Gemm gemm_fn, const Shape& s, float alpha, float beta) {
  Problem p(s, uint32_t(s.m * 131 + s.n * 7 + s.k));
  std::vector<float> c = p.c;
  if (beta == 0.0f)  // garbage C must not leak into the result
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < s.n; ++j)
        c[size_t(i * p.ldc + j)] = std::numeric_limits<float>::quiet_NaN();
  gemm_fn(s.trans_a, s.trans_b, s.m, s.n, s.k, alpha, p.a.data(), p.lda, p.b.data(), p.ldb, beta,
          c.data(), p.ldc);
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.n; ++j) {
      double sum = 0, magnitude = 0;
      for (int64_t q = 0; q < s.k; ++q) {
        sum += p.op_a(i, q) * p.op_b(q, j);
        magnitude += std::abs(p.op_a(i, q) * p.op_b(q, j));
      }
      const double c0 = p.c[size_t(i * p.ldc + j)];
      const double want = alpha * sum + (beta == 0.0f ? 0.0 : beta * c0);
      const double bound =
          (double(s.k) + 2) * 0x1p-23 * (std::abs(alpha) * magnitude + std::abs(beta * c0));
      ASSERT_NEAR(c[size_t(i * p.ldc + j)], want, bound)
          << "trans_a " << s.trans_a << " trans_b " << s.trans_b << " m " << s.m << " n " << s.n
          << " k " << s.k << " at (" << i << ", " << j << ")";
    }
  // Padding between rows of C is never written.
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = s.n; j < p.ldc; ++j)
      ASSERT_EQ(std::memcmp(&c[size_t(i * p.ldc + j)], &p.c[size_t(i * p.ldc + j)], 4), 0);
}

const Shape kShapes[] = {
    {false, false, 1, 1, 1, 0},
    {false, true, 6, 16, 256, 0},
    {true, false, 7, 17, 257, 3},
    {true, true, 13, 37, 300, 1},
    {false, true, 50, 33, 600, 5},
    {false, false, 145, 40, 20, 0},
    {true, false, 300, 70, 513, 2},
    {false, true, 3, 4100, 9, 0},
    {true, true, 2, 5, 1000, 0},
    // Whole 6 x 32 tiles and panels (the zmm kernel's) in every transpose combination.
    {false, false, 6, 32, 40, 0},
    {false, true, 12, 64, 33, 1},
    {true, false, 18, 96, 17, 0},
    {true, true, 12, 64, 260, 2},
};

TEST(CpuGemm, MatchesDoubleSums) {
  for (const Shape& s : kShapes)
    for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, {0.5f, 1.0f}, {-2.0f, 0.25f}})
      expect_matches_double(gemm, s, alpha, beta);
}

TEST(CpuGemm, PackedKernelMatchesDoubleSums) {
  if (!detail::gemm_packed_compiled()) GTEST_SKIP() << "built without AVX2 and FMA";
  for (const Shape& s : kShapes)
    for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, {0.5f, 1.0f}, {-2.0f, 0.25f}})
      expect_matches_double(detail::gemm_packed, s, alpha, beta);
}

TEST(CpuGemm, EmptySumScalesOrZeroesC) {
  std::vector<float> c = {std::numeric_limits<float>::quiet_NaN(), 1.0f, 2.0f, 3.0f};
  gemm(false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.0f, c.data(), 2);
  EXPECT_EQ(c, (std::vector<float>{0, 0, 0, 0}));
  c = {1, 2, 3, 4};
  gemm(false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 2.0f, c.data(), 2);
  EXPECT_EQ(c, (std::vector<float>{2, 4, 6, 8}));
}

// The packed kernel's bits: a function of the element's row, column, alpha and beta only.
TEST(CpuGemm, PackedBitsDependOnRowAndColumnAlone) {
  if (!detail::gemm_packed_compiled()) GTEST_SKIP() << "built without AVX2 and FMA";
  for (const Shape& s : {Shape{false, true, 301, 530, 700, 0}, Shape{true, false, 97, 40, 1030, 0},
                         Shape{false, false, 64, 4200, 70, 0}}) {
    Problem p(s, 7);
    auto run = [&](int threads, int64_t row0, int64_t rows, int64_t shift) {
      // Operands copied `shift` floats further into fresh buffers (other alignment).
      std::vector<float> a(p.a.size() + 16), b(p.b.size() + 16), c(size_t(rows * p.ldc) + 16);
      std::memcpy(a.data() + shift, p.a.data(), p.a.size() * 4);
      std::memcpy(b.data() + shift, p.b.data(), p.b.size() * 4);
      std::memcpy(c.data() + shift, p.c.data() + row0 * p.ldc, size_t(rows * p.ldc) * 4);
      const float* a0 = a.data() + shift + (s.trans_a ? row0 : row0 * p.lda);
      const int saved = omp_get_max_threads();
      omp_set_num_threads(threads);
      detail::gemm_packed(s.trans_a, s.trans_b, rows, s.n, s.k, 0.75f, a0, p.lda, b.data() + shift,
                          p.ldb, 0.5f, c.data() + shift, p.ldc);
      omp_set_num_threads(saved);
      return std::vector<float>(c.begin() + shift, c.begin() + shift + rows * p.ldc);
    };
    const std::vector<float> one = run(1, 0, s.m, 0);
    EXPECT_EQ(std::memcmp(run(2, 0, s.m, 0).data(), one.data(), one.size() * 4), 0)
        << "2 threads differ from 1, m " << s.m;
    EXPECT_EQ(std::memcmp(run(2, 0, s.m, 3).data(), one.data(), one.size() * 4), 0)
        << "moved operands differ, m " << s.m;
    const int64_t row0 = 5, rows = s.m / 3;  // a block of rows alone, as one rank's batch share
    EXPECT_EQ(std::memcmp(run(1, row0, rows, 1).data(), one.data() + row0 * p.ldc,
                          size_t(rows * p.ldc) * 4),
              0)
        << "rows " << row0 << ".." << row0 + rows << " alone differ, m " << s.m;
  }
}

}  // namespace
}  // namespace loom::kernels::cpu
