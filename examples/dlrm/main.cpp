// loom-dlrm: trains DLRM on the built-in synthetic click data (examples/dlrm/click_data.h), whose
// Bayes-optimal accuracy and AUC are known, and reports how close the model gets to them.
//
//   ./build/bin/loom-dlrm                      # one process
//
// The embedding tables are one nn::EmbeddingBagCollection (table-batched lookups); the bottom
// MLP, dot interaction and top MLP are DlrmDense. AdamW trains both.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "common/flags.h"
#include "common/progress.h"
#include "core/embedding_bag.h"
#include "core/error.h"
#include "core/nn/embedding_bag_collection.h"
#include "core/ops.h"
#include "dlrm/click_data.h"
#include "dlrm/dlrm_model.h"
#include "optimizer/adamw.h"

namespace loom::dlrm {
namespace {

struct Evaluation {
  double loss = 0, accuracy = 0, auc = 0;
};

Evaluation evaluate(nn::EmbeddingBagCollection& ebc, DlrmDense& model, const ClickDataset& data,
                    int64_t batches) {
  NoGradGuard no_grad;
  std::vector<float> scores, labels;
  double loss = 0;
  int64_t correct = 0;
  for (int64_t i = 0; i < batches; ++i) {
    ClickBatch b = data.batch(ClickSplit::kEval, i);
    Tensor logits = model.logits(b.dense, ebc.lookup(b.indices, b.offsets));
    loss += binary_cross_entropy_with_logits(logits, b.labels).item();
    const std::vector<float> l = logits.to_vector<float>(), y = b.labels.to_vector<float>();
    for (size_t k = 0; k < l.size(); ++k) correct += (l[k] > 0) == (y[k] > 0.5f);
    scores.insert(scores.end(), l.begin(), l.end());
    labels.insert(labels.end(), y.begin(), y.end());
  }
  return {loss / double(batches), double(correct) / double(scores.size()), auc(scores, labels)};
}

int run(int argc, char** argv) {
  cli::Flags flags("loom-dlrm",
                   "Trains DLRM on synthetic click data with a known accuracy/AUC ceiling.");
  flags.add_int("steps", 400, "training steps");
  flags.add_int("batch", 256, "examples per step");
  flags.add_int("dim", 16, "embedding dim (a multiple of 4)");
  flags.add_int("max-bag", 3, "bag lengths are uniform in [1, max-bag]");
  flags.add_double("lr", 3e-3, "AdamW learning rate (MLPs and tables)");
  flags.add_int("seed", 1234, "data and initialisation seed");
  flags.add_int("eval-every", 100, "evaluate every N steps (0: only at the end)");
  flags.add_int("eval-batches", 16, "held-out batches per evaluation");
  flags.add_string("metrics-file", "", "append one JSON object per step and evaluation");
  if (!flags.parse(argc, argv)) return 0;

  ClickDataConfig data_config;
  data_config.seed = uint64_t(flags.get_int("seed"));
  data_config.batch_size = flags.get_int("batch");
  data_config.max_bag_size = flags.get_int("max-bag");
  ClickDataset data(data_config);
  const ClickCeiling ceiling = data.ceiling();
  std::printf(
      "data: %lld tables (%lld..%lld rows), %lld dense features; ceiling (Bayes): "
      "accuracy %.4f, AUC %.4f, click rate %.3f\n",
      static_cast<long long>(data.num_tables()),
      static_cast<long long>(
          *std::min_element(data_config.table_rows.begin(), data_config.table_rows.end())),
      static_cast<long long>(
          *std::max_element(data_config.table_rows.begin(), data_config.table_rows.end())),
      static_cast<long long>(data_config.num_dense), ceiling.accuracy, ceiling.auc,
      ceiling.positive_rate);

  DlrmConfig config;
  config.num_dense = data_config.num_dense;
  config.num_tables = data.num_tables();
  config.dim = flags.get_int("dim");
  std::vector<nn::EmbeddingTableConfig> tables;
  for (int64_t t = 0; t < data.num_tables(); ++t)
    tables.push_back({"t" + std::to_string(t), data_config.table_rows[size_t(t)], config.dim});
  nn::EmbeddingBagCollection ebc(tables);
  DlrmDense model(config);
  ebc.init_parameters(uint64_t(flags.get_int("seed")));
  model.init_parameters(uint64_t(flags.get_int("seed")));
  std::vector<Tensor> params = ebc.parameters();
  for (const Tensor& p : model.parameters()) params.push_back(p);
  optim::AdamWOptions adamw;
  adamw.lr = flags.get_double("lr");
  adamw.weight_decay = 0.0;
  optim::AdamW opt(params, adamw);

  const int64_t steps = flags.get_int("steps"), eval_every = flags.get_int("eval-every");
  cli::Progress progress(steps, flags.get_string("metrics-file"));
  const auto start = std::chrono::steady_clock::now();
  auto report = [&](int64_t step) {
    const Evaluation e = evaluate(ebc, model, data, flags.get_int("eval-batches"));
    progress.event(step, "eval",
                   {{"val_loss", e.loss},
                    {"accuracy", e.accuracy},
                    {"auc", e.auc},
                    {"ceiling_accuracy", ceiling.accuracy},
                    {"ceiling_auc", ceiling.auc}});
  };
  for (int64_t step = 0; step < steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    ClickBatch b = data.batch(ClickSplit::kTrain, step);
    Tensor loss = binary_cross_entropy_with_logits(
        model.logits(b.dense, ebc.lookup(b.indices, b.offsets)), b.labels);
    opt.zero_grad();
    loss.backward();
    opt.step();
    const auto t1 = std::chrono::steady_clock::now();
    cli::StepMetrics m;
    m.step = step + 1;
    m.loss = loss.item();
    m.lr = adamw.lr;
    m.step_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    m.elapsed_s = std::chrono::duration<double>(t1 - start).count();
    m.tokens_per_s = double(b.batch_size()) / (m.step_ms / 1e3);  // examples/s
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
