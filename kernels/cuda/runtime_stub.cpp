// Built instead of runtime.cpp when loom is configured without CUDA.
#include "core/error.h"
#include "kernels/cuda/runtime.h"

namespace loom::cuda_rt {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  LOOM_FAIL(what, ": loom was built without CUDA (reconfigure with -DLOOM_WITH_CUDA=ON)");
}
}  // namespace

bool built_with_cuda() { return false; }
int device_count() { return 0; }
std::string no_gpu_reason() { return "loom was built without CUDA"; }
std::string device_name(int) { no_cuda("cuda device_name"); }
void* malloc_device(int, size_t) { no_cuda("cuda malloc"); }
void* try_malloc_device(int, size_t) { no_cuda("cuda malloc"); }
size_t device_free_bytes(int) { return 0; }
void free_device(int, void*) {}
void copy_host_to_device(int, void*, const void*, size_t) { no_cuda("copy to cuda"); }
void copy_device_to_host(int, void*, const void*, size_t) { no_cuda("copy from cuda"); }
void copy_device_to_device(int, void*, const void*, size_t) { no_cuda("cuda copy"); }
void memset_device(int, void*, int, size_t) { no_cuda("cuda memset"); }
void synchronize(int) { no_cuda("cuda synchronize"); }
void set_device(int) { no_cuda("cuda set_device"); }
kernels::cuda::Stream compute_stream(int) { no_cuda("cuda compute_stream"); }
int select_device_for_local_rank(int) { no_cuda("cuda select_device_for_local_rank"); }

void copy_2d_device(void*, size_t, const void*, size_t, size_t, size_t) { no_cuda("cuda copy_2d"); }

}  // namespace loom::cuda_rt
