// The extension module loom._loom. The package python/loom/ re-exports it under PyTorch's names;
// users import `loom`, not this module.
#include "bindings.h"

PYBIND11_MODULE(_loom, m) {
  m.doc() = "loom's compiled core (import loom instead)";
  loom::python::init_errors(m);  // first: the translator applies to everything below
  loom::python::init_tensor(m);
  loom::python::init_autograd(m);
  loom::python::init_ops(m);
  loom::python::init_math(m);
  loom::python::init_creation(m);
  loom::python::init_indexing(m);
  loom::python::init_nn(m);
  loom::python::init_optim(m);
  loom::python::init_distributed(m);
  loom::python::init_io(m);
  loom::python::init_parallel(m);
  loom::python::init_pipeline(m);
  loom::python::init_data(m);
  loom::python::init_sharded(m);
  loom::python::init_checkpoint(m);
  loom::python::init_plan(m);
}
