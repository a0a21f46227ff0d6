// See Note [Low-precision compute] in core/ops/low_precision.h.
#include "core/ops/low_precision.h"

#include "core/autograd.h"

namespace loom::detail {

LowPrecision::LowPrecision(const char* op, std::initializer_list<FloatingArg> args) {
  for (const FloatingArg& a : args) add(op, a.name, a.tensor);
}

LowPrecision::LowPrecision(const char* op, const char* name, const std::vector<Tensor>& args) {
  for (size_t i = 0; i < args.size(); ++i)
    add(op, std::string(name) + "[" + std::to_string(i) + "]", args[i]);
}

void LowPrecision::add(const char* op, const std::string& name, const Tensor& t) {
  if (!t.defined()) return;
  const DType d = t.dtype();
  LOOM_CHECK(is_floating(d), op, ": argument '", name, "' has dtype ", dtype_name(d),
             ", expected f32, bf16 or f16");
  if (d == DType::kF32) return;
  if (dtype_ == DType::kF32) {
    dtype_ = d;
    first_name_ = name;
    return;
  }
  LOOM_CHECK(d == dtype_, op, ": argument '", first_name_, "' is ", dtype_name(dtype_),
             " but argument '", name, "' is ", dtype_name(d), "; bf16 and f16 do not mix in one ",
             "op (convert one of them with .to(DType))");
}

Tensor LowPrecision::f32(const Tensor& t) { return t.defined() ? t.to(DType::kF32) : t; }

Tensor LowPrecision::round(const Tensor& f32_result) const {
  LOOM_ASSERT(f32_result.dtype() == DType::kF32, "LowPrecision::round: the result is ",
              dtype_name(f32_result.dtype()), ", expected f32");
  return f32_result.to(dtype_);
}

void LowPrecision::update(Tensor& x, const std::function<void(Tensor& x_f32)>& f32_op) {
  NoGradGuard no_grad;
  if (x.dtype() == DType::kF32) {
    f32_op(x);
    return;
  }
  Tensor x32 = x.detach().to(DType::kF32);
  f32_op(x32);
  x.copy_(x32.to(x.dtype()));
}

}  // namespace loom::detail
