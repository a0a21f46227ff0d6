// The commit protocol's building blocks: files that reach the disk before they get their final
// name, checksums computed as the bytes go by, and directory operations that fail loudly.
//
// Note [Durable commit]
// A checkpoint is committed in this order, and a reader trusts nothing that the order has not
// finished: (1) every rank writes its data file into the staging directory step-N.tmp under a
// temporary name, fsyncs it and renames it; (2) the manifest, naming every file with its size and
// checksums, is written the same way, and the staging directory is renamed to step-N and its
// parent fsynced: from here on the checkpoint exists; (3) the `latest` pointer is replaced the
// same way. A crash before (2) leaves step-N.tmp, which is never loaded and is removed by the
// next save; a crash before (3) leaves `latest` at the previous checkpoint, which is still whole
// (and loaders that find `latest` dangling take the newest committed step). Older checkpoints
// are deleted only after (3).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace loom::parallel::checkpoint {

// CRC-32C (Castagnoli), as iSCSI, ext4 and most storage systems use it: crc32c("123456789") is
// 0xE3069283. Continue a running checksum by passing the previous value. Uses the SSE4.2
// instruction, three streams at once, when the build targets it.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// The same checksum of `src`'s n bytes, which it copies to `dst` (not overlapping it) on the way:
// one pass over `src` where the build folds with VPCLMULQDQ (Note [Folded crc32c]), else the
// checksum and then memcpy.
uint32_t crc32c_copy(void* dst, const void* src, size_t n, uint32_t crc = 0);

// How a DurableFile's bytes reach the disk: through the page cache (small files: manifests,
// pointers) or around it (checkpoint data files; Note [Direct data writes] in durable.cpp).
enum class WriteMode { kBuffered, kDirect };

// A file written under `path`.tmp.<pid> and renamed to `path` by commit() after an fsync (and an
// fsync of its directory). Dropping an uncommitted file removes the temporary. Errors name the
// file and the system's reason (a full disk says so). In kDirect mode the bytes go through an
// aligned staging buffer with O_DIRECT where the file system allows it, and through the page
// cache where it does not (tmpfs refuses O_DIRECT): the file's contents are the same either way.
// A background thread writes the staged blocks while the caller fills the next one (Note [Writing
// while staging]); a write error surfaces in a later write() or in commit().
class DurableFile {
 public:
  explicit DurableFile(const std::string& path, WriteMode mode = WriteMode::kBuffered);
  ~DurableFile();
  DurableFile(const DurableFile&) = delete;
  DurableFile& operator=(const DurableFile&) = delete;

  void write(const void* data, size_t n);
  // write(), returning crc32c of the bytes continued from `crc`. Where the bytes are staged
  // (kDirect) it is computed as they are copied in: one pass over `data` (crc32c_copy).
  uint32_t write_checksummed(const void* data, size_t n, uint32_t crc = 0);
  uint64_t written() const { return written_; }
  void commit();
  // Whether the writes so far went around the page cache (false in kBuffered mode, and after a
  // fallback).
  bool direct() const { return direct_; }

 private:
  class BlockWriter;  // Note [Writing while staging], in durable.cpp

  // Copies into the writer's blocks; with `crc`, checksums the bytes on the way.
  void stage(const char* p, size_t n, uint32_t* crc = nullptr);
  void pwrite_all(const char* p, size_t n, uint64_t offset);
  [[noreturn]] void fail_write(int err, const char* what, uint64_t so_far) const;

  std::string path_, tmp_path_;
  int fd_ = -1;
  uint64_t written_ = 0;
  // kDirect: bytes wait in the writer's current block (kDirectBlock, aligned) until it is full.
  // Set by the writer's thread when an aligned write is refused, hence atomic.
  std::atomic<bool> direct_{false};
  std::unique_ptr<BlockWriter> writer_;
  size_t staged_ = 0;
};

// `text` into `path` through a DurableFile.
void write_file_durably(const std::string& path, const std::string& text);
// Makes a directory entry change (a rename, a new file) durable.
void fsync_directory(const std::string& dir);
// Creates `dir` and its parents when missing; throws naming it when that fails.
void make_directories(const std::string& dir);
// Removes `path` and everything under it; a missing path is not an error.
void remove_tree(const std::string& path);
bool path_exists(const std::string& path);
// The entries of a directory (names only, sorted); throws naming it when it cannot be read.
std::vector<std::string> list_directory(const std::string& dir);

}  // namespace loom::parallel::checkpoint
