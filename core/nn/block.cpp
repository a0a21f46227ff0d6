#include "core/nn/block.h"

#include "core/ops.h"

namespace loom::nn {

Block::Block(int64_t channels, int64_t heads, double dropout, double proj_std,
             const MoeOptions& moe_options, const MoeFactory& make_moe) {
  ln1 = register_module("ln1", std::make_shared<LayerNorm>(channels));
  attn = register_module("attn",
                         std::make_shared<CausalSelfAttention>(channels, heads, dropout, proj_std));
  ln2 = register_module("ln2", std::make_shared<LayerNorm>(channels));
  if (moe_options.enabled())
    moe = register_module<MoeLayer>(
        "mlp", make_moe ? make_moe(channels, moe_options, dropout, proj_std)
                        : std::make_shared<MoE>(channels, moe_options, dropout, proj_std));
  else
    mlp = register_module("mlp", std::make_shared<MLP>(channels, dropout, proj_std));
}

Tensor Block::feed_forward(const Tensor& x) { return moe ? (*moe)(x) : (*mlp)(x); }

Tensor Block::forward(const Tensor& x) {
  Tensor h = add(x, (*attn)((*ln1)(x)));
  return add(h, feed_forward((*ln2)(h)));
}

Tensor Block::forward_cached(const Tensor& x, KvCache::Layer& kv, int64_t past) {
  Tensor h = add(x, attn->forward_cached((*ln1)(x), kv, past));
  return add(h, feed_forward((*ln2)(h)));
}

}  // namespace loom::nn
