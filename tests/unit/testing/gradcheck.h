// Finite-difference gradient checks for op and module tests.
#pragma once

#include <functional>
#include <vector>

#include "core/tensor.h"

namespace loom::testing {

struct GradcheckOptions {
  double eps = 1e-2;   // central-difference step (f32 inputs: large steps keep rounding small)
  double atol = 1e-3;  // |analytic - numeric| <= atol + rtol * |numeric|
  double rtol = 1e-2;
  uint64_t seed = 7;  // for the random projection of the output
};

// Checks the autograd gradients of every input with requires_grad() against central differences
// of L = sum(f(inputs) * R), R a fixed random tensor (so every output element matters).
// Reports mismatches through GoogleTest (EXPECT) with the input, the element and both values.
void expect_gradients_match(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                            const std::vector<Tensor>& inputs,
                            const GradcheckOptions& options = {});

// A tensor of uniform values in [lo, hi), deterministic in seed.
Tensor random_tensor(const Shape& shape, uint64_t seed, float lo = -1.0f, float hi = 1.0f);

// Asserts two f32 tensors have the same shape and elementwise |a - b| <= atol + rtol * |b|.
void expect_close(const Tensor& actual, const Tensor& expected, double atol = 1e-5,
                  double rtol = 1e-5);

}  // namespace loom::testing
