// Binary cross-entropy on logits x with probability targets y in [0, 1], elementwise
//   l = max(x, 0) - x y + log1p(exp(-|x|))
// which equals -(y log sigmoid(x) + (1 - y) log(1 - sigmoid(x))) but never takes the log of a
// rounded probability, so it stays finite and exact-ish for |x| in the hundreds.
#pragma once

#include <cstdint>

namespace loom::kernels::cpu {

// Sum over the n elements of l, accumulated in double: chunks of a fixed size are summed alone and
// the chunk sums added in order, so the result does not depend on the thread count.
double binary_cross_entropy_forward(const float* logits, const float* targets, int64_t n);

// dlogits = scale (sigmoid(x) - y); dtargets = -scale x when dtargets is not null. scale is the
// loss gradient over the element count (the loss is a mean).
void binary_cross_entropy_backward(const float* logits, const float* targets, float scale,
                                   float* dlogits, float* dtargets, int64_t n);

}  // namespace loom::kernels::cpu
