// The optimizers (optimizer/*.h) as loom._loom.optim.*, and gradient clipping.
// python/loom/optim/__init__.py wraps them under PyTorch's names and signatures (param_groups,
// state_dict's layout); this file only converts arguments. step() and clipping release the GIL:
// they touch no Python object, and the parameters they update are held by the C++ optimizer (shared
// tensors), not by Python.
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "bindings.h"
#include "optimizer/adamw.h"
#include "optimizer/clip_grad.h"
#include "optimizer/mixed_precision.h"
#include "optimizer/sgd.h"

namespace loom::python {
namespace {

using Release = py::call_guard<py::gil_scoped_release>;

// Any iterable of tensors (a list, model.parameters()'s generator), as PyTorch accepts.
std::vector<Tensor> tensor_list(py::iterable params, const char* what) {
  std::vector<Tensor> out;
  for (py::handle p : params) {
    if (!py::isinstance<Tensor>(p))
      throw py::type_error(std::string(what) + ": expected an iterable of loom.Tensor, got an " +
                           std::string(py::str(py::type::of(p).attr("__name__"))));
    out.push_back(p.cast<Tensor>());
  }
  return out;
}

// An optimizer's parameters, which must not be empty (as in PyTorch): an empty list is a module
// without parameters or a generator already used up, and the optimizer would train nothing.
std::vector<Tensor> optimizer_params(py::iterable params, const char* what) {
  std::vector<Tensor> out = tensor_list(params, what);
  if (out.empty())
    throw py::value_error(std::string(what) +
                          ": got an empty parameter list (a module without parameters, or a "
                          "parameters() generator that was already used up?)");
  return out;
}

}  // namespace

optim::SgdOptions sgd_options(double lr, double momentum, double dampening, double weight_decay,
                              bool nesterov) {
  optim::SgdOptions o;
  o.lr = lr;
  o.momentum = momentum;
  o.dampening = dampening;
  o.weight_decay = weight_decay;
  o.nesterov = nesterov;
  return o;
}

optim::AdamWOptions adamw_options(double lr, double beta1, double beta2, double eps,
                                  double weight_decay) {
  optim::AdamWOptions o;
  o.lr = lr;
  o.beta1 = beta1;
  o.beta2 = beta2;
  o.eps = eps;
  o.weight_decay = weight_decay;
  return o;
}

void init_optim(py::module_& m) {
  py::module_ o = m.def_submodule("optim", "loom's optimizers (import loom.optim instead)");

  py::class_<optim::Optimizer, std::shared_ptr<optim::Optimizer>>(o, "Optimizer")
      .def("step", &optim::Optimizer::step, Release())
      .def("zero_grad", &optim::Optimizer::zero_grad)
      .def_property("lr", &optim::Optimizer::lr, &optim::Optimizer::set_lr)
      .def_property_readonly("name", [](const optim::Optimizer& self) { return self.name(); })
      .def_property_readonly("params", &optim::Optimizer::params)
      .def("state", &optim::Optimizer::state)
      .def("state_bytes", &optim::Optimizer::state_bytes)
      .def("state_dict", &optim::Optimizer::state_dict, Release())
      .def("load_state_dict", &optim::Optimizer::load_state_dict, py::arg("state"), Release());

  py::class_<optim::SGD, optim::Optimizer, std::shared_ptr<optim::SGD>>(o, "SGD").def(
      py::init([](py::iterable params, double lr, double momentum, double dampening,
                  double weight_decay, bool nesterov) {
        return std::make_shared<optim::SGD>(
            optimizer_params(params, "SGD"),
            sgd_options(lr, momentum, dampening, weight_decay, nesterov));
      }),
      py::arg("params"), py::arg("lr"), py::arg("momentum") = 0.0, py::arg("dampening") = 0.0,
      py::arg("weight_decay") = 0.0, py::arg("nesterov") = false);

  py::class_<optim::AdamW, optim::Optimizer, std::shared_ptr<optim::AdamW>>(o, "AdamW")
      .def(py::init([](py::iterable params, double lr, double beta1, double beta2, double eps,
                       double weight_decay) {
             return std::make_shared<optim::AdamW>(
                 optimizer_params(params, "AdamW"),
                 adamw_options(lr, beta1, beta2, eps, weight_decay));
           }),
           py::arg("params"), py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"),
           py::arg("weight_decay"))
      .def("step_count", &optim::AdamW::step_count, py::arg("param_index"));

  // MixedPrecisionOptimizer over a fresh AdamW or SGD (`inner`, its hyper-parameters in
  // `options`: lr, betas, eps, weight_decay / momentum, dampening, nesterov) stepping the f32
  // masters; loom.optim.MixedPrecisionOptimizer (python/loom/optim/__init__.py) builds it.
  py::class_<optim::MixedPrecisionOptimizer, optim::Optimizer,
             std::shared_ptr<optim::MixedPrecisionOptimizer>>(o, "MixedPrecision")
      .def(py::init([](py::iterable params, const std::string& inner, py::dict options,
                       bool scaling, double init_scale, double growth_factor, double backoff_factor,
                       int64_t growth_interval, bool dynamic) {
             const double lr = options["lr"].cast<double>();
             optim::OptimizerFactory factory;
             if (inner == "adamw") {
               const optim::AdamWOptions a = adamw_options(
                   lr, options["beta1"].cast<double>(), options["beta2"].cast<double>(),
                   options["eps"].cast<double>(), options["weight_decay"].cast<double>());
               factory = [a](std::vector<Tensor> ps) {
                 return std::unique_ptr<optim::Optimizer>(new optim::AdamW(std::move(ps), a));
               };
             } else if (inner == "sgd") {
               const optim::SgdOptions g = sgd_options(
                   lr, options["momentum"].cast<double>(), options["dampening"].cast<double>(),
                   options["weight_decay"].cast<double>(), options["nesterov"].cast<bool>());
               factory = [g](std::vector<Tensor> ps) {
                 return std::unique_ptr<optim::Optimizer>(new optim::SGD(std::move(ps), g));
               };
             } else {
               throw py::value_error("MixedPrecision: inner must be 'adamw' or 'sgd', got '" +
                                     inner + "'");
             }
             optim::LossScaler scaler = optim::LossScaler::none();
             if (scaling) {
               optim::LossScalerOptions so;
               so.init_scale = init_scale;
               so.growth_factor = growth_factor;
               so.backoff_factor = backoff_factor;
               so.growth_interval = growth_interval;
               so.dynamic = dynamic;
               scaler = optim::LossScaler(so);
             }
             return std::make_shared<optim::MixedPrecisionOptimizer>(
                 optimizer_params(params, "MixedPrecisionOptimizer"), factory, scaler);
           }),
           py::arg("params"), py::arg("inner"), py::arg("options"), py::arg("scaling"),
           py::arg("init_scale"), py::arg("growth_factor"), py::arg("backoff_factor"),
           py::arg("growth_interval"), py::arg("dynamic"))
      .def("scale_loss", &optim::MixedPrecisionOptimizer::scale_loss, py::arg("loss"), Release())
      .def("unscale_gradients", &optim::MixedPrecisionOptimizer::unscale_gradients, Release())
      .def("clip_grad_norm", &optim::MixedPrecisionOptimizer::clip_grad_norm, py::arg("max_norm"),
           Release())
      .def_property_readonly(
          "scale", [](const optim::MixedPrecisionOptimizer& self) { return self.scaler().scale(); })
      .def_property_readonly("last_step_skipped", [](const optim::MixedPrecisionOptimizer& self) {
        return self.scaler().last_step_skipped();
      });

  o.def(
      "clip_grad_norm",
      [](py::iterable params, double max_norm) {
        std::vector<Tensor> ps = tensor_list(params, "clip_grad_norm_");
        py::gil_scoped_release release;
        return optim::clip_grad_norm(ps, max_norm);
      },
      py::arg("parameters"), py::arg("max_norm"));
  o.def(
      "grad_sum_of_squares",
      [](py::iterable params) {
        std::vector<Tensor> ps = tensor_list(params, "grad_sum_of_squares");
        py::gil_scoped_release release;
        return optim::grad_sum_of_squares(ps);
      },
      py::arg("parameters"),
      "The sum of the squares of the parameters' gradients (a partial gradient norm: add the "
      "parts of several ranks, then take the root).");
  o.def(
      "scale_grads_to_norm",
      [](py::iterable params, double norm, double max_norm) {
        std::vector<Tensor> ps = tensor_list(params, "scale_grads_to_norm");
        py::gil_scoped_release release;
        optim::scale_grads_to_norm(ps, norm, max_norm);
      },
      py::arg("parameters"), py::arg("norm"), py::arg("max_norm"),
      "Scales the gradients by max_norm / norm when norm exceeds max_norm (clipping, given the "
      "global norm computed over every rank).");
}

}  // namespace loom::python
