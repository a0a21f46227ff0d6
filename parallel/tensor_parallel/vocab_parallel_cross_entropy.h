// Vocab-parallel cross-entropy (Megatron-LM's scheme): the loss of logits whose vocabulary
// columns are split over the ranks of a tensor-parallel group, computed without gathering the
// full logits. Per row, three allreduces of N elements replace the gather of N * V: the row max
// (for stability), the sum of exponentials and the target's logit. The backward is local.
#pragma once

#include <cstdint>
#include <memory>

#include "collectives/communicator.h"
#include "core/tensor.h"

namespace loom::parallel {

// logits [N, V_local] (f32, bf16 or f16): this rank's columns [vocab_start, vocab_start +
// V_local) of the full logits [N, V_local * tp.size()], vocab_start = tp->rank() * V_local.
// Only full columns < `vocab` are classes; the rest (a vocabulary padded to a multiple of tp, or
// beyond) take no probability and get zero gradient. targets [N] i32/i64: full-vocabulary ids in
// [0, vocab), or ignore_index (such rows add nothing and count for nothing).
//
// Returns the mean over non-ignored rows of -log softmax(full row)[target], a scalar (shape [])
// in f32 whatever the logits' dtype, the same on every rank of `tp`: exactly what core's
// cross_entropy(full_logits, targets, {ignore_index, vocab}) returns, up to summation order. All
// rows ignored: 0, with zero gradients. Backward (no communication): d logits = (softmax -
// onehot(target)) * g / count on this rank's columns, in the logits' dtype.
//
// Collective over `tp`: every rank must call it with the same N, V_local, vocab, ignore_index and
// targets. Each call makes exactly 3 allreduces on `tp` (max, then sum and target logit). A rank
// whose V_local, vocab, ignore_index or targets differ from the others' gets the same loom::Error
// as every other rank (they are checked inside the first allreduce, at no extra collective); a
// different N makes the allreduces themselves differ, which the collective checks report.
Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets,
                                    std::shared_ptr<comm::Communicator> tp, int64_t vocab,
                                    int64_t ignore_index = -100);

}  // namespace loom::parallel
