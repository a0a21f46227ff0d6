// Autograd from Python: requires_grad, grad, backward on Tensor, and the grad-mode guards behind
// loom.no_grad / loom.enable_grad (python/loom/autograd.py makes them context managers and
// decorators). Grad mode is per thread, as in PyTorch.
#include <pybind11/stl.h>

#include <memory>
#include <optional>

#include "bindings.h"
#include "core/autograd.h"

namespace loom::python {
namespace {

// A guard a Python context manager opens in __enter__ and closes in __exit__ (RAII guards cannot
// span two Python calls by themselves).
template <typename Guard>
class PyGuard {
 public:
  void enter() {
    LOOM_CHECK(!guard_, "grad-mode guard entered twice");
    guard_.emplace();
  }
  void exit() { guard_.reset(); }

 private:
  std::optional<Guard> guard_;
};

}  // namespace

void init_autograd(py::module_& m) {
  auto cls = py::reinterpret_borrow<py::class_<Tensor>>(m.attr("Tensor"));
  cls.def_property(
         "requires_grad", &Tensor::requires_grad,
         [](Tensor& t, bool value) { t.set_requires_grad(value); },
         "Whether backward computes a gradient for this tensor (settable on leaves).")
      .def(
          "requires_grad_",
          [](py::object self, bool value) {
            self.cast<Tensor&>().set_requires_grad(value);
            return self;
          },
          py::arg("requires_grad") = true)
      .def_property_readonly("is_leaf", &Tensor::is_leaf)
      .def_property(
          "grad",
          [](const Tensor& t) -> std::optional<Tensor> {
            if (!t.grad().defined()) return std::nullopt;
            return t.grad();
          },
          [](Tensor& t, std::optional<Tensor> grad) { t.set_grad(grad.value_or(Tensor())); },
          "The accumulated gradient (None until a backward reaches this leaf); assign None to "
          "clear it, as PyTorch's zero_grad(set_to_none=True).")
      .def(
          "backward",
          [](const Tensor& t, std::optional<Tensor> gradient) {
            t.backward(gradient.value_or(Tensor()));
          },
          py::arg("gradient") = py::none(), py::call_guard<py::gil_scoped_release>(),
          "Backpropagates from this tensor (gradient 1 for a one-element tensor, else pass "
          "`gradient`); gradients accumulate into the leaves' .grad. The graph is freed.");

  py::class_<PyGuard<NoGradGuard>>(m, "_NoGradGuard")
      .def(py::init<>())
      .def("enter", &PyGuard<NoGradGuard>::enter)
      .def("exit", &PyGuard<NoGradGuard>::exit);
  py::class_<PyGuard<autograd::EnableGradGuard>>(m, "_EnableGradGuard")
      .def(py::init<>())
      .def("enter", &PyGuard<autograd::EnableGradGuard>::enter)
      .def("exit", &PyGuard<autograd::EnableGradGuard>::exit);
  m.def("is_grad_enabled", &autograd::grad_enabled,
        "False inside `with loom.no_grad():` (per thread).");
}

}  // namespace loom::python
