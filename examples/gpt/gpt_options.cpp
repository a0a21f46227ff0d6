#include "gpt/gpt_options.h"

#include <algorithm>
#include <cmath>

#include "core/device.h"
#include "core/error.h"

namespace loom::gpt {

void declare_gpt_flags(cli::Flags& f) {
  f.add_int("layers", 2, "transformer blocks");
  f.add_int("heads", 4, "attention heads (must divide --dim)");
  f.add_int("dim", 128, "model width (channels)");
  f.add_int("seq", 0,
            "sequence length T of each row; 0: one example (3*digits+4 tokens) for the addition "
            "task, else 64");
  f.add_int("vocab", 0, "vocabulary size; 0: from the data (task 14, text 256, tokens 50257)");
  f.add_double("dropout", 0.0, "dropout probability (attention, residual, embedding)");
  f.add_bool("checkpoint-activations", "recompute each block's activations in backward");
  f.add_int("moe-experts", 0, "mixture of experts: experts per MoE block (0: dense MLPs)");
  f.add_int("moe-top-k", 1, "MoE: experts per token (1: Switch, raw gate; >1: renormalised)");
  f.add_int("moe-every", 1, "MoE: block i's MLP is a MoE when i % N == 0");
  f.add_double("moe-capacity-factor", 0,
               "MoE: each expert takes ceil(k x tokens x c / experts) tokens, the overflow "
               "dropped (0: dropless)");
  f.add_double("moe-aux-loss", 0.01, "MoE: load-balancing loss coefficient (alpha)");
  f.add_double("moe-z-loss", 0.001, "MoE: router z-loss coefficient (beta)");
  f.add_int("moe-hidden", 0,
            "MoE: each expert's hidden width (0: 4 x dim; 4 x dim / K gives top-K the dense "
            "model's active parameters)");
  f.add_double("moe-receive-budget-mb", 0,
               "MoE, dropless: activation MiB a rank may receive for its experts; over it a "
               "forward keeps each expert's first assignments, with a warning (0: a quarter of "
               "the available memory; < 0: no budget)");
  f.add_int("ep", 1,
            "MoE: expert-parallel ranks: the experts split over groups of this many dp ranks, "
            "replicated across the groups (must divide --dp)");
  f.add_int("expert-tp", 1,
            "MoE with --tp: 1 keeps each expert whole on every tp rank; --tp's value splits each "
            "expert over the tp group (Megatron's expert tensor parallelism: 1/tp of the "
            "experts' weights and work per rank)");
  f.add_string("data", "",
               "training data: an llm.c token file (.bin) or a text file (byte-level); "
               "empty: the built-in addition task");
  f.add_int("digits", 3, "digits per operand of the built-in addition task");
  f.add_int("batch", 64, "sequences per optimizer step");
  f.add_int("steps", 3000, "optimizer steps (the addition task stops early at --target)");
  f.add_double("lr", 3e-3, "peak learning rate");
  f.add_string("optimizer", "adamw", "optimizer", {"sgd", "adamw"});
  f.add_double("weight-decay", 0.0, "weight decay (AdamW: decoupled; SGD: coupled)");
  f.add_double("momentum", 0.0, "SGD momentum");
  f.add_double("grad-clip", 1.0, "clip the global gradient norm to this (0 = off)");
  f.add_int("warmup-steps", 100,
            "linear learning-rate warmup steps; unless given, at most --steps/10");
  f.add_string("lr-schedule", "cosine", "learning-rate schedule after warmup",
               {"constant", "cosine"});
  f.add_double("min-lr-ratio", 0.1, "cosine schedule: final lr as a fraction of --lr");
  f.add_int("seed", 1337, "seed for initialisation, dropout and the task's examples");
  f.add_int(
      "dp", 0,
      "data-parallel ranks (run under mpirun -np dp x tp x pp); 0: the ranks launched / (tp x pp)");
  f.add_int(
      "tp", 1,
      "tensor-parallel ranks (Megatron-style: heads, MLP and vocabulary split); --dp x --tp x "
      "--pp ranks in all");
  f.add_bool("sequence-parallel",
             "with --tp: split the LayerNorm and dropout regions along the sequence");
  f.add_int("pp", 1, "pipeline ranks (each holds a stage; --schedule interleaved: several)");
  f.add_string("schedule", "1f1b", "pipeline schedule",
               {"gpipe", "1f1b", "interleaved", "chimera"});
  f.add_int("microbatches", 0,
            "pipeline micro-batches per step on each dp rank (0: --pp); must divide batch / dp");
  f.add_int("virtual-stages", 1, "--schedule interleaved: model chunks per pipeline rank");
  f.add_string("schedule-file", "",
               "a schedule in loom's text form (see --print-schedule) instead of --schedule");
  f.add_bool("validate-schedule",
             "simulate the schedule on one process (unit costs), print one line per rank "
             "(`rank R bubble F peak_activations A`) and exit");
  f.add_bool("print-schedule", "print the schedule in its text form and exit");
  f.add_string("plan", "none",
               "auto: let the planner (loom-plan) choose dp, tp, pp, the schedule, micro-batches, "
               "ZeRO stage, recomputation and sequence parallelism for the ranks launched",
               {"none", "auto"});
  f.add_string("plan-profile", "",
               "--plan auto: this machine's rates (loom-plan --calibrate); default: measure them "
               "first");
  f.add_string("trace", "",
               "with --pp: write a Chrome trace (chrome://tracing, Perfetto) of every step, one "
               "track per pipeline rank, and print the measured bubble");
  f.add_int("zero", 0, "ZeRO stage over the data-parallel ranks: 0 (DDP), 1, 2 or 3");
  f.add_string("zero-shard-group", "all",
               "with --zero: shard over all the dp ranks (all), over each node's (node), or over "
               "groups of N consecutive dp ranks (a number), replicating across the groups "
               "(hybrid sharding, as MiCS and PyTorch's HSDP)");
  f.add_int("grad-accum", 1,
            "micro-batches per step on each rank (each takes batch / dp / grad-accum rows)");
  f.add_string("dtype", "f32",
               "parameter and activation dtype; bf16 and f16 train with f32 master weights (f16 "
               "with dynamic loss scaling)",
               {"f32", "bf16", "f16"});
  f.add_double("loss-scale", 65536.0,
               "f16: the dynamic loss scale's start (halved on each overflow, doubled after 2000 "
               "good steps)");
  f.add_string("device", "cpu",
               "where the model trains: cpu, cuda (under mpirun each rank takes the GPU of its "
               "local rank) or cuda:N");
  f.add_double("bucket-mb", 25, "gradient bucket size in MiB (DDP and ZeRO)");
  f.add_bool("no-overlap",
             "launch gradient reductions after backward instead of during it (to measure the "
             "overlap)");
  f.add_bool("eval-only", "evaluate and exit: prints `val_loss <float>`");
  f.add_int("eval-batches", 4, "batches of --batch x --seq for --eval-only's val_loss");
  f.add_int("eval-every", 100, "addition task: evaluate held-out exact match every N steps");
  f.add_int("eval-examples", 1000, "addition task: held-out examples scored per evaluation");
  f.add_double("target", 0.95, "addition task: held-out exact-match accuracy to reach");
  f.add_string("generate", "",
               "after training (--steps 0: on the --init-from weights), continue this prompt and "
               "print it: addition-task characters (\"123+045=\"), bytes with a text file as "
               "--data, else token ids (\"15496 11 995\")");
  f.add_int("max-new-tokens", 64, "--generate: tokens to add to the prompt");
  f.add_double("temperature", 1.0,
               "--generate: divide the logits by this before sampling; 0 takes the argmax");
  f.add_int("top-k", 0, "--generate: sample among the k most likely tokens (0: all)");
  f.add_string("init-from", "", "initial weights: llm.c model file or GPT-2 safetensors");
  f.add_string("save", "", "write the final weights (.bin llm.c, .safetensors Hugging Face)");
  f.add_string("metrics-file", "",
               "write one JSON object per step (JSON Lines) to this file; on resume, the rows "
               "after the checkpoint's step are dropped and the run appends");
  cli::declare_checkpoint_flags(f);
  f.add_int("threads", 0, "CPU threads (0: OMP_NUM_THREADS or all cores)");
}

GptOptions read_gpt_options(const cli::Flags& f) {
  GptOptions o;
  o.flags = &f;
  o.layers = f.get_int("layers");
  o.heads = f.get_int("heads");
  o.dim = f.get_int("dim");
  o.seq = f.get_int("seq");
  o.vocab = f.get_int("vocab");
  o.dropout = f.get_double("dropout");
  o.checkpoint_activations = f.get_bool("checkpoint-activations");
  o.moe_experts = f.get_int("moe-experts");
  o.moe_top_k = f.get_int("moe-top-k");
  o.moe_every = f.get_int("moe-every");
  o.moe_capacity_factor = f.get_double("moe-capacity-factor");
  o.moe_aux_loss = f.get_double("moe-aux-loss");
  o.moe_z_loss = f.get_double("moe-z-loss");
  o.moe_hidden = f.get_int("moe-hidden");
  o.moe_receive_budget_mb = f.get_double("moe-receive-budget-mb");
  o.ep = f.get_int("ep");
  o.expert_tp = f.get_int("expert-tp");
  o.data = f.get_string("data");
  o.digits = f.get_int("digits");
  o.batch = f.get_int("batch");
  o.steps = f.get_int("steps");
  o.lr = f.get_double("lr");
  o.optimizer = f.get_string("optimizer");
  o.weight_decay = f.get_double("weight-decay");
  o.momentum = f.get_double("momentum");
  o.grad_clip = f.get_double("grad-clip");
  o.warmup_steps = f.get_int("warmup-steps");
  // The default warmup must not exceed a short run; an explicit one is taken as given.
  if (!f.was_set("warmup-steps")) o.warmup_steps = std::min(o.warmup_steps, o.steps / 10);
  o.lr_schedule = f.get_string("lr-schedule");
  o.min_lr_ratio = f.get_double("min-lr-ratio");
  o.seed = uint64_t(f.get_int("seed"));
  o.dp = f.get_int("dp");
  o.zero = f.get_int("zero");
  o.zero_shard_group = f.get_string("zero-shard-group");
  o.tp = f.get_int("tp");
  o.pp = f.get_int("pp");
  o.schedule = f.get_string("schedule");
  o.microbatches = f.get_int("microbatches");
  o.virtual_stages = f.get_int("virtual-stages");
  o.schedule_file = f.get_string("schedule-file");
  o.validate_schedule = f.get_bool("validate-schedule");
  o.print_schedule = f.get_bool("print-schedule");
  o.plan = f.get_string("plan");
  o.plan_profile = f.get_string("plan-profile");
  o.trace = f.get_string("trace");
  o.sequence_parallel = f.get_bool("sequence-parallel");
  o.dtype = f.get_string("dtype");
  o.loss_scale = f.get_double("loss-scale");
  LOOM_CHECK(!f.was_set("loss-scale") || o.dtype == "f16",
             "loom-gpt: --loss-scale is for --dtype f16 (bf16 and f32 train unscaled)");
  LOOM_CHECK(o.loss_scale > 0 && std::isfinite(o.loss_scale),
             "loom-gpt: --loss-scale must be a positive number, got ", o.loss_scale);
  o.device = f.get_string("device");
  o.grad_accum = f.get_int("grad-accum");
  o.bucket_mb = f.get_double("bucket-mb");
  o.no_overlap = f.get_bool("no-overlap");
  o.eval_only = f.get_bool("eval-only");
  o.eval_batches = f.get_int("eval-batches");
  o.eval_every = f.get_int("eval-every");
  o.eval_examples = f.get_int("eval-examples");
  o.target = f.get_double("target");
  o.generate = f.get_string("generate");
  o.max_new_tokens = f.get_int("max-new-tokens");
  o.temperature = f.get_double("temperature");
  o.top_k = f.get_int("top-k");
  o.init_from = f.get_string("init-from");
  o.save = f.get_string("save");
  o.metrics_file = f.get_string("metrics-file");
  o.threads = f.get_int("threads");
  o.checkpoints = cli::read_checkpoint_flags(f, "loom-gpt");

  auto positive = [](const char* flag, int64_t v) {
    LOOM_CHECK(v > 0, "loom-gpt: --", flag, " must be positive, got ", v);
  };
  positive("layers", o.layers);
  positive("heads", o.heads);
  positive("dim", o.dim);
  LOOM_CHECK(o.seq >= 0, "loom-gpt: --seq must be >= 0 (0 = from the data), got ", o.seq);
  if (o.seq == 0) o.seq = o.data.empty() ? 3 * o.digits + 4 : 64;
  positive("batch", o.batch);
  positive("eval-batches", o.eval_batches);
  positive("eval-every", o.eval_every);
  positive("eval-examples", o.eval_examples);
  LOOM_CHECK(o.steps >= 0, "loom-gpt: --steps must be >= 0, got ", o.steps);
  // A run of no steps is for turning weights into output: text (--generate) or a file (--save).
  LOOM_CHECK(o.steps > 0 || f.was_set("generate") || f.was_set("save"),
             "loom-gpt: --steps 0 trains nothing: give --generate (text from the --init-from "
             "weights) or --save (converting them), or at least one step");
  // With --init-from or a resume the model's width comes from the file: the flags given are
  // checked against it there, not against --dim's default.
  const bool resuming = o.checkpoints.resume || !o.checkpoints.resume_from.empty();
  const bool model_from_file = !o.init_from.empty() || resuming;
  LOOM_CHECK(o.dim % o.heads == 0 || (model_from_file && !f.was_set("dim")), "loom-gpt: --heads ",
             o.heads, " must divide --dim ", o.dim, " (head size would be ",
             double(o.dim) / double(o.heads), ")");
  LOOM_CHECK(o.vocab >= 0, "loom-gpt: --vocab must be >= 0, got ", o.vocab);
  LOOM_CHECK(o.dropout >= 0 && o.dropout < 1, "loom-gpt: --dropout must be in [0, 1), got ",
             o.dropout);
  LOOM_CHECK(o.lr > 0, "loom-gpt: --lr must be positive, got ", o.lr);
  LOOM_CHECK(o.grad_clip >= 0, "loom-gpt: --grad-clip must be >= 0 (0 = off), got ", o.grad_clip);
  LOOM_CHECK(o.warmup_steps >= 0, "loom-gpt: --warmup-steps must be >= 0, got ", o.warmup_steps);
  // --steps 0 (say, to --generate from --init-from weights) runs no schedule at all.
  LOOM_CHECK(o.lr_schedule != "cosine" || o.steps == 0 || o.steps > o.warmup_steps,
             "loom-gpt: --lr-schedule cosine needs --steps (", o.steps,
             ") greater than --warmup-steps (", o.warmup_steps,
             "); use --lr-schedule constant for a run of no steps");
  LOOM_CHECK(o.min_lr_ratio >= 0 && o.min_lr_ratio <= 1,
             "loom-gpt: --min-lr-ratio must be in [0, 1], got ", o.min_lr_ratio);
  LOOM_CHECK(o.target > 0 && o.target <= 1, "loom-gpt: --target must be in (0, 1], got ", o.target);
  LOOM_CHECK(o.weight_decay >= 0, "loom-gpt: --weight-decay must be >= 0, got ", o.weight_decay);
  LOOM_CHECK(o.momentum >= 0 && o.momentum < 1, "loom-gpt: --momentum must be in [0, 1), got ",
             o.momentum);
  LOOM_CHECK(o.optimizer == "sgd" || !f.was_set("momentum"),
             "loom-gpt: --momentum applies to --optimizer sgd only");
  LOOM_CHECK(o.plan == "auto" || !f.was_set("plan-profile"),
             "loom-gpt: --plan-profile applies to --plan auto");
  if (o.plan == "auto") {
    for (const char* flag :
         {"dp", "ep", "tp", "pp", "schedule", "virtual-stages", "microbatches", "grad-accum",
          "zero", "sequence-parallel", "checkpoint-activations", "schedule-file"})
      LOOM_CHECK(!f.was_set(flag), "loom-gpt: --", flag,
                 " conflicts with --plan auto, which chooses the layout (drop one of them)");
  }
  LOOM_CHECK(o.dp >= 0, "loom-gpt: --dp must be >= 0 (0 = every rank launched), got ", o.dp);
  LOOM_CHECK(o.tp >= 1, "loom-gpt: --tp must be >= 1, got ", o.tp);
  LOOM_CHECK(o.pp >= 1, "loom-gpt: --pp must be >= 1, got ", o.pp);
  LOOM_CHECK(o.microbatches >= 0, "loom-gpt: --microbatches must be >= 0, got ", o.microbatches);
  if (o.microbatches == 0) o.microbatches = o.pp;
  LOOM_CHECK(o.virtual_stages >= 1, "loom-gpt: --virtual-stages must be >= 1, got ",
             o.virtual_stages);
  LOOM_CHECK(o.virtual_stages == 1 || o.schedule == "interleaved",
             "loom-gpt: --virtual-stages applies to --schedule interleaved only");
  LOOM_CHECK(o.zero >= 0 && o.zero <= 3, "loom-gpt: --zero must be 0, 1, 2 or 3, got ", o.zero);
  if (o.zero_shard_group != "all") {
    LOOM_CHECK(o.zero > 0, "loom-gpt: --zero-shard-group needs --zero 1, 2 or 3");
    const std::string& g = o.zero_shard_group;
    LOOM_CHECK(
        g == "node" || (!g.empty() && g.find_first_not_of("0123456789") == std::string::npos &&
                        g.size() < 9 && std::stoi(g) > 0),
        "loom-gpt: --zero-shard-group must be all, node or a positive number, got '", g, "'");
  }
  positive("grad-accum", o.grad_accum);
  LOOM_CHECK(o.ep == 1 || o.moe_experts > 0, "loom-gpt: --ep needs --moe-experts");
  LOOM_CHECK(o.expert_tp == 1 || o.moe_experts > 0, "loom-gpt: --expert-tp needs --moe-experts");
  if (o.moe_experts != 0 || f.was_set("moe-top-k") || f.was_set("moe-every") ||
      f.was_set("moe-capacity-factor") || f.was_set("moe-receive-budget-mb") ||
      f.was_set("moe-hidden")) {
    LOOM_CHECK(o.moe_experts > 0, "loom-gpt: the --moe-* flags need --moe-experts N (N >= 1)");
    try {
      o.moe().validate();
    } catch (const Error& e) {
      throw Error(detail::str_cat("loom-gpt: --moe-*: ", e.what()));
    }
    LOOM_CHECK(o.ep >= 1, "loom-gpt: --ep must be >= 1, got ", o.ep);
    // The experts split over --ep consecutive data-parallel ranks, replicated across such
    // groups; the auxiliary losses and capacity are over the whole batch, as on one process.
    LOOM_CHECK(o.dp == 0 || o.dp % o.ep == 0, "loom-gpt: --ep ", o.ep, " must divide --dp ", o.dp,
               " (the experts split over groups of --ep data-parallel "
               "ranks)");
    LOOM_CHECK(o.moe_experts % o.ep == 0, "loom-gpt: --moe-experts ", o.moe_experts,
               " must divide by --ep ", o.ep);
    LOOM_CHECK(o.expert_tp == 1 || o.expert_tp == o.tp, "loom-gpt: --expert-tp ", o.expert_tp,
               " must be 1 (experts whole on every tp rank) or --tp ", o.tp,
               " (each expert split over the tp group)");
    const int64_t width = o.moe().expert_width(o.dim);
    LOOM_CHECK(width % o.expert_tp == 0, "loom-gpt: --expert-tp ", o.expert_tp,
               " must divide the experts' hidden width ", width,
               o.moe_hidden > 0 ? " (--moe-hidden)" : " (4 x --dim)");
  }
  LOOM_CHECK(o.bucket_mb > 0, "loom-gpt: --bucket-mb must be positive, got ", o.bucket_mb);
  LOOM_CHECK(o.threads >= 0, "loom-gpt: --threads must be >= 0, got ", o.threads);
  LOOM_CHECK(!resuming || o.init_from.empty(),
             "loom-gpt: --init-from starts a new run and --resume continues one; give one");
  for (const char* flag : {"max-new-tokens", "temperature", "top-k"})
    LOOM_CHECK(!f.was_set(flag) || f.was_set("generate"), "loom-gpt: --", flag,
               " applies to --generate only");
  LOOM_CHECK(!f.was_set("generate") || !o.eval_only,
             "loom-gpt: --generate runs after training; use --steps 0 instead of --eval-only to "
             "generate from --init-from weights");
  LOOM_CHECK(o.max_new_tokens >= 0, "loom-gpt: --max-new-tokens must be >= 0, got ",
             o.max_new_tokens);
  LOOM_CHECK(o.temperature >= 0, "loom-gpt: --temperature must be >= 0 (0: the argmax), got ",
             o.temperature);
  LOOM_CHECK(o.top_k >= 0, "loom-gpt: --top-k must be >= 0 (0: every token), got ", o.top_k);
  const Device device = Device::parse(o.device);  // an unknown spelling is an error naming it
  LOOM_CHECK(device.is_cpu() || o.pp == 1, "loom-gpt: --device ", o.device,
             " with --pp is not wired yet (the pipeline stages "
             "stay on the CPU); use --dp/--tp/--zero on CUDA, or --pp on the CPU");
  return o;
}

}  // namespace loom::gpt
