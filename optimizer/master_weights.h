// f32 master copies of low-precision (bf16, f16) parameters, or of pieces of them (ZeRO's
// shards): the optimizer steps the masters, whose small updates would vanish in 8 or 11 bits of
// mantissa, and the model gets their rounded values (Micikevicius et al., "Mixed Precision
// Training"). Shared by MixedPrecisionOptimizer and ZeroOptimizer.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace loom::optim {

// True for the dtypes that train with f32 masters.
bool is_low_precision(DType dtype);

class MasterWeights {
 public:
  // `model`: bf16 or f16 tensors (views are fine), all on the CPU. The masters start as their
  // values in f32.
  explicit MasterWeights(std::vector<Tensor> model);

  // The f32 tensors to hand to the wrapped optimizer, one per model tensor.
  const std::vector<Tensor>& masters() const { return masters_; }
  // Gives master i the gradient grads[i] (none when undefined) in f32, times inv_scale (undoing
  // the loss scale). Returns false when any element is inf or nan.
  bool set_gradients(const std::vector<Tensor>& grads, double inv_scale);
  void clear_gradients();
  // Rounds every master into its model tensor.
  void copy_to_model();
  size_t bytes() const;  // of the masters

 private:
  std::vector<Tensor> model_;
  std::vector<Tensor> masters_;
};

}  // namespace loom::optim
