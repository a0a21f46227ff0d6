// loom-bench-cuda: loom's CUDA kernels on GPT-2 124M's shapes (B*T = 8192 tokens, C = 768,
// 12 heads, T = 1024, padded vocabulary 50304), each beside a limit measured in the same run:
//
// - GEMM (f32 and bf16): loom's kernels::cuda::gemm against the same product through a direct
//   cublasGemmEx with the same settings (compute type 32F, no TF32, the math mode loom's handle
//   uses), in TFLOP/s = 2 m n k / time. The ratio says what loom's wrapper costs. gemm_bias (bias,
//   bias + GELU, bias + GELU + pre-GELU output) is compared with loom's plain gemm on the MLP's
//   first shape, and the note says whether cuBLASLt fused the epilogue or loom fell back.
// - Memory-bound kernels: GB/s = (bytes the kernel must read + bytes it must write) / time, the
//   compulsory traffic given per kernel in its note (re-reads from L2 and scratch are not
//   counted), against a device-to-device cudaMemcpyAsync that moves the same traffic: a copy of
//   bytes / 2 reads bytes / 2 and writes bytes / 2. The ratio is copy time / kernel time.
// - Attention (when kernels/cuda/attention.h exists): TFLOP/s with FlashAttention's count, causal
//   halving it (forward 2 matmuls, backward 5, each 2 T^2 D per head), against cuBLAS's strided
//   batched Q K^T product (BH products of [T, D] x [D, T], same dtype and compute type): the
//   throughput cuBLAS itself reaches on such thin products.
//
// Timing: cudaEvents on the device's compute stream (loom::cuda_rt::compute_stream), `--warmup`
// untimed calls, then the median of `--iters` timed calls. Before each timed call the L2 cache is
// flushed as nvbench does it (a cudaMemsetAsync over an L2-sized buffer, outside the events), for
// the kernels and their references alike; `--l2-flush 0` turns that off.
//
// Run: build/bin/loom-bench-cuda [--iters 20] [--warmup 5] [--device 0] [--filter text]
//      [--l2-flush 1] [--json]
// Without a usable GPU it prints one line saying so and exits 0 (CI builds it, never runs it).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/dropout.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gelu.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/layer_norm.h"
#include "kernels/cuda/optimizer_update.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/softmax.h"
#include "kernels/numeric.h"

#if __has_include("kernels/cuda/attention.h")
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_gemm.h"
#define LOOM_BENCH_ATTENTION 1
#else
#define LOOM_BENCH_ATTENTION 0
#endif

namespace {

namespace kc = loom::kernels::cuda;
namespace rt = loom::cuda_rt;
using loom::BFloat16;

// GPT-2 124M at batch 8 x sequence 1024.
constexpr int64_t kTokens = 8192;   // B * T
constexpr int64_t kSeq = 1024;      // T
constexpr int64_t kChannels = 768;  // C
constexpr int64_t kHeads = 12;
constexpr int64_t kHeadDim = kChannels / kHeads;            // 64
constexpr int64_t kBatchHeads = (kTokens / kSeq) * kHeads;  // B * H = 96
constexpr int64_t kLayers = 12;
constexpr int64_t kVocab = 50257;        // classes
constexpr int64_t kPaddedVocab = 50304;  // columns of the logits and rows of wte

struct Flags {
  int64_t iters = 20, warmup = 5, device = 0, l2_flush = 1;
  std::string filter;
  bool json = false;
};

const char* kUsage =
    "usage: loom-bench-cuda [--iters 20] [--warmup 5] [--device 0] [--filter text]\n"
    "    [--l2-flush 0|1] [--json]\n";

Flags parse(int argc, char** argv) {
  Flags f;
  const std::map<std::string, int64_t*> ints = {{"--iters", &f.iters},
                                                {"--warmup", &f.warmup},
                                                {"--device", &f.device},
                                                {"--l2-flush", &f.l2_flush}};
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
    LOOM_CHECK(ints.count(flag) || flag == "--filter", "loom-bench-cuda: unknown flag ", flag, "\n",
               kUsage);
    LOOM_CHECK(i + 1 < argc, "loom-bench-cuda: ", flag, " needs a value");
    const std::string value = argv[++i];
    if (flag == "--filter") {
      f.filter = value;
      continue;
    }
    char* end = nullptr;
    const long long v = std::strtoll(value.c_str(), &end, 10);
    LOOM_CHECK(end && *end == '\0' && v >= 0, "loom-bench-cuda: ", flag,
               " expects a non-negative integer, got '", value, "'");
    *ints.at(flag) = v;
  }
  LOOM_CHECK(f.iters > 0, "loom-bench-cuda: --iters must be positive");
  return f;
}

// ---------------------------------------------------------------- device memory and data

// Device memory from loom's runtime (plain cudaMalloc), freed on scope exit.
class DeviceBuffer {
 public:
  DeviceBuffer(int device, size_t bytes) : device_(device), bytes_(bytes) {
    if (bytes > 0) ptr_ = rt::malloc_device(device, bytes);
  }
  ~DeviceBuffer() {
    if (ptr_) rt::free_device(device_, ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  int device_;
  size_t bytes_;
  void* ptr_ = nullptr;
};

uint64_t next(uint64_t& s) {  // LCG: the values only need to be plausible, not random
  s = s * 6364136223846793005ull + 1442695040888963407ull;
  return s >> 33;
}
float uniform01(uint64_t& s) { return float(next(s) % (1u << 24)) / float(1u << 24); }

template <typename T>
T from_f32(float v);
template <>
float from_f32<float>(float v) {
  return v;
}
template <>
BFloat16 from_f32<BFloat16>(float v) {
  return loom::float_to_bf16(v);
}

template <typename T>
const char* dtype_name() {
  return sizeof(T) == 4 ? "f32" : "bf16";
}

// n elements uniform in [lo, hi): a host block of up to 4M values, copied over the buffer as many
// times as it takes (filling gigabytes from the host element by element would take seconds).
template <typename T>
void fill_uniform(int device, T* dst, int64_t n, float lo, float hi, uint64_t seed) {
  if (n == 0) return;
  const int64_t chunk = std::min<int64_t>(n, int64_t(1) << 22);
  std::vector<T> host(static_cast<size_t>(chunk));
  uint64_t s = seed;
  for (T& x : host) x = from_f32<T>(lo + (hi - lo) * uniform01(s));
  for (int64_t at = 0; at < n; at += chunk) {
    const int64_t len = std::min(chunk, n - at);
    rt::copy_host_to_device(device, dst + at, host.data(), size_t(len) * sizeof(T));
  }
}

// n indices uniform in [0, bound).
template <typename I>
void fill_indices(int device, I* dst, int64_t n, int64_t bound, uint64_t seed) {
  std::vector<I> host(static_cast<size_t>(n));
  uint64_t s = seed;
  for (I& x : host) x = I(next(s) % uint64_t(bound));
  rt::copy_host_to_device(device, dst, host.data(), size_t(n) * sizeof(I));
}

// ---------------------------------------------------------------- timing

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Times work enqueued on the compute stream with a pair of events: warm-up calls, then the median
// of the timed calls, each after an L2 flush that the events do not see.
class Timer {
 public:
  Timer(int device, kc::Stream stream, const Flags& f, size_t l2_bytes)
      : stream_(stream),
        warmup_(f.warmup),
        iters_(f.iters),
        flush_(device, f.l2_flush ? l2_bytes : 0) {
    LOOM_CUDA_CHECK(cudaEventCreate(&start_));
    LOOM_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~Timer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  template <typename Fn>
  double median_ms(Fn&& fn) {
    for (int64_t i = 0; i < warmup_; ++i) fn();
    std::vector<double> times;
    for (int64_t i = 0; i < iters_; ++i) {
      if (flush_.bytes() > 0)
        LOOM_CUDA_CHECK(cudaMemsetAsync(flush_.as<void>(), int(i & 0xff), flush_.bytes(), stream_));
      LOOM_CUDA_CHECK(cudaEventRecord(start_, stream_));
      fn();
      LOOM_CUDA_CHECK(cudaEventRecord(stop_, stream_));
      LOOM_CUDA_CHECK(cudaEventSynchronize(stop_));
      float ms = 0.0f;
      LOOM_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
      times.push_back(double(ms));
    }
    return median(times);
  }

 private:
  kc::Stream stream_;
  int64_t warmup_, iters_;
  DeviceBuffer flush_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// One line of the report. rate and ref_rate are in `unit`; ratio = rate / ref_rate.
struct Row {
  std::string section, kernel, dtype, shape;
  double ms = 0, rate = 0;
  std::string unit, ref;
  double ref_ms = 0, ref_rate = 0, ratio = 0;
  std::string note;
};

// ---------------------------------------------------------------- the run

class Bench {
 public:
  Bench(const Flags& f, int device, size_t l2_bytes)
      : flags_(f),
        device_(device),
        stream_(rt::compute_stream(device)),
        timer_(device, stream_, f, l2_bytes) {
    LOOM_CUBLAS_CHECK(cublasCreate(&cublas_));
    // The math mode of loom's own handle (kernels/cuda/gemm.cu): full f32, f32 split-K sums.
    LOOM_CUBLAS_CHECK(cublasSetMathMode(
        cublas_,
        cublasMath_t(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    LOOM_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
  }
  ~Bench() { cublasDestroy(cublas_); }

  const std::vector<Row>& rows() const { return rows_; }

  void run_all() {
    gemms<float>();
    gemms<BFloat16>();
    memory_bound<float>();
    memory_bound<BFloat16>();
    adamw();
#if LOOM_BENCH_ATTENTION
    attention<float>();
    attention<BFloat16>();
#endif
  }

 private:
  bool wanted(const std::string& name, const char* dtype) const {
    return flags_.filter.empty() || (name + " " + dtype).find(flags_.filter) != std::string::npos;
  }

  // Device-to-device copy moving `bytes` of traffic (bytes / 2 read, bytes / 2 written); the
  // buffers grow to the largest request and are kept.
  double copy_ms(double bytes) {
    const size_t half = size_t(bytes / 2);
    if (!copy_src_ || copy_src_->bytes() < half) {
      copy_src_.reset();
      copy_dst_.reset();
      copy_src_ = std::make_unique<DeviceBuffer>(device_, half);
      copy_dst_ = std::make_unique<DeviceBuffer>(device_, half);
      LOOM_CUDA_CHECK(cudaMemsetAsync(copy_src_->as<void>(), 1, half, stream_));
    }
    return timer_.median_ms([&] {
      LOOM_CUDA_CHECK(cudaMemcpyAsync(copy_dst_->as<void>(), copy_src_->as<void>(), half,
                                      cudaMemcpyDeviceToDevice, stream_));
    });
  }

  // A memory-bound kernel: time it and the same traffic's copy, and report both.
  template <typename Fn>
  void memory_row(const std::string& kernel, const char* dtype, const std::string& shape,
                  double bytes, const std::string& formula, Fn&& fn) {
    Row r;
    r.section = "memory";
    r.kernel = kernel;
    r.dtype = dtype;
    r.shape = shape;
    r.unit = "GB/s";
    r.ref = "memcpy D2D";
    r.ms = timer_.median_ms(fn);
    r.ref_ms = copy_ms(bytes);
    r.rate = bytes / (r.ms * 1e-3) / 1e9;
    r.ref_rate = bytes / (r.ref_ms * 1e-3) / 1e9;
    r.ratio = r.rate / r.ref_rate;
    r.note = "bytes = " + formula;
    rows_.push_back(r);
  }

  // ------------------------------------------------------------ GEMM

  // C [m, n] = A [m, k] W [n, k]^T, row-major: a Linear layer's forward (weight [out, in]), as
  // loom's core calls gemm(false, true, ...). Through cuBLAS column-major, C^T = W A^T: the same
  // operand swap kernels/cuda/gemm.cu makes.
  template <typename T>
  void cublas_linear(int64_t m, int64_t n, int64_t k, const T* a, const T* w, T* c) {
    const cudaDataType_t type = sizeof(T) == 4 ? CUDA_R_32F : CUDA_R_16BF;
    const float one = 1.0f, zero = 0.0f;
    LOOM_CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &one,
                                   w, type, int(k), a, type, int(k), &zero, c, type, int(n),
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  template <typename T>
  void gemms() {
    const char* dt = dtype_name<T>();
    struct Shape {
      const char* name;
      int64_t n, k;
    };
    // [8192, k] x [k, n]: attention qkv, MLP up, MLP down, the vocabulary head.
    const Shape shapes[] = {{"qkv", 3 * kChannels, kChannels},
                            {"fc", 4 * kChannels, kChannels},
                            {"fc_proj", kChannels, 4 * kChannels},
                            {"lm_head", kPaddedVocab, kChannels}};
    const int64_t m = kTokens;
    for (const Shape& s : shapes) {
      const std::string kernel = std::string("gemm ") + s.name;
      if (!wanted(kernel, dt)) continue;
      DeviceBuffer a(device_, size_t(m * s.k) * sizeof(T)),
          w(device_, size_t(s.n * s.k) * sizeof(T)), c(device_, size_t(m * s.n) * sizeof(T));
      fill_uniform(device_, a.as<T>(), m * s.k, -1.0f, 1.0f, 1);
      fill_uniform(device_, w.as<T>(), s.n * s.k, -0.05f, 0.05f, 2);
      const double flop = 2.0 * double(m) * double(s.n) * double(s.k);
      Row r;
      r.section = "gemm";
      r.kernel = kernel;
      r.dtype = dt;
      r.shape = std::to_string(m) + "x" + std::to_string(s.k) + " * " + std::to_string(s.k) + "x" +
                std::to_string(s.n);
      r.unit = "TFLOP/s";
      r.ref = "cublasGemmEx";
      r.ms = timer_.median_ms([&] {
        kc::gemm(false, true, m, s.n, s.k, 1.0f, a.as<T>(), s.k, w.as<T>(), s.k, 0.0f, c.as<T>(),
                 s.n, stream_);
      });
      r.ref_ms =
          timer_.median_ms([&] { cublas_linear<T>(m, s.n, s.k, a.as<T>(), w.as<T>(), c.as<T>()); });
      r.rate = flop / (r.ms * 1e-3) / 1e12;
      r.ref_rate = flop / (r.ref_ms * 1e-3) / 1e12;
      r.ratio = r.rate / r.ref_rate;
      r.note = "flop = 2 m n k; C = A W^T, compute 32F";
      rows_.push_back(r);
      const double gemm_ms = r.ms, gemm_rate = r.rate;
      if (std::string(s.name) != "fc") continue;

      // The MLP's first GEMM with its epilogue, against loom's plain gemm above.
      DeviceBuffer bias(device_, size_t(s.n) * sizeof(float)),
          pre(device_, size_t(m * s.n) * sizeof(T));
      fill_uniform(device_, bias.as<float>(), s.n, -0.1f, 0.1f, 3);
      struct Variant {
        const char* name;
        bool gelu, aux;
      };
      const Variant variants[] = {{"gemm_bias fc", false, false},
                                  {"gemm_bias+gelu fc", true, false},
                                  {"gemm_bias+gelu+pre fc", true, true}};
      for (const Variant& v : variants) {
        if (!wanted(v.name, dt)) continue;
        const int64_t before = kc::gemm_bias_fallback_count();
        auto call = [&] {
          kc::gemm_bias(false, true, m, s.n, s.k, a.as<T>(), s.k, w.as<T>(), s.k, bias.as<float>(),
                        v.gelu, v.aux ? pre.as<T>() : nullptr, c.as<T>(), s.n, stream_);
        };
        call();
        const bool fused = kc::gemm_bias_fallback_count() == before;
        Row b = r;
        b.kernel = v.name;
        b.ref = "loom gemm";
        b.ms = timer_.median_ms(call);
        b.ref_ms = gemm_ms;
        b.rate = flop / (b.ms * 1e-3) / 1e12;
        b.ref_rate = gemm_rate;
        b.ratio = b.rate / b.ref_rate;
        b.note =
            std::string(fused ? "cuBLASLt epilogue (fused)" : "fallback: gemm + bias_gelu kernel") +
            "; flop = 2 m n k";
        rows_.push_back(b);
      }
    }
  }

  // ------------------------------------------------------------ memory-bound kernels

  template <typename T>
  void memory_bound() {
    const char* dt = dtype_name<T>();
    const double st = double(sizeof(T));
    const std::string sts = std::to_string(sizeof(T));

    // layer_norm: [8192, 768], with weight and bias.
    {
      const int64_t rows = kTokens, cols = kChannels;
      const std::string shape = std::to_string(rows) + "x" + std::to_string(cols);
      const bool fwd = wanted("layer_norm_forward", dt), bwd = wanted("layer_norm_backward", dt);
      if (fwd || bwd) {
        DeviceBuffer x(device_, size_t(rows * cols) * sizeof(T)),
            y(device_, size_t(rows * cols) * sizeof(T)),
            dy(device_, size_t(rows * cols) * sizeof(T)),
            dx(device_, size_t(rows * cols) * sizeof(T)), w(device_, size_t(cols) * 4),
            b(device_, size_t(cols) * 4), dw(device_, size_t(cols) * 4),
            db(device_, size_t(cols) * 4), mean(device_, size_t(rows) * 4),
            rstd(device_, size_t(rows) * 4);
        fill_uniform(device_, x.as<T>(), rows * cols, -2.0f, 2.0f, 11);
        fill_uniform(device_, dy.as<T>(), rows * cols, -1.0f, 1.0f, 12);
        fill_uniform(device_, w.as<float>(), cols, 0.5f, 1.5f, 13);
        fill_uniform(device_, b.as<float>(), cols, -0.1f, 0.1f, 14);
        auto forward = [&] {
          kc::layer_norm_forward(x.as<T>(), w.as<float>(), b.as<float>(), y.as<T>(),
                                 mean.as<float>(), rstd.as<float>(), rows, cols, 1e-5f, stream_);
        };
        if (fwd)
          memory_row("layer_norm_forward", dt, shape,
                     2.0 * rows * cols * st + 2.0 * cols * 4 + 2.0 * rows * 4,
                     "2 R C " + sts + " (x, y) + 2 C 4 (w, b) + 2 R 4 (mean, rstd)", forward);
        if (bwd) {
          forward();  // mean and rstd for the backward
          const size_t ws_bytes = kc::layer_norm_backward_workspace_bytes(rows, cols);
          DeviceBuffer ws(device_, ws_bytes);
          memory_row("layer_norm_backward", dt, shape,
                     3.0 * rows * cols * st + 3.0 * cols * 4 + 2.0 * rows * 4,
                     "3 R C " + sts + " (x, dy, dx) + 3 C 4 (w, dw, db) + 2 R 4 (mean, rstd)", [&] {
                       kc::layer_norm_backward(x.as<T>(), w.as<float>(), mean.as<float>(),
                                               rstd.as<float>(), dy.as<T>(), dx.as<T>(),
                                               dw.as<float>(), db.as<float>(), rows, cols,
                                               ws.as<void>(), ws_bytes, stream_);
                     });
        }
      }
    }

    // softmax: attention's rows (B*H*T rows of T) and the vocabulary's (B*T rows of 50304).
    for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{kBatchHeads * kSeq, kSeq},
                                     std::pair<int64_t, int64_t>{kTokens, kPaddedVocab}}) {
      if (!wanted("softmax_forward", dt)) break;
      DeviceBuffer x(device_, size_t(rows * cols) * sizeof(T)),
          y(device_, size_t(rows * cols) * sizeof(T));
      fill_uniform(device_, x.as<T>(), rows * cols, -8.0f, 8.0f, 21);
      memory_row("softmax_forward", dt, std::to_string(rows) + "x" + std::to_string(cols),
                 2.0 * rows * cols * st, "2 R C " + sts + " (x, y)",
                 [&] { kc::softmax_forward(x.as<T>(), y.as<T>(), rows, cols, stream_); });
    }

    // cross_entropy: logits [8192, 50304] of which 50257 classes, int64 targets.
    {
      const int64_t rows = kTokens, cols = kPaddedVocab, classes = kVocab;
      const bool fwd = wanted("cross_entropy_forward", dt),
                 bwd = wanted("cross_entropy_backward", dt);
      if (fwd || bwd) {
        const std::string shape = std::to_string(rows) + "x" + std::to_string(cols) + " (" +
                                  std::to_string(classes) + " classes)";
        DeviceBuffer logits(device_, size_t(rows * cols) * sizeof(T)),
            dlogits(device_, size_t(rows * cols) * sizeof(T)), targets(device_, size_t(rows) * 8),
            lse(device_, size_t(rows) * 4), loss_sum(device_, 8), count(device_, 8),
            scale(device_, 4);
        fill_uniform(device_, logits.as<T>(), rows * cols, -4.0f, 4.0f, 31);
        fill_indices(device_, targets.as<int64_t>(), rows, classes, 32);
        const float s = 1.0f / float(rows);
        rt::copy_host_to_device(device_, scale.as<float>(), &s, sizeof(s));
        kc::CrossEntropyShape shp;
        shp.rows = rows;
        shp.cols = cols;
        shp.num_classes = classes;
        auto forward = [&] {
          kc::cross_entropy_forward(logits.as<T>(), targets.as<int64_t>(), lse.as<float>(), shp,
                                    loss_sum.as<double>(), count.as<int64_t>(), stream_);
        };
        if (fwd)
          memory_row("cross_entropy_forward", dt, shape, rows * classes * st + rows * (8.0 + 4.0),
                     "R classes " + sts + " (logits) + R (8 + 4) (targets, lse)", forward);
        if (bwd) {
          forward();
          memory_row("cross_entropy_backward", dt, shape,
                     rows * classes * st + rows * cols * st + rows * (8.0 + 4.0),
                     "R classes " + sts + " (logits) + R cols " + sts +
                         " (dlogits) + R (8 + 4) (targets, lse)",
                     [&] {
                       kc::cross_entropy_backward(logits.as<T>(), targets.as<int64_t>(),
                                                  lse.as<float>(), scale.as<float>(),
                                                  dlogits.as<T>(), shp, stream_);
                     });
        }
      }
    }

    // embedding: token lookups into wte [50304, 768], int64 indices.
    {
      const int64_t n = kTokens, vocab = kPaddedVocab, cols = kChannels;
      const bool fwd = wanted("embedding_forward", dt), bwd = wanted("embedding_backward", dt);
      if (fwd || bwd) {
        const std::string shape =
            std::to_string(n) + " of " + std::to_string(vocab) + "x" + std::to_string(cols);
        DeviceBuffer weight(device_, size_t(vocab * cols) * sizeof(T)),
            out(device_, size_t(n * cols) * sizeof(T)), indices(device_, size_t(n) * 8),
            dweight(device_, size_t(vocab * cols) * 4);
        fill_uniform(device_, weight.as<T>(), vocab * cols, -0.1f, 0.1f, 41);
        fill_uniform(device_, out.as<T>(), n * cols, -1.0f, 1.0f, 42);  // dout for the backward
        fill_indices(device_, indices.as<int64_t>(), n, kVocab, 43);
        if (fwd)
          memory_row("embedding_forward", dt, shape, 2.0 * n * cols * st + n * 8.0,
                     "2 n C " + sts + " (rows read, out) + n 8 (indices)", [&] {
                       kc::embedding_forward(weight.as<T>(), indices.as<int64_t>(), out.as<T>(), n,
                                             cols, stream_);
                     });
        if (bwd) {
          fill_uniform(device_, out.as<T>(), n * cols, -1.0f, 1.0f, 42);
          const size_t ws_bytes = kc::embedding_backward_workspace_bytes(n, vocab);
          DeviceBuffer ws(device_, ws_bytes);
          memory_row("embedding_backward", dt, shape, n * cols * st + n * 8.0 + vocab * cols * 4.0,
                     "n C " + sts + " (dout) + n 8 (indices) + V C 4 (dweight, all rows)", [&] {
                       kc::embedding_backward(out.as<T>(), indices.as<int64_t>(),
                                              dweight.as<float>(), n, vocab, cols, ws.as<void>(),
                                              ws_bytes, stream_);
                     });
        }
      }
    }

    // gelu: the MLP's hidden activations [8192, 3072].
    {
      const int64_t n = kTokens * 4 * kChannels;
      const std::string shape = std::to_string(kTokens) + "x" + std::to_string(4 * kChannels);
      const bool fwd = wanted("gelu_forward", dt), bwd = wanted("gelu_backward", dt);
      if (fwd || bwd) {
        DeviceBuffer x(device_, size_t(n) * sizeof(T)), y(device_, size_t(n) * sizeof(T)),
            dy(device_, size_t(n) * sizeof(T));
        fill_uniform(device_, x.as<T>(), n, -4.0f, 4.0f, 51);
        fill_uniform(device_, dy.as<T>(), n, -1.0f, 1.0f, 52);
        if (fwd)
          memory_row("gelu_forward", dt, shape, 2.0 * n * st, "2 n " + sts + " (x, y)",
                     [&] { kc::gelu_forward(x.as<T>(), y.as<T>(), n, stream_); });
        if (bwd)
          memory_row("gelu_backward", dt, shape, 3.0 * n * st, "3 n " + sts + " (x, dy, dx)",
                     [&] { kc::gelu_backward(x.as<T>(), dy.as<T>(), y.as<T>(), n, stream_); });
      }
    }

    // dropout: the residual stream [8192, 768], p = 0.1.
    if (wanted("dropout", dt)) {
      const int64_t n = kTokens * kChannels;
      DeviceBuffer x(device_, size_t(n) * sizeof(T)), y(device_, size_t(n) * sizeof(T));
      fill_uniform(device_, x.as<T>(), n, -1.0f, 1.0f, 61);
      int64_t offset = 0;
      memory_row("dropout", dt, std::to_string(kTokens) + "x" + std::to_string(kChannels),
                 2.0 * n * st, "2 n " + sts + " (x, y); p = 0.1", [&] {
                   kc::dropout(x.as<T>(), y.as<T>(), n, 0.1f, 1234, 0, uint64_t(offset), stream_);
                   offset += n;  // a fresh mask each call, as in training
                 });
    }
  }

  // AdamW over GPT-2 124M's 148 parameter tensors (padded vocabulary), one adamw_step_multi call:
  // param, grad, exp_avg, exp_avg_sq read and param, exp_avg, exp_avg_sq written, 28 bytes each.
  void adamw() {
    if (!wanted("adamw_step_multi", "f32")) return;
    std::vector<int64_t> sizes = {kPaddedVocab * kChannels, kSeq * kChannels};  // wte, wpe
    for (int64_t l = 0; l < kLayers; ++l) {
      const int64_t c = kChannels;
      const int64_t layer[] = {c,         c,     3 * c * c, 3 * c, c * c, c,  // ln_1, attn
                               c,         c,                                  // ln_2
                               4 * c * c, 4 * c, 4 * c * c, c};               // mlp
      sizes.insert(sizes.end(), std::begin(layer), std::end(layer));
    }
    sizes.push_back(kChannels);  // ln_f
    sizes.push_back(kChannels);
    int64_t total = 0;
    for (int64_t s : sizes) total += s;
    DeviceBuffer param(device_, size_t(total) * 4), grad(device_, size_t(total) * 4),
        m(device_, size_t(total) * 4), v(device_, size_t(total) * 4);
    fill_uniform(device_, param.as<float>(), total, -0.05f, 0.05f, 71);
    fill_uniform(device_, grad.as<float>(), total, -0.01f, 0.01f, 72);
    fill_uniform(device_, m.as<float>(), total, -0.001f, 0.001f, 73);
    fill_uniform(device_, v.as<float>(), total, 0.0f, 1e-6f, 74);
    std::vector<kc::AdamWTensor> tensors;
    int64_t at = 0;
    for (int64_t s : sizes) {
      tensors.push_back({param.as<float>() + at, grad.as<float>() + at, m.as<float>() + at,
                         v.as<float>() + at, s});
      at += s;
    }
    kc::AdamWHyper h;
    h.lr = 6e-4;
    h.weight_decay = 0.1;
    h.step = 10;
    memory_row("adamw_step_multi", "f32",
               std::to_string(sizes.size()) + " tensors, " + std::to_string(total) + " params",
               28.0 * double(total), "28 N (read p, g, m, v; write p, m, v)",
               [&] { kc::adamw_step_multi(tensors.data(), int64_t(tensors.size()), h, stream_); });
  }

#if LOOM_BENCH_ATTENTION
  // Causal attention at B*H = 96, T = 1024, D = 64, against cuBLAS's batched Q K^T.
  template <typename T>
  void attention() {
    const char* dt = dtype_name<T>();
    const bool fwd = wanted("attention_forward", dt), bwd = wanted("attention_backward", dt);
    if (!fwd && !bwd) return;
    const int64_t bh = kBatchHeads, t = kSeq, d = kHeadDim;
    const int64_t n = bh * t * d;
    const cudaDataType_t type = sizeof(T) == 4 ? CUDA_R_32F : CUDA_R_16BF;
    DeviceBuffer q(device_, size_t(n) * sizeof(T)), k(device_, size_t(n) * sizeof(T)),
        v(device_, size_t(n) * sizeof(T)), out(device_, size_t(n) * sizeof(T)),
        dout(device_, size_t(n) * sizeof(T)), dq(device_, size_t(n) * sizeof(T)),
        dk(device_, size_t(n) * sizeof(T)), dv(device_, size_t(n) * sizeof(T)),
        lse(device_, size_t(bh * t) * 4), scores(device_, size_t(bh * t * t) * sizeof(T));
    fill_uniform(device_, q.as<T>(), n, -1.0f, 1.0f, 81);
    fill_uniform(device_, k.as<T>(), n, -1.0f, 1.0f, 82);
    fill_uniform(device_, v.as<T>(), n, -1.0f, 1.0f, 83);
    fill_uniform(device_, dout.as<T>(), n, -1.0f, 1.0f, 84);

    // The reference: S [T, T] = Q [T, D] K [T, D]^T for each of the BH heads (row-major; as
    // column-major, S^T = K Q^T), in full, without the causal half.
    const double ref_flop = 2.0 * double(bh) * double(t) * double(t) * double(d);
    const float one = 1.0f, zero = 0.0f;
    const double ref_ms = timer_.median_ms([&] {
      LOOM_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
          cublas_, CUBLAS_OP_T, CUBLAS_OP_N, int(t), int(t), int(d), &one, k.as<T>(), type, int(d),
          (long long)(t * d), q.as<T>(), type, int(d), (long long)(t * d), &zero, scores.as<T>(),
          type, int(t), (long long)(t * t), int(bh), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    });
    const double ref_rate = ref_flop / (ref_ms * 1e-3) / 1e12;
    const std::string shape = "BH " + std::to_string(bh) + " T " + std::to_string(t) + " D " +
                              std::to_string(d) + " causal";
    auto row = [&](const char* kernel, double ms, double flop, const std::string& note) {
      Row r;
      r.section = "attention";
      r.kernel = kernel;
      r.dtype = dt;
      r.shape = shape;
      r.unit = "TFLOP/s";
      r.ref = "cuBLAS batched QK^T";
      r.ms = ms;
      r.ref_ms = ref_ms;
      r.rate = flop / (ms * 1e-3) / 1e12;
      r.ref_rate = ref_rate;
      r.ratio = r.rate / ref_rate;
      r.note = note;
      rows_.push_back(r);
    };
    // FlashAttention's count: 2 T^2 D per matmul per head; forward 2 matmuls, backward 5; causal
    // halves both.
    const double fwd_flop = 0.5 * 2.0 * 2.0 * double(bh) * double(t) * double(t) * double(d);
    auto forward = [&] {
      kc::attention_forward(q.as<T>(), k.as<T>(), v.as<T>(), out.as<T>(), lse.as<float>(), bh, t, d,
                            true, stream_);
    };
    if (fwd) row("attention_forward", timer_.median_ms(forward), fwd_flop, "flop = 2 BH T^2 D");
    if (bwd) {
      forward();
      const size_t ws_bytes = kc::attention_backward_workspace_bytes(bh, t, d);
      DeviceBuffer ws(device_, ws_bytes);
      const double ms = timer_.median_ms([&] {
        kc::attention_backward(q.as<T>(), k.as<T>(), v.as<T>(), out.as<T>(), lse.as<float>(),
                               dout.as<T>(), dq.as<T>(), dk.as<T>(), dv.as<T>(), bh, t, d, true,
                               ws.as<void>(), ws_bytes, stream_);
      });
      row("attention_backward", ms, 2.5 * fwd_flop, "flop = 5 BH T^2 D");
    }
    // GEMM attention (Note [GEMM attention]) with the workspace for all heads in one pass, as
    // the op layer gives it at this shape; the same flop count, so the ratios compare directly.
    constexpr bool bf16 = sizeof(T) == 2;
    const size_t gemm_bytes = kc::attention_gemm_workspace_bytes(bh, t, d, bf16, true);
    DeviceBuffer gemm_ws(device_, gemm_bytes);
    auto gemm_forward = [&] {
      kc::attention_gemm_forward(q.as<T>(), k.as<T>(), v.as<T>(), out.as<T>(), lse.as<float>(), bh,
                                 t, d, true, gemm_ws.as<void>(), gemm_bytes, stream_);
    };
    const std::string gemm_note =
        "GEMM attention, workspace " + std::to_string(gemm_bytes >> 20) + " MiB; ";
    if (fwd)
      row("attention_gemm_forward", timer_.median_ms(gemm_forward), fwd_flop,
          gemm_note + "flop = 2 BH T^2 D");
    if (bwd) {
      gemm_forward();
      const double ms = timer_.median_ms([&] {
        kc::attention_gemm_backward(q.as<T>(), k.as<T>(), v.as<T>(), out.as<T>(), lse.as<float>(),
                                    dout.as<T>(), dq.as<T>(), dk.as<T>(), dv.as<T>(), bh, t, d,
                                    true, gemm_ws.as<void>(), gemm_bytes, stream_);
      });
      row("attention_gemm_backward", ms, 2.5 * fwd_flop, gemm_note + "flop = 5 BH T^2 D");
    }
  }
#endif

  const Flags& flags_;
  int device_;
  kc::Stream stream_;
  Timer timer_;
  cublasHandle_t cublas_ = nullptr;
  std::unique_ptr<DeviceBuffer> copy_src_, copy_dst_;
  std::vector<Row> rows_;
};

// ---------------------------------------------------------------- the device and the report

struct DeviceInfo {
  std::string name;
  int cc_major = 0, cc_minor = 0, sms = 0, driver = 0, runtime = 0;
  int sm_clock_khz = 0, mem_clock_khz = 0, bus_width_bits = 0;
  size_t l2_bytes = 0, memory_bytes = 0;
  double dram_gbps = 0;  // 2 (DDR) x memory clock x bus width: the data sheet's figure
};

DeviceInfo device_info(int device) {
  DeviceInfo d;
  cudaDeviceProp prop;
  LOOM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  d.name = prop.name;
  d.cc_major = prop.major;
  d.cc_minor = prop.minor;
  d.sms = prop.multiProcessorCount;
  d.bus_width_bits = prop.memoryBusWidth;
  d.l2_bytes = size_t(prop.l2CacheSize);
  d.memory_bytes = prop.totalGlobalMem;
  // CUDA 13 dropped the clocks from cudaDeviceProp; the attributes remain (peak clocks, kHz).
  LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&d.sm_clock_khz, cudaDevAttrClockRate, device));
  LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&d.mem_clock_khz, cudaDevAttrMemoryClockRate, device));
  LOOM_CUDA_CHECK(cudaDriverGetVersion(&d.driver));
  LOOM_CUDA_CHECK(cudaRuntimeGetVersion(&d.runtime));
  d.dram_gbps = 2.0 * double(d.mem_clock_khz) * 1e3 * double(d.bus_width_bits) / 8.0 / 1e9;
  return d;
}

std::string version(int v) {
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

void print_json(const DeviceInfo& d, const Flags& f, const std::vector<Row>& rows) {
  std::printf(
      "{\"device\": {\"name\": %s, \"compute_capability\": \"%d.%d\", \"sms\": %d, "
      "\"driver\": \"%s\", \"runtime\": \"%s\", \"sm_clock_mhz\": %d, \"mem_clock_mhz\": %d, "
      "\"bus_width_bits\": %d, \"l2_bytes\": %zu, \"memory_bytes\": %zu, "
      "\"dram_gbps_datasheet\": %.1f},\n",
      json_string(d.name).c_str(), d.cc_major, d.cc_minor, d.sms, version(d.driver).c_str(),
      version(d.runtime).c_str(), d.sm_clock_khz / 1000, d.mem_clock_khz / 1000, d.bus_width_bits,
      d.l2_bytes, d.memory_bytes, d.dram_gbps);
  std::printf(
      " \"config\": {\"iters\": %ld, \"warmup\": %ld, \"l2_flush\": %s, \"attention\": %s},\n",
      long(f.iters), long(f.warmup), f.l2_flush ? "true" : "false",
      LOOM_BENCH_ATTENTION ? "true" : "false");
  std::printf(" \"results\": [");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::printf(
        "%s\n  {\"section\": %s, \"kernel\": %s, \"dtype\": %s, \"shape\": %s, \"ms\": %.5f, "
        "\"rate\": %.3f, \"unit\": %s, \"ref\": %s, \"ref_ms\": %.5f, \"ref_rate\": %.3f, "
        "\"ratio\": %.4f, \"note\": %s}",
        i ? "," : "", json_string(r.section).c_str(), json_string(r.kernel).c_str(),
        json_string(r.dtype).c_str(), json_string(r.shape).c_str(), r.ms, r.rate,
        json_string(r.unit).c_str(), json_string(r.ref).c_str(), r.ref_ms, r.ref_rate, r.ratio,
        json_string(r.note).c_str());
  }
  std::printf("\n]}\n");
}

void print_table(const DeviceInfo& d, const Flags& f, const std::vector<Row>& rows) {
  std::printf("loom-bench-cuda: %s (sm_%d%d, %d SMs, %.1f GiB), driver %s, runtime %s\n",
              d.name.c_str(), d.cc_major, d.cc_minor, d.sms, double(d.memory_bytes) / (1 << 30),
              version(d.driver).c_str(), version(d.runtime).c_str());
  std::printf(
      "clocks (peak, device attributes): SM %d MHz, memory %d MHz x %d bits = %.0f GB/s data "
      "sheet; L2 %.0f MiB\n",
      d.sm_clock_khz / 1000, d.mem_clock_khz / 1000, d.bus_width_bits, d.dram_gbps,
      double(d.l2_bytes) / (1 << 20));
  std::printf("median of %ld after %ld warm-up, L2 flushed before each timed call: %s%s\n",
              long(f.iters), long(f.warmup), f.l2_flush ? "yes" : "no",
              LOOM_BENCH_ATTENTION ? "" : "; attention not built (no kernels/cuda/attention.h)");
  std::string section;
  for (const Row& r : rows) {
    if (r.section != section) {
      section = r.section;
      std::printf("\n%-24s %-5s %-30s %10s %9s %-20s %9s %7s  %s\n", r.section.c_str(), "dtype",
                  "shape", "ms", r.unit.c_str(), "reference", r.unit.c_str(), "ratio", "note");
    }
    std::printf("%-24s %-5s %-30s %10.4f %9.2f %-20s %9.2f %7.3f  %s\n", r.kernel.c_str(),
                r.dtype.c_str(), r.shape.c_str(), r.ms, r.rate, r.ref.c_str(), r.ref_rate, r.ratio,
                r.note.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Flags f = parse(argc, argv);
    const int count = rt::device_count();
    if (count == 0) {
      // CI builds this and never runs it; a machine without a GPU is not a failure.
      const std::string why = rt::no_gpu_reason();
      if (f.json)
        std::printf("{\"skipped\": true, \"reason\": %s}\n", json_string(why).c_str());
      else
        std::printf("loom-bench-cuda: skipped, no GPU to run on (%s)\n", why.c_str());
      return 0;
    }
    LOOM_CHECK(f.device < count, "loom-bench-cuda: --device ", f.device, " but only ", count,
               " GPU(s)");
    const int device = int(f.device);
    const DeviceInfo info = device_info(device);
    // nvbench's flush: at least the L2's size (fall back to 64 MiB if the device reports none).
    Bench bench(f, device, info.l2_bytes > 0 ? info.l2_bytes : size_t(64) << 20);
    bench.run_all();
    if (f.json)
      print_json(info, f, bench.rows());
    else
      print_table(info, f, bench.rows());
    return 0;
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
