#include "core/nn/block_checkpointing.h"

#include "core/autograd.h"
#include "core/nn/dropout.h"
#include "core/ops.h"

namespace loom::nn {

void BlockCheckpointing::begin(size_t blocks) {
  moe_.assign(blocks, nullptr);
  aux_.assign(blocks, Tensor());
}

Tensor BlockCheckpointing::run(size_t i, const std::shared_ptr<Module>& block, MoeLayer* moe,
                               const Tensor& x, bool checkpoint) {
  LOOM_CHECK(i < aux_.size(), "BlockCheckpointing: block ", i, " of a forward begun with ",
             aux_.size(), " blocks");
  moe_[i] = moe;
  if (!checkpoint || !autograd::grad_enabled()) return (*block)(x);
  // The recomputation runs in backward, possibly after the training loop (or a pipeline's later
  // micro-batches) moved the dropout step on: pin the step and batch part this forward used.
  const uint64_t step = dropout_step();
  const DropoutBatchPart rows = dropout_batch_part();
  if (!moe) {
    return autograd::checkpoint(
        [block, step, rows](const std::vector<Tensor>& in) {
          DropoutStepGuard guard(step, rows);
          return (*block)(in[0]);
        },
        {x});
  }
  // See Note [Checkpointed MoE blocks].
  const Shape shape = x.shape();
  const DType dtype = x.dtype();
  const int64_t n = x.numel();
  auto part = std::make_shared<MoeBatchSplit::Part>();  // the forward's, for the recomputation
  Tensor packed = autograd::checkpoint(
      [block, moe, step, rows, part](const std::vector<Tensor>& in) {
        DropoutStepGuard guard(step, rows);
        const bool again = autograd::recomputing();
        if (again) moe->replay_part(*part);
        Tensor y = (*block)(in[0]);
        if (!again) *part = moe->forward_part();
        return cat({reshape(y.to(DType::kF32), {y.numel()}),
                    reshape(moe->aux_loss().to(DType::kF32), {1})},
                   0);
      },
      {x});
  aux_[i] = reshape(narrow(packed, 0, n, 1), Shape{});
  return reshape(narrow(packed, 0, 0, n), shape).to(dtype);
}

std::vector<Tensor> BlockCheckpointing::aux_terms() const {
  std::vector<Tensor> terms;
  for (size_t i = 0; i < moe_.size(); ++i)
    if (moe_[i]) terms.push_back(aux_[i].defined() ? aux_[i] : moe_[i]->aux_loss());
  return terms;
}

}  // namespace loom::nn
