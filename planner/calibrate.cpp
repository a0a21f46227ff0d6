#include "planner/calibrate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <vector>

#include "collectives/hierarchical.h"
#include "core/error.h"
#include "core/nn/gpt.h"
#include "core/ops.h"
#include "planner/cost_model.h"
#include "planner/execution.h"

namespace loom::planner {

namespace {

using Clock = std::chrono::steady_clock;

// Waits for the device's queued work: a one-element read is ordered after it.
void settle(const Tensor& t) {
  if (!t.device().is_cpu()) (void)narrow(reshape(t, {-1}), 0, 0, 1).item();
}

// `repeats` timed runs after a warm-up, sorted. With a communicator, every run starts after a
// barrier: ranks sharing the machine measure while the others compute too (a rank that ran alone
// would see the whole machine).
template <typename F>
std::vector<double> timed_runs(int repeats, const std::shared_ptr<comm::Communicator>& comm,
                               F&& run) {
  run();  // warm-up: allocations, kernels, first-touch pages
  std::vector<double> s;
  for (int i = 0; i < repeats; ++i) {
    if (comm) comm->barrier_sync();
    const auto t0 = Clock::now();
    run();
    s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(s.begin(), s.end());
  return s;
}

// Each rank's measurements, averaged over the ranks (every rank gets the same): every rank runs
// the same work at once, and on ranks sharing cores one rank's figures alone are noisy. With
// rank 0's alone, 4 ranks on the development VM's 2 vCPUs fitted a GEMM curve whose time at one
// block's micro-batch of 4 and of 8 ranged over 26-38 and 52-76 ms between ranks in one
// calibration, and the fixed time per block fitted from what the GEMMs leave ranged over 0 to
// 18 ms between calibrations.
std::vector<double> mean_over_ranks(std::vector<double> v,
                                    const std::shared_ptr<comm::Communicator>& comm) {
  if (!comm || comm->size() == 1 || v.empty()) return v;
  std::vector<int64_t> ns;  // summed as integers of nanoseconds: no f64 tensors
  for (double x : v) ns.push_back(int64_t(x * 1e9));
  Tensor t = Tensor::from_vector(ns, {int64_t(ns.size())});
  comm->allreduce(t)->wait();
  ns = t.to_vector<int64_t>();
  for (size_t i = 0; i < v.size(); ++i) v[i] = double(ns[i]) * 1e-9 / comm->size();
  return v;
}

// The GEMM curve takes each size's fastest run: noise only adds time, and one slow run among a
// few skewed the fit's slope by 5x on the development VM. Everything else takes the median, the
// typical run a training step is made of; the block fit (below) then carries the difference.
template <typename F>
double fastest_seconds(int repeats, const std::shared_ptr<comm::Communicator>& comm, F&& run) {
  return timed_runs(repeats, comm, run).front();
}

template <typename F>
double median_seconds(int repeats, const std::shared_ptr<comm::Communicator>& comm, F&& run) {
  const std::vector<double> s = timed_runs(repeats, comm, run);
  return s[s.size() / 2];
}

// Least squares of y = slope * x + intercept in relative terms (each residual divided by its y),
// so the small GEMMs that fix the intercept weigh as much as the large ones that fix the slope.
std::pair<double, double> fit_line(const std::vector<double>& x, const std::vector<double>& y) {
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double w = 1.0 / (y[i] * y[i]);
    sw += w, sx += w * x[i], sy += w * y[i], sxx += w * x[i] * x[i], sxy += w * x[i] * y[i];
  }
  const double slope = (sw * sxy - sx * sy) / (sw * sxx - sx * sx);
  return {slope, (sy - slope * sx) / sw};
}

// One training forward + backward of loom's GPT with `s`'s shape, at 1 and 3 blocks: the median
// of the 1-block model's times and of the differences (3 blocks less 1), taken in pairs, one run
// of each in turn, so that a drift of the machine hits both sides of a difference alike. Ranks
// sharing cores make single runs noisy: on 4 ranks sharing the development VM's 2 vCPUs, the
// fixed time per block fitted from two separate medians came out anywhere from 0 to 18 ms in five
// calibrations in a row.
struct BlockTimes {
  double one_block_model = 0;  // seconds
  double two_blocks = 0;       // seconds that 2 more blocks add
};

BlockTimes gpt_block_seconds(const TransformerShape& s, int batch, const CalibrationOptions& o,
                             const std::shared_ptr<comm::Communicator>& comm) {
  auto model_of = [&](int64_t layers) {
    GptConfig cfg;
    cfg.max_seq_len = s.seq;
    cfg.vocab = s.vocab;
    cfg.padded_vocab = padded_vocab_for(s.vocab);  // as loom-gpt pads it
    cfg.layers = layers;
    cfg.heads = s.heads;
    cfg.channels = s.hidden;
    auto model = std::make_unique<nn::GPT>(cfg);
    model->to(o.device);
    if (o.dtype != DType::kF32) model->to(o.dtype);
    return model;
  };
  std::unique_ptr<nn::GPT> models[2] = {model_of(1), model_of(3)};
  std::vector<int64_t> ids(size_t(batch * s.seq));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t(i * 7919 % size_t(s.vocab));
  const Tensor idx = Tensor::from_vector(ids, {batch, s.seq}, o.device);
  auto run = [&](nn::GPT& model) {
    if (comm) comm->barrier_sync();
    const auto t0 = Clock::now();
    model.zero_grad();
    Tensor loss = model.loss(idx, idx);
    loss.backward();
    settle(loss);
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  for (auto& m : models) run(*m);  // warm-up: allocations, kernels, first-touch pages
  const int pairs = comm && comm->size() > 1 ? std::max(o.repeats, 9) : o.repeats;
  std::vector<double> one, added;
  for (int i = 0; i < pairs; ++i) {
    const double t1 = run(*models[0]);
    one.push_back(t1);
    added.push_back(run(*models[1]) - t1);
  }
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  const std::vector<double> mean = mean_over_ranks({median(one), median(added)}, comm);
  return {mean[0], mean[1]};
}

// Uniform values in [-1, 1) from a fixed LCG. GEMMs are timed on these, never on constants: the
// calibration's bf16 GEMMs on the H200 ran at 912 TFLOP/s on constant inputs against 828-844 on
// random ones (its tensor cores draw less power on repeated values and keep a higher clock).
Tensor random_tensor(const Shape& shape, const CalibrationOptions& o) {
  std::vector<float> v(size_t(shape_numel(shape)));
  uint64_t state = 0x9E3779B97F4A7C15ull;
  for (float& x : v) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    x = float(double(state >> 40) / double(1ull << 23) - 1.0);
  }
  Tensor t = Tensor::from_vector(v, shape).to(o.device);
  return o.dtype == DType::kF32 ? t : t.to(o.dtype);
}

// A ring all-reduce's LinkLevel on `group` (cost_model.h's formula): t(B) = 2(n-1) latency +
// 2(n-1)/n * B / bandwidth, timed at two sizes. Every group of `world` measures at once (world's
// barrier starts each run).
LinkLevel ring_allreduce_link(comm::Communicator& group,
                              const std::shared_ptr<comm::Communicator>& world,
                              const CalibrationOptions& o) {
  const int64_t small = 2048, large = 8 << 20;  // f32 elements: 8 KiB and 32 MiB
  double t[2];
  int i = 0;
  for (int64_t count : {small, large}) {
    Tensor x = Tensor::full({count}, 1.0, DType::kF32, o.device);
    world->barrier_sync();
    t[i++] = median_seconds(o.repeats, world, [&] { group.allreduce_sync(x); });
  }
  const std::vector<double> mean = mean_over_ranks({t[0], t[1]}, world);  // every group's
  t[0] = mean[0], t[1] = mean[1];
  const double n = group.size(), b0 = 4.0 * small, b1 = 4.0 * large;
  const double per_byte = (t[1] - t[0]) / (b1 - b0);  // 2(n-1)/n / bandwidth
  LOOM_CHECK(per_byte > 0, "calibrate: the all-reduce of 32 MiB over ", group.size(),
             " ranks was not slower than 8 KiB's");
  return {std::max(0.0, (t[0] - per_byte * b0) / (2.0 * (n - 1))), 2.0 * (n - 1) / n / per_byte};
}

}  // namespace

Cluster calibrate(Cluster c, const std::shared_ptr<comm::Communicator>& comm,
                  const CalibrationOptions& o) {
  LOOM_CHECK(o.repeats >= 1 && o.max_gemm >= 256,
             "calibrate: repeats must be >= 1 and max_gemm "
             ">= 256, got ",
             o.repeats, " and ", o.max_gemm);
  // Measured on every rank (they share the machine's cores as a run would), averaged over them.
  std::vector<double> flops, seconds;
  // A layer's GEMMs: activations of 4n rows (tokens) by n (channels) against n x n weights, in
  // the three forms a training step runs them: forward (x w), the input's gradient (dy w^T) and
  // the weight's (x^T dy).
  for (int64_t n = 64; n <= o.max_gemm / 2; n *= 2) {
    const Tensor x = random_tensor({4 * n, n}, o);
    const Tensor w = random_tensor({n, n}, o);
    Tensor out;
    seconds.push_back(fastest_seconds(o.repeats, comm,
                                      [&] {
                                        out = matmul(x, w);
                                        out = matmul(out, w, false, true);
                                        out = matmul(x, out, true, false);
                                        settle(out);
                                      }) /
                      3.0);
    flops.push_back(2.0 * 4.0 * double(n) * double(n) * double(n));
  }
  seconds = mean_over_ranks(seconds, comm);
  const auto [slope, intercept] = fit_line(flops, seconds);
  LOOM_CHECK(slope > 0, "calibrate: GEMM times did not grow with size (", seconds.front(), " s to ",
             seconds.back(), " s): the machine is too noisy to calibrate");
  const double rate = 1.0 / slope;

  // Note [Kernels timed in a row]
  // On a GPU each timed run queues the kernel `in_a_row` times and waits once, as a training step
  // queues its kernels back to back; one wait per kernel (a launch, then a one-element read back
  // to the host) is not part of a step. A CPU's kernels are done when they return: one run each.
  // On the H200 (2026-12-04, seventh GPU session) this took the calibrated element-wise rate from
  // the sixth session's 320 GB/s to 375 GB/s; the rest of the gap to loom-bench-cuda's 1-4 TB/s
  // was the softmax's (below): without it, 862 GB/s.
  const int in_a_row = o.device.is_cpu() ? 1 : 20;
  const int64_t elements = 32 << 20;  // 128 MB of f32 each way
  Tensor src = Tensor::full({elements}, 1.0, DType::kF32, o.device);
  Tensor dst = Tensor::zeros({elements}, DType::kF32, o.device);
  const double copy_s = median_seconds(o.repeats, comm,
                                       [&] {
                                         for (int i = 0; i < in_a_row; ++i) dst.copy_(src);
                                         settle(dst);
                                       }) /
                        in_a_row;
  // What the cost model's element-wise term divides by: the bytes loom's GELU and softmax move
  // per second (one read, one write). On a CPU their arithmetic (tanh, exp) bounds them below the
  // copy, so the slowest of the three is kept. On a GPU the copy and the GELU are kept: loom's
  // softmax in bf16 runs as a conversion to f32, the f32 kernel and a rounding back (five times
  // the bf16 op's bytes), which no kernel of a training step does (attention and the loss have
  // their own), and it set the H200's rate at 375 GB/s (862 GB/s without it).
  const Tensor x = Tensor::full({elements / 4 / 1024, 1024}, 0.5, o.dtype, o.device);
  Tensor y;
  const double gelu_s = median_seconds(o.repeats, comm,
                                       [&] {
                                         for (int i = 0; i < in_a_row; ++i) y = gelu(x);
                                         settle(y);
                                       }) /
                        in_a_row;
  const double softmax_s = !o.device.is_cpu() ? 0.0 : median_seconds(o.repeats, comm, [&] {
    y = softmax(x);
    settle(y);
  });
  const std::vector<double> kernels = mean_over_ranks({copy_s, gelu_s, softmax_s}, comm);
  const double op_bytes = 2.0 * double(x.numel()) * double(dtype_size(o.dtype));
  const double bandwidth =
      std::min({2.0 * double(elements) * 4.0 / kernels[0], op_bytes / kernels[1],
                kernels[2] > 0 ? op_bytes / kernels[2] : HUGE_VAL});

  // Note [Calibrating the block]
  // One block's forward + backward (a GPT of 3 blocks less one of 1, halved) at two micro-batch
  // sizes, b and 2b. What its GEMMs do not explain is fitted to overhead + bytes / bandwidth,
  // with bytes the cost model's element-wise traffic (3x the forward's: forward once, backward
  // twice): the slope is the block's bandwidth (block_bandwidth: its attention beyond the GEMM
  // curve and its small kernels are in it, so on a GPU it is far below the kernels' rate, which
  // the optimizer, the loss and the embedding keep), the intercept a fixed time per block and
  // micro-batch (kernel launches, host work the device waits for). The same fit on the 1-block
  // model less its block gives the rest's (embedding, head, loss) fixed time per micro-batch.
  // Why: on the H200, loom-gpt's bf16 GPT-2 124M step (batch 8) took 80.2, 96.0, 135.8 and
  // 206.9 ms in 1, 2, 4 and 8 micro-batches, 18 ms more per micro-batch whatever its size; one
  // bandwidth fitted at one size, for every byte, predicted 141-150 ms for the first three, and
  // the optimizer at the block's rate took 11 ms where its kernel takes 0.9.
  o.block.check();
  DeviceRates fitted;
  fitted.peak_flops = rate;
  fitted.gemm_efficiency = 1.0;
  fitted.gemm_half_flops = std::max(0.0, intercept * rate);
  fitted.memory_bandwidth = bandwidth;
  Execution loom = execution_preset("loom");  // loom's blocks: masks regenerated, never stored
  loom.param_bytes = loom.activation_bytes = loom.logits_bytes = double(dtype_size(o.dtype));
  const int batches[2] = {o.block_batch, 2 * o.block_batch};
  double residual[2], bytes[2], one_block_model[2];
  for (int i = 0; i < 2; ++i) {
    const BlockTimes times = gpt_block_seconds(o.block, batches[i], o, comm);
    one_block_model[i] = times.one_block_model;
    const double block_s = times.two_blocks / 2.0;
    residual[i] = block_s - 3.0 * layer_gemms_forward(o.block, batches[i], 1, fitted);
    bytes[i] = 3.0 * layer_elementwise_bytes_forward(o.block, batches[i], 1, false, loom);
  }
  double block_overhead = 0, block_bw = bandwidth;
  if (residual[1] > residual[0] && residual[0] > 0) {
    block_bw = (bytes[1] - bytes[0]) / (residual[1] - residual[0]);
    block_overhead = residual[0] - bytes[0] / block_bw;
    // An intercept the noise made negative: no fixed part, the larger size's bytes at one rate.
    if (block_overhead <= 0) block_overhead = 0, block_bw = bytes[1] / residual[1];
  } else if (residual[1] > 0) {  // noise: one rate from the larger size, no fixed part
    block_bw = bytes[1] / residual[1];
  }  // a block no slower than its GEMMs (noise) keeps the kernels' rate
  // The rest of the model: the 1-block model's time less its block and less what the cost model
  // gives its embedding and head; the part that does not grow with the micro-batch is the
  // rest's fixed time (rest = overhead + slope b at b and 2b: the intercept is 2 rest(b) -
  // rest(2b)).
  double rest[2];
  for (int i = 0; i < 2; ++i) {
    const double block_s = block_overhead + bytes[i] / block_bw +
                           3.0 * layer_gemms_forward(o.block, batches[i], 1, fitted);
    const EndCosts ends = end_costs(o.block, batches[i], 1, loom, fitted);
    rest[i] = one_block_model[i] - block_s - ends.embed_forward - ends.embed_backward -
              ends.head_forward - ends.head_backward;
  }
  const double rest_overhead = std::max(0.0, 2.0 * rest[0] - rest[1]);

  // Note [Calibrating two link levels]
  // A ring all-reduce's latency and bandwidth per link level, each level's group measured with
  // every such group running at once: inside a node, every node's ranks together; across nodes,
  // every local index's ranks together (each rank's share of its node's link when all of them
  // cross, which is what a per-GPU LinkLevel is, and what dp groups outside a node and the
  // second level of loom's two-level collectives see). A group that does not split evenly into
  // nodes of two or more ranks (one node, one rank per node) is measured whole, for both levels.
  LinkLevel intra = c.intra, inter = c.inter;
  const int ranks = comm ? comm->size() : 1;
  if (ranks > 1) {
    const comm::Hierarchy levels(*comm, o.node_of_rank);
    if (levels.applies()) {
      intra = ring_allreduce_link(levels.intra(), comm, o);
      inter = ring_allreduce_link(levels.inter(), comm, o);
    } else {
      intra = inter = ring_allreduce_link(*comm, comm, o);
    }
  }

  // Every rank fitted the same means (mean_over_ranks), so every rank returns the same figures.
  c.device.name = o.device.is_cpu() ? "calibrated-cpu" : c.device.name + "-calibrated";
  c.device.peak_flops = o.peak_flops > 0 ? o.peak_flops : rate;
  c.device.gemm_efficiency = std::min(1.0, rate / c.device.peak_flops);
  c.device.gemm_half_flops = std::max(0.0, intercept * rate);
  c.device.memory_bandwidth = bandwidth;
  c.device.block_overhead_s = block_overhead;
  c.device.rest_overhead_s = rest_overhead;
  c.device.block_bandwidth = block_bw;
  c.intra = intra;
  c.inter = inter;
  return c;
}

}  // namespace loom::planner
