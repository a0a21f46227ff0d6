// safetensors, the tensor file format of the Hugging Face ecosystem: an 8-byte little-endian
// header length N, N bytes of JSON mapping each tensor name to {"dtype", "shape",
// "data_offsets": [begin, end]} (offsets into the data that follows the header) plus an optional
// "__metadata__" object of string values, then the data. Generic: any names, the dtypes loom has
// (F32, BF16, F16, I32, I64, U8). The GPT-2 naming on top of it is core/io/gpt2_weights.h.
#pragma once

#include <map>
#include <string>

#include "core/tensor.h"

namespace loom::io {

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;  // CPU, contiguous, in the file's dtype
  std::map<std::string, std::string> metadata;
};

// Throws loom::Error naming the file for: a missing or short file, a header length past the end
// of the file, JSON that does not parse or does not follow the format, an unsupported dtype, and
// data offsets that are out of range, overlap, or disagree with shape x dtype size.
SafetensorsFile read_safetensors(const std::string& path);

// Tensors may be on any device and in any layout; they are written contiguous, in name order.
void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Whether the file starts like a safetensors file (a plausible header length, then '{'). Cheap:
// reads 9 bytes. Throws only when the file cannot be opened.
bool looks_like_safetensors(const std::string& path);

}  // namespace loom::io
