// loom.Tensor, the dtypes, and numpy interop. See Note [numpy interop].
//
// Note [numpy interop]
// Both directions share memory for CPU tensors, as torch.from_numpy / Tensor.numpy do:
//  - numpy -> loom: from_numpy(arr) wraps arr's buffer in an external Storage (See Note
//    [External storage] in core/tensor.h) whose owner holds a reference to arr, dropped (with the
//    GIL taken, since the last tensor may die inside a GIL-free C++ call such as backward) when
//    the last tensor using the memory goes away. Strides are kept, so a transposed or sliced
//    array stays a view. tensor(data) copies instead, into loom's own (counted) memory.
//  - loom -> numpy: Tensor implements the buffer protocol itself (not pybind11's def_buffer,
//    whose getbuffer cannot report an error), exporting data pointer, shape, byte strides and
//    format; the exporter keeps the Python Tensor, hence the storage, alive. numpy has no
//    bfloat16, and a CUDA or grad-requiring tensor is no plain buffer: those refuse the buffer
//    (BufferError), and numpy then calls __array__, which raises the explanatory error (TypeError
//    or RuntimeError, as PyTorch does).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "core/autograd.h"
#include "core/ops.h"

namespace loom::python {
namespace {

constexpr std::array<DType, 7> kDTypes{DType::kF32, DType::kBF16, DType::kF16, DType::kI32,
                                       DType::kI64, DType::kU8,   DType::kBool};

// PyTorch's names, in the order of loom's DType enum.
const char* torch_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "float32";
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
    case DType::kI32:
      return "int32";
    case DType::kI64:
      return "int64";
    case DType::kU8:
      return "uint8";
    case DType::kBool:
      return "bool";
  }
  return "?";
}

// The singletons loom.float32, ...: created once, never freed (they live as long as the module).
std::array<PyObject*, 7>& dtype_objects() {
  static std::array<PyObject*, 7> objects{};
  return objects;
}

// ---------------------------------------------------------------- numpy dtypes

// The loom dtype of a numpy dtype, or false when loom has none.
bool dtype_of_numpy(const py::dtype& dt, DType* out) {
  if (dt.kind() == 'f' && dt.itemsize() == 4)
    *out = DType::kF32;
  else if (dt.kind() == 'f' && dt.itemsize() == 2)
    *out = DType::kF16;
  else if (dt.kind() == 'i' && dt.itemsize() == 4)
    *out = DType::kI32;
  else if (dt.kind() == 'i' && dt.itemsize() == 8)
    *out = DType::kI64;
  else if (dt.kind() == 'u' && dt.itemsize() == 1)
    *out = DType::kU8;
  else if (dt.kind() == 'b' && dt.itemsize() == 1)
    *out = DType::kBool;
  else
    return false;
  return true;
}

// The buffer-protocol format of a dtype numpy can hold (all but bf16).
const char* buffer_format(DType t) {
  switch (t) {
    case DType::kF32:
      return "f";
    case DType::kF16:
      return "e";
    case DType::kI32:
      return "i";
    case DType::kI64:
      return "q";
    case DType::kU8:
      return "B";
    case DType::kBool:
      return "?";
    case DType::kBF16:
      break;
  }
  return nullptr;
}

const char* kSupported = "float32, float16, int32, int64, uint8 or bool";

// Why `t` cannot be viewed as a numpy array, with the exception type to raise; empty when it
// can. The messages follow PyTorch's and say what to do instead.
std::string numpy_refusal(const Tensor& t, PyObject** type) {
  if (t.requires_grad()) {
    *type = PyExc_RuntimeError;
    return "Can't call numpy() on a tensor that requires grad: use t.detach().numpy()";
  }
  if (!t.device().is_cpu()) {
    *type = PyExc_TypeError;
    return "can't convert a " + t.device().str() +
           " tensor to numpy (numpy arrays live in host memory): copy it first with "
           "t.to(\"cpu\")";
  }
  if (t.dtype() == DType::kBF16) {
    *type = PyExc_TypeError;
    return "can't convert a bfloat16 tensor to numpy: numpy has no bfloat16 type. Convert it "
           "first with t.to(loom.float32)";
  }
  return "";
}

// ---------------------------------------------------------------- buffer protocol

struct BufferShape {
  std::vector<Py_ssize_t> shape, strides;  // strides in bytes
};

extern "C" int tensor_getbuffer(PyObject* obj, Py_buffer* view, int flags) {
  view->obj = nullptr;
  try {
    const Tensor& t = py::cast<const Tensor&>(py::handle(obj));
    PyObject* type = nullptr;
    std::string why = numpy_refusal(t, &type);
    if (!why.empty()) {
      PyErr_SetString(PyExc_BufferError, why.c_str());
      return -1;
    }
    const size_t itemsize = dtype_size(t.dtype());
    auto* layout = new BufferShape;
    for (int64_t d = 0; d < t.dim(); ++d) {
      layout->shape.push_back(Py_ssize_t(t.shape()[d]));
      layout->strides.push_back(Py_ssize_t(t.strides()[d] * int64_t(itemsize)));
    }
    if (!t.is_contiguous() && ((flags & PyBUF_STRIDES) != PyBUF_STRIDES ||
                               (flags & PyBUF_C_CONTIGUOUS) == PyBUF_C_CONTIGUOUS ||
                               (flags & PyBUF_F_CONTIGUOUS) == PyBUF_F_CONTIGUOUS ||
                               (flags & PyBUF_ANY_CONTIGUOUS) == PyBUF_ANY_CONTIGUOUS)) {
      delete layout;
      PyErr_SetString(PyExc_BufferError,
                      "the tensor is not contiguous and the consumer asked for a contiguous "
                      "buffer: use t.contiguous()");
      return -1;
    }
    view->buf = t.numel() == 0 ? nullptr : t.data_ptr();
    view->len = Py_ssize_t(t.numel()) * Py_ssize_t(itemsize);
    view->itemsize = Py_ssize_t(itemsize);
    view->readonly = 0;
    view->format = (flags & PyBUF_FORMAT) == PyBUF_FORMAT
                       ? const_cast<char*>(buffer_format(t.dtype()))
                       : nullptr;
    view->ndim = int(t.dim());
    view->shape = (flags & PyBUF_ND) == PyBUF_ND ? layout->shape.data() : nullptr;
    view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? layout->strides.data() : nullptr;
    view->suboffsets = nullptr;
    view->internal = layout;
    view->obj = obj;
    Py_INCREF(obj);  // the exporter keeps the Tensor (and so its storage) alive
    return 0;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_BufferError, e.what());
    return -1;
  }
}

extern "C" void tensor_releasebuffer(PyObject*, Py_buffer* view) {
  delete static_cast<BufferShape*>(view->internal);
}

// A numpy array sharing t's memory (CPU, not bf16, not requiring grad); raises otherwise.
py::array numpy_view(py::handle self) {
  const Tensor& t = py::cast<const Tensor&>(self);
  PyObject* type = nullptr;
  std::string why = numpy_refusal(t, &type);
  if (!why.empty()) {
    PyErr_SetString(type, why.c_str());
    throw py::error_already_set();
  }
  return py::array(py::memoryview(py::reinterpret_borrow<py::object>(self)));
}

// A host copy that numpy can hold (bf16 as float32), for item/tolist/repr.
py::array numpy_copy(const Tensor& t) {
  Tensor host;
  {
    py::gil_scoped_release release;
    host = t.detach().to(Device::cpu());
    if (host.dtype() == DType::kBF16) host = host.to(DType::kF32);
  }
  return py::array(py::cast(host)).attr("copy")();
}

// Python's scalar conversions (float(t), int(t)) take one-element tensors only, as PyTorch's do.
void require_one_element(const Tensor& t, const char* what) {
  if (t.numel() != 1)
    throw py::value_error(std::string(what) + ": only a one-element tensor converts to a Python " +
                          "number; this one has shape " + shape_str(t.shape()) + " (" +
                          std::to_string(t.numel()) + " elements)");
}

// The value of a one-element tensor, as Tensor::item gives it, without the GIL.
double float_of(const Tensor& t) {
  py::gil_scoped_release release;
  return t.item();
}

// ---------------------------------------------------------------- numpy -> loom

// Drops the reference `owner` holds on a Python object, taking the GIL: the last tensor may die
// in a GIL-free C++ call (backward frees saved tensors). After the interpreter has finalized
// there is nobody left to tell.
bool python_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

std::shared_ptr<void> python_owner(py::object obj) {
  return std::shared_ptr<void>(obj.release().ptr(), [](void* p) {
    if (!Py_IsInitialized() || python_finalizing()) return;
    py::gil_scoped_acquire gil;
    Py_DECREF(static_cast<PyObject*>(p));
  });
}

Tensor from_numpy(py::handle obj) {
  if (!py::isinstance<py::array>(obj)) {
    throw py::type_error("from_numpy: expected a numpy.ndarray, got " +
                         std::string(py::str(py::type::of(obj).attr("__name__"))) +
                         " (use loom.tensor(data) to copy other data)");
  }
  auto arr = py::reinterpret_borrow<py::array>(obj);
  DType dtype;
  if (!dtype_of_numpy(arr.dtype(), &dtype)) {
    throw py::value_error("from_numpy: numpy dtype " + std::string(py::str(arr.dtype())) +
                          " has no loom dtype (" + kSupported +
                          "); convert first, e.g. arr.astype(numpy.float32), or copy with "
                          "loom.tensor(arr)");
  }
  if (!arr.dtype().attr("isnative").cast<bool>()) {
    throw py::value_error("from_numpy: the array is not in native byte order (" +
                          std::string(py::str(arr.dtype())) + "); use arr.astype(arr.dtype." +
                          "newbyteorder('='))");
  }
  if (!arr.writeable()) {
    throw py::value_error(
        "from_numpy: the array is read-only, and loom tensors are writable (in-place updates "
        "would write into it); copy it with loom.tensor(arr), or arr.copy() first");
  }
  const auto itemsize = int64_t(arr.itemsize());
  Shape shape, strides;
  for (py::ssize_t d = 0; d < arr.ndim(); ++d) {
    shape.push_back(int64_t(arr.shape(d)));
    const int64_t stride = int64_t(arr.strides(d));
    if (stride < 0 || stride % itemsize != 0) {
      throw py::value_error(
          "from_numpy: stride " + std::to_string(stride) + " bytes of dim " + std::to_string(d) +
          (stride < 0 ? " is negative (a reversed view); copy it with numpy.ascontiguousarray"
                      : " is not a multiple of the element size " + std::to_string(itemsize)));
    }
    strides.push_back(stride / itemsize);
  }
  void* data = arr.mutable_data();
  return Tensor::from_external(data, shape, strides, dtype, python_owner(arr));
}

// tensor(data, ...): a copy in loom's memory. Python floats become float32 (loom has no float64),
// ints int64, bools bool; numpy float64 arrays become float32.
Tensor make_tensor(py::handle data, py::handle dtype_obj, bool requires_grad, py::handle device) {
  Tensor src;
  if (py::isinstance<Tensor>(data)) {
    src = py::cast<const Tensor&>(data).detach();
  } else {
    py::module_ np = py::module_::import("numpy");
    py::array arr = np.attr("asarray")(data);
    py::dtype dt = arr.dtype();
    if (dt.kind() == 'f' && dt.itemsize() == 8) arr = arr.attr("astype")("float32");
    if (dt.kind() == 'O') {
      throw py::type_error("tensor: cannot make a tensor from " +
                           std::string(py::str(py::type::of(data).attr("__name__"))) +
                           " (ragged nested lists, or objects that are not numbers?)");
    }
    if (!arr.dtype().attr("isnative").cast<bool>()) arr = np.attr("ascontiguousarray")(arr);
    if (!arr.writeable() || arr.attr("strides").cast<py::tuple>().size() != size_t(arr.ndim()))
      arr = arr.attr("copy")();
    // Negative strides (a reversed view) cannot be wrapped: copy those first.
    for (py::ssize_t d = 0; d < arr.ndim(); ++d)
      if (arr.strides(d) < 0) arr = np.attr("ascontiguousarray")(arr);
    src = from_numpy(arr);
  }
  Tensor out;
  {
    py::gil_scoped_release release;
    out = src.clone().detach();
  }
  if (!dtype_obj.is_none()) {
    DType target = dtype_arg(dtype_obj);
    py::gil_scoped_release release;
    out = out.to(target);
  }
  if (!device.is_none()) {
    Device target = Device::parse(py::str(device));
    py::gil_scoped_release release;
    out = out.to(target);
  }
  if (requires_grad) out.set_requires_grad(true);
  return out;
}

// `dim` of a tensor with `ndim` dims (negative counts from the end) as PyTorch takes it: an
// IndexError naming the op and the range otherwise. `extra`: one more place is valid (unsqueeze).
int64_t view_dim(const char* op, int64_t dim, int64_t ndim, int64_t extra = 0) {
  const int64_t n = ndim + extra;
  if (dim < -std::max<int64_t>(n, 1) || dim >= std::max<int64_t>(n, 1))
    throw py::index_error(std::string(op) + ": dim " + std::to_string(dim) +
                          " is out of range for " + std::to_string(n - extra) +
                          " dims (expected [" + std::to_string(-std::max<int64_t>(n, 1)) + ", " +
                          std::to_string(std::max<int64_t>(n, 1) - 1) + "])");
  return dim < 0 ? dim + n : dim;
}

// t with its dims in the order `dims` (a permutation), as a view: a chain of transposes, each a
// view, so the result shares t's memory and autograd goes back through them.
Tensor permute_dims(const Tensor& t, const std::vector<int64_t>& dims) {
  const int64_t n = t.dim();
  if (int64_t(dims.size()) != n)
    throw py::value_error("permute: " + std::to_string(dims.size()) + " dims given for a " +
                          std::to_string(n) + "-dim tensor");
  std::vector<int64_t> want(dims.size());
  std::vector<bool> seen(size_t(n), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    want[i] = view_dim("permute", dims[i], n);
    if (seen[size_t(want[i])])
      throw py::value_error("permute: dim " + std::to_string(want[i]) + " appears twice");
    seen[size_t(want[i])] = true;
  }
  // cur[i]: which of t's dims sits at place i; bring want[i] to place i by one transpose.
  std::vector<int64_t> cur(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) cur[size_t(i)] = i;
  Tensor out = t;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = int64_t(std::find(cur.begin(), cur.end(), want[size_t(i)]) - cur.begin());
    if (j != i) {
      out = out.transpose(i, j);
      std::swap(cur[size_t(i)], cur[size_t(j)]);
    }
  }
  return out;
}

}  // namespace

Shape shape_args(const py::args& args) {
  // f(2, 3) or f((2, 3)) / f([2, 3]), as PyTorch's *size arguments. Each size is checked here, so
  // one past int64 or not an integer is a ValueError naming it rather than pybind11's "Unable to
  // cast".
  py::sequence sizes = args;
  if (args.size() == 1 && !py::isinstance<py::int_>(args[0])) {
    if (!py::isinstance<py::sequence>(args[0]))
      throw py::type_error("a shape is integers or one sequence of them, got " +
                           std::string(py::str(py::type::of(args[0]).attr("__name__"))));
    sizes = args[0].cast<py::sequence>();
  }
  Shape shape;
  for (size_t d = 0; d < sizes.size(); ++d) {
    py::object v = sizes[d];
    if (!py::isinstance<py::int_>(v) && PyIndex_Check(v.ptr()))  // numpy integers, ...
      v = py::reinterpret_steal<py::object>(PyNumber_Index(v.ptr()));
    if (!v || !py::isinstance<py::int_>(v))
      throw py::type_error("size " + std::to_string(d) + " of a shape must be an integer, got " +
                           std::string(py::repr(sizes[d])));
    int overflow = 0;
    const long long n = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (overflow != 0)
      throw py::value_error("size " + std::to_string(d) + " of a shape (" +
                            std::string(py::repr(v)) + ") does not fit in an int64");
    shape.push_back(int64_t(n));
  }
  return shape;
}

namespace {

std::vector<int64_t> dims_args(const py::args& args) {
  std::vector<int64_t> dims;
  for (int64_t d : shape_args(args)) dims.push_back(d);
  return dims;
}

Tensor finish_creation(Tensor t, bool requires_grad) {
  if (requires_grad) t.set_requires_grad(true);
  return t;
}

// ---------------------------------------------------------------- repr

std::string tensor_repr(const Tensor& t) {
  if (!t.defined()) return "tensor(<undefined>)";
  py::module_ np = py::module_::import("numpy");
  std::string body = py::str(np.attr("array2string")(numpy_copy(t), py::arg("separator") = ", ",
                                                     py::arg("prefix") = "tensor("));
  std::string extra;
  if (t.numel() == 0 && t.dim() != 1)
    extra += ", size=" + std::string(py::str(py::tuple(py::cast(t.shape()))));
  if (t.dtype() != DType::kF32 && t.dtype() != DType::kI64)
    extra += std::string(", dtype=loom.") + torch_name(t.dtype());
  if (!t.device().is_cpu()) extra += ", device='" + t.device().str() + "'";
  if (t.grad_fn()) {
    extra += ", grad_fn=<" + t.grad_fn()->name() + ">";
  } else if (t.requires_grad()) {
    extra += ", requires_grad=True";
  }
  return "tensor(" + body + extra + ")";
}

const char* kTensorDoc = R"doc(A multi-dimensional array on the CPU or a GPU, with autograd.

Make one with loom.tensor (copies), loom.from_numpy (shares memory), loom.zeros / ones / full /
empty / arange, or as the result of an operation. CPU tensors convert to numpy without a copy
(np.asarray(t), t.numpy()).

Example:
    >>> import loom, numpy as np
    >>> w = loom.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    >>> loss = (w @ w).sum()
    >>> loss.backward()
    >>> w.grad.numpy()
    array([[ 7., 11.],
           [ 9., 13.]], dtype=float32)
)doc";

const char* kTensorFnDoc =
    R"doc(tensor(data, dtype=None, requires_grad=False, device=None) -> Tensor

A new tensor holding a copy of `data`: a numpy array, a (nested) list of numbers, a Python
number or another Tensor, as torch.tensor. Python floats and numpy float64 become float32 (loom
has no float64), Python ints int64, bools uint8; `dtype` converts afterwards.

Example:
    >>> t = loom.tensor([[1, 2], [3, 4]], dtype=loom.float32)
    >>> t.shape
    (2, 2)
    >>> loom.tensor(np.zeros(3), requires_grad=True).requires_grad
    True
)doc";

const char* kFromNumpyDoc = R"doc(from_numpy(arr) -> Tensor

A CPU tensor sharing `arr`'s memory, as torch.from_numpy: writes through either are seen by the
other, and the tensor keeps `arr` alive. Any strides (a transposed or sliced view) are kept.
The array must be writable, in native byte order, with non-negative strides and a dtype loom
has (float32, float16, int32, int64, uint8). Its bytes are not counted by loom's allocator.

Example:
    >>> a = np.arange(6, dtype=np.float32).reshape(2, 3)
    >>> t = loom.from_numpy(a.T)
    >>> t.shape, np.shares_memory(np.asarray(t), a)
    ((3, 2), True)
)doc";

}  // namespace

// ---------------------------------------------------------------- shared helpers

DType dtype_arg(py::handle obj) {
  if (py::isinstance<DType>(obj)) return py::cast<DType>(obj);
  if (py::isinstance<py::str>(obj)) {
    std::string name = py::str(obj);
    if (name.rfind("loom.", 0) == 0) name = name.substr(5);
    for (DType t : kDTypes)
      if (name == torch_name(t) || name == dtype_name(t)) return t;
    throw py::value_error("unknown dtype '" + std::string(py::str(obj)) +
                          "' (expected float32, bfloat16, float16, int32, int64, uint8 or bool)");
  }
  throw py::type_error("expected a loom.dtype (loom.float32, ...), got " +
                       std::string(py::str(py::type::of(obj).attr("__name__"))));
}

py::object dtype_object(DType dtype) {
  return py::reinterpret_borrow<py::object>(dtype_objects()[size_t(dtype)]);
}

bool is_scalar(py::handle obj) {
  return py::isinstance<py::float_>(obj) || py::isinstance<py::int_>(obj);
}

void init_tensor(py::module_& m) {
  // ---- dtypes ----
  py::class_<DType>(m, "dtype",
                    "An element type: loom.float32, bfloat16, float16, int32, int64, "
                    "uint8, bool (PyTorch's names).")
      .def_property_readonly("itemsize", [](DType t) { return dtype_size(t); })
      .def_property_readonly("is_floating_point", [](DType t) { return is_floating(t); })
      .def("__repr__", [](DType t) { return std::string("loom.") + torch_name(t); })
      .def("__str__", [](DType t) { return std::string("loom.") + torch_name(t); })
      .def("__eq__",
           [](DType a, py::handle b) { return py::isinstance<DType>(b) && a == b.cast<DType>(); })
      .def("__hash__", [](DType t) { return int(t); })
      .def(py::pickle([](DType t) { return py::make_tuple(int(t)); },
                      [](py::tuple s) { return DType(s[0].cast<int>()); }));
  for (DType t : kDTypes) {
    static_assert(std::is_same_v<std::underlying_type_t<DType>, uint8_t>);
    py::object obj = py::cast(t);
    dtype_objects()[size_t(t)] = obj.inc_ref().ptr();
    m.attr(torch_name(t)) = obj;
  }

  // ---- Tensor ----
  py::class_<Tensor> cls(m, "Tensor", py::buffer_protocol(), kTensorDoc);
  auto* heap = reinterpret_cast<PyHeapTypeObject*>(cls.ptr());
  heap->as_buffer.bf_getbuffer = tensor_getbuffer;  // See Note [numpy interop]
  heap->as_buffer.bf_releasebuffer = tensor_releasebuffer;

  cls.def_property_readonly("dtype", [](const Tensor& t) { return dtype_object(t.dtype()); })
      .def_property_readonly(
          "device", [](const Tensor& t) { return t.device().str(); },
          "Where the tensor lives: 'cpu' or 'cuda:N'.")
      .def_property_readonly("shape",
                             [](const Tensor& t) { return py::tuple(py::cast(t.shape())); })
      .def_property_readonly("ndim", &Tensor::dim)
      .def_property_readonly("is_cuda", [](const Tensor& t) { return t.device().is_cuda(); })
      .def("dim", &Tensor::dim)
      .def(
          "size",
          [](const Tensor& t, py::object dim) -> py::object {
            if (dim.is_none()) return py::tuple(py::cast(t.shape()));
            return py::int_(t.size(dim.cast<int64_t>()));
          },
          py::arg("dim") = py::none(), "The shape as a tuple, or the size of one dim.")
      .def(
          "stride",
          [](const Tensor& t, py::object dim) -> py::object {
            if (dim.is_none()) return py::tuple(py::cast(t.strides()));
            int64_t d = dim.cast<int64_t>();
            LOOM_CHECK(d >= -t.dim() && d < t.dim(), "stride: dim ", d, " out of range for ",
                       t.dim(), "-D tensor");
            return py::int_(t.strides()[size_t(d < 0 ? d + t.dim() : d)]);
          },
          py::arg("dim") = py::none(), "Strides in elements (numpy's are in bytes).")
      .def("numel", &Tensor::numel)
      .def("element_size", [](const Tensor& t) { return dtype_size(t.dtype()); })
      .def("is_contiguous", &Tensor::is_contiguous)
      .def("__len__",
           [](const Tensor& t) {
             if (t.dim() == 0) throw py::type_error("len() of a 0-d tensor");
             return t.shape()[0];
           })
      .def(
          "item",
          [](const Tensor& t) -> py::object {
            double v;
            {
              py::gil_scoped_release release;
              v = t.item();
            }
            if (is_floating(t.dtype())) return py::float_(v);
            return numpy_copy(t).attr("item")();  // exact for int64 beyond 2^53
          },
          "The value of a one-element tensor as a Python float (int for integer dtypes).")
      // float(t), int(t), bool(t) and operator.index(t) as PyTorch has them: one-element tensors
      // only. Without them Python took the buffer protocol's bytes for a number's text.
      .def("__float__",
           [](const Tensor& t) {
             require_one_element(t, "float()");
             return float_of(t);
           })
      .def("__int__",
           [](const Tensor& t) -> py::object {
             require_one_element(t, "int()");
             if (is_floating(t.dtype())) return py::int_(py::float_(float_of(t)));  // truncates
             return numpy_copy(t).attr("item")();
           })
      .def("__bool__",
           [](const Tensor& t) {
             if (t.numel() != 1)
               throw py::value_error("the truth value of a tensor of shape " +
                                     shape_str(t.shape()) + " (" + std::to_string(t.numel()) +
                                     " elements) is ambiguous: only a one-element tensor has one "
                                     "(as in PyTorch)");
             return float_of(t) != 0.0;
           })
      .def("__index__",
           [](const Tensor& t) -> py::object {
             if (is_floating(t.dtype()) || t.numel() != 1)
               throw py::type_error(
                   "only an integer tensor of one element converts to an index; "
                   "this one is " +
                   std::string(dtype_name(t.dtype())) + " " + shape_str(t.shape()));
             return numpy_copy(t).attr("item")();
           })
      .def(
          "tolist", [](const Tensor& t) { return numpy_copy(t).attr("tolist")(); },
          "The values as nested Python lists (a number for a 0-d tensor); bfloat16 as floats.")
      .def(
          "numpy", [](py::handle self) { return numpy_view(self); },
          "A numpy array sharing this CPU tensor's memory (no copy), as torch's Tensor.numpy().")
      .def(
          "__array__",
          [](py::handle self, py::object dtype) {
            py::array a = numpy_view(self);
            if (dtype.is_none()) return a;
            return py::array(a.attr("astype")(dtype, py::arg("copy") = false));
          },
          py::arg("dtype") = py::none())
      .def("__repr__", &tensor_repr)
      .def("data_ptr", [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()); })
      // Which tensor this is, whoever holds it and whether or not its memory is there (a ZeRO-3
      // parameter between uses): loom.nn._placement keys parameters by it.
      .def("_identity", [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.impl().get()); })
      // ---- copies and conversions ----
      .def("contiguous", &Tensor::contiguous, py::call_guard<py::gil_scoped_release>())
      .def("clone", &Tensor::clone, py::call_guard<py::gil_scoped_release>())
      .def("detach", &Tensor::detach, "The same memory without autograd history.")
      .def(
          "to",
          [](const Tensor& t, py::object target, py::object dtype, py::object device) {
            Tensor out = t;
            if (!target.is_none()) {
              if (py::isinstance<DType>(target))
                dtype = target;
              else if (py::isinstance<py::str>(target))
                device = target;
              else
                throw py::type_error("to: expected a loom.dtype or a device string");
            }
            std::optional<DType> to_dtype;
            std::optional<Device> to_device;
            if (!dtype.is_none()) to_dtype = dtype_arg(dtype);
            if (!device.is_none()) to_device = Device::parse(py::str(device));
            py::gil_scoped_release release;
            if (to_device) out = out.to(*to_device);
            if (to_dtype) out = out.to(*to_dtype);
            return out;
          },
          py::arg("target") = py::none(), py::kw_only(), py::arg("dtype") = py::none(),
          py::arg("device") = py::none(),
          "to(loom.float32) / to('cuda:0') / to(device=..., dtype=...): a converted copy "
          "(differentiable), or the tensor itself when nothing changes.")
      .def(
          "cpu", [](const Tensor& t) { return t.to(Device::cpu()); },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "float", [](const Tensor& t) { return t.to(DType::kF32); },
          py::call_guard<py::gil_scoped_release>())
      // ---- views ----
      .def(
          "reshape",
          [](const Tensor& t, py::args shape) { return view_or_reshape(t, shape_args(shape)); },
          "reshape(*shape): a view where the strides allow one (PyTorch's rule), else a copy; "
          "one -1 allowed.")
      .def("transpose", &Tensor::transpose, py::arg("dim0"), py::arg("dim1"))
      .def("narrow", &Tensor::narrow, py::arg("dim"), py::arg("start"), py::arg("length"))
      // PyTorch's view ops, built on reshape and transpose (views, with autograd).
      .def(
          "view", [](const Tensor& t, py::args shape) { return view(t, shape_args(shape)); },
          "view(*shape): the same elements under another shape without copying, as PyTorch's "
          "view: also on a non-contiguous tensor whose strides allow it (q.view(B, T, H, D) on a "
          "part of qkv.split(C, 2)); a ValueError when no view exists.")
      .def(
          "flatten",
          [](const Tensor& t, int64_t start_dim, int64_t end_dim) {
            if (t.dim() == 0) return t.reshape({1});
            const int64_t s = view_dim("flatten", start_dim, t.dim());
            const int64_t e = view_dim("flatten", end_dim, t.dim());
            if (s > e)
              throw py::value_error("flatten: start_dim " + std::to_string(s) +
                                    " comes after end_dim " + std::to_string(e));
            Shape shape(t.shape().begin(), t.shape().begin() + s);
            int64_t merged = 1;
            for (int64_t d = s; d <= e; ++d) merged *= t.size(d);
            shape.push_back(merged);
            shape.insert(shape.end(), t.shape().begin() + e + 1, t.shape().end());
            return view_or_reshape(t, shape);
          },
          py::arg("start_dim") = 0, py::arg("end_dim") = -1,
          "flatten(start_dim=0, end_dim=-1): dims start_dim..end_dim merged into one.")
      .def(
          "unsqueeze",
          [](const Tensor& t, int64_t dim) {
            Shape shape = t.shape();
            shape.insert(shape.begin() + view_dim("unsqueeze", dim, t.dim(), 1), 1);
            return view_or_reshape(t, shape);
          },
          py::arg("dim"), "unsqueeze(dim): a new dim of size 1 at dim (-1: last).")
      .def(
          "squeeze",
          [](const Tensor& t, std::optional<int64_t> dim) {
            Shape shape;
            const int64_t only = dim ? view_dim("squeeze", *dim, t.dim()) : -1;
            for (int64_t d = 0; d < t.dim(); ++d)
              if (t.size(d) != 1 || (dim && d != only)) shape.push_back(t.size(d));
            return view_or_reshape(t, shape);
          },
          py::arg("dim") = py::none(),
          "squeeze(dim=None): size-1 dims removed (all, or only dim when it has size 1).")
      .def(
          "permute",
          [](const Tensor& t, py::args dims) { return permute_dims(t, dims_args(dims)); },
          "permute(*dims): the dims in that order, as a view.")
      .def_property_readonly(
          "T",
          [](const Tensor& t) {
            std::vector<int64_t> dims;
            for (int64_t d = t.dim() - 1; d >= 0; --d) dims.push_back(d);
            return permute_dims(t, dims);
          },
          "Every dim reversed (a 2-D tensor's transpose), as a view.")
      .def_property_readonly(
          "mT",
          [](const Tensor& t) {
            if (t.dim() < 2)
              throw py::value_error("mT: needs at least 2 dims, the tensor has " +
                                    std::to_string(t.dim()));
            return t.transpose(t.dim() - 2, t.dim() - 1);
          },
          "The last two dims swapped (matrix transpose of a batch), as a view.");

  // ---- creation ----
  m.def("tensor", &make_tensor, py::arg("data"), py::arg("dtype") = py::none(),
        py::arg("requires_grad") = false, py::arg("device") = py::none(), kTensorFnDoc);
  m.def("from_numpy", &from_numpy, py::arg("ndarray"), kFromNumpyDoc);
  auto creation = [&m](const char* name, auto make, const char* doc) {
    m.def(
        name,
        [make](py::args shape, py::object dtype, py::object device, bool requires_grad) {
          DType dt = dtype.is_none() ? DType::kF32 : dtype_arg(dtype);
          Device dev = device.is_none() ? Device::cpu() : Device::parse(py::str(device));
          return finish_creation(make(shape_args(shape), dt, dev), requires_grad);
        },
        py::kw_only(), py::arg("dtype") = py::none(), py::arg("device") = py::none(),
        py::arg("requires_grad") = false, doc);
  };
  creation("zeros", &Tensor::zeros, "zeros(*size, dtype=None, device=None, requires_grad=False)");
  creation("ones", &Tensor::ones, "ones(*size, dtype=None, device=None, requires_grad=False)");
  creation("empty", &Tensor::empty,
           "empty(*size, dtype=None, device=None, requires_grad=False): values undefined");
  m.def(
      "full",
      [](const Shape& size, double value, py::object dtype, py::object device, bool rg) {
        DType dt = dtype.is_none() ? DType::kF32 : dtype_arg(dtype);
        Device dev = device.is_none() ? Device::cpu() : Device::parse(py::str(device));
        return finish_creation(Tensor::full(size, value, dt, dev), rg);
      },
      py::arg("size"), py::arg("fill_value"), py::kw_only(), py::arg("dtype") = py::none(),
      py::arg("device") = py::none(), py::arg("requires_grad") = false,
      "full(size, fill_value, dtype=None, device=None, requires_grad=False)");
  m.def(
      "arange",
      [](py::object first, py::object end, py::object step, py::object dtype, py::object device,
         bool rg) {
        Device dev = device.is_none() ? Device::cpu() : Device::parse(py::str(device));
        if (end.is_none() && step.is_none() && py::isinstance<py::int_>(first)) {
          DType dt = dtype.is_none() ? DType::kI64 : dtype_arg(dtype);
          return finish_creation(Tensor::arange(first.cast<int64_t>(), dt, dev), rg);
        }
        // arange(start, end[, step]) or a float end: PyTorch's count ceil((end - start) / step),
        // int64 when every bound is an int, else float32; element i is start + i * step
        // (computed in f64, then converted once).
        const py::object start_obj = end.is_none() ? py::object(py::int_(0)) : first;
        const py::object end_obj = end.is_none() ? first : end;
        const py::object step_obj = step.is_none() ? py::object(py::int_(1)) : step;
        for (const py::object& v : {start_obj, end_obj, step_obj})
          if (!is_scalar(v))
            throw py::type_error("arange: start, end and step must be numbers, got " +
                                 std::string(py::str(py::type::of(v).attr("__name__"))));
        const bool ints = py::isinstance<py::int_>(start_obj) &&
                          py::isinstance<py::int_>(end_obj) && py::isinstance<py::int_>(step_obj);
        const double a = start_obj.cast<double>(), b = end_obj.cast<double>(),
                     s = step_obj.cast<double>();
        if (s == 0 || !std::isfinite(a) || !std::isfinite(b) || !std::isfinite(s))
          throw py::value_error("arange: step must be non-zero and the bounds finite, got start " +
                                std::to_string(a) + ", end " + std::to_string(b) + ", step " +
                                std::to_string(s));
        const double count = std::max(0.0, std::ceil((b - a) / s));
        if (count > double(int64_t(1) << 40))
          throw py::value_error("arange: " + std::to_string(count) + " elements is too many");
        std::vector<double> values(static_cast<size_t>(count));
        for (size_t i = 0; i < values.size(); ++i) values[i] = a + double(i) * s;
        const DType dt = !dtype.is_none() ? dtype_arg(dtype) : ints ? DType::kI64 : DType::kF32;
        Tensor out;
        if (ints) {
          std::vector<int64_t> v(values.begin(), values.end());
          out = Tensor::from_vector(v, {int64_t(v.size())});
        } else {
          std::vector<float> v(values.begin(), values.end());
          out = Tensor::from_vector(v, {int64_t(v.size())});
        }
        return finish_creation(out.to(dt).to(dev), rg);
      },
      py::arg("start"), py::arg("end") = py::none(), py::arg("step") = py::none(), py::kw_only(),
      py::arg("dtype") = py::none(), py::arg("device") = py::none(),
      py::arg("requires_grad") = false,
      "arange(end) or arange(start, end, step=1): start, start + step, ... short of end, as "
      "PyTorch (int64 when every bound is an int, else float32).");
  m.def(
      "memory_allocated",
      [](py::object device) { return allocator_for(Device::parse(py::str(device))).live_bytes(); },
      py::arg("device") = "cpu",
      "Bytes of tensor memory loom's allocator holds for `device` now (from_numpy's arrays are "
      "not loom's and are not counted).");
  m.def(
      "max_memory_allocated",
      [](py::object device) { return allocator_for(Device::parse(py::str(device))).peak_bytes(); },
      py::arg("device") = "cpu");
  m.def("cuda_is_available", &cuda_available);
  m.def("cuda_device_count", &cuda_device_count);
}

}  // namespace loom::python
