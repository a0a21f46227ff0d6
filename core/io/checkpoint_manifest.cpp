// See core/io/checkpoint_manifest.h. Every number read from the JSON is range-checked before it
// is used: a manifest is input like any other file and may be damaged or foreign.
#include "core/io/checkpoint_manifest.h"

#include "core/error.h"
#include "core/io/detail/json.h"
#include "core/io/safetensors.h"

namespace loom::io {

namespace {

constexpr const char* kFormatTag = "loom-checkpoint";

nlohmann::json shape_json(const Shape& s) {
  nlohmann::json a = nlohmann::json::array();
  for (int64_t d : s) a.push_back(d);
  return a;
}

// The reader's context: the manifest's path, for every message.
struct Reader {
  const std::string& path;

  [[noreturn]] void fail(const std::string& what) const {
    LOOM_FAIL("checkpoint manifest ", path, ": ", what);
  }
  const nlohmann::json& field(const nlohmann::json& obj, const char* key,
                              const std::string& where) const {
    if (!obj.is_object() || !obj.contains(key))
      fail(where + " has no \"" + key + "\" (a damaged or foreign manifest)");
    return obj.at(key);
  }
  int64_t integer(const nlohmann::json& v, const std::string& where, int64_t min = 0) const {
    if (!v.is_number_integer() || v.get<int64_t>() < min)
      fail(where + " must be an integer >= " + std::to_string(min) + ", got " +
           detail::json_excerpt(v));
    return v.get<int64_t>();
  }
  uint64_t count(const nlohmann::json& v, const std::string& where) const {
    if (v.is_number_unsigned()) return v.get<uint64_t>();
    return uint64_t(integer(v, where));
  }
  std::string string(const nlohmann::json& v, const std::string& where) const {
    if (!v.is_string()) fail(where + " must be a string, got " + detail::json_excerpt(v));
    return v.get<std::string>();
  }
  Shape shape(const nlohmann::json& v, const std::string& where) const {
    if (!v.is_array()) fail(where + " must be an array, got " + detail::json_excerpt(v));
    Shape s;
    int64_t numel = 1;
    for (const nlohmann::json& d : v) {
      s.push_back(integer(d, where + " entry"));
      if (s.back() > 0 && __builtin_mul_overflow(numel, s.back(), &numel))
        fail(where + " " + detail::json_excerpt(v) + " is too large");
    }
    return s;
  }
};

// A plain file name inside the checkpoint directory: no directories, nothing hidden.
bool plain_file_name(const std::string& name) {
  return !name.empty() && name[0] != '.' && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos;
}

}  // namespace

Region Region::whole(const Shape& global_shape) {
  return box(Shape(global_shape.size(), 0), global_shape);
}

Region Region::box(Shape offset, Shape shape) {
  Region r;
  r.offset = std::move(offset);
  r.shape = std::move(shape);
  r.begin = 0;
  r.end = shape_numel(r.shape);
  return r;
}

void Region::check_inside(const Shape& global_shape, const std::string& what) const {
  LOOM_CHECK(offset.size() == global_shape.size() && shape.size() == global_shape.size(), what,
             ": region ", str(), " has the wrong rank for a tensor of shape ",
             shape_str(global_shape));
  for (size_t d = 0; d < global_shape.size(); ++d)
    LOOM_CHECK(offset[d] >= 0 && shape[d] >= 0 && offset[d] <= global_shape[d] - shape[d], what,
               ": region ", str(), " reaches outside a tensor of shape ", shape_str(global_shape));
  LOOM_CHECK(begin >= 0 && begin <= end && end <= box_numel(), what, ": region ", str(),
             " has an element range outside its box of ", box_numel(), " elements");
}

std::string Region::str() const {
  std::string s = "[";
  for (size_t d = 0; d < shape.size(); ++d)
    s += loom::detail::str_cat(d ? ", " : "", offset[d], ":", offset[d] + shape[d]);
  s += "]";
  if (begin != 0 || end != box_numel())
    s += loom::detail::str_cat(" elements [", begin, ", ", end, ")");
  return s;
}

std::string CheckpointManifest::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  j["format"] = kFormatTag;
  j["format_version"] = format_version;
  j["step"] = step;
  j["state"] = state;
  nlohmann::json files_json = nlohmann::json::array();
  for (const CheckpointFile& f : files)
    files_json.push_back({{"name", f.name}, {"bytes", f.bytes}, {"rank", f.rank}});
  j["files"] = files_json;
  nlohmann::json tensors_json = nlohmann::json::object();
  for (const auto& [name, t] : tensors) {
    nlohmann::json pieces = nlohmann::json::array();
    for (const StoredPiece& p : t.pieces)
      pieces.push_back({{"file", p.file},
                        {"key", p.key},
                        {"offset", p.offset},
                        {"nbytes", p.nbytes},
                        {"box_offset", shape_json(p.region.offset)},
                        {"box_shape", shape_json(p.region.shape)},
                        {"range", {p.region.begin, p.region.end}},
                        {"chunk_bytes", p.chunk_bytes},
                        {"crc32c", p.crc32c}});
    tensors_json[name] = {{"dtype", safetensors_dtype_code(t.dtype)},
                          {"shape", shape_json(t.shape)},
                          {"pieces", pieces}};
  }
  j["tensors"] = tensors_json;
  return j.dump(1);
}

CheckpointManifest parse_checkpoint_manifest(const std::string& text, const std::string& path) {
  const Reader r{path};
  const nlohmann::json j = detail::parse_json(text, "checkpoint manifest " + path);
  if (!j.is_object()) r.fail("must be a JSON object, got " + std::string(j.type_name()));
  if (!j.contains("format") || j["format"] != kFormatTag)
    r.fail(std::string("is not a loom checkpoint manifest (no \"format\": \"") + kFormatTag +
           "\")");
  CheckpointManifest m;
  m.format_version = int(r.integer(r.field(j, "format_version", "the manifest"), "format_version"));
  if (m.format_version != CheckpointManifest::kFormatVersion)
    r.fail(loom::detail::str_cat("has format version ", m.format_version,
                                 "; this loom reads version ", CheckpointManifest::kFormatVersion));
  m.step = r.integer(r.field(j, "step", "the manifest"), "step");
  m.state = r.field(j, "state", "the manifest");
  if (!m.state.is_object()) r.fail("\"state\" must be an object");

  std::map<std::string, uint64_t> file_bytes;
  const nlohmann::json& files = r.field(j, "files", "the manifest");
  if (!files.is_array()) r.fail("\"files\" must be an array");
  for (const nlohmann::json& f : files) {
    CheckpointFile cf;
    cf.name = r.string(r.field(f, "name", "a file entry"), "a file name");
    if (!plain_file_name(cf.name)) r.fail("file name '" + cf.name + "' is not a plain file name");
    cf.bytes = r.count(r.field(f, "bytes", "file " + cf.name), "file " + cf.name + " bytes");
    cf.rank = int(r.integer(r.field(f, "rank", "file " + cf.name), "file " + cf.name + " rank"));
    if (!file_bytes.emplace(cf.name, cf.bytes).second) r.fail("file " + cf.name + " listed twice");
    m.files.push_back(cf);
  }

  const nlohmann::json& tensors = r.field(j, "tensors", "the manifest");
  if (!tensors.is_object()) r.fail("\"tensors\" must be an object");
  for (const auto& [name, tj] : tensors.items()) {
    const std::string where = "tensor '" + name + "'";
    TensorEntry t;
    t.dtype = dtype_from_safetensors_code(r.string(r.field(tj, "dtype", where), where + " dtype"),
                                          "checkpoint manifest " + path + ": " + where);
    t.shape = r.shape(r.field(tj, "shape", where), where + " shape");
    const nlohmann::json& pieces = r.field(tj, "pieces", where);
    if (!pieces.is_array()) r.fail(where + ": \"pieces\" must be an array");
    int64_t covered = 0;
    for (const nlohmann::json& pj : pieces) {
      StoredPiece p;
      p.file = r.string(r.field(pj, "file", where + " piece"), where + " piece file");
      p.key = r.string(r.field(pj, "key", where + " piece"), where + " piece key");
      const std::string at = where + " piece '" + p.key + "' in " + p.file;
      if (!file_bytes.count(p.file)) r.fail(at + ": the file is not in \"files\"");
      p.offset = r.count(r.field(pj, "offset", at), at + " offset");
      p.nbytes = r.count(r.field(pj, "nbytes", at), at + " nbytes");
      p.region.offset = r.shape(r.field(pj, "box_offset", at), at + " box_offset");
      p.region.shape = r.shape(r.field(pj, "box_shape", at), at + " box_shape");
      const nlohmann::json& range = r.field(pj, "range", at);
      if (!range.is_array() || range.size() != 2) r.fail(at + ": range must be [begin, end]");
      p.region.begin = r.integer(range[0], at + " range begin");
      p.region.end = r.integer(range[1], at + " range end");
      p.region.check_inside(t.shape, "checkpoint manifest " + path + ": " + at);
      if (p.nbytes != uint64_t(p.region.numel()) * dtype_size(t.dtype))
        r.fail(loom::detail::str_cat(at, ": ", p.nbytes, " bytes, but region ", p.region.str(),
                                     " of ", dtype_name(t.dtype), " needs ",
                                     uint64_t(p.region.numel()) * dtype_size(t.dtype)));
      if (p.offset > file_bytes[p.file] || p.nbytes > file_bytes[p.file] - p.offset)
        r.fail(loom::detail::str_cat(at, ": bytes [", p.offset, ", ", p.offset + p.nbytes,
                                     ") lie past the end of the file's ", file_bytes[p.file],
                                     " bytes"));
      p.chunk_bytes = r.count(r.field(pj, "chunk_bytes", at), at + " chunk_bytes");
      if (p.chunk_bytes == 0) r.fail(at + ": chunk_bytes must be positive");
      const nlohmann::json& crcs = r.field(pj, "crc32c", at);
      if (!crcs.is_array()) r.fail(at + ": crc32c must be an array");
      for (const nlohmann::json& c : crcs) {
        const uint64_t v = r.count(c, at + " crc32c entry");
        if (v > 0xffffffffu)
          r.fail(at + ": crc32c entry " + detail::json_excerpt(c) + " is not 32-bit");
        p.crc32c.push_back(uint32_t(v));
      }
      const uint64_t chunks = (p.nbytes + p.chunk_bytes - 1) / p.chunk_bytes;
      if (p.crc32c.size() != chunks)
        r.fail(
            loom::detail::str_cat(at, ": ", p.crc32c.size(), " checksums for ", chunks, " chunks"));
      covered += p.region.numel();
      t.pieces.push_back(std::move(p));
    }
    if (covered != shape_numel(t.shape))
      r.fail(loom::detail::str_cat(where, " of shape ", shape_str(t.shape), ": its pieces hold ",
                                   covered, " of its ", shape_numel(t.shape),
                                   " elements (every element must be stored exactly once)"));
    m.tensors.emplace(name, std::move(t));
  }
  return m;
}

}  // namespace loom::io
