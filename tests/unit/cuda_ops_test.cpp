// Every CUDA kernel against its CPU twin: the same op on the same random inputs, forward and
// backward, on CUDA and on the CPU, compared element by element. Sizes are odd (1, 7, 33, 257,
// 1000, and a few large enough to reach grid caps and two-pass paths). Skips without a GPU.
//
// Tolerance. Ops whose every result is a sum of products of inputs (matmul, linear, sums,
// broadcast gradients, copies) are compared with 1e-5 times the sum of the absolute values of the
// terms that make each element, found by running the same op on |inputs| with |grad|: f32
// rounding grows with that sum, and it stays meaningful where terms cancel to nearly zero, where
// a plain relative test would demand more digits than f32 has. Conversions and fills must match
// exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/ops.h"
#include "core/tensor.h"
#include "kernels/cuda/runtime.h"
#include "testing/device_buffer.h"
#include "testing/gradcheck.h"

namespace loom {
namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

const Device kGpu = Device::cuda(0);
const Device kCpu = Device::cpu();
constexpr double kRtol = 1e-5;

Tensor abs_of(const Tensor& x) {
  std::vector<float> v = x.to_vector<float>();
  for (float& e : v) e = std::fabs(e);
  return Tensor::from_vector(v, x.shape());
}

struct Result {
  Tensor out;                 // on the CPU
  std::vector<Tensor> grads;  // on the CPU, one per input
};

// f on fresh leaves (copies of `inputs` on `device`, requiring grad), then backward with a random
// output gradient fixed by `seed`. `absolute` runs on |inputs| with |gradient| instead.
Result run_on(const Fn& f, const std::vector<Tensor>& inputs, Device device, uint64_t seed,
              bool absolute = false) {
  std::vector<Tensor> leaves;
  for (const Tensor& x : inputs) {
    Tensor h = absolute ? abs_of(x) : x.detach().clone();
    Tensor leaf = h.to(device);
    leaf.set_requires_grad(true);
    leaves.push_back(leaf);
  }
  Tensor out = f(leaves);
  Tensor g = testing::random_tensor(out.shape(), seed);
  if (absolute) g = abs_of(g);
  out.backward(g.to(device));
  Result r{out.detach().to(kCpu), {}};
  for (const Tensor& leaf : leaves) {
    EXPECT_TRUE(leaf.grad().defined()) << "an input got no gradient on " << device.str();
    r.grads.push_back(leaf.grad().defined() ? leaf.grad().to(kCpu) : Tensor());
  }
  return r;
}

// |gpu - cpu| <= rtol * |scale| elementwise (scale: the sum of |terms| of each element).
void expect_within_scale(const Tensor& gpu, const Tensor& cpu, const Tensor& scale, double rtol,
                         const std::string& what) {
  ASSERT_EQ(gpu.shape(), cpu.shape()) << what;
  ASSERT_EQ(gpu.device(), kCpu);
  std::vector<float> g = gpu.to_vector<float>(), c = cpu.to_vector<float>(),
                     s = scale.to_vector<float>();
  int failures = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double diff = std::fabs(double(g[i]) - double(c[i]));
    if (!(diff <= rtol * std::fabs(double(s[i]))) && failures++ < 5)
      ADD_FAILURE() << what << " element " << i << ": cuda " << g[i] << " vs cpu " << c[i]
                    << " (scale " << s[i] << ")";
  }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " of " << g.size() << " elements differ";
}

// For ops whose results are sums of products of their inputs. `magnitude` computes the sum of
// |terms|; it defaults to f itself on |inputs| (right for everything but subtraction).
void expect_cuda_matches_cpu(const Fn& f, const std::vector<Tensor>& inputs,
                             const Fn& magnitude = nullptr, uint64_t seed = 99) {
  Result gpu = run_on(f, inputs, kGpu, seed);
  Result cpu = run_on(f, inputs, kCpu, seed);
  Result mag = run_on(magnitude ? magnitude : f, inputs, kCpu, seed, /*absolute=*/true);
  expect_within_scale(gpu.out, cpu.out, mag.out, kRtol, "output");
  for (size_t i = 0; i < inputs.size(); ++i)
    expect_within_scale(gpu.grads[i], cpu.grads[i], mag.grads[i], kRtol,
                        "gradient of input " + std::to_string(i));
}

Tensor rnd(const Shape& s, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  return testing::random_tensor(s, seed, lo, hi);
}

// ---------------------------------------------------------------- matmul / linear

struct Mnk {
  int64_t m, n, k;
};
const Mnk kProducts[] = {{1, 1, 1}, {7, 33, 257}, {257, 7, 33}, {33, 1000, 7}, {1000, 257, 1}};

TEST(CudaPut, MatchesTheCpu) {
  LOOM_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::cuda(0);
  std::vector<int64_t> places;
  for (int64_t i = 0; i < 5000; i += 3) places.push_back((i * 7919) % 5000);  // distinct
  const Tensor pos = Tensor::from_vector(places, {int64_t(places.size())});
  for (DType dt : {DType::kF32, DType::kBF16, DType::kI64, DType::kBool}) {
    Tensor cpu = Tensor::arange(5000).to(dt), values = Tensor::arange(pos.numel()).to(dt);
    Tensor dev = cpu.to(gpu);
    put_(cpu, pos, values);
    put_(dev, pos.to(gpu), values.to(gpu));
    EXPECT_EQ(dev.to(Device::cpu()).to(DType::kF32).to_vector<float>(),
              cpu.to(DType::kF32).to_vector<float>())
        << dtype_name(dt);
  }
}

TEST(CudaMatmul, EveryTransposeCombination) {
  LOOM_SKIP_WITHOUT_CUDA();
  for (const Mnk& p : kProducts)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "m=" << p.m << " n=" << p.n << " k=" << p.k
                                          << " ta=" << ta << " tb=" << tb);
        Tensor a = rnd(ta ? Shape{p.k, p.m} : Shape{p.m, p.k}, 1);
        Tensor b = rnd(tb ? Shape{p.n, p.k} : Shape{p.k, p.n}, 2);
        expect_cuda_matches_cpu(
            [ta, tb](const std::vector<Tensor>& in) { return matmul(in[0], in[1], ta, tb); },
            {a, b});
      }
}

TEST(CudaMatmul, BatchedWithSharedAndBatchedB) {
  LOOM_SKIP_WITHOUT_CUDA();
  const Mnk sizes[] = {{7, 33, 257}, {1, 7, 33}, {33, 1, 1000}};
  for (const Mnk& p : sizes)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "m=" << p.m << " n=" << p.n << " k=" << p.k
                                          << " ta=" << ta << " tb=" << tb);
        Shape as = ta ? Shape{2, 3, p.k, p.m} : Shape{2, 3, p.m, p.k};
        Shape bs = tb ? Shape{p.n, p.k} : Shape{p.k, p.n};
        Shape bs4 = {2, 3, bs[0], bs[1]};
        auto f = [ta, tb](const std::vector<Tensor>& in) { return matmul(in[0], in[1], ta, tb); };
        expect_cuda_matches_cpu(f, {rnd(as, 3), rnd(bs, 4)});   // shared b
        expect_cuda_matches_cpu(f, {rnd(as, 5), rnd(bs4, 6)});  // batched b
      }
}

TEST(CudaMatmul, TransposedViewOperands) {
  LOOM_SKIP_WITHOUT_CUDA();
  // Views whose last two dims are transposed reach cuBLAS with flipped flags.
  expect_cuda_matches_cpu(
      [](const std::vector<Tensor>& in) {
        return matmul(in[0].transpose(-1, -2), in[1].transpose(0, 1));
      },
      {rnd({3, 257, 7}, 7), rnd({33, 257}, 8)});
}

TEST(CudaLinear, WithAndWithoutBias) {
  LOOM_SKIP_WITHOUT_CUDA();
  struct Case {
    Shape x;
    int64_t out;
  };
  const Case cases[] = {{{1, 1}, 1}, {{3, 7, 33}, 257}, {{1000, 257}, 7}, {{257}, 33}};
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "x=" << shape_str(c.x) << " out=" << c.out);
    const int64_t in = c.x.back();
    expect_cuda_matches_cpu([](const std::vector<Tensor>& v) { return linear(v[0], v[1], v[2]); },
                            {rnd(c.x, 9), rnd({c.out, in}, 10), rnd({c.out}, 11)});
    expect_cuda_matches_cpu([](const std::vector<Tensor>& v) { return linear(v[0], v[1]); },
                            {rnd(c.x, 12), rnd({c.out, in}, 13)});
  }
}

// ---------------------------------------------------------------- sum / mean

TEST(CudaReduce, AllElements) {
  LOOM_SKIP_WITHOUT_CUDA();
  // [257, 1000] and [1 << 22] take the two-pass path; the rest one block.
  const Shape shapes[] = {{1}, {7}, {33}, {257}, {1000}, {257, 1000}, {int64_t(1) << 22}};
  for (const Shape& s : shapes) {
    SCOPED_TRACE(shape_str(s));
    Tensor x = rnd(s, 14);
    expect_cuda_matches_cpu([](const std::vector<Tensor>& in) { return sum(in[0]); }, {x});
    expect_cuda_matches_cpu([](const std::vector<Tensor>& in) { return mean(in[0]); }, {x});
  }
}

TEST(CudaReduce, OverEachDim) {
  LOOM_SKIP_WITHOUT_CUDA();
  // [3, 5, 2000] over dim 1 has 6000 outputs with inner > 1: the thread-per-output path.
  const Shape shapes[] = {{1}, {1000}, {7, 33, 257}, {3, 5, 2000}, {257, 1}, {1, 1000}};
  for (const Shape& s : shapes)
    for (int64_t dim = 0; dim < int64_t(s.size()); ++dim)
      for (bool keepdim : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << shape_str(s) << " dim=" << dim << " keepdim=" << keepdim);
        Tensor x = rnd(s, 15);
        expect_cuda_matches_cpu(
            [dim, keepdim](const std::vector<Tensor>& in) { return sum(in[0], dim, keepdim); },
            {x});
        expect_cuda_matches_cpu(
            [dim, keepdim](const std::vector<Tensor>& in) { return mean(in[0], dim, keepdim); },
            {x});
      }
}

// ---------------------------------------------------------------- gelu

TEST(CudaGelu, ForwardAndBackward) {
  LOOM_SKIP_WITHOUT_CUDA();
  // 65535 blocks of 256 threads cover 16776960 elements; one more size goes past the grid cap.
  const int64_t sizes[] = {1, 7, 33, 257, 1000, 65535 * 256 + 7};
  for (int64_t n : sizes) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    Tensor x = rnd({n}, 16, -6.0f, 6.0f);
    Tensor g = rnd({n}, 17);
    Tensor xg = x.to(kGpu).set_requires_grad(true);
    Tensor xc = x.detach().clone().set_requires_grad(true);
    Tensor yg = gelu(xg), yc = gelu(xc);
    yg.backward(g.to(kGpu));
    yc.backward(g);
    // Both sides evaluate the same f32 formula; exp differs (expf on the GPU, a polynomial on
    // the CPU), each within ~1e-7 relative, and FMA contraction may round u differently by an ulp
    // or two, which exp(-2u) amplifies to at most 2 |u| 2 6e-8 ~ 3e-6 for |x| < 6: within 1e-5.
    // gelu' crosses zero near x = -0.75, where its two terms (~0.3) cancel and only an absolute
    // bound of a few of their ulps means anything.
    testing::expect_close(yg.to(kCpu), yc, 0.0, kRtol);
    testing::expect_close(xg.grad().to(kCpu), xc.grad(), 1e-6, kRtol);
  }
}

// ---------------------------------------------------------------- elementwise (existing kernels)

TEST(CudaElementwise, BinaryOpsWithBroadcasting) {
  LOOM_SKIP_WITHOUT_CUDA();
  struct Case {
    Shape a, b;
  };
  // b a suffix of a (b's gradient summed over the leading dims: sum_to_suffix), equal shapes,
  // and a the shorter one (swapped into the kernels' second operand).
  const Case cases[] = {{{1}, {1}},           {{7}, {7}},
                        {{1000, 257}, {257}}, {{3, 257, 7}, {257, 7}},
                        {{33}, {7, 33}},      {{1000}, {1000}}};
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << shape_str(c.a) << " op " << shape_str(c.b));
    std::vector<Tensor> in = {rnd(c.a, 18), rnd(c.b, 19)};
    auto add_f = [](const std::vector<Tensor>& v) { return add(v[0], v[1]); };
    expect_cuda_matches_cpu(add_f, in);
    expect_cuda_matches_cpu([](const std::vector<Tensor>& v) { return sub(v[0], v[1]); }, in,
                            add_f);  // |a - b| terms are |a| and |b|
    expect_cuda_matches_cpu([](const std::vector<Tensor>& v) { return mul(v[0], v[1]); }, in);
    // div: divisors in [1, 2] (both sides divide in IEEE f32, so the quotients are the same).
    std::vector<Tensor> away = {rnd(c.a, 20, 1.0f, 2.0f), rnd(c.b, 21, 1.0f, 2.0f)};
    expect_cuda_matches_cpu([](const std::vector<Tensor>& v) { return div(v[0], v[1]); }, away);
  }
}

TEST(CudaElementwise, Scale) {
  LOOM_SKIP_WITHOUT_CUDA();
  for (int64_t n : {1, 7, 33, 257, 1000}) {
    SCOPED_TRACE(n);
    expect_cuda_matches_cpu([](const std::vector<Tensor>& v) { return scale(v[0], -1.75); },
                            {rnd({n}, 20)});
  }
}

// The sum of squares of x's elements (f32) to within a few f64 rounding errors: Neumaier's
// compensated sum in long double of the squares, which are exact.
double compensated_sum_of_squares(const Tensor& x) {
  long double sum = 0, compensation = 0;
  for (float v : x.to_vector<float>()) {
    const long double term = static_cast<long double>(v) * v, next = sum + term;
    compensation += std::fabs(sum) >= term ? (sum - next) + term : (term - next) + sum;
    sum = next;
  }
  return static_cast<double>(sum + compensation);
}

TEST(CudaElementwise, InPlaceHelpersAndSumOfSquares) {
  LOOM_SKIP_WITHOUT_CUDA();
  for (int64_t n : {1, 7, 33, 257, 1000, 65535 * 256 + 7}) {
    SCOPED_TRACE(n);
    Tensor x = rnd({n}, 21), y = rnd({n}, 22);
    Tensor xc = x.clone(), xg = x.to(kGpu);
    add_(xc, y, 0.5);
    add_(xg, y.to(kGpu), 0.5);
    // Each element is x + 0.5 y: its terms sum to |x| + 0.5 |y|.
    Tensor mag = abs_of(x);
    add_(mag, abs_of(y), 0.5);
    expect_within_scale(xg.to(kCpu), xc, mag, kRtol, "add_");
    scale_(xc, -3.0);
    scale_(xg, -3.0);
    testing::expect_close(xg.to(kCpu), xc, 0.0, kRtol);
    // Both sides add the exact f64 squares in f64, in different orders; each is held to the
    // worst-case bound of its own order against a compensated sum: the CPU's sequential sum to
    // (n - 1) u sum, the GPU's tree (norm_reduce.cu: 16 per thread, a 256-way tree per chunk of
    // 4096, then ceil(chunks / 256) per thread and a 256-way tree) to its depth times u sum.
    // (A fixed 1e-12 relative bound was wrong: the sequential sum of 16.8M squares is 2.4e-12 off.)
    const double exact = compensated_sum_of_squares(x), u = std::ldexp(1.0, -53);
    const int64_t chunks = (n + 4095) / 4096;
    const double gpu_depth = 16 + 8 + double((chunks + 255) / 256) + 8;
    EXPECT_NEAR(sum_of_squares(x), exact, double(n - 1) * u * exact);
    EXPECT_NEAR(sum_of_squares(x.to(kGpu)), exact, gpu_depth * u * exact);
  }
}

// ---------------------------------------------------------------- copies, conversions, fills

TEST(CudaCopy, ContiguousOfTransposedAndNarrowedViews) {
  LOOM_SKIP_WITHOUT_CUDA();
  expect_cuda_matches_cpu(
      [](const std::vector<Tensor>& v) { return v[0].transpose(0, 1).contiguous(); },
      {rnd({33, 257}, 23)});
  expect_cuda_matches_cpu(
      [](const std::vector<Tensor>& v) { return v[0].transpose(0, 1).contiguous(); },
      {rnd({1, 7}, 24)});
  // a 3-D view with an offset: dims 0 and 2 swapped, then a middle slice of the new dim 1
  expect_cuda_matches_cpu(
      [](const std::vector<Tensor>& v) {
        return v[0].transpose(0, 2).narrow(1, 5, 20).contiguous();
      },
      {rnd({7, 33, 257}, 25)});
}

TEST(CudaCopy, NarrowAndCatBackward) {
  LOOM_SKIP_WITHOUT_CUDA();
  expect_cuda_matches_cpu([](const std::vector<Tensor>& v) { return v[0].narrow(1, 3, 250); },
                          {rnd({7, 257}, 26)});
  expect_cuda_matches_cpu([](const std::vector<Tensor>& v) { return v[0].narrow(0, 0, 1); },
                          {rnd({1, 1}, 27)});
  for (int64_t dim : {0, 1, 2}) {
    SCOPED_TRACE(dim);
    Shape a = {7, 33, 3}, b = {7, 33, 3};
    b[size_t(dim)] = 1000 / 33;
    expect_cuda_matches_cpu(
        [dim](const std::vector<Tensor>& v) {
          return cat({v[0], v[1], v[0]}, dim);
        },
        {rnd(a, 28), rnd(b, 29)});
  }
}

TEST(CudaCopy, DtypeConversions) {
  LOOM_SKIP_WITHOUT_CUDA();
  const DType targets[] = {DType::kBF16, DType::kF16, DType::kI32, DType::kI64, DType::kU8};
  for (int64_t n : {1, 7, 33, 257, 1000}) {
    // Integers are exact in f32 up to 2^24; u8 only takes values in [0, 256).
    Tensor x = rnd({n}, 30, 0.0f, 255.0f);
    for (DType to : targets) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " f32 -> " << dtype_name(to));
      Tensor gpu = x.to(kGpu).to(to);
      ASSERT_EQ(gpu.dtype(), to);
      Tensor cpu = x.to(to);
      // Both brought back to f32 by the same (CPU) conversion: equal iff the bits were equal.
      EXPECT_EQ(gpu.to(kCpu).to(DType::kF32).to_vector<float>(),
                cpu.to(DType::kF32).to_vector<float>());
      // and back to f32 on the device
      EXPECT_EQ(gpu.to(DType::kF32).to_vector<float>(), cpu.to(DType::kF32).to_vector<float>());
    }
    SCOPED_TRACE("bf16 <-> f16, i32 <-> i64");
    Tensor bf = x.to(DType::kBF16);
    EXPECT_EQ(bf.to(kGpu).to(DType::kF16).to(kCpu).to(DType::kF32).to_vector<float>(),
              bf.to(DType::kF16).to(DType::kF32).to_vector<float>());
    Tensor i32 = rnd({n}, 31, -1000.0f, 1000.0f).to(DType::kI32);
    EXPECT_EQ(i32.to(kGpu).to(DType::kI64).to(kCpu).to_vector<int64_t>(),
              i32.to(DType::kI64).to_vector<int64_t>());
  }
  // The gradient through to(dtype) is converted back on the device too.
  expect_cuda_matches_cpu(
      [](const std::vector<Tensor>& v) { return v[0].to(DType::kF16).to(DType::kF32); },
      {rnd({257}, 32)});
}

TEST(CudaCopy, Fill) {
  LOOM_SKIP_WITHOUT_CUDA();
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kF16,
                          DType::kI32, DType::kI64,  DType::kU8};
  for (int64_t n : {1, 7, 33, 257, 1000}) {
    for (DType dt : dtypes) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " " << dtype_name(dt));
      const double value = is_floating(dt) ? -3.3 : 200.0;
      Tensor gpu = Tensor::full({n}, value, dt, kGpu);
      Tensor cpu = Tensor::full({n}, value, dt);
      EXPECT_EQ(gpu.to(kCpu).to(DType::kF32).to_vector<float>(),
                cpu.to(DType::kF32).to_vector<float>());
    }
  }
  Tensor z = Tensor::zeros({1000, 7}, DType::kF32, kGpu);
  EXPECT_EQ(z.to_vector<float>(), std::vector<float>(7000, 0.0f));
}

}  // namespace
}  // namespace loom
