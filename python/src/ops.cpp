// Operators and methods on loom.Tensor (+ - * / @, sum, mean, in-place updates) and the
// submodule _loom.functional, re-exported as loom.nn.functional under PyTorch's names. Every op
// that only touches Tensors runs with the GIL released (arguments are converted before, results
// after); ops that parse Python arguments release it once parsing is done.
//
// A Python scalar operand becomes a 0-d tensor of the other operand's dtype and device (its
// shape [] broadcasts over any shape, See core/ops.h), so `t * 2` keeps t's dtype.
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "bindings.h"
#include "core/autograd.h"
#include "core/nn/dropout.h"
#include "core/ops.h"
#include "core/rng.h"

namespace loom::python {
namespace {

// F.dropout without a stream: the n-th call since the dropout step or the batch part last changed
// (a new step, micro-batch or rank share) gets stream "F.dropout#n", so calls in one forward draw
// different masks and every micro-batch's n-th call draws its part of the same whole mask. Called
// with the GIL held (the state is the interpreter's).
uint64_t functional_dropout_stream() {
  static uint64_t step = ~uint64_t(0), calls = 0;
  static nn::DropoutBatchPart part{-1, 0};
  const nn::DropoutBatchPart now = nn::dropout_batch_part();
  if (nn::dropout_step() != step || now.part != part.part || now.parts != part.parts) {
    step = nn::dropout_step();
    part = now;
    calls = 0;
  }
  return rng::stream_of("F.dropout#" + std::to_string(calls++));
}

using Release = py::call_guard<py::gil_scoped_release>;

Tensor scalar_like(double value, const Tensor& t) {
  return Tensor::scalar(value, t.dtype(), t.device());
}

// `other` as a Tensor operand: a Tensor, or a Python scalar made into a 0-d tensor like `t`.
// Returns false for anything else, so the operator returns NotImplemented (a TypeError).
// Against an integer tensor (Note [Integer operands] in core/ops/integer.cpp) a Python float is
// an f32 operand (the result is f32, as PyTorch's), and a Python int one of the tensor's dtype when
// it fits, else of i64 (so nothing is converted out of range).
bool operand(const Tensor& t, py::handle other, Tensor* out) {
  if (py::isinstance<Tensor>(other)) {
    *out = py::cast<const Tensor&>(other);
    return true;
  }
  if (!is_scalar(other)) return false;
  const double v = other.cast<double>();
  if (!is_floating(t.dtype())) {
    if (py::isinstance<py::float_>(other)) {
      *out = Tensor::scalar(v, DType::kF32, t.device());
      return true;
    }
    const int64_t i = other.cast<int64_t>();
    if (t.dtype() == DType::kBool) {  // as PyTorch: a bool meets True/False as bool, an int as i64
      *out = Tensor::scalar(
          double(i), py::isinstance<py::bool_>(other) ? DType::kBool : DType::kI64, t.device());
      return true;
    }
    const bool fits =
        t.dtype() == DType::kI64 ||
        (t.dtype() == DType::kU8 ? i >= 0 && i <= 255 : i >= INT32_MIN && i <= INT32_MAX);
    *out = fits ? Tensor::scalar(double(i), t.dtype(), t.device())
                : Tensor::full({}, double(i), DType::kI64, t.device());
    return true;
  }
  *out = scalar_like(v, t);
  return true;
}

// `other` as the right operand of a comparison with `t`: a Tensor, or a Python number made into a
// 0-d tensor of t's dtype. A non-integral number against an integer tensor would be rounded, so it
// is a ValueError instead. Returns false for anything else (Python then compares identities).
// A float beside an integer tensor is an f32 scalar (operand()), and compare() promotes the
// tensor to f32 with it, as PyTorch does.
bool comparison_operand(const Tensor& t, py::handle other, Tensor* out) {
  return operand(t, other, out);
}

// Binds a binary operator and its reflection: f(a, b) for `a op b`, and with the operands
// swapped for `b op a` when only the right one is a Tensor.
template <typename F>
void def_binary(py::class_<Tensor>& cls, const char* name, const char* rname, F f) {
  cls.def(name, [f](const Tensor& a, py::handle b) -> py::object {
    Tensor other;
    if (!operand(a, b, &other)) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
    Tensor out;
    {
      py::gil_scoped_release release;
      out = f(a, other);
    }
    return py::cast(out);
  });
  cls.def(rname, [f](const Tensor& b, py::handle a) -> py::object {
    Tensor other;
    if (!operand(b, a, &other)) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
    Tensor out;
    {
      py::gil_scoped_release release;
      out = f(other, b);
    }
    return py::cast(out);
  });
}

// Whether an in-place update of t with `other` is recorded by autograd (See Note [In-place ops
// and views] in core/autograd.h): then it is computed out of place and written with
// assign_in_place, which rebases t's history (and refuses a leaf that requires grad); otherwise
// the fast in-place kernels write it.
bool recorded(const Tensor& t, const Tensor& other = Tensor()) {
  return autograd::grad_enabled() && is_floating(t.dtype()) &&
         (t.requires_grad() || (other.defined() && other.requires_grad()));
}

// `result` (t op other, computed out of place) written into t, as PyTorch's in-place ops: it must
// keep t's shape, and a floating result cannot go into an integer tensor.
void write_back(const char* op, Tensor& t, const Tensor& result) {
  LOOM_CHECK(result.shape() == t.shape(), op, ": the result ", shape_str(result.shape()),
             " does not fit in place into ", shape_str(t.shape()),
             " (the other operand broadcasts over it)");
  LOOM_CHECK(is_floating(t.dtype()) || !is_floating(result.dtype()), op, ": a ",
             dtype_name(result.dtype()), " result cannot be written into the ",
             dtype_name(t.dtype()), " tensor in place (as PyTorch refuses it)");
  autograd::assign_in_place(t, result, op);
}

// t += alpha * other (tensor of t's shape, or a scalar), t *= s, in place; returns t.
py::object add_in_place(py::object self, py::handle other, double alpha, const char* op) {
  Tensor& t = self.cast<Tensor&>();
  Tensor y;
  if (!operand(t, other, &y)) throw py::type_error(std::string(op) + ": a Tensor or a number");
  const bool scalar = is_scalar(other);
  const double value = scalar ? other.cast<double>() * alpha : 0.0;
  py::gil_scoped_release release;
  if (!is_floating(t.dtype()) || recorded(t, y)) {  // out of place, then written back
    // add's backward keeps neither operand, so t itself (not a clone) is the operand.
    write_back(op, t,
               alpha == 1.0    ? add(t, y)
               : alpha == -1.0 ? sub(t, y)
                               : add(t, scale(y, alpha)));
  } else if (scalar) {
    add_(t, Tensor::full(t.shape(), value, t.dtype(), t.device()));
  } else {
    add_(t, y.shape() == t.shape() ? y : expand(y, t.shape()), alpha);
  }
  return self;
}

py::object mul_in_place(py::object self, py::handle other) {
  Tensor& t = self.cast<Tensor&>();
  if (is_scalar(other) && is_floating(t.dtype())) {
    double s = other.cast<double>();
    py::gil_scoped_release release;
    if (recorded(t))
      write_back("mul_", t, scale(t, s));  // scale keeps no operand for its backward
    else
      scale_(t, s);
    return self;
  }
  Tensor y;  // a tensor (t *= mask), or a number times an integer tensor
  if (!operand(t, other, &y)) throw py::type_error("mul_: other must be a Tensor or a number");
  py::gil_scoped_release release;
  // mul keeps its operands for backward: a clone of t's old values, which the write leaves alone.
  write_back("mul_", t, mul(recorded(t, y) ? t.clone() : t, y));
  return self;
}

// matmul with PyTorch's 1-D rules: a vector on the left is a row [1, K], on the right a column
// [K, 1], and the added dim is dropped from the result.
Tensor matmul_py(const Tensor& a, const Tensor& b) {
  LOOM_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: both arguments need at least 1 dim, got ",
             shape_str(a.shape()), " @ ", shape_str(b.shape()));
  Tensor x = a.dim() == 1 ? a.reshape({1, a.size(0)}) : a;
  Tensor y = b.dim() == 1 ? b.reshape({b.size(0), 1}) : b;
  Tensor out = matmul(x, y);
  Shape shape = out.shape();
  if (b.dim() == 1) shape.erase(shape.end() - 1);
  if (a.dim() == 1) shape.erase(shape.end() - (b.dim() == 1 ? 1 : 2));
  return shape == out.shape() ? out : out.reshape(shape);
}

// sum / mean over all elements (dim None), one dim, or several (a tuple or list).
Tensor reduce(const Tensor& t, py::handle dim, bool keepdim, bool mean_not_sum) {
  std::vector<int64_t> dims;
  if (py::isinstance<py::int_>(dim)) {
    dims.push_back(dim.cast<int64_t>());
  } else if (!dim.is_none()) {
    dims = dim.cast<std::vector<int64_t>>();
  }
  py::gil_scoped_release release;
  if (dim.is_none()) {
    Tensor out = mean_not_sum ? mean(t) : sum(t);
    return keepdim ? out.reshape(Shape(size_t(t.dim()), 1)) : out;
  }
  for (int64_t& d : dims) {
    LOOM_CHECK(d >= -t.dim() && d < t.dim(), mean_not_sum ? "mean" : "sum", ": dim ", d,
               " out of range for a ", t.dim(), "-D tensor");
    if (d < 0) d += t.dim();
  }
  std::sort(dims.begin(), dims.end());
  LOOM_CHECK(std::adjacent_find(dims.begin(), dims.end()) == dims.end(),
             mean_not_sum ? "mean" : "sum", ": a dim appears twice");
  Tensor out = t;
  for (auto it = dims.rbegin(); it != dims.rend(); ++it)  // highest first: lower dims keep places
    out = mean_not_sum ? mean(out, *it, keepdim) : sum(out, *it, keepdim);
  return out;
}

// softmax over any dim: loom's kernel works on the last one, so move `dim` there and back.
Tensor softmax_dim(const Tensor& x, int64_t dim) {
  const int64_t n = x.dim();
  LOOM_CHECK(dim >= -n && dim < n, "softmax: dim ", dim, " out of range for a ", n, "-D tensor");
  if (dim < 0) dim += n;
  if (dim == n - 1) return softmax(x);
  return softmax(x.transpose(dim, n - 1)).transpose(dim, n - 1);
}

void check_reduction(const char* op, const std::string& reduction) {
  LOOM_CHECK(reduction == "mean", op, ": reduction='", reduction,
             "' is not supported (loom's fused loss computes the mean only)");
}

void init_functional(py::module_& f) {
  f.doc() = "Functional ops under PyTorch's names (loom.nn.functional)";
  f.def(
      "gelu",
      [](const Tensor& x, const std::string& approximate) {
        LOOM_CHECK(approximate == "tanh", "gelu: approximate='", approximate,
                   "' is not supported: loom implements the tanh approximation (GPT-2's), so "
                   "pass approximate='tanh'");
        py::gil_scoped_release release;
        return gelu(x);
      },
      py::arg("input"), py::arg("approximate") = "tanh",
      "GELU, tanh approximation (GPT-2's). Note: PyTorch's default is approximate='none'.");
  f.def("relu", &relu, py::arg("input"), Release());
  f.def("sigmoid", &sigmoid, py::arg("input"), Release());
  f.def("dot_interaction", &dot_interaction, py::arg("features"), Release(),
        "DLRM's pairwise dot interaction: features [B, F, D] -> [B, F*(F-1)/2], "
        "out[b, i*(i-1)/2 + j] = <features[b, i], features[b, j]> for i > j (the strictly lower "
        "triangle of x x^T, row by row: the DLRM reference's order).");
  f.def("softmax", &softmax_dim, py::arg("input"), py::arg("dim") = -1, Release());
  f.def(
      "layer_norm",
      [](const Tensor& x, py::handle normalized_shape, std::optional<Tensor> weight,
         std::optional<Tensor> bias, double eps) {
        Shape ns = py::isinstance<py::int_>(normalized_shape)
                       ? Shape{normalized_shape.cast<int64_t>()}
                       : normalized_shape.cast<Shape>();
        LOOM_CHECK(x.dim() >= 1 && ns == Shape{x.size(-1)}, "layer_norm: normalized_shape ",
                   shape_str(ns), " must be the last dim of the input (", shape_str(x.shape()),
                   "): loom normalizes over the last dim only");
        py::gil_scoped_release release;
        return layer_norm(x, weight.value_or(Tensor()), bias.value_or(Tensor()), eps);
      },
      py::arg("input"), py::arg("normalized_shape"), py::arg("weight") = py::none(),
      py::arg("bias") = py::none(), py::arg("eps") = 1e-5);
  f.def(
      "linear",
      [](const Tensor& x, const Tensor& weight, std::optional<Tensor> bias) {
        return linear(x, weight, bias.value_or(Tensor()));
      },
      py::arg("input"), py::arg("weight"), py::arg("bias") = py::none(), Release(),
      "input [..., in] @ weight[out, in]^T + bias[out]");
  f.def(
      "embedding",
      [](const Tensor& indices, const Tensor& weight) { return embedding(weight, indices); },
      py::arg("input"), py::arg("weight"), Release(),
      "embedding(input, weight): rows of weight [V, C] at int32/int64 indices of any shape.");
  f.def(
      "dropout",
      [](const Tensor& x, double p, bool training, std::optional<uint64_t> seed, py::handle stream,
         std::optional<uint64_t> offset) {
        DropoutKey key;
        key.seed = seed.value_or(nn::dropout_seed());
        if (stream.is_none())
          key.stream = functional_dropout_stream();
        else
          key.stream = py::isinstance<py::str>(stream) ? rng::stream_of(stream.cast<std::string>())
                                                       : stream.cast<uint64_t>();
        key.offset = offset.value_or(nn::dropout_step() << 32);
        const nn::DropoutBatchPart rows = nn::dropout_batch_part();
        key.batch_part = rows.part;
        key.batch_parts = rows.parts;
        py::gil_scoped_release release;
        return dropout(x, p, training, key);
      },
      py::arg("input"), py::arg("p") = 0.5, py::arg("training") = true, py::kw_only(),
      py::arg("seed") = py::none(), py::arg("stream") = py::none(), py::arg("offset") = py::none(),
      R"doc(Dropout with loom's counter-based mask (See Note [Dropout keys] in core/nn/dropout.h).

Element i is kept iff Philox(seed, stream, offset + i) >= p, at i's place in the step's whole
batch (the process-wide batch part: see loom.nn.set_dropout_batch_part); kept elements are
scaled by 1/(1-p). By default every call draws a new mask, as in PyTorch: `offset` is the
process-wide dropout step << 32 (loom.optim's step() advances it), and `stream` numbers the calls
since the step or the batch part last changed, so the n-th call of every micro-batch and every
rank draws its part of the same whole mask. Pass `stream` (an int, or a name such as
"blocks.0.attn_drop") to key a call site yourself (the same key, the same mask: what activation
recomputation needs), `offset` to choose the step, `seed` instead of the process-wide dropout
seed.)doc");
  f.def(
      "cross_entropy",
      [](const Tensor& input, const Tensor& target, int64_t ignore_index,
         const std::string& reduction) {
        check_reduction("cross_entropy", reduction);
        py::gil_scoped_release release;
        CrossEntropyOptions options;
        options.ignore_index = ignore_index;
        return cross_entropy(input, target, options);
      },
      py::arg("input"), py::arg("target"), py::arg("ignore_index") = -100,
      py::arg("reduction") = "mean",
      "Mean over non-ignored rows of -log softmax(input)[target]; input [N, V], target [N].");
  f.def(
      "binary_cross_entropy_with_logits",
      [](const Tensor& input, const Tensor& target, const std::string& reduction) {
        check_reduction("binary_cross_entropy_with_logits", reduction);
        py::gil_scoped_release release;
        return binary_cross_entropy_with_logits(input, target);
      },
      py::arg("input"), py::arg("target"), py::arg("reduction") = "mean");
  f.def(
      "scaled_dot_product_attention",
      [](const Tensor& q, const Tensor& k, const Tensor& v, py::handle attn_mask, double dropout_p,
         bool is_causal) {
        LOOM_CHECK(attn_mask.is_none(),
                   "scaled_dot_product_attention: attn_mask is not "
                   "supported (is_causal=True gives the causal mask)");
        LOOM_CHECK(dropout_p == 0.0,
                   "scaled_dot_product_attention: dropout_p must be 0 (no attention dropout)");
        py::gil_scoped_release release;
        return scaled_dot_product_attention(q, k, v, is_causal);
      },
      py::arg("query"), py::arg("key"), py::arg("value"), py::arg("attn_mask") = py::none(),
      py::arg("dropout_p") = 0.0, py::arg("is_causal") = true,
      "softmax(q k^T / sqrt(D)) v over q, k, v [B, H, T, D]; causal by default (loom's GPT "
      "use), unlike PyTorch's is_causal=False.");
}

}  // namespace

void init_ops(py::module_& m) {
  auto cls = py::reinterpret_borrow<py::class_<Tensor>>(m.attr("Tensor"));

  def_binary(cls, "__add__", "__radd__",
             [](const Tensor& a, const Tensor& b) { return add(a, b); });
  def_binary(cls, "__sub__", "__rsub__",
             [](const Tensor& a, const Tensor& b) { return sub(a, b); });
  // t * number is scale(t, number): no 0-d operand to broadcast, nothing saved for backward.
  for (const char* name : {"__mul__", "__rmul__"}) {
    cls.def(name, [](const Tensor& a, py::handle b) -> py::object {
      Tensor out;
      if (is_scalar(b)) {
        double s = b.cast<double>();
        // An integer tensor times a Python float is f32 (PyTorch's promotion), even for 2.0.
        const bool promote = py::isinstance<py::float_>(b) && !is_floating(a.dtype());
        py::gil_scoped_release release;
        out = scale(promote ? a.to(DType::kF32) : a, s);
      } else if (py::isinstance<Tensor>(b)) {
        const Tensor& other = py::cast<const Tensor&>(b);
        py::gil_scoped_release release;
        out = mul(a, other);  // commutative: no need to tell __rmul__ apart
      } else {
        return py::reinterpret_borrow<py::object>(Py_NotImplemented);
      }
      return py::cast(out);
    });
  }
  def_binary(cls, "__matmul__", "__rmatmul__", &matmul_py);
  cls.def(
      "__truediv__",
      [](const Tensor& a, py::handle b) -> py::object {
        Tensor out;
        if (is_scalar(b)) {
          const double s = b.cast<double>();
          py::gil_scoped_release release;
          out = scale(is_floating(a.dtype()) ? a : a.to(DType::kF32), 1.0 / s);  // true division
        } else if (py::isinstance<Tensor>(b)) {
          const Tensor& other = py::cast<const Tensor&>(b);
          py::gil_scoped_release release;
          out = div(a, other);
        } else {
          return py::reinterpret_borrow<py::object>(Py_NotImplemented);
        }
        return py::cast(out);
      },
      "t / u: elementwise IEEE division with add's broadcasting; t / number multiplies by "
      "1 / number (one rounding more than a division, as loom-gpt scales its losses)");
  cls.def(
      "__rtruediv__",
      [](const Tensor& b, py::handle a) -> py::object {
        if (!is_scalar(a)) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
        const Tensor numerator = scalar_like(a.cast<double>(), b);
        Tensor out;
        {
          py::gil_scoped_release release;
          out = div(numerator, b);
        }
        return py::cast(out);
      },
      "number / t: elementwise IEEE division");
  // Python's // and % on integer tensors (core/ops.h floor_divide, remainder).
  def_binary(cls, "__floordiv__", "__rfloordiv__",
             [](const Tensor& a, const Tensor& b) { return floor_divide(a, b); });
  def_binary(cls, "__mod__", "__rmod__",
             [](const Tensor& a, const Tensor& b) { return remainder(a, b); });
  for (const char* name : {"floor_divide", "remainder"}) {
    const bool floor = std::string(name) == "floor_divide";
    auto f = [floor, name = std::string(name)](const Tensor& a, py::handle b) {
      Tensor other;
      if (!operand(a, b, &other))
        throw py::type_error(name + ": other must be a Tensor or a number");
      py::gil_scoped_release release;
      return floor ? floor_divide(a, other) : remainder(a, other);
    };
    cls.def(name, f, py::arg("other"));
    m.def(name, f, py::arg("input"), py::arg("other"),
          "Python's // and % on integer tensors (i32, i64, u8), with add's broadcasting: the "
          "quotient rounds toward minus infinity, the remainder takes the divisor's sign; a zero "
          "divisor is an error.");
  }
  cls.def(
      "div",
      [](const Tensor& a, py::handle b) {
        Tensor other;
        if (!operand(a, b, &other)) throw py::type_error("div: other must be a Tensor or a number");
        py::gil_scoped_release release;
        return div(a, other);
      },
      py::arg("other"),
      "Elementwise IEEE division a / other (a number too, divided exactly), with add's "
      "broadcasting.");
  cls.def(
      "__neg__", [](const Tensor& a) { return scale(a, -1.0); }, Release());
  cls.def("__pos__", [](const Tensor& a) { return a; });
  cls.def("matmul", &matmul_py, py::arg("other"), Release());
  // Comparisons (core/ops.h compare): elementwise, a uint8 tensor of 1 and 0 (loom has no bool
  // dtype). A tensor is then no longer hashable by Python's default; it stays hashable by
  // identity, as PyTorch's tensors are.
  const std::pair<const char*, Compare> comparisons[] = {
      {"__eq__", Compare::kEq}, {"__ne__", Compare::kNe}, {"__lt__", Compare::kLt},
      {"__le__", Compare::kLe}, {"__gt__", Compare::kGt}, {"__ge__", Compare::kGe}};
  for (const auto& [name, op] : comparisons) {
    const Compare c = op;
    cls.def(name, [c](const Tensor& a, py::handle b) -> py::object {
      Tensor other;
      if (!comparison_operand(a, b, &other))
        return py::reinterpret_borrow<py::object>(Py_NotImplemented);
      Tensor out;
      {
        py::gil_scoped_release release;
        out = compare(a, other, c);
      }
      return py::cast(out);
    });
  }
  cls.def("__hash__", [](py::handle self) { return reinterpret_cast<intptr_t>(self.ptr()); });
  // torch.eq(a, b) / a.eq(b) and the rest: the same, with a Tensor or a number as b.
  const std::pair<const char*, Compare> named[] = {{"eq", Compare::kEq}, {"ne", Compare::kNe},
                                                   {"lt", Compare::kLt}, {"le", Compare::kLe},
                                                   {"gt", Compare::kGt}, {"ge", Compare::kGe}};
  for (const auto& [name, op] : named) {
    const Compare c = op;
    auto f = [c, name = std::string(name)](const Tensor& a, py::handle b) {
      Tensor other;
      if (!comparison_operand(a, b, &other))
        throw py::type_error(name + ": other must be a Tensor or a number, got " +
                             std::string(py::str(py::type::of(b).attr("__name__"))));
      py::gil_scoped_release release;
      return compare(a, other, c);
    };
    cls.def(name, f, py::arg("other"));
    m.def(name, f, py::arg("input"), py::arg("other"),
          "Elementwise comparison as PyTorch's, into a uint8 tensor of 1 and 0 (loom has no bool "
          "dtype); add's broadcasting.");
  }
  cls.def(
      "sum",
      [](const Tensor& t, py::handle dim, bool keepdim) { return reduce(t, dim, keepdim, false); },
      py::arg("dim") = py::none(), py::arg("keepdim") = false);
  cls.def(
      "mean",
      [](const Tensor& t, py::handle dim, bool keepdim) { return reduce(t, dim, keepdim, true); },
      py::arg("dim") = py::none(), py::arg("keepdim") = false);
  cls.def("softmax", &softmax_dim, py::arg("dim"), Release());
  cls.def("relu", &relu, Release());
  cls.def("sigmoid", &sigmoid, Release());

  // In place: recorded by autograd when t or the operand requires grad (See recorded()).
  cls.def("__iadd__", [](py::object s, py::handle o) { return add_in_place(s, o, 1.0, "+="); });
  cls.def("__isub__", [](py::object s, py::handle o) { return add_in_place(s, o, -1.0, "-="); });
  cls.def("__imul__", [](py::object s, py::handle o) { return mul_in_place(s, o); });
  cls.def(
      "add_",
      [](py::object s, py::handle o, double alpha) { return add_in_place(s, o, alpha, "add_"); },
      py::arg("other"), py::kw_only(), py::arg("alpha") = 1.0, "t += alpha * other, in place");
  cls.def(
      "sub_",
      [](py::object s, py::handle o, double alpha) { return add_in_place(s, o, -alpha, "sub_"); },
      py::arg("other"), py::kw_only(), py::arg("alpha") = 1.0, "t -= alpha * other, in place");
  cls.def("mul_", &mul_in_place, py::arg("other"));
  cls.def("zero_", [](py::object self) {
    Tensor& t = self.cast<Tensor&>();
    py::gil_scoped_release release;
    if (recorded(t))
      autograd::assign_in_place(t, Tensor::zeros(t.shape(), t.dtype(), t.device()), "zero_");
    else
      t.zero_();
    return self;
  });
  cls.def(
      "fill_",
      [](py::object self, double value) {
        Tensor& t = self.cast<Tensor&>();
        py::gil_scoped_release release;
        if (recorded(t))
          autograd::assign_in_place(t, Tensor::full(t.shape(), value, t.dtype(), t.device()),
                                    "fill_");
        else
          t.fill_(value);
        return self;
      },
      py::arg("value"));
  cls.def(
      "copy_",
      [](py::object self, const Tensor& src) {
        Tensor& t = self.cast<Tensor&>();
        {
          py::gil_scoped_release release;
          // As PyTorch's copy_: src broadcasts to t's shape and is converted to its dtype and
          // device; recorded when t or src requires grad.
          Tensor value = src.shape() == t.shape() ? src : expand(src, t.shape());
          autograd::assign_in_place(t, value, "copy_");
        }
        return self;
      },
      py::arg("src"));

  m.def("matmul", &matmul_py, py::arg("input"), py::arg("other"), Release());
  m.def("cat", &cat, py::arg("tensors"), py::arg("dim") = 0, Release());

  py::module_ f = m.def_submodule("functional");
  init_functional(f);
}

}  // namespace loom::python
