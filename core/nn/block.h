// A pre-LayerNorm transformer block (GPT-2): x + attn(ln1(x)), then x + mlp(ln2(x)).
#pragma once

#include <memory>

#include "core/nn/attention.h"
#include "core/nn/layer_norm.h"
#include "core/nn/mlp.h"

namespace loom::nn {

class Block : public Module {
 public:
  Block(int64_t channels, int64_t heads, double dropout = 0.0, double proj_std = 0.02);
  Tensor forward(const Tensor& x) override;  // [B, T, C] -> [B, T, C]
  // forward with attention over cached keys and values (CausalSelfAttention::forward_cached).
  Tensor forward_cached(const Tensor& x, KvCache::Layer& kv, int64_t past);

  std::shared_ptr<LayerNorm> ln1;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<LayerNorm> ln2;
  std::shared_ptr<MLP> mlp;
};

}  // namespace loom::nn
