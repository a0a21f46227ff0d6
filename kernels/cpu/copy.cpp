#include "kernels/cpu/copy.h"

#include <cstring>

namespace loom::kernels::cpu {

namespace {

// Walks a strided view in row-major order, copying its innermost run with memcpy when it is
// contiguous and walking the outer dims with an odometer. kScatter false: view -> contiguous
// (gather); true: contiguous -> view (scatter).
template <size_t kSize, bool kScatter>
void strided_walk(const char* src, char* dst, int ndim, const int64_t* shape,
                  const int64_t* strides) {
  int64_t total = 1;
  for (int d = 0; d < ndim; ++d) total *= shape[d];
  if (total == 0) return;
  const int64_t inner = ndim > 0 ? shape[ndim - 1] : 1;
  const int64_t inner_stride = ndim > 0 ? strides[ndim - 1] : 1;
  int64_t index[16] = {0};
  int64_t view_off = 0;
  // `flat` walks the contiguous side, view_off the strided one.
  const char* from = src;
  char* to = dst;
  for (int64_t done = 0; done < total; done += inner) {
    if constexpr (kScatter) {
      if (inner_stride == 1) {
        std::memcpy(to + view_off * kSize, from, size_t(inner) * kSize);
        from += inner * kSize;
      } else {
        for (int64_t i = 0; i < inner; ++i, from += kSize)
          std::memcpy(to + (view_off + i * inner_stride) * kSize, from, kSize);
      }
    } else {
      if (inner_stride == 1) {
        std::memcpy(to, from + view_off * kSize, size_t(inner) * kSize);
        to += inner * kSize;
      } else {
        for (int64_t i = 0; i < inner; ++i, to += kSize)
          std::memcpy(to, from + (view_off + i * inner_stride) * kSize, kSize);
      }
    }
    for (int d = ndim - 2; d >= 0; --d) {  // advance the odometer over the outer dims
      if (++index[d] < shape[d]) {
        view_off += strides[d];
        break;
      }
      view_off -= strides[d] * (shape[d] - 1);
      index[d] = 0;
    }
  }
}

template <bool kScatter>
void strided(const void* src, void* dst, size_t elem_size, int ndim, const int64_t* shape,
             const int64_t* strides) {
  auto s = static_cast<const char*>(src);
  auto d = static_cast<char*>(dst);
  switch (elem_size) {
    case 1:
      return strided_walk<1, kScatter>(s, d, ndim, shape, strides);
    case 2:
      return strided_walk<2, kScatter>(s, d, ndim, shape, strides);
    case 4:
      return strided_walk<4, kScatter>(s, d, ndim, shape, strides);
    case 8:
      return strided_walk<8, kScatter>(s, d, ndim, shape, strides);
  }
}

}  // namespace

void put_elements(const void* src, void* dst, size_t elem_size, const int64_t* positions,
                  int64_t n) {
  const auto* s = static_cast<const char*>(src);
  auto* d = static_cast<char*>(dst);
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(d + positions[i] * int64_t(elem_size), s + i * int64_t(elem_size), elem_size);
}

void strided_copy(const void* src, void* dst, size_t elem_size, int ndim, const int64_t* shape,
                  const int64_t* strides) {
  strided</*kScatter=*/false>(src, dst, elem_size, ndim, shape, strides);
}

void strided_scatter(const void* src, void* dst, size_t elem_size, int ndim, const int64_t* shape,
                     const int64_t* strides) {
  strided</*kScatter=*/true>(src, dst, elem_size, ndim, shape, strides);
}

}  // namespace loom::kernels::cpu
