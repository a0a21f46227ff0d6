// loom-dlrm: trains DLRM on the built-in synthetic click data (core/io/click_data.h), whose
// Bayes-optimal accuracy and AUC are known, and reports how close the model gets to them.
//
//   ./build/bin/loom-dlrm                                   # one process
//   mpirun -np 4 ./build/bin/loom-dlrm --sharding auto      # tables sharded, MLPs data-parallel
//
// One process: the tables are one nn::EmbeddingBagCollection (table-batched lookups). Under
// mpirun the tables are a parallel::ShardedEmbeddingBagCollection placed by --sharding (model
// parallel), DlrmDense (bottom MLP, dot interaction, top MLP) is wrapped in DDP (data parallel),
// and each rank trains on its 1/W of every global batch. AdamW trains both, or the tables train
// with a fused optimizer in the embedding bags' backward (--embedding-optimizer sgd,
// rowwise_adagrad, adam). --checkpoint-dir saves the whole state (dlrm/dlrm_checkpoint.h) and
// --resume continues it on any layout. Only rank 0 prints.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "collectives/communicator.h"
#include "collectives/hierarchical.h"
#include "common/checkpointing.h"
#include "common/flags.h"
#include "common/main_guard.h"
#include "common/output_paths.h"
#include "common/progress.h"
#include "core/embedding_bag.h"
#include "core/error.h"
#include "core/io/click_data.h"
#include "core/nn/embedding_bag_collection.h"
#include "core/ops.h"
#include "dlrm/dlrm_checkpoint.h"
#include "dlrm/dlrm_model.h"
#include "optimizer/adamw.h"
#include "parallel/checkpoint/embedding_state.h"
#include "parallel/checkpoint/training_state.h"
#include "parallel/ddp.h"
#include "parallel/sharded_embedding.h"

namespace loom::dlrm {
namespace {

using io::auc;
using io::ClickBatch;
using io::ClickCeiling;
using io::ClickDataConfig;
using io::ClickDataset;
using io::ClickSplit;

struct Evaluation {
  double loss = 0, accuracy = 0, auc = 0;
};

using Lookup = std::function<Tensor(const ClickBatch&)>;

// Every rank scores its share of each held-out batch; the logits are gathered so every rank
// computes the figures of the whole batches.
Evaluation evaluate(const Lookup& lookup, DlrmDense& model, const ClickDataset& data,
                    int64_t batches, comm::Communicator& world) {
  NoGradGuard no_grad;
  const int64_t b_all = data.config().batch_size, b_local = b_all / world.size();
  std::vector<float> scores, labels;
  double loss = 0;
  int64_t correct = 0;
  for (int64_t i = 0; i < batches; ++i) {
    ClickBatch b = data.examples(ClickSplit::kEval, i * b_all + world.rank() * b_local, b_local);
    Tensor local = model.logits(b.dense, lookup(b)).contiguous();
    Tensor logits = Tensor::empty({b_all});
    world.allgather(local, logits)->wait();
    Tensor y = data.batch(ClickSplit::kEval, i).labels;
    loss += binary_cross_entropy_with_logits(logits, y).item();
    const std::vector<float> l = logits.to_vector<float>(), yv = y.to_vector<float>();
    for (size_t k = 0; k < l.size(); ++k) correct += (l[k] > 0) == (yv[k] > 0.5f);
    scores.insert(scores.end(), l.begin(), l.end());
    labels.insert(labels.end(), yv.begin(), yv.end());
  }
  return {loss / double(batches), double(correct) / double(scores.size()), auc(scores, labels)};
}

// --embedding-optimizer as the fused update's kind (kNone: "adamw", dense gradients).
kernels::EmbeddingOptimizerHyper embedding_optimizer(const cli::Flags& flags) {
  kernels::EmbeddingOptimizerHyper h;
  const std::string& name = flags.get_string("embedding-optimizer");
  h.kind = name == "sgd"               ? EmbeddingOptimizer::kSgd
           : name == "rowwise_adagrad" ? EmbeddingOptimizer::kRowwiseAdagrad
           : name == "adam"            ? EmbeddingOptimizer::kAdam
                                       : EmbeddingOptimizer::kNone;
  const double lr = flags.get_double("embedding-lr");
  h.lr = float(lr > 0 ? lr : flags.get_double("lr"));
  return h;
}

int run(int argc, char** argv) {
  cli::Flags flags("loom-dlrm",
                   "Trains DLRM on synthetic click data with a known accuracy/AUC ceiling.");
  flags.add_int("steps", 400, "training steps");
  flags.add_int("batch", 256, "examples per step (global: split over the ranks)");
  flags.add_int("dim", 16, "embedding dim (a multiple of 4)");
  flags.add_int("max-bag", 3, "bag lengths are uniform in [1, max-bag]");
  flags.add_double("lr", 3e-3, "AdamW learning rate (MLPs, and tables without a fused optimizer)");
  flags.add_string("embedding-optimizer", "adamw",
                   "how the tables train: adamw (dense gradients, with the MLPs' AdamW), or fused "
                   "into the embedding bags' backward (no weight gradient): sgd, rowwise_adagrad, "
                   "adam",
                   {"adamw", "sgd", "rowwise_adagrad", "adam"});
  flags.add_double("embedding-lr", 0, "learning rate of the fused embedding optimizer (0: --lr)");
  flags.add_int("seed", 1234, "data and initialisation seed");
  flags.add_int("eval-every", 100, "evaluate every N steps (0: only at the end)");
  flags.add_int("eval-batches", 16, "held-out batches per evaluation");
  flags.add_int("ceiling-examples", int64_t(1) << 18,
                "held-out examples the Bayes ceiling (the best accuracy and AUC) is estimated on");
  flags.add_string("sharding", "auto",
                   "under mpirun, how the tables are placed: table (whole tables), row, column, "
                   "data (replicated), auto (small tables replicated, the others whole)",
                   {"table", "row", "column", "data", "auto"});
  flags.add_string("metrics-file", "",
                   "append one JSON object per step and evaluation; on resume, the rows after the "
                   "checkpoint's step are dropped and the run appends");
  cli::declare_checkpoint_flags(flags);
  if (!flags.parse(argc, argv)) return 0;
  const cli::CheckpointOptions checkpoints = cli::read_checkpoint_flags(flags, "loom-dlrm");
  LOOM_CHECK(flags.get_double("embedding-lr") >= 0, "loom-dlrm: --embedding-lr must be >= 0, got ",
             flags.get_double("embedding-lr"));
  LOOM_CHECK(flags.get_int("eval-every") >= 0, "loom-dlrm: --eval-every must be >= 0 (0: only at ",
             "the end), got ", flags.get_int("eval-every"));
  LOOM_CHECK(flags.get_int("eval-batches") >= 1, "loom-dlrm: --eval-batches must be >= 1, got ",
             flags.get_int("eval-batches"));
  LOOM_CHECK(flags.get_int("ceiling-examples") > 0,
             "loom-dlrm: --ceiling-examples must be positive, got ",
             flags.get_int("ceiling-examples"));

  auto world = comm::world();
  // Across nodes, the tables' all-to-alls and the MLPs' gradient allreduces pick flat or two
  // levels per call (LOOM_COLL_ALGO, auto by default; Note [Flat or hierarchical]).
  if (world->size() > 1) world->set_algorithm(comm::algorithm_from_env());
  if (world->rank() != 0)
    LOOM_CHECK(std::freopen("/dev/null", "w", stdout) != nullptr,
               "loom-dlrm: cannot silence stdout on rank ", world->rank());
  // A bad path fails every rank now, not rank 0 alone after training.
  cli::check_output_paths("loom-dlrm", *world,
                          {{"metrics-file", flags.get_string("metrics-file")},
                           {"checkpoint-dir", checkpoints.dir, /*directory=*/true}});
  const int64_t ranks = world->size(), batch = flags.get_int("batch");
  LOOM_CHECK(batch > 0 && batch % ranks == 0, "loom-dlrm: --batch ", batch,
             " must be a positive multiple of the ", ranks, " rank(s) running");
  const int64_t b_local = batch / ranks;
  const std::optional<cli::ResumePoint> resume = cli::find_resume_point(checkpoints);

  ClickDataConfig data_config;
  data_config.seed = uint64_t(flags.get_int("seed"));
  data_config.batch_size = batch;
  data_config.max_bag_size = flags.get_int("max-bag");
  ClickDataset data(data_config);
  // Only rank 0 prints the ceiling (and reports it with each evaluation). Its cost is the
  // examples' lookups: with long bags the default number of examples would take minutes, so
  // unless --ceiling-examples was given it is cut to a budget of lookups, and said so.
  int64_t ceiling_examples = flags.get_int("ceiling-examples");
  const double lookups_per_example =
      double(data.num_tables()) * (1.0 + double(data_config.max_bag_size)) / 2.0;
  constexpr double kCeilingLookups = double(int64_t(1) << 26);
  if (!flags.was_set("ceiling-examples") &&
      double(ceiling_examples) * lookups_per_example > kCeilingLookups) {
    ceiling_examples = std::max<int64_t>(2, int64_t(kCeilingLookups / lookups_per_example));
    std::printf(
        "data: bags of up to %lld rows: the ceiling is estimated on %lld held-out examples, not "
        "%lld (--ceiling-examples sets it)\n",
        static_cast<long long>(data_config.max_bag_size), static_cast<long long>(ceiling_examples),
        static_cast<long long>(flags.get_int("ceiling-examples")));
  } else if (double(ceiling_examples) * lookups_per_example > kCeilingLookups) {
    std::printf("data: estimating the ceiling on %lld held-out examples (%.3g lookups)...\n",
                static_cast<long long>(ceiling_examples),
                double(ceiling_examples) * lookups_per_example);
  }
  std::fflush(stdout);
  const ClickCeiling ceiling = world->rank() == 0 ? data.ceiling(ceiling_examples) : ClickCeiling{};
  const auto& rows = data_config.table_rows;
  std::printf(
      "data: %lld tables (%lld..%lld rows), %lld dense features; ceiling (Bayes): "
      "accuracy %.4f, AUC %.4f, click rate %.3f\n",
      static_cast<long long>(data.num_tables()),
      static_cast<long long>(*std::min_element(rows.begin(), rows.end())),
      static_cast<long long>(*std::max_element(rows.begin(), rows.end())),
      static_cast<long long>(data_config.num_dense), ceiling.accuracy, ceiling.auc,
      ceiling.positive_rate);
  std::fflush(stdout);  // before a first step that may take long (a huge --batch or bags)

  DlrmRun run;
  DlrmConfig& config = run.config;
  config.num_dense = data_config.num_dense;
  config.num_tables = data.num_tables();
  config.dim = resume ? checkpoint_dim(*resume, flags.get_int("dim"), flags.was_set("dim"))
                      : flags.get_int("dim");
  run.table_rows = rows;
  run.seed = data_config.seed;
  run.batch = batch;
  run.max_bag = data_config.max_bag_size;
  run.steps = flags.get_int("steps");
  LOOM_CHECK(run.steps >= 0, "loom-dlrm: --steps must be >= 0, got ", run.steps);
  run.lr = flags.get_double("lr");
  run.embedding_lr = flags.get_double("embedding-lr");
  run.embedding_optimizer = flags.get_string("embedding-optimizer");
  run.world_size = int(ranks);
  run.sharding = flags.get_string("sharding");
  std::vector<nn::EmbeddingTableConfig> tables;
  for (int64_t t = 0; t < data.num_tables(); ++t)
    tables.push_back({"t" + std::to_string(t), rows[size_t(t)], config.dim});
  const uint64_t seed = run.seed;
  DlrmDense model(config);
  model.init_parameters(seed);
  const kernels::EmbeddingOptimizerHyper fused = embedding_optimizer(flags);
  Lookup lookup;
  std::unique_ptr<nn::EmbeddingBagCollection> local_tables;
  std::unique_ptr<parallel::ShardedEmbeddingBagCollection> sharded;
  std::unique_ptr<parallel::DistributedDataParallel> ddp;
  nn::Module* table_module = nullptr;
  if (ranks == 1) {
    nn::EmbeddingBagCollectionOptions o;
    o.fused = fused;
    local_tables = std::make_unique<nn::EmbeddingBagCollection>(tables, o);
    local_tables->init_parameters(seed);
    table_module = local_tables.get();
    lookup = [&](const ClickBatch& b) { return local_tables->lookup(b.indices, b.offsets); };
  } else {
    parallel::ShardedEmbeddingOptions o;
    o.fused = fused;
    sharded = std::make_unique<parallel::ShardedEmbeddingBagCollection>(
        tables, parallel::embedding_placements(run.sharding, rows), world, o);
    sharded->init_parameters(seed);
    run.placements = sharded->placements();
    table_module = sharded.get();
    lookup = [&](const ClickBatch& b) { return sharded->lookup(b.indices, b.offsets); };
    ddp = std::make_unique<parallel::DistributedDataParallel>(model, world);
    std::printf("parallel: %lld ranks, tables sharded (--sharding %s), MLPs data-parallel\n",
                static_cast<long long>(ranks), run.sharding.c_str());
    if (world->hierarchy() != nullptr && world->hierarchy()->applies())
      std::printf("collectives: %s\n", world->algorithm_str().c_str());
  }
  if (fused.kind != EmbeddingOptimizer::kNone)
    std::printf("tables: fused %s in the embedding bags' backward, lr %g\n",
                run.embedding_optimizer.c_str(), double(fused.lr));
  // AdamW on the MLPs, and on the tables unless their backward updates them (two AdamWs equal
  // one over both: its update is per parameter).
  optim::AdamWOptions adamw;
  adamw.lr = run.lr;
  adamw.weight_decay = 0.0;
  optim::AdamW opt(model.parameters(), adamw);
  std::unique_ptr<optim::AdamW> table_opt;
  if (fused.kind == EmbeddingOptimizer::kNone)
    table_opt = std::make_unique<optim::AdamW>(table_module->parameters(), adamw);

  // The checkpoint: the MLPs and their optimizer (TrainingState: replicated under DDP), the
  // tables and theirs (EmbeddingState: as placed), and the run state.
  namespace ckpt = parallel::checkpoint;
  ckpt::TrainingState mlp_state(model, opt);
  std::unique_ptr<ckpt::EmbeddingState> table_state =
      local_tables ? std::make_unique<ckpt::EmbeddingState>(*local_tables, table_opt.get())
                   : std::make_unique<ckpt::EmbeddingState>(*sharded, table_opt.get());
  int64_t first_step = 0, next_example = 0;
  if (resume) {
    next_example = resume_position(*resume, run);
    mlp_state.load(resume->path, resume->manifest, *world);
    table_state->load(resume->path, resume->manifest, *world);
    first_step = resume->manifest.step;
    std::printf("checkpoint: resumed from %s at step %lld (saved by %s)\n", resume->path.c_str(),
                static_cast<long long>(first_step),
                resume->manifest.state.value("layout", nlohmann::json::object()).dump().c_str());
  }
  cli::CheckpointSaver saver(checkpoints, world, first_step, [&](nlohmann::json& state) {
    state = run_state(run, next_example);
    std::vector<ckpt::StatePiece> pieces = mlp_state.save_pieces(state);
    std::vector<ckpt::StatePiece> more = table_state->save_pieces(state);
    pieces.insert(pieces.end(), more.begin(), more.end());
    return pieces;
  });

  const int64_t steps = run.steps, eval_every = flags.get_int("eval-every");
  cli::Progress progress(steps, world->rank() == 0 ? flags.get_string("metrics-file") : "", "ex/s",
                         first_step);
  const auto start = std::chrono::steady_clock::now();
  auto report = [&](int64_t step) {
    const Evaluation e = evaluate(lookup, model, data, flags.get_int("eval-batches"), *world);
    progress.event(step, "eval",
                   {{"val_loss", e.loss},
                    {"accuracy", e.accuracy},
                    {"auc", e.auc},
                    {"ceiling_accuracy", ceiling.accuracy},
                    {"ceiling_auc", ceiling.auc}});
  };
  int64_t steps_done = first_step;
  for (int64_t step = first_step; step < steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    ClickBatch b =
        data.examples(ClickSplit::kTrain, next_example + world->rank() * b_local, b_local);
    // This rank's mean: DDP averages the MLPs' gradients over the ranks and the sharded tables
    // scale theirs to match (Note [Sharded embedding gradient scale]).
    Tensor loss = binary_cross_entropy_with_logits(model.logits(b.dense, lookup(b)), b.labels);
    opt.zero_grad();
    if (table_opt) table_opt->zero_grad();
    if (ddp) {
      ddp->backward(loss);
      ddp->finish();
      sharded->finish_gradients();
    } else {
      loss.backward();
    }
    opt.step();
    if (table_opt) table_opt->step();
    next_example += batch;
    steps_done = step + 1;
    Tensor mean_loss = Tensor::full({1}, loss.item() / double(ranks));
    world->allreduce(mean_loss)->wait();
    const auto t1 = std::chrono::steady_clock::now();
    cli::StepMetrics m;
    m.step = step + 1;
    m.loss = mean_loss.item();
    m.lr = adamw.lr;
    m.step_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    m.elapsed_s = std::chrono::duration<double>(t1 - start).count();
    m.tokens_per_s = double(batch) / (m.step_ms / 1e3);  // examples/s
    progress.step(m);
    saver.after_step(steps_done, progress);
    if (eval_every > 0 && (step + 1) % eval_every == 0 && step + 1 < steps) report(step + 1);
  }
  progress.flush_line();
  saver.at_end(steps_done, progress);
  report(steps_done);
  return 0;
}

}  // namespace
}  // namespace loom::dlrm

int main(int argc, char** argv) {
  return loom::cli::guarded_main("loom-dlrm", "--batch, --steps, --rows, --max-bag, ...",
                                 [&] { return loom::dlrm::run(argc, argv); });
}
