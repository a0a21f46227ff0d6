// Microbenchmarks of the CPU kernels on raw buffers (no Tensor, no autograd): the numbers say
// what the kernels themselves reach. Counters: GFLOP/s for GEMM and attention (flops counted as
// 2*m*n*k per product), GB/s for the memory-bound ones (bytes read + written once).
// Run: build/bin/loom-bench [--benchmark_filter=gemm]; set OMP_NUM_THREADS for the thread count.
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/layer_norm.h"
#include "kernels/cpu/vocab_parallel_cross_entropy.h"

namespace {

namespace cpu = loom::kernels::cpu;

std::vector<float> random_floats(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// C[m,n] = A[m,k] B[k,n]^T: the shape of a linear layer's forward (weight is [out, in]).
void BM_gemm(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  auto a = random_floats(size_t(m * k), 1), b = random_floats(size_t(n * k), 2);
  std::vector<float> c(static_cast<size_t>(m * n));
  for (auto _ : state) {
    cpu::gemm(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c.data(), n);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * double(m * n * k) * double(state.iterations()),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
// GPT training shapes at B*T = 1024 tokens, dim 256: qkv, proj, fc, fc-proj, and the vocab head.
BENCHMARK(BM_gemm)
    ->Args({1024, 768, 256})
    ->Args({1024, 256, 256})
    ->Args({1024, 1024, 256})
    ->Args({1024, 256, 1024})
    ->Args({1024, 50304, 64})
    ->Unit(benchmark::kMillisecond);

void BM_layer_norm_forward(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  auto x = random_floats(size_t(rows * cols), 3), w = random_floats(size_t(cols), 4),
       b = random_floats(size_t(cols), 5);
  std::vector<float> y(x.size()), mean(static_cast<size_t>(rows)), rstd(static_cast<size_t>(rows));
  for (auto _ : state) {
    cpu::layer_norm_forward(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), rows,
                            cols, 1e-5f);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GB/s"] =
      benchmark::Counter(8.0 * double(rows * cols) * double(state.iterations()),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_layer_norm_forward)
    ->Args({1024, 256})
    ->Args({8192, 768})
    ->Unit(benchmark::kMicrosecond);

void BM_layer_norm_backward(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  auto x = random_floats(size_t(rows * cols), 3), w = random_floats(size_t(cols), 4),
       b = random_floats(size_t(cols), 5), dy = random_floats(size_t(rows * cols), 6);
  std::vector<float> y(x.size()), mean(static_cast<size_t>(rows)), rstd(static_cast<size_t>(rows)),
      dx(x.size()), dw(static_cast<size_t>(cols)), db(static_cast<size_t>(cols));
  cpu::layer_norm_forward(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), rows,
                          cols, 1e-5f);
  for (auto _ : state) {
    cpu::layer_norm_backward(x.data(), w.data(), mean.data(), rstd.data(), dy.data(), dx.data(),
                             dw.data(), db.data(), rows, cols);
    benchmark::DoNotOptimize(dx.data());
  }
  // reads x and dy, writes dx
  state.counters["GB/s"] =
      benchmark::Counter(12.0 * double(rows * cols) * double(state.iterations()),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_layer_norm_backward)
    ->Args({1024, 256})
    ->Args({8192, 768})
    ->Unit(benchmark::kMicrosecond);

// Causal attention forward + backward, [B*H, T, D]. Causal flops: the two products of each pass
// cover half of T x T, so forward 2 * (2 * T*T/2 * D) per head and backward about twice that.
void BM_attention(benchmark::State& state) {
  const int64_t bh = state.range(0), t = state.range(1), d = state.range(2);
  const size_t n = size_t(bh * t * d);
  auto q = random_floats(n, 7), k = random_floats(n, 8), v = random_floats(n, 9),
       dout = random_floats(n, 10);
  std::vector<float> out(n), lse(static_cast<size_t>(bh * t)), dq(n), dk(n), dv(n);
  for (auto _ : state) {
    cpu::attention_forward(q.data(), k.data(), v.data(), out.data(), lse.data(), bh, t, d, true);
    cpu::attention_backward(q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(),
                            dq.data(), dk.data(), dv.data(), bh, t, d, true);
    benchmark::DoNotOptimize(dq.data());
  }
  const double flops = 6.0 * 2.0 * double(bh) * double(t) * double(t) / 2.0 * double(d);
  state.counters["GFLOP/s"] = benchmark::Counter(
      flops * double(state.iterations()), benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_attention)->Args({32, 128, 64})->Args({96, 128, 64})->Unit(benchmark::kMillisecond);

// Fused softmax cross-entropy forward + backward over [rows, vocab] logits.
void BM_cross_entropy(benchmark::State& state) {
  const int64_t rows = state.range(0), vocab = state.range(1);
  auto logits = random_floats(size_t(rows * vocab), 11, 4.0f);
  std::vector<int32_t> targets(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) targets[size_t(i)] = int32_t((i * 7919) % vocab);
  std::vector<float> lse(static_cast<size_t>(rows)), dlogits(logits.size());
  cpu::CrossEntropyShape shape;
  shape.rows = rows;
  shape.cols = vocab;
  shape.num_classes = vocab;
  shape.ignore_index = -100;
  for (auto _ : state) {
    int64_t count = 0;
    double loss =
        cpu::cross_entropy_forward(logits.data(), targets.data(), lse.data(), shape, &count);
    cpu::cross_entropy_backward(logits.data(), targets.data(), lse.data(), 1.0f / float(count),
                                dlogits.data(), shape);
    benchmark::DoNotOptimize(loss);
  }
  // forward reads the logits; backward reads them and writes the gradient
  state.counters["GB/s"] =
      benchmark::Counter(12.0 * double(rows * vocab) * double(state.iterations()),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_cross_entropy)
    ->Args({1024, 256})
    ->Args({512, 50257})
    ->Args({1024, 50304})
    ->Unit(benchmark::kMillisecond);

// The vocab-parallel cross-entropy's kernels on one rank holding every column (the allreduces
// between them are no-ops there): forward + backward, to set beside BM_cross_entropy.
void BM_vocab_parallel_cross_entropy(benchmark::State& state) {
  const int64_t rows = state.range(0), vocab = state.range(1);
  auto logits = random_floats(size_t(rows * vocab), 11, 4.0f);
  std::vector<int32_t> targets(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) targets[size_t(i)] = int32_t((i * 7919) % vocab);
  std::vector<float> local_max(static_cast<size_t>(rows)), target_logit(local_max.size()),
      sum_exp(local_max.size()), lse(local_max.size()), dlogits(logits.size());
  std::vector<double> local_sum_exp(local_max.size());
  cpu::VocabParallelCrossEntropyShape shape;
  shape.rows = rows;
  shape.cols = vocab;
  shape.local_classes = vocab;
  for (auto _ : state) {
    cpu::vocab_parallel_cross_entropy_local_stats(logits.data(), targets.data(), local_max.data(),
                                                  local_sum_exp.data(), shape);
    cpu::vocab_parallel_cross_entropy_target_logit(logits.data(), targets.data(),
                                                   target_logit.data(), shape);
    cpu::vocab_parallel_cross_entropy_rescale_sum_exp(local_max.data(), local_sum_exp.data(),
                                                      local_max.data(), sum_exp.data(), rows);
    int64_t count = 0;
    double loss =
        cpu::vocab_parallel_cross_entropy_loss(targets.data(), local_max.data(), sum_exp.data(),
                                               target_logit.data(), lse.data(), shape, &count);
    cpu::vocab_parallel_cross_entropy_backward(logits.data(), targets.data(), lse.data(),
                                               1.0f / float(count), dlogits.data(), shape);
    benchmark::DoNotOptimize(loss);
  }
  // as BM_cross_entropy: the forward reads the logits once, the backward reads and writes
  state.counters["GB/s"] =
      benchmark::Counter(12.0 * double(rows * vocab) * double(state.iterations()),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_vocab_parallel_cross_entropy)->Args({1024, 50304})->Unit(benchmark::kMillisecond);

void BM_gelu(benchmark::State& state) {
  const int64_t n = state.range(0);
  auto x = random_floats(size_t(n), 12, 3.0f), dy = random_floats(size_t(n), 13);
  std::vector<float> y(static_cast<size_t>(n)), dx(static_cast<size_t>(n));
  for (auto _ : state) {
    cpu::gelu_forward(x.data(), y.data(), n);
    cpu::gelu_backward(x.data(), dy.data(), dx.data(), n);
    benchmark::DoNotOptimize(dx.data());
  }
  state.counters["GB/s"] =
      benchmark::Counter(20.0 * double(n) * double(state.iterations()), benchmark::Counter::kIsRate,
                         benchmark::Counter::kIs1000);
}
BENCHMARK(BM_gelu)->Arg(1 << 20)->Unit(benchmark::kMicrosecond);

// The memory-bandwidth reference for the GB/s figures above: memcpy of the same order of bytes
// (counted as read + write).
void BM_memcpy_reference(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<float> src = random_floats(n, 14), dst(n);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), n * sizeof(float));
    benchmark::DoNotOptimize(dst.data());
  }
  state.counters["GB/s"] =
      benchmark::Counter(8.0 * double(n) * double(state.iterations()), benchmark::Counter::kIsRate,
                         benchmark::Counter::kIs1000);
}
// From in-cache to DRAM: 2, 8, 32, 128 and 512 MiB moved per call (read + write), so each
// memory-bound kernel above can be held against a copy of a comparable footprint.
BENCHMARK(BM_memcpy_reference)
    ->Arg(1 << 18)
    ->Arg(1 << 20)
    ->Arg(1 << 22)
    ->Arg(1 << 24)
    ->Arg(1 << 26)
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
