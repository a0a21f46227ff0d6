// The cuBLAS handle of the current device, bound to `stream` (math mode: full f32, no reduced-
// precision split-K reductions). Shared by the .cu files that call cuBLAS; defined in gemm.cu.
#pragma once

#include <cublas_v2.h>

#include "kernels/cuda/stream.h"

namespace loom::kernels::cuda {

cublasHandle_t cublas_handle(Stream stream);

}  // namespace loom::kernels::cuda
