// Dropout as a module, keyed so that masks are reproducible. See Note [Dropout keys].
//
// Note [Dropout keys]
// loom::dropout draws element i's mask bit from Philox at (seed, stream, offset + i). The Dropout
// module uses
//   seed   = the process-wide dropout seed (set_dropout_seed; the same on every rank),
//   stream = hash of the module's full name (rng::stream_of("blocks.3.attn.attn_drop")),
//   offset = dropout_step() * 2^32,
// and keeps no per-call state of its own. The "dropout step" is a process-wide counter that the
// training loop sets (set_dropout_step) once per forward of a micro-batch: e.g.
// step * accumulation_steps + micro_batch. Consequences:
//  - An activation-checkpoint recomputation in the same step draws the same mask, so the
//    recomputed region equals the original. GPT's checkpointed blocks also capture the step at
//    forward time and restore it around the recomputation (DropoutStepGuard), so the masks stay
//    right even when a pipeline schedule runs other micro-batches' forwards before this one's
//    backward.
//  - Masks do not depend on the parallel layout: a tensor-parallel or pipeline run names its
//    modules as the single-process model does and draws the same bits.
//  - A module called twice in one step reuses its mask; modules that need two masks per step
//    hold two Dropout modules (distinct names, distinct streams).
//  - When one process's batch is split (over data-parallel ranks, into micro-batches), the
//    training loop also sets the "dropout batch part" (set_dropout_batch_part): this call's rows
//    are part k of K equal parts of the step's batch, and every element draws the bit of its
//    place in the whole batch. So a step split any way draws the single-process masks, and the
//    step stays the optimizer step (not the micro-batch).
// One call may use at most 2^32 elements, so consecutive steps never overlap.
#pragma once

#include <cstdint>

#include "core/nn/module.h"

namespace loom::nn {

void set_dropout_seed(uint64_t seed);
uint64_t dropout_seed();
void set_dropout_step(uint64_t step);
uint64_t dropout_step();

// The rows of the next calls are part `part` of `parts` equal parts of the step's batch
// (See Note [Dropout keys]); (0, 1) when the batch is whole.
struct DropoutBatchPart {
  int64_t part = 0;
  int64_t parts = 1;
};
void set_dropout_batch_part(DropoutBatchPart batch_part);
DropoutBatchPart dropout_batch_part();

// Sets the dropout step and batch part for its lifetime and restores the previous ones.
class DropoutStepGuard {
 public:
  explicit DropoutStepGuard(uint64_t step, DropoutBatchPart batch_part = {});
  ~DropoutStepGuard();
  DropoutStepGuard(const DropoutStepGuard&) = delete;
  DropoutStepGuard& operator=(const DropoutStepGuard&) = delete;

 private:
  uint64_t previous_;
  DropoutBatchPart previous_part_;
};

class Dropout : public Module {
 public:
  explicit Dropout(double p);
  // Identity in eval mode or when p == 0; otherwise the mask of Note [Dropout keys].
  Tensor forward(const Tensor& x) override;
  double p() const { return p_; }
  // The inputs are part `part` of `parts` equal parts along `dim` of what one process would drop
  // out (tensor or sequence parallelism): masks are drawn at the elements' places in the whole,
  // See DropoutKey.
  void set_part(int64_t dim, int64_t part, int64_t parts);

 private:
  double p_;
  int64_t part_dim_ = 0, part_ = 0, parts_ = 1;
};

}  // namespace loom::nn
