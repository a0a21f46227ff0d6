// An opaque CUDA stream handle, so kernel headers need no CUDA include and core compiles the
// same with and without CUDA. (The same typedef as cudaStream_t; repeating it is legal.)
#pragma once

struct CUstream_st;

namespace loom::kernels::cuda {
using Stream = CUstream_st*;
}
