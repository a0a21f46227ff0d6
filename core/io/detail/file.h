// Binary file access shared by the readers and writers in core/io. Every failure is a
// loom::Error that names the file and what was being done, so a caller never has to check a
// return code. Writers go to a temporary file beside the target and rename it on commit(), so an
// interrupted save never leaves a half-written checkpoint under the final name.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace loom::io::detail {

// A file opened for reading. `what` names the kind of file in errors ("llm.c token file").
class InFile {
 public:
  InFile(const std::string& path, const std::string& what);
  ~InFile();
  InFile(const InFile&) = delete;
  InFile& operator=(const InFile&) = delete;

  const std::string& path() const { return path_; }
  const std::string& what() const { return what_; }
  uint64_t size() const { return size_; }
  // Reads exactly n bytes at `offset`; the caller has checked that they lie inside the file.
  void read_at(uint64_t offset, void* dst, uint64_t n);

 private:
  std::FILE* file_ = nullptr;
  std::string path_;
  std::string what_;
  uint64_t size_ = 0;
};

// A file written through a temporary name (`path`.tmp.<host>.<pid>), renamed to `path` by
// commit(). Dropping an uncommitted OutFile removes the temporary file; opening one removes those
// of `path` that writers on this host killed before they could.
class OutFile {
 public:
  OutFile(const std::string& path, const std::string& what);
  ~OutFile();
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;

  void write(const void* src, uint64_t n);
  void commit();

 private:
  std::FILE* file_ = nullptr;
  std::string path_;
  std::string tmp_path_;
  std::string what_;
};

// Reads a whole (small) file into a string; used for text data.
std::string read_all(const std::string& path, const std::string& what);

// The lowercase extension of a path including the dot (".bin"), or "" when there is none.
std::string extension_of(const std::string& path);

}  // namespace loom::io::detail
