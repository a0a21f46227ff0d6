#include "common/gpu_peak.h"

#include "kernels/cuda/runtime.h"

namespace loom::cli {

namespace {

struct Entry {
  const char* match;  // a substring of the CUDA device name
  double bf16_tflops, f32_tflops;
  const char* model;
};

// NVIDIA datasheets, dense. More specific names first (H100 PCIe and NVL before plain H100, the
// SXM part, whose CUDA name is "NVIDIA H100 80GB HBM3").
constexpr Entry kTable[] = {
    {"H100 PCIe", 756.5, 51.2, "H100 PCIe"}, {"H100 NVL", 835.0, 60.0, "H100 NVL"},
    {"H100", 989.4, 66.9, "H100 SXM"},       {"H200", 989.4, 66.9, "H200 SXM"},
    {"A100", 312.0, 19.5, "A100"},
};

}  // namespace

GpuPeak gpu_peak(int device, DType dtype) {
  GpuPeak p;
  p.gpu = cuda_rt::device_name(device);
  const bool tensor_cores = dtype == DType::kBF16 || dtype == DType::kF16;
  for (const Entry& e : kTable) {
    if (p.gpu.find(e.match) == std::string::npos) continue;
    p.flops = (tensor_cores ? e.bf16_tflops : e.f32_tflops) * 1e12;
    p.basis = std::string(e.model) + (tensor_cores ? " bf16 tensor cores" : " f32 CUDA cores") +
              ", dense, datasheet";
    return p;
  }
  p.basis = "not in loom's table of peaks: no MFU";
  return p;
}

double gpt_flops_per_token(double parameters, int layers, int channels, int seq) {
  return 6.0 * parameters + 12.0 * double(layers) * double(channels) * double(seq);
}

}  // namespace loom::cli
