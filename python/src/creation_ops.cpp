// Random tensors from a global generator (manual_seed, randn, rand, randint, and the in-place
// normal_ / uniform_), and stack, linspace, eye, tril, triu, under PyTorch's names.
//
// Note [The Python generator]
// loom's random numbers are counter-based (core/rng.h): element i of a draw is a pure function of
// (seed, stream, i). The global generator is a seed and a count of draws: the n-th random call
// since manual_seed(seed) uses stream "loom.random#n", so a script that seeds and then draws in
// the same order gets the same numbers, on any device (values are made on the host in f32 and
// then converted and copied), in any process. The numbers are not PyTorch's (its Mersenne
// Twister / Philox streams differ); the default seed is 0, so an unseeded script is reproducible.
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "core/rng.h"

namespace loom::python {
namespace {

struct Generator {
  uint64_t seed = 0;
  uint64_t draws = 0;
  std::string next_stream() { return "loom.random#" + std::to_string(draws++); }
};

// Called with the GIL held (the state is the interpreter's).
Generator& generator() {
  static Generator g;
  return g;
}

Device device_of(py::handle device) {
  return device.is_none() ? Device::cpu() : Device::parse(py::str(device));
}

DType float_dtype(py::handle dtype, const char* op) {
  const DType dt = dtype.is_none() ? DType::kF32 : dtype_arg(dtype);
  LOOM_CHECK(is_floating(dt), op, ": dtype must be a floating type, got ", dtype_name(dt));
  return dt;
}

// A draw of `shape` on the host in f32 (the fill's own precision), then dtype and device.
Tensor draw(const Shape& shape, bool normal, double a, double b, DType dtype, Device device) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  Generator& g = generator();
  if (normal)
    rng::fill_normal(t, g.seed, g.next_stream(), a, b);
  else
    rng::fill_uniform(t, g.seed, g.next_stream(), a, b);
  return t.to(dtype).to(device);
}

Tensor finish(Tensor t, bool requires_grad) {
  if (requires_grad) t.set_requires_grad(true);
  return t;
}

// x with the elements outside the band zeroed: tril keeps j - i <= diagonal, triu j - i >=
// diagonal, over the last two dims (differentiable through where).
Tensor band(const Tensor& x, int64_t diagonal, bool lower) {
  const char* op = lower ? "tril" : "triu";
  LOOM_CHECK(x.dim() >= 2, op, ": needs at least 2 dims, got ", shape_str(x.shape()));
  const int64_t rows = x.size(-2), cols = x.size(-1);
  std::vector<uint8_t> keep(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      keep[size_t(i * cols + j)] = lower ? (j - i <= diagonal) : (j - i >= diagonal);
  const Tensor mask = Tensor::from_vector(keep, {rows, cols}).to(x.device());
  return where(mask, x, Tensor::scalar(0.0, x.dtype(), x.device()));
}

}  // namespace

RandomStream next_random_stream() {
  Generator& g = generator();
  return {g.seed, g.next_stream()};
}

void init_creation(py::module_& m) {
  auto cls = py::reinterpret_borrow<py::class_<Tensor>>(m.attr("Tensor"));

  m.def(
      "manual_seed",
      [](int64_t seed) {
        generator() = Generator{uint64_t(seed), 0};
        return seed;
      },
      py::arg("seed"),
      "Seeds loom's global generator and restarts its draws (See Note [The Python generator] in "
      "python/src/creation_ops.cpp): the same seed and the same calls give the same numbers on "
      "any device. The numbers are not PyTorch's.");
  m.def("initial_seed", [] { return generator().seed; });

  auto random = [&m](const char* name, bool normal, const char* doc) {
    m.def(
        name,
        [normal, name](py::args size, py::object dtype, py::object device, bool requires_grad) {
          const Shape shape = shape_args(size);
          return finish(draw(shape, normal, normal ? 0.0 : 0.0, 1.0, float_dtype(dtype, name),
                             device_of(device)),
                        requires_grad);
        },
        py::kw_only(), py::arg("dtype") = py::none(), py::arg("device") = py::none(),
        py::arg("requires_grad") = false, doc);
  };
  random("randn", true,
         "randn(*size, dtype=None, device=None, requires_grad=False): standard normal values "
         "from loom's global generator (loom.manual_seed).");
  random("rand", false,
         "rand(*size, dtype=None, device=None, requires_grad=False): uniform values in [0, 1) "
         "from loom's global generator (loom.manual_seed).");
  m.def(
      "randint",
      [](py::args args, py::object size, py::object dtype, py::object device) {
        // randint(high, size) or randint(low, high, size), as PyTorch's positional forms.
        std::vector<py::object> pos;
        for (py::handle a : args) pos.push_back(py::reinterpret_borrow<py::object>(a));
        if (!size.is_none()) pos.push_back(size);
        if (pos.size() != 2 && pos.size() != 3)
          throw py::type_error("randint(high, size) or randint(low, high, size)");
        const int64_t low = pos.size() == 3 ? pos[0].cast<int64_t>() : 0;
        const int64_t high = pos[pos.size() - 2].cast<int64_t>();
        const Shape shape = shape_args(py::args(py::make_tuple(pos.back())));
        // A draw has 24 bits (kernels/cpu/philox.h uniform01); a wider range would skip values.
        LOOM_CHECK(high > low && high - low <= (int64_t(1) << 24),
                   "randint: needs low < high and "
                   "high - low <= 2^24 (loom's uniform draws have 24 bits), got low ",
                   low, ", high ", high);
        const DType dt = dtype.is_none() ? DType::kI64 : dtype_arg(dtype);
        Tensor u = draw(shape, false, 0.0, 1.0, DType::kF32, Device::cpu());
        std::vector<int64_t> v;
        for (float x : u.to_vector<float>())
          v.push_back(low + int64_t(std::floor(double(x) * double(high - low))));
        return Tensor::from_vector(v, shape).to(dt).to(device_of(device));
      },
      py::kw_only(), py::arg("size") = py::none(), py::arg("dtype") = py::none(),
      py::arg("device") = py::none(),
      "randint(high, size) or randint(low, high, size): integers uniform in [low, high), int64 "
      "by default, from loom's global generator.");
  for (const bool normal : {true, false}) {
    const char* name = normal ? "normal_" : "uniform_";
    cls.def(
        name,
        [normal, name](py::object self, double a, double b) {
          Tensor& t = self.cast<Tensor&>();
          LOOM_CHECK(is_floating(t.dtype()), name, ": the tensor is ", dtype_name(t.dtype()),
                     ", expected a floating type");
          // Recorded as any in-place write (a leaf that requires grad is refused while grad is
          // on: nn.init fills under no_grad).
          autograd::assign_in_place(t, draw(t.shape(), normal, a, b, t.dtype(), t.device()), name);
          return self;
        },
        py::arg(normal ? "mean" : "from") = normal ? 0.0 : 0.0,
        py::arg(normal ? "std" : "to") = 1.0,
        normal ? "Fills in place with normal values (mean, std) from loom's global generator."
               : "Fills in place with uniform values in [from, to) from loom's global generator.");
  }

  m.def(
      "stack",
      [](const std::vector<Tensor>& tensors, int64_t dim) {
        LOOM_CHECK(!tensors.empty(), "stack: expects a non-empty list of tensors");
        const int64_t nd = tensors[0].dim() + 1;
        LOOM_CHECK(dim >= -nd && dim < nd, "stack: dim ", dim, " out of range for ", nd,
                   "-D results");
        if (dim < 0) dim += nd;
        std::vector<Tensor> parts;
        for (size_t i = 0; i < tensors.size(); ++i) {
          LOOM_CHECK(tensors[i].shape() == tensors[0].shape(), "stack: tensor ", i, " has shape ",
                     shape_str(tensors[i].shape()), ", tensor 0 ", shape_str(tensors[0].shape()),
                     " (stack needs equal shapes)");
          Shape s = tensors[i].shape();
          s.insert(s.begin() + dim, 1);
          parts.push_back(tensors[i].reshape(s));
        }
        return cat(parts, dim);
      },
      py::arg("tensors"), py::arg("dim") = 0, py::call_guard<py::gil_scoped_release>(),
      "stack(tensors, dim=0): equal-shaped tensors joined along a new dim (differentiable).");
  m.def(
      "linspace",
      [](double start, double end, int64_t steps, py::object dtype, py::object device,
         bool requires_grad) {
        LOOM_CHECK(steps >= 0, "linspace: steps must be non-negative, got ", steps);
        // PyTorch's: the first half counts up from start, the second half down from end, so both
        // ends are exact.
        std::vector<float> v(static_cast<size_t>(steps));
        const double step = steps > 1 ? (end - start) / double(steps - 1) : 0.0;
        for (int64_t i = 0; i < steps; ++i)
          v[size_t(i)] =
              float(i < steps / 2 ? start + step * double(i) : end - step * double(steps - 1 - i));
        return finish(Tensor::from_vector(v, {steps})
                          .to(float_dtype(dtype, "linspace"))
                          .to(device_of(device)),
                      requires_grad);
      },
      py::arg("start"), py::arg("end"), py::arg("steps"), py::kw_only(),
      py::arg("dtype") = py::none(), py::arg("device") = py::none(),
      py::arg("requires_grad") = false,
      "linspace(start, end, steps): steps values evenly spaced from start to end inclusive.");
  m.def(
      "eye",
      [](int64_t n, std::optional<int64_t> m_cols, py::object dtype, py::object device,
         bool requires_grad) {
        const int64_t cols = m_cols.value_or(n);
        LOOM_CHECK(n >= 0 && cols >= 0, "eye: sizes must be non-negative, got ", n, " x ", cols);
        std::vector<float> v(static_cast<size_t>(n * cols), 0.0f);
        for (int64_t i = 0; i < std::min(n, cols); ++i) v[size_t(i * cols + i)] = 1.0f;
        const DType dt = dtype.is_none() ? DType::kF32 : dtype_arg(dtype);
        return finish(Tensor::from_vector(v, {n, cols}).to(dt).to(device_of(device)),
                      requires_grad);
      },
      py::arg("n"), py::arg("m") = py::none(), py::kw_only(), py::arg("dtype") = py::none(),
      py::arg("device") = py::none(), py::arg("requires_grad") = false,
      "eye(n, m=None): ones on the diagonal of an n x m matrix, zeros elsewhere.");
  for (const bool lower : {true, false}) {
    const char* name = lower ? "tril" : "triu";
    auto f = [lower](const Tensor& x, int64_t diagonal) { return band(x, diagonal, lower); };
    const char* doc = lower ? "The lower triangle (j - i <= diagonal) of the last two dims, the "
                              "rest zero; differentiable."
                            : "The upper triangle (j - i >= diagonal) of the last two dims, the "
                              "rest zero; differentiable.";
    m.def(name, f, py::arg("input"), py::arg("diagonal") = 0,
          py::call_guard<py::gil_scoped_release>(), doc);
    cls.def(name, f, py::arg("diagonal") = 0, py::call_guard<py::gil_scoped_release>(), doc);
  }
}

}  // namespace loom::python
