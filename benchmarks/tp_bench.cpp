// loom-bench-tp: tensor parallelism's communication and speed, under mpirun -np N (N = tp).
//
// 1. Bytes moved per transformer block per training step, from the communicator's counters,
//    beside Megatron-LM's formula: without sequence parallelism 2 allreduces of B x T x C in
//    forward and 2 in backward; with it an all-gather and a reduce-scatter of B x T x C in place
//    of each (plus the tp-sum of the LayerNorm and bias gradients), and as in Megatron-LM's
//    implementation 2 all-gathers more in backward, which rebuild the column-parallel linears'
//    inputs for their weight gradients (Note [Sequence-parallel linears keep their shard] in
//    parallel/tensor_parallel/layers.cpp). The per-block figure is the
//    difference between an L-block and an (L-1)-block model, so embedding and loss traffic cancel.
// 2. Step time (forward, backward, AdamW) of the same GPT with tp 1 (every rank trains its own
//    copy, one core each) and with tp N over all ranks, median of --steps after --warmup, and the
//    speedup.
//
//   mpirun -np 2 build/bin/loom-bench-tp [--layers 4 --dim 256 --heads 4 --seq 128 --batch 8]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_gpt.h"
#include "collectives/communicator.h"
#include "core/nn/gpt.h"
#include "core/ops.h"
#include "optimizer/adamw.h"
#include "parallel/tensor_parallel/tp_gpt.h"

namespace {

using namespace loom;
using Clock = std::chrono::steady_clock;

struct Args {
  int64_t layers = 4, dim = 256, heads = 4, seq = 128, batch = 8, vocab = 256, steps = 8,
          warmup = 2;
};

Args parse(int argc, char** argv) {
  Args a;
  bench::parse_int_flags(argc, argv, "loom-bench-tp",
                         {{"layers", &a.layers},
                          {"dim", &a.dim},
                          {"heads", &a.heads},
                          {"seq", &a.seq},
                          {"batch", &a.batch},
                          {"vocab", &a.vocab},
                          {"steps", &a.steps},
                          {"warmup", &a.warmup}});
  return a;
}

GptConfig config_of(const Args& a, int64_t layers) {
  return bench::bench_config(layers, a.dim, a.heads, a.seq, a.vocab);
}

// Token ids and next-token targets [batch, seq], the same on every rank.
std::pair<Tensor, Tensor> batch_of(const Args& a, int step) {
  return {bench::random_tokens(a.batch, a.seq, a.vocab, 12345 + uint64_t(step)),
          bench::random_tokens(a.batch, a.seq, a.vocab, 54321 + uint64_t(step))};
}

struct Bytes {
  double allreduce, allgather, reduce_scatter;
};

// One forward and backward's traffic on a fresh tp group.
Bytes traffic(const Args& a, int64_t layers, comm::Communicator& world, bool sp) {
  auto tp = world.split(0, world.rank(), "tp_bench");
  parallel::TpGPT model(config_of(a, layers), tp, parallel::TpGptOptions{0.0, sp});
  model.init_parameters(1);
  auto [x, y] = batch_of(a, 0);
  model.loss(x, y).backward();
  return {double(tp->op_bytes("allreduce")), double(tp->op_bytes("allgather")),
          double(tp->op_bytes("reduce_scatter"))};
}

template <typename Model>
double median_step_ms(Model& model, const Args& a, comm::Communicator* sync) {
  optim::AdamW opt(model.parameters(), optim::AdamWOptions{});
  std::vector<double> ms;
  for (int s = 0; s < a.warmup + a.steps; ++s) {
    auto [x, y] = batch_of(a, s);
    if (sync) sync->barrier_sync();
    const auto start = Clock::now();
    model.loss(x, y).backward();
    opt.step();
    opt.zero_grad();
    if (s >= a.warmup)
      ms.push_back(std::chrono::duration<double>(Clock::now() - start).count() * 1e3);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int run(int argc, char** argv) {
  const Args a = parse(argc, argv);
  omp_set_num_threads(1);
  auto world = comm::world();
  const int n = world->size();
  const bool root = world->rank() == 0;
  if (root)
    std::printf(
        "loom-bench-tp: tp %d, GPT layers %lld dim %lld heads %lld, batch %lld x seq %lld, "
        "f32, 1 thread per rank\n",
        n, (long long)a.layers, (long long)a.dim, (long long)a.heads, (long long)a.batch,
        (long long)a.seq);

  const double btc = double(a.batch * a.seq * a.dim) * 4;  // bytes of one activation, f32
  for (bool sp : {false, true}) {
    const Bytes hi = traffic(a, a.layers, *world, sp), lo = traffic(a, a.layers - 1, *world, sp);
    const double ar = hi.allreduce - lo.allreduce, ag = hi.allgather - lo.allgather,
                 rs = hi.reduce_scatter - lo.reduce_scatter;
    if (!root) continue;
    if (!sp)
      std::printf(
          "bytes per block per step (tp):  allreduce %.0f  | Megatron 4 x B*T*C*4 = %.0f  "
          "(ratio %.3f)\n",
          ar, 4 * btc, ar / (4 * btc));
    else
      std::printf(
          "bytes per block per step (sp):  all-gather %.0f + reduce-scatter %.0f (+ "
          "allreduce %.0f of LayerNorm/bias gradients)  | Megatron 6 + 4 x B*T*C*4 = "
          "%.0f + %.0f  (ratio %.3f)\n",
          ag, rs, ar, 6 * btc, 4 * btc, (ag + rs) / (10 * btc));
  }

  // tp 1: every rank trains its own whole model, as one process would.
  double single_ms;
  {
    nn::GPT model(config_of(a, a.layers));
    model.init_parameters(1);
    world->barrier_sync();
    single_ms = median_step_ms(model, a, nullptr);
  }
  world->barrier_sync();
  double tp_ms;
  {
    parallel::TpGPT model(config_of(a, a.layers), world);
    model.init_parameters(1);
    tp_ms = median_step_ms(model, a, world.get());
  }
  if (root)
    std::printf("step time: tp 1 %.1f ms, tp %d %.1f ms  -> speedup %.2fx (ideal %d)\n", single_ms,
                n, tp_ms, single_ms / tp_ms, n);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "loom-bench-tp: error: %s\n", e.what());
    return 1;
  }
}
