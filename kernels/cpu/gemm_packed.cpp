// Note [A packed GEMM]
// Eigen 3.4's GEMM on an AVX2 target (AMD EPYC Zen 3, no AVX-512) ran the GPT's shapes at 48-64
// GFLOP/s on one core where OpenBLAS, PyTorch's BLAS, ran them at 81-85: most of the gap between
// loom's and PyTorch's training step at one thread (benchmarks/README.md). Its 16-lane AVX-512
// kernel measured on par with OpenBLAS on AVX-512 Xeons, but not on Zen 4 (AMD EPYC, AVX-512
// executed as two 256-bit halves): 78-87 GFLOP/s on the GPT's forward and backward shapes where
// this kernel runs them at 97-107 and torch.mm's best is 104. So gemm() uses this kernel wherever
// it is compiled (gemm_packed_preferred), AVX2 or AVX-512; Eigen only on other targets. (Not yet
// measured on an AVX-512 Xeon, where its zmm micro-kernel issues as many FMAs per cycle as
// Eigen's.)
//
// The structure is the one of Goto's algorithm, as BLIS and OpenBLAS have it: op(B) is packed in
// blocks of kKc x kNc into panels kNr columns wide, op(A) in blocks of kMc x kKc into panels kMr
// rows tall, each zero-padded to whole panels; a 6 x kNr micro-kernel keeps its tile of C in 12
// vector accumulators (two per row: kNr is 16 floats on ymm, 32 on zmm) and adds one rank-1
// update per k from one broadcast of A and two loads of B. A block of A (144 x 256 floats, 144
// KiB) stays in L2, a panel of B (16 or 32 KiB) in L1.
//
// Bits. Every element of C is the sum over k of its products, accumulated in order by one FMA
// chain per k-block of kKc and the k-blocks added to C in order, so it depends on its row of
// op(A), its column of op(B), alpha and beta only: not on the thread count, the shape of C, where
// the operands sit (packing removes alignment; Note [Aligned scratch]) or the vector width (an
// AVX-512 and an AVX2 build give the same bits). Data parallelism's equivalence tests rely on
// that (a batch split over ranks computes each row as one process does). Threads split C into
// blocks; k is never split.
#include "kernels/cpu/gemm_packed.h"

#include <algorithm>

#include "core/error.h"

#if defined(__AVX2__) && defined(__FMA__)
#define LOOM_GEMM_AVX2 1
#include <immintrin.h>
#include <omp.h>

#include "kernels/cpu/aligned_buffer.h"
#endif

namespace loom::kernels::cpu::detail {

#ifndef LOOM_GEMM_AVX2

bool gemm_packed_compiled() { return false; }
bool gemm_packed_preferred() { return false; }
void gemm_packed(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                 int64_t, float, float*, int64_t) {
  LOOM_ASSERT(false, "gemm_packed: this build was not compiled with AVX2 and FMA");
}

#else

namespace {

// The micro-kernel's vectors: zmm where the target has AVX-512, else ymm. Every operation the
// kernel uses, under one name per width, so that both widths run the same code.
#if defined(__AVX512F__)
struct Lanes {
  using V = __m512;
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V load(const float* p) { return _mm512_load_ps(p); }
  static V loadu(const float* p) { return _mm512_loadu_ps(p); }
  static V broadcast(const float* p) { return _mm512_set1_ps(*p); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static void store(float* p, V v) { _mm512_store_ps(p, v); }
  static void storeu(float* p, V v) { _mm512_storeu_ps(p, v); }
};
constexpr int64_t kNc = 4064;  // columns of a block of B (a multiple of kNr)
#else
struct Lanes {
  using V = __m256;
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V load(const float* p) { return _mm256_load_ps(p); }
  static V loadu(const float* p) { return _mm256_loadu_ps(p); }
  static V broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static void store(float* p, V v) { _mm256_store_ps(p, v); }
  static void storeu(float* p, V v) { _mm256_storeu_ps(p, v); }
};
constexpr int64_t kNc = 4080;  // columns of a block of B (a multiple of kNr)
#endif
constexpr int64_t kWidth = int64_t(sizeof(Lanes::V) / sizeof(float));  // floats per vector

constexpr int64_t kMr = 6;           // rows of the micro-kernel's tile
constexpr int64_t kNr = 2 * kWidth;  // columns: two vectors
constexpr int64_t kKc = 256;         // the k-block
constexpr int64_t kMc = 144;         // rows of a block of A (a multiple of kMr)
static_assert(kNc % kNr == 0);
constexpr int64_t kPackSlack = 8;  // floats past a packed block that pack_a may write (2 used)
constexpr int64_t kSerialWork = int64_t(1) << 18;  // m * n * k below which one thread does it

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// The operands as gemm() sees them: element (i, p) of op(A), (p, j) of op(B).
struct Operands {
  bool trans_a, trans_b;
  const float* a;
  int64_t lda;
  const float* b;
  int64_t ldb;
};

// Transposes the 8 x 8 block held in r[0..7] (row i in r[i]) in place.
inline void transpose8x8(__m256 r[8]) {
  __m256 t[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  __m256 u[8];
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// Rows i0 .. i0 + rows of op(A) over k-columns p0 .. p0 + kc into panels of kMr rows, each
// stored k-major (kMr values per k), the rows past `rows` zero.
void pack_a(const Operands& o, int64_t i0, int64_t rows, int64_t p0, int64_t kc, float* out) {
  for (int64_t ir = 0; ir < rows; ir += kMr) {
    const int64_t mr = std::min(kMr, rows - ir);
    float* panel = out + ir * kc;
    if (o.trans_a) {  // A stored [k, m]: a panel's kMr values per k are adjacent
      // A masked load reads the real rows only (the lanes past them neither fault nor count);
      // the 8-wide store's last 2 lanes are overwritten as in the transposing path below.
      alignas(32) int32_t lanes[8];
      for (int i = 0; i < 8; ++i) lanes[i] = i < mr ? -1 : 0;
      const __m256i mask = _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes));
      for (int64_t p = 0; p < kc; ++p)
        _mm256_storeu_ps(panel + p * kMr,
                         _mm256_maskload_ps(o.a + (p0 + p) * o.lda + i0 + ir, mask));
    } else if (mr == kMr) {  // A stored [m, k]: 8 k at a time through a transpose
      const float* src = o.a + (i0 + ir) * o.lda + p0;
      int64_t p = 0;
      for (; p + 8 <= kc; p += 8) {
        __m256 r[8];
        for (int i = 0; i < kMr; ++i) r[i] = _mm256_loadu_ps(src + i * o.lda + p);
        r[6] = r[7] = _mm256_setzero_ps();
        transpose8x8(r);
        // Each k's 8 values: the 6 rows and 2 that the next k's store (or the next panel, or
        // the scratch's slack: kPackSlack) overwrites.
        for (int i = 0; i < 8; ++i) _mm256_storeu_ps(panel + (p + i) * kMr, r[i]);
      }
      for (; p < kc; ++p)
        for (int64_t i = 0; i < kMr; ++i) panel[p * kMr + i] = src[i * o.lda + p];
    } else {  // the last, partial panel: row by row
      for (int64_t r = 0; r < kMr; ++r) {
        if (r < mr) {
          const float* src = o.a + (i0 + ir + r) * o.lda + p0;
          for (int64_t p = 0; p < kc; ++p) panel[p * kMr + r] = src[p];
        } else {
          for (int64_t p = 0; p < kc; ++p) panel[p * kMr + r] = 0.0f;
        }
      }
    }
  }
}

// Columns j0 + panel * kNr .. of op(B) over k-rows p0 .. p0 + kc into one panel, k-major (kNr
// values per k), the columns past n zero.
void pack_b_panel(const Operands& o, int64_t j0, int64_t cols, int64_t p0, int64_t kc,
                  float* panel) {
  if (o.trans_b && cols == kNr) {  // B stored [n, k]: 8 x 8 blocks through a transpose
    const float* src = o.b + j0 * o.ldb + p0;
    int64_t p = 0;
    for (; p + 8 <= kc; p += 8)
      for (int64_t eighth = 0; eighth < kNr / 8; ++eighth) {
        __m256 r[8];
        for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + (eighth * 8 + i) * o.ldb + p);
        transpose8x8(r);
        for (int i = 0; i < 8; ++i) _mm256_store_ps(panel + (p + i) * kNr + eighth * 8, r[i]);
      }
    for (; p < kc; ++p)
      for (int64_t j = 0; j < kNr; ++j) panel[p * kNr + j] = src[j * o.ldb + p];
  } else if (o.trans_b) {  // the last, partial panel: column by column
    for (int64_t j = 0; j < kNr; ++j) {
      if (j < cols) {
        const float* src = o.b + (j0 + j) * o.ldb + p0;
        for (int64_t p = 0; p < kc; ++p) panel[p * kNr + j] = src[p];
      } else {
        for (int64_t p = 0; p < kc; ++p) panel[p * kNr + j] = 0.0f;
      }
    }
  } else if (cols == kNr) {  // B stored [k, n]: a panel's kNr values per k are adjacent
    for (int64_t p = 0; p < kc; ++p) {
      const float* src = o.b + (p0 + p) * o.ldb + j0;
      Lanes::store(panel + p * kNr, Lanes::loadu(src));
      Lanes::store(panel + p * kNr + kWidth, Lanes::loadu(src + kWidth));
    }
  } else {  // the last, partial panel
    for (int64_t p = 0; p < kc; ++p) {
      const float* src = o.b + (p0 + p) * o.ldb + j0;
      for (int64_t j = 0; j < kNr; ++j) panel[p * kNr + j] = j < cols ? src[j] : 0.0f;
    }
  }
}

// C's tile (mr x nr of it real) = alpha * A panel x B panel + beta * C; beta == 0 does not
// read C (it may hold garbage). The twelve accumulators are named variables: held in an array,
// GCC 12 stored the array to the stack on every k.
void micro_kernel(int64_t kc, const float* __restrict a, const float* __restrict b, float* c,
                  int64_t ldc, int64_t mr, int64_t nr, float alpha, float beta) {
  using L = Lanes;
  L::V c00 = L::zero(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  L::V c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (int64_t p = 0; p < kc; ++p) {
    const L::V b0 = L::load(b);
    const L::V b1 = L::load(b + kWidth);
    L::V ar = L::broadcast(a);
    c00 = L::fmadd(ar, b0, c00);
    c01 = L::fmadd(ar, b1, c01);
    ar = L::broadcast(a + 1);
    c10 = L::fmadd(ar, b0, c10);
    c11 = L::fmadd(ar, b1, c11);
    ar = L::broadcast(a + 2);
    c20 = L::fmadd(ar, b0, c20);
    c21 = L::fmadd(ar, b1, c21);
    ar = L::broadcast(a + 3);
    c30 = L::fmadd(ar, b0, c30);
    c31 = L::fmadd(ar, b1, c31);
    ar = L::broadcast(a + 4);
    c40 = L::fmadd(ar, b0, c40);
    c41 = L::fmadd(ar, b1, c41);
    ar = L::broadcast(a + 5);
    c50 = L::fmadd(ar, b0, c50);
    c51 = L::fmadd(ar, b1, c51);
    a += kMr;
    b += kNr;
  }
  const L::V va = L::set1(alpha);
  const L::V acc[kMr][2] = {{L::mul(va, c00), L::mul(va, c01)}, {L::mul(va, c10), L::mul(va, c11)},
                            {L::mul(va, c20), L::mul(va, c21)}, {L::mul(va, c30), L::mul(va, c31)},
                            {L::mul(va, c40), L::mul(va, c41)}, {L::mul(va, c50), L::mul(va, c51)}};
  if (mr == kMr && nr == kNr) {
    const L::V vb = L::set1(beta);
    for (int r = 0; r < kMr; ++r) {
      float* row = c + r * ldc;
      L::V lo = acc[r][0], hi = acc[r][1];
      if (beta != 0.0f) {
        lo = L::add(lo, L::mul(vb, L::loadu(row)));
        hi = L::add(hi, L::mul(vb, L::loadu(row + kWidth)));
      }
      L::storeu(row, lo);
      L::storeu(row + kWidth, hi);
    }
    return;
  }
  // An edge tile: the same arithmetic, element by element over the real part.
  alignas(64) float tile[kMr][kNr];
  for (int r = 0; r < kMr; ++r) {
    L::store(tile[r], acc[r][0]);
    L::store(tile[r] + kWidth, acc[r][1]);
  }
  for (int64_t r = 0; r < mr; ++r)
    for (int64_t j = 0; j < nr; ++j) {
      float& out = c[r * ldc + j];
      out = beta != 0.0f ? tile[r][j] + beta * out : tile[r][j];
    }
}

using Scratch = AlignedVector<float>;

// Per thread, reused from call to call: packing a block must not fault in fresh pages.
Scratch& thread_scratch_a() {
  thread_local Scratch s;
  return s;
}
Scratch& thread_scratch_b() {
  thread_local Scratch s;
  return s;
}

float* sized(Scratch& s, int64_t floats) {
  if (int64_t(s.size()) < floats) s.resize(size_t(floats));
  return s.data();
}

}  // namespace

bool gemm_packed_compiled() { return true; }

bool gemm_packed_preferred() { return true; }

void gemm_packed(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc) {
  LOOM_ASSERT(m > 0 && n > 0 && k > 0, "gemm_packed: empty product m=", m, " n=", n, " k=", k);
  const Operands o{trans_a, trans_b, a, lda, b, ldb};
  const int threads = omp_in_parallel() || m * n * k < kSerialWork ? 1 : omp_get_max_threads();
  // Rows per block of A: at most kMc, fewer when that gives every thread a block.
  const int64_t mc = std::min(kMc, round_up((m + threads - 1) / threads, kMr));
  const int64_t m_blocks = (m + mc - 1) / mc;
  Scratch& b_scratch = thread_scratch_b();
  for (int64_t j0 = 0; j0 < n; j0 += kNc) {
    const int64_t nc = std::min(kNc, n - j0);
    const int64_t panels = (nc + kNr - 1) / kNr;
    // When C has fewer row blocks than threads, each row block's panels are split too.
    const int64_t splits = m_blocks >= threads ? 1 : std::min<int64_t>(panels, threads / m_blocks);
    for (int64_t p0 = 0; p0 < k; p0 += kKc) {
      const int64_t kc = std::min(kKc, k - p0);
      float* packed_b = sized(b_scratch, panels * kNr * kc);
      const float beta_here = p0 == 0 ? beta : 1.0f;  // later k-blocks add to C
#pragma omp parallel num_threads(threads) if (threads > 1)
      {
#pragma omp for schedule(static)
        for (int64_t q = 0; q < panels; ++q)
          pack_b_panel(o, j0 + q * kNr, std::min(kNr, nc - q * kNr), p0, kc,
                       packed_b + q * kNr * kc);
          // (the for's barrier: B is packed before any thread reads it)
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < m_blocks * splits; ++item) {
          const int64_t i0 = (item / splits) * mc;
          const int64_t rows = std::min(mc, m - i0);
          const int64_t first = panels * (item % splits) / splits;
          const int64_t last = panels * (item % splits + 1) / splits;
          float* packed_a = sized(thread_scratch_a(), round_up(rows, kMr) * kc + kPackSlack);
          pack_a(o, i0, rows, p0, kc, packed_a);
          for (int64_t q = first; q < last; ++q) {
            const int64_t j = j0 + q * kNr;
            for (int64_t ir = 0; ir < rows; ir += kMr)
              micro_kernel(kc, packed_a + ir * kc, packed_b + q * kNr * kc, c + (i0 + ir) * ldc + j,
                           ldc, std::min(kMr, rows - ir), std::min(kNr, n - j), alpha, beta_here);
          }
        }
      }
    }
  }
}

#endif

}  // namespace loom::kernels::cpu::detail
