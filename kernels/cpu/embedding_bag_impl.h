// Internals shared by the CPU embedding-bag forward (embedding_bag.cpp) and backward
// (embedding_bag_backward.cpp): weight-dtype dispatch, f32 row arithmetic on f32 / bf16 / f16
// rows, and the bounds-check rule. Not part of the kernel interface.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/embedding_bag_types.h"
#include "kernels/numeric.h"

#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace loom::kernels::cpu::detail {

// Calls f(W{}) with W the C++ type of the weights' dtype.
template <typename F>
decltype(auto) dispatch_dtype(EmbeddingDType dtype, F&& f) {
  switch (dtype) {
    case EmbeddingDType::kBF16:
      return f(BFloat16{});
    case EmbeddingDType::kF16:
      return f(Float16{});
    case EmbeddingDType::kF32:
      break;
  }
  return f(float{});
}

inline float to_f32(float x) { return x; }
inline float to_f32(BFloat16 x) { return bits_float(uint32_t(x.bits) << 16); }
inline float to_f32(Float16 x) { return f16_to_float(x); }

inline void from_f32(float x, float* dst) { *dst = x; }
inline void from_f32(float x, BFloat16* dst) { *dst = float_to_bf16(x); }
inline void from_f32(float x, Float16* dst) { *dst = float_to_f16(x); }

// acc[0, n) += s * row[0, n), n a multiple of 4. The f32 and bf16 loops vectorise as written;
// f16 uses the F16C conversion where the target has it (the portable one does not vectorise).
inline void axpy_row(float* acc, const float* row, float s, int64_t n) {
  for (int64_t c = 0; c < n; ++c) acc[c] += s * row[c];
}
inline void axpy_row(float* acc, const BFloat16* row, float s, int64_t n) {
  for (int64_t c = 0; c < n; ++c) acc[c] += s * bits_float(uint32_t(row[c].bits) << 16);
}
inline void axpy_row(float* acc, const Float16* row, float s, int64_t n) {
#if defined(__F16C__)
  static_assert(sizeof(Float16) == 2, "8 Float16 must fill 16 bytes");
  int64_t c = 0;
  const __m256 vs = _mm256_set1_ps(s);
  for (; c + 8 <= n; c += 8) {
    const __m256 w = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c)));
    _mm256_storeu_ps(acc + c, _mm256_fmadd_ps(vs, w, _mm256_loadu_ps(acc + c)));
  }
  for (; c < n; ++c) acc[c] += s * f16_to_float(row[c]);
#else
  for (int64_t c = 0; c < n; ++c) acc[c] += s * f16_to_float(row[c]);
#endif
}

// 16 floats as one value (GCC / Clang vector extension): a zmm register with AVX-512, a pair of
// ymm with AVX2. Local tiles of these stay in registers where a float array would not.
typedef float F32x16 __attribute__((vector_size(64)));
typedef uint16_t U16x16 __attribute__((vector_size(32)));
typedef uint32_t U32x16 __attribute__((vector_size(64)));

// Loads 16 weights at p as f32 (unaligned).
inline F32x16 load16(const float* p) {
  F32x16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline F32x16 load16(const BFloat16* p) {
  U16x16 h;
  std::memcpy(&h, p, sizeof(h));
  const U32x16 bits = __builtin_convertvector(h, U32x16) << 16;  // bf16 is f32's top half
  F32x16 v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}
inline F32x16 load16(const Float16* p) {
  F32x16 v;
#if defined(__F16C__)  // (not _mm512_cvtph_ps: GCC 12 warns inside it, -Wmaybe-uninitialized)
  const __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
  std::memcpy(&v, &lo, sizeof(lo));
  std::memcpy(reinterpret_cast<char*>(&v) + sizeof(lo), &hi, sizeof(hi));
#else
  for (int i = 0; i < 16; ++i) v[i] = f16_to_float(p[i]);
#endif
  return v;
}
inline void store16(float* p, F32x16 v) { std::memcpy(p, &v, sizeof(v)); }

template <typename W>
inline float dot_row(const float* a, const W* row, int64_t n) {
  float sum = 0.0f;
  for (int64_t c = 0; c < n; ++c) sum += a[c] * to_f32(row[c]);
  return sum;
}

// The row a lookup reads under the bounds-check mode, or -1 for "contributes nothing".
// See Note [Embedding bounds check]: kError skips too, defensively (the op validated first).
inline int64_t resolve_row(int64_t index, int64_t rows, EmbeddingBoundsCheck mode) {
  if (static_cast<uint64_t>(index) < static_cast<uint64_t>(rows)) return index;
  return mode == EmbeddingBoundsCheck::kWarn && rows > 0 ? 0 : -1;
}

// packed[t] = sum_{t'<t} L_t' * dims[t'] (T+1 entries): where table t's block of the unpooled
// output starts. See Note [Embedding bag layout].
template <typename Index>
std::vector<int64_t> packed_offsets(const EmbeddingTables& tables,
                                    const EmbeddingBagIndices<Index>& in) {
  const int64_t nt = tables.num_tables, b = in.batch_size;
  std::vector<int64_t> packed(static_cast<size_t>(nt) + 1, 0);
  for (int64_t t = 0; t < nt; ++t) {
    const int64_t lookups = int64_t(in.offsets[(t + 1) * b]) - int64_t(in.offsets[t * b]);
    packed[size_t(t) + 1] = packed[size_t(t)] + lookups * tables.dims[t];
  }
  return packed;
}

}  // namespace loom::kernels::cpu::detail
