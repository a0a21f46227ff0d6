// Activation checkpointing of a model's blocks, for every model made of them (nn::GPT, the
// tensor-parallel parallel::TpGPT, a pipeline's parallel::pipeline::GptStage): each block keeps
// only its input in forward and runs again in backward; outputs and gradients are those without
// checkpointing, bit for bit.
//
// Note [Checkpointed MoE blocks]
// A checkpointed block runs its forward without recording and again in backward. For a MoE block
// two things differ from a dense one. Its auxiliary losses join the loss outside the block, and
// their gradient must reach the router through the recomputation: so the checkpointed function
// returns the block's output and the layer's auxiliary loss packed into one f32 vector (exact for
// f32, bf16 and f16 outputs), whose two parts the loss and the next block use; the packed
// gradient carries both into the recomputation's backward. And the layer's forward counts and
// decides once per forward (its place in a split batch, Note [A batch in micro-batches]; the
// statistics the trainer reports): the recomputation replays the part its own forward had
// (MoeLayer::replay_part, kept by the checkpointed function, since a pipeline forwards other
// micro-batches through the layer before this one's backward) and keeps the statistics, so it
// routes, drops and exchanges (with expert parallelism, every rank of the ep group recomputes the
// same blocks in the same order) exactly as the forward did.
#pragma once

#include <memory>
#include <vector>

#include "core/nn/module.h"
#include "core/nn/moe.h"

namespace loom::nn {

class BlockCheckpointing {
 public:
  // Starts a forward through `blocks` blocks.
  void begin(size_t blocks);
  // Block i of the forward on x: block(x), checkpointed when `checkpoint` and grad mode are on.
  // `moe`: the block's MoE layer (null for a dense block). The dropout step and batch part of
  // this call are pinned for the recomputation (See Note [Dropout keys]).
  Tensor run(size_t i, const std::shared_ptr<Module>& block, MoeLayer* moe, const Tensor& x,
             bool checkpoint);
  // The MoE blocks' auxiliary losses of this forward, in block order, as the loss must add them:
  // the one a checkpointed block's function returned, else the layer's own (See Note
  // [Checkpointed MoE blocks]).
  std::vector<Tensor> aux_terms() const;

 private:
  std::vector<MoeLayer*> moe_;  // per block of the forward: its MoE layer, or null
  // Per block, the auxiliary loss a checkpointed MoE block's forward returned beside its output
  // (undefined for the others).
  std::vector<Tensor> aux_;
};

}  // namespace loom::nn
