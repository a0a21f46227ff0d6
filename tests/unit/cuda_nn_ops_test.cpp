// The model ops wired to CUDA kernels (layer_norm, softmax, attention, cross_entropy, embedding,
// dropout) through the op layer: each op forward and backward on CUDA tensors against the same op
// on CPU tensors, with autograd, views and bf16 inputs in the mix. The kernels themselves are
// tested element by element against their CPU twins in cuda_{norm,loss,attention}_test; this
// checks the dispatch (workspaces, device slots, dtype paths). Skips without a GPU.
//
// Tolerance: the ops are not sums of products, so each output is compared with
// atol + rtol * |cpu|, atol = 1e-6 of the tensor's largest CPU magnitude and rtol = 1e-5 (f32
// kernels that differ from the CPU only in the order of additions); dropout is compared exactly
// (its mask is a pure function of the key); bf16 results within one bf16 step (2^-8 relative).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
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

struct Result {
  Tensor out;
  std::vector<Tensor> grads;
};

// f on leaf copies of `inputs` on `device` (floating ones require grad), then backward with a
// fixed random output gradient. Integer inputs (targets, indices) travel along without grad.
Result run_on(const Fn& f, const std::vector<Tensor>& inputs, Device device, uint64_t seed) {
  std::vector<Tensor> leaves;
  for (const Tensor& x : inputs) {
    Tensor leaf = x.detach().clone().to(device);
    if (is_floating(x.dtype())) leaf.set_requires_grad(true);
    leaves.push_back(leaf);
  }
  Tensor out = f(leaves);
  Tensor g = testing::random_tensor(out.shape(), seed).to(out.dtype());
  out.backward(g.to(device));
  Result r{out.detach().to(kCpu), {}};
  for (const Tensor& leaf : leaves)
    r.grads.push_back(leaf.grad().defined() ? leaf.grad().to(kCpu) : Tensor());
  return r;
}

void expect_close(const Tensor& gpu, const Tensor& cpu, double rtol, const std::string& what,
                  double atol_frac = 1e-6) {
  ASSERT_EQ(gpu.defined(), cpu.defined()) << what;
  if (!cpu.defined()) return;
  ASSERT_EQ(gpu.shape(), cpu.shape()) << what;
  ASSERT_EQ(gpu.dtype(), cpu.dtype()) << what;
  const std::vector<float> g = gpu.to(DType::kF32).to_vector<float>();
  const std::vector<float> c = cpu.to(DType::kF32).to_vector<float>();
  float scale = 0.0f;
  for (float e : c) scale = std::max(scale, std::fabs(e));
  const double atol = atol_frac * double(scale);
  int failures = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double allowed = atol + rtol * std::fabs(double(c[i]));
    if (!(std::fabs(double(g[i]) - double(c[i])) <= allowed) && failures++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: cuda " << g[i] << " cpu " << c[i] << " (allowed "
                    << allowed << ")";
  }
}

void expect_cuda_matches_cpu(const Fn& f, const std::vector<Tensor>& inputs, double rtol = 1e-5,
                             uint64_t seed = 7, double atol_frac = 1e-6) {
  const Result gpu = run_on(f, inputs, kGpu, seed), cpu = run_on(f, inputs, kCpu, seed);
  expect_close(gpu.out, cpu.out, rtol, "output", atol_frac);
  for (size_t i = 0; i < inputs.size(); ++i)
    expect_close(gpu.grads[i], cpu.grads[i], rtol, "gradient of input " + std::to_string(i),
                 atol_frac);
}

Tensor rnd(const Shape& s, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  return testing::random_tensor(s, seed, lo, hi);
}

Tensor ids(const Shape& s, int64_t vocab, uint64_t seed, int64_t ignore_every = 0) {
  std::vector<int64_t> v(size_t(shape_numel(s)));
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < v.size(); ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    v[i] = ignore_every > 0 && i % size_t(ignore_every) == 0 ? -100 : int64_t(x % uint64_t(vocab));
  }
  return Tensor::from_vector(v, s);
}

TEST(CudaNnOps, LayerNormWithAndWithoutAffine) {
  LOOM_SKIP_WITHOUT_CUDA();
  for (const Shape& s : {Shape{1, 1}, Shape{3, 17}, Shape{2, 5, 768}, Shape{7, 1025}}) {
    SCOPED_TRACE(shape_str(s));
    const int64_t c = s.back();
    expect_cuda_matches_cpu(
        [](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); },
        {rnd(s, 1), rnd({c}, 2), rnd({c}, 3)});
    expect_cuda_matches_cpu(
        [](const std::vector<Tensor>& in) { return layer_norm(in[0], Tensor(), Tensor()); },
        {rnd(s, 4)});
  }
}

TEST(CudaNnOps, SoftmaxRowsAndViews) {
  LOOM_SKIP_WITHOUT_CUDA();
  for (const Shape& s : {Shape{1}, Shape{3, 17}, Shape{4, 1024}, Shape{2, 50304}}) {
    SCOPED_TRACE(shape_str(s));
    expect_cuda_matches_cpu([](const std::vector<Tensor>& in) { return softmax(in[0]); },
                            {rnd(s, 5, -4, 4)});
  }
  // A transposed view reaches the kernel as a contiguous copy.
  expect_cuda_matches_cpu(
      [](const std::vector<Tensor>& in) { return softmax(in[0].transpose(0, 1)); },
      {rnd({33, 7}, 6)});
}

TEST(CudaNnOps, AttentionCausalAndFull) {
  LOOM_SKIP_WITHOUT_CUDA();
  for (bool causal : {true, false})
    for (const Shape& s : {Shape{1, 1, 1, 8}, Shape{2, 3, 17, 16}, Shape{1, 2, 65, 64}}) {
      SCOPED_TRACE(::testing::Message() << shape_str(s) << " causal=" << causal);
      expect_cuda_matches_cpu(
          [causal](const std::vector<Tensor>& in) {
            return scaled_dot_product_attention(in[0], in[1], in[2], causal);
          },
          {rnd(s, 7), rnd(s, 8), rnd(s, 9)}, 1e-4);
    }
}

// Note [CUDA attention kernels]: LOOM_CUDA_ATTENTION picks the implementation; both match the
// CPU, in f32 and bf16, at a length with several causal row blocks and a head dim past the flash
// kernels' 128 (auto and gemm only); a bad value is a clear error. cuda_attention_test holds
// every element to its own rounding bound; this checks the wiring, so f32 gets an absolute floor
// of 1e-5 of the largest value (T 300 sums cancel in dq and dk) beside the 1e-4 relative.
TEST(CudaNnOps, AttentionEveryImplementation) {
  LOOM_SKIP_WITHOUT_CUDA();
  struct Restore {
    ~Restore() { unsetenv("LOOM_CUDA_ATTENTION"); }
  } restore;
  const double step = 1.0 / 128.0, frac = 1.0 / 256.0;
  auto bf16 = [](const Tensor& t) { return t.to(DType::kBF16); };
  for (const char* choice : {"auto", "gemm", "flash"}) {
    setenv("LOOM_CUDA_ATTENTION", choice, 1);
    const bool wide = std::string(choice) != "flash";
    for (const Shape& s : {Shape{2, 2, 300, 64}, Shape{1, 2, 40, wide ? 160 : 128}}) {
      SCOPED_TRACE(::testing::Message() << choice << " " << shape_str(s));
      expect_cuda_matches_cpu(
          [](const std::vector<Tensor>& in) {
            return scaled_dot_product_attention(in[0], in[1], in[2], true);
          },
          {rnd(s, 51), rnd(s, 52), rnd(s, 53)}, 1e-4, 7, 1e-5);
      expect_cuda_matches_cpu(
          [&](const std::vector<Tensor>& in) {
            return scaled_dot_product_attention(bf16(in[0]), bf16(in[1]), bf16(in[2]), true);
          },
          {rnd(s, 54), rnd(s, 55), rnd(s, 56)}, 2 * step, 7, 2 * frac);
    }
  }
  setenv("LOOM_CUDA_ATTENTION", "fast", 1);
  const Tensor q = rnd({1, 1, 4, 8}, 57).to(kGpu);
  try {
    scaled_dot_product_attention(q, q, q, true);
    ADD_FAILURE() << "LOOM_CUDA_ATTENTION=fast was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("LOOM_CUDA_ATTENTION='fast'"), std::string::npos)
        << e.what();
  }
}

TEST(CudaNnOps, CrossEntropyPaddedVocabularyAndIgnoredRows) {
  LOOM_SKIP_WITHOUT_CUDA();
  CrossEntropyOptions o;
  o.num_classes = 61;
  for (int64_t ignore_every : {0, 3}) {
    SCOPED_TRACE(::testing::Message() << "ignore every " << ignore_every);
    expect_cuda_matches_cpu(
        [o](const std::vector<Tensor>& in) { return cross_entropy(in[0], in[1], o); },
        {rnd({37, 64}, 10, -3, 3), ids({37}, 61, 11, ignore_every)});
  }
  // Every row ignored: loss 0 and zero gradient on both devices.
  expect_cuda_matches_cpu([](const std::vector<Tensor>& in) { return cross_entropy(in[0], in[1]); },
                          {rnd({5, 9}, 12), ids({5}, 9, 13, 1)});
}

TEST(CudaNnOps, EmbeddingWithRepeatedIndices) {
  LOOM_SKIP_WITHOUT_CUDA();
  Tensor many_of_one = Tensor::from_vector<int64_t>({3, 3, 3, 0, 3, 9, 3}, {7});
  expect_cuda_matches_cpu([](const std::vector<Tensor>& in) { return embedding(in[0], in[1]); },
                          {rnd({10, 33}, 14), many_of_one});
  expect_cuda_matches_cpu([](const std::vector<Tensor>& in) { return embedding(in[0], in[1]); },
                          {rnd({50, 768}, 15), ids({4, 64}, 50, 16)});
}

TEST(CudaNnOps, IndexAddRowsWithRepeatedIndices) {
  LOOM_SKIP_WITHOUT_CUDA();
  auto f = [](const std::vector<Tensor>& in) { return index_add_rows(in[0], in[1], in[2]); };
  Tensor many_of_one = Tensor::from_vector<int64_t>({3, 3, 3, 0, 3, 9, 3}, {7});
  expect_cuda_matches_cpu(f, {rnd({10, 33}, 18), many_of_one, rnd({7, 33}, 19)});
  expect_cuda_matches_cpu(f, {rnd({50, 768}, 20), ids({4, 64}, 50, 21), rnd({4, 64, 768}, 22)});
}

TEST(CudaNnOps, DropoutIsTheCpuMaskExactly) {
  LOOM_SKIP_WITHOUT_CUDA();
  DropoutKey key;
  key.seed = 42;
  key.stream = 3;
  key.offset = 1000;
  auto f = [key](const std::vector<Tensor>& in) { return dropout(in[0], 0.25, true, key); };
  const Result gpu = run_on(f, {rnd({5, 1001}, 17)}, kGpu, 1);
  const Result cpu = run_on(f, {rnd({5, 1001}, 17)}, kCpu, 1);
  EXPECT_EQ(gpu.out.to_vector<float>(), cpu.out.to_vector<float>());
  EXPECT_EQ(gpu.grads[0].to_vector<float>(), cpu.grads[0].to_vector<float>());
}

TEST(CudaNnOps, Bf16InputsTakeTheLowPrecisionPath) {
  LOOM_SKIP_WITHOUT_CUDA();
  const double bf16_step = 1.0 / 256.0;
  expect_cuda_matches_cpu(
      [](const std::vector<Tensor>& in) {
        return layer_norm(in[0].to(DType::kBF16), in[1], in[2]);
      },
      {rnd({6, 96}, 18), rnd({96}, 19), rnd({96}, 20)}, bf16_step);
  expect_cuda_matches_cpu(
      [](const std::vector<Tensor>& in) { return gelu(softmax(in[0].to(DType::kBF16))); },
      {rnd({6, 96}, 21)}, bf16_step);
}

// matmul and linear on all-bf16 CUDA tensors run cuBLAS's bf16 GEMM (Note [bf16 GEMMs on CUDA]);
// the CPU computes bf16 through f32 copies. Both round an f32 accumulation once, in different
// orders, so a result may land one bf16 step away (2^-7 relative at most), and a sum that cancels
// may differ by the accumulation error before rounding: 2^-8 of the tensor's largest value.
TEST(CudaNnOps, Bf16MatmulAndLinearUseTensorCoresWithTheCpuResult) {
  LOOM_SKIP_WITHOUT_CUDA();
  const double ulp = 1.0 / 128.0, atol_frac = 1.0 / 256.0;
  auto bf16 = [](const Tensor& t) { return t.to(DType::kBF16); };
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "ta=" << ta << " tb=" << tb);
      // a is [2, 33, 65]: K is 65, or 33 when a is transposed; b is K x 31 as stored or transposed.
      const int64_t k = ta ? 33 : 65, n = 31;
      const Shape b_shape = tb ? Shape{n, k} : Shape{k, n};
      expect_cuda_matches_cpu(
          [&](const std::vector<Tensor>& in) { return matmul(bf16(in[0]), bf16(in[1]), ta, tb); },
          {rnd({2, 33, 65}, 24), rnd(b_shape, 25)}, ulp, 7, atol_frac);
    }
  expect_cuda_matches_cpu(
      [&](const std::vector<Tensor>& in) { return matmul(bf16(in[0]), bf16(in[1])); },
      {rnd({3, 17, 64}, 26), rnd({3, 64, 31}, 27)}, ulp, 7, atol_frac);
  expect_cuda_matches_cpu(
      [&](const std::vector<Tensor>& in) { return linear(bf16(in[0]), bf16(in[1]), bf16(in[2])); },
      {rnd({4, 7, 96}, 28), rnd({130, 96}, 29), rnd({130}, 30)}, ulp, 7, atol_frac);
  expect_cuda_matches_cpu(
      [&](const std::vector<Tensor>& in) { return linear(bf16(in[0]), bf16(in[1])); },
      {rnd({5, 96}, 31), rnd({33, 96}, 32)}, ulp, 7, atol_frac);
}

// The ops that read bf16 directly on CUDA (Note [bf16 kernels on CUDA]) against the CPU's f32
// path on the same bf16 values: the same f32 results rounded once, up to the order of f32
// additions, so one bf16 step apart at most (2^-7 relative); attention's backward reads its
// rounded bf16 output, so its gradients get two steps.
TEST(CudaNnOps, Bf16KernelsGiveTheLowPrecisionResults) {
  LOOM_SKIP_WITHOUT_CUDA();
  const double step = 1.0 / 128.0, frac = 1.0 / 256.0;
  auto bf16 = [](const Tensor& t) { return t.to(DType::kBF16); };
  expect_cuda_matches_cpu([&](const std::vector<Tensor>& in) { return gelu(bf16(in[0])); },
                          {rnd({7, 333}, 33, -3, 3)}, step, 7, frac);
  expect_cuda_matches_cpu(
      [&](const std::vector<Tensor>& in) {
        return layer_norm(bf16(in[0]), bf16(in[1]), bf16(in[2]));
      },
      {rnd({9, 768}, 34), rnd({768}, 35), rnd({768}, 36)}, step, 7, frac);
  expect_cuda_matches_cpu(
      [&](const std::vector<Tensor>& in) { return embedding(bf16(in[0]), in[1]); },
      {rnd({50, 96}, 37), ids({3, 40}, 50, 38)}, step, 7, frac);
  CrossEntropyOptions o;
  o.num_classes = 61;
  expect_cuda_matches_cpu(
      [&](const std::vector<Tensor>& in) { return cross_entropy(bf16(in[0]), in[1], o); },
      {rnd({37, 64}, 39, -3, 3), ids({37}, 61, 40, 5)}, step, 7, frac);
  for (bool causal : {true, false})
    expect_cuda_matches_cpu(
        [&](const std::vector<Tensor>& in) {
          return scaled_dot_product_attention(bf16(in[0]), bf16(in[1]), bf16(in[2]), causal);
        },
        {rnd({2, 3, 33, 64}, 41), rnd({2, 3, 33, 64}, 42), rnd({2, 3, 33, 64}, 43)}, 2 * step, 7,
        2 * frac);
  // Dropout's mask and scale are the CPU's, and both round the same f32 product: exact.
  DropoutKey key;
  key.seed = 9;
  auto f = [&](const std::vector<Tensor>& in) { return dropout(bf16(in[0]), 0.1, true, key); };
  const Result gpu = run_on(f, {rnd({4, 777}, 44)}, kGpu, 3);
  const Result cpu = run_on(f, {rnd({4, 777}, 44)}, kCpu, 3);
  EXPECT_EQ(gpu.out.to(DType::kF32).to_vector<float>(), cpu.out.to(DType::kF32).to_vector<float>());
  EXPECT_EQ(gpu.grads[0].to_vector<float>(), cpu.grads[0].to_vector<float>());
}

TEST(CudaNnOps, MixedDevicesAreAClearError) {
  LOOM_SKIP_WITHOUT_CUDA();
  Tensor x = rnd({2, 4}, 22).to(kGpu), w = rnd({4}, 23);
  try {
    layer_norm(x, w, Tensor());
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("layer_norm"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cuda:0"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace loom
