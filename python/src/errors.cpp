// Errors cross into Python with loom's message unchanged. loom::Error is a mistake in the input
// (shape, dtype, device, index, file), so ValueError; comm::CommError (a timeout, a dead peer,
// mismatched collectives) is not the input's fault, so RuntimeError, as is any other C++
// exception (pybind11's default). CommError derives from Error, hence caught first.
#include "bindings.h"
#include "collectives/communicator.h"
#include "core/error.h"

namespace loom::python {

void init_errors(py::module_& m) {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const comm::CommError& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    } catch (const Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
}

}  // namespace loom::python
