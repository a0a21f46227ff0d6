// loom-bench-pp: every pipeline schedule on the same GPT and global batch, under mpirun -np N
// (N = pp): the measured bubble per rank (from the executor's timeline, the median over the timed
// steps) beside the validator's prediction with unit costs, the median step time, and each rank's
// peak memory during a step from the CPU allocator (parameters, gradients, optimizer state and live
// activations).
//
//   mpirun -np 4 build/bin/loom-bench-pp [--layers 8 --dim 256 --heads 4 --seq 128 --batch 16
//                                         --microbatches 8 --steps 6 --recompute 0|1]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bench_gpt.h"
#include "collectives/communicator.h"
#include "core/allocator.h"
#include "core/ops.h"
#include "optimizer/adamw.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/generators.h"
#include "parallel/pipeline/gpt_stage.h"
#include "parallel/pipeline/trace.h"
#include "parallel/pipeline/validator.h"

namespace {

using namespace loom;
using namespace loom::parallel::pipeline;
using Clock = std::chrono::steady_clock;

struct Args {
  int64_t layers = 8, dim = 256, heads = 4, seq = 128, batch = 16, vocab = 256, microbatches = 8,
          steps = 6, warmup = 1, recompute = 0;
};

Args parse(int argc, char** argv) {
  Args a;
  bench::parse_int_flags(argc, argv, "loom-bench-pp",
                         {{"layers", &a.layers},
                          {"dim", &a.dim},
                          {"heads", &a.heads},
                          {"seq", &a.seq},
                          {"batch", &a.batch},
                          {"vocab", &a.vocab},
                          {"microbatches", &a.microbatches},
                          {"steps", &a.steps},
                          {"warmup", &a.warmup},
                          {"recompute", &a.recompute}});
  return a;
}

struct Result {
  double step_ms;
  std::vector<double> measured;
  loom::parallel::pipeline::Simulation predicted;
  double peak_mb;
};

Result bench(const Args& a, const Schedule& s, const std::shared_ptr<comm::Communicator>& pp) {
  const GptConfig c = bench::bench_config(a.layers, a.dim, a.heads, a.seq, a.vocab);
  const int rank = pp->rank();
  std::vector<std::shared_ptr<GptStage>> stages;
  std::vector<StageChunk> chunks;
  std::vector<Tensor> params;
  const auto pairs = replica_pairs(s, *pp);
  for (const ChunkPlace& place : s.chunks[size_t(rank)]) {
    auto st = std::make_shared<GptStage>(c, place.stage, s.stages);
    st->init_parameters(1);
    st->set_checkpointing(a.recompute != 0);  // full recomputation: every block checkpointed
    for (const Tensor& p : st->parameters()) params.push_back(p);
    chunks.push_back(stage_chunk(st, pairs[size_t(place.stage)], nullptr));
    stages.push_back(st);
  }
  const int64_t rows = a.batch / s.microbatches;
  PipelineExecutor exec(s, pp, std::move(chunks), Shape{rows, a.seq, a.dim});
  optim::AdamW opt(params, optim::AdamWOptions{});
  std::vector<Tensor> tokens, targets;
  for (int m = 0; m < s.microbatches; ++m) {
    tokens.push_back(bench::random_tokens(rows, a.seq, a.vocab, 7 + uint64_t(m)));
    targets.push_back(bench::random_tokens(rows, a.seq, a.vocab, 1007 + uint64_t(m)));
  }
  Allocator& cpu = allocator_for(Device::cpu());
  std::vector<double> ms;
  std::vector<std::vector<double>> bubbles;  // per timed step, per rank
  for (int step = 0; step < a.warmup + a.steps; ++step) {
    pp->barrier_sync();
    cpu.reset_peak();
    const auto start = Clock::now();
    exec.run(tokens, targets);
    opt.step();
    opt.zero_grad();
    const double t = std::chrono::duration<double>(Clock::now() - start).count() * 1e3;
    const std::vector<double> b = measured_bubbles(gather_timelines(exec.timeline(), *pp));
    if (step < a.warmup) continue;
    ms.push_back(t);
    bubbles.push_back(b);
  }
  // Each rank's median bubble over the timed steps: one step's moves with the host's noise.
  std::vector<double> bubble(bubbles[0].size());
  for (size_t r = 0; r < bubble.size(); ++r) {
    std::vector<double> of_rank;
    for (const std::vector<double>& b : bubbles) of_rank.push_back(b[r]);
    std::sort(of_rank.begin(), of_rank.end());
    bubble[r] = of_rank[of_rank.size() / 2];
  }
  std::sort(ms.begin(), ms.end());
  // The slowest rank's median sets the step time.
  Tensor med = Tensor::full({1}, ms[ms.size() / 2], DType::kF32);
  pp->allreduce(med, {comm::ReduceOp::kMax})->wait();
  return Result{med.item(), bubble, validate(s), double(cpu.peak_bytes()) / 1e6};
}

int run(int argc, char** argv) {
  const Args a = parse(argc, argv);
  omp_set_num_threads(1);
  auto world = comm::world();
  const int p = world->size();
  const bool root = world->rank() == 0;
  if (root)
    std::printf(
        "loom-bench-pp: pp %d, GPT layers %lld dim %lld heads %lld, batch %lld x seq %lld, "
        "%lld micro-batches, f32, AdamW, %s, 1 thread per rank, median of %lld steps\n",
        p, (long long)a.layers, (long long)a.dim, (long long)a.heads, (long long)a.batch,
        (long long)a.seq, (long long)a.microbatches,
        a.recompute ? "full recomputation" : "no recomputation", (long long)a.steps);
  for (const std::string name : {"gpipe", "1f1b", "interleaved", "chimera"}) {
    if (name == "chimera" && p % 2 != 0) continue;
    const Schedule s = make_schedule(name, p, a.microbatches, name == "interleaved" ? 2 : 1);
    const Result r = bench(a, s, world);
    Tensor peak = Tensor::full({1}, r.peak_mb, DType::kF32);
    Tensor peaks = Tensor::empty({p});
    world->allgather(peak, peaks)->wait();
    const std::vector<float> pk = peaks.to_vector<float>();
    if (!root) continue;
    std::printf("%-12s step %8.1f ms\n", (name + (name == "interleaved" ? " v2" : "")).c_str(),
                r.step_ms);
    for (int rank = 0; rank < p; ++rank)
      std::printf(
          "  rank %d: bubble measured %.3f, predicted %.3f; peak activations predicted %d; "
          "peak memory %.1f MB\n",
          rank, r.measured[size_t(rank)], r.predicted.ranks[size_t(rank)].bubble,
          r.predicted.ranks[size_t(rank)].peak_activations, double(pk[size_t(rank)]));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "loom-bench-pp: error: %s\n", e.what());
    return 1;
  }
}
