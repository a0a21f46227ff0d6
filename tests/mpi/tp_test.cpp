// Tensor parallelism against the single-process run (the equivalence principle): a small GPT
// split over tp = the world's ranks (1, 2, 4), with and without sequence parallelism, with
// dropout off and on, trains 5 AdamW steps on the same batches as one process and gives its
// per-step losses and (gathered) final parameters within 1e-5 relative. Its vocabulary, 257, does
// not divide by tp: the padded rows and logits must change nothing. Also: every shard starts as
// the slice of the single-process initialisation, the communication per block is Megatron's, and
// loading a single-process checkpoint into the tp model works.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "collectives/communicator.h"
#include "core/allocator.h"
#include "core/nn/dropout.h"
#include "core/nn/linear.h"
#include "core/ops.h"
#include "dp_reference.h"
#include "optimizer/sgd.h"
#include "parallel/ddp.h"
#include "parallel/mesh.h"
#include "parallel/tensor_parallel/layers.h"
#include "parallel/tensor_parallel/tp_gpt.h"
#include "parallel/tensor_parallel/tp_grad_norm.h"
#include "parallel/tensor_parallel/tp_state.h"
#include "parallel/zero.h"

namespace loom::parallel {
namespace {

using namespace loom::testing;

GptConfig tp_config() {
  GptConfig c;
  c.max_seq_len = 8;
  c.vocab = 257;  // odd: padded per rank (258 rows on tp 2, 260 on tp 4)
  c.padded_vocab = 257;
  c.layers = 2;
  c.heads = 4;
  c.channels = 32;
  return c;
}

constexpr uint64_t kDropoutSeed = 77;
constexpr double kClip = 0.05;  // well below this model's gradient norm: every step clips

// Skips (with the reason) when the world cannot be one tp group of this model.
bool world_fits(int n) { return tp_config().heads % n == 0; }

// The single-process GPT's parameters, with wte's rows as the single-process model has them.
std::vector<std::pair<std::string, std::vector<float>>> single_process_values(
    const nn::StateDict& full, int64_t padded_vocab) {
  std::vector<std::pair<std::string, std::vector<float>>> out;
  nn::GPT layout(tp_config());  // for the order of names
  for (const auto& [name, t] : layout.named_parameters()) {
    Tensor v = full.at(name);
    if (name == "wte.weight") v = v.narrow(0, 0, padded_vocab);
    out.emplace_back(name, v.contiguous().to_vector<float>());
  }
  return out;
}

enum class Opt { kAdamW, kSgd };

std::unique_ptr<optim::Optimizer> make_optimizer(Opt which, std::vector<Tensor> params) {
  if (which == Opt::kAdamW) return test_adamw_over(std::move(params));
  optim::SgdOptions o;
  o.lr = 0.1;
  o.momentum = 0.9;
  return std::make_unique<optim::SGD>(std::move(params), o);
}

constexpr int64_t kRows = 8;  // sequences per step

// `clip`: a function clipping the model's gradients (null: none).
template <typename Model>
RunResult train(Model& model, Opt which, const std::function<double()>& clip = {}) {
  std::unique_ptr<optim::Optimizer> opt = make_optimizer(which, model.parameters());
  nn::set_dropout_seed(kDropoutSeed);
  RunResult r;
  for (int s = 0; s < kSteps; ++s) {
    nn::set_dropout_step(uint64_t(s));
    GlobalBatch b = global_batch(s, model.config().vocab);
    Tensor loss = model.loss(b.rows(0, kRows), b.target_rows(0, kRows));
    loss.backward();
    if (clip) EXPECT_GT(clip(), kClip) << "the test must exercise clipping";
    opt->step();
    opt->zero_grad();
    r.losses.push_back(loss.item());
  }
  return r;
}

RunResult single_process(double dropout, Opt which, bool clip = false) {
  nn::GPT model(tp_config(), nn::GptOptions{dropout, false});
  model.init_parameters(kSeed);
  RunResult r = train(model, which,
                      clip ? std::function<double()>(
                                 [&] { return optim::clip_grad_norm(model.parameters(), kClip); })
                           : std::function<double()>());
  r.params = parameter_values(model);
  return r;
}

RunResult tensor_parallel(const GroupPtr& tp, double dropout, bool sequence_parallel, Opt which) {
  TpGPT model(tp_config(), tp, TpGptOptions{dropout, sequence_parallel});
  model.init_parameters(kSeed);
  RunResult r = train(model, which);
  r.params = single_process_values(gather_full_state(model, *tp), tp_config().padded_vocab);
  return r;
}

// Tolerances. tp splits the reductions of every GEMM (and sums the partial products over ranks),
// so gradients differ from one process's in the last bits. With SGD that stays there, and every
// tensor compares within 1e-5 of its own scale. AdamW divides each element's step by the root of
// its squared gradients, so an element whose gradient is a cancellation of much larger terms (a
// bias summed over positions) turns those last bits into up to ~1e-4 of its step; tensors that
// started at zero are only a few steps large, so for AdamW the parameters compare within 1e-5 of
// the model's scale (its largest parameter), and the losses within 1e-5 as always.
TEST(TensorParallel, MatchesTheSingleProcessRun) {
  auto world = comm::world();
  if (!world_fits(world->size()))
    GTEST_SKIP() << "tp " << world->size() << " does not divide 4 heads";
  for (Opt which : {Opt::kAdamW, Opt::kSgd})
    for (double dropout : {0.0, 0.1}) {
      const RunResult want = single_process(dropout, which);
      for (bool sp : {false, true}) {
        SCOPED_TRACE(detail::str_cat("tp ", world->size(), which == Opt::kSgd ? ", SGD" : ", AdamW",
                                     ", dropout ", dropout, sp ? ", sequence parallel" : ""));
        expect_same_run(tensor_parallel(world, dropout, sp, which), want, 1e-5,
                        which == Opt::kSgd ? Scale::kTensor : Scale::kModel);
      }
    }
}

// The global norm counts each element of the whole model once: tp-sharded parameters' squares add
// over tp, whole ones (replicated on every tp rank) count once.
TEST(TensorParallel, ClipsTheGlobalNormAcrossShards) {
  auto world = comm::world();
  if (!world_fits(world->size()))
    GTEST_SKIP() << "tp " << world->size() << " does not divide 4 heads";
  const RunResult want = single_process(0.0, Opt::kSgd, /*clip=*/true);
  for (bool sp : {false, true}) {
    SCOPED_TRACE(detail::str_cat("tp ", world->size(), sp ? ", sequence parallel" : ""));
    TpGPT model(tp_config(), world, TpGptOptions{0.0, sp});
    model.init_parameters(kSeed);
    RunResult got =
        train(model, Opt::kSgd, [&] { return tp_clip_grad_norm(model, kClip, *world); });
    got.params = single_process_values(gather_full_state(model, *world), 257);
    expect_same_run(got, want, 1e-5);
  }
}

// dp 2 x tp 2 on 4 ranks: each dp replica (a tp pair) takes half the batch; DDP or ZeRO-1/2 over
// the dp group, gradients clipped over the whole model; the single-process run.
TEST(TensorParallel, ComposesWithDataParallelismAndZero) {
  auto world = comm::world();
  if (world->size() != 4) GTEST_SKIP() << "dp 2 x tp 2 needs 4 ranks";
  DeviceMesh mesh(world, 1, 2, 2);
  const RunResult want = single_process(0.0, Opt::kAdamW, /*clip=*/true);
  for (int stage : {0, 1, 2}) {
    SCOPED_TRACE(detail::str_cat(
        "dp 2 x tp 2, ", stage == 0 ? std::string("DDP") : "ZeRO-" + std::to_string(stage)));
    TpGPT model(tp_config(), mesh.tp_ptr());
    model.init_parameters(kSeed);
    std::unique_ptr<DistributedDataParallel> ddp;
    std::unique_ptr<optim::Optimizer> opt;
    ZeroOptimizer* zero = nullptr;
    if (stage == 0) {
      ddp = std::make_unique<DistributedDataParallel>(model, mesh.dp_ptr());
      opt = test_adamw_over(model.parameters());
    } else {
      ZeroOptions o;
      o.stage = stage;
      o.tp = mesh.tp_ptr();
      auto z = std::make_unique<ZeroOptimizer>(model, mesh.dp_ptr(), o, test_adamw_over);
      zero = z.get();
      opt = std::move(z);
    }
    RunResult got;
    const int64_t rows = kRows / 2, first = mesh.coords().dp * rows;
    for (int s = 0; s < kSteps; ++s) {
      GlobalBatch b = global_batch(s, tp_config().vocab);
      Tensor loss = model.loss(b.rows(first, rows), b.target_rows(first, rows));
      double norm;
      if (ddp) {
        ddp->backward(loss);
        ddp->finish();
        norm = tp_clip_grad_norm(model, kClip, mesh.tp());
      } else {
        zero->backward(loss);
        norm = zero->clip_grad_norm(kClip);
      }
      EXPECT_GT(norm, kClip);
      opt->step();
      opt->zero_grad();
      Tensor l = Tensor::full({1}, loss.item(), DType::kF32);
      mesh.dp().allreduce(l, comm::AllreduceOptions{comm::ReduceOp::kAvg})->wait();
      got.losses.push_back(l.item());
    }
    got.params = single_process_values(gather_full_state(model, mesh.tp()), 257);
    expect_same_run(got, want, 1e-5, Scale::kModel);  // AdamW: See MatchesTheSingleProcessRun
  }
}

// The layers alone: a column-parallel layer gathering its output is the single-process Linear;
// feeding its split output to a row-parallel layer gives the single-process pair; both with their
// gradients (the input's is summed over tp by copy_to_tp).
class TwoLinears : public nn::Module {
 public:
  TwoLinears(GroupPtr tp, bool gather) {
    ColumnParallelOptions c;
    c.gather_output = gather;
    fc = register_module("fc", std::make_shared<ColumnParallelLinear>(8, 12, tp, c));
    proj = register_module("proj", std::make_shared<RowParallelLinear>(12, 6, tp));
  }
  std::shared_ptr<ColumnParallelLinear> fc;
  std::shared_ptr<RowParallelLinear> proj;
};

class TwoLinearsSingle : public nn::Module {
 public:
  TwoLinearsSingle() {
    fc = register_module("fc", std::make_shared<nn::Linear>(8, 12));
    proj = register_module("proj", std::make_shared<nn::Linear>(12, 6));
  }
  std::shared_ptr<nn::Linear> fc, proj;
};

TEST(TensorParallel, ColumnAndRowParallelLayersAreTheSingleProcessLinears) {
  auto world = comm::world();
  if (12 % world->size() != 0) GTEST_SKIP() << "12 features do not divide over " << world->size();
  TwoLinearsSingle single;
  single.init_parameters(kSeed);
  Tensor x = Tensor::arange(3 * 8).reshape({3, 8});
  x = scale(x, 0.1).detach();
  x.set_requires_grad(true);
  Tensor want_mid = (*single.fc)(x);
  Tensor want = (*single.proj)(gelu(want_mid));
  want.backward(Tensor::ones(want.shape()));

  TwoLinears gathered(world, /*gather=*/true);
  gathered.init_parameters(kSeed);
  Tensor mid = (*gathered.fc)(x.detach());
  // Within rounding: a GEMM over fewer output columns may block its sums differently.
  const std::vector<float> m = mid.to_vector<float>(), wm = want_mid.to_vector<float>();
  ASSERT_EQ(m.size(), wm.size()) << "gather_output gives all 12 features";
  for (size_t i = 0; i < wm.size(); ++i) EXPECT_NEAR(m[i], wm[i], 1e-7) << "gather_output " << i;

  TwoLinears split(world, /*gather=*/false);
  split.init_parameters(kSeed);
  Tensor xs = x.detach();
  xs.set_requires_grad(true);
  Tensor got = (*split.proj)(gelu((*split.fc)(xs)));
  got.backward(Tensor::ones(got.shape()));
  const std::vector<float> g = got.to_vector<float>(), w = want.to_vector<float>();
  for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(g[i], w[i], 1e-6) << i;
  const std::vector<float> gx = xs.grad().to_vector<float>(), wx = x.grad().to_vector<float>();
  for (size_t i = 0; i < wx.size(); ++i) EXPECT_NEAR(gx[i], wx[i], 1e-6) << "input gradient " << i;
}

// Note [Sequence-parallel linears keep their shard]: a sequence-parallel ColumnParallelLinear
// gives linear(gather_sequence(x), W, b)'s output and gradients bit for bit, and holds only its
// output after the forward where the composition also holds the gathered input (on one rank
// both are linear itself).
TEST(TensorParallel, SequenceParallelLinearKeepsOnlyItsShard) {
  auto world = comm::world();
  const int n = world->size();
  ColumnParallelOptions o;
  o.sequence_parallel = true;
  ColumnParallelLinear layer(8, 12 * n, world, o);
  layer.init_parameters(kSeed);
  // This rank's slice of a [2, 3n, 8] batch, and of the output's gradient.
  const int64_t local = 3;
  auto values = [&](int64_t count, double step) {
    std::vector<float> v(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i)
      v[size_t(i)] = float(std::sin(double(i) * step + world->rank()));
    return Tensor::from_vector(v, {count});
  };
  Tensor x = values(2 * local * 8, 0.37).reshape({2, local, 8});
  x.set_requires_grad(true);
  Tensor w = layer.weight.detach().clone(), b = layer.bias.detach().clone();
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  Tensor x_ref = x.detach().clone();
  x_ref.set_requires_grad(true);
  Tensor grad = values(2 * local * n * 12, 0.11).reshape({2, local * n, 12});

  Allocator& memory = allocator_for(Device::cpu());
  size_t before = memory.live_bytes();
  Tensor y = layer(x);
  const size_t held = memory.live_bytes() - before;
  before = memory.live_bytes();
  Tensor want = linear(gather_sequence(x_ref, world, 1), w, b);
  const size_t held_ref = memory.live_bytes() - before;
  EXPECT_EQ(held, y.nbytes()) << "the output alone";
  EXPECT_EQ(held_ref, y.nbytes() + (n > 1 ? x.nbytes() * n : 0))
      << "the composition keeps the gathered input too";

  y.backward(grad);
  want.backward(grad);
  auto same = [](const Tensor& a, const Tensor& b, const char* what) {
    EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>()) << what;
  };
  same(y, want, "output");
  same(x.grad(), x_ref.grad(), "input gradient");
  same(layer.weight.grad(), w.grad(), "weight gradient");
  same(layer.bias.grad(), b.grad(), "bias gradient");
}

// The vocab-parallel embedding zeroes the rows other ranks own with one mask value per id, and
// keeps just that for its backward: after the forward it holds its output, the ids and the mask
// (a mask spread over the rows, as a plain mul keeps it, was as large as the output). Its values
// and gradients are checked against one process with the whole model (MatchesTheSingleProcessRun).
TEST(TensorParallel, VocabParallelEmbeddingKeepsOneMaskValuePerId) {
  auto world = comm::world();
  const int n = world->size();
  VocabParallelEmbedding wte(8 * n, 16, world, nn::Init::normal(0.02));
  wte.init_parameters(kSeed);
  std::vector<int64_t> ids(2 * 8);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t(i * 5 % (8 * n));
  const Tensor idx = Tensor::from_vector(ids, {2, 8});
  Allocator& memory = allocator_for(Device::cpu());
  const size_t before = memory.live_bytes();
  Tensor y = wte(idx);
  const size_t held = memory.live_bytes() - before;
  EXPECT_EQ(held, y.nbytes() + ids.size() * (sizeof(int64_t) + sizeof(float)));
  y.backward(Tensor::ones(y.shape()));
  // Each owned row's gradient counts its ids; the rows others own get nothing from this rank.
  const std::vector<float> g = wte.weight.grad().to_vector<float>();
  for (int64_t r = 0; r < 8; ++r) {
    const int64_t row = world->rank() * 8 + r;
    const float uses = float(std::count(ids.begin(), ids.end(), row));
    for (int64_t c = 0; c < 16; ++c) EXPECT_EQ(g[size_t(r * 16 + c)], uses) << "row " << row;
  }
}

// Every shard is the slice of the single-process initialisation, bit for bit, and the padded
// rows of wte are zero.
TEST(TensorParallel, ShardsStartAsSlicesOfTheSingleProcessInit) {
  auto world = comm::world();
  if (!world_fits(world->size()))
    GTEST_SKIP() << "tp " << world->size() << " does not divide 4 heads";
  nn::GPT single(tp_config());
  single.init_parameters(kSeed);
  TpGPT model(tp_config(), world);
  model.init_parameters(kSeed);
  const RunResult want{{}, parameter_values(single)};
  const RunResult got{{}, single_process_values(gather_full_state(model, *world), 257)};
  expect_same_run(got, want, 0);
  const nn::StateDict full = gather_full_state(model, *world);
  const Tensor wte = full.at("wte.weight");
  ASSERT_EQ(wte.size(0), (257 + world->size() - 1) / world->size() * world->size());
  for (float v : wte.narrow(0, 257, wte.size(0) - 257).contiguous().to_vector<float>())
    EXPECT_EQ(v, 0.0f);
}

// Megatron's communication: per block one allreduce in forward and one in backward for
// attention, the same for the MLP; plus, per step, the embedding's allreduce, the three of the
// vocab-parallel loss, and the head input's in backward. With sequence parallelism the block
// allreduces become all-gather / reduce-scatter pairs.
TEST(TensorParallel, CommunicatesAsMegatronDoes) {
  auto world = comm::world();
  if (world->size() == 1 || !world_fits(world->size())) GTEST_SKIP() << "needs tp > 1";
  const int64_t layers = tp_config().layers;
  for (bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "sequence parallel" : "tensor parallel");
    auto tp = world->split(0, world->rank(), sp ? "tp_sp" : "tp");  // fresh counters
    TpGPT model(tp_config(), tp, TpGptOptions{0.0, sp});
    model.init_parameters(kSeed);
    GlobalBatch b = global_batch(0, tp_config().vocab);
    Tensor loss = model.loss(b.rows(0, 4), b.target_rows(0, 4));
    const uint64_t ar_fwd = tp->op_count("allreduce"), ag_fwd = tp->op_count("allgather"),
                   rs_fwd = tp->op_count("reduce_scatter");
    loss.backward();
    const uint64_t ar_bwd = tp->op_count("allreduce") - ar_fwd,
                   ag_bwd = tp->op_count("allgather") - ag_fwd,
                   rs_bwd = tp->op_count("reduce_scatter") - rs_fwd;
    if (!sp) {
      EXPECT_EQ(ar_fwd, uint64_t(2 * layers + 1 + 3));
      EXPECT_EQ(ar_bwd, uint64_t(2 * layers + 1));
      EXPECT_EQ(ag_fwd + rs_fwd + ag_bwd + rs_bwd, 0u);
    } else {
      // Forward: an all-gather into qkv and fc, a reduce-scatter out of proj (x2), and one
      // all-gather into the head; backward the conjugates, and qkv's and fc's inputs gathered
      // again for their weight gradients (Note [Sequence-parallel linears keep their shard]).
      // The embedding's allreduce and the loss's three stay; backward sums the 4 LayerNorm
      // parameters per block and ln_f's 2.
      EXPECT_EQ(ag_fwd, uint64_t(2 * layers + 1));
      EXPECT_EQ(rs_fwd, uint64_t(2 * layers));
      EXPECT_EQ(ar_fwd, uint64_t(1 + 3));
      EXPECT_EQ(rs_bwd, uint64_t(2 * layers + 1));
      EXPECT_EQ(ag_bwd, uint64_t(4 * layers + 1));               // + the scatter of the embeddings
      EXPECT_EQ(ar_bwd, uint64_t(4 * layers + 2 + 2 * layers));  // LayerNorms, proj biases
    }
  }
}

// The bytes per block, as Megatron counts them: the difference between a 2-block and a 1-block
// model's traffic for one forward and backward. Without sequence parallelism, 4 allreduces of
// B x T x C (2 forward, 2 backward); with it, 4 all-gathers and 4 reduce-scatters of B x T x C
// and the 2 all-gathers that rebuild the column-parallel linears' inputs in the backward, plus
// the allreduce of the 4 LayerNorm vectors and 2 row-parallel biases summed over tp.
TEST(TensorParallel, MovesMegatronsBytesPerBlock) {
  auto world = comm::world();
  if (world->size() == 1 || !world_fits(world->size())) GTEST_SKIP() << "needs tp > 1";
  const int64_t b = 4, t = 8, c = tp_config().channels, f32 = 4;
  for (bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "sequence parallel" : "tensor parallel");
    std::map<std::string, int64_t> bytes[2];
    for (int64_t layers : {1, 2}) {
      GptConfig config = tp_config();
      config.layers = layers;
      auto tp = world->split(0, world->rank(), "tp_bytes");
      TpGPT model(config, tp, TpGptOptions{0.0, sp});
      model.init_parameters(kSeed);
      GlobalBatch batch = global_batch(0, config.vocab);
      model.loss(batch.rows(0, b), batch.target_rows(0, b)).backward();
      for (const char* op : {"allreduce", "allgather", "reduce_scatter"})
        bytes[layers - 1][op] = int64_t(tp->op_bytes(op));
    }
    auto per_block = [&](const char* op) { return bytes[1][op] - bytes[0][op]; };
    const int64_t activation = b * t * c * f32;
    if (!sp) {
      EXPECT_EQ(per_block("allreduce"), 4 * activation);
      EXPECT_EQ(per_block("allgather") + per_block("reduce_scatter"), 0);
    } else {
      // Megatron's 4 all-gathers, and 2 more: the backward gathers qkv's and fc's inputs again
      // (Note [Sequence-parallel linears keep their shard]), as Megatron's implementation does.
      EXPECT_EQ(per_block("allgather"), 6 * activation);
      EXPECT_EQ(per_block("reduce_scatter"), 4 * activation);
      EXPECT_EQ(per_block("allreduce"), 6 * c * f32);
    }
  }
}

// A single-process checkpoint loads into the tp model (each rank takes its slice, wte is padded)
// and gathering gives it back.
TEST(TensorParallel, LoadsAndGathersSingleProcessWeights) {
  auto world = comm::world();
  if (!world_fits(world->size()))
    GTEST_SKIP() << "tp " << world->size() << " does not divide 4 heads";
  nn::GPT single(tp_config());
  single.init_parameters(kSeed + 1);
  TpGPT model(tp_config(), world);
  load_full_state(model, single.state_dict());
  const RunResult want{{}, parameter_values(single)};
  expect_same_run(RunResult{{}, single_process_values(gather_full_state(model, *world), 257)}, want,
                  0);

  nn::StateDict wrong = single.state_dict();
  wrong["blocks.0.mlp.fc.weight"] = Tensor::zeros({16, 32});
  try {
    load_full_state(model, wrong);
    FAIL() << "a wrong shape must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'blocks.0.mlp.fc.weight' has shape [16, 32]"),
              std::string::npos)
        << e.what();
  }
}

TEST(TensorParallel, FullLogitsAreTheSingleProcessOnesForAnySequenceLength) {
  // Evaluation rows need not be training's length (the addition task's held-out rows are 11 of
  // 13): with sequence parallelism full_logits pads a T that tp does not divide and cuts back.
  auto world = comm::world();
  if (!world_fits(world->size()))
    GTEST_SKIP() << "tp " << world->size() << " does not divide 4 heads";
  nn::GPT single(tp_config());
  single.init_parameters(kSeed + 2);
  single.eval();
  for (bool sequence_parallel : {false, true}) {
    TpGPT model(tp_config(), world, TpGptOptions{0.0, sequence_parallel});
    load_full_state(model, single.state_dict());
    model.eval();
    for (int64_t t : {1, 3, 7, 8}) {
      const Tensor idx = global_batch(0, tp_config().vocab).inputs.narrow(1, 0, t).contiguous();
      NoGradGuard no_grad;
      const std::vector<float> want = single(idx).to_vector<float>();
      const std::vector<float> got = model.full_logits(idx).contiguous().to_vector<float>();
      ASSERT_EQ(got.size(), want.size()) << "T " << t;
      double worst = 0;
      for (size_t i = 0; i < want.size(); ++i)
        worst = std::max(worst, double(std::abs(got[i] - want[i])));
      // Split GEMM reductions: f32 rounding of sums of 32-128 terms of size ~0.1.
      EXPECT_LE(worst, 1e-5) << "T " << t << (sequence_parallel ? " sequence parallel" : "");
    }
  }
}

TEST(TensorParallel, RefusesShapesThatDoNotDivide) {
  auto world = comm::world();
  if (world->size() == 1) GTEST_SKIP() << "every shape divides by 1";
  GptConfig c = tp_config();
  c.heads = world->size() + 1;
  c.channels = 8 * c.heads;
  try {
    TpGPT model(c, world);
    FAIL() << "heads not dividing by tp must throw";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("heads (" + std::to_string(c.heads) +
                                   ") must divide evenly over tp " + std::to_string(world->size())),
        std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace loom::parallel
