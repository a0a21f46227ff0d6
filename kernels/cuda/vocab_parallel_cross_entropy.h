// The per-rank stages of vocab-parallel cross-entropy on CUDA: the twins of
// kernels/cpu/vocab_parallel_cross_entropy.h (same shape struct, same stages in the same order,
// with the caller's allreduces in between; this file knows no communicator), on device memory
// with a trailing stream.
//
// Where this differs from the CPU interface, so that the host never waits for the GPU:
// - The loss stage writes (=) the loss sum and the counted-row count to device slots instead of
//   returning them (cross_entropy_mean in kernels/cuda/cross_entropy.h gives the mean).
// - The backward's scale is a device scalar (cross_entropy_grad_scale).
// - Logits (and dlogits) are f32 or bf16 (T = float or BFloat16; f32 arithmetic inside, dlogits
//   rounded once); targets int32 or int64 (I). Functions with a T or I are templates instantiated
//   for those types. The row statistics stay f32 / f64 as on the CPU, since the allreduces
//   between the stages exchange them.
//
// The loss stage sums the rows in a fixed tree in double (bit-identical from run to run); every
// other stage is per row or per element.
#pragma once

#include <cstdint>

#include "kernels/cpu/vocab_parallel_cross_entropy.h"
#include "kernels/cuda/stream.h"
#include "kernels/numeric.h"

namespace loom::kernels::cuda {

using VocabParallelCrossEntropyShape = cpu::VocabParallelCrossEntropyShape;

// Writes local_max[rows], each row's max over this rank's class columns, and local_sum_exp[rows],
// the sum of exp(x - local_max) over them in double; -inf and 0 for ignored rows and where this
// rank holds no classes. One pass over the logits.
template <typename T, typename I>
void vocab_parallel_cross_entropy_local_stats(const T* logits, const I* targets, float* local_max,
                                              double* local_sum_exp,
                                              const VocabParallelCrossEntropyShape& shape,
                                              Stream stream);

// Writes target_logit[rows]: the target's logit where this rank holds it, else 0.
template <typename T, typename I>
void vocab_parallel_cross_entropy_target_logit(const T* logits, const I* targets,
                                               float* target_logit,
                                               const VocabParallelCrossEntropyShape& shape,
                                               Stream stream);

// Given row_max[rows], the max over all ranks of local_max: writes sum_exp[rows] = local_sum_exp *
// exp(local_max - row_max) (0 where local_sum_exp is 0).
void vocab_parallel_cross_entropy_rescale_sum_exp(const float* local_max,
                                                  const double* local_sum_exp, const float* row_max,
                                                  float* sum_exp, int64_t rows, Stream stream);

// Given the global row_max, sum_exp and target_logit: writes lse[rows] = row_max + log(sum_exp)
// (0 for ignored rows), *loss_sum (=) the sum over counted rows of lse - target_logit formed in
// double, and *count (=) the number of counted rows. loss_sum and count are device slots; with no
// rows they get 0 (no kernel launches).
template <typename I>
void vocab_parallel_cross_entropy_loss(const I* targets, const float* row_max, const float* sum_exp,
                                       const float* target_logit, float* lse,
                                       const VocabParallelCrossEntropyShape& shape,
                                       double* loss_sum, int64_t* count, Stream stream);

// Writes (=) dlogits [rows, cols] = (softmax - onehot(target)) * *scale on the class columns of
// counted rows, zero elsewhere, with softmax = exp(x - lse). scale is a device scalar (the loss
// gradient over the counted-row count). Needs no communication.
template <typename T, typename I>
void vocab_parallel_cross_entropy_backward(const T* logits, const I* targets, const float* lse,
                                           const float* scale, T* dlogits,
                                           const VocabParallelCrossEntropyShape& shape,
                                           Stream stream);

}  // namespace loom::kernels::cuda
