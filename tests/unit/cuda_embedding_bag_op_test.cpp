// The embedding_bag op, embedding_bag_sparse_grad and nn::EmbeddingBagCollection on CUDA tensors
// against the same calls on CPU tensors (whose kernels embedding_bag_kernel_test.cpp checks against
// a naive reference): the same random batches (fixed seeds) through both, every element compared.
// Covers sum / mean / none pooling, f32 and bf16 tables, i32 and i64 indices, per-sample weights,
// the dense backward, the three fused optimizers over three steps, the sparse gradient, kWarn /
// kSkip, and errors (the same text on both devices). Skips without a GPU, and when loom was built
// without CUDA. The kernels alone are tested in embedding_bag_cuda_test.cpp.
//
// Tolerances, as embedding_bag_cuda_test.cpp states them. Both devices read the same stored weights
// (bf16 converted exactly to f32) and differ only in the order of f32 additions, so every sum
// (outputs, gradients, sparse values, per-sample-weight gradients) is compared with 1e-5 times the
// sum of |terms| that make it: the CPU op run on |tables|, |per-sample weights| and |dout|. A
// gradient the op rounds to bf16 (bf16 tables' dense gradients) may also land one bf16 step
// (2^-7 of the value, itself at most the sum of |terms|) away, so it gets 2^-7 more. Weights
// updated in place, and what is computed from them after an update, are compared with 1e-5 (f32)
// or 1e-2 (bf16: a one-unit difference before the single rounding may move the stored value by
// one bf16 step) times (1 + |value|); so is the optimizer state. Integers (sparse ids and offsets)
// and error messages are exact; the backward's promised determinism is checked bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/embedding_bag.h"
#include "core/error.h"
#include "core/nn/embedding_bag_collection.h"
#include "core/tensor.h"
#include "kernels/cuda/runtime.h"
#include "testing/device_buffer.h"
#include "testing/gradcheck.h"

namespace loom {
namespace {

#if !LOOM_WITH_CUDA

TEST(CudaEmbeddingBagOp, NeedsCuda) {
  GTEST_SKIP() << "loom was built without CUDA (LOOM_WITH_CUDA=0): no CUDA op path to test";
}

#else

const Device kGpu = Device::cuda(0);
const Device kCpu = Device::cpu();
constexpr double kRtol = 1e-5;
constexpr double kBf16Rtol = 1.0 / 128 * 1.01 + kRtol;  // one bf16 step (+1% for the rounded scale)
constexpr double kUpdatedF32 = 1e-5;
constexpr double kUpdatedBf16 = 1e-2;

// ---------------------------------------------------------------- batches

// One random batch of lookups over T tables, feature-major CSR (Note [Embedding bag layout]).
struct Batch {
  std::vector<int64_t> rows, dims;
  int64_t batch = 0;
  std::vector<int64_t> idx, off;
  std::vector<float> psw;

  EmbeddingBagLayout layout() const { return EmbeddingBagLayout(rows, dims); }
  int64_t num_indices() const { return int64_t(idx.size()); }
  Tensor indices(DType dtype, Device device) const { return as_index(idx, dtype, device); }
  Tensor offsets(DType dtype, Device device) const { return as_index(off, dtype, device); }
  Tensor per_sample_weights(Device device) const {
    return Tensor::from_vector(psw, {num_indices()}, device);
  }

  static Tensor as_index(const std::vector<int64_t>& v, DType dtype, Device device) {
    if (dtype == DType::kI64) return Tensor::from_vector(v, {int64_t(v.size())}, device);
    const std::vector<int32_t> v32(v.begin(), v.end());
    return Tensor::from_vector(v32, {int64_t(v.size())}, device);
  }
};

// Bags of 0..max_len lookups (empty bags included); a `hot` fraction of lookups goes to row 0,
// which makes long runs of one row (the backward splits those over warps).
Batch make_batch(uint64_t seed, std::vector<int64_t> rows, std::vector<int64_t> dims, int64_t batch,
                 int max_len, double hot = 0.0) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> len(0, max_len);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::uniform_real_distribution<float> weight(-1.0f, 1.0f);
  Batch b;
  b.rows = std::move(rows);
  b.dims = std::move(dims);
  b.batch = batch;
  b.off.push_back(0);
  for (size_t t = 0; t < b.rows.size(); ++t)
    for (int64_t bag = 0; bag < batch; ++bag) {
      const int n = len(rng);
      std::uniform_int_distribution<int64_t> row(0, b.rows[t] - 1);
      for (int k = 0; k < n; ++k) b.idx.push_back(unit(rng) < hot ? 0 : row(rng));
      b.off.push_back(int64_t(b.idx.size()));
    }
  for (size_t p = 0; p < b.idx.size(); ++p) b.psw.push_back(weight(rng));
  return b;
}

// Odd sizes: a one-row table, rows and dims around warp multiples, a dim past 128, long runs.
std::vector<Batch> batches() {
  return {make_batch(1, {1, 3, 17, 127}, {4, 8, 12, 132}, 3, 5),
          make_batch(2, {769, 5}, {64, 20}, 17, 9, 0.5),
          make_batch(3, {1000}, {128}, 127, 40, 0.3)};
}

std::vector<Tensor> make_tables(const Batch& b, uint64_t seed, DType dtype) {
  std::vector<Tensor> tables;
  for (size_t t = 0; t < b.rows.size(); ++t)
    tables.push_back(testing::random_tensor({b.rows[t], b.dims[t]}, seed + t).to(dtype));
  return tables;
}

// ---------------------------------------------------------------- helpers

std::vector<float> host_f32(const Tensor& t) {
  return t.detach().to(kCpu).to(DType::kF32).to_vector<float>();
}

// |x| on the host, in x's dtype (exact for bf16 too).
Tensor abs_of(const Tensor& x) {
  std::vector<float> v = host_f32(x);
  for (float& e : v) e = std::fabs(e);
  return Tensor::from_vector(v, x.shape()).to(x.dtype());
}

std::vector<Tensor> abs_of(const std::vector<Tensor>& xs) {
  std::vector<Tensor> out;
  for (const Tensor& x : xs) out.push_back(abs_of(x));
  return out;
}

std::vector<Tensor> to_device(const std::vector<Tensor>& xs, Device device) {
  std::vector<Tensor> out;
  for (const Tensor& x : xs) out.push_back(x.detach().to(device).clone());
  return out;
}

// Every element within rtol * |scale| + atol; the first mismatch is printed with its position.
void expect_within(const std::string& what, const Tensor& got, const Tensor& want,
                   const std::vector<float>& scale, double rtol, double atol = 0.0) {
  ASSERT_TRUE(got.defined()) << what << ": the CUDA result is undefined";
  ASSERT_TRUE(want.defined()) << what << ": the CPU result is undefined";
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<float> g = host_f32(got), w = host_f32(want);
  ASSERT_EQ(scale.size(), w.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    const double tol = rtol * std::fabs(double(scale[i])) + atol;
    if (std::fabs(double(g[i]) - double(w[i])) <= tol) continue;  // false for NaN
    if (bad == 0)
      ADD_FAILURE() << what << ": first mismatch at element " << i << " of "
                    << shape_str(want.shape()) << ": cuda " << g[i] << ", cpu " << w[i]
                    << ", tolerance " << tol;
    ++bad;
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << w.size() << " elements differ";
}

// Within rtol * (1 + |cpu value|): weights updated in place and the optimizer state.
void expect_updated(const std::string& what, const Tensor& got, const Tensor& want, double rtol) {
  std::vector<float> scale = host_f32(want);
  for (float& s : scale) s = 1.0f + std::fabs(s);
  expect_within(what, got, want, scale, rtol);
}

void expect_same_ints(const std::string& what, const Tensor& got, const Tensor& want) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<int64_t> g = got.to_vector<int64_t>(), w = want.to_vector<int64_t>();
  for (size_t i = 0; i < w.size(); ++i)
    ASSERT_EQ(g[i], w[i]) << what << ": first mismatch at element " << i;
}

void expect_same_bits(const std::string& what, const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  const std::vector<float> x = host_f32(a), y = host_f32(b);
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_EQ(std::memcmp(&x[i], &y[i], sizeof(float)), 0)
        << what << ": run 1 and run 2 differ at element " << i << " (" << x[i] << " vs " << y[i]
        << ")";
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::string case_str(size_t batch, DType dtype, DType index, EmbeddingPooling pooling, bool psw) {
  static const char* kPooling[] = {"sum", "mean", "none"};
  return "batch " + std::to_string(batch) + " " + dtype_name(dtype) + " tables, " +
         dtype_name(index) + " indices, " + kPooling[int(pooling)] + " pooling" +
         (psw ? ", per-sample weights" : "");
}

// The op with its gradients, on `device`: tables (CPU, any dtype) and the batch are copied there.
struct Result {
  Tensor out;
  std::vector<Tensor> table_grads;
  Tensor psw_grad;
};

Result run(const Batch& b, const std::vector<Tensor>& host_tables, Device device, DType index,
           const EmbeddingBagOptions& options, bool with_psw, const Tensor& host_dout,
           bool abs_inputs = false) {
  std::vector<Tensor> tables = to_device(abs_inputs ? abs_of(host_tables) : host_tables, device);
  for (Tensor& t : tables) t.set_requires_grad(true);
  Tensor psw;
  if (with_psw) {
    psw = b.per_sample_weights(kCpu);
    psw = (abs_inputs ? abs_of(psw) : psw).to(device).set_requires_grad(true);
  }
  Result r;
  r.out = embedding_bag(tables, b.layout(), b.indices(index, device), b.offsets(index, device), psw,
                        options);
  if (host_dout.defined()) {
    r.out.backward((abs_inputs ? abs_of(host_dout) : host_dout).to(device));
    for (const Tensor& t : tables) r.table_grads.push_back(t.grad());
    if (with_psw) r.psw_grad = psw.grad();
  }
  return r;
}

const EmbeddingPooling kPoolings[] = {EmbeddingPooling::kSum, EmbeddingPooling::kMean,
                                      EmbeddingPooling::kNone};

// ---------------------------------------------------------------- forward and dense backward

TEST(CudaEmbeddingBagOp, ForwardAndDenseBackwardMatchTheCpu) {
  LOOM_SKIP_WITHOUT_CUDA();
  const std::vector<Batch> all = batches();
  for (size_t bi = 0; bi < all.size(); ++bi) {
    const Batch& b = all[bi];
    for (DType dtype : {DType::kF32, DType::kBF16})
      for (DType index : {DType::kI32, DType::kI64})
        for (EmbeddingPooling pooling : kPoolings)
          for (bool with_psw : {false, true}) {
            if (with_psw && pooling != EmbeddingPooling::kSum) continue;
            const std::string what = case_str(bi, dtype, index, pooling, with_psw);
            SCOPED_TRACE(what);
            const std::vector<Tensor> tables = make_tables(b, 10 * bi, dtype);
            EmbeddingBagOptions o;
            o.pooling = pooling;
            const Tensor shape_probe = run(b, tables, kCpu, index, o, with_psw, Tensor()).out;
            const Tensor dout = testing::random_tensor(shape_probe.shape(), 100 + bi);
            const Result cpu = run(b, tables, kCpu, index, o, with_psw, dout);
            const Result gpu = run(b, tables, kGpu, index, o, with_psw, dout);
            const Result mag = run(b, tables, kCpu, index, o, with_psw, dout, true);
            ASSERT_EQ(gpu.out.device(), kGpu);
            expect_within(what + ": output", gpu.out, cpu.out, host_f32(mag.out), kRtol);
            for (size_t t = 0; t < tables.size(); ++t) {
              ASSERT_EQ(gpu.table_grads[t].dtype(), dtype);
              ASSERT_EQ(gpu.table_grads[t].device(), kGpu);
              expect_within(what + ": table " + std::to_string(t) + "'s gradient",
                            gpu.table_grads[t], cpu.table_grads[t], host_f32(mag.table_grads[t]),
                            dtype == DType::kF32 ? kRtol : kBf16Rtol);
            }
            if (with_psw)
              expect_within(what + ": per-sample weights' gradient", gpu.psw_grad, cpu.psw_grad,
                            host_f32(mag.psw_grad), kRtol);
            // The backward promises the same bits from run to run.
            const Result again = run(b, tables, kGpu, index, o, with_psw, dout);
            for (size_t t = 0; t < tables.size(); ++t)
              expect_same_bits(what + ": table gradient", again.table_grads[t], gpu.table_grads[t]);
            if (with_psw) expect_same_bits(what + ": psw gradient", again.psw_grad, gpu.psw_grad);
          }
  }
}

// ---------------------------------------------------------------- the module, fused optimizers

struct FusedCase {
  EmbeddingOptimizer kind;
  EmbeddingPooling pooling;
  bool psw;
  const char* name;
};

TEST(CudaEmbeddingBagOp, CollectionWithFusedOptimizersMatchesTheCpuOverThreeSteps) {
  LOOM_SKIP_WITHOUT_CUDA();
  const std::vector<nn::EmbeddingTableConfig> configs = {
      {"user", 17, 12}, {"item", 769, 64}, {"tiny", 1, 4}};
  const std::vector<int64_t> rows = {17, 769, 1}, dims = {12, 64, 4};
  const FusedCase cases[] = {
      {EmbeddingOptimizer::kNone, EmbeddingPooling::kSum, true, "dense gradients"},
      {EmbeddingOptimizer::kSgd, EmbeddingPooling::kSum, true, "SGD"},
      {EmbeddingOptimizer::kRowwiseAdagrad, EmbeddingPooling::kMean, false, "row-wise Adagrad"},
      {EmbeddingOptimizer::kAdam, EmbeddingPooling::kNone, false, "Adam"},
      {EmbeddingOptimizer::kAdam, EmbeddingPooling::kSum, true, "Adam with per-sample weights"}};
  for (DType dtype : {DType::kF32, DType::kBF16})
    for (const FusedCase& k : cases) {
      const std::string what = std::string(k.name) + ", " + dtype_name(dtype) + " tables";
      SCOPED_TRACE(what);
      const double rtol = dtype == DType::kF32 ? kUpdatedF32 : kUpdatedBf16;
      nn::EmbeddingBagCollectionOptions o;
      o.pooling = k.pooling;
      o.fused.kind = k.kind;
      o.fused.lr = k.kind == EmbeddingOptimizer::kAdam ? 0.01f : 0.1f;
      o.fused.eps = 1e-6f;
      o.fused.weight_decay = k.kind == EmbeddingOptimizer::kRowwiseAdagrad ? 0.0f : 0.01f;
      nn::EmbeddingBagCollection cpu(configs, o), gpu(configs, o);
      cpu.init_parameters(11);
      gpu.init_parameters(11);
      if (dtype != DType::kF32) {
        cpu.to(dtype);
        gpu.to(dtype);
      }
      gpu.to(kGpu);
      for (int step = 0; step < 3; ++step) {
        const std::string at = what + ", step " + std::to_string(step);
        const Batch b = make_batch(200 + uint64_t(step), rows, dims, 5, 6, 0.3);
        const DType index = step % 2 == 0 ? DType::kI64 : DType::kI32;
        Tensor psw_c, psw_g;
        if (k.psw) {
          psw_c = b.per_sample_weights(kCpu).set_requires_grad(true);
          psw_g = b.per_sample_weights(kGpu).set_requires_grad(true);
        }
        Tensor out_c = cpu.lookup(b.indices(index, kCpu), b.offsets(index, kCpu), psw_c);
        Tensor out_g = gpu.lookup(b.indices(index, kGpu), b.offsets(index, kGpu), psw_g);
        expect_updated(at + ": output", out_g, out_c, rtol);
        const Tensor dout = testing::random_tensor(out_c.shape(), 300 + uint64_t(step));
        out_c.backward(dout);
        out_g.backward(dout.to(kGpu));
        if (k.psw)
          expect_updated(at + ": per-sample weights' gradient", psw_g.grad(), psw_c.grad(), rtol);
        for (size_t t = 0; t < configs.size(); ++t) {
          const std::string table = at + ": table '" + configs[t].name + "'";
          if (k.kind == EmbeddingOptimizer::kNone) {
            expect_updated(table + "'s gradient", gpu.weights()[t].grad(), cpu.weights()[t].grad(),
                           rtol);
            Tensor(cpu.weights()[t]).zero_grad();  // a handle on the same parameter
            Tensor(gpu.weights()[t]).zero_grad();
          } else {
            EXPECT_FALSE(gpu.weights()[t].grad().defined()) << table << ": fused, no gradient";
          }
          ASSERT_EQ(gpu.weights()[t].device(), kGpu);
          expect_updated(table + "'s weights", gpu.weights()[t], cpu.weights()[t], rtol);
        }
      }
      if (k.kind == EmbeddingOptimizer::kNone) continue;
      const EmbeddingFusedOptimizer& fc = *cpu.fused_optimizer();
      const EmbeddingFusedOptimizer& fg = *gpu.fused_optimizer();
      EXPECT_EQ(fg.hyper.step, fc.hyper.step);
      if (fc.momentum1.defined()) {
        EXPECT_EQ(fg.momentum1.device(), kGpu) << "the state follows the tables";
        expect_updated(what + ": momentum1", fg.momentum1, fc.momentum1, kUpdatedF32);
      }
      if (fc.momentum2.defined())
        expect_updated(what + ": momentum2", fg.momentum2, fc.momentum2, kUpdatedF32);
    }
}

// ---------------------------------------------------------------- sparse gradient

TEST(CudaEmbeddingBagOp, SparseGradientMatchesTheCpu) {
  LOOM_SKIP_WITHOUT_CUDA();
  const std::vector<Batch> all = batches();
  for (size_t bi = 0; bi < all.size(); ++bi) {
    const Batch& b = all[bi];
    const EmbeddingBagLayout layout = b.layout();
    for (DType dtype : {DType::kF32, DType::kBF16})
      for (DType index : {DType::kI32, DType::kI64})
        for (EmbeddingPooling pooling : kPoolings)
          for (bool with_psw : {false, true}) {
            if (with_psw && pooling != EmbeddingPooling::kSum) continue;
            const std::string what = case_str(bi, dtype, index, pooling, with_psw);
            SCOPED_TRACE(what);
            const std::vector<Tensor> tables = make_tables(b, 10 * bi, dtype);
            EmbeddingBagOptions o;
            o.pooling = pooling;
            const Tensor psw = with_psw ? b.per_sample_weights(kCpu) : Tensor();
            const Tensor out = embedding_bag(tables, layout, b.indices(index, kCpu),
                                             b.offsets(index, kCpu), psw, o);
            const Tensor dout = testing::random_tensor(out.shape(), 400 + bi);
            auto sparse = [&](const std::vector<Tensor>& t, const Tensor& d, const Tensor& w,
                              Device device) {
              return embedding_bag_sparse_grad(
                  to_device(t, device), layout, b.indices(index, device), b.offsets(index, device),
                  d.to(device), w.defined() ? w.to(device) : Tensor(), o);
            };
            const EmbeddingSparseGradient cpu = sparse(tables, dout, psw, kCpu);
            const EmbeddingSparseGradient gpu = sparse(tables, dout, psw, kGpu);
            const EmbeddingSparseGradient mag =
                sparse(abs_of(tables), abs_of(dout), with_psw ? abs_of(psw) : Tensor(), kCpu);
            EXPECT_EQ(gpu.ids.device(), kGpu);
            EXPECT_EQ(gpu.values.device(), kGpu);
            expect_same_ints(what + ": ids", gpu.ids, cpu.ids);
            expect_same_ints(what + ": value_offsets", gpu.value_offsets, cpu.value_offsets);
            expect_within(what + ": values", gpu.values, cpu.values, host_f32(mag.values), kRtol);
            const EmbeddingSparseGradient again = sparse(tables, dout, psw, kGpu);
            expect_same_bits(what + ": values", again.values, gpu.values);
          }
  }
}

// ---------------------------------------------------------------- bad input

// Two tables (3 x 4 and 5 x 8), batch 2; bags: t0 {1, 2} {} ; t1 {4} {0, 4, 3}.
struct Small {
  EmbeddingBagLayout layout{{3, 5}, {4, 8}, {"user", "item"}};
  std::vector<Tensor> tables = {testing::random_tensor({3, 4}, 1),
                                testing::random_tensor({5, 8}, 2)};
  std::vector<int64_t> idx = {1, 2, 4, 0, 4, 3};
  std::vector<int64_t> off = {0, 2, 2, 3, 6};
};

TEST(CudaEmbeddingBagOp, ErrorsAreTheCpusWordForWord) {
  LOOM_SKIP_WITHOUT_CUDA();
  const Small s;
  struct Bad {
    std::vector<int64_t> idx, off;
    int64_t psw_len;  // -1: none
    EmbeddingBoundsCheck mode;
    const char* expect;  // a part of the message
  };
  const Bad cases[] = {
      {{1, 2, 5, 0, 4, 3}, s.off, -1, EmbeddingBoundsCheck::kError, "index 5 at position 2"},
      {{1, -1, 4, 0, 4, 7}, s.off, -1, EmbeddingBoundsCheck::kError, "index -1 at position 1"},
      {{1, 2, 4, 0, 9, 3}, s.off, 6, EmbeddingBoundsCheck::kError, "table 1 ('item'), bag 1"},
      {s.idx,
       {0, 2, 1, 3, 6},
       -1,
       EmbeddingBoundsCheck::kError,
       "'offsets' decrease at position 2"},
      {s.idx, {0, 2, 1, 3, 6}, -1, EmbeddingBoundsCheck::kSkip, "'offsets' decrease at position 2"},
      {s.idx, {1, 2, 2, 3, 6}, -1, EmbeddingBoundsCheck::kWarn, "the first offset must be 0"},
      {s.idx, {0, 2, 2, 3, 5}, -1, EmbeddingBoundsCheck::kError, "is 5 but there are 6 indices"},
      {s.idx, s.off, 5, EmbeddingBoundsCheck::kError, "wrong length: got 5, expected 6"},
  };
  for (DType index : {DType::kI32, DType::kI64})
    for (const Bad& c : cases) {
      auto call = [&](Device device) {
        EmbeddingBagOptions o;
        o.bounds_check = c.mode;
        const Tensor psw =
            c.psw_len >= 0 ? Tensor::ones({c.psw_len}, DType::kF32, device) : Tensor();
        embedding_bag(to_device(s.tables, device), s.layout, Batch::as_index(c.idx, index, device),
                      Batch::as_index(c.off, index, device), psw, o);
      };
      const std::string cpu = error_of([&] { call(kCpu); });
      const std::string gpu = error_of([&] { call(kGpu); });
      EXPECT_NE(cpu.find(c.expect), std::string::npos) << cpu;
      EXPECT_EQ(gpu, cpu) << dtype_name(index) << " indices";
      // The sparse gradient validates the same way.
      const std::string sparse_gpu = error_of([&] {
        embedding_bag_sparse_grad(to_device(s.tables, kGpu), s.layout,
                                  Batch::as_index(c.idx, index, kGpu),
                                  Batch::as_index(c.off, index, kGpu), Tensor::zeros({2, 12}),
                                  Tensor(), EmbeddingBagOptions{EmbeddingPooling::kSum, c.mode});
      });
      if (c.psw_len < 0) EXPECT_EQ(sparse_gpu, cpu) << "sparse, " << dtype_name(index);
    }

  // Arguments on different devices are named.
  const std::string mixed = error_of([&] {
    embedding_bag(s.tables, s.layout, Batch::as_index(s.idx, DType::kI64, kGpu),
                  Batch::as_index(s.off, DType::kI64, kGpu));
  });
  EXPECT_NE(mixed.find("'indices' is on cuda:0 but the tables are on cpu"), std::string::npos)
      << mixed;
  const std::string psw_elsewhere = error_of([&] {
    embedding_bag(to_device(s.tables, kGpu), s.layout, Batch::as_index(s.idx, DType::kI64, kGpu),
                  Batch::as_index(s.off, DType::kI64, kGpu), Tensor::ones({6}));
  });
  EXPECT_NE(psw_elsewhere.find("'per_sample_weights' is on cpu but the tables are on cuda:0"),
            std::string::npos)
      << psw_elsewhere;
}

// kWarn looks bad indices up as row 0 and warns with their count; kSkip ignores them. Outputs and
// gradients match the CPU's, and the warning is the same line.
TEST(CudaEmbeddingBagOp, WarnAndSkipMatchTheCpu) {
  LOOM_SKIP_WITHOUT_CUDA();
  const Small s;
  Batch b;
  b.rows = {3, 5};
  b.dims = {4, 8};
  b.batch = 2;
  b.idx = {7, 2, 4, -3, 4, 3};  // two bad: table 0 bag 0, table 1 bag 1
  b.off = s.off;
  b.psw = {0.5f, -1.0f, 2.0f, 0.25f, 1.5f, -0.75f};
  for (EmbeddingBoundsCheck mode : {EmbeddingBoundsCheck::kWarn, EmbeddingBoundsCheck::kSkip})
    for (EmbeddingPooling pooling : kPoolings) {
      const bool with_psw = pooling == EmbeddingPooling::kSum;
      EmbeddingBagOptions o;
      o.pooling = pooling;
      o.bounds_check = mode;
      const std::string what =
          std::string(mode == EmbeddingBoundsCheck::kWarn ? "kWarn" : "kSkip") + ", pooling " +
          std::to_string(int(pooling));
      SCOPED_TRACE(what);
      const Tensor probe = run(b, s.tables, kCpu, DType::kI64, o, with_psw, Tensor()).out;
      const Tensor dout = testing::random_tensor(probe.shape(), 7);
      ::testing::internal::CaptureStderr();
      const Result cpu = run(b, s.tables, kCpu, DType::kI64, o, with_psw, dout);
      const std::string cpu_warning = ::testing::internal::GetCapturedStderr();
      ::testing::internal::CaptureStderr();
      const Result gpu = run(b, s.tables, kGpu, DType::kI64, o, with_psw, dout);
      const std::string gpu_warning = ::testing::internal::GetCapturedStderr();
      EXPECT_EQ(gpu_warning, cpu_warning);
      if (mode == EmbeddingBoundsCheck::kWarn)
        EXPECT_NE(cpu_warning.find("2 index(es) outside their table"), std::string::npos)
            << cpu_warning;
      else
        EXPECT_EQ(cpu_warning, "");
      const Result mag = run(b, s.tables, kCpu, DType::kI64, o, with_psw, dout, true);
      expect_within(what + ": output", gpu.out, cpu.out, host_f32(mag.out), kRtol);
      for (size_t t = 0; t < 2; ++t)
        expect_within(what + ": table gradient", gpu.table_grads[t], cpu.table_grads[t],
                      host_f32(mag.table_grads[t]), kRtol);
      if (with_psw)
        expect_within(what + ": psw gradient", gpu.psw_grad, cpu.psw_grad, host_f32(mag.psw_grad),
                      kRtol);
    }
}

// An empty batch (B = 0) and a batch of only empty bags go through without launching on nothing.
TEST(CudaEmbeddingBagOp, EmptyBatchesWork) {
  LOOM_SKIP_WITHOUT_CUDA();
  const Small s;
  for (const std::vector<int64_t>& off : {std::vector<int64_t>{0}, std::vector<int64_t>{0, 0, 0}})
    for (EmbeddingPooling pooling : kPoolings) {
      Batch b;
      b.rows = {3, 5};
      b.dims = {4, 8};
      b.batch = (int64_t(off.size()) - 1) / 2;
      b.off = off;
      EmbeddingBagOptions o;
      o.pooling = pooling;
      const Tensor probe = run(b, s.tables, kCpu, DType::kI32, o, false, Tensor()).out;
      const Tensor dout = testing::random_tensor(probe.shape(), 8);
      const Result cpu = run(b, s.tables, kCpu, DType::kI32, o, false, dout);
      const Result gpu = run(b, s.tables, kGpu, DType::kI32, o, false, dout);
      const std::vector<float> zeros(size_t(cpu.out.numel()), 0.0f);
      expect_within("empty: output", gpu.out, cpu.out, zeros, 0.0);
      for (size_t t = 0; t < 2; ++t)
        expect_within("empty: gradient", gpu.table_grads[t], cpu.table_grads[t],
                      std::vector<float>(size_t(cpu.table_grads[t].numel()), 0.0f), 0.0);
      const EmbeddingSparseGradient sparse = embedding_bag_sparse_grad(
          to_device(s.tables, kGpu), s.layout, b.indices(DType::kI32, kGpu),
          b.offsets(DType::kI32, kGpu), dout.to(kGpu), Tensor(), o);
      EXPECT_EQ(sparse.ids.shape(), (Shape{0, 2}));
      EXPECT_EQ(sparse.value_offsets.to_vector<int64_t>(), std::vector<int64_t>{0});
      EXPECT_EQ(sparse.values.numel(), 0);
    }
}

#endif  // LOOM_WITH_CUDA

}  // namespace
}  // namespace loom
