// Fused softmax + cross-entropy over logits [rows, cols] f32 with integer targets [rows].
// Only the first num_classes columns are classes (the rest are a padded vocabulary's filler:
// no probability, zero gradient). Rows whose target is ignore_index count for nothing.
// Targets must already be checked to lie in [0, num_classes) or equal ignore_index.
//
// Nothing of size [rows, cols] is stored between forward and backward beyond the logits: the
// forward keeps one log-sum-exp per row and the backward recomputes softmax from it.
#pragma once

#include <cstdint>

namespace loom::kernels::cpu {

struct CrossEntropyShape {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t num_classes = 0;  // <= cols
  int64_t ignore_index = -100;
};

// Writes lse[rows] (0 for ignored rows) and returns the sum over counted rows of
// lse - logit[target], accumulated in double; *count gets the number of counted rows.
double cross_entropy_forward(const float* logits, const int32_t* targets, float* lse,
                             const CrossEntropyShape& shape, int64_t* count);
double cross_entropy_forward(const float* logits, const int64_t* targets, float* lse,
                             const CrossEntropyShape& shape, int64_t* count);

// Writes (=) dlogits [rows, cols] = (softmax - onehot(target)) * scale on the class columns of
// counted rows, zero elsewhere. scale is the loss gradient over the counted-row count.
void cross_entropy_backward(const float* logits, const int32_t* targets, const float* lse,
                            float scale, float* dlogits, const CrossEntropyShape& shape);
void cross_entropy_backward(const float* logits, const int64_t* targets, const float* lse,
                            float scale, float* dlogits, const CrossEntropyShape& shape);

}  // namespace loom::kernels::cpu
