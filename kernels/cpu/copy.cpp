#include "kernels/cpu/copy.h"

#include <cstring>

namespace loom::kernels::cpu {

namespace {

// Copies the innermost contiguous run with memcpy, walking the outer dims with an odometer.
template <size_t kSize>
void strided_copy_typed(const char* src, char* dst, int ndim, const int64_t* shape,
                        const int64_t* strides) {
  int64_t total = 1;
  for (int d = 0; d < ndim; ++d) total *= shape[d];
  if (total == 0) return;
  int64_t inner = ndim > 0 ? shape[ndim - 1] : 1;
  int64_t inner_stride = ndim > 0 ? strides[ndim - 1] : 1;
  int64_t index[16] = {0};
  int64_t src_off = 0;
  for (int64_t done = 0; done < total; done += inner) {
    if (inner_stride == 1) {
      std::memcpy(dst, src + src_off * kSize, size_t(inner) * kSize);
      dst += inner * kSize;
    } else {
      for (int64_t i = 0; i < inner; ++i, dst += kSize)
        std::memcpy(dst, src + (src_off + i * inner_stride) * kSize, kSize);
    }
    for (int d = ndim - 2; d >= 0; --d) {  // advance the odometer over the outer dims
      if (++index[d] < shape[d]) {
        src_off += strides[d];
        break;
      }
      src_off -= strides[d] * (shape[d] - 1);
      index[d] = 0;
    }
  }
}

}  // namespace

void strided_copy(const void* src, void* dst, size_t elem_size, int ndim, const int64_t* shape,
                  const int64_t* strides) {
  auto s = static_cast<const char*>(src);
  auto d = static_cast<char*>(dst);
  switch (elem_size) {
    case 1:
      return strided_copy_typed<1>(s, d, ndim, shape, strides);
    case 2:
      return strided_copy_typed<2>(s, d, ndim, shape, strides);
    case 4:
      return strided_copy_typed<4>(s, d, ndim, shape, strides);
    case 8:
      return strided_copy_typed<8>(s, d, ndim, shape, strides);
  }
}

}  // namespace loom::kernels::cpu
