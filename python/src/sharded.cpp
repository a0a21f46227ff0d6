// Placeholder: filled in by the binding of this area.
#include "bindings.h"

namespace loom::python {

void init_sharded(py::module_& m) { (void)m; }

}  // namespace loom::python
