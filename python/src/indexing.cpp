// Tensor indexing as PyTorch's t[...]: ints (negative too), slices (any positive step), None,
// Ellipsis, an integer index tensor (or list) and a uint8 mask (loom's bool), on any dim, with
// autograd. Ints and step-1 slices are narrow() views; None adds a dim; an index tensor gathers
// rows with embedding() (differentiable; the backward scatter-adds, so repeated indices sum as in
// PyTorch); a mask becomes the index tensor of its nonzero places (computed on the host, as
// PyTorch's mask indexing synchronizes too). Integer tensors are gathered on the host (no
// autograd for them). Where loom differs: an int or a dropped dim gives a reshape of the view,
// which copies when the view is not contiguous, and at most one index tensor or mask per
// expression (PyTorch's combined advanced indexing is refused with a message).
//
// t[...] = value writes in place for ints, step-1 slices, None and Ellipsis (a view's copy_),
// and is recorded by autograd when t or value requires grad, as t += ... is (See Note [In-place
// ops and views] in core/autograd.h): the value's gradient is its places' gradient, and t's old
// values get none there. A leaf that requires grad is refused while grad is on.
#include <pybind11/stl.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "core/autograd.h"
#include "core/ops.h"

namespace loom::python {
namespace {

// x with dims permuted: result dim i is x's dim order[i] (a chain of transposes: views).
Tensor permute_to(Tensor x, const std::vector<int64_t>& order) {
  std::vector<int64_t> at(order.size());  // at[d]: where x's dim d is now
  std::vector<int64_t> holds(order.size());
  for (size_t d = 0; d < order.size(); ++d) at[d] = holds[d] = int64_t(d);
  for (size_t i = 0; i < order.size(); ++i) {
    const int64_t from = at[size_t(order[i])];
    if (from == int64_t(i)) continue;
    x = x.transpose(int64_t(i), from);
    const int64_t moved = holds[i];
    std::swap(holds[i], holds[size_t(from)]);
    at[size_t(order[i])] = int64_t(i);
    at[size_t(moved)] = from;
  }
  return x;
}

// Host gather of whole rows: out[k] = x[idx[k]] along dim 0 (any dtype; no autograd).
Tensor host_gather_rows(const Tensor& x, const std::vector<int64_t>& idx, const Shape& idx_shape) {
  const Tensor h = x.detach().contiguous().to(Device::cpu());
  const size_t row = size_t(h.numel() / std::max<int64_t>(1, h.size(0))) * dtype_size(h.dtype());
  Shape shape = idx_shape;
  shape.insert(shape.end(), h.shape().begin() + 1, h.shape().end());
  Tensor out = Tensor::empty(shape, h.dtype());
  const char* src = static_cast<const char*>(h.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  for (size_t k = 0; k < idx.size(); ++k)
    std::memcpy(dst + k * row, src + size_t(idx[k]) * row, row);
  return out.to(x.device());
}

// x's rows along `dim` at `idx` (any shape; values in [-size, size)): the idx dims replace dim.
Tensor index_select_dims(const Tensor& x, int64_t dim, const Tensor& index) {
  const int64_t size = x.size(dim);
  const Tensor host = index.detach().contiguous().to(Device::cpu()).to(DType::kI64);
  std::vector<int64_t> idx = host.to_vector<int64_t>();
  for (int64_t& i : idx) {
    LOOM_CHECK(i >= -size && i < size, "index ", i, " is out of bounds for dim ", dim,
               " with size ", size);
    if (i < 0) i += size;
  }
  // Move dim to the front, gather rows, then put the index dims where dim was.
  std::vector<int64_t> front{dim};
  for (int64_t d = 0; d < x.dim(); ++d)
    if (d != dim) front.push_back(d);
  const Tensor moved = permute_to(x, front);
  Tensor rows;
  if (is_floating(x.dtype())) {
    const int64_t rest = size > 0 ? moved.numel() / size : 0;
    const Tensor w = moved.reshape({size, rest});
    const Tensor i = Tensor::from_vector(idx, host.shape()).to(x.device());
    rows = embedding(w, i);  // [*idx, rest]
    Shape shape = host.shape();
    shape.insert(shape.end(), moved.shape().begin() + 1, moved.shape().end());
    rows = rows.reshape(shape);
  } else {
    rows = host_gather_rows(moved, idx, host.shape());
  }
  // rows: [*idx (k dims), the other dims of x in order]; the idx block goes to position dim.
  const int64_t k = host.dim();
  std::vector<int64_t> order;
  for (int64_t d = 0; d < dim; ++d) order.push_back(k + d);
  for (int64_t d = 0; d < k; ++d) order.push_back(d);
  for (int64_t d = k + dim; d < rows.dim(); ++d) order.push_back(d);
  return permute_to(rows, order);
}

bool is_index_tensor(py::handle h) {
  if (py::isinstance<Tensor>(h)) return true;
  return py::isinstance<py::list>(h);  // t[[0, 2]]: a list of ints is an index tensor
}

// A mask index: loom.bool (a comparison's result) or uint8 (nonzero = selected).
bool is_mask(const Tensor& t) { return t.dtype() == DType::kBool || t.dtype() == DType::kU8; }

Tensor as_index_tensor(py::handle h) {
  if (py::isinstance<Tensor>(h)) return py::cast<Tensor>(h);
  std::vector<int64_t> v;
  for (py::handle e : h.cast<py::list>()) {
    if (!py::isinstance<py::int_>(e))
      throw py::type_error("a list index must hold ints, got " + std::string(py::repr(e)));
    v.push_back(e.cast<int64_t>());
  }
  return Tensor::from_vector(v, {int64_t(v.size())});
}

// The index expression as a list of items, Ellipsis expanded into full slices.
std::vector<py::object> items_of(const Tensor& x, py::handle index) {
  std::vector<py::object> items;
  if (py::isinstance<py::tuple>(index))
    for (py::handle h : index.cast<py::tuple>())
      items.push_back(py::reinterpret_borrow<py::object>(h));
  else
    items.push_back(py::reinterpret_borrow<py::object>(index));
  int64_t uses = 0, ellipses = 0;  // dims the items consume
  for (const py::object& it : items) {
    if (it.is_none()) continue;
    if (it.ptr() == Py_Ellipsis) {
      ++ellipses;
      continue;
    }
    if (py::isinstance<Tensor>(it) && is_mask(py::cast<const Tensor&>(it)))
      uses += std::max<int64_t>(1, py::cast<const Tensor&>(it).dim());
    else
      ++uses;
  }
  if (ellipses > 1) throw py::index_error("an index can only have a single ellipsis ('...')");
  if (uses > x.dim())
    throw py::index_error("too many indices for tensor of dimension " + std::to_string(x.dim()) +
                          " (" + std::to_string(uses) + " given)");
  std::vector<py::object> out;
  for (const py::object& it : items) {
    if (it.ptr() == Py_Ellipsis) {
      for (int64_t k = 0; k < x.dim() - uses; ++k)
        out.push_back(py::reinterpret_steal<py::object>(PySlice_New(nullptr, nullptr, nullptr)));
    } else {
      out.push_back(it);
    }
  }
  return out;
}

// What an index expression does, applied to x. With `assign_shape` (assignment: basic indices
// only, index tensors and masks refused) the result stays a view of x: an int keeps its dim at
// size 1 and None adds none, and *assign_shape gets the shape PyTorch's t[index] would have,
// which the assigned value broadcasts to.
Tensor apply_index(const Tensor& x, py::handle index, Shape* assign_shape = nullptr) {
  const bool basic_only = assign_shape != nullptr;
  const std::vector<py::object> items = items_of(x, index);
  Tensor t = x;
  int64_t dim = 0;  // the dim of t the next item indexes
  bool advanced = false;
  Shape result;  // assignment only: the shape of t[index] so far
  for (const py::object& it : items) {
    if (it.is_none() && basic_only) {
      result.push_back(1);
    } else if (it.is_none()) {
      Shape s = t.shape();
      s.insert(s.begin() + dim, 1);
      t = view_or_reshape(t, s);  // a view, as PyTorch's: size-1 dims always have one
      ++dim;
    } else if (py::isinstance<py::bool_>(it)) {
      throw py::index_error("a bool index (t[True]) is not supported; use a bool mask tensor");
    } else if (py::isinstance<py::int_>(it) ||
               (!is_index_tensor(it) && PyIndex_Check(it.ptr()) && !py::isinstance<Tensor>(it))) {
      const int64_t size = t.size(dim);
      int64_t i = py::reinterpret_steal<py::object>(PyNumber_Index(it.ptr())).cast<int64_t>();
      if (i < -size || i >= size)
        throw py::index_error("index " + std::to_string(i) + " is out of bounds for dimension " +
                              std::to_string(dim) + " with size " + std::to_string(size));
      if (i < 0) i += size;
      t = t.narrow(dim, i, 1);
      if (basic_only) {
        ++dim;  // kept at size 1, so t stays a view
        continue;
      }
      Shape s = t.shape();
      s.erase(s.begin() + dim);
      t = view_or_reshape(t, s);  // t[:, 1] is a view of t, as PyTorch's
    } else if (py::isinstance<py::slice>(it)) {
      Py_ssize_t start = 0, stop = 0, step = 0, length = 0;
      if (PySlice_GetIndicesEx(it.ptr(), Py_ssize_t(t.size(dim)), &start, &stop, &step, &length) !=
          0)
        throw py::error_already_set();
      if (step <= 0)
        throw py::value_error("slice step must be positive, got " + std::to_string(step));
      t = slice(t, dim, start, length, step);  // a view, with a step too (as PyTorch's)
      result.push_back(length);
      ++dim;
    } else if (is_index_tensor(it)) {
      if (basic_only)
        throw py::index_error(
            "assignment through an index tensor or a mask is not supported "
            "yet: use loom.where(mask, value, t) (or masked_fill) instead");
      if (advanced)
        throw py::index_error(
            "at most one index tensor or mask per index expression in loom "
            "(PyTorch combines several); index in two steps");
      advanced = true;
      Tensor index_tensor = as_index_tensor(it);
      if (is_mask(index_tensor)) {
        // A mask over dims [dim, dim + k): those dims flattened, indexed by its nonzero places.
        const int64_t k = std::max<int64_t>(1, index_tensor.dim());
        const Shape covered(t.shape().begin() + dim, t.shape().begin() + dim + k);
        const Shape mask_shape = index_tensor.dim() == 0 ? Shape{1} : index_tensor.shape();
        if (covered != mask_shape)
          throw py::index_error("the mask's shape " + shape_str(index_tensor.shape()) +
                                " does not match the indexed dims " + shape_str(covered));
        const std::vector<uint8_t> m = index_tensor.detach()
                                           .to(DType::kU8)
                                           .contiguous()
                                           .to(Device::cpu())
                                           .to_vector<uint8_t>();
        std::vector<int64_t> places;
        for (size_t j = 0; j < m.size(); ++j)
          if (m[j]) places.push_back(int64_t(j));
        Shape flat(t.shape().begin(), t.shape().begin() + dim);
        flat.push_back(shape_numel(covered));
        flat.insert(flat.end(), t.shape().begin() + dim + k, t.shape().end());
        py::gil_scoped_release release;
        t = index_select_dims(t.reshape(flat), dim,
                              Tensor::from_vector(places, {int64_t(places.size())}));
        ++dim;
      } else {
        if (index_tensor.dtype() != DType::kI64 && index_tensor.dtype() != DType::kI32)
          throw py::index_error(
              "tensors used as indices must be int64, int32, or bool or uint8 (a mask), "
              "got " +
              std::string(dtype_name(index_tensor.dtype())));
        const int64_t k = index_tensor.dim();
        py::gil_scoped_release release;
        t = index_select_dims(t, dim, index_tensor);
        dim += k;
      }
    } else {
      throw py::index_error(
          "only integers, slices (':'), ellipsis ('...'), None, and int64 or "
          "bool tensors are valid indices, got " +
          std::string(py::str(py::type::of(it).attr("__name__"))));
    }
  }
  if (assign_shape != nullptr) {
    result.insert(result.end(), t.shape().begin() + dim, t.shape().end());
    *assign_shape = result;
  }
  return t;
}

bool has_index_tensor(const Tensor& x, py::handle index) {
  for (const py::object& it : items_of(x, index))
    if (is_index_tensor(it)) return true;
  return false;
}

// t[index] = value with an index tensor or mask in the index: the places x[index] reads are
// found by indexing x's flat positions (0 .. numel-1 laid out in x's shape) the same way, and
// the value, broadcast to x[index]'s shape, is written there with put_ (CPU and CUDA; a place
// named twice is refused, as scatter refuses it).
void assign_advanced(Tensor& x, py::handle index, py::handle value) {
  const Tensor places =
      apply_index(Tensor::arange(x.numel(), DType::kI64, x.device()).reshape(x.shape()), index);
  Tensor src;
  if (is_scalar(value))
    src = Tensor::full(places.shape(), value.cast<double>(), x.dtype(), x.device());
  else if (py::isinstance<Tensor>(value))
    src = py::cast<Tensor>(value).to(x.dtype()).to(x.device());
  else
    throw py::type_error("t[...] = value: value must be a Tensor or a number");
  py::gil_scoped_release release;
  if (src.shape() != places.shape()) src = expand(src, places.shape());
  const int64_t n = places.numel();
  const Tensor at = places.contiguous().reshape({n});
  const bool recorded = autograd::grad_enabled() && is_floating(x.dtype()) &&
                        (x.requires_grad() || src.requires_grad());
  if (!recorded) {
    put_(x, at, src.detach().contiguous().reshape({n}));
    return;
  }
  // Recorded: x's new values where(written, the value scattered to its places, x), computed out
  // of place (differentiable in x and the value) and written with assign_in_place.
  Tensor written = Tensor::zeros({x.numel()}, DType::kBool, x.device());
  put_(written, at, Tensor::ones({n}, DType::kBool, x.device()));
  const Tensor scattered = index_add_rows(Tensor::zeros({x.numel(), 1}, x.dtype(), x.device()), at,
                                          src.contiguous().reshape({n, 1}));
  autograd::assign_in_place(x, where(written.reshape(x.shape()), scattered.reshape(x.shape()), x),
                            "t[...] = value");
}

}  // namespace

void init_indexing(py::module_& m) {
  auto cls = py::reinterpret_borrow<py::class_<Tensor>>(m.attr("Tensor"));
  cls.def(
      "__getitem__", [](const Tensor& x, py::handle index) { return apply_index(x, index); },
      "t[index] as PyTorch's: ints, slices, None, ..., an int64 index tensor or list, a uint8 "
      "mask; differentiable (See python/src/indexing.cpp for where loom differs).");
  cls.def(
      "__setitem__",
      [](py::object self, py::handle index, py::handle value) {
        Tensor& x = self.cast<Tensor&>();
        if (has_index_tensor(x, index)) {  // t[mask] = v, t[idx] = v: See assign_advanced
          assign_advanced(x, index, value);
          return;
        }
        Shape shape;  // what x[index] would be; the value broadcasts to it
        Tensor view = apply_index(x, index, &shape);
        Tensor src;
        if (is_scalar(value))
          src = Tensor::full(view.shape(), value.cast<double>(), view.dtype(), view.device());
        else if (py::isinstance<Tensor>(value))
          src = py::cast<Tensor>(value);
        else
          throw py::type_error("t[...] = value: value must be a Tensor or a number");
        py::gil_scoped_release release;
        if (src.shape() != view.shape()) {
          if (src.shape() != shape) src = expand(src, shape);
          src = src.contiguous().reshape(view.shape());  // the same elements, ints kept as 1s
        }
        autograd::assign_in_place(view, src, "t[...] = value");
      },
      "t[index] = value as PyTorch's, in place: ints, slices, None, ..., and one index tensor "
      "or mask (each place written at most once: a place named twice is an error).");
}

}  // namespace loom::python
