// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011). A draw is a pure function
// of (key, counter), so any element of a random tensor can be produced alone: a shard of a
// parameter or a dropout mask is the same numbers whatever the parallel layout. Header-only and
// host/device so CPU and CUDA kernels draw identical values.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/numeric.h"

namespace loom::philox {

struct Block {
  uint32_t v[4];
};

LOOM_HOST_DEVICE inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = uint64_t(a) * uint64_t(b);
  hi = uint32_t(p >> 32);
  lo = uint32_t(p);
}

// Ten rounds over a 128-bit counter with a 64-bit key.
LOOM_HOST_DEVICE inline Block philox4x32(uint64_t counter_lo, uint64_t counter_hi, uint64_t key) {
  uint32_t c0 = uint32_t(counter_lo), c1 = uint32_t(counter_lo >> 32);
  uint32_t c2 = uint32_t(counter_hi), c3 = uint32_t(counter_hi >> 32);
  uint32_t k0 = uint32_t(key), k1 = uint32_t(key >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(0xD2511F53u, c0, hi0, lo0);
    mulhilo(0xCD9E8D57u, c2, hi1, lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Block{{c0, c1, c2, c3}};
}

// Uniform in [0, 1) with 24 bits, from one 32-bit word.
LOOM_HOST_DEVICE inline float uniform01(uint32_t x) { return float(x >> 8) * (1.0f / 16777216.0f); }

// Standard normal by Box-Muller from two words; uses (0, 1] for the log so it is finite.
LOOM_HOST_DEVICE inline float normal(uint32_t a, uint32_t b) {
  float u1 = (float(a >> 8) + 1.0f) * (1.0f / 16777216.0f);
  float u2 = float(b >> 8) * (1.0f / 16777216.0f);
  return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647692f * u2);
}

// Element i of a stream: one Philox block per element, so element i needs nothing else.
LOOM_HOST_DEVICE inline Block element_block(uint64_t key, uint64_t stream, uint64_t index) {
  return philox4x32(index, stream, key);
}

// 64-bit FNV-1a of a name, to turn a parameter name into a Philox stream id. The offset basis
// is the published 14695981039346656037 (0xcbf29ce484222325); tests/unit/rng_test.cpp pins it.
inline uint64_t hash_name(const char* s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; ++s) h = (h ^ uint64_t(uint8_t(*s))) * 1099511628211ull;
  return h;
}

}  // namespace loom::philox
