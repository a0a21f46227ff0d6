// loom-gpt: trains or evaluates a GPT-2-style model, on one process or data-parallel under
// mpirun (--dp, --zero, --grad-accum; See gpt_parallel.h). Only rank 0 prints.
//
// With no flags it trains the built-in addition task until held-out exact match reaches
// --target (and says whether it did); with --data it trains on an llm.c token file or a text
// file; --init-from / --save read and write llm.c and safetensors weights; --eval-only prints
// `val_loss <float>` over the first --eval-batches batches, read as llm.c reads them.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

#include "collectives/communicator.h"
#include "common/flags.h"
#include "common/gpu_peak.h"
#include "common/main_guard.h"
#include "common/output_paths.h"
#include "common/progress.h"
#include "core/allocator.h"
#include "core/autograd.h"
#include "core/io/batch_loader.h"
#include "core/io/gpt_weights.h"
#include "core/nn/dropout.h"
#include "core/nn/generate.h"
#include "core/nn/gpt.h"
#include "gpt/gpt_checkpoint.h"
#include "gpt/gpt_data.h"
#include "gpt/gpt_generate.h"
#include "gpt/gpt_model.h"
#include "gpt/gpt_options.h"
#include "gpt/gpt_parallel.h"
#include "gpt/gpt_pipeline.h"
#include "gpt/gpt_plan.h"
#include "kernels/cuda/runtime.h"
#include "optimizer/adamw.h"
#include "optimizer/clip_grad.h"
#include "optimizer/lr_schedule.h"
#include "optimizer/sgd.h"
#include "parallel/checkpoint/training_state.h"
#include "parallel/pipeline/generators.h"
#include "parallel/pipeline/validator.h"

namespace loom::gpt {
namespace {

using Clock = std::chrono::steady_clock;

// The device this rank trains on (--device): under mpirun, "cuda" is the GPU of the rank's local
// rank, with a clear error when the node has fewer GPUs than ranks.
Device training_device(const GptOptions& o) {
  Device device = Device::parse(o.device);
  if (device.is_cpu()) return device;
  LOOM_CHECK(cuda_available(), "loom-gpt: --device ", o.device, ": ", cuda_rt::no_gpu_reason());
  const int64_t local = o.device == "cuda" ? std::max<int64_t>(0, comm::launcher_local_rank())
                                           : int64_t(device.index);
  device.index = cuda_rt::select_device_for_local_rank(int(local));
  return device;
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The model shape: from the checkpoint when there is one (explicit flags must agree), else from
// the flags and the data's vocabulary.
std::string moe_str(const nn::MoeOptions& m, int64_t channels) {
  if (!m.enabled()) return "none (dense blocks)";
  return detail::str_cat(m.experts, " experts of width ", m.expert_width(channels), ", top-",
                         m.top_k, ", every ", m.every, " block(s)");
}

// --init-from weights with mixture-of-experts blocks build only the model they were saved
// from: the experts, their width, top-k and the MoE blocks must be the --moe-* flags' (the
// capacity and the loss coefficients are training's, and may change).
void check_init_moe(const GptOptions& o, const io::GptWeights& init) {
  const nn::MoeOptions given = o.moe(), saved = init.moe;
  const int64_t c = init.config.channels;
  const bool same =
      given.experts == saved.experts &&
      (!given.enabled() || (given.top_k == saved.top_k && given.every == saved.every &&
                            given.expert_width(c) == saved.expert_width(c)));
  LOOM_CHECK(same, "loom-gpt: --init-from ", o.init_from, " holds mixture of experts ",
             moe_str(saved, c), " but the --moe-* flags give ", moe_str(given, c),
             "; pass the file's (--moe-experts, --moe-top-k, --moe-every, --moe-hidden)");
}

GptConfig resolve_config(const GptOptions& o, const GptData& data, const io::GptWeights* init,
                         const ResumePoint* resume) {
  GptConfig c;
  if (resume || init) {
    // The model is the file's; sizes given as flags must agree with it.
    const std::string source =
        resume ? "the checkpoint " + resume->path : "--init-from " + o.init_from;
    c = resume ? checkpoint_config(*resume) : init->config;
    auto agree = [&](const char* flag, int64_t given, int64_t in_file) {
      LOOM_CHECK(!o.was_set(flag) || given == in_file, "loom-gpt: --", flag, " ", given,
                 " conflicts with ", source, ", whose model has ", in_file);
    };
    agree("layers", o.layers, c.layers);
    agree("heads", o.heads, c.heads);
    agree("dim", o.dim, c.channels);
    agree("vocab", o.vocab, c.vocab);
    LOOM_CHECK(o.seq <= c.max_seq_len, "loom-gpt: --seq ", o.seq, " exceeds ", source,
               "'s maximum sequence length ", c.max_seq_len);
  } else {
    c.layers = o.layers;
    c.heads = o.heads;
    c.channels = o.dim;
    c.vocab = o.vocab > 0 ? o.vocab : data.vocab;
    c.padded_vocab = data.task ? io::AdditionTask::kPaddedVocab : padded_vocab_for(c.vocab);
    if (c.padded_vocab < c.vocab) c.padded_vocab = padded_vocab_for(c.vocab);
    c.max_seq_len = o.seq;
  }
  c.validate();
  return c;
}

// Mean next-token loss over the first `batches` batches of the stream (no gradients).
double evaluate_loss(const GptModel& model, const io::BatchLoader& loader, int64_t batches) {
  NoGradGuard no_grad;
  double total = 0.0;
  for (int64_t k = 0; k < batches; ++k) {
    io::Batch b = loader.batch_at(k);
    total += model.loss(b.inputs, b.targets).item();
  }
  return total / double(batches);
}

io::ExactMatch evaluate_task(const std::function<Tensor(const Tensor&)>& logits,
                             const io::AdditionEvalSet& set, int64_t rows) {
  NoGradGuard no_grad;
  return io::evaluate_exact_match(set, logits, rows);
}

// The pipeline schedule the flags describe: --schedule-file, or the --schedule generator.
// --print-schedule / --validate-schedule: one process, no training.
int inspect_schedule(const GptOptions& o) {
  const parallel::pipeline::Schedule s = schedule_from(o);
  if (o.print_schedule) std::printf("%s", parallel::pipeline::format_schedule(s).c_str());
  if (o.validate_schedule) {
    const parallel::pipeline::Simulation sim = parallel::pipeline::validate(s);
    std::printf(
        "schedule %s: %d ranks, %d stage(s) x %d pipeline(s), %d micro-batches, unit "
        "costs: valid, makespan %g\n%s",
        s.name.c_str(), s.ranks, s.stages, s.pipelines, s.microbatches, sim.makespan,
        sim.report().c_str());
  }
  return 0;
}

// --generate: every rank gathers the trained weights (a collective in every layout); rank 0 runs
// them as one GPT in the training dtype on the training device and prints the prompt and its
// continuation.
void generate_sample(const GptOptions& o, const GptConfig& config, Trainer& trainer,
                     const std::vector<int64_t>& prompt, PromptForm form, DType dtype,
                     Device device, int rank) {
  const io::GptParams params = trainer.full_params();
  if (rank != 0) return;
  nn::GptOptions shape;
  shape.moe = o.moe();  // the trained model's blocks, MoE ones included
  nn::GPT model(config, shape);
  model.load_state_dict(params);
  if (dtype != DType::kF32) model.to(dtype);
  model.to(device);
  model.eval();
  nn::GenerateOptions g;
  g.max_new_tokens = o.max_new_tokens;
  g.temperature = o.temperature;
  g.top_k = o.top_k;
  g.seed = o.seed;
  const auto start = Clock::now();
  const Tensor out =
      nn::generate(model, Tensor::from_vector(prompt, {1, int64_t(prompt.size())}).to(device), g);
  const double seconds = seconds_since(start);
  std::printf("generate: %zu prompt tokens (%s) + %" PRId64 " new, temperature %g, top-k %" PRId64
              ", seed %" PRIu64 ", %.1f tokens/s:\n",
              prompt.size(), prompt_form_name(form), o.max_new_tokens, o.temperature, o.top_k,
              o.seed, seconds > 0 ? double(o.max_new_tokens) / seconds : 0.0);
  std::printf("%s\n", decode_tokens(out.to(Device::cpu()).to_vector<int64_t>(), form).c_str());
  std::fflush(stdout);
}

std::unique_ptr<optim::Optimizer> make_optimizer(const GptOptions& o, std::vector<Tensor> params) {
  if (o.optimizer == "sgd") {
    optim::SgdOptions s;
    s.lr = o.lr;
    s.momentum = o.momentum;
    s.weight_decay = o.weight_decay;
    return std::make_unique<optim::SGD>(std::move(params), s);
  }
  optim::AdamWOptions a;
  a.lr = o.lr;
  a.weight_decay = o.weight_decay;
  return std::make_unique<optim::AdamW>(std::move(params), a);
}

int run(int argc, char** argv) {
  cli::Flags flags("loom-gpt",
                   "Trains or evaluates a GPT-2-style model. With no flags: trains the built-in "
                   "addition task to --target.");
  declare_gpt_flags(flags);
  if (!flags.parse(argc, argv)) return 0;
  GptOptions o = read_gpt_options(flags);
  if (o.validate_schedule || o.print_schedule) return inspect_schedule(o);
  if (o.threads > 0) omp_set_num_threads(int(o.threads));
  auto world = comm::world();
  // The other ranks compute the same figures; one copy of the output is enough (errors still
  // reach stderr from every rank).
  if (world->rank() != 0)
    LOOM_CHECK(std::freopen("/dev/null", "w", stdout) != nullptr,
               "loom-gpt: cannot silence stdout on rank ", world->rank());
  // Rank 0 writes these; a bad path fails every rank now, not rank 0 alone later.
  cli::check_output_paths("loom-gpt", *world,
                          {{"metrics-file", o.metrics_file},
                           {"save", o.save},
                           {"trace", o.trace},
                           {"checkpoint-dir", o.checkpoints.dir, /*directory=*/true}});
  std::unique_ptr<io::GptWeights> init;
  if (!o.init_from.empty())
    init = std::make_unique<io::GptWeights>(
        io::load_gpt_weights(o.init_from, o.was_set("heads") ? o.heads : 0));
  if (init) check_init_moe(o, *init);
  const std::optional<ResumePoint> resume = cli::find_resume_point(o.checkpoints);
  GptData data = load_gpt_data(o);
  const GptConfig config = resolve_config(o, data, init.get(), resume ? &*resume : nullptr);
  if (o.plan == "auto") plan_layout(o, config, world, training_device(o));
  const int64_t model_ranks = o.tp * o.pp;
  if (o.dp == 0) {
    LOOM_CHECK(world->size() % model_ranks == 0, "loom-gpt: --tp ", o.tp, " x --pp ", o.pp,
               " does not divide the ", world->size(), " rank(s) running");
    o.dp = world->size() / model_ranks;
  }
  LOOM_CHECK(o.dp * model_ranks == world->size(), "loom-gpt: --dp ", o.dp, " x --tp ", o.tp,
             " x --pp ", o.pp, " needs ", o.dp * model_ranks, " ranks but ", world->size(),
             " rank(s) are running; launch with mpirun -np ", o.dp * model_ranks);
  const parallel::DeviceMesh mesh(world, int(o.pp), int(o.dp), int(o.tp));
  LOOM_CHECK(o.batch % (o.dp * o.grad_accum) == 0, "loom-gpt: --batch ", o.batch,
             " must divide evenly over --dp ", o.dp, " x --grad-accum ", o.grad_accum,
             " (it is the global batch: each rank takes batch / dp rows, in grad-accum "
             "micro-batches)");

  io::check_token_range(data.tokens, config.vocab, o.data.empty() ? "addition task" : o.data);
  io::BatchLoader loader(std::move(data.tokens), o.batch, o.seq, o.data);
  // A bad prompt fails now, not after training.
  const PromptForm form = prompt_form(o, config);
  std::vector<int64_t> prompt;
  if (!o.generate.empty()) {
    prompt = encode_prompt(o.generate, form, config.vocab);
    LOOM_CHECK(o.top_k <= config.vocab, "loom-gpt: --top-k ", o.top_k, " exceeds the vocabulary (",
               config.vocab, " tokens)");
  }

  nn::set_dropout_seed(o.seed);
  const DType dtype = parse_dtype(o.dtype);
  const Device device = training_device(o);
  auto optimizer_factory = [&o](std::vector<Tensor> params) {
    return make_optimizer(o, std::move(params));
  };
  // With --pp the stages live in the PipelineStep; evaluation runs on a gathered single-process
  // copy (See gpt_pipeline.h).
  std::unique_ptr<GptModel> gpt;
  std::unique_ptr<Trainer> trainer;
  if (o.pp > 1) {
    LOOM_CHECK(!o.eval_only, "loom-gpt: --eval-only runs without --pp");
    trainer = std::make_unique<PipelineStep>(config, o, mesh, schedule_from(o), optimizer_factory,
                                             init ? &init->params : nullptr);
  } else {
    gpt = std::make_unique<GptModel>(config, o, mesh);
    if (init)
      gpt->load(init->params);
    else
      gpt->module().init_parameters(o.seed);
    if (dtype != DType::kF32) gpt->module().to(dtype);  // initialised in f32, then rounded
    gpt->to(device);
  }
  init.reset();  // the model holds its own copy

  if (o.eval_only) {
    GptModel& model_ref = *gpt;
    nn::Module& model = model_ref.module();
    if (resume) {  // the checkpoint's weights (any layout), not its optimizer state
      namespace ckpt = parallel::checkpoint;
      ckpt::load(resume->path, resume->manifest,
                 ckpt::value_pieces(ckpt::parameter_places(model), model.parameters()), *world);
    }
    model.eval();
    LOOM_CHECK(o.eval_batches <= loader.batches_per_pass(), "loom-gpt: --eval-batches ",
               o.eval_batches, " but the data holds only ", loader.batches_per_pass(),
               " batches of ", o.batch, " x ", o.seq);
    std::printf("val_loss %.7f\n", evaluate_loss(model_ref, loader, o.eval_batches));
    if (data.task) {
      io::ExactMatch m =
          evaluate_task(model_ref.logits_fn(), data.task->heldout_set(o.eval_examples), o.batch);
      std::printf("exact_match %.4f (%" PRId64 "/%" PRId64 " held-out examples)\n", m.accuracy(),
                  m.correct, m.total);
    }
    return 0;
  }

  std::printf("loom-gpt: %s\n", data.description.c_str());
  std::printf("model: %s, %" PRId64 " parameters (%.1f MB %s)%s\n", config.str().c_str(),
              config.num_parameters(),
              double(config.num_parameters()) * double(dtype_size(dtype)) / 1e6, dtype_name(dtype),
              o.dropout > 0 ? detail::str_cat(", dropout ", o.dropout).c_str() : "");
  // The parameters a token passes through, for MFU: a MoE block's top-k experts, not all of them.
  int64_t active_parameters = config.num_parameters();
  if (o.moe_experts > 0) {
    int64_t total = 0;  // of the single-process model, whatever the layout holds here
    for (const io::GptParamSpec& spec : io::gpt_param_specs(config, o.moe()))
      total += shape_numel(spec.shape);
    const int64_t c = config.channels, width = o.moe().expert_width(c);
    const int64_t expert = 2 * c * width + width + c;  // fc and proj, with biases
    const int64_t moe_blocks = (config.layers + o.moe_every - 1) / o.moe_every;
    active_parameters = total - moe_blocks * (o.moe_experts - o.moe_top_k) * expert;
    std::printf("moe: %" PRId64 " experts of hidden width %" PRId64 ", top-%" PRId64
                " in every %" PRId64 " block(s), %s, aux loss %g, z-loss %g; %" PRId64
                " parameters in all, %" PRId64 " active per token\n",
                o.moe_experts, width, o.moe_top_k, o.moe_every,
                o.moe_capacity_factor > 0
                    ? detail::str_cat("capacity factor ", o.moe_capacity_factor).c_str()
                    : "dropless",
                o.moe_aux_loss, o.moe_z_loss, total, active_parameters);
  }

  if (!trainer) trainer = std::make_unique<DataParallelStep>(*gpt, o, mesh, optimizer_factory);
  const optim::LrSchedule schedule =
      o.lr_schedule == "cosine" && o.steps > 0
          ? optim::LrSchedule::cosine(o.lr, o.lr * o.min_lr_ratio, o.warmup_steps, o.steps)
          : optim::LrSchedule::constant(o.lr, o.warmup_steps);
  std::printf("training: %" PRId64 " steps of %" PRId64 " x %" PRId64
              " tokens, %s, lr %s, "
              "grad clip %g, %d thread(s) per rank\n",
              o.steps, o.batch, o.seq, trainer->optimizer_name(), schedule.str().c_str(),
              o.grad_clip, omp_get_max_threads());
  if (world->size() > 1 || o.zero > 0 || o.grad_accum > 1 || dtype != DType::kF32)
    std::printf("parallel: %s over %d rank(s)\n", trainer->str().c_str(), world->size());
  if (mesh.nodes().nodes() > 1) {  // across machines: where each rank and group runs
    std::string where = mesh.placement();
    for (size_t at = 0; (at = where.find('\n', at)) != std::string::npos && at + 1 < where.size();)
      where.insert(++at, "  ");
    std::printf("placement: %d nodes\n  %s", mesh.nodes().nodes(), where.c_str());
  }
  std::printf("memory per rank: %s\n", trainer->memory().str().c_str());
  // MFU: model FLOPs per token (6N + attention, N the active parameters) at the measured tokens/s
  // over every GPU's peak.
  const cli::GpuPeak peak = device.is_cuda() ? cli::gpu_peak(device.index, dtype) : cli::GpuPeak{};
  const double flops_per_token = cli::gpt_flops_per_token(
      double(active_parameters), int(config.layers), int(config.channels), int(o.seq));
  if (device.is_cuda())
    std::printf("device: %s (%s); MFU against %.1f TFLOP/s per GPU (%s)\n", device.str().c_str(),
                peak.gpu.c_str(), peak.flops / 1e12, peak.basis.c_str());

  std::unique_ptr<io::AdditionEvalSet> heldout;
  if (data.task)
    heldout = std::make_unique<io::AdditionEvalSet>(data.task->heldout_set(o.eval_examples));

  int64_t first_step = 0;
  if (resume) {
    loader.seek(resume_batch_index(*resume, o));
    const auto load_start = Clock::now();
    const parallel::checkpoint::LoadStats loaded =
        trainer->load_checkpoint(resume->path, resume->manifest, *world);
    first_step = resume->manifest.step;
    // What the ranks read, which `loom-ckpt check` predicts: in all, and the most one rank read.
    Tensor read = Tensor::full({1}, double(loaded.bytes_read), DType::kI64);
    Tensor most = read.clone();
    world->allreduce_sync(read);
    world->allreduce_sync(most, comm::ReduceOp::kMax);
    std::printf("checkpoint: resumed from %s at step %" PRId64 " in %.2f s (saved by %s)\n",
                resume->path.c_str(), first_step, seconds_since(load_start),
                resume->manifest.state.value("layout", nlohmann::json::object()).dump().c_str());
    std::printf("checkpoint: read %" PRId64 " bytes in all, at most %" PRId64 " on one rank\n",
                read.to_vector<int64_t>()[0], most.to_vector<int64_t>()[0]);
  }
  cli::Progress progress(o.steps, world->rank() == 0 ? o.metrics_file : std::string(), "tok/s",
                         first_step);
  const auto start = Clock::now();
  io::ExactMatch best;
  int64_t best_step = 0, steps_done = first_step;
  // --checkpoint-dir: every --save-every steps and at the end, in place or (--async-save) in the
  // background.
  cli::CheckpointSaver saver(o.checkpoints, world, first_step, [&](nlohmann::json& state) {
    state = run_state(config, o, world->size(), loader.index(), schedule.str());
    return trainer->checkpoint_pieces(state);
  });
  bool reached = false;
  if (gpt) gpt->module().train();
  // The steps' own peak apart from the setup's (the initial weights, a loaded checkpoint): what
  // the layout needs to train.
  Allocator& allocator = allocator_for(device);
  const size_t setup_peak = allocator.peak_bytes();
  allocator.reset_peak();
  // Held-out evaluation: on the model itself, or with a pipeline on a gathered copy.
  std::unique_ptr<nn::GPT> gathered;
  auto evaluate_heldout = [&] {
    if (gpt) {
      gpt->module().eval();
      io::ExactMatch em = evaluate_task(gpt->logits_fn(), *heldout, o.batch);
      gpt->module().train();
      return em;
    }
    if (!gathered) {
      nn::GptOptions shape;
      shape.moe = o.moe();  // the trained model's blocks, MoE ones included
      gathered = std::make_unique<nn::GPT>(config, shape);
    }
    gathered->load_state_dict(trainer->full_params());
    gathered->eval();
    return evaluate_task([&](const Tensor& x) { return (*gathered)(x); }, *heldout, o.batch);
  };
  for (int64_t step = first_step; step < o.steps; ++step) {
    const auto step_start = Clock::now();
    const double lr = schedule.lr(step);
    io::Batch batch = loader.next_batch();
    if (data.task) data.task->mask_non_answer_targets(batch.targets);
    const StepResult r = trainer->run(batch, step, lr);
    const double norm = r.grad_norm;
    steps_done = step + 1;

    cli::StepMetrics m;
    m.step = step + 1;
    m.loss = r.loss;
    m.lr = lr;
    m.step_ms = seconds_since(step_start) * 1e3;
    m.elapsed_s = seconds_since(start);
    m.tokens_per_s = double(o.batch * o.seq) / (m.step_ms / 1e3);
    m.grad_norm = norm;
    m.comm_wait_ms = r.comm_wait_ms;
    m.comm_wait_least_ms = r.comm_wait_least_ms;
    if (r.moe_aux_loss >= 0) {  // MoE: the auxiliary losses and where the tokens went
      std::string load;
      for (int64_t n : r.moe_load) load += (load.empty() ? "" : "/") + std::to_string(n);
      m.line_extra =
          detail::str_cat("moe aux ", r.moe_aux_loss, " load ", load, " dropped ", r.moe_dropped);
      nlohmann::json extra = {{"moe_aux_loss", r.moe_aux_loss},
                              {"moe_load", r.moe_load},
                              {"moe_dropped", r.moe_dropped}};
      if (r.moe_exchange_ms >= 0) {  // expert parallelism: rank 0's time in the all-to-alls
        m.line_extra += detail::str_cat(" a2a ", int64_t(r.moe_exchange_ms * 10) / 10.0, " ms");
        extra["moe_exchange_ms"] = r.moe_exchange_ms;
      }
      m.metrics_extra = extra.dump();
    }
    if (peak.flops > 0)
      m.mfu = flops_per_token * m.tokens_per_s / (peak.flops * double(world->size()));
    progress.step(m);
    saver.after_step(steps_done, progress);

    if (heldout && ((step + 1) % o.eval_every == 0 || step + 1 == o.steps)) {
      io::ExactMatch em = evaluate_heldout();
      if (em.accuracy() >= best.accuracy()) best = em, best_step = step + 1;
      progress.event(step + 1, "eval", {{"exact_match", em.accuracy()}});
      if (em.accuracy() >= o.target) {
        reached = true;
        break;
      }
    }
  }
  progress.flush_line();
  saver.at_end(steps_done, progress);
  trainer->finish();
  const double elapsed = seconds_since(start);
  const size_t steps_peak = allocator.peak_bytes();
  std::printf("trained %" PRId64 " steps in %s; peak memory on rank 0: %.2f MB (%s allocator)\n",
              steps_done, cli::format_duration(elapsed).c_str(),
              double(std::max(setup_peak, steps_peak)) / 1e6, device.is_cpu() ? "CPU" : "CUDA");
  std::printf("peak memory on rank 0 in the steps: %.2f MB (the setup's excluded)\n",
              double(steps_peak) / 1e6);
  if (const optim::LossScaler* scaler = trainer->scaler(); scaler && scaler->skipped_steps() > 0)
    std::printf("skipped %" PRId64 " step(s) with an inf or nan gradient; loss scaling %s\n",
                scaler->skipped_steps(), scaler->str().c_str());

  if (!o.save.empty()) {
    const io::GptParams params = trainer->full_params();  // every rank takes part
    if (world->rank() == 0) {
      io::save_gpt_weights(o.save, config, params, o.moe());
      std::printf("saved weights to %s\n", o.save.c_str());
    }
  }
  if (!o.generate.empty())
    generate_sample(o, config, *trainer, prompt, form, dtype, device, world->rank());
  if (heldout) {
    std::printf(
        "%s: held-out exact match %.3f %s %.3f on %" PRId64 " examples (step %" PRId64 ", %s)\n",
        reached ? "target reached" : "target not reached", best.accuracy(), reached ? ">=" : "<",
        o.target, best.total, best_step, cli::format_duration(elapsed).c_str());
  }
  return 0;
}

}  // namespace
}  // namespace loom::gpt

int main(int argc, char** argv) {
  return loom::cli::guarded_main("loom-gpt", "--batch, --seq, --steps, --dim, --layers, ...",
                                 [&] { return loom::gpt::run(argc, argv); });
}
