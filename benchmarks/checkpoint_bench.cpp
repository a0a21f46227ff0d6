// loom-bench-checkpoint: distributed checkpoints of GPT-2 124M's training state against the disk's
// own bandwidth, measured in the same run, under mpirun -np N (or alone: one process).
//
// The state: GPT-2 124M (GptConfig{}: 12 layers, dim 768, vocab 50304 rows, f32) with AdamW's two
// moments, filled by one step on a tiny batch. On N > 1 ranks AdamW is wrapped in ZeRO-1 over all
// ranks, so each rank saves 1/N of the parameters and moments; on one process it is plain AdamW.
//
// Bytes: a save's are its files; a load's are what the ranks' tensors receive, summed over ranks
// (ZeRO-1 keeps every parameter whole on every rank, so each rank loads all the parameters and
// its shard of the moments: N x params + moments in all); each raw phase counts its own.
//
// Each repeat, every rank in step (a barrier before each timed phase; a phase's time is the
// slowest rank's, so GB/s is the aggregate over ranks):
//   save        TrainingState::save_pieces (views of the live tensors) + checkpoint::save (crc32c,
//               fsync, two-phase commit)
//   raw write   every rank writes the same number of bytes as its checkpoint file to a file of its
//               own the way the save writes (O_DIRECT in 8 MiB pwrite()s where the file system
//               allows it, Note [Direct data writes]), then fsync()s it: the disk's own speed
//               (the save and the raw write alternate which goes first)
//   load        TrainingState::load of that checkpoint, same layout, as a resume loads: into a
//               model and optimizer just built for it (FreshState)
//   raw read    every rank read()s its raw file back into memory of its own as large as the file,
//               just allocated and written by the process, as a resume's tensors are (FreshTarget)
// Loads and reads run twice: warm (the files are in the page cache: the save and the raw write go
// around it, so every file is read once, untimed, first) and
// cold (the files' cached pages dropped first with posix_fadvise(POSIX_FADV_DONTNEED), which needs
// no privileges; on a VM the host may still cache the disk). Resharding, N > 1: the same
// checkpoint loaded into ZeRO-3 over the same N ranks (its buckets are per module, so the shard
// boundaries differ), and into a whole model with plain AdamW on every rank (DDP's layout: each
// rank loads all of it), the latter skipped when the host's memory cannot hold N whole states.
//
//   mpirun -np 4 build/bin/loom-bench-checkpoint [--repeat 3] [--dir /tmp] [--layers 12]
//       [--full-load 1] [--json]
//
// --dir names the directory under which a fresh one (loom-ckpt-bench-XXXXXX) is made and removed
// at exit. --layers shrinks the model for a quick check. --json adds one line of JSON (rank 0).
#include <fcntl.h>
#include <malloc.h>
#include <omp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_gpt.h"
#include "collectives/communicator.h"
#include "core/nn/gpt.h"
#include "optimizer/adamw.h"
#include "parallel/checkpoint/checkpoint.h"
#include "parallel/checkpoint/durable.h"
#include "parallel/checkpoint/training_state.h"
#include "parallel/zero.h"

namespace {

using namespace loom;
namespace ckpt = loom::parallel::checkpoint;
using Clock = std::chrono::steady_clock;

constexpr const char* kProgram = "loom-bench-checkpoint";
constexpr size_t kIoChunk = size_t(1) << 20;     // bytes per read() of the raw read
constexpr size_t kRawBuffer = size_t(64) << 20;  // the raw phases' source/target (past the L3)
// A checkpoint data file's writes (Note [Direct data writes] in parallel/checkpoint/durable.cpp).
constexpr size_t kDirectAlign = 4096;
constexpr size_t kDirectBlock = size_t(8) << 20;

constexpr const char* kUsage =
    "usage: mpirun -np N loom-bench-checkpoint [--dir /tmp] [--repeat 3] [--layers 12]\n"
    "    [--full-load 0|1] [--json]";

struct Args {
  std::string dir = "/tmp";
  int64_t repeat = 3;
  int64_t layers = 12;
  int64_t full_load = 1;
  bool json = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--json") {
      a.json = true;
      continue;
    }
    if (flag == "--help" || flag == "-h") {  // before MPI starts, so a plain exit is clean
      std::printf("%s\n", kUsage);
      std::exit(0);
    }
    int64_t* field = flag == "--repeat"      ? &a.repeat
                     : flag == "--layers"    ? &a.layers
                     : flag == "--full-load" ? &a.full_load
                                             : nullptr;
    LOOM_CHECK(field || flag == "--dir", kProgram, ": unknown flag ", flag, "\n", kUsage);
    LOOM_CHECK(i + 1 < argc, kProgram, ": ", flag, " needs a value");
    const std::string value = argv[++i];
    if (!field) {
      a.dir = value;
      continue;
    }
    const bool binary = flag == "--full-load";
    char* end = nullptr;
    const long long v = std::strtoll(value.c_str(), &end, 10);
    LOOM_CHECK(end && *end == '\0' && (binary ? v == 0 || v == 1 : v >= 1), kProgram, ": ", flag,
               " expects ", binary ? "0 or 1" : "a positive integer", ", got '", value, "'");
    *field = v;
  }
  return a;
}

// Rank 0's string on every rank. Collective.
std::string broadcast_string(comm::Communicator& world, const std::string& s) {
  Tensor n = Tensor::full({1}, double(s.size()), DType::kI64);
  world.broadcast(n)->wait();
  const size_t size = size_t(n.to_vector<int64_t>()[0]);
  Tensor bytes = Tensor::zeros({std::max<int64_t>(1, int64_t(size))}, DType::kU8);
  if (world.rank() == 0) std::memcpy(bytes.data_ptr(), s.data(), s.size());
  world.broadcast(bytes)->wait();
  return std::string(static_cast<const char*>(bytes.data_ptr()), size);
}

double max_over_ranks(comm::Communicator& world, double v) {
  Tensor t = Tensor::full({1}, v, DType::kF32);
  world.allreduce_sync(t, comm::ReduceOp::kMax);
  return t.item();
}

double sum_over_ranks(comm::Communicator& world, int64_t v) {
  Tensor t = Tensor::full({1}, double(v), DType::kI64);
  world.allreduce_sync(t, comm::ReduceOp::kSum);
  return double(t.to_vector<int64_t>()[0]);
}

// Seconds from a barrier to the slowest rank's end of fn. Collective.
template <typename Fn>
double timed(comm::Communicator& world, Fn&& fn) {
  world.barrier_sync();
  const auto start = Clock::now();
  fn();
  return max_over_ranks(world, std::chrono::duration<double>(Clock::now() - start).count());
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int open_or_throw(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags, 0644);
  LOOM_CHECK(fd >= 0, kProgram, ": cannot open ", path, ": ", std::strerror(errno));
  return fd;
}

// The raw phases' source and target: kRawBuffer bytes aligned for O_DIRECT.
struct RawBuffer {
  RawBuffer() : data(static_cast<char*>(std::aligned_alloc(kDirectAlign, kRawBuffer))) {
    LOOM_CHECK(data != nullptr, kProgram, ": cannot allocate the raw phases' buffer");
    for (size_t i = 0; i < kRawBuffer; ++i) data[i] = char((i * 2654435761u) >> 13);
  }
  ~RawBuffer() { std::free(data); }
  RawBuffer(const RawBuffer&) = delete;
  RawBuffer& operator=(const RawBuffer&) = delete;
  char* data;
  size_t size() const { return kRawBuffer; }
};

// `bytes` bytes to `path`, then fsync: as a checkpoint's data file is written (Note [Direct data
// writes]), with O_DIRECT in kDirectBlock pwrite()s cycling through `buf`, the last one padded to
// the alignment and the file truncated back; buffered write()s where the file system refuses
// O_DIRECT. Returns whether it was direct.
bool raw_write(const std::string& path, uint64_t bytes, const RawBuffer& buf) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
  const bool direct = fd >= 0;
  if (!direct) fd = open_or_throw(path, O_WRONLY | O_CREAT | O_TRUNC);
  for (uint64_t at = 0; at < bytes;) {
    size_t n = size_t(std::min<uint64_t>(kDirectBlock, bytes - at));
    if (direct) n = (n + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
    const ssize_t w = ::pwrite(fd, buf.data + at % buf.size(), n, off_t(at));
    if (w < 0 && errno == EINTR) continue;
    LOOM_CHECK(w > 0, kProgram, ": cannot write ", path, ": ", std::strerror(errno));
    at += uint64_t(w);
  }
  if (direct)
    LOOM_CHECK(::ftruncate(fd, off_t(bytes)) == 0, kProgram, ": cannot truncate ", path, ": ",
               std::strerror(errno));
  LOOM_CHECK(::fsync(fd) == 0, kProgram, ": cannot fsync ", path, ": ", std::strerror(errno));
  ::close(fd);
  return direct;
}

// Where a raw read puts the bytes it reads. A resume loads into tensors that the model and
// optimizer have just made and initialised (FreshState), pages the kernel has never written, which
// on the development VM costs the kernel's first write to each page far more than the process's
// own stores (Note [Parallel load]). So the raw read's fair twin reads into memory just made the
// same way: `FreshTarget` allocates as many bytes as the read and writes them, untimed, before the
// timed read. Cycling through the 64 MiB RawBuffer instead shows the kernel's copy-out at its
// fastest (the destination stays in the L3, the TLB and the kernel's page tables), which no
// resume can do; that read is kept as a reference row, and the warm load is set against it too.
class FreshTarget {
 public:
  explicit FreshTarget(size_t bytes) {
    release_freed_memory();
    size_ = (bytes + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
    data_ = static_cast<char*>(std::aligned_alloc(kDirectAlign, size_));
    LOOM_CHECK(data_ != nullptr, kProgram, ": cannot allocate ", bytes, " bytes to read into");
    std::memset(data_, 1, size_);
  }
  FreshTarget(const FreshTarget&) = delete;
  FreshTarget& operator=(const FreshTarget&) = delete;
  ~FreshTarget() { std::free(data_); }
  char* data() { return data_; }
  size_t size() const { return size_; }

  // loom's allocator keeps freed blocks in the heap for reuse (core/allocator.cpp), so a state or
  // target made after another would get pages an earlier load or read already wrote, as no
  // resume (a new process) does. This hands them back to the kernel first.
  static void release_freed_memory() { ::malloc_trim(0); }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
};

// Reads `path` whole in kIoChunk read()s into `dst` (`capacity` bytes, cycled through when the
// file is larger); returns the bytes read.
uint64_t raw_read(const std::string& path, char* dst, size_t capacity) {
  const int fd = open_or_throw(path, O_RDONLY);
  uint64_t at = 0;
  for (;;) {
    const size_t off = size_t(at % capacity);
    const ssize_t r = ::read(fd, dst + off, std::min(kIoChunk, capacity - off));
    if (r < 0 && errno == EINTR) continue;
    LOOM_CHECK(r >= 0, kProgram, ": cannot read ", path, ": ", std::strerror(errno));
    if (r == 0) break;
    at += uint64_t(r);
  }
  ::close(fd);
  return at;
}

// Reads every file under `path` (a file or a directory) once, untimed: a save and the raw write
// go around the page cache, so the warm phases bring their files in first.
void bring_into_cache(const std::string& path, RawBuffer& buf) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    for (const std::string& name : ckpt::list_directory(path))
      bring_into_cache(path + "/" + name, buf);
    return;
  }
  raw_read(path, buf.data, buf.size());
}

// Drops the page cache's clean pages of `path` (a file, or every file under a directory).
void drop_cached(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    for (const std::string& name : ckpt::list_directory(path)) drop_cached(path + "/" + name);
    return;
  }
  const int fd = open_or_throw(path, O_RDONLY);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

int64_t mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kb = 0;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

// Elements of this rank's ZeRO pieces (its shard of every parameter).
int64_t own_numel(const parallel::ZeroOptimizer& zero) {
  int64_t k = 0;
  for (const parallel::ShardPiece& p : zero.own_pieces()) k += p.numel;
  return k;
}

std::unique_ptr<optim::Optimizer> make_adamw(std::vector<Tensor> params) {
  return std::make_unique<optim::AdamW>(std::move(params), optim::AdamWOptions{});
}

// A resume's destination: the model and optimizer just built (the constructors initialise the
// parameters; no step taken), as loom-gpt --resume builds them, on pages no earlier phase wrote
// (FreshTarget).
// zero_stage 0: plain AdamW on a whole model; 1-3: AdamW in ZeRO over `world`. Collective when
// zero_stage > 0.
struct FreshState {
  FreshState(const GptConfig& config, std::shared_ptr<comm::Communicator> world, int zero_stage) {
    FreshTarget::release_freed_memory();
    model = std::make_unique<nn::GPT>(config);
    if (zero_stage > 0) {
      parallel::ZeroOptions o;
      o.stage = zero_stage;
      auto z = std::make_unique<parallel::ZeroOptimizer>(*model, world, o, make_adamw);
      zero = z.get();
      opt = std::move(z);
    } else {
      opt = make_adamw(model->parameters());
    }
    state = std::make_unique<ckpt::TrainingState>(*model, *opt);
  }
  // The bytes a load delivers into the tensors, all ranks together. ZeRO-1 and -2 keep every
  // parameter whole, so each rank loads all the parameters and its shard of the moments; ZeRO-3
  // loads its shard of both; a whole model loads all of it. Collective.
  double load_bytes(comm::Communicator& world, int64_t numel) const {
    if (!zero) return double(world.size()) * double(numel) * 12;
    const int64_t own = own_numel(*zero);
    return sum_over_ranks(world, zero->stage() == 3 ? 3 * own * 4 : (numel + 2 * own) * 4);
  }
  std::unique_ptr<nn::GPT> model;
  std::unique_ptr<optim::Optimizer> opt;
  parallel::ZeroOptimizer* zero = nullptr;
  std::unique_ptr<ckpt::TrainingState> state;
};

// One row of the table: a phase and its raw twin, per repeat.
struct Row {
  std::string what, raw_what;
  double bytes = 0, raw_bytes = 0;  // moved by each, all ranks together
  std::vector<double> seconds, raw_seconds;
};

// Per repeat (phase GB/s) / (raw GB/s), median.
double median_ratio(const Row& r) {
  std::vector<double> ratios;
  for (size_t i = 0; i < r.seconds.size(); ++i)
    ratios.push_back((r.bytes / r.seconds[i]) / (r.raw_bytes / r.raw_seconds[i]));
  return median(ratios);
}

void print_table(const std::vector<Row>& rows, int n) {
  std::printf(
      "\n| phase | ranks | bytes | time s | GB/s | raw phase | raw GB/s | ratio |\n"
      "|---|---:|---:|---:|---:|---|---:|---:|\n");
  for (const Row& r : rows) {
    const double s = median(r.seconds), raw = median(r.raw_seconds);
    std::printf("| %s | %d | %.0f | %.3f | %.3f | %s | %.3f | **%.2f** |\n", r.what.c_str(), n,
                r.bytes, s, r.bytes / s / 1e9, r.raw_what.c_str(), r.raw_bytes / raw / 1e9,
                median_ratio(r));
  }
}

nlohmann::json json_of(const std::vector<Row>& rows, int n, int64_t repeat, int64_t parameters,
                       double checkpoint_bytes) {
  nlohmann::json j;
  j["ranks"] = n;
  j["repeat"] = repeat;
  j["parameters"] = parameters;
  j["checkpoint_bytes"] = checkpoint_bytes;
  for (const Row& r : rows) {
    nlohmann::json& row = j["rows"][r.what];
    row["bytes"] = r.bytes;
    row["seconds"] = r.seconds;
    row["median_s"] = median(r.seconds);
    row["raw"] = r.raw_what;
    row["raw_bytes"] = r.raw_bytes;
    row["raw_seconds"] = r.raw_seconds;
    row["raw_median_s"] = median(r.raw_seconds);
    row["ratio"] = median_ratio(r);
  }
  return j;
}

int run(int argc, char** argv) {
  const Args a = parse(argc, argv);
  omp_set_num_threads(1);
  auto world = comm::world();
  const int n = world->size(), rank = world->rank();
  const bool root = rank == 0;

  // A fresh directory under --dir, made by rank 0 and removed at exit.
  std::string dir;
  if (root) {
    ckpt::make_directories(a.dir);
    std::string tmpl = a.dir + "/loom-ckpt-bench-XXXXXX";
    LOOM_CHECK(::mkdtemp(tmpl.data()) != nullptr, kProgram, ": cannot make a directory under ",
               a.dir, ": ", std::strerror(errno));
    dir = tmpl;
  }
  dir = broadcast_string(*world, dir);
  struct RemoveAtExit {
    std::string dir;
    bool root;
    ~RemoveAtExit() {
      if (root) ckpt::remove_tree(dir);
    }
  } remove_at_exit{dir, root};
  const std::string ckpt_dir = dir + "/ckpt";
  auto raw_path_of = [&](int r) {
    char name[64];
    std::snprintf(name, sizeof name, "/raw-rank-%05d.bin", r);
    return dir + name;
  };
  const std::string raw_path = raw_path_of(rank);

  GptConfig config;
  config.layers = a.layers;
  const int64_t numel = config.num_parameters();
  if (root)
    std::printf(
        "%s: GPT (%s) = %lld parameters, f32, + AdamW exp_avg/exp_avg_sq; %d rank%s (%s); "
        "%lld repeats (median); one thread per rank; dir %s\n",
        kProgram, config.str().c_str(), (long long)numel, n, n > 1 ? "s" : "",
        n > 1 ? "AdamW in ZeRO-1 over all ranks: each saves 1/N" : "plain AdamW",
        (long long)a.repeat, dir.c_str());

  RawBuffer raw_buf;
  bool raw_direct = true;

  Row save{"save (save_pieces + write + crc32c + fsync + commit)", "write + fsync"};
  Row load_warm{"load, same layout, warm", "read, warm"};
  Row load_cold{"load, same layout, cold", "read, cold"};
  Row z3_warm{detail::str_cat("load into ZeRO-3 dp ", n, ", warm"), "read, warm"};
  Row z3_cold{detail::str_cat("load into ZeRO-3 dp ", n, ", cold"), "read, cold"};
  // Reference: the same warm read cycling through one 64 MiB buffer (see FreshTarget).
  Row reused_warm{"read, warm, into a reused 64 MiB buffer", "read, warm"};
  std::string last_path;
  double total_bytes = 0;
  uint64_t my_bytes = 0;  // this rank's data file
  {
    // The training state: one step on a tiny batch fills the moments.
    nn::GPT model(config);
    model.init_parameters(1);
    std::unique_ptr<optim::Optimizer> opt;
    parallel::ZeroOptimizer* zero = nullptr;
    if (n > 1) {
      auto z = std::make_unique<parallel::ZeroOptimizer>(model, world, parallel::ZeroOptions{},
                                                         make_adamw);
      zero = z.get();
      opt = std::move(z);
    } else {
      opt = make_adamw(model.parameters());
    }
    const Tensor x = bench::random_tokens(1, 8, config.vocab, 1 + uint64_t(rank));
    const Tensor y = bench::random_tokens(1, 8, config.vocab, 2 + uint64_t(rank));
    if (zero)
      zero->backward(model.loss(x, y));
    else
      model.loss(x, y).backward();
    opt->step();
    opt->zero_grad();
    ckpt::TrainingState state(model, *opt);
    // The loads' layouts: the saved one, and (resharding) ZeRO-3 over the same ranks.
    const int same_stage = n > 1 ? 1 : 0;

    for (int64_t r = 0; r < a.repeat; ++r) {
      // The save and the raw write alternate which goes first (the first save sizes the raw
      // file: every rank's raw file holds as many bytes as its data file, the same total).
      ckpt::SaveResult saved;
      auto save_once = [&] {
        save.seconds.push_back(timed(*world, [&] {
          nlohmann::json js = nlohmann::json::object();
          const std::vector<ckpt::StatePiece> pieces = state.save_pieces(js);
          saved = ckpt::save(ckpt_dir, r, pieces, js, *world);
        }));
        if (r == 0) my_bytes = saved.bytes;
      };
      auto raw_write_once = [&] {
        ::unlink(raw_path.c_str());
        save.raw_seconds.push_back(
            timed(*world, [&] { raw_direct = raw_write(raw_path, my_bytes, raw_buf); }));
      };
      if (r % 2 == 0) {
        save_once();
        raw_write_once();
      } else {
        raw_write_once();
        save_once();
      }
      total_bytes = double(saved.total_bytes);
      save.bytes = save.raw_bytes = total_bytes;

      const io::CheckpointManifest manifest = ckpt::read_manifest(saved.path);
      // Warm means in the page cache, which the save and the raw write went around.
      world->barrier_sync();
      if (root) bring_into_cache(saved.path, raw_buf);
      bring_into_cache(raw_path, raw_buf);
      auto load_pair = [&](Row& row, int zero_stage, bool cold) {
        // Cold drops only what the next phase reads, so a later warm phase finds its files
        // cached (the cold load and read bring them back).
        if (cold && root) drop_cached(ckpt_dir);
        {
          FreshState into(config, world, zero_stage);
          row.bytes = into.load_bytes(*world, numel);
          row.seconds.push_back(
              timed(*world, [&] { into.state->load(saved.path, manifest, *world); }));
        }
        if (cold) drop_cached(raw_path);
        FreshTarget target{size_t(my_bytes)};
        row.raw_seconds.push_back(
            timed(*world, [&] { raw_read(raw_path, target.data(), target.size()); }));
        row.raw_bytes = total_bytes;
      };
      reused_warm.seconds.push_back(
          timed(*world, [&] { raw_read(raw_path, raw_buf.data, raw_buf.size()); }));
      {
        FreshTarget target{size_t(my_bytes)};
        reused_warm.raw_seconds.push_back(
            timed(*world, [&] { raw_read(raw_path, target.data(), target.size()); }));
      }
      reused_warm.bytes = reused_warm.raw_bytes = total_bytes;
      load_pair(load_warm, same_stage, false);
      load_pair(load_cold, same_stage, true);
      if (n > 1) {
        load_pair(z3_warm, 3, false);
        load_pair(z3_cold, 3, true);
      }
      // Untimed: keep only the last checkpoint (the whole-model loads below read it).
      world->barrier_sync();
      if (root && !last_path.empty()) ckpt::remove_tree(last_path);
      last_path = saved.path;
    }
  }
  // The warm load against the kernel's copy-out at its fastest (the reused-buffer read).
  Row load_warm_vs_reused = load_warm;
  load_warm_vs_reused.what += " (the same loads, against the fastest read)";
  load_warm_vs_reused.raw_what = "read, warm, into a reused 64 MiB buffer";
  load_warm_vs_reused.raw_bytes = reused_warm.bytes;
  load_warm_vs_reused.raw_seconds = reused_warm.seconds;
  std::vector<Row> rows = {save, load_warm, load_cold, reused_warm, load_warm_vs_reused};
  if (n > 1) {
    rows.push_back(z3_warm);
    rows.push_back(z3_cold);
  }
  std::vector<std::string> notes;

  // DDP's layout: a whole model and plain AdamW on every rank, each loading all of the state.
  // Loading holds the parameters and the moments (the load writes into them in place, through a
  // few MiB of buffers), plus headroom: ~4 bytes per parameter byte per rank.
  if (n > 1 && a.full_load) {
    // ... and the raw twin's target: every rank's file.
    const double need = double(n) * double(numel) * 4 * 4 + double(n) * total_bytes;
    Tensor avail = Tensor::full({1}, double(mem_available_bytes()), DType::kI64);
    world->broadcast(avail)->wait();
    const double available = double(avail.to_vector<int64_t>()[0]);
    if (available < need * 1.1) {
      notes.push_back(detail::str_cat("whole-model load on every rank skipped: it needs ~",
                                      need / 1e9, " GB on this host, MemAvailable is ",
                                      available / 1e9, " GB"));
    } else {
      Row full_warm{detail::str_cat("load whole model on each of ", n, " ranks (DDP), warm"),
                    "read all files, warm"};
      Row full_cold{detail::str_cat("load whole model on each of ", n, " ranks (DDP), cold"),
                    "read all files, cold"};
      const io::CheckpointManifest manifest = ckpt::read_manifest(last_path);
      // Every rank's raw file holds my_bytes (the same total as the data files, spread alike).
      const size_t all_files = size_t(total_bytes) + size_t(n) * kDirectAlign;
      for (int64_t r = 0; r < a.repeat; ++r) {
        for (Row* row : {&full_warm, &full_cold}) {
          const bool cold = row == &full_cold;
          if (cold && root) drop_cached(ckpt_dir);
          {
            FreshState into(config, world, 0);
            row->bytes = into.load_bytes(*world, numel);  // each rank loads all of it
            row->seconds.push_back(
                timed(*world, [&] { into.state->load(last_path, manifest, *world); }));
          }
          if (cold && root)
            for (int k = 0; k < n; ++k) drop_cached(raw_path_of(k));
          FreshTarget target(all_files);
          row->raw_seconds.push_back(timed(*world, [&] {
            char* at = target.data();
            char* const end = target.data() + target.size();
            for (int k = 0; k < n; ++k) at += raw_read(raw_path_of(k), at, size_t(end - at));
          }));
          row->raw_bytes = double(n) * total_bytes;
        }
      }
      rows.push_back(full_warm);
      rows.push_back(full_cold);
      notes.push_back(
          "whole-model rows: each rank loads all of the state; the raw twin reads every rank's "
          "raw file on every rank (the ranks share one page cache, so a cold page comes from the "
          "disk once)");
    }
  }
  world->barrier_sync();
  ::unlink(raw_path.c_str());

  if (root) {
    std::printf("checkpoint: %.0f bytes (%.1f MB) in %d data file%s; GB = 1e9 bytes\n", total_bytes,
                total_bytes / 1e6, n, n > 1 ? "s" : "");
    print_table(rows, n);
    for (const std::string& note : notes) std::printf("%s\n", note.c_str());
    std::printf(
        "bytes: save = the checkpoint's files; load = what the ranks' tensors receive, all ranks "
        "together (ZeRO-1 keeps every parameter whole on every rank, so each rank loads all the "
        "parameters and its shard of the moments); raw = its own files. GB/s of each over its "
        "own bytes.\n"
        "load: into a model and optimizer built just before it, as a resume does; read: into "
        "memory "
        "allocated and written just before it (pages no earlier phase wrote).\n"
        "warm: the files are in the page cache (read once, untimed, after the save); cold: the "
        "files' cached pages dropped first with posix_fadvise(DONTNEED) (the host under a VM may "
        "still cache them). ratio = median over repeats of (phase GB/s / raw GB/s in the same "
        "repeat).\nraw write: %s, then fsync\n",
        raw_direct ? "O_DIRECT in 8 MiB pwrite()s, as the save writes its data files"
                   : "buffered pwrite()s (this file system refuses O_DIRECT; so does the save)");
    if (a.json) std::printf("%s\n", json_of(rows, n, a.repeat, numel, total_bytes).dump().c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", kProgram, e.what());
    return 1;
  }
}
