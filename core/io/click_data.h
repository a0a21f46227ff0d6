// Synthetic click logs, loom-dlrm's built-in data (and loom.data's): a learnable signal whose
// best possible accuracy and AUC are known, so a run can report "AUC X against a ceiling of Y"
// instead of a number with nothing to compare it to. Nothing to download.
//
// Note [Hidden click model]
// Every example is a pure function of (seed, split, example index), drawn with Philox
// (kernels/cpu/philox.h), so any range of examples -- a data-parallel rank's share of a batch --
// is generated alone and equals the same slice of the whole batch. An example has
//   dense   num_dense values, each N(0, 1);
//   bags    for each table t, a bag of 1..max_bag_size rows (length uniform, rows uniform in
//           [0, rows_t), repeats allowed);
//   label   Bernoulli(p), p = sigmoid(score), with the hidden score
//     score = bias + <w, dense> + sum_t sum_{r in bag t} a_t[r]
//                  + sum_{t < s} < sum_{r in bag t} u_t[r], sum_{r in bag s} u_s[r] >.
// w, the per-row scalars a_t[r] and the per-row latent vectors u_t[r] (latent_dim entries) are
// normal, fixed by the seed alone (not the split) and computed on the fly, never stored, so the
// tables may be large. Their scales make the three terms' variances dense_variance,
// categorical_variance and interaction_variance (for bags of the mean length). The score is a sum
// pooling of per-row values plus pairwise dot products of pooled per-table vectors: a DLRM with
// sum-pooled embeddings and a dot interaction can represent it.
//
// Because p is known for every example, the Bayes-optimal classifier (predict 1 iff p > 1/2) and
// its scores are known: its accuracy is the mean of max(p, 1 - p) and its AUC that of ranking by
// p. Both are estimated on a sample of held-out examples (ceiling()).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace loom::io {

struct ClickDataConfig {
  uint64_t seed = 1234;
  int64_t num_dense = 13;  // dense features per example (Criteo has 13)
  // Rows of each categorical table; the number of entries is the number of tables T.
  std::vector<int64_t> table_rows = {1000, 1000, 500, 500, 200, 200, 50, 50};
  int64_t batch_size = 128;
  int64_t max_bag_size = 3;  // L: bag lengths uniform in [1, L]; 1 is one-hot
  // The hidden score (See Note [Hidden click model]).
  double bias = 0.0;  // shifts the click rate: 0 gives about 1/2
  double dense_variance = 2.0;
  double categorical_variance = 3.0;
  double interaction_variance = 1.0;  // 0 for no pairwise term
  int64_t latent_dim = 4;             // entries of each hidden row vector u_t[r]
};

// Which examples: training and held-out examples are drawn from different Philox streams, so the
// two never share an example; the hidden model is the same for both.
enum class ClickSplit { kTrain, kEval };

// One batch of B examples, T tables. Everything on the CPU.
struct ClickBatch {
  Tensor dense;    // [B, num_dense] f32
  Tensor indices;  // [N] i64, N the batch's lookups; rows of table t lie in [0, table_rows[t])
  // [T*B + 1] i64, feature-major CSR: the bag of example b in table t is
  // indices[offsets[t*B + b] : offsets[t*B + b + 1]]; offsets[0] = 0, offsets[T*B] = N.
  Tensor offsets;
  Tensor labels;         // [B] f32, 0 or 1
  Tensor probabilities;  // [B] f32, the hidden p = sigmoid(score) of each example (not an input)

  int64_t batch_size() const { return labels.numel(); }
};

// The best any model can do on this data, estimated on `num_examples` held-out examples.
struct ClickCeiling {
  double accuracy = 0.0;       // Bayes accuracy: mean of max(p, 1 - p)
  double auc = 0.0;            // Bayes AUC: bayes_auc() of the sample's p
  double positive_rate = 0.0;  // mean of p: the expected click rate
  int64_t num_examples = 0;
};

class ClickDataset {
 public:
  // Checks the configuration (positive sizes, non-negative variances), naming the bad field.
  explicit ClickDataset(ClickDataConfig config);

  const ClickDataConfig& config() const { return config_; }
  int64_t num_tables() const { return int64_t(config_.table_rows.size()); }

  // Batch `index` of a split: examples [index * batch_size, (index + 1) * batch_size).
  ClickBatch batch(ClickSplit split, int64_t index) const;
  // Examples [first, first + count) of a split as one batch of `count` (a rank's share).
  ClickBatch examples(ClickSplit split, int64_t first, int64_t count) const;
  // Bayes accuracy and AUC on held-out examples [0, num_examples) of kEval.
  ClickCeiling ceiling(int64_t num_examples = int64_t(1) << 18) const;

 private:
  struct Example;
  Example draw(ClickSplit split, int64_t index) const;
  float row_value(int64_t table, int64_t row) const;                  // a_t[r]
  void add_row_latent(int64_t table, int64_t row, float* acc) const;  // acc += u_t[r]

  ClickDataConfig config_;
  std::vector<float> dense_weight_;                       // w, [num_dense]
  float row_value_std_ = 0.0f;                            // std of a_t[r]
  float row_latent_std_ = 0.0f;                           // std of each entry of u_t[r]
  std::vector<uint64_t> value_streams_, latent_streams_;  // Philox streams per table
};

// Exact ROC AUC of `scores` against labels in {0, 1}: the probability that a random positive
// scores above a random negative, ties counting one half (by ranking with average ranks).
// Needs at least one positive and one negative.
double auc(const std::vector<float>& scores, const std::vector<float>& labels);
// The same for tensors of equal numel (e.g. logits [B, 1] against labels [B]), f32, on the CPU.
double auc(const Tensor& scores, const Tensor& labels);

// The Bayes-optimal figures for examples whose click probabilities are p: the mean of
// max(p, 1 - p), and the AUC of the scorer p on the population these examples stand for, where
// each example is a positive with weight p and a negative with weight 1 - p (pairs with equal p
// count one half). Computed from the p's alone, so the estimate has no label noise; auc() of the
// same p's against drawn labels scatters around it.
double bayes_accuracy(const std::vector<float>& p);
double bayes_auc(const std::vector<float>& p);

}  // namespace loom::io
