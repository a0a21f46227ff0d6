#include "planner/calibrate.h"

#include <algorithm>
#include <chrono>
#include <vector>

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

// One training forward + backward of loom's GPT with `layers` blocks of `s`'s shape.
double gpt_seconds(const TransformerShape& s, int64_t layers, int batch,
                   const CalibrationOptions& o, const std::shared_ptr<comm::Communicator>& comm) {
  GptConfig cfg;
  cfg.max_seq_len = s.seq;
  cfg.vocab = cfg.padded_vocab = s.vocab;
  cfg.layers = layers;
  cfg.heads = s.heads;
  cfg.channels = s.hidden;
  nn::GPT model(cfg);
  model.to(o.device);
  if (o.dtype != DType::kF32) model.to(o.dtype);
  std::vector<int64_t> ids(size_t(batch * s.seq));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t(i * 7919 % size_t(s.vocab));
  const Tensor idx = Tensor::from_vector(ids, {batch, s.seq}, o.device);
  return median_seconds(o.repeats, comm, [&] {
    model.zero_grad();
    Tensor loss = model.loss(idx, idx);
    loss.backward();
    settle(loss);
  });
}

}  // namespace

Cluster calibrate(Cluster c, const std::shared_ptr<comm::Communicator>& comm,
                  const CalibrationOptions& o) {
  LOOM_CHECK(o.repeats >= 1 && o.max_gemm >= 256,
             "calibrate: repeats must be >= 1 and max_gemm "
             ">= 256, got ",
             o.repeats, " and ", o.max_gemm);
  // Measured on every rank (they share the machine's cores as a run would), kept from rank 0.
  std::vector<double> flops, seconds;
  // A layer's GEMMs: activations of 4n rows (tokens) by n (channels) against n x n weights, in
  // the three forms a training step runs them: forward (x w), the input's gradient (dy w^T) and
  // the weight's (x^T dy).
  for (int64_t n = 64; n <= o.max_gemm / 2; n *= 2) {
    const Tensor x = Tensor::full({4 * n, n}, 0.5, o.dtype, o.device);
    const Tensor w = Tensor::full({n, n}, 0.25, o.dtype, o.device);
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
  const auto [slope, intercept] = fit_line(flops, seconds);
  LOOM_CHECK(slope > 0, "calibrate: GEMM times did not grow with size (", seconds.front(), " s to ",
             seconds.back(), " s): the machine is too noisy to calibrate");
  const double rate = 1.0 / slope;

  const int64_t elements = 32 << 20;  // 128 MB of f32 each way
  Tensor src = Tensor::full({elements}, 1.0, DType::kF32, o.device);
  Tensor dst = Tensor::zeros({elements}, DType::kF32, o.device);
  const double copy_s = median_seconds(o.repeats, comm, [&] {
    dst.copy_(src);
    settle(dst);
  });
  // What the cost model's element-wise term divides by: the bytes loom's GELU and softmax move
  // per second (one read, one write). On a GPU that is about the copy's bandwidth; on a CPU their
  // arithmetic (tanh, exp) bounds them below it, so the slower of the three is kept.
  const Tensor x = Tensor::full({elements / 4 / 1024, 1024}, 0.5, o.dtype, o.device);
  Tensor y;
  const double gelu_s = median_seconds(o.repeats, comm, [&] {
    y = gelu(x);
    settle(y);
  });
  const double softmax_s = median_seconds(o.repeats, comm, [&] {
    y = softmax(x);
    settle(y);
  });
  const double op_bytes = 2.0 * double(x.numel()) * double(dtype_size(o.dtype));
  double bandwidth =
      std::min({2.0 * double(elements) * 4.0 / copy_s, op_bytes / gelu_s, op_bytes / softmax_s});

  // One block (a GPT of 3 blocks less one of 1, halved): what its GEMMs do not explain is its
  // element-wise traffic (3x the forward's: forward once, backward twice), at this bandwidth.
  o.block.check();
  const double block_s = (gpt_seconds(o.block, 3, o.block_batch, o, comm) -
                          gpt_seconds(o.block, 1, o.block_batch, o, comm)) /
                         2.0;
  DeviceRates fitted;
  fitted.peak_flops = rate;
  fitted.gemm_efficiency = 1.0;
  fitted.gemm_half_flops = std::max(0.0, intercept * rate);
  const double gemm_s = 3.0 * layer_gemms_forward(o.block, o.block_batch, 1, fitted);
  Execution loom = execution_preset("loom");  // loom's blocks: masks regenerated, never stored
  loom.activation_bytes = double(dtype_size(o.dtype));
  const double bytes =
      3.0 * layer_elementwise_bytes_forward(o.block, o.block_batch, 1, false, loom);
  // A block no slower than its GEMMs (noise) keeps the kernels' figure.
  if (block_s > gemm_s * 1.05) bandwidth = bytes / (block_s - gemm_s);

  double latency = c.intra.latency_s, link = c.intra.bandwidth;
  const int ranks = comm ? comm->size() : 1;
  if (ranks > 1) {
    // t(B) = 2(n-1) latency + 2(n-1)/n * B / bandwidth at two sizes: two equations.
    const int64_t small = 2048, large = 8 << 20;  // f32 elements: 8 KiB and 32 MiB
    double t[2];
    int i = 0;
    for (int64_t count : {small, large}) {
      Tensor x = Tensor::full({count}, 1.0, DType::kF32, o.device);
      comm->barrier_sync();
      t[i++] = median_seconds(o.repeats, comm, [&] { comm->allreduce_sync(x); });
    }
    const double n = ranks, b0 = 4.0 * small, b1 = 4.0 * large;
    const double per_byte = (t[1] - t[0]) / (b1 - b0);  // 2(n-1)/n / bandwidth
    LOOM_CHECK(per_byte > 0, "calibrate: the all-reduce of 32 MiB was not slower than 8 KiB's");
    link = 2.0 * (n - 1) / n / per_byte;
    latency = std::max(0.0, (t[0] - per_byte * b0) / (2.0 * (n - 1)));
  }

  double measured[5] = {rate, std::max(0.0, intercept * rate), bandwidth, latency, link};
  if (comm && ranks > 1) {  // rank 0's figures everywhere
    Tensor m = Tensor::from_vector(std::vector<float>(measured, measured + 5), {5});
    comm->broadcast(m)->wait();
    for (int i = 0; i < 5; ++i) measured[i] = m.data<float>()[i];
  }
  c.device.name = o.device.is_cpu() ? "calibrated-cpu" : c.device.name + "-calibrated";
  c.device.peak_flops = o.peak_flops > 0 ? o.peak_flops : measured[0];
  c.device.gemm_efficiency = std::min(1.0, measured[0] / c.device.peak_flops);
  c.device.gemm_half_flops = measured[1];
  c.device.memory_bandwidth = measured[2];
  c.intra.latency_s = measured[3];
  c.intra.bandwidth = measured[4];
  c.inter = c.intra;
  return c;
}

}  // namespace loom::planner
