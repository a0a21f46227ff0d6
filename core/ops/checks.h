// Argument checks shared by the ops: each names the op and the argument in its message.
#pragma once

#include <optional>

#include <string>
#include <utility>

#include "core/tensor.h"

namespace loom::detail {

void check_defined(const char* op, const char* arg, const Tensor& t);
// Defined, f32 (the dtype the kernels compute in). Ops call it on their f32 path, after
// LowPrecision has sent bf16/f16 inputs through f32 copies (See Note [Low-precision compute]).
void check_f32(const char* op, const char* arg, const Tensor& t);
// Defined and of an index type (i32 or i64).
void check_index(const char* op, const char* arg, const Tensor& t);
void check_same_device(const char* op, const char* arg_a, const Tensor& a, const char* arg_b,
                       const Tensor& b);
void check_dim(const char* op, const char* arg, const Tensor& t, int64_t dims);
// Normalises a possibly negative dim into [0, ndim).
int64_t wrap_dim(const char* op, int64_t dim, int64_t ndim);

// For broadcasting over leading dims: true when `small` is a suffix of `big`.
bool is_suffix(const Shape& small, const Shape& big);
// Sums a gradient of shape `from` down to the suffix shape `to` (identity when equal).
Tensor sum_to_suffix(const Tensor& grad, const Shape& to);
// numpy's broadcast shape of a and b; an error naming op and both shapes when they do not
// broadcast.
Shape broadcast_shape(const char* op, const Shape& a, const Shape& b);
// a and b made ready for the ops' kernels, which broadcast only a suffix operand: an operand
// whose shape is neither the broadcast shape nor a suffix of it is expand()ed (differentiable).
// Errors name op and both shapes when they do not broadcast.
std::pair<Tensor, Tensor> broadcast_for_kernels(const char* op, const Tensor& a, const Tensor& b);

// Integer operands (core/ops/integer.cpp, Note [Integer operands]). Each returns nothing when no
// operand is an integer tensor, so the caller goes on with its floating path.
bool is_integer(DType dtype);
// add / sub / mul (integer arithmetic) and div (true division in f32), or the floating op on the
// promoted operands.
std::optional<Tensor> integer_operands(const char* name, const Tensor& a, const Tensor& b,
                                       Tensor (*float_op)(const Tensor&, const Tensor&));
std::optional<Tensor> integer_scale(const Tensor& x, double s);
std::optional<Tensor> integer_sum_all(const Tensor& x);
std::optional<Tensor> integer_sum_dim(const Tensor& x, int64_t dim, bool keepdim);
// where with an integer operand: the floating where on the promoted operands, or, for two
// integer ones, the promoted integer dtype's values picked exactly.
std::optional<Tensor> integer_where(const Tensor& condition, const Tensor& a, const Tensor& b);

}  // namespace loom::detail
