// Elementwise math, selection and broadcasting under PyTorch's names, as loom functions and
// Tensor methods: exp log sqrt rsqrt abs neg tanh sin cos erf log1p expm1, pow (and t ** number),
// clamp, where, masked_fill, expand, and the max / min / argmax / argmin reductions. Each is
// differentiable (core/ops.h) and runs with the GIL released.
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "core/ops.h"

namespace loom::python {
namespace {

using Release = py::call_guard<py::gil_scoped_release>;

// `value` as an operand beside `like`: a Tensor as it is, a Python number as a 0-d tensor of
// like's dtype and device (it broadcasts to any shape).
Tensor tensor_or_scalar(py::handle value, const Tensor& like, const char* op, const char* arg) {
  if (py::isinstance<Tensor>(value)) return py::cast<Tensor>(value);
  if (is_scalar(value)) return Tensor::scalar(value.cast<double>(), like.dtype(), like.device());
  throw py::type_error(std::string(op) + ": " + arg + " must be a Tensor or a number, got " +
                       std::string(py::str(py::type::of(value).attr("__name__"))));
}

Tensor clamp_py(const Tensor& x, std::optional<double> min, std::optional<double> max) {
  constexpr double none = std::numeric_limits<double>::quiet_NaN();
  LOOM_CHECK(min || max, "clamp: give at least one of min and max");
  LOOM_CHECK(!(min && std::isnan(*min)) && !(max && std::isnan(*max)),
             "clamp: min and max must not be NaN");
  py::gil_scoped_release release;
  return clamp(x, min.value_or(none), max.value_or(none));
}

Tensor where_py(const Tensor& condition, py::handle input, py::handle other) {
  // A number takes the dtype of the tensor beside it (the other operand, else f32).
  const Tensor* like = py::isinstance<Tensor>(input)   ? &py::cast<const Tensor&>(input)
                       : py::isinstance<Tensor>(other) ? &py::cast<const Tensor&>(other)
                                                       : nullptr;
  const Tensor f32 = Tensor::scalar(0.0, DType::kF32, condition.device());
  const Tensor& base = like ? *like : f32;
  // As PyTorch: a float number beside an integer tensor makes the result floating (f32).
  const bool integer = base.dtype() == DType::kI32 || base.dtype() == DType::kI64 ||
                       base.dtype() == DType::kU8 || base.dtype() == DType::kBool;
  const Tensor f32_like = Tensor::scalar(0.0, DType::kF32, base.device());
  auto operand = [&](py::handle value, const char* arg) {
    const bool promote = integer && py::isinstance<py::float_>(value);
    return tensor_or_scalar(value, promote ? f32_like : base, "where", arg);
  };
  const Tensor a = operand(input, "input");
  const Tensor b = operand(other, "other");
  py::gil_scoped_release release;
  return where(condition, a, b);
}

// PyTorch's expand(*sizes): -1 keeps a dim's size; new dims go in front.
Tensor expand_py(const Tensor& x, py::args sizes) {
  Shape shape;
  if (sizes.size() == 1 && !py::isinstance<py::int_>(sizes[0]))
    shape = sizes[0].cast<Shape>();
  else
    for (py::handle s : sizes) shape.push_back(s.cast<int64_t>());
  LOOM_CHECK(shape.size() >= size_t(x.dim()), "expand: ", shape.size(),
             " sizes given for a tensor of ", x.dim(), " dims: ", shape_str(x.shape()));
  const size_t lead = shape.size() - size_t(x.dim());
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] != -1) continue;
    LOOM_CHECK(i >= lead, "expand: -1 is not allowed for a new leading dim (dim ", i, ")");
    shape[i] = x.size(int64_t(i - lead));
  }
  py::gil_scoped_release release;
  return expand(x, shape);
}

// The extreme `v` of all of x with PyTorch's gradient for that form: shared equally by every
// element equal to v (the dim form gives it all to one index). The value stays v exactly: the
// differentiable part is (s - s) / count with s the sum of the tied elements, which is 0 forward
// and mask / count backward.
Tensor split_among_ties(const Tensor& x, const Tensor& v) {
  if (!x.requires_grad()) return v;
  const Tensor mask = compare(x.detach(), v, Compare::kEq);
  const Tensor zero = Tensor::scalar(0.0, DType::kF32, x.device());
  const Tensor tied = sum(where(mask, x.to(DType::kF32), zero));
  const Tensor count = sum(mask.to(DType::kF32));
  return add(v, div(sub(tied, tied.detach()), count).to(v.dtype()));
}

// (values, indices) as a named tuple, as torch.return_types.max / topk.
py::object values_indices_tuple(const ValuesIndices& r) {
  static py::object type =
      py::module_::import("collections")
          .attr("namedtuple")("return_types", py::make_tuple("values", "indices"));
  return type(py::cast(r.values), py::cast(r.indices));
}

// max / min / argmax / argmin as PyTorch's: no dim gives the extreme of all elements (a 0-d
// tensor); a dim gives (values, indices), a named tuple as torch.return_types.max.
py::object extreme_py(const Tensor& x, py::handle dim, bool keepdim, bool largest,
                      bool index_only) {
  const char* op = index_only ? (largest ? "argmax" : "argmin") : (largest ? "max" : "min");
  if (py::isinstance<Tensor>(dim))
    throw py::type_error(std::string(op) +
                         ": the elementwise form (two tensors) is not supported; use "
                         "loom.where(a > b, a, b)");
  ValuesIndices r;
  {
    py::gil_scoped_release release;
    if (dim.is_none()) {
      LOOM_CHECK(x.numel() > 0, op, ": the tensor is empty (", shape_str(x.shape()),
                 "), and an empty tensor has no ", largest ? "largest" : "smallest", " element");
      r = largest ? max_dim(x.reshape({-1}), 0) : min_dim(x.reshape({-1}), 0);
      if (!index_only) r.values = split_among_ties(x, r.values.detach());
      if (keepdim) {
        const Shape ones(size_t(x.dim()), 1);
        r.values = r.values.reshape(ones);
        r.indices = r.indices.reshape(ones);
      }
    }
  }
  if (dim.is_none()) return index_only ? py::cast(r.indices) : py::cast(r.values);
  const int64_t d = dim.cast<int64_t>();
  {
    py::gil_scoped_release release;
    r = largest ? max_dim(x, d, keepdim) : min_dim(x, d, keepdim);
  }
  if (index_only) return py::cast(r.indices);
  return values_indices_tuple(r);
}

// topk as torch.topk (sorted=True only; loom's order of ties: the lower index first).
py::object topk_py(const Tensor& x, int64_t k, int64_t dim, bool largest, bool sorted) {
  if (!sorted) throw py::value_error("topk: loom returns the elements sorted (sorted=True) only");
  ValuesIndices r;
  {
    py::gil_scoped_release release;
    r = topk(x, k, dim, largest);
  }
  return values_indices_tuple(r);
}

// The dims a reduction's `dim` argument names (None: all), in [0, x.dim()), sorted, distinct.
std::vector<int64_t> reduced_dims(const char* op, const Tensor& x, py::handle dim) {
  std::vector<int64_t> dims;
  if (dim.is_none()) {
    for (int64_t d = 0; d < x.dim(); ++d) dims.push_back(d);
    return dims;
  }
  if (py::isinstance<py::int_>(dim))
    dims.push_back(dim.cast<int64_t>());
  else
    dims = dim.cast<std::vector<int64_t>>();
  for (int64_t& d : dims) {
    LOOM_CHECK(d >= -x.dim() && d < std::max<int64_t>(1, x.dim()), op, ": dim ", d,
               " out of range for a ", x.dim(), "-D tensor");
    if (d < 0) d += x.dim();
  }
  std::sort(dims.begin(), dims.end());
  LOOM_CHECK(std::adjacent_find(dims.begin(), dims.end()) == dims.end(), op,
             ": a dim appears twice");
  return dims;
}

// var / std as torch.var / torch.std: sum((x - mean)^2) / (N - correction) over the dims, with
// PyTorch's argument forms (unbiased=False is correction=0). Composed of differentiable ops, so
// the gradient is autograd's. N - correction <= 0 gives inf or NaN, as PyTorch.
Tensor variance(const Tensor& x, py::handle dim, py::handle unbiased, py::handle correction,
                bool keepdim, bool root) {
  const char* op = root ? "std" : "var";
  if (py::isinstance<py::bool_>(dim)) {  // x.var(False): PyTorch's var(unbiased) form
    if (!unbiased.is_none())
      throw py::type_error(std::string(op) + ": dim must be an int or a tuple of ints");
    unbiased = dim;
    dim = py::none();
  }
  double c = 1.0;
  if (!correction.is_none()) {
    if (!unbiased.is_none())
      throw py::type_error(std::string(op) + ": give unbiased or correction, not both");
    c = correction.cast<double>();
  } else if (!unbiased.is_none()) {
    c = unbiased.cast<bool>() ? 1.0 : 0.0;
  }
  const std::vector<int64_t> dims = reduced_dims(op, x, dim);
  py::gil_scoped_release release;
  const Tensor xs = x.dim() == 0 ? x.reshape({1}) : x;
  int64_t n = 1;
  Tensor m = xs;
  for (auto d = dims.rbegin(); d != dims.rend(); ++d) {
    n *= xs.size(*d);
    m = mean(m, *d, true);
  }
  const Tensor dev = sub(xs, m);
  Tensor s = mul(dev, dev);
  for (auto d = dims.rbegin(); d != dims.rend(); ++d) s = sum(s, *d, keepdim);
  const double denominator = std::max(0.0, double(n) - c);
  Tensor v = scale(s, 1.0 / denominator);  // 0 / 0: NaN; s / 0: inf, as PyTorch
  if (root) v = unary(v, Unary::kSqrt);
  return x.dim() == 0 ? v.reshape({}) : v;
}

}  // namespace

void init_math(py::module_& m) {
  auto cls = py::reinterpret_borrow<py::class_<Tensor>>(m.attr("Tensor"));
  const std::pair<const char*, Unary> unaries[] = {
      {"exp", Unary::kExp},     {"log", Unary::kLog},     {"sqrt", Unary::kSqrt},
      {"rsqrt", Unary::kRsqrt}, {"abs", Unary::kAbs},     {"neg", Unary::kNeg},
      {"tanh", Unary::kTanh},   {"sin", Unary::kSin},     {"cos", Unary::kCos},
      {"erf", Unary::kErf},     {"log1p", Unary::kLog1p}, {"expm1", Unary::kExpm1},
      {"floor", Unary::kFloor}, {"ceil", Unary::kCeil},   {"round", Unary::kRound},
      {"trunc", Unary::kTrunc}};
  for (const auto& [name, op] : unaries) {
    const Unary u = op;
    auto f = [u](const Tensor& x) { return unary(x, u); };
    m.def(
        name, f, py::arg("input"), Release(),
        (std::string("Elementwise ") + name + ", as torch." + name + "; differentiable.").c_str());
    cls.def(name, f, Release());
  }
  m.attr("negative") = m.attr("neg");
  cls.def(
      "__abs__", [](const Tensor& x) { return unary(x, Unary::kAbs); }, Release());

  auto pow_f = [](const Tensor& x, py::handle exponent) {
    LOOM_CHECK(is_scalar(exponent),
               "pow: the exponent must be a number (loom has no tensor ** tensor; use "
               "loom.exp(e * loom.log(x)) for positive x)");
    const double e = exponent.cast<double>();
    py::gil_scoped_release release;
    return pow(x, e);
  };
  m.def("pow", pow_f, py::arg("input"), py::arg("exponent"),
        "input ** exponent for a number exponent; gradient exponent * input^(exponent-1).");
  cls.def("pow", pow_f, py::arg("exponent"));
  cls.def("__pow__", [](const Tensor& x, py::handle e) -> py::object {
    if (!is_scalar(e)) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
    const double v = e.cast<double>();
    py::gil_scoped_release release;
    Tensor out = pow(x, v);
    py::gil_scoped_acquire acquire;
    return py::cast(out);
  });
  cls.def(
      "__rpow__",
      [](const Tensor& x, py::handle base) -> py::object {
        if (!is_scalar(base)) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
        const double b = base.cast<double>();
        LOOM_CHECK(b > 0.0,
                   "number ** tensor: the base must be positive (computed as "
                   "exp(t * log(base))), got ",
                   b);
        Tensor out;
        {
          py::gil_scoped_release release;
          out = unary(scale(x, std::log(b)), Unary::kExp);
        }
        return py::cast(out);
      },
      "base ** t for a positive number base, as exp(t * log(base)).");

  const char* clamp_doc =
      "min(max(input, min), max) with either bound optional, as torch.clamp (NaN stays NaN; "
      "min > max gives max); the gradient passes where min <= input <= max.";
  m.def("clamp", &clamp_py, py::arg("input"), py::arg("min") = py::none(),
        py::arg("max") = py::none(), clamp_doc);
  cls.def("clamp", &clamp_py, py::arg("min") = py::none(), py::arg("max") = py::none(), clamp_doc);
  m.attr("clip") = m.attr("clamp");
  cls.def(
      "clamp_min", [](const Tensor& x, double v) { return clamp_py(x, v, std::nullopt); },
      py::arg("min"));
  cls.def(
      "clamp_max", [](const Tensor& x, double v) { return clamp_py(x, std::nullopt, v); },
      py::arg("max"));

  m.def("where", &where_py, py::arg("condition"), py::arg("input"), py::arg("other"),
        "input where condition (a uint8 tensor, nonzero = true) else other; the three broadcast "
        "together; input and other may be numbers. Differentiable in input and other.");
  cls.def(
      "where",
      [](const Tensor& self, const Tensor& condition, py::handle other) {
        return where_py(condition, py::cast(self), other);
      },
      py::arg("condition"), py::arg("other"), "self where condition else other (as torch's).");
  auto masked_fill_f = [](const Tensor& x, const Tensor& mask, double value) {
    return masked_fill(x, mask, value);
  };
  m.def("masked_fill", masked_fill_f, py::arg("input"), py::arg("mask"), py::arg("value"),
        Release(), "input with value where mask (uint8, broadcast to input) is nonzero.");
  cls.def("masked_fill", masked_fill_f, py::arg("mask"), py::arg("value"), Release(),
          "self with value where mask (uint8, broadcast to self) is nonzero.");
  m.def("index_add_rows", &index_add_rows, py::arg("input"), py::arg("index"), py::arg("source"),
        Release(),
        "input [V, C] with the rows of source [..., C] added at rows index [...] (int32/int64; "
        "an index used twice adds both). The core of index_add and scatter_add; differentiable "
        "in input and source.");
  cls.def("expand", &expand_py,
          "self broadcast to sizes (-1 keeps a dim), as torch's expand; loom returns a "
          "contiguous copy (not a view), and its gradient sums back to self's shape.");
  for (const bool largest : {true, false}) {
    const char* name = largest ? "max" : "min";
    const std::string doc =
        std::string("The ") + (largest ? "largest" : "smallest") +
        " element (dim None: of all, a 0-d tensor) or, along dim, (values, indices) as "
        "torch." +
        name +
        ": the first index among equals; NaN propagates. Values are "
        "differentiable.";
    auto f = [largest](const Tensor& x, py::handle dim, bool keepdim) {
      return extreme_py(x, dim, keepdim, largest, false);
    };
    m.def(name, f, py::arg("input"), py::arg("dim") = py::none(), py::arg("keepdim") = false,
          doc.c_str());
    cls.def(name, f, py::arg("dim") = py::none(), py::arg("keepdim") = false, doc.c_str());
    const char* arg_name = largest ? "argmax" : "argmin";
    auto g = [largest](const Tensor& x, py::handle dim, bool keepdim) {
      return extreme_py(x, dim, keepdim, largest, true);
    };
    const std::string arg_doc =
        std::string("The index (int64) of the ") + (largest ? "largest" : "smallest") +
        " element along dim (None: in the flattened tensor), as torch." + arg_name + ".";
    m.def(arg_name, g, py::arg("input"), py::arg("dim") = py::none(), py::arg("keepdim") = false,
          arg_doc.c_str());
    cls.def(arg_name, g, py::arg("dim") = py::none(), py::arg("keepdim") = false, arg_doc.c_str());
  }
  const char* topk_doc =
      "The k largest (largest=False: smallest) elements along dim and their indices, sorted, "
      "as torch.topk; ties: the lower index first; NaN counts as the largest value. Values are "
      "differentiable.";
  m.def("topk", &topk_py, py::arg("input"), py::arg("k"), py::arg("dim") = -1,
        py::arg("largest") = true, py::arg("sorted") = true, topk_doc);
  cls.def("topk", &topk_py, py::arg("k"), py::arg("dim") = -1, py::arg("largest") = true,
          py::arg("sorted") = true, topk_doc);
  for (const bool root : {false, true}) {
    const char* name = root ? "std" : "var";
    const std::string doc = std::string("As torch.") + name +
                            ": over dim (None: all; an int or a tuple), correction 1 by default "
                            "(unbiased=False is correction=0); differentiable.";
    auto f = [root](const Tensor& x, py::handle dim, py::handle unbiased, py::handle correction,
                    bool keepdim) { return variance(x, dim, unbiased, correction, keepdim, root); };
    m.def(name, f, py::arg("input"), py::arg("dim") = py::none(), py::arg("unbiased") = py::none(),
          py::kw_only(), py::arg("correction") = py::none(), py::arg("keepdim") = false,
          doc.c_str());
    cls.def(name, f, py::arg("dim") = py::none(), py::arg("unbiased") = py::none(), py::kw_only(),
            py::arg("correction") = py::none(), py::arg("keepdim") = false, doc.c_str());
  }
  m.def(
      "broadcast_to", [](const Tensor& x, const Shape& shape) { return expand(x, shape); },
      py::arg("input"), py::arg("size"), Release(), "input expanded to size (a copy).");
}

}  // namespace loom::python
