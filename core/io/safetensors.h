// safetensors, the tensor file format of the Hugging Face ecosystem: an 8-byte little-endian
// header length N, N bytes of JSON mapping each tensor name to {"dtype", "shape",
// "data_offsets": [begin, end]} (offsets into the data that follows the header) plus an optional
// "__metadata__" object of string values, then the data. Generic: any names, the dtypes loom has
// (F32, BF16, F16, I32, I64, U8). The GPT-2 naming on top of it is core/io/gpt2_weights.h.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

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

// The format's dtype code ("F32", "BF16", ...) and back; the latter throws naming `where` for a
// code loom does not support.
const char* safetensors_dtype_code(DType dtype);
DType dtype_from_safetensors_code(const std::string& code, const std::string& where);

// For writers that stream the data themselves (checkpoints compute checksums as they write):
// the bytes that precede the data of a file holding `entries` in the order given, and where each
// entry's data starts in the file. The data follows the header with no holes, so each entry
// must start aligned to its dtype: list wider dtypes first (the header itself is padded to 8).
struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
};
struct SafetensorsLayout {
  std::string header;                 // the 8-byte length and the JSON header
  std::vector<uint64_t> data_offset;  // per entry, from the start of the file
  uint64_t file_bytes = 0;
};
SafetensorsLayout safetensors_layout(const std::vector<SafetensorsEntry>& entries,
                                     const std::map<std::string, std::string>& metadata = {});

}  // namespace loom::io
