// See core/io/safetensors.h. The checks follow the reference implementation's
// (huggingface/safetensors): header at most 100 MB, offsets within the data, no overlaps, each
// tensor exactly shape x dtype size. Holes between tensors are tolerated. Writers leave none and
// align each tensor to its dtype by putting wider dtypes first.
#include "core/io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "core/io/detail/file.h"
#include "core/io/detail/json.h"

namespace loom::io {

static_assert(std::endian::native == std::endian::little, "core/io assumes a little-endian host");

namespace {

constexpr const char* kWhat = "safetensors file";
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DTypeCode {
  DType dtype;
  const char* code;
};
constexpr DTypeCode kCodes[] = {{DType::kF32, "F32"},  {DType::kBF16, "BF16"}, {DType::kF16, "F16"},
                                {DType::kI32, "I32"},  {DType::kI64, "I64"},   {DType::kU8, "U8"},
                                {DType::kBool, "BOOL"}};

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin;
  uint64_t end;
};

// A JSON value as a non-negative integer, or an error naming what it is.
uint64_t as_count(const nlohmann::json& v, const std::string& where) {
  LOOM_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0), where,
             " must be a non-negative integer, got ", detail::json_excerpt(v));
  return v.get<uint64_t>();
}

Entry parse_entry(const std::string& path, const std::string& name, const nlohmann::json& v) {
  const std::string where = std::string(kWhat) + " " + path + ": tensor '" + name + "'";
  LOOM_CHECK(v.is_object(), where, " is not a JSON object: ", detail::json_excerpt(v));
  for (const char* key : {"dtype", "shape", "data_offsets"})
    LOOM_CHECK(v.contains(key), where, " has no \"", key, "\"");
  Entry e;
  e.name = name;
  LOOM_CHECK(v["dtype"].is_string(), where, ": dtype must be a string, got ",
             detail::json_excerpt(v["dtype"]));
  const std::string code = v["dtype"].get<std::string>();
  e.dtype = dtype_from_safetensors_code(code, where);

  LOOM_CHECK(v["shape"].is_array(), where, ": shape must be an array, got ",
             detail::json_excerpt(v["shape"]));
  uint64_t bytes = dtype_size(e.dtype);
  for (const nlohmann::json& d : v["shape"]) {
    uint64_t n = as_count(d, where + " shape entry");
    LOOM_CHECK(n <= uint64_t(INT64_MAX) && !__builtin_mul_overflow(bytes, n, &bytes), where,
               ": shape ", detail::json_excerpt(v["shape"]), " is too large");
    e.shape.push_back(int64_t(n));
  }

  const nlohmann::json& off = v["data_offsets"];
  LOOM_CHECK(off.is_array() && off.size() == 2, where, ": data_offsets must be [begin, end], got ",
             detail::json_excerpt(off));
  e.begin = as_count(off[0], where + " data_offsets begin");
  e.end = as_count(off[1], where + " data_offsets end");
  LOOM_CHECK(e.begin <= e.end, where, ": data_offsets [", e.begin, ", ", e.end,
             "] end before they begin");
  LOOM_CHECK(e.end - e.begin == bytes, where, ": data_offsets [", e.begin, ", ", e.end, "] span ",
             e.end - e.begin, " bytes, but shape ", shape_str(e.shape), " ", code, " needs ",
             bytes);
  return e;
}

}  // namespace

const char* safetensors_dtype_code(DType t) {
  for (const DTypeCode& c : kCodes)
    if (c.dtype == t) return c.code;
  LOOM_ASSERT(false, "no safetensors code for dtype ", dtype_name(t));
}

DType dtype_from_safetensors_code(const std::string& code, const std::string& where) {
  for (const DTypeCode& c : kCodes)
    if (code == c.code) return c.dtype;
  LOOM_FAIL(where, " has dtype ", code,
            ", which loom does not support (F32, BF16, F16, I32, I64, U8)");
}

SafetensorsFile read_safetensors(const std::string& path) {
  detail::InFile in(path, kWhat);
  LOOM_CHECK(in.size() >= 8, kWhat, " ", path, " is ", in.size(),
             " bytes, too short for the 8-byte header length");
  uint64_t n = 0;
  in.read_at(0, &n, 8);
  LOOM_CHECK(n <= kMaxHeaderBytes, kWhat, " ", path, ": header length ", n,
             " is over the format's limit of 100 MB (is this a safetensors file?)");
  LOOM_CHECK(8 + n <= in.size(), kWhat, " ", path, " is truncated: the header length ", n,
             " runs past the end of the file (", in.size(), " bytes)");
  std::string text(n, '\0');
  in.read_at(8, text.data(), n);

  const nlohmann::json header =
      detail::parse_json(text, std::string(kWhat) + " " + path + ": the header");
  LOOM_CHECK(header.is_object(), kWhat, " ", path, ": the header must be a JSON object, got ",
             header.type_name());

  SafetensorsFile file;
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      LOOM_CHECK(value.is_object(), kWhat, " ", path, ": __metadata__ must be an object, got ",
                 detail::json_excerpt(value));
      for (const auto& [key, v] : value.items()) {
        LOOM_CHECK(v.is_string(), kWhat, " ", path, ": __metadata__ value '", key,
                   "' must be a string, got ", detail::json_excerpt(v));
        file.metadata[key] = v.get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(path, name, value));
  }

  const uint64_t data_start = 8 + n;
  const uint64_t data_bytes = in.size() - data_start;
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const Entry* last = nullptr;  // the non-empty tensor ending last so far
  for (const Entry& e : entries) {
    LOOM_CHECK(e.end <= data_bytes, kWhat, " ", path, ": tensor '", e.name, "' data_offsets [",
               e.begin, ", ", e.end, "] run past the end of the data (", data_bytes,
               " bytes after the header): the file is truncated or the header is wrong");
    if (e.begin == e.end) continue;  // empty tensors occupy no bytes and overlap nothing
    LOOM_CHECK(last == nullptr || e.begin >= last->end, kWhat, " ", path, ": tensors '", last->name,
               "' [", last->begin, ", ", last->end, ") and '", e.name, "' [", e.begin, ", ", e.end,
               ") overlap");
    last = &e;
  }
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    in.read_at(data_start + e.begin, t.data_ptr(), e.end - e.begin);
    if (e.dtype == DType::kBool) {  // a byte other than 0 or 1 is no bool
      const auto* b = static_cast<const uint8_t*>(t.data_ptr());
      for (uint64_t i = 0; i < e.end - e.begin; ++i)
        LOOM_CHECK(b[i] <= 1, kWhat, " ", path, ": bool tensor '", e.name, "' holds the byte ",
                   int(b[i]), " at element ", i, " (a bool is 0 or 1)");
    }
    file.tensors.emplace(e.name, t);
  }
  return file;
}

SafetensorsLayout safetensors_layout(const std::vector<SafetensorsEntry>& entries,
                                     const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<uint64_t> relative;
  uint64_t offset = 0;
  for (const SafetensorsEntry& e : entries) {
    LOOM_CHECK(!e.name.empty() && e.name != "__metadata__" && !header.contains(e.name),
               "cannot write ", kWhat, ": '", e.name, "' is not a valid or unique tensor name");
    LOOM_ASSERT(offset % dtype_size(e.dtype) == 0, kWhat, " entry '", e.name, "' (",
                dtype_name(e.dtype), ") would start at unaligned offset ", offset,
                ": list wider dtypes first");
    const uint64_t bytes = uint64_t(shape_numel(e.shape)) * dtype_size(e.dtype);
    nlohmann::json shape = nlohmann::json::array();
    for (int64_t d : e.shape) shape.push_back(d);
    header[e.name] = {{"dtype", safetensors_dtype_code(e.dtype)},
                      {"shape", shape},
                      {"data_offsets", {offset, offset + bytes}}};
    relative.push_back(offset);
    offset += bytes;
  }
  std::string text = header.dump();
  // The reference writer pads the header with spaces to 8 bytes so the data stays aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();
  SafetensorsLayout layout;
  layout.header.assign(reinterpret_cast<const char*>(&n), 8);
  layout.header += text;
  for (uint64_t r : relative) layout.data_offset.push_back(layout.header.size() + r);
  layout.file_bytes = layout.header.size() + offset;
  return layout;
}

void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsEntry> entries;
  std::vector<Tensor> data;
  for (const auto& [name, tensor] : tensors) {
    LOOM_CHECK(tensor.defined(), "cannot write ", kWhat, " ", path, ": tensor '", name,
               "' is undefined");
    Tensor t = tensor.detach().to(Device::cpu()).contiguous();
    entries.push_back({name, t.dtype(), t.shape()});
    data.push_back(t);
  }
  // Wider dtypes first, so every tensor starts aligned to its dtype (with no holes, which the
  // reference reader refuses); by name within a width.
  std::vector<size_t> order(entries.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return dtype_size(entries[a].dtype) > dtype_size(entries[b].dtype);
  });
  std::vector<SafetensorsEntry> sorted;
  for (size_t i : order) sorted.push_back(entries[i]);
  for (const SafetensorsEntry& e : sorted)
    LOOM_CHECK(!e.name.empty() && e.name != "__metadata__", "cannot write ", kWhat, " ", path,
               ": '", e.name, "' is not a valid tensor name");
  const SafetensorsLayout layout = safetensors_layout(sorted, metadata);

  detail::OutFile out(path, kWhat);
  out.write(layout.header.data(), layout.header.size());
  for (size_t i : order) out.write(data[i].data_ptr(), data[i].nbytes());
  out.commit();
}

bool looks_like_safetensors(const std::string& path) {
  detail::InFile in(path, kWhat);
  if (in.size() < 9) return false;
  unsigned char head[9];
  in.read_at(0, head, 9);
  uint64_t n = 0;
  std::memcpy(&n, head, 8);
  return n >= 2 && n <= kMaxHeaderBytes && 8 + n <= in.size() && head[8] == '{';
}

}  // namespace loom::io
