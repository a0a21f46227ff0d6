// Device memory for the CUDA kernel tests: an owning buffer on GPU 0 that uploads from and reads
// back to host vectors, and the skip every CUDA test starts with. The kernels under test take raw
// device pointers and know no Tensor, so their tests hold memory this way.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "core/device.h"
#include "kernels/cuda/runtime.h"

// Skips the calling test where no GPU can run it, saying why.
#define LOOM_SKIP_WITHOUT_CUDA() \
  if (!::loom::cuda_available()) \
  GTEST_SKIP() << "no CUDA device: " << ::loom::cuda_rt::no_gpu_reason()

namespace loom::testing {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    ptr_ = cuda_rt::malloc_device(0, bytes > 0 ? bytes : 1);
  }
  template <typename T>
  explicit DeviceBuffer(const std::vector<T>& v) : DeviceBuffer(v.size() * sizeof(T)) {
    write(v);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_) cuda_rt::free_device(0, ptr_);
  }

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

  // Copies v to the start of the buffer.
  template <typename T>
  void write(const std::vector<T>& v) {
    if (!v.empty()) cuda_rt::copy_host_to_device(0, ptr_, v.data(), v.size() * sizeof(T));
  }
  // Every byte 0xff: NaN as f32 / f64, -1 as an integer, so an element a kernel forgot to write
  // fails every comparison.
  void poison() {
    if (bytes_ > 0) cuda_rt::memset_device(0, ptr_, 0xff, bytes_);
  }
  template <typename T>
  std::vector<T> read(size_t n) const {
    std::vector<T> v(n);
    if (n > 0) cuda_rt::copy_device_to_host(0, v.data(), ptr_, n * sizeof(T));
    return v;
  }
  template <typename T>
  T read_one() const {
    return read<T>(1)[0];
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace loom::testing
