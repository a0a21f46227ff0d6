// A pre-LayerNorm transformer block (GPT-2): x + attn(ln1(x)), then x + mlp(ln2(x)), mlp a
// dense MLP or a mixture of experts.
#pragma once

#include <memory>

#include "core/nn/attention.h"
#include "core/nn/layer_norm.h"
#include "core/nn/mlp.h"
#include "core/nn/moe.h"

namespace loom::nn {

class Block : public Module {
 public:
  // With `moe` enabled, the feed-forward is a mixture of experts (core/nn/moe.h), registered
  // as "mlp" too.
  // `make_moe` builds it (empty: a MoE on this process).
  Block(int64_t channels, int64_t heads, double dropout = 0.0, double proj_std = 0.02,
        const MoeOptions& moe = {}, const MoeFactory& make_moe = {});
  Tensor forward(const Tensor& x) override;  // [B, T, C] -> [B, T, C]
  // forward with attention over cached keys and values (CausalSelfAttention::forward_cached).
  Tensor forward_cached(const Tensor& x, KvCache::Layer& kv, int64_t past);

  std::shared_ptr<LayerNorm> ln1;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<LayerNorm> ln2;
  std::shared_ptr<MLP> mlp;       // null when the block holds a MoE
  std::shared_ptr<MoeLayer> moe;  // null when the block holds a dense MLP

 private:
  Tensor feed_forward(const Tensor& x);
};

}  // namespace loom::nn
