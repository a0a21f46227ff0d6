// Internals shared by the CPU embedding-bag forward (embedding_bag.cpp), backward
// (embedding_bag_backward.cpp) and lookup grouping (embedding_bag_segments.cpp): weight-dtype
// dispatch, f32 row arithmetic on f32 / bf16 / f16 rows, the bounds-check rule, and the sorted
// segments. Not part of the kernel interface.
#pragma once

#include <algorithm>
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

// Note [Prefetches the compiler drops]
// GCC 12's IPA pure-const pass finds a function whose only effect is __builtin_prefetch to be
// "looping const" and, since its result is unused, deletes the calls to it. A small prefetching
// helper or lambda that is not inlined before that pass (the backward's prefetch_bytes, the
// forward's look-ahead lambda in pool_tile) therefore vanished: the backward's object file held
// no prefetch instruction at all, and the forward kept only the ones written inline. The empty
// volatile asm below is an effect the pass must keep, so every caller keeps its prefetches; it
// clobbers nothing, so it costs no instruction. tests/unit/kernels_object_code.sh checks
// the object files.
//
// Note [Prefetch loops]
// A row's lines are prefetched by straight-line code (a switch falling through up to 8 lines,
// whole groups of 8 before it), not by a loop of one prefetch per line whose trip count, the
// row's bytes, is known only at run time. With that loop the forward at FBGEMM's default shape
// (rows of 512 bytes) took 1.3-1.4x the time of the same kernel compiled with the row width
// known (its 8 prefetches unrolled), timed in turn in one process on the 2-vCPU Zen 5 VM:
// 13.5-15 ms against 10-11 ms, and torch.nn.EmbeddingBag's 11-12 ms. The prefetches stall the
// core once its miss buffers are full; a loop branch per line, and its exit, apparently cost the
// look-ahead the core would otherwise keep. No hardware counters here to say more.
//
// Starts loading the 64-byte lines of [p, p + bytes) (locality and write intent as
// __builtin_prefetch's).
template <int Locality, int Write = 0>
inline void prefetch_lines(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  int64_t lines = (bytes + 63) / 64;
  for (; lines > 8; lines -= 8, c += 512)
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) __builtin_prefetch(c + 64 * k, Write, Locality);
  switch (lines) {  // the last 1-8 lines, straight-line code
    case 8:
      __builtin_prefetch(c + 448, Write, Locality);
      [[fallthrough]];
    case 7:
      __builtin_prefetch(c + 384, Write, Locality);
      [[fallthrough]];
    case 6:
      __builtin_prefetch(c + 320, Write, Locality);
      [[fallthrough]];
    case 5:
      __builtin_prefetch(c + 256, Write, Locality);
      [[fallthrough]];
    case 4:
      __builtin_prefetch(c + 192, Write, Locality);
      [[fallthrough]];
    case 3:
      __builtin_prefetch(c + 128, Write, Locality);
      [[fallthrough]];
    case 2:
      __builtin_prefetch(c + 64, Write, Locality);
      [[fallthrough]];
    case 1:
      __builtin_prefetch(c, Write, Locality);
      [[fallthrough]];
    default:
      break;
  }
  asm volatile("");
}

// Built without AVX-512 or AVX (LOOM_NATIVE=OFF), GCC notes that a 64- or 32-byte vector return has
// another ABI there; these helpers are inline within the kernel files, so no call crosses that ABI.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

// The widest vector the target adds in one instruction, as one value (GCC / Clang vector
// extension): 16 floats (a zmm register) with AVX-512, else 8 (a ymm with AVX2). Local tiles of
// these stay in registers where a float array would not; a wider generic vector does not (Note
// [Embedding tile width], embedding_bag.cpp).
#if defined(__AVX512F__)
inline constexpr int kLanes = 16;
#else
inline constexpr int kLanes = 8;
#endif
typedef float F32xV __attribute__((vector_size(4 * kLanes)));
typedef uint16_t U16xV __attribute__((vector_size(2 * kLanes)));
typedef uint32_t U32xV __attribute__((vector_size(4 * kLanes)));

// Loads kLanes weights at p as f32 (unaligned).
inline F32xV load_lanes(const float* p) {
  F32xV v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline F32xV load_lanes(const BFloat16* p) {
  U16xV h;
  std::memcpy(&h, p, sizeof(h));
  const U32xV bits = __builtin_convertvector(h, U32xV) << 16;  // bf16 is f32's top half
  F32xV v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}
inline F32xV load_lanes(const Float16* p) {
  F32xV v;
#if defined(__F16C__)  // 8 at a time (not _mm512_cvtph_ps: GCC 12 warns inside it)
  for (int part = 0; part < kLanes / 8; ++part) {
    const __m256 x =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8 * part)));
    std::memcpy(reinterpret_cast<char*>(&v) + sizeof(x) * part, &x, sizeof(x));
  }
#else
  for (int i = 0; i < kLanes; ++i) v[i] = f16_to_float(p[i]);
#endif
  return v;
}
inline void store_lanes(float* p, const F32xV& v) { std::memcpy(p, &v, sizeof(v)); }

// Stores kLanes floats at p rounded to nearest even, as float_to_bf16 / float_to_f16 do one by one.
inline void store_lanes(BFloat16* p, const F32xV& v) {
  U32xV u;
  std::memcpy(&u, &v, sizeof(u));
  const U32xV rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const U32xV nan = (u >> 16) | 0x40u;  // quiet NaN, as float_to_bf16
  const U32xV bits = (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
  const U16xV h = __builtin_convertvector(bits, U16xV);
  std::memcpy(p, &h, sizeof(h));
}
inline void store_lanes(Float16* p, const F32xV& v) {
#if defined(__F16C__)
  for (int part = 0; part < kLanes / 8; ++part) {
    __m256 x;
    std::memcpy(&x, reinterpret_cast<const char*>(&v) + sizeof(x) * part, sizeof(x));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 8 * part),
                     _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
#else
  for (int i = 0; i < kLanes; ++i) p[i] = float_to_f16(v[i]);
#endif
}

// dst[0, n) = src[0, n) converted (n a multiple of 4), kLanes at a time.
template <typename From, typename To>
inline void convert_row(const From* src, To* dst, int64_t n) {
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) store_lanes(dst + c, load_lanes(src + c));
  for (; c < n; ++c) from_f32(to_f32(src[c]), dst + c);
}

// sum_c a[c] * to_f32(b[c]) over n (a multiple of 4), in 16 lanes then lanes 0..15 in order: the
// same bits every call and on every target, and vector speed (a plain float sum cannot be
// reordered by the compiler). The 16 lanes are 16 / kLanes native vectors (Note [Embedding tile
// width]: one 16-float vector is spilled on AVX2).
template <typename W>
inline float dot_row(const float* a, const W* b, int64_t n) {
  constexpr int kParts = 16 / kLanes;
  F32xV acc[kParts] = {};
  int64_t c = 0;
  for (; c + 16 <= n; c += 16)
    for (int j = 0; j < kParts; ++j)
      acc[j] += load_lanes(a + c + j * kLanes) * load_lanes(b + c + j * kLanes);
  float sum = 0.0f;
  for (int j = 0; j < kParts; ++j)
    for (int i = 0; i < kLanes; ++i) sum += acc[j][i];
  for (; c < n; ++c) sum += a[c] * to_f32(b[c]);
  return sum;
}

#pragma GCC diagnostic pop

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

using ::loom::kernels::embedding_bit_width;

// A batch's lookups grouped by (table, row) (embedding_bag_segments.cpp): sorted entries
// [seg_start[k], seg_start[k+1]) are segment k, one unique (table, row), its lookups in index
// order. Skipped lookups (bounds check) are in no segment. See Note [Deterministic embedding
// backward]. The arrays live in the calling thread's workspace, valid until its next call.
struct Segments {
  const uint64_t* sorted = nullptr;  // [num_indices]: (key << pos_bits) | position
  int pos_bits = 0;
  const int64_t* seg_start = nullptr;  // [segments + 1]
  const int32_t* seg_table = nullptr;  // [segments]: the table of segment k
  int64_t segments = 0;
  const int64_t* bag = nullptr;      // [sorted entries]: t*B+b of sorted entry i's lookup
  const float* bag_scale = nullptr;  // [T*B]: 1 / len of each bag (mean pooling only)
  std::vector<uint64_t> base;        // [T+1] first key of table t: key = base[t] + row

  int64_t position(int64_t i) const { return int64_t(sorted[i] & ((uint64_t(1) << pos_bits) - 1)); }
  uint64_t key(int64_t i) const { return sorted[i] >> pos_bits; }
  int64_t table(int64_t k) const { return seg_table[k]; }
  int64_t row(int64_t k, int64_t t) const { return int64_t(key(seg_start[k]) - base[size_t(t)]); }
};

// Keys, sorts and segments the lookups of a validated batch (bounds-check mode applied).
template <typename Index>
Segments make_segments(const EmbeddingTables& tables, const EmbeddingBagIndices<Index>& in,
                       const EmbeddingBagOptions& opt);

}  // namespace loom::kernels::cpu::detail
