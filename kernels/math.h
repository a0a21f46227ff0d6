// The elementwise math of the unary kernels (kernels/cpu/math.h and their CUDA twins): one
// definition for both sides, so they cannot disagree on a formula. Each function's value and its
// derivative are written with C's float functions (expf, logf, ...), which CUDA provides on the
// device; results may still differ in the last bits between the two libraries.
#pragma once

#include <math.h>

#include <cstdint>

#if defined(__CUDACC__)
#define LOOM_HOST_DEVICE __host__ __device__
#else
#define LOOM_HOST_DEVICE
#endif

namespace loom::kernels {

enum class UnaryOp : int {
  kExp,
  kLog,
  kSqrt,
  kRsqrt,
  kAbs,
  kNeg,
  kTanh,
  kSin,
  kCos,
  kErf,
  kLog1p,
  kExpm1,
  kFloor,
  kCeil,
  kRound,  // half to even, as torch.round (rintf in the default rounding mode)
  kTrunc
};

LOOM_HOST_DEVICE inline float unary_value(float x, UnaryOp op) {
  switch (op) {
    case UnaryOp::kExp:
      return expf(x);
    case UnaryOp::kLog:
      return logf(x);
    case UnaryOp::kSqrt:
      return sqrtf(x);
    case UnaryOp::kRsqrt:
      return 1.0f / sqrtf(x);  // not CUDA's rsqrtf, whose rounding differs from the host's
    case UnaryOp::kAbs:
      return fabsf(x);
    case UnaryOp::kNeg:
      return -x;
    case UnaryOp::kTanh:
      return tanhf(x);
    case UnaryOp::kSin:
      return sinf(x);
    case UnaryOp::kCos:
      return cosf(x);
    case UnaryOp::kErf:
      return erff(x);
    case UnaryOp::kLog1p:
      return log1pf(x);
    case UnaryOp::kExpm1:
      return expm1f(x);
    case UnaryOp::kFloor:
      return floorf(x);
    case UnaryOp::kCeil:
      return ceilf(x);
    case UnaryOp::kRound:
      return rintf(x);
    case UnaryOp::kTrunc:
      return truncf(x);
  }
  return 0.0f;
}

// dL/dx from dL/dy = g, the input x and the output y = op(x) (PyTorch's formulas: abs's slope is
// sign(x), 0 at 0; rsqrt's is -y^3 / 2).
LOOM_HOST_DEVICE inline float unary_grad(float x, float y, float g, UnaryOp op) {
  switch (op) {
    case UnaryOp::kExp:
      return g * y;
    case UnaryOp::kLog:
      return g / x;
    case UnaryOp::kSqrt:
      return g / (2.0f * y);
    case UnaryOp::kRsqrt:
      return -0.5f * g * y * y * y;
    case UnaryOp::kAbs:
      return x > 0.0f ? g : (x < 0.0f ? -g : 0.0f);
    case UnaryOp::kNeg:
      return -g;
    case UnaryOp::kTanh:
      return g * (1.0f - y * y);
    case UnaryOp::kSin:
      return g * cosf(x);
    case UnaryOp::kCos:
      return -g * sinf(x);
    case UnaryOp::kErf:  // 2 / sqrt(pi) * exp(-x^2)
      return g * 1.12837916709551257f * expf(-x * x);
    case UnaryOp::kLog1p:
      return g / (1.0f + x);
    case UnaryOp::kExpm1:
      return g * (y + 1.0f);
    case UnaryOp::kFloor:  // piecewise constant: PyTorch's gradient is 0
    case UnaryOp::kCeil:
    case UnaryOp::kRound:
    case UnaryOp::kTrunc:
      return 0.0f;
  }
  return 0.0f;
}

// x ** e, and its slope e * x^(e-1) (0 for e == 0, as PyTorch).
LOOM_HOST_DEVICE inline float pow_value(float x, float e) { return powf(x, e); }
LOOM_HOST_DEVICE inline float pow_grad(float x, float e, float g) {
  return e == 0.0f ? 0.0f : g * e * powf(x, e - 1.0f);
}

// min(max(x, lo), hi) as PyTorch's clamp: a NaN x stays NaN; a NaN bound means "no bound";
// lo > hi gives hi. The gradient passes where lo <= x <= hi.
LOOM_HOST_DEVICE inline float clamp_value(float x, float lo, float hi) {
  float v = x < lo ? lo : x;  // NaN x: every comparison false, x kept
  return v > hi ? hi : v;
}
LOOM_HOST_DEVICE inline float clamp_grad(float x, float lo, float hi, float g) {
  const bool above = isnan(lo) || x >= lo, below = isnan(hi) || x <= hi;
  return above && below ? g : 0.0f;
}

}  // namespace loom::kernels
