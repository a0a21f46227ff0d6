// See parallel/checkpoint/durable.h.
#include "parallel/checkpoint/durable.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <mutex>
#include <thread>
#include <utility>

#include "core/error.h"

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif
#if defined(__SSE4_2__) && defined(__AVX512F__) && defined(__VPCLMULQDQ__)
#define LOOM_CRC32C_FOLD 1
#include <immintrin.h>
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

#if defined(__SSE4_2__)
namespace {

// Note [Three-way crc32c]
// The crc32 instruction takes three cycles but starts one every cycle, so a single running
// checksum uses a third of it. Three checksums over three consecutive blocks of L bytes run side
// by side and are then combined: appending L bytes to a message maps its crc register r (before
// the final inversion) to shift_L(r) xor the crc of those bytes from a zero register, and shift_L,
// multiplication by x^(8L) modulo the polynomial, is linear on 32 bits. So
//   crc(A B C) = shift_L(shift_L(crc(A)) ^ crc0(B)) ^ crc0(C),
// each shift four table lookups (a table per byte of r, built once from the 32 images of single
// bits, which the instruction itself computes by running over L zero bytes).

// The register after n (a multiple of 8) bytes, one stream.
inline uint64_t crc_words(uint64_t c, const unsigned char* p, size_t n) {
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
  }
  return c;
}

struct Shift {
  std::array<std::array<uint32_t, 256>, 4> table{};

  explicit Shift(size_t bytes) {
    std::array<uint32_t, 32> bit{};  // the images of single bits
    for (int k = 0; k < 32; ++k) {
      uint64_t c = uint64_t(1) << k;
      for (size_t i = 0; i < bytes; i += 8) c = _mm_crc32_u64(c, 0);
      bit[size_t(k)] = uint32_t(c);
    }
    for (size_t t = 0; t < 4; ++t)
      for (uint32_t b = 0; b < 256; ++b) {
        uint32_t r = 0;
        for (int k = 0; k < 8; ++k)
          if (b >> k & 1) r ^= bit[t * 8 + size_t(k)];
        table[t][b] = r;
      }
  }
  uint32_t operator()(uint32_t r) const {
    return table[0][r & 0xff] ^ table[1][(r >> 8) & 0xff] ^ table[2][(r >> 16) & 0xff] ^
           table[3][r >> 24];
  }
};

// Three streams over blocks of `block` bytes (a multiple of 8) while 3 x block remain.
inline uint32_t crc_three_way(uint32_t c, const unsigned char*& p, size_t& n, size_t block,
                              const Shift& shift) {
  for (; n >= 3 * block; n -= 3 * block, p += 3 * block) {
    uint64_t a = c, b = 0, d = 0;
    for (size_t i = 0; i < block; i += 8) {
      uint64_t va, vb, vd;
      std::memcpy(&va, p + i, 8);
      std::memcpy(&vb, p + block + i, 8);
      std::memcpy(&vd, p + 2 * block + i, 8);
      a = _mm_crc32_u64(a, va);
      b = _mm_crc32_u64(b, vb);
      d = _mm_crc32_u64(d, vd);
    }
    c = shift(shift(uint32_t(a)) ^ uint32_t(b)) ^ uint32_t(d);
  }
  return c;
}

#if LOOM_CRC32C_FOLD
// Note [Folded crc32c]
// Where the CPU has VPCLMULQDQ (AVX-512 carry-less multiplies, 64 bytes a time), the bulk of a
// buffer is folded instead: four 64-byte accumulators, each 128-bit lane holding the polynomial of
// 16 message bytes. Moving a lane 256 bytes on multiplies it by x^2048, and modulo the CRC
// polynomial P that is two carry-less products of its 64-bit halves with x^(2048+64) mod P and
// x^2048 mod P (each under 32 bits), XORed into the data 256 bytes later. Only the residue mod P
// matters to a CRC, so after the last fold the 256 accumulator bytes stand for everything before
// them, and the crc32 instruction finishes from a zero register (a running register is XORed into
// the first four bytes, which is what the instruction does with it). The bytes are reflected (bit
// 0 of byte 0 is the highest power), which makes a product come out one power short: hence the
// constants' exponents are one less, x^(2048+63) and x^2047. They are computed here from P
// (kFoldHigh, kFoldLow) rather than copied.

// x^k mod P, P = the CRC-32C polynomial, as a 32-bit polynomial (bit d: the coefficient of x^d).
uint32_t x_pow_mod(int k) {
  constexpr uint64_t kP = 0x11EDC6F41ull;  // x^32 + ... + 1, unreflected
  uint64_t r = 1;
  for (int i = 0; i < k; ++i) {
    r <<= 1;
    if (r >> 32 & 1) r ^= kP;
  }
  return uint32_t(r);
}

// A polynomial of degree < 64 in the reflected lane layout: the coefficient of x^d at bit 63 - d.
uint64_t reflected64(uint32_t poly) {
  uint64_t out = 0;
  for (int d = 0; d < 32; ++d)
    if (poly >> d & 1) out |= uint64_t(1) << (63 - d);
  return out;
}

// Folds the buffer while at least 512 bytes remain and returns the register after everything it
// consumed (a multiple of 256 bytes); p and n advance past it. With kCopy, every 64 bytes it loads
// are also stored to d, which advances with p: the copy costs stores only (crc32c_copy).
template <bool kCopy>
uint32_t crc_fold(uint32_t c, const unsigned char*& p, size_t& n, unsigned char*& d) {
  if (n < 512) return c;
  static const __m512i k = [] {
    const uint64_t high = reflected64(x_pow_mod(2048 + 63)), low = reflected64(x_pow_mod(2047));
    return _mm512_set_epi64(int64_t(low), int64_t(high), int64_t(low), int64_t(high), int64_t(low),
                            int64_t(high), int64_t(low), int64_t(high));
  }();
  auto load = [&](size_t at) {
    const __m512i v = _mm512_loadu_si512(p + at);
    if constexpr (kCopy) _mm512_storeu_si512(d + at, v);
    return v;
  };
  __m512i x0 = load(0), x1 = load(64), x2 = load(128), x3 = load(192);
  x0 = _mm512_xor_si512(x0, _mm512_zextsi128_si512(_mm_cvtsi32_si128(int(c))));
  auto advance = [&] {
    p += 256;
    n -= 256;
    if constexpr (kCopy) d += 256;
  };
  advance();
  auto fold = [&](__m512i x, size_t at) {
    const __m512i hi = _mm512_clmulepi64_epi128(x, k, 0x00);   // low qword: x^127..x^64
    const __m512i lo = _mm512_clmulepi64_epi128(x, k, 0x11);   // high qword: x^63..x^0
    return _mm512_ternarylogic_epi64(hi, lo, load(at), 0x96);  // a ^ b ^ c
  };
  for (; n >= 256; advance()) {
    x0 = fold(x0, 0);
    x1 = fold(x1, 64);
    x2 = fold(x2, 128);
    x3 = fold(x3, 192);
  }
  alignas(64) unsigned char rest[256];
  _mm512_store_si512(rest, x0);
  _mm512_store_si512(rest + 64, x1);
  _mm512_store_si512(rest + 128, x2);
  _mm512_store_si512(rest + 192, x3);
  return uint32_t(crc_words(0, rest, sizeof rest));
}
#endif

}  // namespace
#endif

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
#if defined(__SSE4_2__)
  // See Note [Three-way crc32c]: long blocks for the bulk, short ones for what remains.
  constexpr size_t kLong = 8192, kShort = 512;
  static const Shift long_shift(kLong), short_shift(kShort);
#if LOOM_CRC32C_FOLD
  unsigned char* no_copy = nullptr;
  c = crc_fold<false>(c, p, n, no_copy);  // Note [Folded crc32c]
#endif
  c = crc_three_way(c, p, n, kLong, long_shift);
  c = crc_three_way(c, p, n, kShort, short_shift);
  c = uint32_t(crc_words(c, p, n & ~size_t(7)));
  p += n & ~size_t(7);
  n &= 7;
  for (; n > 0; --n, ++p) c = _mm_crc32_u8(c, *p);
#else
  static const std::array<uint32_t, 256> table = crc_table();
  for (; n > 0; --n, ++p) c = table[(c ^ *p) & 0xff] ^ (c >> 8);
#endif
  return ~c;
}

uint32_t crc32c_copy(void* dst, const void* src, size_t n, uint32_t crc) {
#if LOOM_CRC32C_FOLD
  // Measured on the development VM (Zen 5, 1 MiB blocks from an L2-resident buffer into fresh
  // memory): 9.7-10.8 GB/s on one thread against 8.0-9.1 for crc32c and then memcpy.
  const auto* p = static_cast<const unsigned char*>(src);
  auto* d = static_cast<unsigned char*>(dst);
  const uint32_t c = crc_fold<true>(~crc, p, n, d);  // Note [Folded crc32c]
  std::memcpy(d, p, n);
  return crc32c(p, n, ~c);  // the rest (under 512 bytes), from the register the fold left
#else
  std::memcpy(dst, src, n);
  return crc32c(src, n, crc);
#endif
}

// Note [Direct data writes]
// A checkpoint's data files are written with O_DIRECT: from an aligned staging buffer straight to
// the device, around the page cache. Through the page cache, a save first copies every byte into
// freshly allocated cache pages, then fsync waits for their writeback. On the development VM
// (virtio disk) GPT-2 124M's 1.5 GB training state took 3.2-5.0 s that way and 1.2-1.4 s with
// O_DIRECT, fsync included, against 1.7-4.1 s for torch.save + fsync of the same state
// (benchmarks/README.md). It also leaves the page cache to the training job instead of filling it
// with a file that is read back only after a restart.
// The rules O_DIRECT imposes: the buffer, the file offset and the length of every write aligned
// to the device's logical block. kDirectAlign = 4096 covers 512-byte and 4 KiB sectors; the bytes
// gather in a kDirectBlock staging block, written whenever it is full (by a thread of its own:
// Note [Writing while staging]); commit() writes the last, partial block padded with zeros to the
// alignment and truncates the file back to its length.
// Fallbacks, each silent because the file comes out the same: a file system that refuses O_DIRECT
// at open (tmpfs: EINVAL) gets a buffered file; one that refuses an aligned write (a larger
// sector size) gets O_DIRECT turned off on the open file (fcntl) and the write retried buffered.
constexpr size_t kDirectAlign = 4096;
constexpr size_t kDirectBlock = size_t(8) << 20;

// Note [Writing while staging]
// A synchronous O_DIRECT pwrite() returns when the device has the bytes, and until then the
// thread that fills the staging block waits; the device waits in turn while the next block is
// checksummed and copied. So a full block goes to a writer thread (a BlockWriter, one per data
// file) and the caller fills a second block while the first is written: the copy and the
// checksums come off the save's critical path. On the development VM (virtio disk) a 1.5 GB save,
// fsync included, took a median 3.15 s this way (10 runs, 2.9-4.0 s) against 3.95 s with the
// caller writing (4 runs, 2.9-4.3 s), runs of each taken in turn: the disk's speed moves that much
// from minute to minute. A second writer thread, three blocks and two writes in flight, measured
// no faster (median 3.12 s over 9 runs, 2.3-4.1 s) and was not kept. Staging memory per file: two
// kDirectBlock blocks. A write error is kept by the thread and rethrown in the caller by its next
// full block or by commit(); the file is then dropped as before, its temporary removed.
//
// A filled block is queued at once, and the caller then waits for a free block to fill: so when a
// write ends, the thread finds the next block already queued. (It first waited for the write
// under way and queued the block after it: each block then sat filled until the caller's thread
// woke, and the writer idled 0.2-0.5 s of a 1.5 GB save on the Zen 4 VM, 1-3 ms per block; now
// about 0.01 s. benchmarks/README.md, "A checkpoint's blocks queued as they fill".)
class DurableFile::BlockWriter {
 public:
  explicit BlockWriter(DurableFile& file) : file_(file) {
    for (char*& b : blocks_) {
      b = static_cast<char*>(std::aligned_alloc(kDirectAlign, kDirectBlock));
      if (b == nullptr) {
        free_blocks();
        LOOM_FAIL("cannot allocate the ", kDirectBlock, "-byte staging blocks of ", file.path_);
      }
    }
    try {
      thread_ = std::thread([this] { run(); });
    } catch (...) {
      free_blocks();
      throw;
    }
  }

  // Stops the thread after the write under way; blocks still queued are dropped.
  ~BlockWriter() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    changed_.notify_all();
    thread_.join();
    free_blocks();
  }

  // The block being filled: kDirectBlock bytes, aligned.
  char* block() const { return blocks_[filling_]; }

  // Queues the filled block's first n bytes (a multiple of kDirectAlign) for the thread, to be
  // written at the file's next offset, and returns when the next block is free to fill (written,
  // or never used); rethrows a write error.
  void submit(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    if (error_ != nullptr) std::rethrow_exception(error_);
    queue_.push_back({blocks_[filling_], n, offset_});
    ++unwritten_;
    offset_ += n;
    filling_ = (filling_ + 1) % blocks_.size();
    changed_.notify_all();
    // The blocks are filled and written in turn, so the next one is free once fewer than all
    // of them wait for their write.
    wait_until(lock, [&] { return unwritten_ < blocks_.size(); });
  }

  // Waits until every queued block is in the file; rethrows a write error.
  void finish() {
    std::unique_lock<std::mutex> lock(mu_);
    wait_until(lock, [&] { return unwritten_ == 0; });
  }

 private:
  template <typename Done>
  void wait_until(std::unique_lock<std::mutex>& lock, Done done) {
    changed_.wait(lock, [&] { return done() || error_ != nullptr; });
    if (error_ != nullptr) std::rethrow_exception(error_);
  }

  struct Job {
    const char* block = nullptr;
    size_t n = 0;
    uint64_t offset = 0;
  };

  // Writes the queued blocks in order, each counted off unwritten_ when it is in the file.
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      changed_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      const Job job = queue_.front();
      queue_.pop_front();
      lock.unlock();
      std::exception_ptr error;
      try {
        file_.pwrite_all(job.block, job.n, job.offset);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      error_ = error;
      --unwritten_;
      changed_.notify_all();
      if (error_ != nullptr) return;  // the file will be dropped
    }
  }

  void free_blocks() {
    for (char*& b : blocks_) std::free(std::exchange(b, nullptr));
  }

  DurableFile& file_;
  std::array<char*, 2> blocks_{};
  size_t filling_ = 0;   // the caller's: which block it fills
  uint64_t offset_ = 0;  // the caller's: bytes queued so far
  std::mutex mu_;
  std::condition_variable changed_;  // a block queued or written, or stop
  std::deque<Job> queue_;            // filled blocks the thread has not begun to write
  size_t unwritten_ = 0;             // queued or being written
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;
};

DurableFile::DurableFile(const std::string& path, WriteMode mode)
    : path_(path), tmp_path_(path + ".tmp." + std::to_string(::getpid())) {
  const int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
  if (mode == WriteMode::kDirect) {
    fd_ = ::open(tmp_path_.c_str(), flags | O_DIRECT, 0644);
    direct_ = fd_ >= 0;
    if (direct_) {
      try {
        writer_ = std::make_unique<BlockWriter>(*this);
      } catch (...) {
        ::close(fd_);
        ::unlink(tmp_path_.c_str());
        throw;
      }
    }
  }
  if (fd_ < 0) fd_ = ::open(tmp_path_.c_str(), flags, 0644);
  LOOM_CHECK(fd_ >= 0, "cannot create ", tmp_path_, ": ", std::strerror(errno));
}

DurableFile::~DurableFile() {
  writer_.reset();  // its thread uses fd_
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
  }
}

void DurableFile::fail_write(int err, const char* what, uint64_t so_far) const {
  LOOM_FAIL("cannot write ", path_, " (", so_far, " bytes written so far): ", what,
            err == ENOSPC ? " (the disk is full)" : "");
}

// Called by the writer's thread in kDirect mode.
void DurableFile::pwrite_all(const char* p, size_t n, uint64_t offset) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd_, p, n, off_t(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EINVAL && direct_) {
      // An alignment this file system does not take: the rest goes through the page cache.
      const int fl = ::fcntl(fd_, F_GETFL);
      if (fl < 0 || ::fcntl(fd_, F_SETFL, fl & ~O_DIRECT) != 0) fail_write(errno, "fcntl", offset);
      direct_ = false;
      continue;
    }
    if (w <= 0)
      fail_write(errno, w < 0 ? std::strerror(errno) : "the write made no progress", offset);
    p += w;
    n -= size_t(w);
    offset += uint64_t(w);
  }
}

void DurableFile::stage(const char* p, size_t n, uint32_t* crc) {
  while (n > 0) {
    const size_t take = std::min(n, kDirectBlock - staged_);
    if (crc != nullptr)
      *crc = crc32c_copy(writer_->block() + staged_, p, take, *crc);
    else
      std::memcpy(writer_->block() + staged_, p, take);
    staged_ += take;
    p += take;
    n -= take;
    if (staged_ == kDirectBlock) {
      writer_->submit(kDirectBlock);
      staged_ = 0;
    }
  }
}

void DurableFile::write(const void* data, size_t n) {
  LOOM_ASSERT(fd_ >= 0, "write after commit to ", path_);
  const auto* p = static_cast<const char*>(data);
  if (writer_ != nullptr) {
    stage(p, n);
    written_ += n;
    return;
  }
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t(1) << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      fail_write(errno, w < 0 ? std::strerror(errno) : "the write made no progress", written_);
    p += w;
    n -= size_t(w);
    written_ += uint64_t(w);
  }
}

uint32_t DurableFile::write_checksummed(const void* data, size_t n, uint32_t crc) {
  LOOM_ASSERT(fd_ >= 0, "write after commit to ", path_);
  if (writer_ == nullptr) {
    crc = crc32c(data, n, crc);
    write(data, n);
    return crc;
  }
  stage(static_cast<const char*>(data), n, &crc);
  written_ += n;
  return crc;
}

void DurableFile::commit() {
  LOOM_ASSERT(fd_ >= 0, "commit twice to ", path_);
  if (writer_ != nullptr) {
    // The last block, padded to the alignment with zeros, then the file cut back to its length.
    const size_t padded = (staged_ + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
    if (padded > 0) {
      std::memset(writer_->block() + staged_, 0, padded - staged_);
      writer_->submit(padded);
      staged_ = 0;
    }
    writer_->finish();
    writer_.reset();
    if (padded > 0 && ::ftruncate(fd_, off_t(written_)) != 0)
      fail_write(errno, std::strerror(errno), written_);
  }
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
