// loom-dlrm: trains DLRM on the built-in synthetic click data (core/io/click_data.h), whose
// Bayes-optimal accuracy and AUC are known, and reports how close the model gets to them.
//
//   ./build/bin/loom-dlrm                                   # one process
//   mpirun -np 4 ./build/bin/loom-dlrm --sharding auto      # tables sharded, MLPs data-parallel
//
// One process: the tables are one nn::EmbeddingBagCollection (table-batched lookups). Under
// mpirun the tables are a parallel::ShardedEmbeddingBagCollection placed by --sharding (model
// parallel), DlrmDense (bottom MLP, dot interaction, top MLP) is wrapped in DDP (data parallel),
// and each rank trains on its 1/W of every global batch. AdamW trains both. Only rank 0 prints.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include "collectives/communicator.h"
#include "common/flags.h"
#include "common/progress.h"
#include "core/embedding_bag.h"
#include "core/error.h"
#include "core/io/click_data.h"
#include "core/nn/embedding_bag_collection.h"
#include "core/ops.h"
#include "dlrm/dlrm_model.h"
#include "optimizer/adamw.h"
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

int run(int argc, char** argv) {
  cli::Flags flags("loom-dlrm",
                   "Trains DLRM on synthetic click data with a known accuracy/AUC ceiling.");
  flags.add_int("steps", 400, "training steps");
  flags.add_int("batch", 256, "examples per step (global: split over the ranks)");
  flags.add_int("dim", 16, "embedding dim (a multiple of 4)");
  flags.add_int("max-bag", 3, "bag lengths are uniform in [1, max-bag]");
  flags.add_double("lr", 3e-3, "AdamW learning rate (MLPs and tables)");
  flags.add_int("seed", 1234, "data and initialisation seed");
  flags.add_int("eval-every", 100, "evaluate every N steps (0: only at the end)");
  flags.add_int("eval-batches", 16, "held-out batches per evaluation");
  flags.add_string("sharding", "auto",
                   "under mpirun, how the tables are placed: table (whole tables), row, column, "
                   "data (replicated), auto (small tables replicated, the others whole)",
                   {"table", "row", "column", "data", "auto"});
  flags.add_string("metrics-file", "", "append one JSON object per step and evaluation");
  if (!flags.parse(argc, argv)) return 0;

  auto world = comm::world();
  if (world->rank() != 0)
    LOOM_CHECK(std::freopen("/dev/null", "w", stdout) != nullptr,
               "loom-dlrm: cannot silence stdout on rank ", world->rank());
  const int64_t ranks = world->size(), batch = flags.get_int("batch");
  LOOM_CHECK(batch > 0 && batch % ranks == 0, "loom-dlrm: --batch ", batch,
             " must be a positive multiple of the ", ranks, " rank(s) running");
  const int64_t b_local = batch / ranks;

  ClickDataConfig data_config;
  data_config.seed = uint64_t(flags.get_int("seed"));
  data_config.batch_size = batch;
  data_config.max_bag_size = flags.get_int("max-bag");
  ClickDataset data(data_config);
  const ClickCeiling ceiling = data.ceiling();
  const auto& rows = data_config.table_rows;
  std::printf(
      "data: %lld tables (%lld..%lld rows), %lld dense features; ceiling (Bayes): "
      "accuracy %.4f, AUC %.4f, click rate %.3f\n",
      static_cast<long long>(data.num_tables()),
      static_cast<long long>(*std::min_element(rows.begin(), rows.end())),
      static_cast<long long>(*std::max_element(rows.begin(), rows.end())),
      static_cast<long long>(data_config.num_dense), ceiling.accuracy, ceiling.auc,
      ceiling.positive_rate);

  DlrmConfig config;
  config.num_dense = data_config.num_dense;
  config.num_tables = data.num_tables();
  config.dim = flags.get_int("dim");
  std::vector<nn::EmbeddingTableConfig> tables;
  for (int64_t t = 0; t < data.num_tables(); ++t)
    tables.push_back({"t" + std::to_string(t), rows[size_t(t)], config.dim});
  const uint64_t seed = uint64_t(flags.get_int("seed"));
  DlrmDense model(config);
  model.init_parameters(seed);
  std::vector<Tensor> params;
  Lookup lookup;
  std::unique_ptr<nn::EmbeddingBagCollection> local_tables;
  std::unique_ptr<parallel::ShardedEmbeddingBagCollection> sharded;
  std::unique_ptr<parallel::DistributedDataParallel> ddp;
  if (ranks == 1) {
    local_tables = std::make_unique<nn::EmbeddingBagCollection>(tables);
    local_tables->init_parameters(seed);
    params = local_tables->parameters();
    lookup = [&](const ClickBatch& b) { return local_tables->lookup(b.indices, b.offsets); };
  } else {
    sharded = std::make_unique<parallel::ShardedEmbeddingBagCollection>(
        tables, parallel::embedding_placements(flags.get_string("sharding"), rows), world);
    sharded->init_parameters(seed);
    params = sharded->parameters();
    lookup = [&](const ClickBatch& b) { return sharded->lookup(b.indices, b.offsets); };
    ddp = std::make_unique<parallel::DistributedDataParallel>(model, world);
    std::printf("parallel: %lld ranks, tables sharded (--sharding %s), MLPs data-parallel\n",
                static_cast<long long>(ranks), flags.get_string("sharding").c_str());
  }
  for (const Tensor& p : model.parameters()) params.push_back(p);
  optim::AdamWOptions adamw;
  adamw.lr = flags.get_double("lr");
  adamw.weight_decay = 0.0;
  optim::AdamW opt(params, adamw);

  const int64_t steps = flags.get_int("steps"), eval_every = flags.get_int("eval-every");
  cli::Progress progress(steps, world->rank() == 0 ? flags.get_string("metrics-file") : "", "ex/s");
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
  for (int64_t step = 0; step < steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    ClickBatch b =
        data.examples(ClickSplit::kTrain, step * batch + world->rank() * b_local, b_local);
    // This rank's mean: DDP averages the MLPs' gradients over the ranks and the sharded tables
    // scale theirs to match (Note [Sharded embedding gradient scale]).
    Tensor loss = binary_cross_entropy_with_logits(model.logits(b.dense, lookup(b)), b.labels);
    opt.zero_grad();
    if (ddp) {
      ddp->backward(loss);
      ddp->finish();
      sharded->finish_gradients();
    } else {
      loss.backward();
    }
    opt.step();
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
    if (eval_every > 0 && (step + 1) % eval_every == 0 && step + 1 < steps) report(step + 1);
  }
  report(steps);
  return 0;
}

}  // namespace
}  // namespace loom::dlrm

int main(int argc, char** argv) {
  try {
    return loom::dlrm::run(argc, argv);
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "loom-dlrm: %s\n", e.what());
    return 1;
  }
}
