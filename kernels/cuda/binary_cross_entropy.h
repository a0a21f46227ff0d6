// Binary cross-entropy on logits on device memory: the CUDA twin of
// kernels/cpu/binary_cross_entropy.h (the same elementwise loss
// l = max(x, 0) - x y + log1p(exp(-|x|)), in double, and the same gradient formulas in f32).
//
// Where this differs from the CPU interface, so that the host never waits for the GPU:
// - The forward writes (=) the loss sum to a device slot instead of returning it, and needs a
//   workspace for its per-block partial sums: ask binary_cross_entropy_workspace_bytes(n) and pass
//   at least that many bytes of device memory (8-byte aligned). binary_cross_entropy_mean turns
//   the sum into the mean loss on the device.
// - The backward's scale is a device scalar (binary_cross_entropy_grad_scale computes it).
//
// The sum is deterministic: each thread adds its elements (a grid-stride walk) in double, the
// block adds its threads in a fixed tree, and one block adds the blocks' partials in a fixed tree;
// the grid depends only on n. It adds in another order than the CPU's 4096-element chunks, so
// the two agree to double rounding (far below f32's), not bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/stream.h"

namespace loom::kernels::cuda {

// Bytes of workspace binary_cross_entropy_forward needs for n elements (0 when n is 0).
size_t binary_cross_entropy_workspace_bytes(int64_t n);

// *loss_sum (=) the sum over the n elements of l in double; loss_sum is a device slot. With n == 0
// it gets 0 (no kernel launches; the workspace may then be null).
void binary_cross_entropy_forward(const float* logits, const float* targets, int64_t n,
                                  double* loss_sum, void* workspace, size_t workspace_bytes,
                                  Stream stream);

// The CPU op's formulas, in double, on device slots (one thread each):
// *loss = n > 0 ? float(*loss_sum / n) : 0 (no elements: 0, not NaN).
void binary_cross_entropy_mean(const double* loss_sum, int64_t n, float* loss, Stream stream);
// *scale = n > 0 ? float(double(*grad_loss) / n) : 0.
void binary_cross_entropy_grad_scale(const float* grad_loss, int64_t n, float* scale,
                                     Stream stream);

// dlogits = *scale (sigmoid(x) - y); dtargets = -*scale x when dtargets is not null. scale is a
// device scalar: the loss gradient over the element count (binary_cross_entropy_grad_scale).
void binary_cross_entropy_backward(const float* logits, const float* targets, const float* scale,
                                   float* dlogits, float* dtargets, int64_t n, Stream stream);

}  // namespace loom::kernels::cuda
