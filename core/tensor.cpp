#include "core/tensor.h"

#include <cstring>
#include <limits>
#include <sstream>

#include "core/autograd.h"
#include "core/cuda_dispatch.h"
#include "core/dispatch.h"
#include "core/ops.h"
#include "kernels/cpu/copy.h"
#include "kernels/cuda/copy.h"
#include "kernels/cuda/runtime.h"

namespace loom {

// Shapes come from users, files and Python: every product of sizes is checked, so no tensor's
// allocation is ever smaller than its shape (an int64 that wrapped would make it so).
int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape)
    if (s == 0) return 0;  // no elements, however large the other sizes
  for (int64_t s : shape)
    LOOM_CHECK(!__builtin_mul_overflow(n, s, &n), "shape ", shape_str(shape),
               " has more elements than an int64 counts (2^63 - 1)");
  return n;
}

std::string shape_str(const Shape& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    // Saturates: a stride past 2^63 can only belong to a tensor with no elements (a zero size
    // further left), which never indexes with it.
    if (__builtin_mul_overflow(s, std::max<int64_t>(shape[i], 1), &s))
      s = std::numeric_limits<int64_t>::max();
  }
  return strides;
}

Storage::Storage(size_t nbytes, Device device)
    : data_(allocator_for(device).allocate(nbytes)), nbytes_(nbytes), device_(device) {}

Storage::Storage(void* data, size_t nbytes, Device device, std::shared_ptr<void> owner)
    : data_(data), nbytes_(nbytes), device_(device), external_(true), owner_(std::move(owner)) {}

Storage::~Storage() {
  if (!released_ && !external_) allocator_for(device_).deallocate(data_, nbytes_);
}

void Storage::release() {
  LOOM_CHECK(!external_, "Storage::release: the storage wraps external memory (", device_.str(),
             ", ", nbytes_,
             " bytes, e.g. from a numpy array), which loom does not own and cannot free");
  if (released_) return;
  allocator_for(device_).deallocate(data_, nbytes_);
  data_ = nullptr;
  released_ = true;
}

void Storage::materialize() {
  LOOM_CHECK(!external_, "Storage::materialize: the storage wraps external memory (", device_.str(),
             ", ", nbytes_,
             " bytes, e.g. from a numpy array), which loom does not own and cannot allocate");
  if (!released_) return;
  data_ = allocator_for(device_).allocate(nbytes_);
  released_ = false;
}

// ---------------------------------------------------------------- creation

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t s : shape)
    LOOM_CHECK(s >= 0, "Tensor::empty: negative size in shape ", shape_str(shape));
  if (device.is_cuda()) {
    LOOM_CHECK(cuda_rt::built_with_cuda(), "Tensor::empty on ", device.str(),
               ": loom was built without CUDA");
    LOOM_CHECK(device.index < cuda_rt::device_count(), "Tensor::empty on ", device.str(), ": ",
               cuda_rt::device_count(), " CUDA device(s) present",
               cuda_rt::device_count() == 0 ? " (" + cuda_rt::no_gpu_reason() + ")" : "");
  }
  size_t nbytes = 0;
  LOOM_CHECK(!__builtin_mul_overflow(size_t(shape_numel(shape)), dtype_size(dtype), &nbytes) &&
                 nbytes <= size_t(std::numeric_limits<int64_t>::max()),
             "Tensor::empty: shape ", shape_str(shape), " of ", dtype_name(dtype),
             " needs more bytes than an int64 counts");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(nbytes, device);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  impl->device = device;
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(0.0);
  return t;
}

Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}

Tensor Tensor::scalar(double value, DType dtype, Device device) {
  return full({}, value, dtype, device);
}

Tensor Tensor::arange(int64_t n, DType dtype, Device device) {
  Tensor t = empty({n}, dtype, Device::cpu());
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = t.data<T>();
    for (int64_t i = 0; i < n; ++i) p[i] = kernels::cpu::convert_scalar<T>(double(i));
  });
  return device.is_cpu() ? t : t.to(device);
}

Tensor Tensor::from_external(void* data, const Shape& shape, const Shape& strides, DType dtype,
                             std::shared_ptr<void> owner, Device device) {
  LOOM_CHECK(strides.size() == shape.size(), "Tensor::from_external: ", strides.size(),
             " strides for shape ", shape_str(shape), " (needs one per dim)");
  // The bytes the view can reach: one past its last element (nothing when it has no elements).
  int64_t span = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    LOOM_CHECK(shape[i] >= 0, "Tensor::from_external: negative size in shape ", shape_str(shape));
    LOOM_CHECK(strides[i] >= 0, "Tensor::from_external: negative stride ", strides[i], " in ",
               shape_str(strides), " (reverse the data first)");
  }
  if (shape_numel(shape) == 0) span = 0;
  for (size_t i = 0; i < shape.size() && span != 0; ++i) {
    int64_t reach = 0;
    LOOM_CHECK(!__builtin_mul_overflow(shape[i] - 1, strides[i], &reach) &&
                   !__builtin_add_overflow(span, reach, &span),
               "Tensor::from_external: shape ", shape_str(shape), " with strides ",
               shape_str(strides), " reaches past what an int64 counts");
  }
  LOOM_CHECK(data != nullptr || span == 0, "Tensor::from_external: null data for shape ",
             shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage =
      std::make_shared<Storage>(data, size_t(span) * dtype_size(dtype), device, std::move(owner));
  impl->shape = shape;
  impl->strides = strides;
  impl->dtype = dtype;
  impl->device = device;
  return Tensor(std::move(impl));
}

Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = base.dtype();
  impl->device = base.device();
  return Tensor(std::move(impl));
}

// ---------------------------------------------------------------- properties

void Tensor::fail_undefined(const char* what) {
  LOOM_FAIL("Tensor::", what, ": the tensor is undefined");
}

int64_t Tensor::size(int64_t d) const {
  int64_t n = dim();
  LOOM_CHECK(d >= -n && d < n, "Tensor::size: dim ", d, " out of range for ", n, "-D tensor");
  return shape()[d < 0 ? d + n : d];
}
int64_t Tensor::offset() const {
  require_defined("offset");
  return impl_->offset;
}
const std::shared_ptr<Storage>& Tensor::storage() const {
  require_defined("storage");
  return impl_->storage;
}

bool Tensor::is_contiguous() const {
  const Shape& sh = shape();
  const Shape& st = strides();
  if (shape_numel(sh) == 0) return true;  // no element to be out of place (as in PyTorch)
  int64_t expected = 1;
  for (size_t i = sh.size(); i-- > 0;) {
    if (sh[i] == 1) continue;
    if (st[i] != expected) return false;
    expected *= sh[i];
  }
  return true;
}

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  return "Tensor" + shape_str(shape()) + " " + dtype_name(dtype()) + " " + device().str();
}

void* Tensor::data_ptr() const {
  require_defined("data_ptr");
  LOOM_CHECK(!impl_->storage->released(), "Tensor: the memory of ", str(),
             " has been released (a ZeRO-3 parameter used outside its module's forward and "
             "backward? Call the module through operator(), or gather the parameters first)");
  return static_cast<char*>(impl_->storage->data()) + impl_->offset * dtype_size(impl_->dtype);
}

double Tensor::item() const {
  require_defined("item");
  LOOM_CHECK(numel() == 1, "Tensor::item: tensor has ", numel(), " elements (expected 1)");
  Tensor host = detach().to(Device::cpu());
  return visit_dtype(dtype(), [&](auto tag) {
    using T = decltype(tag);
    return kernels::cpu::convert_scalar<double>(*static_cast<const T*>(host.data_ptr()));
  });
}

void Tensor::copy_from_host(const void* src, size_t nbytes_in) {
  require_defined("copy_from_host");
  LOOM_CHECK(is_contiguous(), "Tensor::copy_from_host: destination ", str(), " is not contiguous");
  LOOM_CHECK(nbytes_in == nbytes(), "Tensor::copy_from_host: ", nbytes_in, " bytes for ", str(),
             " (needs ", nbytes(), ")");
  if (nbytes_in == 0) return;
  impl_->storage->bump_version();  // See Note [Version counter]
  if (device().is_cpu())
    std::memcpy(data_ptr(), src, nbytes_in);
  else
    cuda_rt::copy_host_to_device(device().index, data_ptr(), src, nbytes_in);
}

void Tensor::copy_to_host(void* dst, size_t nbytes_out) const {
  require_defined("copy_to_host");
  LOOM_CHECK(is_contiguous(), "Tensor::copy_to_host: source ", str(), " is not contiguous");
  LOOM_CHECK(nbytes_out == nbytes(), "Tensor::copy_to_host: ", nbytes_out, " bytes for ", str(),
             " (needs ", nbytes(), ")");
  if (nbytes_out == 0) return;
  if (device().is_cpu())
    std::memcpy(dst, data_ptr(), nbytes_out);
  else
    cuda_rt::copy_device_to_host(device().index, dst, data_ptr(), nbytes_out);
}

// ---------------------------------------------------------------- copies

namespace {

// A contiguous copy of x's data on x's device (no autograd).
Tensor contiguous_copy(const Tensor& x) {
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (x.numel() == 0) return out;
  const void* base = x.data_ptr();  // the first element; the strides walk from there
  if (x.device().is_cpu()) {
    kernels::cpu::strided_copy(base, out.data_ptr(), dtype_size(x.dtype()), int(x.dim()),
                               x.shape().data(), x.strides().data());
  } else {
    LOOM_IF_CUDA(kernels::cuda::strided_copy(base, out.data_ptr(), dtype_size(x.dtype()),
                                             int(x.dim()), x.shape().data(), x.strides().data(),
                                             cuda_stream(x.device())));
  }
  return out;
}

// Copies contiguous src into contiguous dst of the same byte size, across devices.
void copy_bytes(const Tensor& src, Tensor& dst) {
  size_t n = src.nbytes();
  if (n == 0) return;
  Device s = src.device(), d = dst.device();
  if (s.is_cpu() && d.is_cpu()) {
    std::memcpy(dst.data_ptr(), src.data_ptr(), n);
  } else if (s.is_cpu()) {
    cuda_rt::copy_host_to_device(d.index, dst.data_ptr(), src.data_ptr(), n);
  } else if (d.is_cpu()) {
    cuda_rt::copy_device_to_host(s.index, dst.data_ptr(), src.data_ptr(), n);
  } else if (s == d) {
    cuda_rt::copy_device_to_device(d.index, dst.data_ptr(), src.data_ptr(), n);
  } else {  // between GPUs through the host
    std::vector<char> host(n);
    cuda_rt::copy_device_to_host(s.index, host.data(), src.data_ptr(), n);
    cuda_rt::copy_host_to_device(d.index, dst.data_ptr(), host.data(), n);
  }
}

Tensor convert_copy(const Tensor& x, DType to) {
  Tensor src = x.is_contiguous() ? x : contiguous_copy(x);
  Tensor out = Tensor::empty(x.shape(), to, x.device());
  if (x.device().is_cpu()) {
    visit_dtype(x.dtype(), [&](auto from_tag) {
      visit_dtype(to, [&](auto to_tag) {
        using From = decltype(from_tag);
        using To = decltype(to_tag);
        kernels::cpu::convert(src.data<From>(), out.data<To>(), src.numel());
      });
    });
  } else {
    LOOM_IF_CUDA(kernels::cuda::convert(src.data_ptr(), int(x.dtype()), out.data_ptr(), int(to),
                                        src.numel(), cuda_stream(x.device())));
  }
  return out;
}

}  // namespace

Tensor Tensor::contiguous() const {
  require_defined("contiguous");
  if (is_contiguous()) return *this;
  Tensor out = contiguous_copy(*this);
  autograd::record(out, "contiguous", {*this}, {},
                   [](const Tensor& g) { return std::vector<Tensor>{g}; });
  return out;
}

Tensor Tensor::clone() const {
  require_defined("clone");
  Tensor out = contiguous_copy(*this);
  autograd::record(out, "clone", {*this}, {},
                   [](const Tensor& g) { return std::vector<Tensor>{g}; });
  return out;
}

void Tensor::set_data(const Tensor& source) {
  require_defined("set_data");
  LOOM_CHECK(source.defined(), "Tensor::set_data: source is undefined");
  LOOM_CHECK(source.shape() == shape() && source.dtype() == dtype() && source.device() == device(),
             "Tensor::set_data: source ", source.str(),
             " must have the shape, dtype and device of ", str());
  impl_->storage = source.storage();
  impl_->strides = source.strides();
  impl_->offset = source.offset();
}

void Tensor::to_(DType target) {
  require_defined("to_");
  LOOM_CHECK(is_floating(dtype()) && is_floating(target), "Tensor::to_: ", str(), " to ",
             dtype_name(target), ": only floating tensors convert to floating dtypes in place");
  LOOM_CHECK(impl_->grad_fn == nullptr, "Tensor::to_: ", str(), " was produced by ",
             impl_->grad_fn->name(), "; only leaf tensors convert in place (use to(DType) for a ",
             "differentiable copy)");
  if (target == dtype()) return;
  Tensor converted = convert_copy(*this, target);
  impl_->storage = converted.storage();
  impl_->strides = converted.strides();
  impl_->offset = converted.offset();
  impl_->dtype = target;
  impl_->grad = Tensor();
}

void Tensor::to_(Device target) {
  require_defined("to_");
  LOOM_CHECK(impl_->grad_fn == nullptr, "Tensor::to_: ", str(), " was produced by ",
             impl_->grad_fn->name(), "; only leaf tensors move in place (use to(Device) for a ",
             "differentiable copy)");
  if (target == device()) return;
  Tensor moved = detach().to(target);
  impl_->storage = moved.storage();
  impl_->strides = moved.strides();
  impl_->offset = moved.offset();
  impl_->device = target;
  impl_->grad = Tensor();
}

Tensor Tensor::detach() const {
  require_defined("detach");
  return make_view(*this, shape(), strides(), offset());
}

Tensor Tensor::to(Device target) const {
  require_defined("to");
  if (target == device()) return *this;
  Tensor src = is_contiguous() ? detach() : contiguous_copy(*this);
  Tensor out = Tensor::empty(shape(), dtype(), target);
  copy_bytes(src, out);
  Device source = device();
  autograd::record(out, "to_device", {*this}, {},
                   [source](const Tensor& g) { return std::vector<Tensor>{g.to(source)}; });
  return out;
}

Tensor Tensor::to(DType target) const {
  require_defined("to");
  if (target == dtype()) return *this;
  Tensor out = convert_copy(*this, target);
  if (is_floating(dtype()) && is_floating(target)) {
    DType source = dtype();
    autograd::record(out, "to_dtype", {*this}, {},
                     [source](const Tensor& g) { return std::vector<Tensor>{g.to(source)}; });
  }
  return out;
}

void Tensor::copy_(const Tensor& src) {
  require_defined("copy_");
  LOOM_CHECK(src.defined(), "Tensor::copy_: source is undefined");
  LOOM_CHECK(src.shape() == shape(), "Tensor::copy_: source shape ", shape_str(src.shape()),
             " does not match destination ", shape_str(shape()));
  LOOM_CHECK(src.dtype() == dtype(), "Tensor::copy_: source dtype ", dtype_name(src.dtype()),
             " does not match destination ", dtype_name(dtype()));
  Tensor s = src.detach().contiguous();
  impl_->storage->bump_version();  // See Note [Version counter]
  if (is_contiguous()) {
    copy_bytes(s, *this);
    return;
  }
  // Non-contiguous destination (a view: its elements never overlap): scattered through its
  // strides on its own device.
  if (s.device() != device()) s = s.to(device());
  if (numel() == 0) return;
  if (device().is_cpu()) {
    kernels::cpu::strided_scatter(s.data_ptr(), data_ptr(), dtype_size(dtype()), int(dim()),
                                  shape().data(), strides().data());
  } else {
    LOOM_IF_CUDA(kernels::cuda::strided_scatter(s.data_ptr(), data_ptr(), dtype_size(dtype()),
                                                int(dim()), shape().data(), strides().data(),
                                                cuda_stream(device())));
  }
}

void Tensor::fill_(double value) {
  require_defined("fill_");
  if (!is_contiguous()) {  // a strided view: filled through a contiguous copy of its shape
    Tensor filled = Tensor::empty(shape(), dtype(), device());
    filled.fill_(value);
    copy_(filled);
    return;
  }
  impl_->storage->bump_version();  // See Note [Version counter]
  visit_dtype(dtype(), [&](auto tag) {
    using T = decltype(tag);
    T v = kernels::cpu::convert_scalar<T>(value);
    if (device().is_cpu()) {
      T* p = static_cast<T*>(data_ptr());
      for (int64_t i = 0, n = numel(); i < n; ++i) p[i] = v;
    } else {
      LOOM_IF_CUDA(kernels::cuda::fill(data_ptr(), &v, sizeof(T), numel(), cuda_stream(device())));
    }
  });
}

// ---------------------------------------------------------------- views

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  return loom::narrow(*this, d, start, length);
}
Tensor Tensor::transpose(int64_t d0, int64_t d1) const { return loom::transpose(*this, d0, d1); }
Tensor Tensor::reshape(const Shape& s) const { return loom::reshape(*this, s); }

// ---------------------------------------------------------------- autograd

bool Tensor::requires_grad() const {
  require_defined("requires_grad");
  autograd::refresh_view(impl_);
  return impl_->requires_grad;
}

Tensor& Tensor::set_requires_grad(bool value) {
  require_defined("set_requires_grad");
  LOOM_CHECK(impl_->grad_fn == nullptr,
             "Tensor::set_requires_grad: only leaf tensors can be marked; this one was produced "
             "by ",
             impl_->grad_fn->name(), " (use detach() to make a leaf)");
  LOOM_CHECK(!value || is_floating(dtype()), "Tensor::set_requires_grad: dtype ",
             dtype_name(dtype()), " cannot require gradients (floating types only)");
  impl_->requires_grad = value;
  return *this;
}

bool Tensor::is_leaf() const {
  require_defined("is_leaf");
  autograd::refresh_view(impl_);
  return impl_->grad_fn == nullptr;
}

const Tensor& Tensor::grad() const {
  require_defined("grad");
  return impl_->grad;
}

void Tensor::set_grad(const Tensor& grad) {
  require_defined("set_grad");
  if (grad.defined()) {
    LOOM_CHECK(grad.shape() == shape(), "Tensor::set_grad: gradient shape ",
               shape_str(grad.shape()), " does not match ", shape_str(shape()));
  }
  impl_->grad = grad;
}

void Tensor::zero_grad() {
  require_defined("zero_grad");
  impl_->grad = Tensor();
}

const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const {
  require_defined("grad_fn");
  autograd::refresh_view(impl_);
  return impl_->grad_fn;
}

void Tensor::backward(const Tensor& grad_output) const {
  require_defined("backward");
  Tensor g = grad_output;
  if (!g.defined()) {
    LOOM_CHECK(numel() == 1,
               "Tensor::backward: an implicit gradient needs a single-element "
               "output, this one is ",
               shape_str(shape()), " (pass grad_output)");
    g = Tensor::ones(shape(), dtype(), device());
  }
  autograd::backward({*this}, {g});
}

void Tensor::register_grad_ready_hook(std::function<void(const Tensor&)> hook) {
  require_defined("register_grad_ready_hook");
  LOOM_CHECK(is_leaf(),
             "Tensor::register_grad_ready_hook: only leaf tensors (parameters) have "
             "grad-ready hooks");
  impl_->grad_ready_hooks.push_back(std::move(hook));
}

}  // namespace loom
