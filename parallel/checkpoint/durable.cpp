// See parallel/checkpoint/durable.h.
#include "parallel/checkpoint/durable.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

namespace loom::parallel::checkpoint {

namespace {

#if !defined(__SSE4_2__)
constexpr uint32_t kCastagnoli = 0x82F63B78u;  // the reflected polynomial

std::array<uint32_t, 256> crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kCastagnoli : c >> 1;
    t[i] = c;
  }
  return t;
}
#endif

std::string parent_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
#if defined(__SSE4_2__)
  uint64_t c64 = c;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = _mm_crc32_u64(c64, v);
  }
  c = uint32_t(c64);
  for (; n > 0; --n, ++p) c = _mm_crc32_u8(c, *p);
#else
  static const std::array<uint32_t, 256> table = crc_table();
  for (; n > 0; --n, ++p) c = table[(c ^ *p) & 0xff] ^ (c >> 8);
#endif
  return ~c;
}

DurableFile::DurableFile(const std::string& path)
    : path_(path), tmp_path_(path + ".tmp." + std::to_string(::getpid())) {
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  LOOM_CHECK(fd_ >= 0, "cannot create ", tmp_path_, ": ", std::strerror(errno));
}

DurableFile::~DurableFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
  }
}

void DurableFile::write(const void* data, size_t n) {
  LOOM_ASSERT(fd_ >= 0, "write after commit to ", path_);
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t(1) << 30));
    if (w < 0 && errno == EINTR) continue;
    LOOM_CHECK(w > 0, "cannot write ", path_, " (", written_, " bytes written so far): ",
               w < 0 ? std::strerror(errno) : "the write made no progress",
               errno == ENOSPC ? " (the disk is full)" : "");
    p += w;
    n -= size_t(w);
    written_ += uint64_t(w);
  }
}

void DurableFile::commit() {
  LOOM_ASSERT(fd_ >= 0, "commit twice to ", path_);
  const int fd = fd_;
  fd_ = -1;
  int err = ::fsync(fd) == 0 ? 0 : errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && std::rename(tmp_path_.c_str(), path_.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmp_path_.c_str());
    LOOM_FAIL("cannot write ", path_, ": ", std::strerror(err),
              err == ENOSPC ? " (the disk is full)" : "");
  }
  fsync_directory(parent_of(path_));
}

void write_file_durably(const std::string& path, const std::string& text) {
  DurableFile f(path);
  f.write(text.data(), text.size());
  f.commit();
}

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  LOOM_CHECK(fd >= 0, "cannot open directory ", dir, " to sync it: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  LOOM_CHECK(rc == 0, "cannot sync directory ", dir, ": ", std::strerror(err));
}

void make_directories(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  LOOM_CHECK(!ec, "cannot create directory ", dir, ": ", ec.message());
  LOOM_CHECK(std::filesystem::is_directory(dir, ec), "cannot use ", dir,
             " as a checkpoint directory: it is not a directory");
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  LOOM_CHECK(!ec, "cannot remove ", path, ": ", ec.message());
}

bool path_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::vector<std::string> list_directory(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  LOOM_CHECK(d != nullptr, "cannot read directory ", dir, ": ", std::strerror(errno));
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace loom::parallel::checkpoint
