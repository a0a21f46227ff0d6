#include "kernels/cuda/copy.h"
#include "kernels/cuda/launch.h"

namespace loom::kernels::cuda {

namespace {

constexpr int kMaxDims = 16;
struct Layout {
  int ndim;
  int64_t shape[kMaxDims];
  int64_t strides[kMaxDims];
};

// Element i of the view sits at offset `off` (layout's strides); kScatter false gathers the view
// into contiguous dst, true scatters contiguous src into the view.
template <typename T, bool kScatter>
__global__ void strided_copy_kernel(const T* src, T* dst, Layout layout, int64_t n) {
  LOOM_GRID_STRIDE(i, n) {
    int64_t rem = i, off = 0;
    for (int d = layout.ndim - 1; d >= 0; --d) {
      off += (rem % layout.shape[d]) * layout.strides[d];
      rem /= layout.shape[d];
    }
    if constexpr (kScatter)
      dst[off] = src[i];
    else
      dst[i] = src[off];
  }
}

template <typename T>
__device__ float to_f(T v) {
  return float(v);
}
template <>
__device__ float to_f(BFloat16 v) {
  return bf16_to_float(v);
}
template <>
__device__ float to_f(Float16 v) {
  return f16_to_float(v);
}

template <typename T>
__device__ T from_f(float v) {
  return T(v);
}
template <>
__device__ BFloat16 from_f(float v) {
  return float_to_bf16(v);
}
template <>
__device__ Float16 from_f(float v) {
  return float_to_f16(v);
}

template <typename To, typename From>
__global__ void convert_kernel(const From* src, To* dst, int64_t n) {
  LOOM_GRID_STRIDE(i, n) {
    if constexpr (std::is_integral_v<To> && std::is_integral_v<From>)
      dst[i] = To(src[i]);
    else
      dst[i] = from_f<To>(to_f(src[i]));
  }
}

template <typename T>
__global__ void put_kernel(const T* src, T* dst, const int64_t* positions, int64_t n) {
  LOOM_GRID_STRIDE(i, n)
  dst[positions[i]] = src[i];
}

template <typename T>
__global__ void fill_kernel(T* dst, T value, int64_t n) {
  LOOM_GRID_STRIDE(i, n)
  dst[i] = value;
}

constexpr int kBlock = kBlockThreads;

// Calls f(T{}) with an unsigned type of elem_size bytes: copies and fills move bit patterns.
template <typename F>
void visit_element_size(const char* op, size_t elem_size, F&& f) {
  switch (elem_size) {
    case 1:
      return f(uint8_t{});
    case 2:
      return f(uint16_t{});
    case 4:
      return f(uint32_t{});
    case 8:
      return f(uint64_t{});
  }
  LOOM_FAIL(op, ": element size ", elem_size);
}

template <typename F>
void visit_type(int code, F&& f) {
  switch (code) {
    case 0:
      return f(float{});
    case 1:
      return f(BFloat16{});
    case 2:
      return f(Float16{});
    case 3:
      return f(int32_t{});
    case 4:
      return f(int64_t{});
    case 5:
      return f(uint8_t{});
    case 6:
      return f(bool{});
  }
  LOOM_FAIL("cuda convert: unknown type code ", code);
}

}  // namespace

namespace {

template <bool kScatter>
void strided(const char* op, const void* src, void* dst, size_t elem_size, int ndim,
             const int64_t* shape, const int64_t* strides, Stream stream) {
  LOOM_CHECK(ndim <= kMaxDims, op, ": ", ndim, " dims (at most ", kMaxDims, ")");
  Layout layout{};
  layout.ndim = ndim;
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) {
    layout.shape[d] = shape[d];
    layout.strides[d] = strides[d];
    n *= shape[d];
  }
  if (n == 0) return;
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    LOOM_LAUNCH((strided_copy_kernel<T, kScatter>), grid_stride_blocks(n), kBlock, 0, stream,
                static_cast<const T*>(src), static_cast<T*>(dst), layout, n);
  };
  visit_element_size(op, elem_size, launch);
}

}  // namespace

void strided_copy(const void* src, void* dst, size_t elem_size, int ndim, const int64_t* shape,
                  const int64_t* strides, Stream stream) {
  strided<false>("cuda strided_copy", src, dst, elem_size, ndim, shape, strides, stream);
}

void strided_scatter(const void* src, void* dst, size_t elem_size, int ndim, const int64_t* shape,
                     const int64_t* strides, Stream stream) {
  strided<true>("cuda strided_scatter", src, dst, elem_size, ndim, shape, strides, stream);
}

void convert(const void* src, int src_type, void* dst, int dst_type, int64_t n, Stream stream) {
  if (n == 0) return;
  visit_type(src_type, [&](auto from_tag) {
    visit_type(dst_type, [&](auto to_tag) {
      using From = decltype(from_tag);
      using To = decltype(to_tag);
      auto kernel = convert_kernel<To, From>;
      LOOM_LAUNCH(kernel, grid_stride_blocks(n), kBlock, 0, stream, static_cast<const From*>(src),
                  static_cast<To*>(dst), n);
    });
  });
}

void put_elements(const void* src, void* dst, size_t elem_size, const int64_t* positions, int64_t n,
                  Stream stream) {
  if (n == 0) return;
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    LOOM_LAUNCH(put_kernel<T>, grid_stride_blocks(n), kBlock, 0, stream, static_cast<const T*>(src),
                static_cast<T*>(dst), positions, n);
  };
  visit_element_size("cuda put_elements", elem_size, launch);
}

void fill(void* dst, const void* value, size_t elem_size, int64_t n, Stream stream) {
  if (n == 0) return;
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    T v;
    memcpy(&v, value, sizeof(T));
    LOOM_LAUNCH(fill_kernel<T>, grid_stride_blocks(n), kBlock, 0, stream, static_cast<T*>(dst), v,
                n);
  };
  visit_element_size("cuda fill", elem_size, launch);
}

}  // namespace loom::kernels::cuda
