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

// Where a parameter that is a shard of a larger single-process parameter sits in it (tensor
// parallelism): the full parameter, of full_shape, seen as view_shape (the same elements in
// row-major order, e.g. attention's qkv weight [3C, C] as [3, C, C], its q, k and v blocks), is
// cut along view dimension `dim` at [start, start + length). The local parameter holds those
// elements in the same order, in whatever shape its module uses. With it, init_parameters fills a
// shard with exactly its part of the single-process values, and checkpoints can be cut and
// reassembled (slice_of, and the gather in parallel/).
struct ShardSpec {
  Shape full_shape;
  Shape view_shape;
  int64_t dim = 0;
  int64_t start = 0;
  int64_t length = 0;

  // full_shape cut along its own dimension `dim` (Column/Row-parallel weights, vocab rows).
  static ShardSpec along(const Shape& full_shape, int64_t dim, int64_t start, int64_t length);
  Shape local_view_shape() const;  // view_shape with `length` at `dim`
  int64_t local_numel() const;
  // This shard of a full tensor (shape full_shape), as a new contiguous tensor of
  // local_view_shape(). Throws naming both shapes when `full` is not full_shape.
  Tensor slice_of(const Tensor& full) const;
  std::string str() const;  // "[3, 16, 16] dim 1 [8, 16)"
};

// Fills t as the parameter `full_name` under `seed`. With `slice`, t holds that slice of the full
// parameter (core/rng.h) and receives exactly the matching part of the full initialisation.
// Not recorded by autograd.
void init_tensor(Tensor& t, const Init& init, uint64_t seed, const std::string& full_name,
                 const rng::Slice* slice = nullptr);

}  // namespace loom::nn
