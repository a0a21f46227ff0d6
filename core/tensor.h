// Tensor: shared storage + shape + strides + offset (in elements). Views (narrow, transpose,
// reshape of a contiguous tensor) share storage; kernels take contiguous inputs, so ops call
// contiguous() first. A Tensor is a cheap handle (one shared_ptr); copies alias.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"

namespace loom {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);  // "[2, 3]"
Shape contiguous_strides(const Shape& shape);

// Bytes on one device, returned to its allocator when the last tensor using them goes away.
//
// Or external bytes (See Note [External storage]): memory loom did not allocate (a numpy array's
// buffer), kept alive by `owner` until the last tensor using it goes away.
//
// Note [External storage]
// An external Storage wraps memory owned by someone else: `data` stays valid while `owner` (any
// shared_ptr, typically one whose deleter drops a reference on the owning object, e.g. a Python
// ndarray) is alive, and the Storage holds `owner` until it is destroyed. Its bytes never go
// through an Allocator, so the allocator's live and peak counters do not count them: they report
// memory loom allocated, and a tensor made with Tensor::from_external adds nothing to them
// (copies made from it, contiguous() of a strided one, are loom's and are counted). Such a
// storage cannot be released or materialized (ZeRO-3's freeing of gathered parameters): those
// are a loom::Error.
class Storage {
 public:
  Storage(size_t nbytes, Device device);
  // External memory: `nbytes` at `data` on `device`, kept alive by `owner`. See Note [External
  // storage].
  Storage(void* data, size_t nbytes, Device device, std::shared_ptr<void> owner);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

  // Frees the bytes but keeps the object, so every tensor viewing it (a parameter, the copies
  // autograd saved for backward) stays valid and sees the new bytes after materialize(). ZeRO-3
  // frees gathered parameters between uses this way. Reading a released storage's data is an
  // error (Tensor::data_ptr checks).
  void release();
  // Allocates the bytes again (contents undefined) when released; a no-op otherwise.
  void materialize();
  bool released() const { return released_; }
  bool external() const { return external_; }

  // See Note [Version counter]. Every write of these bytes through loom (Tensor::copy_, fill_,
  // add_, an optimizer step, ...) bumps it; autograd compares it at backward against the value
  // it recorded when an op saved a tensor viewing this storage.
  uint64_t version() const { return version_.load(std::memory_order_relaxed); }
  void bump_version() { version_.fetch_add(1, std::memory_order_relaxed); }
  // Sets the version back after a write that rewrote the very values it had then (ZeRO-3's
  // re-gather of unchanged shards, See Note [ZeRO-3 re-gathers]); no other write may use it.
  void restore_version(uint64_t version) { version_.store(version, std::memory_order_relaxed); }

 private:
  void* data_;
  size_t nbytes_;
  Device device_;
  bool released_ = false;
  bool external_ = false;
  std::shared_ptr<void> owner_;  // external storage only: keeps data_ alive
  std::atomic<uint64_t> version_{0};
};

// Note [Version counter]
// An op that saves a tensor for backward (autograd::record's `saved`) notes the tensor's storage
// and that storage's version; the backward checks both before it runs and raises naming the op
// and the tensor when either changed (See autograd::SavedTensor). The counter sits on the Storage,
// so every view of the same bytes (narrow, reshape, detach, a parameter viewing a DDP/ZeRO flat
// buffer) shares it: writing one view invalidates what was saved from another.
// Who bumps: every Tensor method and op that writes existing bytes (copy_, fill_/zero_,
// copy_from_host, add_, scale_, the Python in-place methods, which call these), and the code that
// writes a parameter's bytes with a raw kernel: SGD and AdamW steps, the fused embedding
// optimizers, ZeRO-1/2's all-gather of updated shards. set_data and to_ swap a tensor's storage
// instead of writing it; the saved tensor notices the different storage. Collectives do not
// bump: the caller that writes a parameter through one bumps (See Note [ZeRO-3 re-gathers]
// in parallel/sharded_parameters.h).
// Writes loom cannot see (a numpy view's writes, a user's kernel on data_ptr()) are not counted;
// call storage()->bump_version() after them.

namespace autograd {
class Node;
}
struct TensorImpl;

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- creation ----
  static Tensor empty(const Shape& shape, DType dtype = DType::kF32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::kF32, Device device = Device::cpu());
  static Tensor ones(const Shape& shape, DType dtype = DType::kF32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::kF32,
                     Device device = Device::cpu());
  static Tensor scalar(double value, DType dtype = DType::kF32, Device device = Device::cpu());
  // 0, 1, ..., n-1 as f32 (or the given dtype), shaped [n].
  static Tensor arange(int64_t n, DType dtype = DType::kF32, Device device = Device::cpu());
  // Copies host values (T must match dtype's C++ type) into a new tensor of `shape`.
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape,
                            Device device = Device::cpu());
  // A tensor over external memory, no copy (See Note [External storage]): element (i0, i1, ...)
  // is at data + (i0 * strides[0] + i1 * strides[1] + ...) * dtype_size(dtype). Strides are in
  // elements, non-negative, and may describe any layout (a transposed or sliced numpy view).
  // `owner` keeps the memory alive for as long as any tensor uses it.
  static Tensor from_external(void* data, const Shape& shape, const Shape& strides, DType dtype,
                              std::shared_ptr<void> owner, Device device = Device::cpu());

  // ---- properties ----
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  const Shape& strides() const;
  int64_t dim() const { return int64_t(shape().size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t offset() const;         // in elements
  int64_t numel() const;
  DType dtype() const;
  Device device() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype()); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const;
  std::string str() const;  // "Tensor[2, 3] f32 cpu"

  // ---- data access ----
  void* data_ptr() const;  // first element (storage + offset)
  template <typename T>
  T* data() const;      // checks that T matches dtype
  double item() const;  // the single element as double (any dtype, any device)
  template <typename T>
  std::vector<T> to_vector() const;  // row-major copy to the host, any layout or device
  void copy_from_host(const void* src, size_t nbytes);  // into a contiguous tensor
  void copy_to_host(void* dst, size_t nbytes) const;    // from a contiguous tensor

  // ---- copies and conversions (not recorded by autograd unless noted) ----
  Tensor contiguous() const;       // itself when already contiguous; differentiable
  Tensor clone() const;            // new contiguous storage; differentiable
  Tensor detach() const;           // same storage, no autograd history
  Tensor to(Device device) const;  // differentiable
  Tensor to(DType dtype) const;    // differentiable between floating types
  void copy_(const Tensor& src);   // same shape and dtype; any device or layout
  void fill_(double value);
  void zero_() { fill_(0.0); }
  // Makes this tensor use `source`'s memory (same shape, dtype and device; its values become
  // source's), keeping its own autograd identity: gradient, hooks and graph edges. DDP and ZeRO
  // move parameters into flat buffers this way. Views made earlier (what most ops save for
  // backward: detach(), contiguous copies) keep the old memory; a graph that saved this tensor
  // itself (checkpoint's inputs) would see the new memory, so its backward raises (See Note
  // [Version counter]).
  void set_data(const Tensor& source);
  // Converts a leaf's values to floating `dtype` in new memory, keeping its autograd identity
  // (this impl, requires_grad, hooks): how Module::to casts parameters. Drops the gradient, which
  // had the old dtype. A no-op when the dtype is already `dtype`. Leaves only (an op's output
  // would no longer match its graph). Like set_data, not while a graph that saved this tensor is
  // waiting for backward; views made earlier (detach(), narrow) keep the old memory and dtype.
  void to_(DType dtype);
  // The same for a device: moves a leaf's values to `device` (a contiguous copy), keeping its
  // autograd identity; how Module::to(Device) moves parameters. Drops the gradient.
  void to_(Device device);

  // ---- views (differentiable; see core/ops.h) ----
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor reshape(const Shape& shape) const;

  // ---- autograd ----
  bool requires_grad() const;
  // Marks a leaf as needing a gradient. Only leaves (tensors no op produced) may be marked.
  Tensor& set_requires_grad(bool value);
  bool is_leaf() const;
  const Tensor& grad() const;  // undefined until a backward reaches this leaf
  void set_grad(const Tensor& grad);
  void zero_grad();  // drops the gradient (undefined again)
  const std::shared_ptr<autograd::Node>& grad_fn() const;
  // backward() of a single-element tensor (gradient 1), or with an explicit output gradient.
  void backward(const Tensor& grad_output = Tensor()) const;
  // `hook(param)` runs once this leaf's gradient is complete for the current backward.
  void register_grad_ready_hook(std::function<void(const Tensor&)> hook);

  const std::shared_ptr<TensorImpl>& impl() const { return impl_; }
  bool same_as(const Tensor& other) const { return impl_ == other.impl_; }

 private:
  void require_defined(const char* what) const;
  [[noreturn]] static void fail_undefined(const char* what);
  std::shared_ptr<TensorImpl> impl_;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;
  int64_t offset = 0;
  DType dtype = DType::kF32;
  Device device;

  // autograd state
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<autograd::Node> grad_fn;         // null for leaves
  std::weak_ptr<autograd::Node> grad_accumulator;  // the leaf's AccumulateGrad node
  std::vector<std::function<void(const Tensor&)>> grad_ready_hooks;

  // Differentiable views (See Note [In-place ops and views] in core/autograd.h). A view holds
  // its root (the tensor whose memory it views, never itself a view) weakly, so that no graph
  // that saved a view can keep its own root alive, and shares the root's count of in-place
  // writes that rebased the root's history; `view_generation` is that count when the view's
  // grad_fn was made. A view that is behind rebuilds its history from the root's on next use.
  bool is_view = false;
  std::weak_ptr<TensorImpl> view_base;        // views only
  std::shared_ptr<uint64_t> root_generation;  // a root's own count (made with its first view)
  uint64_t view_generation = 0;               // views only
};

// The properties every op and collective reads, inline: the checks of a small collective or a
// send read a few dozen of them, and out of line each was a call and a check with its message.
inline void Tensor::require_defined(const char* what) const {
  if (impl_ == nullptr) [[unlikely]]
    fail_undefined(what);
}
inline const Shape& Tensor::shape() const {
  require_defined("shape");
  return impl_->shape;
}
inline const Shape& Tensor::strides() const {
  require_defined("strides");
  return impl_->strides;
}
inline int64_t Tensor::numel() const {
  // The product inline (a small collective asks a dozen times); a product that overflows goes to
  // shape_numel, which knows a zero size further on and raises otherwise.
  int64_t n = 1;
  for (int64_t s : shape())
    if (__builtin_mul_overflow(n, s, &n)) return shape_numel(shape());
  return n;
}
inline DType Tensor::dtype() const {
  require_defined("dtype");
  return impl_->dtype;
}
inline Device Tensor::device() const {
  require_defined("device");
  return impl_->device;
}

// Makes a tensor over existing storage (a view): no copy, no autograd history.
Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset);

template <typename T>
T* Tensor::data() const {
  require_defined("data");
  LOOM_CHECK(dtype() == DTypeOf<T>::value, "Tensor::data: tensor is ", dtype_name(dtype()), " but ",
             dtype_name(DTypeOf<T>::value), " was requested");
  return static_cast<T*>(data_ptr());
}

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape, Device device) {
  LOOM_CHECK(int64_t(values.size()) == shape_numel(shape), "Tensor::from_vector: ", values.size(),
             " values for shape ", shape_str(shape), " (needs ", shape_numel(shape), ")");
  Tensor t = empty(shape, DTypeOf<T>::value, device);
  t.copy_from_host(values.data(), values.size() * sizeof(T));
  return t;
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  require_defined("to_vector");
  LOOM_CHECK(dtype() == DTypeOf<T>::value, "Tensor::to_vector: tensor is ", dtype_name(dtype()),
             " but ", dtype_name(DTypeOf<T>::value), " was requested");
  std::vector<T> out(static_cast<size_t>(numel()));
  detach().contiguous().copy_to_host(out.data(), out.size() * sizeof(T));
  return out;
}

}  // namespace loom
