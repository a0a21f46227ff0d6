// How a module parameter is initialised, and the function that does it by the parameter's full
// hierarchical name. See Note [Deterministic init].
//
// Note [Deterministic init]
// Module::init_parameters(seed) fills each parameter through core/rng keyed by (seed, full
// hierarchical name, element index in the full parameter). The values therefore depend on
// neither the order modules were built in, nor the device, nor how a parameter is sharded: a
// tensor-parallel or ZeRO shard initialised alone with init_tensor(..., &slice) is bit-for-bit
// the slice of the single-process parameter.
#pragma once

#include <cstdint>
#include <string>

#include "core/rng.h"
#include "core/tensor.h"

namespace loom::nn {

struct Init {
  enum class Kind { kNormal, kZeros, kOnes };
  Kind kind = Kind::kZeros;
  double std = 0.0;  // kNormal: mean 0 and this standard deviation
  // >= 0: rows (dim 0) from this index on are zero whatever the kind (a padded vocabulary's
  // rows past the real tokens).
  int64_t zero_rows_from = -1;

  static Init normal(double std);
  static Init zeros();
  static Init ones();
  Init with_zero_rows_from(int64_t row) const;
  std::string str() const;  // "normal(0.02)", "zeros", "ones", "+ zero rows from 11"
};

// Fills t as the parameter `full_name` under `seed`. With `slice`, t holds that slice of the full
// parameter (core/rng.h) and receives exactly the matching part of the full initialisation.
// Not recorded by autograd.
void init_tensor(Tensor& t, const Init& init, uint64_t seed, const std::string& full_name,
                 const rng::Slice* slice = nullptr);

}  // namespace loom::nn
