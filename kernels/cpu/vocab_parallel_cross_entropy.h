// The per-rank steps of vocab-parallel cross-entropy (Megatron-LM's scheme) over logits whose
// vocabulary columns are split across ranks: this rank holds columns [start, start + cols) of the
// full logits [rows, cols * ranks], f32, with integer targets [rows] of full-vocabulary ids. Only
// the first local_classes columns here are classes (the rest are a padded vocabulary's filler:
// no probability, zero gradient). Rows whose target is ignore_index count for nothing. Targets
// must already be checked to lie in [0, vocab) or equal ignore_index.
//
// The kernels know no communicator: the caller runs them in this order, with allreduces over the
// ranks in between (on one rank the allreduces are no-ops):
//
//   local_stats, target_logit   -> allreduce(max) of local_max into row_max
//                                  allreduce(sum) of target_logit
//   rescale_sum_exp             -> allreduce(sum) of sum_exp
//   loss                        (the same on every rank)
//   backward                    (local, no communication)
//
// The forward reads the logits once: each rank sums exp(x - its own row max) in the same pass
// that finds that max, and rescales the sum to the global max once that is known.
#pragma once

#include <cstdint>

namespace loom::kernels::cpu {

struct VocabParallelCrossEntropyShape {
  int64_t rows = 0;
  int64_t cols = 0;           // V_local: this rank's columns of each row
  int64_t start = 0;          // the full-vocabulary id of local column 0
  int64_t local_classes = 0;  // <= cols; local columns [0, local_classes) are classes
  int64_t ignore_index = -100;
};

// Writes local_max[rows], each row's max over this rank's class columns, and local_sum_exp[rows],
// the sum of exp(x - local_max) over them in double; -inf and 0 for ignored rows and where this
// rank holds no classes.
void vocab_parallel_cross_entropy_local_stats(const float* logits, const int32_t* targets,
                                              float* local_max, double* local_sum_exp,
                                              const VocabParallelCrossEntropyShape& shape);
void vocab_parallel_cross_entropy_local_stats(const float* logits, const int64_t* targets,
                                              float* local_max, double* local_sum_exp,
                                              const VocabParallelCrossEntropyShape& shape);

// Writes target_logit[rows]: the target's logit where this rank holds it, else 0 (so the sum
// over ranks is exact).
void vocab_parallel_cross_entropy_target_logit(const float* logits, const int32_t* targets,
                                               float* target_logit,
                                               const VocabParallelCrossEntropyShape& shape);
void vocab_parallel_cross_entropy_target_logit(const float* logits, const int64_t* targets,
                                               float* target_logit,
                                               const VocabParallelCrossEntropyShape& shape);

// Given row_max[rows], the max over all ranks of local_max: writes sum_exp[rows] = local_sum_exp *
// exp(local_max - row_max), this rank's part of the row's sum of exp(x - row_max) (0 where
// local_sum_exp is 0). With one rank the factor is exactly 1.
void vocab_parallel_cross_entropy_rescale_sum_exp(const float* local_max,
                                                  const double* local_sum_exp, const float* row_max,
                                                  float* sum_exp, int64_t rows);

// Given the global row_max, sum_exp and target_logit: writes lse[rows] = row_max + log(sum_exp)
// (0 for ignored rows) and returns the sum over counted rows of lse - target_logit, formed in
// double and added in row order; *count gets the number of counted rows.
double vocab_parallel_cross_entropy_loss(const int32_t* targets, const float* row_max,
                                         const float* sum_exp, const float* target_logit,
                                         float* lse, const VocabParallelCrossEntropyShape& shape,
                                         int64_t* count);
double vocab_parallel_cross_entropy_loss(const int64_t* targets, const float* row_max,
                                         const float* sum_exp, const float* target_logit,
                                         float* lse, const VocabParallelCrossEntropyShape& shape,
                                         int64_t* count);

// Writes (=) dlogits [rows, cols] = (softmax - onehot(target)) * scale on the class columns of
// counted rows, zero elsewhere, with softmax = exp(x - lse). scale is the loss gradient over the
// counted-row count. Needs no communication.
void vocab_parallel_cross_entropy_backward(const float* logits, const int32_t* targets,
                                           const float* lse, float scale, float* dlogits,
                                           const VocabParallelCrossEntropyShape& shape);
void vocab_parallel_cross_entropy_backward(const float* logits, const int64_t* targets,
                                           const float* lse, float scale, float* dlogits,
                                           const VocabParallelCrossEntropyShape& shape);

}  // namespace loom::kernels::cpu
