// The peak arithmetic rate of a GPU, for model-FLOPs utilisation (MFU = achieved model FLOP/s /
// peak). From the vendor's datasheet by model name, dense (no 2:4 sparsity): MFU is only as honest
// as the peak it divides by, so an unknown GPU gets no peak rather than a guess.
#pragma once

#include <string>

#include "core/dtype.h"

namespace loom::cli {

struct GpuPeak {
  std::string gpu;     // the device's name, as CUDA reports it
  double flops = 0.0;  // peak FLOP/s for the dtype; 0 when the model is not in the table
  std::string basis;   // what the peak is: "bf16 tensor cores, dense (datasheet)"
};

// For CUDA device `device` computing in `dtype`: bf16/f16 use the tensor-core peak; f32 the
// CUDA-core peak (loom's f32 GEMMs run in full f32, never TF32).
GpuPeak gpu_peak(int device, DType dtype);

// FLOPs of one training step per token of a GPT (forward + backward): 6 per parameter plus the
// attention's 12 * layers * channels * seq (PaLM, appendix B; llm.c's estimate).
double gpt_flops_per_token(double parameters, int layers, int channels, int seq);

}  // namespace loom::cli
