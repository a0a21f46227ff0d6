// Reduced-precision number formats shared by every layer. They are plain 16-bit patterns with
// conversions to and from float; arithmetic always happens in f32 (DESIGN.md: "bf16/f16
// arithmetic accumulates in f32"). The conversions round to nearest even, like the hardware.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define LOOM_HOST_DEVICE __host__ __device__
#else
#define LOOM_HOST_DEVICE
#endif

namespace loom {

struct BFloat16 {
  uint16_t bits;
};
struct Float16 {
  uint16_t bits;
};
static_assert(sizeof(BFloat16) == 2 && sizeof(Float16) == 2, "16-bit formats must be 2 bytes");

LOOM_HOST_DEVICE inline uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
LOOM_HOST_DEVICE inline float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

LOOM_HOST_DEVICE inline float bf16_to_float(BFloat16 h) {
  return bits_float(uint32_t(h.bits) << 16);
}

LOOM_HOST_DEVICE inline BFloat16 float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return BFloat16{uint16_t((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return BFloat16{uint16_t(u >> 16)};
}

LOOM_HOST_DEVICE inline float f16_to_float(Float16 h) {
  uint32_t sign = uint32_t(h.bits & 0x8000u) << 16;
  uint32_t exp = (h.bits >> 10) & 0x1fu;
  uint32_t man = h.bits & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (man << 13));  // inf / nan
  if (exp == 0) {
    if (man == 0) return bits_float(sign);
    // subnormal: value = man * 2^-24
    float v = float(man) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}

LOOM_HOST_DEVICE inline Float16 float_to_f16(float f) {
  uint32_t u = float_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return Float16{uint16_t(sign | 0x7e00u)};   // nan
  if (a >= 0x477ff000u) return Float16{uint16_t(sign | 0x7c00u)};  // overflow -> inf
  if (a < 0x38800000u) {  // subnormal or zero in f16: round(|f| * 2^24)
    float v = bits_float(a) * 16777216.0f;
    uint32_t r = uint32_t(v);
    float frac = v - float(r);
    if (frac > 0.5f || (frac == 0.5f && (r & 1u))) ++r;
    return Float16{uint16_t(sign | r)};
  }
  uint32_t mant_odd = (a >> 13) & 1u;
  a += 0xfffu + mant_odd;  // round to nearest even at bit 13
  return Float16{uint16_t(sign | ((a - 0x38000000u) >> 13))};
}

}  // namespace loom
