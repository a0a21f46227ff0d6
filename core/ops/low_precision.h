// How the ops run on bf16 and f16 tensors: one helper, LowPrecision, that every op in core/ops.h
// calls first. The kernels stay f32-only.
//
// Note [Low-precision compute]
// An op given bf16 or f16 floating inputs computes in f32 on upcast copies and rounds its floating
// result to that low-precision dtype: the numerics of bf16/f16 storage with f32 accumulation
// (DESIGN.md, "bf16/f16 arithmetic accumulates in f32"). Both conversions go through
// Tensor::to(DType), which autograd records, so nothing new is needed for gradients: the upcast's
// backward rounds the f32 gradient to the input's dtype and the rounding's backward upcasts the
// incoming gradient. By construction, op(x) for a bf16 x is exactly op(x.to(f32)).to(bf16), and
// x's gradient is exactly the f32 gradient rounded to bf16.
//
// - Mixed inputs: f32 with bf16 (or with f16) is allowed and the result takes the low-precision
//   dtype; an f32 input is used as it is and its gradient stays f32. bf16 with f16 in one op is an
//   error naming the op, both arguments and both dtypes. Integer inputs (indices, targets) are not
//   floating inputs and are never converted.
// - f32 inputs only: the op takes its f32 path unchanged (no copies, bit-identical results).
// - cross_entropy returns its loss in f32 (as PyTorch autocast does); the logits' gradient still
//   comes back in the logits' dtype.
// - sum and mean over all elements follow the rule: the f32 sum is rounded to the input's dtype
//   (PyTorch's sum of a bf16 tensor is bf16 too). Callers wanting an f32 scalar convert it.
// - The in-place ops add_ and scale_ compute in f32 and round back into x, so a bf16 x (a
//   gradient being accumulated, a parameter being updated) stays bf16; an f32 x stays f32.
//   sum_of_squares upcasts exactly and accumulates in f64 as before.
// - cat and the views copy or alias bytes and are dtype-agnostic; cat converts only when its
//   inputs' dtypes differ.
// Cost: the f32 copies are what the ops save for backward, so activations are held in f32, not in
// bf16. This buys the numerics, not the memory; kernels that read bf16 directly buy both, which
// is what the CUDA ops with bf16 kernels do (Notes [bf16 GEMMs on CUDA], [bf16 kernels on CUDA]).
#pragma once

#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace loom::detail {

// One floating argument of an op, named as in the op's signature. An undefined tensor (an
// optional argument such as linear's bias) is skipped.
struct FloatingArg {
  const char* name;
  const Tensor& tensor;
};

// Decides, for one call of `op`, whether it takes the low-precision path of Note [Low-precision
// compute], and in which dtype:
//
//   const detail::LowPrecision lp("add", {{"a", a}, {"b", b}});
//   if (lp) return lp.round(add(lp.f32(a), lp.f32(b)));
//   ...  // the f32 path
class LowPrecision {
 public:
  // Checks that every defined argument is f32, bf16 or f16 and that bf16 and f16 do not meet.
  LowPrecision(const char* op, std::initializer_list<FloatingArg> args);
  // For ops over a list of tensors (cat): argument i is named "<name>[i]".
  LowPrecision(const char* op, const char* name, const std::vector<Tensor>& args);

  // True when some argument is bf16 or f16: the op must run on f32() copies and round() its result.
  explicit operator bool() const { return dtype_ != DType::kF32; }
  DType dtype() const { return dtype_; }  // the floating dtype of the op's result

  // `t` in f32: an upcast copy of a bf16/f16 tensor (differentiable); an f32 or undefined tensor
  // as it is.
  static Tensor f32(const Tensor& t);
  // The op's f32 result rounded to dtype() (differentiable).
  Tensor round(const Tensor& f32_result) const;
  // For in-place ops: runs `f32_op` on x in f32 (x itself when x is f32, else an upcast copy
  // written back rounded to x's dtype). No autograd.
  static void update(Tensor& x, const std::function<void(Tensor& x_f32)>& f32_op);

 private:
  void add(const char* op, const std::string& name, const Tensor& t);

  DType dtype_ = DType::kF32;
  std::string first_name_;  // the first bf16/f16 argument, named in the mixing error
};

}  // namespace loom::detail
