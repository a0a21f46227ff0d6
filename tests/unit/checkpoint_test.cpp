// Distributed checkpoints in one process (the `self` communicator). The building blocks against
// references that share no code with them (a bit-by-bit crc32c, regions enumerated element by
// element, tensor-parallel shards cut by ShardSpec::slice_of); then save and load round trips that
// reshard between layouts, the commit protocol, and damaged checkpoints and bad input turned into
// clear errors. Values are compared bit for bit: a checkpoint gives back exactly what it was given.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "collectives/communicator.h"
#include "core/io/checkpoint_manifest.h"
#include "core/nn/init.h"
#include "parallel/checkpoint/checkpoint.h"
#include "parallel/checkpoint/durable.h"
#include "parallel/checkpoint/region.h"
#include "testing/files.h"

namespace loom::parallel::checkpoint {
namespace {

namespace fs = std::filesystem;
using io::Region;
using loom::testing::expect_error;
using loom::testing::read_bytes;
using loom::testing::write_bytes;

// Small checksum chunks, so that every tensor below spans several and partial reads happen.
constexpr uint64_t kChunkBytes = 64;

comm::Communicator& self_comm() {
  static const std::shared_ptr<comm::Communicator> world = comm::world();
  return *world;
}

int64_t pick(std::mt19937& rng, int64_t lo, int64_t hi) {  // uniform in [lo, hi]
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// ---------------------------------------------------------------- brute-force references

// CRC-32C bit by bit, straight from the reflected polynomial: shares nothing with the table or the
// SSE4.2 instruction crc32c() uses.
uint32_t crc32c_bitwise(const std::string& bytes) {
  uint32_t c = 0xffffffffu;
  for (unsigned char b : bytes) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}

// The global flat index of each element of a region, in the region's order: unravel the element's
// index over the box, add the box's origin, ravel over the global shape.
std::vector<int64_t> global_indices(const Shape& global_shape, const Region& r) {
  std::vector<int64_t> out;
  for (int64_t i = r.begin; i < r.end; ++i) {
    int64_t rest = i, flat = 0, stride = 1;
    for (size_t k = global_shape.size(); k-- > 0;) {
      flat += (r.offset[k] + rest % r.shape[k]) * stride;
      rest /= r.shape[k];
      stride *= global_shape[k];
    }
    out.push_back(flat);
  }
  return out;
}

// The global indices a placement's local elements stand for, in local order.
std::vector<int64_t> global_indices(const Placement& p) {
  std::vector<int64_t> out;
  for (const Placement::Part& part : p.parts) {
    EXPECT_EQ(part.local_offset, int64_t(out.size())) << "parts must tile the local tensor";
    for (int64_t g : global_indices(p.global_shape, part.region)) out.push_back(g);
  }
  return out;
}

std::string bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.nbytes());
}

// The elements of `full` that region r holds, as a new 1-D tensor: what a layout hands to save.
Tensor gather(const Tensor& full, const Region& r) {
  const std::string src = bytes_of(full);
  const size_t es = dtype_size(full.dtype());
  Tensor out = Tensor::empty({r.numel()}, full.dtype());
  const std::vector<int64_t> idx = global_indices(full.shape(), r);
  for (size_t k = 0; k < idx.size(); ++k)
    std::memcpy(static_cast<char*>(out.data_ptr()) + k * es, src.data() + size_t(idx[k]) * es, es);
  return out;
}

// ---------------------------------------------------------------- crc32c

TEST(Crc32cTest, StandardCheckValue) {
  const std::string s = "123456789";
  EXPECT_EQ(crc32c(s.data(), s.size()), 0xE3069283u);
  EXPECT_EQ(crc32c_bitwise(s), 0xE3069283u);  // the reference itself is right
}

TEST(Crc32cTest, RunningChecksumOverPartsEqualsTheWhole) {
  std::mt19937 rng(1);
  std::string data(1000, '\0');
  for (char& c : data) c = char(rng());
  const uint32_t whole = crc32c(data.data(), data.size());
  EXPECT_EQ(whole, crc32c_bitwise(data));
  // Split points around the 8-byte steps of the vector loop and at both ends.
  for (size_t split : {size_t(0), size_t(1), size_t(3), size_t(8), size_t(13), size_t(500),
                       size_t(999), size_t(1000)}) {
    const uint32_t first = crc32c(data.data(), split);
    EXPECT_EQ(first, crc32c_bitwise(data.substr(0, split))) << "split " << split;
    EXPECT_EQ(crc32c(data.data() + split, data.size() - split, first), whole) << "split " << split;
  }
}

// Lengths around the three-stream blocks (Note [Three-way crc32c]: 3 x 8192 and 3 x 512 bytes)
// and their combinations, each against the bit-by-bit reference, from a zero and a running start.
TEST(Crc32cTest, ThreeStreamLengthsEqualTheReference) {
  std::mt19937 rng(2);
  std::string data(3 * 3 * 8192 + 3 * 512 + 64, '\0');
  for (char& c : data) c = char(rng());
  const uint32_t running = crc32c_bitwise("prefix");
  for (size_t n :
       {size_t(1535), size_t(1536), size_t(1537), size_t(1536 + 7), size_t(3071), size_t(24575),
        size_t(24576), size_t(24576 + 1536 + 5), size_t(2 * 24576), data.size() - 3}) {
    const std::string part = data.substr(0, n);
    EXPECT_EQ(crc32c(part.data(), n), crc32c_bitwise(part)) << n << " bytes";
    EXPECT_EQ(crc32c(part.data(), n, running), crc32c_bitwise("prefix" + part)) << n << " bytes";
    // An unaligned start, as a chunk inside a file buffer may have.
    const std::string shifted = data.substr(3, n);
    EXPECT_EQ(crc32c(data.data() + 3, n), crc32c_bitwise(shifted)) << n << " bytes at offset 3";
  }
}

// Lengths around the folded path's steps (Note [Folded crc32c]: at least 512 bytes, then 256 a
// time, the rest by the three streams), at every start alignment mod 64, from a zero and a running
// start. On a CPU without VPCLMULQDQ these exercise the three streams again.
TEST(Crc32cTest, FoldedLengthsEqualTheReference) {
  std::mt19937 rng(3);
  std::string data(70000, '\0');
  for (char& c : data) c = char(rng());
  const uint32_t running = crc32c_bitwise("prefix");
  for (size_t n : {size_t(511), size_t(512), size_t(513), size_t(767), size_t(768), size_t(1000),
                   size_t(4096), size_t(4096 + 255), size_t(65536 + 17)})
    for (size_t offset = 0; offset < 64; offset += 7) {
      const std::string part = data.substr(offset, n);
      EXPECT_EQ(crc32c(data.data() + offset, n), crc32c_bitwise(part)) << n << " at " << offset;
      EXPECT_EQ(crc32c(data.data() + offset, n, running), crc32c_bitwise("prefix" + part))
          << n << " at " << offset << ", running";
    }
  // All-ones and all-zero buffers: no lucky cancellation in random data.
  for (char fill : {'\0', '\xff'}) {
    const std::string same(3000, fill);
    EXPECT_EQ(crc32c(same.data(), same.size()), crc32c_bitwise(same)) << int(fill);
  }
}

// crc32c_copy: the checksum crc32c gives and the bytes copied exactly, at the folded path's
// lengths and every source and destination alignment mod 64, from a zero and a running start;
// nothing written past the end.
TEST(Crc32cTest, CopyGivesTheChecksumAndTheBytes) {
  std::mt19937 rng(4);
  std::string data(70000, '\0');
  for (char& c : data) c = char(rng());
  const uint32_t running = crc32c_bitwise("prefix");
  for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(511), size_t(512), size_t(513),
                   size_t(767), size_t(768), size_t(4096 + 255), size_t(65536 + 17)})
    for (size_t from = 0; from < 64; from += 13)
      for (size_t to = 0; to < 64; to += 21) {
        const std::string part = data.substr(from, n);
        std::string out(n + 128, '\x5a');
        EXPECT_EQ(crc32c_copy(out.data() + to, data.data() + from, n), crc32c_bitwise(part))
            << n << " from " << from << " to " << to;
        EXPECT_EQ(out.substr(to, n), part) << n << " from " << from << " to " << to;
        EXPECT_EQ(out.substr(0, to), std::string(to, '\x5a'));
        EXPECT_EQ(out.substr(to + n), std::string(128 - to, '\x5a'));
        EXPECT_EQ(crc32c_copy(out.data() + to, data.data() + from, n, running),
                  crc32c_bitwise("prefix" + part))
            << n << " from " << from << " to " << to << ", running";
      }
}

TEST(Crc32cTest, EmptyInput) {
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
  EXPECT_EQ(crc32c_bitwise(""), 0u);
  // Nothing more to checksum leaves a running value as it was.
  EXPECT_EQ(crc32c("x", 0, 0xE3069283u), 0xE3069283u);
}

// ---------------------------------------------------------------- DurableFile

class DurableFileTest : public testing::TempDirTest {};

// Note [Direct data writes]: whatever the sizes of the writes (write() and write_checksummed() in
// turn, the latter returning each piece's crc32c), a committed file holds exactly the bytes
// written, in both modes: lengths around the 4 KiB alignment and the 8 MiB staging block,
// written in pieces of odd sizes, on the test's temporary directory (O_DIRECT where its file
// system takes it) and on /dev/shm when there is one (tmpfs, which on Linux before 6.6 refuses
// O_DIRECT: the buffered fallback). No temporary is left behind.
TEST_F(DurableFileTest, EveryModeAndLengthWritesExactlyTheBytes) {
  const size_t mib = size_t(1) << 20;
  std::string data(20 * mib + 4097, '\0');
  std::mt19937 rng(5);
  for (char& c : data) c = char(rng());
  const size_t lengths[] = {0, 1, 4095, 4096, 4097, 8 * mib - 1, 8 * mib, 8 * mib + 1, data.size()};
  const size_t pieces[] = {1, 4096 * 3 + 5, 3 * mib + 7, 9 * mib};
  std::vector<std::string> dirs = {dir_};
  if (::access("/dev/shm", W_OK) == 0) {
    std::string shm = "/dev/shm/loom_durable_XXXXXX";
    if (::mkdtemp(shm.data()) != nullptr) dirs.push_back(shm);
  }
  for (const std::string& dir : dirs)
    for (WriteMode mode : {WriteMode::kBuffered, WriteMode::kDirect})
      for (size_t length : lengths) {
        SCOPED_TRACE(dir + (mode == WriteMode::kDirect ? " direct " : " buffered ") +
                     std::to_string(length) + " bytes");
        const std::string path = dir + "/data.safetensors";
        {
          DurableFile f(path, mode);
          if (mode == WriteMode::kBuffered) EXPECT_FALSE(f.direct());
          size_t at = 0;
          for (size_t k = 0; at < length; ++k) {
            const size_t n = std::min(length - at, pieces[k % 4]);
            if (k % 2 == 0) {
              f.write(data.data() + at, n);
            } else {  // checksummed as staged, across the staging blocks' ends
              const uint32_t running = 0x1234567u;
              EXPECT_EQ(f.write_checksummed(data.data() + at, n, running),
                        crc32c(data.data() + at, n, running))
                  << n << " bytes at " << at;
            }
            at += n;
          }
          EXPECT_EQ(f.written(), length);
          f.commit();
        }
        const std::string got = read_bytes(path);
        EXPECT_EQ(got.size(), length);
        EXPECT_TRUE(got == data.substr(0, length)) << "the file's bytes differ";
        EXPECT_EQ(list_directory(dir), std::vector<std::string>{"data.safetensors"});
      }
  if (dirs.size() > 1) remove_tree(dirs[1]);
}

// An uncommitted file in direct mode leaves nothing behind, its staged bytes included.
TEST_F(DurableFileTest, DroppedDirectFileLeavesNothing) {
  {
    DurableFile f(path("data.safetensors"), WriteMode::kDirect);
    const std::string bytes(10 << 20, 'x');
    f.write(bytes.data(), bytes.size());
  }
  EXPECT_TRUE(list_directory(dir_).empty());
}

// Note [Writing while staging]: a write that fails in the writer's thread, blocks after the
// first, surfaces in the caller, naming the file and the system's reason, and the dropped file
// leaves nothing. The failure is a file-size limit (RLIMIT_FSIZE, no root needed; SIGXFSZ ignored
// so that the write returns EFBIG), set for the moment of the writes and restored.
TEST_F(DurableFileTest, WriteErrorsInTheMiddleOfTheFileReachTheCaller) {
  const size_t mib = size_t(1) << 20;
  const std::string bytes(40 * mib, 'x');
  for (WriteMode mode : {WriteMode::kDirect, WriteMode::kBuffered}) {
    SCOPED_TRACE(mode == WriteMode::kDirect ? "direct" : "buffered");
    const std::string file = path("data.safetensors");
    rlimit saved{};
    ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
    rlimit limit = saved;
    limit.rlim_cur = 20 * mib + 4096;  // inside the third 8 MiB block
    const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
    std::string error;
    try {
      DurableFile f(file, mode);
      for (size_t at = 0; at < bytes.size(); at += 3 * mib + 7)
        f.write(bytes.data() + at, std::min(3 * mib + 7, bytes.size() - at));
      f.commit();
    } catch (const Error& e) {
      error = e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &saved);
    std::signal(SIGXFSZ, old_handler);
    EXPECT_NE(error.find("cannot write " + file + " ("), std::string::npos) << error;
    EXPECT_NE(error.find("bytes written so far): " + std::string(std::strerror(EFBIG))),
              std::string::npos)
        << error;
    EXPECT_TRUE(list_directory(dir_).empty());
  }
}

// ---------------------------------------------------------------- for_each_overlap

// A random box inside `shape` (sometimes all of it, so that regions meet often) and a random
// element range of it: often the whole box, sometimes empty.
Region random_region(const Shape& shape, std::mt19937& rng) {
  Region r;
  const bool all = pick(rng, 0, 3) == 0;
  for (int64_t d : shape) {
    r.offset.push_back(all ? 0 : pick(rng, 0, d - 1));
    r.shape.push_back(all ? d : pick(rng, 1, d - r.offset.back()));
  }
  const int64_t n = r.box_numel();
  switch (pick(rng, 0, 5)) {
    case 0:
    case 1:
      r.begin = 0, r.end = n;
      break;
    case 2:
      r.begin = r.end = pick(rng, 0, n);
      break;
    default:
      r.begin = pick(rng, 0, n);
      r.end = pick(rng, r.begin, n);
  }
  return r;
}

TEST(ForEachOverlapTest, MatchesBruteForceOnRandomRegions) {
  std::mt19937 rng(20240607);
  int meeting = 0;
  for (int c = 0; c < 2000; ++c) {
    Shape shape(size_t(pick(rng, 0, 3)));  // 0 dims: a scalar
    for (int64_t& d : shape) d = pick(rng, 0, 2) == 0 ? 1 : pick(rng, 1, 5);
    const Region src = random_region(shape, rng), dst = random_region(shape, rng);
    SCOPED_TRACE("shape " + shape_str(shape) + " src " + src.str() + " dst " + dst.str());
    const std::vector<int64_t> src_global = global_indices(shape, src);
    const std::vector<int64_t> dst_global = global_indices(shape, dst);
    const std::set<int64_t> in_src(src_global.begin(), src_global.end());

    std::vector<int> seen(size_t(dst.numel()), 0);
    int64_t dst_done = 0, src_done = -1;
    for_each_overlap(shape, src, dst, [&](int64_t s, int64_t d, int64_t n) {
      ASSERT_GE(n, 1);
      ASSERT_TRUE(s >= 0 && s + n <= src.numel()) << "src run " << s << " + " << n;
      ASSERT_TRUE(d >= 0 && d + n <= dst.numel()) << "dst run " << d << " + " << n;
      EXPECT_GE(d, dst_done) << "runs come in dst order";
      EXPECT_FALSE(d == dst_done && s == src_done) << "a run continues the one before: merge them";
      dst_done = d + n;
      src_done = s + n;
      for (int64_t k = 0; k < n; ++k) {
        EXPECT_EQ(src_global[size_t(s + k)], dst_global[size_t(d + k)]) << "run element " << k;
        ++seen[size_t(d + k)];
      }
    });
    // Every shared element once, nothing else (each region holds a global element at most once).
    bool any = false;
    for (size_t j = 0; j < dst_global.size(); ++j) {
      const int want = int(in_src.count(dst_global[j]));
      EXPECT_EQ(seen[j], want) << "dst element " << j << " (global " << dst_global[j] << ")";
      any = any || want;
    }
    meeting += any;
  }
  // The random regions must meet often enough for the comparison to mean something.
  EXPECT_GT(meeting, 300);
}

TEST(ForEachOverlapTest, WholeRowsAreOneRun) {
  std::vector<std::array<int64_t, 3>> runs;
  auto record = [&](int64_t s, int64_t d, int64_t n) { runs.push_back({s, d, n}); };
  const Shape shape{50, 7, 3};
  for_each_overlap(shape, Region::whole(shape), Region::whole(shape), record);
  EXPECT_EQ(runs, (std::vector<std::array<int64_t, 3>>{{0, 0, 1050}}));
  // Rows 10..19 of the whole tensor (a row-wise shard): one run, 10 rows from element 210 on.
  Region rows = Region::whole(shape);
  rows.offset[0] = 10, rows.shape[0] = 10, rows.end = rows.box_numel();
  runs.clear();
  for_each_overlap(shape, Region::whole(shape), rows, record);
  EXPECT_EQ(runs, (std::vector<std::array<int64_t, 3>>{{210, 0, 210}}));
  // Columns 1..2 of the last dimension: one run per row, since the rows are not adjacent.
  Region cols = Region::whole(shape);
  cols.offset[2] = 1, cols.shape[2] = 2, cols.end = cols.box_numel();
  runs.clear();
  for_each_overlap(shape, Region::whole(shape), cols, record);
  EXPECT_EQ(runs.size(), 350u);
}

TEST(ForEachOverlapTest, Scalar) {
  const Region whole = Region::whole({});
  EXPECT_EQ(whole.numel(), 1);
  std::vector<std::array<int64_t, 3>> runs;
  auto record = [&](int64_t s, int64_t d, int64_t n) { runs.push_back({s, d, n}); };
  for_each_overlap({}, whole, whole, record);
  EXPECT_EQ(runs, (std::vector<std::array<int64_t, 3>>{{0, 0, 1}}));
  Region none = whole;
  none.end = 0;
  runs.clear();
  for_each_overlap({}, whole, none, record);
  for_each_overlap({}, none, whole, record);
  EXPECT_TRUE(runs.empty());
}

// ---------------------------------------------------------------- Placement

// The tensor-parallel cuts loom's layers make (parallel/tensor_parallel/layers.cpp), rank r of tp.
std::vector<std::pair<std::string, nn::ShardSpec>> tp_specs(int64_t tp, int64_t r) {
  const int64_t block = 8, in = 4;  // attention's qkv: out = 3 * block
  const int64_t qkv = block / tp, cols = 8 / tp, rows = 12 / tp;
  return {
      {"column-parallel qkv weight", {{3 * block, in}, {3, block, in}, 1, r * qkv, qkv}},
      {"column-parallel qkv bias", {{3 * block}, {3, block}, 1, r * qkv, qkv}},
      {"row-parallel weight", nn::ShardSpec::along({6, 8}, 1, r * cols, cols)},
      {"vocab-parallel rows", nn::ShardSpec::along({12, 5}, 0, r * rows, rows)},
  };
}

// Copies a placement's local elements into the whole tensor (row-major) through for_each_overlap
// into Region::whole, counting the writes to each element.
void scatter(const Placement& p, const std::vector<float>& local, std::vector<float>& global,
             std::vector<int>& writes) {
  ASSERT_EQ(p.numel(), int64_t(local.size()));
  const Region all = Region::whole(p.global_shape);
  for (const Placement::Part& part : p.parts) {
    part.region.check_inside(p.global_shape, "placement part");
    for_each_overlap(p.global_shape, part.region, all, [&](int64_t s, int64_t d, int64_t n) {
      for (int64_t k = 0; k < n; ++k) {
        global[size_t(d + k)] = local[size_t(part.local_offset + s + k)];
        ++writes[size_t(d + k)];
      }
    });
  }
}

// The full tensor 0, 1, 2, ...: each element's value is its global index.
Tensor iota(const Shape& shape) { return Tensor::arange(shape_numel(shape)).reshape(shape); }

TEST(PlacementTest, TensorParallelShardsReassembleTheFullTensor) {
  for (int64_t tp : {1, 2, 4}) {
    const auto specs0 = tp_specs(tp, 0);
    for (size_t i = 0; i < specs0.size(); ++i) {
      const auto& [what, spec0] = specs0[i];
      SCOPED_TRACE(what + " tp " + std::to_string(tp));
      const Tensor full = iota(spec0.full_shape);
      const std::vector<float> want = full.to_vector<float>();
      std::vector<float> got(want.size(), -1.f);
      std::vector<int> writes(want.size(), 0);
      for (int64_t r = 0; r < tp; ++r) {
        const nn::ShardSpec spec = tp_specs(tp, r)[i].second;
        const Placement p = Placement::of_shard(spec);
        EXPECT_EQ(p.global_shape, spec.full_shape);
        // One box, or one per block of q, k and v.
        EXPECT_EQ(p.parts.size(), what.find("qkv") != std::string::npos ? 3u : 1u);
        const std::vector<float> local = spec.slice_of(full).to_vector<float>();
        // Brute force: local element j is global element global_indices(p)[j] (its value).
        const std::vector<int64_t> idx = global_indices(p);
        EXPECT_EQ(std::vector<float>(idx.begin(), idx.end()), local) << "rank " << r;
        scatter(p, local, got, writes);
      }
      EXPECT_EQ(got, want);
      EXPECT_EQ(writes, std::vector<int>(want.size(), 1));
    }
  }
}

// ZeRO cuts a rank's flattened shard into pieces at any element, across the boxes of q, k and v:
// each slice alone must still say where its elements sit.
TEST(PlacementTest, SlicesKeepElementCorrespondence) {
  std::mt19937 rng(7);
  for (int64_t tp : {1, 2, 4}) {
    for (int64_t r = 0; r < tp; ++r) {
      for (const auto& [what, spec] : tp_specs(tp, r)) {
        SCOPED_TRACE(what + " tp " + std::to_string(tp) + " rank " + std::to_string(r));
        const Placement p = Placement::of_shard(spec);
        const std::vector<float> local = spec.slice_of(iota(spec.full_shape)).to_vector<float>();
        const int64_t n = p.numel();
        for (int trial = 0; trial < 5; ++trial) {
          const int64_t a = pick(rng, 0, n), b = pick(rng, a, n);
          std::vector<float> got(size_t(shape_numel(spec.full_shape)), -1.f), want = got;
          std::vector<int> writes(got.size(), 0), want_writes = writes;
          const std::vector<std::pair<int64_t, int64_t>> cuts = {{0, a}, {a, b}, {b, n}};
          for (const auto& [lo, hi] : cuts) {
            const Placement s = p.slice(lo, hi - lo);
            EXPECT_EQ(s.global_shape, p.global_shape);
            EXPECT_EQ(s.numel(), hi - lo);
            const std::vector<float> part(local.begin() + lo, local.begin() + hi);
            const std::vector<int64_t> idx = global_indices(s);
            EXPECT_EQ(std::vector<float>(idx.begin(), idx.end()), part)
                << "[" << lo << ", " << hi << ")";
            scatter(s, part, got, writes);
          }
          scatter(p, local, want, want_writes);
          EXPECT_EQ(got, want);
          EXPECT_EQ(writes, want_writes);
        }
      }
    }
  }
}

TEST(PlacementTest, CutsThatAreNotContiguousLocallyAreRejected) {
  // [4, 6] seen as [4, 2, 3] and cut along the last dimension: local element (i, j) is global
  // (i, 3j), so the two boxes (j = 0, 1) interleave row by row in the local tensor.
  expect_error(
      [] {
        Placement::of_shard({{4, 6}, {4, 2, 3}, 2, 0, 1});
      },
      {"not contiguous in the local tensor", "[4, 6]"});
  // Not a view of the shape at all.
  expect_error([] { Placement::of_shard({{4, 6}, {2, 12}, 0, 0, 1}); }, {"does not refine"});
  expect_error([] { Placement::of_shard({{4, 6}, {5, 5}, 0, 0, 1}); }, {"is not a view of"});
}

// ---------------------------------------------------------------- save and load

// The global tensors of a small training state, by name, with random contents.
using Globals = std::map<std::string, Tensor>;

Globals make_globals(uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  auto floats = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = u(rng);
    return v;
  };
  std::vector<BFloat16> h;
  for (float x : floats(24)) h.push_back(float_to_bf16(x));
  return {
      {"model.w", Tensor::from_vector(floats(48), {6, 8})},  // f32 2-D
      {"model.b", Tensor::from_vector(floats(10), {10})},    // f32 1-D
      {"model.h", Tensor::from_vector(h, {4, 6})},           // bf16
      {"model.scale", Tensor::from_vector(floats(1), {})},   // a 0-dim scalar
      {"optim.step", Tensor::from_vector(std::vector<int64_t>{(int64_t(rng()) << 24) + 5}, {1})},
  };
}

StatePiece piece_of(const Globals& g, const std::string& name, const Region& r) {
  const Tensor& full = g.at(name);
  return {name, full.shape(), r, gather(full, r)};
}

// The layout the checkpoint is saved from: w in column blocks; b twice, whole, as replicated
// copies are (save must still write each element once); h in row halves with the first given
// twice; the rest whole.
std::vector<StatePiece> saved_layout(const Globals& g) {
  return {
      piece_of(g, "model.w", Region::box({0, 0}, {6, 3})),
      piece_of(g, "model.w", Region::box({0, 3}, {6, 5})),
      piece_of(g, "model.b", Region::whole({10})),
      piece_of(g, "model.b", Region::whole({10})),
      piece_of(g, "model.h", Region::box({0, 0}, {2, 6})),
      piece_of(g, "model.h", Region::box({2, 0}, {2, 6})),
      piece_of(g, "model.h", Region::box({0, 0}, {2, 6})),
      piece_of(g, "model.scale", Region::whole({})),
      piece_of(g, "optim.step", Region::whole({1})),
  };
}

// Room to load region r of a tensor into, as `dtype`, filled with a byte pattern no stored value
// has, so an element the load misses shows.
StatePiece room(const Globals& g, const std::string& name, const Region& r, DType dtype) {
  Tensor data = Tensor::empty({r.numel()}, dtype);
  if (data.nbytes() > 0) std::memset(data.data_ptr(), 0xA5, data.nbytes());
  return {name, g.at(name).shape(), r, data};
}

std::vector<StatePiece> whole_rooms(const Globals& g) {
  std::vector<StatePiece> out;
  for (const auto& [name, t] : g) out.push_back(room(g, name, Region::whole(t.shape()), t.dtype()));
  return out;
}

// Pieces that view one local buffer, one per part of the placement, as training_state makes them.
std::vector<StatePiece> rooms_of(const Globals& g, const std::string& name, const Placement& p) {
  Tensor buffer = Tensor::empty({p.numel()}, g.at(name).dtype());
  std::memset(buffer.data_ptr(), 0xA5, buffer.nbytes());
  std::vector<StatePiece> out;
  for (const Placement::Part& part : p.parts)
    out.push_back({name, p.global_shape, part.region,
                   buffer.narrow(0, part.local_offset, part.region.numel())});
  return out;
}

// Expects a loaded piece to hold exactly its region of the global tensor, bit for bit; a bf16
// tensor loaded as f32 holds each value widened (exact: every bf16 is an f32).
void expect_holds(const StatePiece& p, const Globals& g) {
  SCOPED_TRACE("piece " + p.name + " " + p.region.str());
  const Tensor want = gather(g.at(p.name), p.region);
  if (p.data.dtype() == want.dtype()) {
    EXPECT_EQ(bytes_of(p.data), bytes_of(want));
    return;
  }
  ASSERT_EQ(want.dtype(), DType::kBF16);
  ASSERT_EQ(p.data.dtype(), DType::kF32);
  std::vector<uint32_t> widened, got;
  for (BFloat16 h : want.to_vector<BFloat16>()) widened.push_back(float_bits(bf16_to_float(h)));
  for (float f : p.data.to_vector<float>()) got.push_back(float_bits(f));
  EXPECT_EQ(got, widened);
}

void expect_all_hold(const std::vector<StatePiece>& pieces, const Globals& g) {
  for (const StatePiece& p : pieces) expect_holds(p, g);
}

class CheckpointTest : public loom::testing::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    ASSERT_EQ(self_comm().size(), 1) << "unit tests run in one process";
  }
  SaveResult save_globals(const std::string& dir, int64_t step, const Globals& g,
                          const nlohmann::json& state = nlohmann::json::object(),
                          int keep_last = 0) {
    return save(dir, step, saved_layout(g), state, self_comm(),
                {.keep_last = keep_last, .chunk_bytes = kChunkBytes});
  }
  // Loads every tensor of `path` whole and checks it against g.
  void expect_loads_back(const std::string& path, const Globals& g) {
    SCOPED_TRACE("loading " + path);
    const std::vector<StatePiece> rooms = whole_rooms(g);
    load(path, read_manifest(path), rooms, self_comm());
    expect_all_hold(rooms, g);
  }
};

TEST_F(CheckpointTest, RoundTripStoresEachElementOnce) {
  const Globals g = make_globals(11);
  const SaveResult r = save_globals(path("ckpt"), 7, g);
  EXPECT_EQ(r.path, path("ckpt") + "/step-00000007");
  EXPECT_EQ(r.total_bytes, fs::file_size(r.path + "/rank-00000.safetensors"));
  EXPECT_EQ(r.bytes, r.total_bytes);

  const io::CheckpointManifest m = read_manifest(r.path);
  EXPECT_EQ(m.step, 7);
  ASSERT_EQ(m.tensors.size(), g.size());
  size_t multi_chunk = 0;
  for (const auto& [name, t] : m.tensors) {
    SCOPED_TRACE(name);
    const Tensor& full = g.at(name);
    EXPECT_EQ(t.shape, full.shape());
    EXPECT_EQ(t.dtype, full.dtype());
    // Duplicated pieces are written once: every element in exactly one stored piece.
    std::vector<int> stored(size_t(full.numel()), 0);
    uint64_t nbytes = 0;
    for (const io::StoredPiece& p : t.pieces) {
      for (int64_t i : global_indices(t.shape, p.region)) ++stored[size_t(i)];
      nbytes += p.nbytes;
      EXPECT_EQ(p.chunk_bytes, kChunkBytes);
      multi_chunk += p.crc32c.size() > 1;
    }
    EXPECT_EQ(stored, std::vector<int>(stored.size(), 1));
    EXPECT_EQ(nbytes, full.nbytes());
  }
  EXPECT_GE(multi_chunk, 2u) << "the test should exercise pieces of several chunks";

  expect_loads_back(r.path, g);
  verify(r.path, m);
}

// Whether the kernel holds every page of the file at `path` now: mincore over a mapping of it,
// written here apart from in_page_cache's.
bool every_page_resident(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  EXPECT_GE(fd, 0) << path;
  const size_t size = fs::file_size(path), page = size_t(::sysconf(_SC_PAGESIZE));
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  EXPECT_NE(map, MAP_FAILED);
  std::vector<unsigned char> pages((size + page - 1) / page);
  EXPECT_EQ(::mincore(map, size, pages.data()), 0);
  ::munmap(map, size);
  return std::all_of(pages.begin(), pages.end(), [](unsigned char c) { return (c & 1) != 0; });
}

// in_page_cache follows the kernel: true once the data file has been read, what mincore says once
// its pages are dropped (a disk file system drops them; tmpfs has nowhere else to keep them), and
// false, without raising, for a file gone or a request the checkpoint does not hold (the load
// names those itself).
TEST_F(CheckpointTest, InPageCacheFollowsTheDataFilesPages) {
  const Globals g = make_globals(14);
  const std::string ckpt = save_globals(path("ckpt"), 1, g).path;
  const io::CheckpointManifest m = read_manifest(ckpt);
  const std::vector<StatePiece> rooms = whole_rooms(g);
  const std::string data = ckpt + "/rank-00000.safetensors";
  read_bytes(data);  // through the page cache
  EXPECT_TRUE(in_page_cache(ckpt, m, rooms));
  const int fd = ::open(data.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
  ::close(fd);
  EXPECT_EQ(in_page_cache(ckpt, m, rooms), every_page_resident(data));
  std::vector<StatePiece> other = rooms;
  other.push_back(room(g, "model.w", Region::whole({6, 8}), DType::kF32));
  other.back().name = "model.not_saved";
  EXPECT_FALSE(in_page_cache(ckpt, m, other));
  fs::remove(data);
  EXPECT_FALSE(in_page_cache(ckpt, m, rooms));
}

// Saved in column blocks, loaded in row blocks, ZeRO-like flat ranges, and a ZeRO slice of a
// q/k/v-blocked tensor-parallel shard; bf16 loaded into f32.
TEST_F(CheckpointTest, LoadsIntoAnotherLayout) {
  const Globals g = make_globals(12);
  const std::string ckpt = save_globals(path("ckpt"), 1, g).path;

  std::vector<StatePiece> rooms = {
      room(g, "model.w", Region::box({0, 0}, {2, 8}), DType::kF32),
      room(g, "model.w", Region::box({2, 0}, {4, 8}), DType::kF32),
      room(g, "model.h", Region::box({0, 0}, {4, 1}), DType::kF32),
      room(g, "model.h", Region::box({0, 1}, {4, 5}), DType::kF32),
      room(g, "model.h", Region::box({1, 2}, {2, 3}), DType::kBF16),
      room(g, "model.scale", Region::whole({}), DType::kF32),
      room(g, "optim.step", Region::whole({1}), DType::kI64),
  };
  auto add = [&](const std::vector<StatePiece>& more) {
    rooms.insert(rooms.end(), more.begin(), more.end());
  };
  add(rooms_of(g, "model.b", Placement::whole({10}).slice(0, 3)));
  add(rooms_of(g, "model.b", Placement::whole({10}).slice(3, 7)));
  // Rows 1, 3 and 5 of w (w seen as [3, 2, 8], cut at row 1 of dimension 1): a tp shard of three
  // boxes, and elements [3, 19) of it, which cross all three.
  const Placement qkv = Placement::of_shard({{6, 8}, {3, 2, 8}, 1, 1, 1}).slice(3, 16);
  ASSERT_EQ(qkv.parts.size(), 3u);
  add(rooms_of(g, "model.w", qkv));

  const io::CheckpointManifest m = read_manifest(ckpt);
  const LoadStats stats = load(ckpt, m, rooms, self_comm());
  expect_all_hold(rooms, g);

  // The plan reads exactly the checksum chunks that hold a wanted element, found here by brute
  // force over every element of every stored piece; the load read what it planned.
  const ReadPlan plan = plan_load(ckpt, m, requests_of(rooms));
  std::set<std::pair<std::string, std::pair<size_t, uint64_t>>> chunks;  // (tensor, piece, chunk)
  uint64_t expected = 0;
  for (const StatePiece& room : rooms) {
    const io::TensorEntry& t = m.tensors.at(room.name);
    const std::vector<int64_t> wanted = global_indices(t.shape, room.region);
    const std::set<int64_t> want(wanted.begin(), wanted.end());
    for (size_t s = 0; s < t.pieces.size(); ++s) {
      const io::StoredPiece& sp = t.pieces[s];
      const std::vector<int64_t> held = global_indices(t.shape, sp.region);
      for (size_t k = 0; k < held.size(); ++k) {
        if (!want.count(held[k])) continue;
        const uint64_t c = k * dtype_size(t.dtype) / sp.chunk_bytes;
        if (chunks.insert({room.name, {s, c}}).second)
          expected += std::min(sp.chunk_bytes, sp.nbytes - c * sp.chunk_bytes);
      }
    }
  }
  EXPECT_EQ(plan.bytes(), expected);
  EXPECT_EQ(stats.bytes_read, expected);
  uint64_t by_file = 0;
  for (const auto& [file, n] : plan.bytes_per_file(m)) by_file += n;
  EXPECT_EQ(by_file, expected);
}

// A request no stored piece covers is refused by the plan, naming the tensor, before any read.
TEST_F(CheckpointTest, PlanRefusesWhatTheCheckpointDoesNotHold) {
  const Globals g = make_globals(13);
  const std::string ckpt = save_globals(path("ckpt"), 1, g).path;
  const io::CheckpointManifest m = read_manifest(ckpt);
  auto refused = [&](const PieceRequest& r, const std::string& expected) {
    try {
      plan_load(ckpt, m, {r});
      ADD_FAILURE() << "planned " << r.name << " " << r.region.str();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  };
  refused({"model.nope", {4}, Region::whole({4}), DType::kF32}, "has no tensor model.nope");
  refused({"model.b", {11}, Region::whole({11}), DType::kF32}, "tensor model.b is [10]");
  refused({"optim.step", {1}, Region::whole({1}), DType::kF32}, "cannot be loaded into f32");
}

// ---------------------------------------------------------------- the commit protocol

// A one-tensor state whose values and JSON say which step saved it.
Globals step_globals(int64_t step) {
  std::vector<float> v(6);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(step) * 100.f + float(i);
  return {{"model.w", Tensor::from_vector(v, {2, 3})}};
}
nlohmann::json step_state(int64_t step) {
  return {{"step", step},
          {"loss", 0.125 * double(step)},
          {"config", {{"n_layer", 2}, {"name", "tiny"}}},
          {"data", {{"position", {step, 3}}, {"rng", "philox"}}}};
}

class CommitTest : public CheckpointTest {
 protected:
  SaveResult save_step(const std::string& dir, int64_t step, int keep_last = 0) {
    const Globals g = step_globals(step);
    return save(dir, step, {piece_of(g, "model.w", Region::whole({2, 3}))}, step_state(step),
                self_comm(), {.keep_last = keep_last, .chunk_bytes = kChunkBytes});
  }
};

TEST_F(CommitTest, KeepLastAndLatest) {
  const std::string root = path("run");
  for (int64_t step = 1; step <= 3; ++step)
    EXPECT_EQ(save_step(root, step, 2).path, root + "/step-0000000" + std::to_string(step));
  EXPECT_EQ(list_directory(root),
            (std::vector<std::string>{"latest", "step-00000002", "step-00000003"}));
  EXPECT_EQ(list_directory(root + "/step-00000003"),
            (std::vector<std::string>{"manifest.json", "rank-00000.safetensors"}));
  EXPECT_EQ(read_bytes(root + "/latest"), "step-00000003\n");
  EXPECT_EQ(latest_checkpoint(root), root + "/step-00000003");

  const io::CheckpointManifest m = read_manifest(root + "/step-00000003");
  EXPECT_EQ(m.step, 3);
  EXPECT_EQ(m.state, step_state(3));
  expect_loads_back(root + "/step-00000003", step_globals(3));
  expect_loads_back(root + "/step-00000002", step_globals(2));
}

TEST_F(CommitTest, UncommittedAndDanglingAreSkipped) {
  const std::string root = path("run");
  EXPECT_EQ(latest_checkpoint(root), "");  // no directory yet
  for (int64_t step = 1; step <= 3; ++step) save_step(root, step);

  // A step directory without a manifest (a save that never committed) is never the latest, even
  // when `latest` names it, and reading it says why.
  const std::string unfinished = root + "/step-00000009";
  make_directories(unfinished);
  write_bytes(unfinished + "/rank-00000.safetensors", "partial");
  EXPECT_EQ(latest_checkpoint(root), root + "/step-00000003");
  expect_error([&] { read_manifest(unfinished); }, {"no committed checkpoint", unfinished});
  write_bytes(root + "/latest", "step-00000009\n");
  EXPECT_EQ(latest_checkpoint(root), root + "/step-00000003");

  // `latest` naming a removed checkpoint: the highest committed step.
  write_bytes(root + "/latest", "step-00000003\n");
  remove_tree(root + "/step-00000003");
  EXPECT_EQ(latest_checkpoint(root), root + "/step-00000002");
  expect_loads_back(latest_checkpoint(root), step_globals(2));

  // A staging directory left by a save interrupted just before its rename holds a manifest but is
  // not a step directory; the next save clears it.
  fs::copy(root + "/step-00000002", root + "/step-00000004.tmp", fs::copy_options::recursive);
  EXPECT_EQ(latest_checkpoint(root), root + "/step-00000002");
  save_step(root, 5);
  EXPECT_FALSE(path_exists(root + "/step-00000004.tmp"));
  EXPECT_EQ(latest_checkpoint(root), root + "/step-00000005");
}

TEST_F(CommitTest, SavingAStepAgainReplacesIt) {
  const std::string root = path("run");
  const Globals first = step_globals(1), second = step_globals(2);
  save(root, 5, {piece_of(first, "model.w", Region::whole({2, 3}))}, step_state(1), self_comm());
  save(root, 5, {piece_of(second, "model.w", Region::whole({2, 3}))}, step_state(2), self_comm());
  EXPECT_EQ(list_directory(root), (std::vector<std::string>{"latest", "step-00000005"}));
  EXPECT_EQ(list_directory(root + "/step-00000005"),
            (std::vector<std::string>{"manifest.json", "rank-00000.safetensors"}));
  EXPECT_EQ(latest_checkpoint(root), root + "/step-00000005");
  EXPECT_EQ(read_manifest(root + "/step-00000005").state, step_state(2));
  expect_loads_back(root + "/step-00000005", second);
}

// ---------------------------------------------------------------- damage and bad input

class DamageTest : public CheckpointTest {
 protected:
  void SetUp() override {
    CheckpointTest::SetUp();
    good_ = save_globals(path("good"), 1, g_).path;
  }
  // A fresh copy of the checkpoint to damage.
  std::string fresh() { return save_globals(path("bad" + std::to_string(n_++)), 1, g_).path; }
  void load_whole(const std::string& ckpt) {
    load(ckpt, read_manifest(ckpt), whole_rooms(g_), self_comm());
  }
  // Damage elsewhere leaves the good checkpoint whole.
  void TearDown() override {
    expect_loads_back(good_, g_);
    verify(good_, read_manifest(good_));
    CheckpointTest::TearDown();
  }

  const Globals g_ = make_globals(13);
  std::string good_;
  int n_ = 0;
};

TEST_F(DamageTest, FlippedByteFailsItsChecksum) {
  const std::string ckpt = fresh();
  const io::CheckpointManifest m = read_manifest(ckpt);
  const io::StoredPiece& p = m.tensors.at("model.w").pieces.back();
  ASSERT_GT(p.crc32c.size(), 1u);
  const std::string file = ckpt + "/" + p.file;
  std::string bytes = read_bytes(file);
  bytes[p.offset + p.nbytes - 3] ^= 0x10;  // in the piece's last chunk
  write_bytes(file, bytes);

  const std::initializer_list<std::string> says = {"checksum", "rank-00000.safetensors",
                                                   "tensor model.w", ckpt};
  expect_error([&] { load_whole(ckpt); }, says);
  expect_error([&] { verify(ckpt, m); }, says);
  // A load that needs none of the damaged chunk reads only its own chunks and succeeds.
  std::vector<StatePiece> b = {room(g_, "model.b", Region::whole({10}), DType::kF32)};
  load(ckpt, m, b, self_comm());
  expect_all_hold(b, g_);
}

// A piece of several read blocks (1 MiB each) damaged in two of them: however the load's workers
// share the blocks (Note [Parallel load]), the error names the earlier damage, as a sequential
// read would; and an undamaged load of the same size reads every block back whole.
TEST_F(DamageTest, DamageInTwoBlocksReportsTheFirst) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(size_t(3) << 18);  // 3 MiB of f32
  for (float& x : v) x = u(rng);
  const Tensor big = Tensor::from_vector(v, {int64_t(v.size())});
  const Globals g = {{"model.big", big}};
  const Region whole = Region::whole(big.shape());
  const std::string ckpt = save(path("big"), 1, {{"model.big", big.shape(), whole, big}},
                                nlohmann::json::object(), self_comm(), {.chunk_bytes = 4096})
                               .path;
  const io::CheckpointManifest m = read_manifest(ckpt);
  std::vector<StatePiece> rooms = {room(g, "model.big", whole, DType::kF32)};
  load(ckpt, m, rooms, self_comm());
  expect_all_hold(rooms, g);

  const io::StoredPiece& p = m.tensors.at("model.big").pieces.at(0);
  const std::string file = ckpt + "/" + p.file;
  std::string bytes = read_bytes(file);
  const uint64_t early = (uint64_t(1) << 20) + 5, late = p.nbytes - 7;  // blocks 1 and 2
  bytes[p.offset + early] ^= 0x01;
  bytes[p.offset + late] ^= 0x01;
  write_bytes(file, bytes);
  const uint64_t chunk = early / p.chunk_bytes * p.chunk_bytes;
  const std::string range = "bytes [" + std::to_string(p.offset + chunk) + ", " +
                            std::to_string(p.offset + chunk + p.chunk_bytes) + ")";
  for (int trial = 0; trial < 20; ++trial)
    expect_error([&] { load(ckpt, m, rooms, self_comm()); }, {"checksum", range});
}

// Note [Checked while copied]: a chunk goes to its rooms through crc32c_copy when at most
// kCheckedRuns runs take it, each byte once; else it is checked first. Each way, a load reads a
// good checkpoint back exactly and names a damaged chunk: the whole tensor (one run), a part
// starting and ending inside chunks (runs with bytes no room takes around them), eight short
// rooms inside one chunk (too many runs), and the same part twice (two runs on the same bytes).
TEST_F(DamageTest, DamageIsFoundWhetherCheckedWhileCopiedOrFirst) {
  std::vector<float> v(size_t(1) << 16);
  std::mt19937 rng(6);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (float& x : v) x = u(rng);
  const Tensor big = Tensor::from_vector(v, {int64_t(v.size())});
  const Globals g = {{"model.big", big}};
  const std::string ckpt =
      save(path("runs"), 1, {{"model.big", big.shape(), Region::whole(big.shape()), big}},
           nlohmann::json::object(), self_comm(), {.chunk_bytes = 4096})
          .path;
  const io::CheckpointManifest m = read_manifest(ckpt);
  const int64_t chunk = 1024;                    // elements
  auto part = [&](int64_t begin, int64_t end) {  // elements [begin, end)
    Region r = Region::whole(big.shape());
    r.begin = begin;
    r.end = end;
    return room(g, "model.big", r, DType::kF32);
  };
  std::vector<StatePiece> short_rooms;
  for (int64_t k = 0; k < 8; ++k)
    short_rooms.push_back(part(5 * chunk + 100 * k, 5 * chunk + 100 * k + 60));
  const std::vector<std::vector<StatePiece>> loads = {
      {room(g, "model.big", Region::whole(big.shape()), DType::kF32)},
      {part(3 * chunk + 17, 9 * chunk - 5)},
      short_rooms,
      {part(4 * chunk + 3, 6 * chunk), part(4 * chunk + 3, 6 * chunk)},
  };
  for (const std::vector<StatePiece>& rooms : loads) {
    load(ckpt, m, rooms, self_comm());
    expect_all_hold(rooms, g);
  }
  const io::StoredPiece& p = m.tensors.at("model.big").pieces.at(0);
  const std::string file = ckpt + "/" + p.file;
  std::string bytes = read_bytes(file);
  const uint64_t damaged = 5 * 4096 + 4 * 400 + 8;  // inside the fourth short room
  bytes[p.offset + damaged] ^= 0x04;
  write_bytes(file, bytes);
  const std::string range = "bytes [" + std::to_string(p.offset + 5 * 4096) + ", " +
                            std::to_string(p.offset + 6 * 4096) + ")";
  for (size_t i = 0; i < loads.size(); ++i) {
    SCOPED_TRACE("load " + std::to_string(i));
    expect_error([&] { load(ckpt, m, loads[i], self_comm()); }, {"checksum", range, "model.big"});
  }
}

TEST_F(DamageTest, TruncatedDataFile) {
  const std::string ckpt = fresh();
  const std::string file = ckpt + "/rank-00000.safetensors";
  fs::resize_file(file, fs::file_size(file) - 10);
  expect_error([&] { load_whole(ckpt); }, {"truncated", "rank-00000.safetensors", ckpt});
  expect_error([&] { verify(ckpt, read_manifest(ckpt)); }, {"truncated", "rank-00000.safetensors"});
}

TEST_F(DamageTest, MissingDataFile) {
  const std::string ckpt = fresh();
  fs::remove(ckpt + "/rank-00000.safetensors");
  expect_error([&] { load_whole(ckpt); }, {"missing", "rank-00000.safetensors", ckpt});
  expect_error([&] { verify(ckpt, read_manifest(ckpt)); }, {"missing", "rank-00000.safetensors"});
}

TEST_F(DamageTest, ManifestThatIsNotJson) {
  const std::string ckpt = fresh();
  const std::string text = read_bytes(ckpt + "/manifest.json");
  write_bytes(ckpt + "/manifest.json", text.substr(0, text.size() / 2));  // cut short
  expect_error([&] { read_manifest(ckpt); }, {ckpt + "/manifest.json", "not valid JSON"});
}

// Two stored pieces that overlap and so hide a gap hold the right number of elements between
// them, which the manifest's count accepts; the load still refuses them.
TEST_F(DamageTest, OverlappingPiecesHidingAGap) {
  const std::string ckpt = fresh();
  nlohmann::json j = nlohmann::json::parse(read_bytes(ckpt + "/manifest.json"));
  nlohmann::json& second = j["tensors"]["model.w"]["pieces"][1];
  ASSERT_EQ(second["box_offset"], nlohmann::json({0, 3}));
  second["box_offset"] = {0, 2};  // columns 2-6 instead of 3-7: column 2 twice, 7 never
  write_bytes(ckpt + "/manifest.json", j.dump());
  expect_error([&] { load_whole(ckpt); }, {"tensor model.w", "twice", ckpt});
}

TEST_F(DamageTest, DifferentModel) {
  // A tensor of another shape.
  const std::vector<StatePiece> wider = {
      {"model.w", {6, 9}, Region::whole({6, 9}), Tensor::zeros({54})}};
  expect_error([&] { load(good_, read_manifest(good_), wider, self_comm()); },
               {"different model", "model.w", "[6, 8]", "[6, 9]"});
  // A tensor the checkpoint lacks.
  const std::vector<StatePiece> extra = {
      {"model.extra", {3}, Region::whole({3}), Tensor::zeros({3})}};
  expect_error([&] { load(good_, read_manifest(good_), extra, self_comm()); },
               {"has no tensor model.extra"});
  // Integers into floats.
  const std::vector<StatePiece> as_float = {
      room(g_, "optim.step", Region::whole({1}), DType::kF32)};
  expect_error([&] { load(good_, read_manifest(good_), as_float, self_comm()); },
               {"optim.step", "i64", "cannot be loaded into f32"});
}

// ---------------------------------------------------------------- save errors

TEST_F(CheckpointTest, SaveIntoAFileFailsAndLeavesOtherCheckpointsAlone) {
  const Globals g = make_globals(14);
  const std::string good = save_globals(path("good"), 1, g).path;
  const std::vector<std::string> before = list_directory(good);

  write_bytes(path("file"), "not a directory");
  expect_error([&] { save_globals(path("file"), 2, g); },
               {"rank 0", path("file"), "cannot create directory"});
  EXPECT_EQ(read_bytes(path("file")), "not a directory");

  // Pieces that leave elements out are refused before anything is written.
  std::vector<StatePiece> half = {piece_of(g, "model.w", Region::box({0, 0}, {3, 8}))};
  expect_error([&] { save(path("half"), 1, half, nlohmann::json::object(), self_comm()); },
               {"model.w", "hold 24 of its 48 elements"});
  EXPECT_FALSE(path_exists(path("half")));

  EXPECT_EQ(list_directory(good), before);
  expect_loads_back(good, g);
}

}  // namespace
}  // namespace loom::parallel::checkpoint
