// See core/io/token_file.h. The header layout is llm.c's dev/data/data_common.py write_datafile.
#include "core/io/token_file.h"

#include <bit>

#include "core/error.h"
#include "core/io/detail/file.h"

namespace loom::io {

// The file formats are little-endian and read with plain memcpy.
static_assert(std::endian::native == std::endian::little, "core/io assumes a little-endian host");

namespace {

constexpr const char* kWhat = "llm.c token file";
constexpr int32_t kModelFileMagic = 20240326;  // see core/io/llmc_checkpoint.h

}  // namespace

std::vector<int32_t> read_token_file(const std::string& path) {
  detail::InFile in(path, kWhat);
  LOOM_CHECK(in.size() >= uint64_t(kLlmcHeaderBytes), kWhat, " ", path, " is ", in.size(),
             " bytes, shorter than the ", kLlmcHeaderBytes, "-byte header (256 x int32)");
  int32_t header[kLlmcHeaderInts];
  in.read_at(0, header, sizeof(header));
  LOOM_CHECK(
      header[0] == kTokenFileMagic, path, " is not an llm.c token file: magic ", header[0],
      ", expected ", kTokenFileMagic,
      header[0] == kModelFileMagic ? " (it is an llm.c model file: pass it as weights)" : "");
  LOOM_CHECK(header[1] == kTokenFileVersion, kWhat, " ", path, " has version ", header[1],
             ", expected ", kTokenFileVersion);
  int64_t count = header[2];
  LOOM_CHECK(count >= 0, kWhat, " ", path, " has a negative token count ", count, " in its header");
  uint64_t body = in.size() - uint64_t(kLlmcHeaderBytes);
  uint64_t expected = uint64_t(count) * 2;
  LOOM_CHECK(body == expected, kWhat, " ", path,
             body < expected ? " is truncated" : " has trailing bytes", ": the header says ", count,
             " tokens (", expected, " bytes after the header), but the file holds ", body,
             " bytes after the header (", body / 2, " tokens)");

  std::vector<uint16_t> raw(static_cast<size_t>(count));
  in.read_at(uint64_t(kLlmcHeaderBytes), raw.data(), expected);
  return std::vector<int32_t>(raw.begin(), raw.end());
}

void write_token_file(const std::string& path, const std::vector<int32_t>& tokens) {
  LOOM_CHECK(tokens.size() <= size_t(INT32_MAX), "cannot write ", kWhat, " ", path, ": ",
             tokens.size(), " tokens do not fit the header's int32 count");
  std::vector<uint16_t> raw(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    LOOM_CHECK(tokens[i] >= 0 && tokens[i] <= 65535, "cannot write ", kWhat, " ", path, ": token ",
               tokens[i], " at position ", i,
               " does not fit in uint16 (llm.c token files hold ids 0..65535)");
    raw[i] = uint16_t(tokens[i]);
  }
  int32_t header[kLlmcHeaderInts] = {};
  header[0] = kTokenFileMagic;
  header[1] = kTokenFileVersion;
  header[2] = int32_t(tokens.size());
  detail::OutFile out(path, kWhat);
  out.write(header, sizeof(header));
  out.write(raw.data(), raw.size() * 2);
  out.commit();
}

}  // namespace loom::io
