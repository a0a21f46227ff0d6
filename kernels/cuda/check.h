// Checking macros for CUDA and cuBLAS calls: a failure throws loom::Error naming the call, the
// error string and file:line. Only for translation units compiled with CUDA.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/error.h"

#define LOOM_CUDA_CHECK(call)                                                                   \
  do {                                                                                          \
    cudaError_t loom_err_ = (call);                                                             \
    if (loom_err_ != cudaSuccess)                                                               \
      ::loom::detail::throw_error(                                                              \
          ::loom::detail::str_cat(#call, " failed: ", cudaGetErrorString(loom_err_)), __FILE__, \
          __LINE__);                                                                            \
  } while (0)

#define LOOM_CUBLAS_CHECK(call)                                                                   \
  do {                                                                                            \
    cublasStatus_t loom_st_ = (call);                                                             \
    if (loom_st_ != CUBLAS_STATUS_SUCCESS)                                                        \
      ::loom::detail::throw_error(                                                                \
          ::loom::detail::str_cat(#call, " failed: ", cublasGetStatusString(loom_st_)), __FILE__, \
          __LINE__);                                                                              \
  } while (0)
