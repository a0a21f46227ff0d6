// loom-bench-embedding: the table-batched embedding-bag kernels on FBGEMM's benchmark shape
// (split_table_batched_embeddings_benchmark.py `device`: B=512, T=32, rows=100000, D=128, L=20,
// uniform indices, f32, exact row-wise Adagrad), forward and forward + fused backward, beside a
// memcpy measured in the same run.
//
// Bandwidth is given two ways. FBGEMM's count (fwd_gbps, fwdbwd_gbps): forward moves
// B*T*L*D weight elements plus the B*T*D f32 outputs; forward + backward is counted as twice
// that. The true count (*_true_gbps) adds what the kernels also move: indices and offsets, and in
// the backward the sort, one dout row per lookup, and read + write of each unique weight row and
// its optimizer state. copy_gbps counts a copy's read and write (2 bytes per byte copied), so a
// forward at copy_gbps would stream weights as fast as the machine copies memory.
//
// --optimizer none runs the sparse-gradient backward (unique rows + gradient rows), the gradient
// a sparse optimizer would consume; the others update the weights in place.
// Run: build/bin/loom-bench-embedding [--json]; OMP_NUM_THREADS sets the threads.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <sys/mman.h>

#include "core/error.h"
#include "kernels/cpu/embedding_bag.h"
#include "kernels/numeric.h"

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace {

namespace k = loom::kernels;
namespace cpu = loom::kernels::cpu;
using Clock = std::chrono::steady_clock;

struct Flags {
  int64_t batch = 512, tables = 32, rows = 100000, dim = 128, bag_size = 20;
  int64_t iters = 10, warmup = 3, huge_pages = 1;
  std::string dtype = "f32", optimizer = "rowwise_adagrad", index = "int64";
  bool json = false;
};

const char* kUsage =
    "usage: loom-bench-embedding [--batch 512] [--tables 32] [--rows 100000] [--dim 128]\n"
    "    [--bag-size 20] [--dtype f32|bf16|f16] [--index int32|int64]\n"
    "    [--optimizer none|sgd|rowwise_adagrad|adam] [--iters 10] [--warmup 3] [--json]\n";

Flags parse(int argc, char** argv) {
  Flags f;
  const std::map<std::string, int64_t*> ints = {
      {"--batch", &f.batch},   {"--tables", &f.tables},        {"--rows", &f.rows},
      {"--dim", &f.dim},       {"--bag-size", &f.bag_size},    {"--iters", &f.iters},
      {"--warmup", &f.warmup}, {"--huge-pages", &f.huge_pages}};
  const std::map<std::string, std::string*> strings = {
      {"--dtype", &f.dtype}, {"--optimizer", &f.optimizer}, {"--index", &f.index}};
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--json") {
      f.json = true;
      continue;
    }
    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    LOOM_CHECK(ints.count(flag) || strings.count(flag), "loom-bench-embedding: unknown flag ", flag,
               "\n", kUsage);
    LOOM_CHECK(i + 1 < argc, "loom-bench-embedding: ", flag, " needs a value");
    const std::string value = argv[++i];
    if (strings.count(flag)) {
      *strings.at(flag) = value;
      continue;
    }
    char* end = nullptr;
    const long long v = std::strtoll(value.c_str(), &end, 10);
    LOOM_CHECK(end && *end == '\0' && v >= 0, "loom-bench-embedding: ", flag,
               " expects a non-negative integer, got '", value, "'");
    *ints.at(flag) = v;
  }
  LOOM_CHECK(f.dim > 0 && f.dim % 4 == 0, "loom-bench-embedding: --dim must be a positive ",
             "multiple of 4, got ", f.dim);
  LOOM_CHECK(f.batch > 0 && f.tables > 0 && f.rows > 0 && f.iters > 0,
             "loom-bench-embedding: --batch, --tables, --rows and --iters must be positive");
  LOOM_CHECK(f.dtype == "f32" || f.dtype == "bf16" || f.dtype == "f16",
             "loom-bench-embedding: --dtype is f32, bf16 or f16, got '", f.dtype, "'");
  LOOM_CHECK(f.index == "int32" || f.index == "int64",
             "loom-bench-embedding: --index is int32 or int64, got '", f.index, "'");
  LOOM_CHECK(f.optimizer == "none" || f.optimizer == "sgd" || f.optimizer == "rowwise_adagrad" ||
                 f.optimizer == "adam",
             "loom-bench-embedding: --optimizer is none, sgd, rowwise_adagrad or adam, got '",
             f.optimizer, "'");
  return f;
}

int threads() {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// Zeroed memory from mmap, optionally in transparent huge pages (madvise): the lookups read rows
// at random over gigabytes, and with 4 KiB pages nearly every row read is also a TLB miss.
class Buffer {
 public:
  Buffer(size_t bytes, bool huge) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    LOOM_CHECK(p != MAP_FAILED, "loom-bench-embedding: cannot map ", bytes, " bytes");
    if (huge) madvise(p, bytes, MADV_HUGEPAGE);
    data_ = static_cast<char*>(p);
  }
  ~Buffer() { munmap(data_, bytes_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  char* data() { return data_; }

 private:
  size_t bytes_;
  char* data_;
};

uint64_t next(uint64_t& s) {  // LCG: cheap enough to fill gigabytes of weights
  s = s * 6364136223846793005ull + 1442695040888963407ull;
  return s >> 33;
}

template <typename Fn>
double seconds(Fn&& fn) {
  const auto start = Clock::now();
  fn();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A parallel memcpy of 512 MiB, split over the threads as the kernels are: the machine's
// streaming bandwidth as the kernels' threads see it.
class Copy {
 public:
  static constexpr size_t kBytes = size_t(512) << 20;
  Copy() : src_(kBytes, false), dst_(kBytes, false) { std::memset(src_.data(), 1, kBytes); }
  void operator()() {
    constexpr int64_t kChunks = 64;
    char* dst = dst_.data();
    const char* src = src_.data();
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < kChunks; ++c)
      std::memcpy(dst + size_t(c) * (kBytes / kChunks), src + size_t(c) * (kBytes / kChunks),
                  kBytes / kChunks);
  }

 private:
  Buffer src_, dst_;
};

template <typename Index>
int run(const Flags& f) {
  const int64_t nt = f.tables, nb = f.batch, d = f.dim, l = f.bag_size;
  const k::EmbeddingDType dtype = f.dtype == "f32"    ? k::EmbeddingDType::kF32
                                  : f.dtype == "bf16" ? k::EmbeddingDType::kBF16
                                                      : k::EmbeddingDType::kF16;
  const size_t esize = dtype == k::EmbeddingDType::kF32 ? 4 : 2;
  std::vector<int64_t> rows(size_t(nt), f.rows), dims(size_t(nt), d), woff(size_t(nt) + 1),
      roff(size_t(nt) + 1), doff(size_t(nt) + 1);
  k::embedding_tables_pack(nt, rows.data(), dims.data(), woff.data(), roff.data(), doff.data());
  const int64_t elems = woff.back();
  k::EmbeddingTables tables{nt,          rows.data(), dims.data(), woff.data(),
                            roff.data(), doff.data(), dtype};

  // Weights uniform in [-0.01, 0.01) as FBGEMM initialises them; filled in parallel.
  Buffer weights(size_t(elems) * esize, f.huge_pages != 0);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < 256; ++c) {
    uint64_t s = uint64_t(c) + 1;
    for (int64_t e = elems * c / 256; e < elems * (c + 1) / 256; ++e) {
      const float v = (float(next(s) % 20000) - 10000.0f) * 1e-6f;
      if (dtype == k::EmbeddingDType::kF32)
        reinterpret_cast<float*>(weights.data())[e] = v;
      else if (dtype == k::EmbeddingDType::kBF16)
        reinterpret_cast<loom::BFloat16*>(weights.data())[e] = loom::float_to_bf16(v);
      else
        reinterpret_cast<loom::Float16*>(weights.data())[e] = loom::float_to_f16(v);
    }
  }
  const int64_t n = nt * nb * l;
  LOOM_CHECK(sizeof(Index) == 8 || n < (int64_t(1) << 31), "loom-bench-embedding: ", n,
             " lookups overflow --index int32");
  std::vector<Index> indices(static_cast<size_t>(n)), offsets(static_cast<size_t>(nt * nb + 1));
  uint64_t s = 2024;
  for (int64_t p = 0; p < n; ++p) indices[size_t(p)] = Index(next(s) % uint64_t(f.rows));
  for (int64_t i = 0; i <= nt * nb; ++i) offsets[size_t(i)] = Index(i * l);
  k::EmbeddingBagIndices<Index> in;
  in.batch_size = nb;
  in.indices = indices.data();
  in.num_indices = n;
  in.offsets = offsets.data();
  in.num_offsets = nt * nb + 1;
  k::EmbeddingBagOptions opt;  // sum pooling, bounds check: error (validated once below)
  const k::EmbeddingBagError err = cpu::validate_embedding_bag(tables, in, opt);
  LOOM_CHECK(err.ok(),
             "loom-bench-embedding: invalid batch: ", k::embedding_bag_error_name(err.kind));

  std::vector<float> out(size_t(nb * nt * d)), dout(out.size());
  for (float& x : dout) x = (float(next(s) % 2000) - 1000.0f) * 1e-6f;

  k::EmbeddingOptimizerHyper hyper;
  hyper.kind = f.optimizer == "sgd"               ? k::EmbeddingOptimizer::kSgd
               : f.optimizer == "rowwise_adagrad" ? k::EmbeddingOptimizer::kRowwiseAdagrad
               : f.optimizer == "adam"            ? k::EmbeddingOptimizer::kAdam
                                                  : k::EmbeddingOptimizer::kNone;
  hyper.lr = 0.01f;
  const bool adam = hyper.kind == k::EmbeddingOptimizer::kAdam;
  const bool adagrad = hyper.kind == k::EmbeddingOptimizer::kRowwiseAdagrad;
  std::vector<float> m1(size_t(adam ? elems : adagrad ? roff.back() : 0), 0.0f);
  std::vector<float> m2(size_t(adam ? elems : 0), 0.0f);
  const k::EmbeddingOptimizerState state{m1.data(), m2.data()};
  // The sparse gradient (--optimizer none), sized as documented.
  std::vector<int64_t> g_tables(static_cast<size_t>(n)), g_rows(static_cast<size_t>(n)),
      g_voff(static_cast<size_t>(n) + 1);
  std::vector<float> g_values(size_t(n * d));
  const k::EmbeddingSparseGrad sparse{g_tables.data(), g_rows.data(), g_voff.data(),
                                      g_values.data()};
  int64_t unique = 0;

  Copy copy;
  auto forward = [&] { cpu::embedding_bag_forward(tables, weights.data(), in, out.data(), opt); };
  auto backward = [&] {
    if (hyper.kind == k::EmbeddingOptimizer::kNone)
      unique = cpu::embedding_bag_backward_sparse(tables, weights.data(), in, dout.data(), sparse,
                                                  nullptr, opt);
    else
      cpu::embedding_bag_backward_fused(tables, weights.data(), in, dout.data(), hyper, state,
                                        nullptr, opt);
  };
  // The machine is shared and its bandwidth drifts, so the copy, the forward and the forward +
  // backward are timed in turn in every iteration, and each reports its median.
  std::vector<double> copy_t, fwd_t, fwdbwd_t;
  for (int64_t it = 0; it < f.warmup + f.iters; ++it) {
    const double c = seconds(copy), a = seconds(forward), b = seconds([&] {
                                                            forward();
                                                            backward();
                                                          });
    if (it < f.warmup) continue;
    copy_t.push_back(c);
    fwd_t.push_back(a);
    fwdbwd_t.push_back(b);
  }
  const double fwd_s = median(fwd_t), fwdbwd_s = median(fwdbwd_t);
  const double copy_gbps = 2.0 * double(Copy::kBytes) / median(copy_t) / 1e9;
  if (hyper.kind != k::EmbeddingOptimizer::kNone)  // the unique rows, for the true bytes
    unique = cpu::embedding_bag_backward_sparse(tables, weights.data(), in, dout.data(), sparse,
                                                nullptr, opt);

  // FBGEMM's count: weight rows read plus outputs written; forward + backward twice that.
  const double out_bytes = double(nb * nt * d) * 4.0;
  const double fbgemm_bytes = double(n) * double(d) * double(esize) + out_bytes;
  // The true count. Forward: + indices and offsets. Backward: indices and offsets again, 48 bytes
  // per lookup for keying and sorting (an 8-byte key and bag written, two radix passes reading
  // and writing the keys), one dout row per lookup, and each unique row's weights and optimizer
  // state read and written (or, for --optimizer none, its gradient row written).
  const double index_bytes = double(n + nt * nb + 1) * double(sizeof(Index));
  const double fwd_true = fbgemm_bytes + index_bytes;
  const double state_bytes = adam ? 2.0 * double(d) * 4.0 : adagrad ? 4.0 : 0.0;
  const double row_update = hyper.kind == k::EmbeddingOptimizer::kNone
                                ? double(d) * 4.0  // the gradient row written
                                : 2.0 * (double(d) * double(esize) + state_bytes);
  const double bwd_true = index_bytes + double(n) * 8.0 * 6.0 + double(n) * double(d) * 4.0 +
                          double(unique) * row_update;
  const double fwd_gbps = fbgemm_bytes / fwd_s / 1e9,
               fwdbwd_gbps = 2.0 * fbgemm_bytes / fwdbwd_s / 1e9;
  const double fwd_true_gbps = fwd_true / fwd_s / 1e9;
  const double fwdbwd_true_gbps = (fwd_true + bwd_true) / fwdbwd_s / 1e9;

  if (f.json) {
    std::printf(
        "{\"batch\": %ld, \"tables\": %ld, \"rows\": %ld, \"dim\": %ld, \"bag_size\": %ld, "
        "\"dtype\": \"%s\", \"index\": \"%s\", \"optimizer\": \"%s\", \"threads\": %d, "
        "\"iters\": %ld, \"fwd_ms\": %.4f, \"fwd_gbps\": %.3f, \"fwd_true_gbps\": %.3f, "
        "\"fwdbwd_ms\": %.4f, \"fwdbwd_gbps\": %.3f, \"fwdbwd_true_gbps\": %.3f, "
        "\"copy_gbps\": %.3f, \"fwd_vs_copy\": %.3f, \"unique_rows\": %ld}\n",
        long(nb), long(nt), long(f.rows), long(d), long(l), f.dtype.c_str(), f.index.c_str(),
        f.optimizer.c_str(), threads(), long(f.iters), fwd_s * 1e3, fwd_gbps, fwd_true_gbps,
        fwdbwd_s * 1e3, fwdbwd_gbps, fwdbwd_true_gbps, copy_gbps, fwd_gbps / copy_gbps,
        long(unique));
    return 0;
  }
  std::printf(
      "loom-bench-embedding: B=%ld T=%ld rows=%ld D=%ld L=%ld %s %s optimizer=%s, "
      "%d threads, median of %ld iters after %ld warm-up\n",
      long(nb), long(nt), long(f.rows), long(d), long(l), f.dtype.c_str(), f.index.c_str(),
      f.optimizer.c_str(), threads(), long(f.iters), long(f.warmup));
  std::printf("weights %.2f GB, %ld lookups, %ld unique rows\n",
              double(elems) * double(esize) / 1e9, long(n), long(unique));
  std::printf("%-16s %10s %14s %14s\n", "", "ms", "GB/s (FBGEMM)", "GB/s (true)");
  std::printf("%-16s %10.3f %14.2f %14.2f\n", "forward", fwd_s * 1e3, fwd_gbps, fwd_true_gbps);
  std::printf("%-16s %10.3f %14.2f %14.2f\n", "forward+backward", fwdbwd_s * 1e3, fwdbwd_gbps,
              fwdbwd_true_gbps);
  std::printf("memcpy: %.2f GB/s (read + write); forward reaches %.0f%% of it\n", copy_gbps,
              100.0 * fwd_gbps / copy_gbps);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Flags f = parse(argc, argv);
    return f.index == "int32" ? run<int32_t>(f) : run<int64_t>(f);
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
