// See core/io/detail/file.h.
#include "core/io/detail/file.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <string>

#include "core/error.h"

namespace loom::io::detail {

InFile::InFile(const std::string& path, const std::string& what) : path_(path), what_(what) {
  file_ = std::fopen(path.c_str(), "rb");
  LOOM_CHECK(file_ != nullptr, "cannot open ", what, " ", path, ": ", std::strerror(errno));
  struct stat st;
  if (::fstat(::fileno(file_), &st) != 0 || !S_ISREG(st.st_mode)) {
    std::fclose(file_);
    file_ = nullptr;
    LOOM_FAIL("cannot read ", what, " ", path, ": not a regular file");
  }
  size_ = uint64_t(st.st_size);
}

InFile::~InFile() {
  if (file_) std::fclose(file_);
}

void InFile::read_at(uint64_t offset, void* dst, uint64_t n) {
  LOOM_ASSERT(offset + n <= size_, "read of ", n, " bytes at ", offset, " past the end of ", path_,
              " (", size_, " bytes)");
  if (n == 0) return;
  LOOM_CHECK(::fseeko(file_, off_t(offset), SEEK_SET) == 0, "cannot seek in ", what_, " ", path_,
             ": ", std::strerror(errno));
  size_t got = std::fread(dst, 1, n, file_);
  LOOM_CHECK(got == n, "cannot read ", what_, " ", path_, ": got ", got, " of ", n,
             " bytes at offset ", offset, std::ferror(file_) ? " (read error)" : " (end of file)");
}

namespace {

std::string host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "host";
  for (char* c = buf; *c; ++c)
    if (*c == '/' || *c == '.') *c = '_';  // one path component, no dots to confuse the parse
  return buf;
}

// "<path>.tmp.<host>.": the temporary files of `path` written on this host; a number follows.
std::string tmp_prefix(const std::string& path) { return path + ".tmp." + host_name() + "."; }

// A process that was killed while writing `path` left its temporary file behind (full size, for
// a checkpoint). Those of this host whose writer is gone are removed; another host's are left
// alone, since its process ids mean nothing here.
void remove_stale_temporaries(const std::string& path) {
  const std::string prefix = tmp_prefix(path);
  const size_t slash = prefix.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : prefix.substr(0, slash);
  const std::string base = slash == std::string::npos ? prefix : prefix.substr(slash + 1);
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() <= base.size() || name.compare(0, base.size(), base) != 0) continue;
    const std::string digits = name.substr(base.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) continue;
    const pid_t pid = pid_t(std::stol(digits));
    if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
    std::remove((dir + "/" + name).c_str());
  }
  ::closedir(d);
}

}  // namespace

OutFile::OutFile(const std::string& path, const std::string& what) : path_(path), what_(what) {
  remove_stale_temporaries(path);
  tmp_path_ = tmp_prefix(path) + std::to_string(::getpid());
  file_ = std::fopen(tmp_path_.c_str(), "wb");
  LOOM_CHECK(file_ != nullptr, "cannot write ", what, " ", path, ": ", std::strerror(errno));
}

OutFile::~OutFile() {
  if (file_) {
    std::fclose(file_);
    std::remove(tmp_path_.c_str());
  }
}

void OutFile::write(const void* src, uint64_t n) {
  LOOM_ASSERT(file_ != nullptr, "write after commit to ", path_);
  if (n == 0) return;
  LOOM_CHECK(std::fwrite(src, 1, n, file_) == n, "cannot write ", what_, " ", path_, ": ",
             std::strerror(errno));
}

void OutFile::commit() {
  LOOM_ASSERT(file_ != nullptr, "commit twice to ", path_);
  std::FILE* f = file_;
  file_ = nullptr;
  bool ok = std::fflush(f) == 0;
  int err = errno;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp_path_.c_str());
    LOOM_FAIL("cannot write ", what_, " ", path_, ": ", std::strerror(err));
  }
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    err = errno;
    std::remove(tmp_path_.c_str());
    LOOM_FAIL("cannot write ", what_, " ", path_, ": rename from ", tmp_path_,
              " failed: ", std::strerror(err));
  }
}

std::string read_all(const std::string& path, const std::string& what) {
  InFile in(path, what);
  std::string bytes(in.size(), '\0');
  in.read_at(0, bytes.data(), bytes.size());
  return bytes;
}

std::string extension_of(const std::string& path) {
  size_t slash = path.find_last_of('/');
  size_t dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return "";
  std::string ext = path.substr(dot);
  for (char& c : ext) c = char(std::tolower(static_cast<unsigned char>(c)));
  return ext;
}

}  // namespace loom::io::detail
