// GELU with GPT-2's tanh approximation, y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), and
// its derivative. The formula pieces here are shared with kernels/cuda/gelu.cu; each side brings
// its own exp.
#pragma once

#include <cstdint>

#include "kernels/numeric.h"  // LOOM_HOST_DEVICE

namespace loom::kernels {

constexpr float kGeluSqrt2OverPi = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

// 0.5 (1 + tanh(u)) is computed as the identical s = 1 / (1 + exp(-2u)): for negative x the tanh
// form subtracts two numbers close to 1 and loses most digits of a small result
// (gelu(-5) ~ -2.3e-7); this form loses none. gelu(x) = x * s.
LOOM_HOST_DEVICE inline float gelu_minus_2u(float x) {
  return -2.0f * kGeluSqrt2OverPi * (x + kGeluCubic * x * x * x);
}

// gelu'(x) = s + 2 x s (1 - s) u'(x), since 0.5 (1 - tanh(u)^2) = 2 s (1 - s).
LOOM_HOST_DEVICE inline float gelu_derivative(float x, float s) {
  const float du = kGeluSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
  return s + 2.0f * x * s * (1.0f - s) * du;
}

}  // namespace loom::kernels

namespace loom::kernels::cpu {

void gelu_forward(const float* x, float* y, int64_t n);
// dx = dy * gelu'(x)
void gelu_backward(const float* x, const float* dy, float* dx, int64_t n);

}  // namespace loom::kernels::cpu
