// The CUDA optimizer updates (kernels/cuda/optimizer_update.h) and global-norm kernels
// (kernels/cuda/norm_reduce.h) against their CPU twins: the same random parameters, gradients
// and state (fixed seeds) through both, over several steps, every element compared. Skips
// without a GPU, and when loom was built without CUDA.
//
// Tolerances.
// - Optimizer state (parameters, momentum buffers, exp_avg, exp_avg_sq): the CUDA kernels
//   round exactly where the CPU build does (Note [Optimizer FMA contraction] in
//   optimizer_update.cu), so on the reference build they agree bit for bit; the tests report
//   how many elements are bit-identical. What they require is |cuda - cpu| <= 1e-6 (|old| + |new|)
//   per element and step: every new value is a multiple of the old one plus an increment whose
//   magnitude is at most |old| + |new|, so this is 1e-6 relative to the terms that make it, and
//   it holds where a CPU built without FMA rounds a product differently (~6e-8 of a term per
//   step, a few steps).
// - The multi-tensor kernels give exactly the single-tensor kernel's bits (the same device code):
//   required bit for bit.
// - Sums of squares: every term x^2 is exact in f64 and positive, so any order of the n - 1
//   additions is within gamma(n - 1) = (n - 1) 2^-53 / (1 - (n - 1) 2^-53) of the exact sum,
//   relative (Higham, Accuracy and Stability of Numerical Algorithms, eq. 4.4). CPU and CUDA
//   add in different orders, so they may differ by twice that: 2 n 2^-53 relative, rigorous
//   (a fixed 1e-12 would be too strict past n ~ 4500 and too loose below).
// - Clipping, given the same sum of squares, is the CPU's formula in the same IEEE operations:
//   bit for bit.
// - Determinism (the same bits from two runs) is exact.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/optimizer_update.h"
#include "kernels/cuda/runtime.h"
#include "testing/device_buffer.h"
#include "testing/files.h"  // expect_error

#if LOOM_WITH_CUDA
#include "kernels/cuda/norm_reduce.h"
#include "kernels/cuda/optimizer_update.h"
#endif

namespace loom::kernels {
namespace {

#if !LOOM_WITH_CUDA

TEST(CudaOptimizer, NeedsCuda) {
  GTEST_SKIP() << "loom was built without CUDA (LOOM_WITH_CUDA=0): no CUDA kernels to test";
}

#else

using testing::expect_error;
constexpr cuda::Stream kStream = nullptr;  // the legacy default stream: ordered with the copies
constexpr double kRtol = 1e-6;

// ---------------------------------------------------------------- device memory

using Buffer = ::loom::testing::DeviceBuffer;

// ---------------------------------------------------------------- inputs and comparisons

std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> value(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = value(gen);
  return v;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }
bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

// Counts of one comparison: elements checked, bit-identical ones, out-of-tolerance ones.
struct Tally {
  int64_t elements = 0, identical = 0, bad = 0;
  void add(const Tally& o) {
    elements += o.elements;
    identical += o.identical;
    bad += o.bad;
  }
};

// Compares one state array after an update: |got - want| <= kRtol (|old| + |want|). Reports the
// first few mismatches with index and all three values.
Tally compare_state(const std::string& what, const std::vector<float>& got,
                    const std::vector<float>& want, const std::vector<float>& old) {
  Tally t;
  EXPECT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    ++t.elements;
    if (same_bits(got[i], want[i])) {
      ++t.identical;
      continue;
    }
    const double diff = std::fabs(double(got[i]) - double(want[i]));
    const double tol = kRtol * (std::fabs(double(old[i])) + std::fabs(double(want[i])));
    if (!(diff <= tol) && t.bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "] of " << got.size() << ": cuda " << got[i] << ", cpu "
                    << want[i] << " (before the step " << old[i] << ", diff " << diff << ", tol "
                    << tol << ")";
  }
  return t;
}

void report(const std::string& what, const Tally& t) {
  std::cout << "[ info ] " << what << ": " << t.identical << " of " << t.elements
            << " elements bit-identical to the CPU\n";
}

// Expects two runs' outputs to be the same bits.
void expect_identical(const std::string& what, const std::vector<float>& a,
                      const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (!same_bits(a[i], b[i]) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "] of " << a.size() << ": " << a[i] << " vs " << b[i];
}

const std::vector<int64_t> kSizes = {1, 3, 17, 127, 769, 4095, 4096, 4097, 100003};

// ---------------------------------------------------------------- SGD

struct SgdConfig {
  const char* name;
  double momentum, dampening, weight_decay;
  bool nesterov;
};

const SgdConfig kSgdConfigs[] = {
    {"plain", 0.0, 0.0, 0.0, false},
    {"weight_decay", 0.0, 0.0, 1e-2, false},
    {"momentum", 0.9, 0.0, 0.0, false},
    {"momentum_dampening_weight_decay", 0.9, 0.1, 1e-2, false},
    {"nesterov_weight_decay", 0.9, 0.0, 5e-3, true},
};

cpu::SgdHyper sgd_hyper(const SgdConfig& c, int step) {
  cpu::SgdHyper h;
  h.lr = 0.05 * (1.0 + 0.1 * step);  // a schedule, so each step rounds its own lr
  h.momentum = c.momentum;
  h.dampening = c.dampening;
  h.weight_decay = c.weight_decay;
  h.nesterov = c.nesterov;
  h.first_step = step == 0;
  return h;
}

constexpr int kSteps = 4;

TEST(CudaOptimizer, SgdMatchesCpu) {
  LOOM_SKIP_WITHOUT_CUDA();
  for (const SgdConfig& c : kSgdConfigs) {
    Tally total;
    for (int64_t n : kSizes) {
      SCOPED_TRACE(std::string(c.name) + ", n = " + std::to_string(n));
      const bool momentum = c.momentum != 0.0;
      std::vector<float> param = random_floats(size_t(n), 1 + uint64_t(n));
      std::vector<float> buf(momentum ? size_t(n) : 0, 0.0f);
      Buffer d_param(param), d_grad(size_t(n) * sizeof(float)), d_buf(buf);
      for (int step = 0; step < kSteps; ++step) {
        const cpu::SgdHyper h = sgd_hyper(c, step);
        const std::vector<float> grad = random_floats(size_t(n), 100 + uint64_t(step * 7 + n));
        d_grad.write(grad);
        const std::vector<float> param_old = param, buf_old = buf;
        cpu::sgd_step(param.data(), grad.data(), momentum ? buf.data() : nullptr, n, h);
        cuda::sgd_step(d_param.as<float>(), d_grad.as<float>(),
                       momentum ? d_buf.as<float>() : nullptr, n, h, kStream);
        const std::string at = " after step " + std::to_string(step + 1);
        total.add(compare_state("param" + at, d_param.read<float>(size_t(n)), param, param_old));
        if (momentum)
          total.add(compare_state("momentum_buf" + at, d_buf.read<float>(size_t(n)), buf, buf_old));
      }
    }
    report(std::string("sgd ") + c.name, total);
  }
}

// ---------------------------------------------------------------- AdamW

struct AdamWConfig {
  const char* name;
  double beta1, beta2, eps, weight_decay;
};

const AdamWConfig kAdamWConfigs[] = {
    {"default", 0.9, 0.999, 1e-8, 0.0},
    {"weight_decay", 0.9, 0.999, 1e-8, 0.1},
    {"gpt_betas_weight_decay", 0.9, 0.95, 1e-6, 0.01},
};

cpu::AdamWHyper adamw_hyper(const AdamWConfig& c, int step) {
  cpu::AdamWHyper h;
  h.lr = 1e-3 * (1.0 + 0.1 * step);
  h.beta1 = c.beta1;
  h.beta2 = c.beta2;
  h.eps = c.eps;
  h.weight_decay = c.weight_decay;
  h.step = step + 1;
  return h;
}

TEST(CudaOptimizer, AdamWMatchesCpu) {
  LOOM_SKIP_WITHOUT_CUDA();
  for (const AdamWConfig& c : kAdamWConfigs) {
    Tally total;
    for (int64_t n : kSizes) {
      SCOPED_TRACE(std::string(c.name) + ", n = " + std::to_string(n));
      std::vector<float> param = random_floats(size_t(n), 3 + uint64_t(n));
      std::vector<float> m(size_t(n), 0.0f), v(size_t(n), 0.0f);
      Buffer d_param(param), d_grad(size_t(n) * sizeof(float)), d_m(m), d_v(v);
      for (int step = 0; step < kSteps; ++step) {
        const cpu::AdamWHyper h = adamw_hyper(c, step);
        const std::vector<float> grad = random_floats(size_t(n), 200 + uint64_t(step * 7 + n));
        d_grad.write(grad);
        const std::vector<float> param_old = param, m_old = m, v_old = v;
        cpu::adamw_step(param.data(), grad.data(), m.data(), v.data(), n, h);
        cuda::adamw_step(d_param.as<float>(), d_grad.as<float>(), d_m.as<float>(), d_v.as<float>(),
                         n, h, kStream);
        const std::string at = " after step " + std::to_string(step + 1);
        total.add(compare_state("param" + at, d_param.read<float>(size_t(n)), param, param_old));
        total.add(compare_state("exp_avg" + at, d_m.read<float>(size_t(n)), m, m_old));
        total.add(compare_state("exp_avg_sq" + at, d_v.read<float>(size_t(n)), v, v_old));
      }
    }
    report(std::string("adamw ") + c.name, total);
  }
}

// ---------------------------------------------------------------- many tensors

// Sizes of 160 tensors, 136 of them non-empty (three launches: 64, 64, 8): 0 and 1 among them,
// odd sizes, sizes at and around the 4096-element chunk.
std::vector<int64_t> many_sizes() {
  const int64_t pool[] = {1, 2, 3, 17, 31, 127, 769, 4095, 4096, 4097, 9000};
  std::mt19937_64 gen(77);
  std::vector<int64_t> sizes;
  for (int i = 0; i < 160; ++i)
    sizes.push_back(i % 7 == 3 ? 0 : pool[gen() % (sizeof(pool) / sizeof(pool[0]))]);
  sizes[0] = 1;
  sizes[1] = 0;
  sizes.back() = 20000;
  return sizes;
}

// Tensors packed into one allocation per array, each followed by a guard element the kernels
// must not touch. offsets[t] is tensor t's first element.
struct Packed {
  std::vector<int64_t> sizes, offsets;
  int64_t total = 0;
  explicit Packed(std::vector<int64_t> s) : sizes(std::move(s)) {
    for (int64_t n : sizes) {
      offsets.push_back(total);
      total += n + 1;  // + guard
    }
  }
  size_t count() const { return sizes.size(); }
  // Tensor t's elements out of a packed host array.
  std::vector<float> slice(const std::vector<float>& all, size_t t) const {
    return std::vector<float>(all.begin() + offsets[t], all.begin() + offsets[t] + sizes[t]);
  }
};

constexpr float kGuard = 12345.0f;

void set_guards(const Packed& p, std::vector<float>& all) {
  for (size_t t = 0; t < p.count(); ++t) all[size_t(p.offsets[t] + p.sizes[t])] = kGuard;
}

void expect_guards(const Packed& p, const std::vector<float>& all, const std::string& what) {
  for (size_t t = 0; t < p.count(); ++t) {
    const float g = all[size_t(p.offsets[t] + p.sizes[t])];
    EXPECT_EQ(g, kGuard) << what << ": the element after tensor " << t << " (size " << p.sizes[t]
                         << ") was overwritten";
  }
}

TEST(CudaOptimizer, SgdMultiMatchesSingleAndCpu) {
  LOOM_SKIP_WITHOUT_CUDA();
  const Packed p(many_sizes());
  for (const SgdConfig& c : kSgdConfigs) {
    SCOPED_TRACE(c.name);
    const bool momentum = c.momentum != 0.0;
    std::vector<float> param = random_floats(size_t(p.total), 5);
    std::vector<float> buf(size_t(p.total), 0.0f);
    set_guards(p, param);
    set_guards(p, buf);
    // multi: the fused launches; single: one sgd_step per tensor; cpu: cpu::sgd_step per tensor.
    Buffer multi_param(param), multi_buf(buf), single_param(param), single_buf(buf),
        d_grad(size_t(p.total) * sizeof(float));
    std::vector<float> cpu_param = param, cpu_buf = buf;
    Tally total;
    for (int step = 0; step < kSteps; ++step) {
      const cpu::SgdHyper h = sgd_hyper(c, step);
      const std::vector<float> grad = random_floats(size_t(p.total), 300 + uint64_t(step));
      d_grad.write(grad);
      std::vector<cuda::SgdTensor> tensors;
      for (size_t t = 0; t < p.count(); ++t) {
        const int64_t o = p.offsets[t], n = p.sizes[t];
        if (n == 0) {  // an empty tensor's pointers are never read
          tensors.push_back({nullptr, nullptr, nullptr, 0});
          continue;
        }
        tensors.push_back({multi_param.as<float>() + o, d_grad.as<float>() + o,
                           momentum ? multi_buf.as<float>() + o : nullptr, n});
        cuda::sgd_step(single_param.as<float>() + o, d_grad.as<float>() + o,
                       momentum ? single_buf.as<float>() + o : nullptr, n, h, kStream);
      }
      cuda::sgd_step_multi(tensors.data(), int64_t(tensors.size()), h, kStream);
      const std::vector<float> cpu_param_old = cpu_param, cpu_buf_old = cpu_buf;
      for (size_t t = 0; t < p.count(); ++t) {
        const int64_t o = p.offsets[t];
        cpu::sgd_step(cpu_param.data() + o, grad.data() + o,
                      momentum ? cpu_buf.data() + o : nullptr, p.sizes[t], h);
      }
      const std::string at = " after step " + std::to_string(step + 1);
      const std::vector<float> got_param = multi_param.read<float>(size_t(p.total));
      const std::vector<float> got_buf = multi_buf.read<float>(size_t(p.total));
      expect_identical("multi vs single param" + at, got_param,
                       single_param.read<float>(size_t(p.total)));
      expect_identical("multi vs single momentum_buf" + at, got_buf,
                       single_buf.read<float>(size_t(p.total)));
      expect_guards(p, got_param, "param" + at);
      expect_guards(p, got_buf, "momentum_buf" + at);
      for (size_t t = 0; t < p.count(); ++t) {
        const std::string what = " of tensor " + std::to_string(t) + at;
        total.add(compare_state("param" + what, p.slice(got_param, t), p.slice(cpu_param, t),
                                p.slice(cpu_param_old, t)));
        if (momentum)
          total.add(compare_state("momentum_buf" + what, p.slice(got_buf, t), p.slice(cpu_buf, t),
                                  p.slice(cpu_buf_old, t)));
      }
    }
    report(std::string("sgd_step_multi ") + c.name, total);
  }
}

TEST(CudaOptimizer, AdamWMultiMatchesSingleAndCpu) {
  LOOM_SKIP_WITHOUT_CUDA();
  const Packed p(many_sizes());
  for (const AdamWConfig& c : kAdamWConfigs) {
    SCOPED_TRACE(c.name);
    std::vector<float> param = random_floats(size_t(p.total), 6);
    std::vector<float> m(size_t(p.total), 0.0f), v(size_t(p.total), 0.0f);
    set_guards(p, param);
    set_guards(p, m);
    set_guards(p, v);
    Buffer multi_param(param), multi_m(m), multi_v(v), single_param(param), single_m(m),
        single_v(v), d_grad(size_t(p.total) * sizeof(float));
    std::vector<float> cpu_param = param, cpu_m = m, cpu_v = v;
    Tally total;
    for (int step = 0; step < kSteps; ++step) {
      const cpu::AdamWHyper h = adamw_hyper(c, step);
      const std::vector<float> grad = random_floats(size_t(p.total), 400 + uint64_t(step));
      d_grad.write(grad);
      std::vector<cuda::AdamWTensor> tensors;
      for (size_t t = 0; t < p.count(); ++t) {
        const int64_t o = p.offsets[t], n = p.sizes[t];
        if (n == 0) {
          tensors.push_back({nullptr, nullptr, nullptr, nullptr, 0});
          continue;
        }
        tensors.push_back({multi_param.as<float>() + o, d_grad.as<float>() + o,
                           multi_m.as<float>() + o, multi_v.as<float>() + o, n});
        cuda::adamw_step(single_param.as<float>() + o, d_grad.as<float>() + o,
                         single_m.as<float>() + o, single_v.as<float>() + o, n, h, kStream);
      }
      cuda::adamw_step_multi(tensors.data(), int64_t(tensors.size()), h, kStream);
      const std::vector<float> cpu_param_old = cpu_param, cpu_m_old = cpu_m, cpu_v_old = cpu_v;
      for (size_t t = 0; t < p.count(); ++t) {
        const int64_t o = p.offsets[t];
        cpu::adamw_step(cpu_param.data() + o, grad.data() + o, cpu_m.data() + o, cpu_v.data() + o,
                        p.sizes[t], h);
      }
      const std::string at = " after step " + std::to_string(step + 1);
      const std::vector<float> got_param = multi_param.read<float>(size_t(p.total));
      const std::vector<float> got_m = multi_m.read<float>(size_t(p.total));
      const std::vector<float> got_v = multi_v.read<float>(size_t(p.total));
      expect_identical("multi vs single param" + at, got_param,
                       single_param.read<float>(size_t(p.total)));
      expect_identical("multi vs single exp_avg" + at, got_m,
                       single_m.read<float>(size_t(p.total)));
      expect_identical("multi vs single exp_avg_sq" + at, got_v,
                       single_v.read<float>(size_t(p.total)));
      expect_guards(p, got_param, "param" + at);
      expect_guards(p, got_m, "exp_avg" + at);
      expect_guards(p, got_v, "exp_avg_sq" + at);
      for (size_t t = 0; t < p.count(); ++t) {
        const std::string what = " of tensor " + std::to_string(t) + at;
        total.add(compare_state("param" + what, p.slice(got_param, t), p.slice(cpu_param, t),
                                p.slice(cpu_param_old, t)));
        total.add(compare_state("exp_avg" + what, p.slice(got_m, t), p.slice(cpu_m, t),
                                p.slice(cpu_m_old, t)));
        total.add(compare_state("exp_avg_sq" + what, p.slice(got_v, t), p.slice(cpu_v, t),
                                p.slice(cpu_v_old, t)));
      }
    }
    report(std::string("adamw_step_multi ") + c.name, total);
  }
}

TEST(CudaOptimizer, EmptyCallsLaunchNothing) {
  LOOM_SKIP_WITHOUT_CUDA();
  cpu::SgdHyper sgd;
  sgd.lr = 0.1;
  sgd.momentum = 0.9;
  cuda::sgd_step(nullptr, nullptr, nullptr, 0, sgd, kStream);
  cuda::sgd_step_multi(nullptr, 0, sgd, kStream);
  const cuda::SgdTensor empty[2] = {{nullptr, nullptr, nullptr, 0}, {nullptr, nullptr, nullptr, 0}};
  cuda::sgd_step_multi(empty, 2, sgd, kStream);
  cpu::AdamWHyper adamw;
  adamw.lr = 1e-3;
  cuda::adamw_step(nullptr, nullptr, nullptr, nullptr, 0, adamw, kStream);
  cuda::adamw_step_multi(nullptr, 0, adamw, kStream);
  cuda_rt::synchronize(0);
}

TEST(CudaOptimizer, BadArgumentsAreNamed) {
  LOOM_SKIP_WITHOUT_CUDA();
  Buffer p(std::vector<float>(8, 1.0f)), g(std::vector<float>(8, 1.0f));
  cpu::SgdHyper h;
  h.lr = 0.1;
  h.momentum = 0.9;
  expect_error([&] { cuda::sgd_step(p.as<float>(), g.as<float>(), nullptr, 8, h, kStream); },
               {"sgd_step", "momentum_buf", "null"});
  const cuda::SgdTensor tensors[2] = {{p.as<float>(), g.as<float>(), p.as<float>(), 4},
                                      {p.as<float>(), g.as<float>(), nullptr, 4}};
  expect_error([&] { cuda::sgd_step_multi(tensors, 2, h, kStream); },
               {"sgd_step_multi", "tensors[1].momentum_buf", "null"});
  expect_error([&] { cuda::sgd_step_multi(tensors, -1, h, kStream); },
               {"sgd_step_multi", "count = -1"});
  // A bad tensor past the first launch's 64: the error comes before anything is updated.
  const std::vector<float> ones(400, 1.0f);
  Buffer many(ones), many_grad(ones), many_buf(ones);
  std::vector<cuda::SgdTensor> list;
  for (int64_t i = 0; i < 100; ++i)
    list.push_back({many.as<float>() + 4 * i, many_grad.as<float>() + 4 * i,
                    i == 90 ? nullptr : many_buf.as<float>() + 4 * i, 4});
  expect_error([&] { cuda::sgd_step_multi(list.data(), 100, h, kStream); },
               {"sgd_step_multi", "tensors[90].momentum_buf", "null"});
  expect_identical("parameters after a rejected call", many.read<float>(400), ones);
  cpu::AdamWHyper a;
  expect_error(
      [&] {
        cuda::adamw_step(p.as<float>(), g.as<float>(), nullptr, p.as<float>(), 8, a, kStream);
      },
      {"adamw_step", "exp_avg", "null"});
  expect_error(
      [&] {
        cuda::adamw_step(p.as<float>(), g.as<float>(), p.as<float>(), p.as<float>(), -2, a,
                         kStream);
      },
      {"adamw_step", "n = -2"});
}

// ---------------------------------------------------------------- sums of squares

// |got - want| <= 2 n 2^-53 want (see the top of the file); n terms, all positive.
void expect_sum_close(double got, double want, int64_t n, const std::string& what) {
  const double tol = 2.0 * double(n) * std::ldexp(1.0, -53) * 1.001 * want;
  EXPECT_LE(std::fabs(got - want), tol)
      << what << ": cuda " << got << ", cpu " << want << " (" << n << " terms, relative diff "
      << std::fabs(got - want) / want << ")";
}

double run_sum_of_squares(const Buffer& x, int64_t n) {
  const size_t bytes = cuda::sum_of_squares_workspace_bytes(n);
  Buffer workspace(bytes), out(sizeof(double));
  workspace.poison();
  out.poison();
  cuda::sum_of_squares(x.as<float>(), n, out.as<double>(), workspace.as<void>(), bytes, kStream);
  return out.read<double>(1)[0];
}

TEST(CudaNormReduce, SumOfSquaresMatchesCpu) {
  LOOM_SKIP_WITHOUT_CUDA();
  for (int64_t n : {int64_t(0), int64_t(1), int64_t(3), int64_t(17), int64_t(4095), int64_t(4096),
                    int64_t(4097), int64_t(100003), int64_t(1) << 22, (int64_t(1) << 22) + 5}) {
    const std::string what = "sum_of_squares n = " + std::to_string(n);
    const std::vector<float> x = random_floats(size_t(n), 11 + uint64_t(n), -3.0f, 3.0f);
    const Buffer d_x(x);
    const double want = cpu::sum_of_squares(x.data(), n);
    const double got = run_sum_of_squares(d_x, n);
    if (n == 0) {
      EXPECT_TRUE(same_bits(got, 0.0)) << what << ": " << got;
      continue;
    }
    expect_sum_close(got, want, n, what);
    const double again = run_sum_of_squares(d_x, n);
    EXPECT_TRUE(same_bits(got, again))
        << what << " is not deterministic: " << got << " then " << again;
  }
}

TEST(CudaNormReduce, SumOfSquaresMultiMatchesCpu) {
  LOOM_SKIP_WITHOUT_CUDA();
  const Packed p(many_sizes());
  const std::vector<float> all = random_floats(size_t(p.total), 12, -2.0f, 2.0f);
  const Buffer d_all(all);
  std::vector<const float*> tensors;
  double want = 0.0;  // the CPU's optim::grad_sum_of_squares order: per tensor, then in order
  int64_t terms = 0;
  for (size_t t = 0; t < p.count(); ++t) {
    tensors.push_back(p.sizes[t] == 0 ? nullptr : d_all.as<float>() + p.offsets[t]);
    want += cpu::sum_of_squares(all.data() + p.offsets[t], p.sizes[t]);
    terms += p.sizes[t];
  }
  const size_t bytes =
      cuda::sum_of_squares_multi_workspace_bytes(p.sizes.data(), int64_t(p.count()));
  Buffer workspace(bytes), out(sizeof(double));
  double first = 0.0;
  for (int run = 0; run < 2; ++run) {
    workspace.poison();
    out.poison();
    cuda::sum_of_squares_multi(tensors.data(), p.sizes.data(), int64_t(p.count()), out.as<double>(),
                               workspace.as<void>(), bytes, kStream);
    const double got = out.read<double>(1)[0];
    if (run == 0) {
      expect_sum_close(got, want, terms, "sum_of_squares_multi");
      first = got;
    } else {
      EXPECT_TRUE(same_bits(got, first))
          << "sum_of_squares_multi is not deterministic: " << first << " then " << got;
    }
  }
  // No tensors, or only empty ones: 0, written without a launch.
  out.poison();
  cuda::sum_of_squares_multi(nullptr, nullptr, 0, out.as<double>(), nullptr, 0, kStream);
  EXPECT_TRUE(same_bits(out.read<double>(1)[0], 0.0));
  const int64_t zeros[3] = {0, 0, 0};
  const float* nulls[3] = {nullptr, nullptr, nullptr};
  EXPECT_EQ(cuda::sum_of_squares_multi_workspace_bytes(zeros, 3), 0u);
  out.poison();
  cuda::sum_of_squares_multi(nulls, zeros, 3, out.as<double>(), nullptr, 0, kStream);
  EXPECT_TRUE(same_bits(out.read<double>(1)[0], 0.0));
}

TEST(CudaNormReduce, WorkspaceTooSmallIsNamed) {
  LOOM_SKIP_WITHOUT_CUDA();
  const Buffer x(std::vector<float>(10000, 1.0f));
  const size_t bytes = cuda::sum_of_squares_workspace_bytes(10000);
  Buffer workspace(bytes), out(sizeof(double));
  expect_error(
      [&] {
        cuda::sum_of_squares(x.as<float>(), 10000, out.as<double>(), workspace.as<void>(),
                             bytes - 1, kStream);
      },
      {"sum_of_squares", "workspace", "too small", std::to_string(bytes)});
  const float* tensors[2] = {x.as<float>(), x.as<float>()};
  const int64_t sizes[2] = {5000, 5000};
  expect_error(
      [&] {
        cuda::sum_of_squares_multi(tensors, sizes, 2, out.as<double>(), workspace.as<void>(), 8,
                                   kStream);
      },
      {"sum_of_squares_multi", "workspace", "too small"});
  const int64_t bad_sizes[2] = {5000, -1};
  expect_error(
      [&] {
        cuda::sum_of_squares_multi(tensors, bad_sizes, 2, out.as<double>(), workspace.as<void>(),
                                   bytes, kStream);
      },
      {"sum_of_squares_multi", "sizes[1] = -1"});
}

// ---------------------------------------------------------------- clipping

// optim::scale_grads_to_norm (optimizer/clip_grad.cpp) on host data, given the sum of squares.
void cpu_clip(std::vector<float>& all, const Packed& p, double sum_sq, double max_norm) {
  const double norm = std::sqrt(sum_sq);
  const double coef = max_norm / (norm + 1e-6);
  if (!std::isfinite(norm) || !(coef < 1.0)) return;
  for (size_t t = 0; t < p.count(); ++t)
    cpu::scale(all.data() + p.offsets[t], float(coef), all.data() + p.offsets[t], p.sizes[t]);
}

TEST(CudaNormReduce, ClipByGlobalNormMatchesCpu) {
  LOOM_SKIP_WITHOUT_CUDA();
  const Packed p(many_sizes());
  std::vector<float> all = random_floats(size_t(p.total), 13);
  set_guards(p, all);
  std::vector<int64_t> sizes = p.sizes;
  const size_t bytes = cuda::sum_of_squares_multi_workspace_bytes(sizes.data(), int64_t(p.count()));
  Buffer workspace(bytes), sum_sq(sizeof(double));
  // max_norm below the norm (~316: scales) twice, then far above it (leaves all as it is); then
  // a sum of squares that is inf or NaN (leaves all as it is).
  for (double max_norm : {1.0, 50.0, 1e9}) {
    SCOPED_TRACE("max_norm = " + std::to_string(max_norm));
    Buffer d_all(all);
    std::vector<float*> tensors;
    for (size_t t = 0; t < p.count(); ++t)
      tensors.push_back(p.sizes[t] == 0 ? nullptr : d_all.as<float>() + p.offsets[t]);
    cuda::sum_of_squares_multi(tensors.data(), sizes.data(), int64_t(p.count()),
                               sum_sq.as<double>(), workspace.as<void>(), bytes, kStream);
    cuda::clip_by_global_norm(tensors.data(), sizes.data(), int64_t(p.count()), sum_sq.as<double>(),
                              max_norm, kStream);
    const double s = sum_sq.read<double>(1)[0];  // the CPU mirror uses the GPU's sum
    std::vector<float> want = all;
    cpu_clip(want, p, s, max_norm);
    const std::vector<float> got = d_all.read<float>(size_t(p.total));
    expect_identical("clipped tensors", got, want);
    expect_guards(p, got, "clip_by_global_norm");
    std::cout << "[ info ] max_norm " << max_norm << ": norm " << std::sqrt(s) << ", coef "
              << max_norm / (std::sqrt(s) + 1e-6) << "\n";
  }
  for (double bad :
       {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    Buffer d_all(all);
    std::vector<float*> tensors;
    for (size_t t = 0; t < p.count(); ++t)
      tensors.push_back(p.sizes[t] == 0 ? nullptr : d_all.as<float>() + p.offsets[t]);
    sum_sq.write(std::vector<double>{bad});
    cuda::clip_by_global_norm(tensors.data(), sizes.data(), int64_t(p.count()), sum_sq.as<double>(),
                              1.0, kStream);
    expect_identical("tensors after a non-finite norm", d_all.read<float>(size_t(p.total)), all);
  }
}

TEST(CudaNormReduce, ClipBadArgumentsAreNamed) {
  LOOM_SKIP_WITHOUT_CUDA();
  Buffer x(std::vector<float>(4, 1.0f)), sum_sq(std::vector<double>{4.0});
  float* tensors[1] = {x.as<float>()};
  const int64_t sizes[1] = {4};
  expect_error(
      [&] { cuda::clip_by_global_norm(tensors, sizes, 1, sum_sq.as<double>(), 0.0, kStream); },
      {"clip_by_global_norm", "max_norm", "> 0"});
  expect_error([&] { cuda::clip_by_global_norm(tensors, sizes, 1, nullptr, 1.0, kStream); },
               {"clip_by_global_norm", "sum_sq", "null"});
  float* nulls[1] = {nullptr};
  expect_error(
      [&] { cuda::clip_by_global_norm(nulls, sizes, 1, sum_sq.as<double>(), 1.0, kStream); },
      {"clip_by_global_norm", "tensors[0]", "null"});
}

#endif  // LOOM_WITH_CUDA

}  // namespace
}  // namespace loom::kernels
