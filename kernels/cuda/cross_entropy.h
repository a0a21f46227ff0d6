// Fused softmax + cross-entropy on CUDA: the twin of kernels/cpu/cross_entropy.h (same shape
// struct, same semantics: padded columns [num_classes, cols) get no probability and zero gradient,
// rows whose target is ignore_index count for nothing), on device memory with a trailing stream.
// Like the CPU kernels, nothing of size [rows, cols] is stored beyond the logits: the forward
// keeps one log-sum-exp per row and the backward recomputes softmax from it.
//
// Where this differs from the CPU interface, so that the host never waits for the GPU:
// - The forward writes (=) the loss sum and the counted-row count to device slots instead of
//   returning them; cross_entropy_mean turns them into the mean loss on the device.
// - The backward's scale is a device scalar (cross_entropy_grad_scale computes it).
// - Logits (and dlogits) are f32 or bf16 (T = float or BFloat16; f32 arithmetic inside, dlogits
//   rounded once); targets int32 or int64 (I). The forward and backward are templates
//   instantiated for those four pairs; lse stays f32.
//
// Rows are summed in a fixed tree in double, so the loss is bit-identical from run to run. It is
// formed from the stored f32 lse, where the CPU uses the double before rounding: the two differ
// by at most half an f32 ulp of lse per row.
#pragma once

#include <cstdint>

#include "kernels/cpu/cross_entropy.h"
#include "kernels/cuda/stream.h"
#include "kernels/numeric.h"

namespace loom::kernels::cuda {

using CrossEntropyShape = cpu::CrossEntropyShape;

// Writes lse[rows] (0 for ignored rows), *loss_sum (=) the sum over counted rows of
// lse - logit[target] in double, and *count (=) the number of counted rows. loss_sum and count
// are device slots; with no rows they get 0 (no kernel launches).
template <typename T, typename I>
void cross_entropy_forward(const T* logits, const I* targets, float* lse,
                           const CrossEntropyShape& shape, double* loss_sum, int64_t* count,
                           Stream stream);

// Writes (=) dlogits [rows, cols] = (softmax - onehot(target)) * *scale on the class columns of
// counted rows, zero elsewhere, with softmax = exp(x - lse). scale is a device scalar: the loss
// gradient over the counted-row count (cross_entropy_grad_scale).
template <typename T, typename I>
void cross_entropy_backward(const T* logits, const I* targets, const float* lse, const float* scale,
                            T* dlogits, const CrossEntropyShape& shape, Stream stream);

// The CPU ops' formulas, in double, on device slots (one thread each); used by both losses:
// *loss = count > 0 ? float(*loss_sum / *count) : 0 (all rows ignored: 0, not NaN).
void cross_entropy_mean(const double* loss_sum, const int64_t* count, float* loss, Stream stream);
// *scale = count > 0 ? float(double(*grad_loss) / double(*count)) : 0.
void cross_entropy_grad_scale(const float* grad_loss, const int64_t* count, float* scale,
                              Stream stream);

}  // namespace loom::kernels::cuda
