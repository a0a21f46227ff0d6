// The CUDA layer_norm, softmax, dropout and GELU kernels against their CPU twins
// (kernels/cpu/{layer_norm,softmax,dropout,gelu}.h): the same random inputs (fixed seeds) through
// both, every output element compared. Shapes are odd on purpose: 1, 3, 17, 127, 769, 1025, 3001
// columns (no multiple of a warp or a 16-byte vector), besides the vector-friendly 32, 768, 1024,
// 4096 and a 50304-wide vocabulary row; rows past the grid caps; pointers off the 16-byte boundary
// (the scalar paths). Skips without a GPU, and when loom was built without CUDA.
//
// Tolerance.
// - f32: both sides evaluate the same f32 formula and differ only in the order of additions (and
//   in exp, which is within ~2 ulp on each side, and in FMA contraction). Every element is compared
//   with 1e-5 times the sum of the absolute values of the terms that make it (computed here in
//   f64 from the CPU's values): f32 rounding grows with that sum, and it stays meaningful where
//   terms cancel to nearly zero. For softmax's output, whose terms are all positive, that is 1e-5
//   relative.
// - bf16: the reference is the CPU f32 kernel on the bf16-rounded inputs, its result rounded to
//   bf16 (weights, biases and statistics stay f32). The GPU rounds its own f32 result once. Two
//   f32 values within the f32 tolerance above may round to neighbouring bf16 values when they
//   straddle a rounding boundary, so the bound is one bf16 step plus the f32 tolerance. A bf16
//   step is at most 2^-7 of the value (8 significant bits), hence
//   |got - want| <= 2^-7 * max(|got|, |want|) + 1e-5 * sum|terms|.
// - Exact: dropout (the mask and the f32 multiply are the CPU's, bit for bit), -inf entries
//   (exactly 0 on both sides) and all -inf softmax rows (NaN on both sides), and determinism
//   (two runs on one GPU compared bit for bit).
// On a mismatch the first few failing elements are printed with (row, col), both values and the
// bound; SCOPED_TRACE names the kernel, dtype, shape and options.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "kernels/cpu/dropout.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/layer_norm.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cuda/runtime.h"
#include "kernels/numeric.h"
#include "testing/device_buffer.h"

#if LOOM_WITH_CUDA
#include "kernels/cuda/dropout.h"
#include "kernels/cuda/gelu.h"
#include "kernels/cuda/layer_norm.h"
#include "kernels/cuda/softmax.h"
#endif

namespace loom::kernels {
namespace {

#if !LOOM_WITH_CUDA

TEST(CudaNorm, NeedsCuda) {
  GTEST_SKIP() << "loom was built without CUDA (LOOM_WITH_CUDA=0): no CUDA kernels to test";
}

#else

constexpr cuda::Stream kStream = nullptr;  // the legacy default stream: ordered with the copies
constexpr double kRtol = 1e-5;
constexpr float kEps = 1e-5f;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kTiny = std::numeric_limits<float>::min();  // the smallest normal f32

// ---------------------------------------------------------------- dtypes

template <typename T>
struct DType;
template <>
struct DType<float> {
  static constexpr const char* kName = "f32";
  static constexpr double kStep = 0.0;  // no rounding after the f32 result
};
template <>
struct DType<BFloat16> {
  static constexpr const char* kName = "bf16";
  static constexpr double kStep = 1.0 / 128.0;  // one bf16 step relative to the value, at most
};

float to_f32(float v) { return v; }
float to_f32(BFloat16 v) { return bf16_to_float(v); }
template <typename T>
T from_f32(float v);
template <>
float from_f32<float>(float v) {
  return v;
}
template <>
BFloat16 from_f32<BFloat16>(float v) {
  return float_to_bf16(v);
}

// Host values as the device holds them in T: unchanged for f32, rounded for bf16.
template <typename T>
std::vector<float> as_stored(std::vector<float> v) {
  for (float& e : v) e = to_f32(from_f32<T>(e));
  return v;
}

std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> value(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = value(gen);
  return v;
}

// ---------------------------------------------------------------- device memory

using Buffer = ::loom::testing::DeviceBuffer;

// n elements of T in device memory, starting `offset` elements past a 256-byte aligned
// allocation (offset 1 puts every row off the 16-byte boundary: the kernels' scalar paths).
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n, size_t offset = 0)
      : n_(n), offset_(offset), buf_((n + offset) * sizeof(T)) {}
  explicit DeviceArray(const std::vector<float>& v, size_t offset = 0)
      : DeviceArray(v.size(), offset) {
    upload(v);
  }
  T* ptr() const { return static_cast<T*>(buf_.get()) + offset_; }
  size_t size() const { return n_; }
  void upload(const std::vector<float>& v) {
    ASSERT_EQ(v.size(), n_);
    std::vector<T> host(n_);
    for (size_t i = 0; i < n_; ++i) host[i] = from_f32<T>(v[i]);
    if (n_ > 0) cuda_rt::copy_host_to_device(0, ptr(), host.data(), n_ * sizeof(T));
  }
  // Every byte 0xff: NaN as f32 and as bf16, so an element a kernel forgot to write fails every
  // comparison.
  void poison() {
    if (n_ > 0) cuda_rt::memset_device(0, ptr(), 0xff, n_ * sizeof(T));
  }
  std::vector<float> read() const {
    std::vector<T> host(n_);
    if (n_ > 0) cuda_rt::copy_device_to_host(0, host.data(), ptr(), n_ * sizeof(T));
    std::vector<float> v(n_);
    for (size_t i = 0; i < n_; ++i) v[i] = to_f32(host[i]);
    return v;
  }

 private:
  size_t n_, offset_;
  Buffer buf_;
};

// ---------------------------------------------------------------- comparisons

// Every element: |got - want| <= rtol * scale[i] + step * max(|got|, |want|) + kTiny. NaN must
// meet NaN; equal values (zeros, infinities) always pass. kTiny, the smallest normal f32, forgives
// subnormal results that one side flushes to zero (the CPU's vectorised exp returns 0 below about
// e^-88 where expf returns a subnormal). cols > 0 prints indices as (row, col).
void expect_close_each(const std::vector<float>& got, const std::vector<float>& want,
                       const std::vector<double>& scale, double step, int64_t cols,
                       const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_EQ(scale.size(), want.size()) << what;
  size_t failures = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    bool ok;
    double bound = 0.0;
    if (std::isnan(w) || std::isnan(g)) {
      ok = std::isnan(w) && std::isnan(g);
    } else if (g == w) {
      ok = true;
    } else {
      bound = kRtol * scale[i] + step * std::max(std::fabs(g), std::fabs(w)) + kTiny;
      ok = std::fabs(g - w) <= bound;
    }
    if (!ok && failures++ < 5) {
      ADD_FAILURE() << what << " element " << i << " (row " << (cols > 0 ? int64_t(i) / cols : 0)
                    << ", col " << (cols > 0 ? int64_t(i) % cols : int64_t(i)) << "): cuda "
                    << got[i] << " vs cpu " << want[i] << ", |diff| " << std::fabs(g - w)
                    << " > bound " << bound << " (scale " << scale[i] << ")";
    }
  }
  EXPECT_EQ(failures, 0u) << what << ": " << failures << " of " << got.size()
                          << " elements outside the bound";
}

// Bit-for-bit equality of two results (NaNs of one pattern included).
void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b,
                      const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t failures = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (float_bits(a[i]) != float_bits(b[i]) && failures++ < 5)
      ADD_FAILURE() << what << " element " << i << ": " << a[i] << " (0x" << std::hex
                    << float_bits(a[i]) << ") vs " << b[i] << " (0x" << float_bits(b[i]) << std::dec
                    << ")";
  EXPECT_EQ(failures, 0u) << what << ": " << failures << " of " << a.size() << " elements differ";
}

// The CPU's f32 result as the reference for T: rounded to bf16 for bf16.
template <typename T>
std::vector<float> reference(const std::vector<float>& f32) {
  return as_stored<T>(f32);
}

std::string loom_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no loom::Error thrown)";
}

// ---------------------------------------------------------------- layer norm

struct LnOptions {
  bool weight = true, bias = true;
  bool dx = true, dweight = true, dbias = true;
  size_t offset = 0;  // elements past the allocation's start, for every array
};

std::string describe(int64_t rows, int64_t cols, const LnOptions& o) {
  return ::testing::PrintToString(rows) + " x " + ::testing::PrintToString(cols) +
         (o.weight ? " weight" : " no-weight") + (o.bias ? " bias" : " no-bias") +
         (o.dx ? "" : " no-dx") + (o.dweight ? "" : " no-dweight") + (o.dbias ? "" : " no-dbias") +
         " offset " + ::testing::PrintToString(o.offset);
}

// Layer norm forward and backward of one shape on T, against the CPU f32 kernel on the values
// the device holds. The backward takes the CPU forward's mean and rstd, so each half is checked
// alone.
template <typename T>
void check_layer_norm(int64_t rows, int64_t cols, const LnOptions& o, uint64_t seed) {
  SCOPED_TRACE(std::string("layer_norm ") + DType<T>::kName + " " + describe(rows, cols, o));
  const size_t n = size_t(rows * cols), nc = size_t(cols), nr = size_t(rows);
  const std::vector<float> x = as_stored<T>(random_floats(n, seed, -2.0f, 3.0f));
  const std::vector<float> dy = as_stored<T>(random_floats(n, seed + 1));
  const std::vector<float> w = random_floats(nc, seed + 2, 0.5f, 1.5f);
  const std::vector<float> b = random_floats(nc, seed + 3);
  const float* wp = o.weight ? w.data() : nullptr;
  const float* bp = o.bias ? b.data() : nullptr;

  // CPU, f32.
  std::vector<float> y(n), mean(nr), rstd(nr), dx(n), dw(nc), db(nc);
  cpu::layer_norm_forward(x.data(), wp, bp, y.data(), mean.data(), rstd.data(), rows, cols, kEps);
  cpu::layer_norm_backward(x.data(), wp, mean.data(), rstd.data(), dy.data(), dx.data(), dw.data(),
                           db.data(), rows, cols);

  // CUDA.
  DeviceArray<T> d_x(x, o.offset), d_y(n, o.offset), d_dy(dy, o.offset), d_dx(n, o.offset);
  DeviceArray<float> d_w(w, o.offset), d_b(b, o.offset), d_mean(nr), d_rstd(nr);
  DeviceArray<float> d_mean_cpu(mean), d_rstd_cpu(rstd), d_dw(nc), d_db(nc);
  for (auto* a : {&d_y, &d_dx}) a->poison();
  for (auto* a : {&d_mean, &d_rstd, &d_dw, &d_db}) a->poison();
  cuda::layer_norm_forward(d_x.ptr(), o.weight ? d_w.ptr() : nullptr, o.bias ? d_b.ptr() : nullptr,
                           d_y.ptr(), d_mean.ptr(), d_rstd.ptr(), rows, cols, kEps, kStream);
  const size_t ws_bytes = cuda::layer_norm_backward_workspace_bytes(rows, cols);
  Buffer ws(ws_bytes);
  cuda::layer_norm_backward(d_x.ptr(), o.weight ? d_w.ptr() : nullptr, d_mean_cpu.ptr(),
                            d_rstd_cpu.ptr(), d_dy.ptr(), o.dx ? d_dx.ptr() : nullptr,
                            o.dweight ? d_dw.ptr() : nullptr, o.dbias ? d_db.ptr() : nullptr, rows,
                            cols, ws.get(), ws_bytes, kStream);
  cuda_rt::synchronize(0);

  // Scales: the sum of |terms| of each result (see the top of the file).
  std::vector<double> s_mean(nr), s_rstd(nr), s_y(n), s_dx(n), s_dw(nc, 0.0), s_db(nc, 0.0);
  for (size_t r = 0; r < nr; ++r) {
    const double m = mean[r], s = rstd[r];
    double abs_x = 0.0, abs_g = 0.0, abs_gx = 0.0;
    for (size_t c = 0; c < nc; ++c) {
      const size_t i = r * nc + c;
      const double wc = o.weight ? w[c] : 1.0, g = double(dy[i]) * wc;
      abs_x += std::fabs(x[i]);
      abs_g += std::fabs(g);
      abs_gx += std::fabs(g * (x[i] - m));
      s_y[i] =
          (std::fabs(x[i]) + std::fabs(m)) * s * std::fabs(wc) + (o.bias ? std::fabs(b[c]) : 0);
      s_dw[c] += std::fabs(dy[i] * (x[i] - m) * s);
      s_db[c] += std::fabs(dy[i]);
    }
    s_mean[r] = abs_x / double(cols);
    s_rstd[r] = s;
    for (size_t c = 0; c < nc; ++c) {
      const size_t i = r * nc + c;
      const double wc = o.weight ? w[c] : 1.0, g = double(dy[i]) * wc;
      s_dx[i] = s * (std::fabs(g) + abs_g / double(cols) +
                     std::fabs(x[i] - m) * s * s * abs_gx / double(cols));
    }
  }
  const double step = DType<T>::kStep;
  expect_close_each(d_mean.read(), mean, s_mean, 0.0, 0, "mean");
  expect_close_each(d_rstd.read(), rstd, s_rstd, 0.0, 0, "rstd");
  expect_close_each(d_y.read(), reference<T>(y), s_y, step, cols, "y");
  if (o.dx) expect_close_each(d_dx.read(), reference<T>(dx), s_dx, step, cols, "dx");
  if (o.dweight) expect_close_each(d_dw.read(), dw, s_dw, 0.0, 0, "dweight");
  if (o.dbias) expect_close_each(d_db.read(), db, s_db, 0.0, 0, "dbias");
}

// Rows / cols: odd sizes on both row paths (a warp per row up to 1024 columns, a block beyond),
// vector-friendly ones (f32: multiples of 4; bf16: of 8) and not.
const std::pair<int64_t, int64_t> kLnShapes[] = {
    {1, 1},    {3, 3},    {17, 17},  {5, 4},     {7, 8},    {9, 32},
    {64, 127}, {33, 768}, {13, 769}, {17, 1024}, {3, 1025}, {11, 1028},
    {5, 1536}, {4, 3001}, {2, 4096}, {129, 64},  {1, 8192},
};

template <typename T>
void check_layer_norm_shapes() {
  uint64_t seed = 100;
  int k = 0;
  for (const auto& [rows, cols] : kLnShapes) {
    LnOptions o;
    o.weight = k % 4 != 1;  // every weight / bias combination comes round
    o.bias = k % 4 != 2 && k % 4 != 1;
    ++k;
    check_layer_norm<T>(rows, cols, o, seed += 10);
  }
}

TEST(CudaLayerNorm, ForwardBackwardF32) {
  LOOM_SKIP_WITHOUT_CUDA();
  check_layer_norm_shapes<float>();
}

TEST(CudaLayerNorm, ForwardBackwardBf16) {
  LOOM_SKIP_WITHOUT_CUDA();
  check_layer_norm_shapes<BFloat16>();
}

// Pointers off the 16-byte boundary take the scalar paths even when cols would allow vectors;
// 16 bytes off keeps the vector paths.
TEST(CudaLayerNorm, MisalignedPointers) {
  LOOM_SKIP_WITHOUT_CUDA();
  for (size_t offset : {1, 2, 3}) {
    LnOptions o;
    o.offset = offset;
    check_layer_norm<float>(9, 768, o, 7);
    check_layer_norm<float>(3, 2048, o, 8);
    check_layer_norm<BFloat16>(9, 768, o, 9);
    check_layer_norm<BFloat16>(3, 2048, o, 10);
  }
  LnOptions o;
  o.offset = 4;  // 16 bytes of f32
  check_layer_norm<float>(9, 768, o, 11);
  o.offset = 8;  // 16 bytes of bf16
  check_layer_norm<BFloat16>(3, 2048, o, 12);
}

// Each gradient may be null alone or with others; the rest are still right.
TEST(CudaLayerNorm, NullGradients) {
  LOOM_SKIP_WITHOUT_CUDA();
  for (int mask = 0; mask < 8; ++mask) {
    LnOptions o;
    o.dx = mask & 1;
    o.dweight = mask & 2;
    o.dbias = mask & 4;
    check_layer_norm<float>(37, 100, o, 20 + mask);
    check_layer_norm<BFloat16>(5, 1100, o, 30 + mask);
  }
}

// Many rows: more than kMaxChunks * 32, so chunks grow past 32 rows; and enough for the
// gradient partials to have hundreds of chunks.
TEST(CudaLayerNorm, ManyRows) {
  LOOM_SKIP_WITHOUT_CUDA();
  check_layer_norm<float>(40001, 65, LnOptions{}, 40);
  check_layer_norm<float>(5000, 768, LnOptions{}, 41);
  check_layer_norm<BFloat16>(4099, 768, LnOptions{}, 42);
}

// rows == 0: the parameter gradients are zeros (the CPU's empty sums), with no workspace;
// cols == 0 or rows == 0 elsewhere launches nothing.
TEST(CudaLayerNorm, EmptyShapes) {
  LOOM_SKIP_WITHOUT_CUDA();
  EXPECT_EQ(cuda::layer_norm_backward_workspace_bytes(0, 5), 0u);
  DeviceArray<float> dw(5), db(5), w(std::vector<float>(5, 1.0f));
  dw.poison();
  db.poison();
  cuda::layer_norm_backward(static_cast<const float*>(nullptr), w.ptr(), nullptr, nullptr, nullptr,
                            nullptr, dw.ptr(), db.ptr(), 0, 5, nullptr, 0, kStream);
  expect_same_bits(dw.read(), std::vector<float>(5, 0.0f), "dweight of 0 rows");
  expect_same_bits(db.read(), std::vector<float>(5, 0.0f), "dbias of 0 rows");
  // Nothing to do, nothing launched (a zero grid would be a launch error).
  cuda::layer_norm_forward(static_cast<const float*>(nullptr), nullptr, nullptr, nullptr, nullptr,
                           nullptr, 0, 5, kEps, kStream);
  cuda::layer_norm_forward(static_cast<const BFloat16*>(nullptr), nullptr, nullptr, nullptr,
                           nullptr, nullptr, 4, 0, kEps, kStream);
  cuda::layer_norm_backward(static_cast<const float*>(nullptr), nullptr, nullptr, nullptr, nullptr,
                            nullptr, dw.ptr(), nullptr, 4, 0, nullptr, 0, kStream);
  cuda_rt::synchronize(0);
}

// y == x is allowed in the forward.
TEST(CudaLayerNorm, InPlaceForward) {
  LOOM_SKIP_WITHOUT_CUDA();
  for (int64_t cols : {17, 768, 3001}) {
    SCOPED_TRACE(::testing::Message() << "cols " << cols);
    const int64_t rows = 6;
    const std::vector<float> x = random_floats(size_t(rows * cols), 50);
    const std::vector<float> w = random_floats(size_t(cols), 51),
                             b = random_floats(size_t(cols), 52);
    std::vector<float> y(x.size()), mean(rows), rstd(rows);
    cpu::layer_norm_forward(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), rows,
                            cols, kEps);
    DeviceArray<float> d_x(x), d_w(w), d_b(b), d_mean(static_cast<size_t>(rows)),
        d_rstd(static_cast<size_t>(rows));
    cuda::layer_norm_forward(d_x.ptr(), d_w.ptr(), d_b.ptr(), d_x.ptr(), d_mean.ptr(), d_rstd.ptr(),
                             rows, cols, kEps, kStream);
    std::vector<double> scale(y.size());
    for (size_t i = 0; i < y.size(); ++i) {
      const size_t r = i / size_t(cols), c = i % size_t(cols);
      scale[i] =
          (std::fabs(x[i]) + std::fabs(mean[r])) * rstd[r] * std::fabs(w[c]) + std::fabs(b[c]);
    }
    expect_close_each(d_x.read(), y, scale, 0.0, cols, "in-place y");
  }
}

// Two runs on one GPU agree bit for bit: every output of the forward and the backward.
template <typename T>
void check_layer_norm_determinism(int64_t rows, int64_t cols) {
  SCOPED_TRACE(std::string("layer_norm determinism ") + DType<T>::kName + " " +
               describe(rows, cols, LnOptions{}));
  const size_t n = size_t(rows * cols), nc = size_t(cols), nr = size_t(rows);
  DeviceArray<T> x(random_floats(n, 60, -2.0f, 3.0f)), dy(random_floats(n, 61)), y(n), dx(n);
  DeviceArray<float> w(random_floats(nc, 62)), b(random_floats(nc, 63)), mean(nr), rstd(nr), dw(nc),
      db(nc);
  const size_t ws_bytes = cuda::layer_norm_backward_workspace_bytes(rows, cols);
  Buffer ws(ws_bytes);
  std::vector<std::vector<float> > first;
  for (int run = 0; run < 2; ++run) {
    for (auto* a : {&y, &dx}) a->poison();
    for (auto* a : {&mean, &rstd, &dw, &db}) a->poison();
    cuda::layer_norm_forward(x.ptr(), w.ptr(), b.ptr(), y.ptr(), mean.ptr(), rstd.ptr(), rows, cols,
                             kEps, kStream);
    cuda::layer_norm_backward(x.ptr(), w.ptr(), mean.ptr(), rstd.ptr(), dy.ptr(), dx.ptr(),
                              dw.ptr(), db.ptr(), rows, cols, ws.get(), ws_bytes, kStream);
    std::vector<std::vector<float> > out = {y.read(),  mean.read(), rstd.read(),
                                            dx.read(), dw.read(),   db.read()};
    if (run == 0) {
      first = std::move(out);
      continue;
    }
    const char* names[] = {"y", "mean", "rstd", "dx", "dweight", "dbias"};
    for (size_t k = 0; k < out.size(); ++k) expect_same_bits(out[k], first[k], names[k]);
  }
}

TEST(CudaLayerNorm, Deterministic) {
  LOOM_SKIP_WITHOUT_CUDA();
  check_layer_norm_determinism<float>(4096, 768);
  check_layer_norm_determinism<float>(40001, 33);
  check_layer_norm_determinism<BFloat16>(1000, 3001);
}

TEST(CudaLayerNorm, BadArguments) {
  LOOM_SKIP_WITHOUT_CUDA();
  const int64_t rows = 100, cols = 64;
  const size_t n = size_t(rows * cols);
  DeviceArray<float> x(random_floats(n, 70)), dy(random_floats(n, 71)), dx(n), y(n);
  DeviceArray<float> mean(static_cast<size_t>(rows)), rstd(static_cast<size_t>(rows)),
      dw(static_cast<size_t>(cols)), db(static_cast<size_t>(cols));
  const size_t need = cuda::layer_norm_backward_workspace_bytes(rows, cols);
  ASSERT_GT(need, 0u);
  Buffer ws(need);
  cuda::layer_norm_forward(x.ptr(), nullptr, nullptr, y.ptr(), mean.ptr(), rstd.ptr(), rows, cols,
                           kEps, kStream);

  std::string msg = loom_error_of([&] {
    cuda::layer_norm_backward(x.ptr(), nullptr, mean.ptr(), rstd.ptr(), dy.ptr(), dx.ptr(),
                              dw.ptr(), db.ptr(), rows, cols, ws.get(), need - 4, kStream);
  });
  EXPECT_NE(msg.find("workspace"), std::string::npos) << msg;
  EXPECT_NE(msg.find("too small"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(need)), std::string::npos) << msg;

  msg = loom_error_of([&] {
    cuda::layer_norm_backward(x.ptr(), nullptr, mean.ptr(), rstd.ptr(), dy.ptr(), dx.ptr(), nullptr,
                              db.ptr(), rows, cols, nullptr, need, kStream);
  });
  EXPECT_NE(msg.find("workspace is null"), std::string::npos) << msg;

  msg = loom_error_of([&] {
    cuda::layer_norm_forward(x.ptr(), nullptr, nullptr, y.ptr(), nullptr, rstd.ptr(), rows, cols,
                             kEps, kStream);
  });
  EXPECT_NE(msg.find("mean and rstd must not be null"), std::string::npos) << msg;

  // Without parameter gradients no workspace is needed.
  cuda::layer_norm_backward(x.ptr(), nullptr, mean.ptr(), rstd.ptr(), dy.ptr(), dx.ptr(), nullptr,
                            nullptr, rows, cols, nullptr, 0, kStream);
  cuda_rt::synchronize(0);
}

// ---------------------------------------------------------------- softmax

// Softmax forward and backward of one shape on T from given inputs (the device's values), against
// the CPU f32 kernel. The backward takes the CPU forward's y as the device holds it.
template <typename T>
void check_softmax(int64_t rows, int64_t cols, std::vector<float> x, size_t offset, uint64_t seed) {
  SCOPED_TRACE(std::string("softmax ") + DType<T>::kName + " " + ::testing::PrintToString(rows) +
               " x " + ::testing::PrintToString(cols) + " offset " +
               ::testing::PrintToString(offset));
  const size_t n = size_t(rows * cols), nc = size_t(cols);
  x = as_stored<T>(std::move(x));
  const std::vector<float> dy = as_stored<T>(random_floats(n, seed));
  std::vector<float> y(n), dx(n);
  cpu::softmax_forward(x.data(), y.data(), rows, cols);
  const std::vector<float> y_in = as_stored<T>(y);  // the backward's input, as the device holds it
  cpu::softmax_backward(y_in.data(), dy.data(), dx.data(), rows, cols);

  DeviceArray<T> d_x(x, offset), d_y(n, offset), d_y_in(y_in, offset), d_dy(dy, offset),
      d_dx(n, offset);
  d_y.poison();
  d_dx.poison();
  cuda::softmax_forward(d_x.ptr(), d_y.ptr(), rows, cols, kStream);
  cuda::softmax_backward(d_y_in.ptr(), d_dy.ptr(), d_dx.ptr(), rows, cols, kStream);
  cuda_rt::synchronize(0);

  std::vector<double> s_y(n), s_dx(n);
  for (size_t r = 0; r < size_t(rows); ++r) {
    double abs_dot = 0.0;
    for (size_t c = 0; c < nc; ++c) abs_dot += std::fabs(double(y_in[r * nc + c]) * dy[r * nc + c]);
    for (size_t c = 0; c < nc; ++c) {
      const size_t i = r * nc + c;
      s_y[i] = std::fabs(y[i]);
      s_dx[i] = std::fabs(y_in[i]) * (std::fabs(dy[i]) + abs_dot);
    }
  }
  const double step = DType<T>::kStep;
  expect_close_each(d_y.read(), reference<T>(y), s_y, step, cols, "y");
  expect_close_each(d_dx.read(), reference<T>(dx), s_dx, step, cols, "dx");
}

const std::pair<int64_t, int64_t> kSoftmaxShapes[] = {
    {1, 1},    {3, 3},     {17, 17},  {5, 4},     {7, 8},    {9, 32},   {64, 127}, {33, 768},
    {13, 769}, {17, 1024}, {3, 1025}, {11, 1028}, {4, 3001}, {2, 4096}, {129, 64},
};

template <typename T>
void check_softmax_shapes() {
  uint64_t seed = 200;
  for (const auto& [rows, cols] : kSoftmaxShapes) {
    seed += 10;
    check_softmax<T>(rows, cols, random_floats(size_t(rows * cols), seed, -4.0f, 4.0f), 0,
                     seed + 1);
    // A wide range: most exps tiny (down to e^-60, still normal floats), one term dominating.
    check_softmax<T>(rows, cols, random_floats(size_t(rows * cols), seed + 2, -30.0f, 30.0f), 0,
                     seed + 3);
  }
}

TEST(CudaSoftmax, ForwardBackwardF32) {
  LOOM_SKIP_WITHOUT_CUDA();
  check_softmax_shapes<float>();
}

TEST(CudaSoftmax, ForwardBackwardBf16) {
  LOOM_SKIP_WITHOUT_CUDA();
  check_softmax_shapes<BFloat16>();
}

// GPT-2's padded vocabulary: 50304-wide rows, one block per row.
TEST(CudaSoftmax, VocabularyRows) {
  LOOM_SKIP_WITHOUT_CUDA();
  const int64_t rows = 6, cols = 50304;
  check_softmax<float>(rows, cols, random_floats(size_t(rows * cols), 300, -8.0f, 8.0f), 0, 301);
  check_softmax<BFloat16>(rows, cols, random_floats(size_t(rows * cols), 302, -8.0f, 8.0f), 0, 303);
  check_softmax<float>(rows, cols - 1, random_floats(size_t(rows * (cols - 1)), 304), 0, 305);
}

TEST(CudaSoftmax, MisalignedPointers) {
  LOOM_SKIP_WITHOUT_CUDA();
  for (size_t offset : {1, 2, 3, 4, 8}) {
    check_softmax<float>(9, 768, random_floats(9 * 768, 310 + offset), offset, 320 + offset);
    check_softmax<float>(3, 2048, random_floats(3 * 2048, 330 + offset), offset, 340 + offset);
    check_softmax<BFloat16>(9, 768, random_floats(9 * 768, 350 + offset), offset, 360 + offset);
    check_softmax<BFloat16>(3, 2048, random_floats(3 * 2048, 370 + offset), offset, 380 + offset);
  }
}

// -inf entries (masked attention scores) give exactly 0; a row of only -inf gives NaN, as on the
// CPU (its max is -inf and -inf - -inf is NaN); a row with one finite entry gives 1 there.
template <typename T>
void check_softmax_negative_infinity(int64_t cols) {
  const int64_t rows = 6;
  std::vector<float> x = random_floats(size_t(rows * cols), 400 + uint64_t(cols), -4.0f, 4.0f);
  std::mt19937_64 gen(401);
  for (float& v : x)
    if (gen() % 4 == 0) v = -kInf;
  for (int64_t c = 0; c < cols; ++c) x[size_t(1 * cols + c)] = -kInf;  // row 1: all -inf
  for (int64_t c = 0; c < cols; ++c)                                   // row 2: one finite entry
    x[size_t(2 * cols + c)] = c == cols / 2 ? 0.5f : -kInf;
  check_softmax<T>(rows, cols, x, 0, 402);
}

TEST(CudaSoftmax, NegativeInfinity) {
  LOOM_SKIP_WITHOUT_CUDA();
  for (int64_t cols : {1, 3, 32, 769, 1024, 3001, 4096}) {
    SCOPED_TRACE(::testing::Message() << "cols " << cols);
    check_softmax_negative_infinity<float>(cols);
    check_softmax_negative_infinity<BFloat16>(cols);
  }
}

// y == x is allowed in the forward.
TEST(CudaSoftmax, InPlaceForward) {
  LOOM_SKIP_WITHOUT_CUDA();
  for (int64_t cols : {17, 768, 3001}) {
    SCOPED_TRACE(::testing::Message() << "cols " << cols);
    const int64_t rows = 5;
    const std::vector<float> x = random_floats(size_t(rows * cols), 410, -4.0f, 4.0f);
    std::vector<float> y(x.size());
    cpu::softmax_forward(x.data(), y.data(), rows, cols);
    DeviceArray<float> d_x(x);
    cuda::softmax_forward(d_x.ptr(), d_x.ptr(), rows, cols, kStream);
    std::vector<double> scale(y.size());
    for (size_t i = 0; i < y.size(); ++i) scale[i] = std::fabs(y[i]);
    expect_close_each(d_x.read(), y, scale, 0.0, cols, "in-place y");
  }
}

TEST(CudaSoftmax, Deterministic) {
  LOOM_SKIP_WITHOUT_CUDA();
  for (int64_t cols : {768, 50304}) {
    SCOPED_TRACE(::testing::Message() << "cols " << cols);
    const int64_t rows = 64;
    const size_t n = size_t(rows * cols);
    DeviceArray<float> x(random_floats(n, 420, -8.0f, 8.0f)), dy(random_floats(n, 421)), y(n),
        dx(n);
    std::vector<float> first_y, first_dx;
    for (int run = 0; run < 2; ++run) {
      y.poison();
      dx.poison();
      cuda::softmax_forward(x.ptr(), y.ptr(), rows, cols, kStream);
      cuda::softmax_backward(y.ptr(), dy.ptr(), dx.ptr(), rows, cols, kStream);
      if (run == 0) {
        first_y = y.read();
        first_dx = dx.read();
      } else {
        expect_same_bits(y.read(), first_y, "y");
        expect_same_bits(dx.read(), first_dx, "dx");
      }
    }
  }
}

// ---------------------------------------------------------------- rows past the grid caps

// A row kernel's grid is capped at 65535 blocks: a warp per row covers 8 * 65535 rows per sweep,
// a block per row 65535; more rows go round the grid-stride loop.
TEST(CudaRowKernels, RowsPastTheGridCap) {
  LOOM_SKIP_WITHOUT_CUDA();
  const std::pair<int64_t, int64_t> shapes[] = {{8 * 65535 + 13, 5}, {65535 + 7, 1025}};
  for (const auto& [rows, cols] : shapes) {
    check_layer_norm<float>(rows, cols, LnOptions{}, 500);
    check_softmax<float>(rows, cols, random_floats(size_t(rows * cols), 501, -4.0f, 4.0f), 0, 502);
  }
}

// ---------------------------------------------------------------- dropout

// f32: bit-identical to the CPU. bf16: bit-identical to the CPU's f32 result on the rounded
// inputs, rounded.
template <typename T>
void check_dropout(int64_t n, float p, uint64_t seed, uint64_t rng_stream, uint64_t offset,
                   bool in_place) {
  SCOPED_TRACE(::testing::Message() << "dropout " << DType<T>::kName << " n " << n << " p " << p
                                    << " seed " << seed << " stream " << rng_stream << " offset "
                                    << offset << (in_place ? " in place" : ""));
  const std::vector<float> x = as_stored<T>(random_floats(size_t(n), seed ^ 0x5eed, -3.0f, 3.0f));
  std::vector<float> y(static_cast<size_t>(n));
  cpu::dropout(x.data(), y.data(), n, p, seed, rng_stream, offset);
  DeviceArray<T> d_x(x), d_y(static_cast<size_t>(n));
  d_y.poison();
  T* out = in_place ? d_x.ptr() : d_y.ptr();
  cuda::dropout(d_x.ptr(), out, n, p, seed, rng_stream, offset, kStream);
  expect_same_bits((in_place ? d_x : d_y).read(), reference<T>(y), "y");
}

template <typename T>
void check_dropout_cases() {
  const int64_t sizes[] = {1, 3, 17, 1000, 4097, 65535 * 256 + 7};  // the last past the grid cap
  const float ps[] = {0.0f, 0.1f, 0.5f, 0.9f, 1.0f};
  uint64_t seed = 600;
  for (int64_t n : sizes)
    for (float p : ps) {
      ++seed;
      check_dropout<T>(n, p, seed, seed * 7, 0, false);
      check_dropout<T>(n, p, seed, 3, uint64_t(1) << 33, seed % 2 == 0);  // offset past 2^32
    }
}

TEST(CudaDropout, BitIdenticalF32) {
  LOOM_SKIP_WITHOUT_CUDA();
  check_dropout_cases<float>();
}

TEST(CudaDropout, BitIdenticalBf16) {
  LOOM_SKIP_WITHOUT_CUDA();
  check_dropout_cases<BFloat16>();
}

TEST(CudaDropout, EmptyIsANoOp) {
  LOOM_SKIP_WITHOUT_CUDA();
  cuda::dropout(static_cast<const float*>(nullptr), nullptr, 0, 0.5f, 1, 2, 3, kStream);
  cuda::dropout(static_cast<const BFloat16*>(nullptr), nullptr, 0, 0.5f, 1, 2, 3, kStream);
  cuda_rt::synchronize(0);
}

// ---------------------------------------------------------------- gelu

// GELU f32 and bf16 against the CPU f32 kernel. The f32 kernels differ in exp only (CUDA expf vs
// the CPU's), so forward results agree to 1e-5 relative; the derivative s + 2 x s (1 - s) u' has
// terms that cancel near x = -0.75, so it is compared with the sum of |terms| of each element.
template <typename T>
void check_gelu(int64_t n, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "gelu " << DType<T>::kName << " n " << n);
  const std::vector<float> x = as_stored<T>(random_floats(size_t(n), seed, -6.0f, 6.0f));
  const std::vector<float> dy = as_stored<T>(random_floats(size_t(n), seed + 1));
  std::vector<float> y(static_cast<size_t>(n)), dx(static_cast<size_t>(n));
  cpu::gelu_forward(x.data(), y.data(), n);
  cpu::gelu_backward(x.data(), dy.data(), dx.data(), n);
  DeviceArray<T> d_x(x), d_dy(dy), d_y(static_cast<size_t>(n)), d_dx(static_cast<size_t>(n));
  d_y.poison();
  d_dx.poison();
  cuda::gelu_forward(d_x.ptr(), d_y.ptr(), n, kStream);
  cuda::gelu_backward(d_x.ptr(), d_dy.ptr(), d_dx.ptr(), n, kStream);
  std::vector<double> s_y(static_cast<size_t>(n)), s_dx(static_cast<size_t>(n));
  for (size_t i = 0; i < size_t(n); ++i) {
    const double v = x[i];
    const double s = 1.0 / (1.0 + std::exp(double(gelu_minus_2u(x[i]))));
    const double du = double(kGeluSqrt2OverPi) * (1.0 + 3.0 * double(kGeluCubic) * v * v);
    s_y[i] = std::fabs(y[i]);
    s_dx[i] = std::fabs(dy[i]) * (s + std::fabs(2.0 * v * s * (1.0 - s) * du));
  }
  const double step = DType<T>::kStep;
  expect_close_each(d_y.read(), reference<T>(y), s_y, step, 0, "y");
  expect_close_each(d_dx.read(), reference<T>(dx), s_dx, step, 0, "dx");
}

TEST(CudaGelu, F32AndBf16) {
  LOOM_SKIP_WITHOUT_CUDA();
  const int64_t sizes[] = {1, 7, 33, 257, 1000, 65535 * 256 + 7};  // the last past the grid cap
  uint64_t seed = 700;
  for (int64_t n : sizes) {
    check_gelu<float>(n, seed += 2);
    check_gelu<BFloat16>(n, seed += 2);
  }
}

#endif  // LOOM_WITH_CUDA

}  // namespace
}  // namespace loom::kernels
