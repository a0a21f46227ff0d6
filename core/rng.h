// Deterministic, layout-independent random initialisation. Element i of a parameter named
// `name` under seed s is a pure function of (s, hash_name(name), i), computed with Philox
// (kernels/cpu/philox.h). Any slice of a parameter can therefore be generated alone: a
// tensor-parallel or ZeRO shard is bit-for-bit the slice of the single-process parameter.
//
// Note [Counter-based init]
// For element i (row-major index in the *full* parameter) we draw one Philox block
// element_block(key = seed, stream = hash_name(name), index = i) and use
//   normal:  mean + std * philox::normal(v[0], v[1])      (Box-Muller, computed in f32)
//   uniform: lo + (hi - lo) * philox::uniform01(v[0])
// Values are produced in f32 on the host and then converted to the tensor's dtype and copied
// to its device, so the numbers never depend on where the tensor lives.
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace loom::rng {

// The Philox stream id of a name (64-bit FNV-1a, philox::hash_name).
uint64_t stream_of(const std::string& name);

// Where a tensor sits inside a larger parameter: it holds [start, start + t.size(dim)) along
// `dim` of a parameter of shape `full_shape`, and equals the full shape elsewhere.
struct Slice {
  Shape full_shape;
  int64_t dim = 0;
  int64_t start = 0;
};

// Fill the whole parameter `t` (any dtype, device or layout).
void fill_normal(Tensor& t, uint64_t seed, const std::string& name, double mean, double std);
void fill_uniform(Tensor& t, uint64_t seed, const std::string& name, double lo, double hi);

// Fill `t` with the slice `slice` of the parameter `name`; element indices are taken in the full
// parameter's row-major order, so the result equals narrow() of the full fill.
void fill_normal(Tensor& t, const Slice& slice, uint64_t seed, const std::string& name, double mean,
                 double std);
void fill_uniform(Tensor& t, const Slice& slice, uint64_t seed, const std::string& name, double lo,
                  double hi);

}  // namespace loom::rng
