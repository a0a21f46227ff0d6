// The CUDA kernels of the DLRM ops (relu, sigmoid, binary cross-entropy, dot interaction) against
// their CPU twins in kernels/cpu, and the ops themselves on CUDA tensors against the same ops on
// CPU tensors, forward and backward. The same random inputs (fixed seeds) go through both sides
// and every output element is compared. Sizes are odd (1, 3, 17, 127, 769, ...), with a few large
// enough to reach the grid cap and the loss's partial-sum cap. Skips without a GPU, and when loom
// was built without CUDA.
//
// Tolerances (f32 arithmetic on both sides unless said):
// - relu forward and backward, sigmoid backward, BCE's target gradient: exactly (the same selects,
//   or the same f32 operations in the same order, with nothing an FMA could fuse);
// - sigmoid forward, BCE's logit gradient: within 1e-5 relative plus 1e-30 absolute: expf differs
//   between CUDA and glibc in the last bit or two, which moves 1 / (1 + e) by ~1e-7 relative;
//   results below f32's normal range (x < -87) only have an absolute meaning;
// - BCE's loss sum (double on both sides, other order of additions, CUDA's exp / log1p against
//   glibc's, each within an ulp or two): within 1e-12 of the sum of the (non-negative) terms;
//   the mean and gradient-scale helpers exactly against the same double formula on the host;
// - dot interaction: within 1e-5 times the sum of |terms| of each element (the CPU kernel run on
//   |x| and |dout|): the CPU's order of additions is kept, but FMA contraction may differ;
// - the ops' bf16 path (which upcasts in core): the GPU's and CPU's f32 results are each rounded
//   once to bf16; two f32 values that agree to 1e-5 relative may round to neighbouring bf16
//   values, one bf16 ulp (2^-7 of the value, 8 significant bits) apart.
// Where determinism is promised (the loss sum, the dot interaction), two runs give the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "kernels/cpu/binary_cross_entropy.h"
#include "kernels/cpu/dot_interaction.h"
#include "kernels/cpu/relu.h"
#include "kernels/cpu/sigmoid.h"
#include "kernels/cuda/runtime.h"
#include "testing/device_buffer.h"
#include "testing/gradcheck.h"

#if LOOM_WITH_CUDA
#include "kernels/cuda/binary_cross_entropy.h"
#include "kernels/cuda/dot_interaction.h"
#include "kernels/cuda/relu.h"
#include "kernels/cuda/sigmoid.h"
#endif

namespace loom {
namespace {

#if !LOOM_WITH_CUDA

TEST(CudaDlrmOps, NeedsCuda) {
  GTEST_SKIP() << "loom was built without CUDA (LOOM_WITH_CUDA=0): no CUDA kernels to test";
}

#else

namespace kcpu = kernels::cpu;
namespace kcuda = kernels::cuda;

constexpr kcuda::Stream kStream = nullptr;  // the legacy default stream: ordered with the copies
constexpr double kRtol = 1e-5;
constexpr double kTiny = 1e-30;                  // absolute floor (exp's denormal results)
constexpr double kBf16Rtol = 1.0 / 128 + kRtol;  // one bf16 ulp (2^-7 of the value) + f32's
const Device kGpu = Device::cuda(0);
const Device kCpu = Device::cpu();

// Sizes of the elementwise kernels: odd, around warp and block multiples, and past the grid cap
// (65535 blocks of 256 threads cover 16776960 elements).
const int64_t kSizes[] = {1, 3, 17, 127, 769, 4097, 65535 * 256 + 7};

// ---------------------------------------------------------------- device memory

using Buffer = ::loom::testing::DeviceBuffer;

// A poisoned device buffer of n floats.
Buffer output_floats(int64_t n) {
  Buffer b(size_t(n) * sizeof(float));
  b.poison();
  return b;
}

// ---------------------------------------------------------------- inputs and comparisons

std::vector<float> uniform(int64_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& e : v) e = dist(gen);
  return v;
}

std::vector<float> abs_of(std::vector<float> v) {
  for (float& e : v) e = std::fabs(e);
  return v;
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// Every element bit for bit; reports the first few mismatches with their index and both values.
void expect_bits_equal(const std::vector<float>& gpu, const std::vector<float>& cpu,
                       const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  int64_t failures = 0;
  for (size_t i = 0; i < gpu.size(); ++i)
    if (bits_of(gpu[i]) != bits_of(cpu[i]) && failures++ < 5)
      ADD_FAILURE() << what << ": element " << i << " of " << gpu.size() << ": cuda " << gpu[i]
                    << " vs cpu " << cpu[i] << " (bits 0x" << std::hex << bits_of(gpu[i])
                    << " vs 0x" << bits_of(cpu[i]) << std::dec << ")";
  EXPECT_EQ(failures, 0) << what << ": " << failures << " of " << gpu.size() << " elements differ";
}

// |gpu - cpu| <= rtol * |scale| + atol elementwise; scale empty: cpu itself.
void expect_within(const std::vector<float>& gpu, const std::vector<float>& cpu,
                   const std::vector<float>& scale, double rtol, double atol,
                   const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  ASSERT_TRUE(scale.empty() || scale.size() == cpu.size()) << what;
  int64_t failures = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    const double s = scale.empty() ? cpu[i] : scale[i];
    const double diff = std::fabs(double(gpu[i]) - double(cpu[i]));
    if (!(diff <= rtol * std::fabs(s) + atol) && failures++ < 5)
      ADD_FAILURE() << what << ": element " << i << " of " << gpu.size() << ": cuda " << gpu[i]
                    << " vs cpu " << cpu[i] << " (scale " << s << ", diff " << diff << ")";
  }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " of " << gpu.size() << " elements differ";
}

// ================================================================ kernels

// ---------------------------------------------------------------- relu

// Values in [-2, 2) with every seventh element exactly 0 and one -0, so the x == 0 rule is hit.
std::vector<float> relu_input(int64_t n, uint64_t seed) {
  std::vector<float> x = uniform(n, seed, -2.0f, 2.0f);
  for (size_t i = 0; i < x.size(); i += 7) x[i] = 0.0f;
  if (x.size() > 3) x[3] = -0.0f;
  return x;
}

TEST(CudaDlrmKernels, ReluForwardAndBackwardAreTheCpusBitForBit) {
  LOOM_SKIP_WITHOUT_CUDA();
  for (int64_t n : kSizes) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const std::vector<float> x = relu_input(n, 1), dy = uniform(n, 2, -1.0f, 1.0f);
    std::vector<float> y(static_cast<size_t>(n)), dx(static_cast<size_t>(n));
    kcpu::relu_forward(x.data(), y.data(), n);
    kcpu::relu_backward(x.data(), dy.data(), dx.data(), n);

    Buffer xd(x), dyd(dy), yd = output_floats(n), dxd = output_floats(n);
    kcuda::relu_forward(xd.as<float>(), yd.as<float>(), n, kStream);
    kcuda::relu_backward(xd.as<float>(), dyd.as<float>(), dxd.as<float>(), n, kStream);
    expect_bits_equal(yd.read<float>(size_t(n)), y, "relu_forward");
    expect_bits_equal(dxd.read<float>(size_t(n)), dx, "relu_backward");
  }
}

TEST(CudaDlrmKernels, ElementwiseKernelsAcceptZeroElements) {
  LOOM_SKIP_WITHOUT_CUDA();
  // Nothing is launched (a grid of 0 would be a launch error), and null pointers are not read.
  kcuda::relu_forward(nullptr, nullptr, 0, kStream);
  kcuda::relu_backward(nullptr, nullptr, nullptr, 0, kStream);
  kcuda::sigmoid_forward(nullptr, nullptr, 0, kStream);
  kcuda::sigmoid_backward(nullptr, nullptr, nullptr, 0, kStream);
  kcuda::binary_cross_entropy_backward(nullptr, nullptr, nullptr, nullptr, nullptr, 0, kStream);
  cuda_rt::synchronize(0);
}

// ---------------------------------------------------------------- sigmoid

// Values in [-20, 20) plus the extremes: underflow to 0 (x < -87 and far below), 1 exactly, 0.
std::vector<float> sigmoid_input(int64_t n, uint64_t seed) {
  std::vector<float> x = uniform(n, seed, -20.0f, 20.0f);
  const float extremes[] = {-200.0f, -100.0f, -88.0f, -87.0f, 0.0f, 17.0f, 100.0f, 200.0f};
  for (size_t i = 0; i < x.size() && i < 8; ++i) x[i * x.size() / 8] = extremes[i];
  return x;
}

TEST(CudaDlrmKernels, SigmoidForwardAndBackward) {
  LOOM_SKIP_WITHOUT_CUDA();
  for (int64_t n : kSizes) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const std::vector<float> x = sigmoid_input(n, 3), dy = uniform(n, 4, -1.0f, 1.0f);
    std::vector<float> y(static_cast<size_t>(n)), dx(static_cast<size_t>(n));
    kcpu::sigmoid_forward(x.data(), y.data(), n);
    kcpu::sigmoid_backward(y.data(), dy.data(), dx.data(), n);

    // The backward is fed the CPU's y, so the two backwards see the same inputs.
    Buffer xd(x), yd(y), dyd(dy), yg = output_floats(n), dxd = output_floats(n);
    kcuda::sigmoid_forward(xd.as<float>(), yg.as<float>(), n, kStream);
    kcuda::sigmoid_backward(yd.as<float>(), dyd.as<float>(), dxd.as<float>(), n, kStream);
    expect_within(yg.read<float>(size_t(n)), y, {}, kRtol, kTiny, "sigmoid_forward");
    expect_bits_equal(dxd.read<float>(size_t(n)), dx, "sigmoid_backward");
  }
}

// ---------------------------------------------------------------- binary cross-entropy

// Logits in [-30, 30) with a few at +-200 (the log1p(exp(-|x|)) form must stay finite); targets
// in [0, 1] with exact 0s and 1s.
struct BceInputs {
  std::vector<float> logits, targets;
};

BceInputs bce_inputs(int64_t n, uint64_t seed) {
  BceInputs in{uniform(n, seed, -30.0f, 30.0f), uniform(n, seed + 1, 0.0f, 1.0f)};
  for (size_t i = 0; i < in.logits.size(); i += 101) in.logits[i] = i % 2 ? 200.0f : -200.0f;
  for (size_t i = 0; i < in.targets.size(); i += 5) in.targets[i] = (i / 5) % 2 ? 1.0f : 0.0f;
  return in;
}

// The sum of the loss over n elements on the device, through a fresh workspace.
double cuda_bce_sum(const Buffer& logits, const Buffer& targets, int64_t n) {
  const size_t bytes = kcuda::binary_cross_entropy_workspace_bytes(n);
  Buffer workspace(bytes), sum(sizeof(double));
  workspace.poison();
  sum.poison();
  kcuda::binary_cross_entropy_forward(logits.as<float>(), targets.as<float>(), n, sum.as<double>(),
                                      workspace.as<void>(), bytes, kStream);
  return sum.read_one<double>();
}

TEST(CudaDlrmKernels, BinaryCrossEntropyLossSumIsTheCpusAndDeterministic) {
  LOOM_SKIP_WITHOUT_CUDA();
  // 262144 = 1024 blocks of 256: the sizes past it reach the cap on partial sums.
  const int64_t sizes[] = {0, 1, 3, 17, 127, 769, 4097, 262145, (int64_t(1) << 22) + 3};
  for (int64_t n : sizes) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const BceInputs in = bce_inputs(n, 5);
    const double cpu = kcpu::binary_cross_entropy_forward(in.logits.data(), in.targets.data(), n);
    Buffer x(in.logits), y(in.targets);
    const double gpu = cuda_bce_sum(x, y, n);
    // Every term is >= 0, so the CPU's sum is the sum of |terms|.
    EXPECT_LE(std::fabs(gpu - cpu), 1e-12 * cpu) << "cuda " << gpu << " vs cpu " << cpu;
    const double again = cuda_bce_sum(x, y, n);
    EXPECT_EQ(std::memcmp(&gpu, &again, sizeof(double)), 0)
        << "two runs differ: " << gpu << " vs " << again;
  }
}

TEST(CudaDlrmKernels, BinaryCrossEntropyMeanAndGradScaleHelpers) {
  LOOM_SKIP_WITHOUT_CUDA();
  const double sums[] = {0.0, 1.0, 12345.678901234, 1e-3};
  const int64_t counts[] = {0, 1, 3, 769, 1 << 22};
  for (double s : sums)
    for (int64_t n : counts) {
      SCOPED_TRACE(::testing::Message() << "sum=" << s << " n=" << n);
      Buffer sum(std::vector<double>{s}), loss = output_floats(1);
      kcuda::binary_cross_entropy_mean(sum.as<double>(), n, loss.as<float>(), kStream);
      const float expected = n > 0 ? float(s / double(n)) : 0.0f;
      EXPECT_EQ(bits_of(loss.read_one<float>()), bits_of(expected));

      const float g = float(s) - 0.5f;
      Buffer grad(std::vector<float>{g}), scale = output_floats(1);
      kcuda::binary_cross_entropy_grad_scale(grad.as<float>(), n, scale.as<float>(), kStream);
      const float expected_scale = n > 0 ? float(double(g) / double(n)) : 0.0f;
      EXPECT_EQ(bits_of(scale.read_one<float>()), bits_of(expected_scale));
    }
}

TEST(CudaDlrmKernels, BinaryCrossEntropyBackward) {
  LOOM_SKIP_WITHOUT_CUDA();
  for (int64_t n : kSizes) {
    for (bool with_dtargets : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " dtargets=" << with_dtargets);
      const BceInputs in = bce_inputs(n, 6);
      const float scale = -0.75f / float(n);
      std::vector<float> dx(static_cast<size_t>(n)), dy(static_cast<size_t>(n));
      kcpu::binary_cross_entropy_backward(in.logits.data(), in.targets.data(), scale, dx.data(),
                                          with_dtargets ? dy.data() : nullptr, n);
      Buffer x(in.logits), y(in.targets), scale_d(std::vector<float>{scale});
      Buffer dxd = output_floats(n), dyd = output_floats(n);
      kcuda::binary_cross_entropy_backward(x.as<float>(), y.as<float>(), scale_d.as<float>(),
                                           dxd.as<float>(),
                                           with_dtargets ? dyd.as<float>() : nullptr, n, kStream);
      // dlogits = scale (p - y): p agrees to ~1e-7 relative, so the error is below
      // 1e-5 |scale| (|p| + |y|) <= 2e-5 |scale|.
      std::vector<float> mag(size_t(n), 2.0f * std::fabs(scale));
      expect_within(dxd.read<float>(size_t(n)), dx, mag, kRtol, kTiny, "dlogits");
      if (with_dtargets) {
        expect_bits_equal(dyd.read<float>(size_t(n)), dy, "dtargets");
      } else {  // not written
        for (float v : dyd.read<float>(size_t(n < 16 ? n : 16))) EXPECT_TRUE(std::isnan(v));
      }
    }
  }
}

TEST(CudaDlrmKernels, BinaryCrossEntropyWorkspaceErrors) {
  LOOM_SKIP_WITHOUT_CUDA();
  const int64_t n = 769;
  const BceInputs in = bce_inputs(n, 7);
  Buffer x(in.logits), y(in.targets), sum(sizeof(double));
  const size_t needed = kcuda::binary_cross_entropy_workspace_bytes(n);
  ASSERT_GT(needed, 0u);
  Buffer small(needed - 8);
  try {
    kcuda::binary_cross_entropy_forward(x.as<float>(), y.as<float>(), n, sum.as<double>(),
                                        small.as<void>(), needed - 8, kStream);
    ADD_FAILURE() << "a too-small workspace was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("binary_cross_entropy_forward"), std::string::npos) << msg;
    EXPECT_NE(msg.find("workspace"), std::string::npos) << msg;
    EXPECT_NE(msg.find("too small"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(needed)), std::string::npos) << msg;
  }
  try {
    kcuda::binary_cross_entropy_forward(x.as<float>(), y.as<float>(), n, sum.as<double>(), nullptr,
                                        needed, kStream);
    ADD_FAILURE() << "a null workspace was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("workspace is null"), std::string::npos) << msg;
  }
  EXPECT_EQ(kcuda::binary_cross_entropy_workspace_bytes(0), 0u);
}

// ---------------------------------------------------------------- dot interaction

struct Bfd {
  int64_t batch, features, dim;
};
// One feature (no pairs), dims of 0 and 1, dims around the eight lanes (7, 8, 9, 17), DLRM's 27
// features of 128, many features, and a batch large enough for several thousand blocks.
const Bfd kInteractions[] = {{1, 1, 1},    {1, 2, 1},   {3, 2, 0},   {1, 3, 7},    {3, 17, 8},
                             {5, 27, 128}, {7, 3, 769}, {2, 64, 33}, {127, 9, 17}, {4097, 27, 16}};

std::string bfd_str(const Bfd& s) {
  return "[B=" + std::to_string(s.batch) + ", F=" + std::to_string(s.features) +
         ", D=" + std::to_string(s.dim) + "]";
}

TEST(CudaDlrmKernels, DotInteractionForwardAndBackward) {
  LOOM_SKIP_WITHOUT_CUDA();
  for (const Bfd& s : kInteractions) {
    SCOPED_TRACE(bfd_str(s));
    const int64_t pairs = s.features * (s.features - 1) / 2;
    const int64_t nx = s.batch * s.features * s.dim, nout = s.batch * pairs;
    const std::vector<float> x = uniform(nx, 8, -1.0f, 1.0f), g = uniform(nout, 9, -1.0f, 1.0f);
    std::vector<float> out(static_cast<size_t>(nout)), dx(static_cast<size_t>(nx)),
        out_mag(static_cast<size_t>(nout)), dx_mag(static_cast<size_t>(nx));
    kcpu::dot_interaction_forward(x.data(), out.data(), s.batch, s.features, s.dim);
    kcpu::dot_interaction_backward(x.data(), g.data(), dx.data(), s.batch, s.features, s.dim);
    const std::vector<float> ax = abs_of(x), ag = abs_of(g);
    kcpu::dot_interaction_forward(ax.data(), out_mag.data(), s.batch, s.features, s.dim);
    kcpu::dot_interaction_backward(ax.data(), ag.data(), dx_mag.data(), s.batch, s.features, s.dim);

    Buffer xd(x), gd(g);
    std::vector<float> first_out, first_dx;
    for (int run = 0; run < 2; ++run) {
      Buffer od = output_floats(nout), dxd = output_floats(nx);
      kcuda::dot_interaction_forward(xd.as<float>(), od.as<float>(), s.batch, s.features, s.dim,
                                     kStream);
      kcuda::dot_interaction_backward(xd.as<float>(), gd.as<float>(), dxd.as<float>(), s.batch,
                                      s.features, s.dim, kStream);
      std::vector<float> o = od.read<float>(size_t(nout)), d = dxd.read<float>(size_t(nx));
      if (run == 0) {
        expect_within(o, out, out_mag, kRtol, 0.0, "dot_interaction_forward " + bfd_str(s));
        expect_within(d, dx, dx_mag, kRtol, 0.0, "dot_interaction_backward " + bfd_str(s));
        first_out = std::move(o);
        first_dx = std::move(d);
      } else {
        expect_bits_equal(o, first_out, "dot_interaction_forward, second run");
        expect_bits_equal(d, first_dx, "dot_interaction_backward, second run");
      }
    }
  }
}

TEST(CudaDlrmKernels, DotInteractionNegativeSizesAreAnError) {
  LOOM_SKIP_WITHOUT_CUDA();
  try {
    kcuda::dot_interaction_forward(nullptr, nullptr, 2, -3, 4, kStream);
    ADD_FAILURE() << "negative features were accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("dot_interaction_forward"), std::string::npos) << msg;
    EXPECT_NE(msg.find("features -3"), std::string::npos) << msg;
  }
}

// ================================================================ ops: CUDA tensors vs CPU tensors

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

struct Result {
  Tensor out;                 // on the CPU
  std::vector<Tensor> grads;  // on the CPU, one per input
};

// f on fresh leaves (copies of `inputs` on `device`, requiring grad), then backward with a random
// output gradient fixed by `seed`. `absolute` runs on |inputs| with |gradient| instead (the sums
// of |terms| for the tolerance of sums of products).
Result run_on(const Fn& f, const std::vector<Tensor>& inputs, Device device, uint64_t seed,
              bool absolute = false) {
  std::vector<Tensor> leaves;
  for (const Tensor& x : inputs) {
    std::vector<float> v = x.to_vector<float>();
    if (absolute) v = abs_of(std::move(v));
    Tensor leaf = Tensor::from_vector(v, x.shape()).to(device);
    leaf.set_requires_grad(true);
    leaves.push_back(leaf);
  }
  Tensor out = f(leaves);
  EXPECT_EQ(out.device(), device) << "the output is not on " << device.str();
  std::vector<float> gv = testing::random_tensor(out.shape(), seed).to_vector<float>();
  if (absolute) gv = abs_of(std::move(gv));
  out.backward(Tensor::from_vector(gv, out.shape()).to(device));
  Result r{out.detach().to(kCpu), {}};
  for (const Tensor& leaf : leaves) {
    EXPECT_TRUE(leaf.grad().defined()) << "an input got no gradient on " << device.str();
    r.grads.push_back(leaf.grad().defined() ? leaf.grad().to(kCpu) : Tensor());
  }
  return r;
}

std::vector<float> values(const Tensor& t) { return t.to_vector<float>(); }

Tensor rnd(const Shape& s, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  return testing::random_tensor(s, seed, lo, hi);
}

const Shape kOpShapes[] = {{1}, {3, 17}, {127}, {769, 3}, {2, 3, 4097}};

TEST(CudaDlrmOps, ReluMatchesCpuBitForBit) {
  LOOM_SKIP_WITHOUT_CUDA();
  const Fn f = [](const std::vector<Tensor>& in) { return relu(in[0]); };
  for (const Shape& s : kOpShapes) {
    SCOPED_TRACE(shape_str(s));
    Tensor x = Tensor::from_vector(relu_input(shape_numel(s), 10), s);
    Result gpu = run_on(f, {x}, kGpu, 11), cpu = run_on(f, {x}, kCpu, 11);
    expect_bits_equal(values(gpu.out), values(cpu.out), "relu output");
    expect_bits_equal(values(gpu.grads[0]), values(cpu.grads[0]), "relu gradient");
  }
}

TEST(CudaDlrmOps, SigmoidMatchesCpu) {
  LOOM_SKIP_WITHOUT_CUDA();
  const Fn f = [](const std::vector<Tensor>& in) { return sigmoid(in[0]); };
  for (const Shape& s : kOpShapes) {
    SCOPED_TRACE(shape_str(s));
    Tensor x = Tensor::from_vector(sigmoid_input(shape_numel(s), 12), s);
    Result gpu = run_on(f, {x}, kGpu, 13), cpu = run_on(f, {x}, kCpu, 13);
    expect_within(values(gpu.out), values(cpu.out), {}, kRtol, kTiny, "sigmoid output");
    // dx = g y (1 - y), each side from its own y. The y's differ by dy ~ 2 ulp ~ 1.2e-7 y, which
    // moves dx by |g| |1 - 2y| dy <= 1.2e-7 |g| y: that is large against dx itself where y is near
    // 1 (1 - y tiny), so the bound is 1e-5 of |g| y (1 - y) + 0.1 |g| y (1e-6 |g| y).
    std::vector<float> y = values(cpu.out), g = values(testing::random_tensor(s, 13)),
                       mag(y.size());
    for (size_t i = 0; i < y.size(); ++i)
      mag[i] = std::fabs(g[i]) * (y[i] * (1.0f - y[i]) + 0.1f * y[i]);
    expect_within(values(gpu.grads[0]), values(cpu.grads[0]), mag, kRtol, kTiny,
                  "sigmoid gradient");
  }
}

// Logits and targets (targets in [0, 1]) of shape s.
std::vector<Tensor> bce_tensors(const Shape& s, uint64_t seed) {
  const BceInputs in = bce_inputs(shape_numel(s), seed);
  return {Tensor::from_vector(in.logits, s), Tensor::from_vector(in.targets, s)};
}

TEST(CudaDlrmOps, BinaryCrossEntropyMatchesCpu) {
  LOOM_SKIP_WITHOUT_CUDA();
  const Fn f = [](const std::vector<Tensor>& in) {
    return binary_cross_entropy_with_logits(in[0], in[1]);
  };
  for (const Shape& s : kOpShapes) {
    SCOPED_TRACE(shape_str(s));
    const std::vector<Tensor> in = bce_tensors(s, 14);
    Result gpu = run_on(f, in, kGpu, 15), cpu = run_on(f, in, kCpu, 15);
    // The two double sums agree to ~1e-12 (see the kernel test); rounded to f32 they may still
    // fall on either side of a rounding boundary: one f32 ulp, 2^-23 relative.
    expect_within(values(gpu.out), values(cpu.out), {}, 1.2e-7, 0.0, "loss");
    // The scale is the same f32 on both sides (the same double formula); dlogits as in the
    // kernel test; dtargets bit for bit.
    const double scale =
        std::fabs(testing::random_tensor(Shape{}, 15).item()) / double(shape_numel(s));
    std::vector<float> mag(size_t(shape_numel(s)), float(2.0 * scale));
    expect_within(values(gpu.grads[0]), values(cpu.grads[0]), mag, kRtol, kTiny, "dlogits");
    expect_bits_equal(values(gpu.grads[1]), values(cpu.grads[1]), "dtargets");
  }
}

TEST(CudaDlrmOps, BinaryCrossEntropyWithoutTargetGradientAndEmpty) {
  LOOM_SKIP_WITHOUT_CUDA();
  const std::vector<Tensor> in = bce_tensors({769}, 16);
  Tensor x = in[0].to(kGpu).set_requires_grad(true), y = in[1].to(kGpu);
  Tensor xc = in[0].detach().clone().set_requires_grad(true);
  Tensor loss = binary_cross_entropy_with_logits(x, y);
  Tensor loss_c = binary_cross_entropy_with_logits(xc, in[1]);
  loss.backward();
  loss_c.backward();
  EXPECT_NEAR(loss.item(), loss_c.item(), 1.2e-7 * std::fabs(loss_c.item()));
  expect_within(values(x.grad().to(kCpu)), values(xc.grad()),
                std::vector<float>(769, 2.0f / 769.0f), kRtol, kTiny, "dlogits");
  // No elements: loss 0 and empty gradients, as on the CPU.
  Tensor e = Tensor::zeros({0}, DType::kF32, kGpu).set_requires_grad(true);
  Tensor le = binary_cross_entropy_with_logits(e, Tensor::zeros({0}, DType::kF32, kGpu));
  EXPECT_EQ(le.item(), 0.0);
  le.backward();
  EXPECT_EQ(e.grad().numel(), 0);
}

TEST(CudaDlrmOps, BinaryCrossEntropyBadTargetsAreAClearError) {
  LOOM_SKIP_WITHOUT_CUDA();
  Tensor x = Tensor::zeros({3}, DType::kF32, kGpu);
  Tensor y = Tensor::from_vector<float>({0.0f, 1.0f, -1.0f}, {3}).to(kGpu);
  try {
    binary_cross_entropy_with_logits(x, y);
    ADD_FAILURE() << "a target of -1 was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("binary_cross_entropy_with_logits"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'targets'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("flat index 2"), std::string::npos) << msg;
  }
}

TEST(CudaDlrmOps, DotInteractionMatchesCpu) {
  LOOM_SKIP_WITHOUT_CUDA();
  const Fn f = [](const std::vector<Tensor>& in) { return dot_interaction(in[0]); };
  const Shape shapes[] = {{1, 1, 3}, {1, 2, 1}, {3, 17, 9}, {5, 27, 128}, {127, 9, 17}};
  for (const Shape& s : shapes) {
    SCOPED_TRACE(shape_str(s));
    Tensor x = rnd(s, 17);
    Result gpu = run_on(f, {x}, kGpu, 18), cpu = run_on(f, {x}, kCpu, 18);
    Result mag = run_on(f, {x}, kCpu, 18, /*absolute=*/true);
    expect_within(values(gpu.out), values(cpu.out), values(mag.out), kRtol, 0.0, "output");
    expect_within(values(gpu.grads[0]), values(cpu.grads[0]), values(mag.grads[0]), kRtol, 0.0,
                  "gradient");
  }
}

// The ops' bf16 path upcasts to f32 in core and rounds the result once; on CUDA it must do the
// same as on the CPU (exactly for relu, within one bf16 ulp where the f32 results may differ).
TEST(CudaDlrmOps, Bf16InputsFollowTheCpu) {
  LOOM_SKIP_WITHOUT_CUDA();
  Tensor x = Tensor::from_vector(relu_input(769, 19), {769}).to(DType::kBF16);
  Tensor rg = relu(x.to(kGpu)), rc = relu(x);
  ASSERT_EQ(rg.dtype(), DType::kBF16);
  expect_bits_equal(values(rg.to(kCpu).to(DType::kF32)), values(rc.to(DType::kF32)), "relu bf16");
  Tensor sg = sigmoid(x.to(kGpu)), sc = sigmoid(x);
  ASSERT_EQ(sg.dtype(), DType::kBF16);
  expect_within(values(sg.to(kCpu).to(DType::kF32)), values(sc.to(DType::kF32)), {}, kBf16Rtol,
                kTiny, "sigmoid bf16");
  Tensor f = rnd({3, 17, 9}, 20).to(DType::kBF16);
  Tensor dg = dot_interaction(f.to(kGpu)), dc = dot_interaction(f);
  ASSERT_EQ(dg.dtype(), DType::kBF16);
  Tensor mag = dot_interaction(Tensor::from_vector(abs_of(values(f.to(DType::kF32))), {3, 17, 9}));
  expect_within(values(dg.to(kCpu).to(DType::kF32)), values(dc.to(DType::kF32)), values(mag),
                kBf16Rtol, 0.0, "dot_interaction bf16");
}

#endif  // LOOM_WITH_CUDA

}  // namespace
}  // namespace loom
