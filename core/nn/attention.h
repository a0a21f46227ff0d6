// Causal multi-head self-attention, GPT-2 style: one qkv projection (C -> 3C) split into q, k, v,
// heads [B, H, T, D] with D = C / H, causal scaled-dot-product attention, heads merged, output
// projection (C -> C), residual dropout.
//
// Attention-probability dropout cannot go through the fused scaled_dot_product_attention op (it
// has no dropout), so when it is active (training, p > 0) attention is composed from matmul,
// a causal -inf mask, softmax and dropout; otherwise the fused op runs. Both compute the same
// function up to rounding.
#pragma once

#include <memory>

#include "core/nn/dropout.h"
#include "core/nn/kv_cache.h"
#include "core/nn/linear.h"

namespace loom::nn {

// Causal attention of heads q, k, v [B, H, T, D] -> [B, H, T, D]: the fused op, or, while
// attn_drop is active (training, p > 0), composed with dropout on the probabilities. Shared by
// the single-process and the tensor-parallel attention, so both compute the same function.
Tensor attend(const Tensor& q, const Tensor& k, const Tensor& v, Dropout& attn_drop);

class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(int64_t channels, int64_t heads, double dropout = 0.0,
                      double proj_std = 0.02);
  Tensor forward(const Tensor& x) override;  // [B, T, C] -> [B, T, C]
  // x [B, T, C] holds positions past .. past + T - 1 of sequences whose earlier keys and values
  // are in `kv` (past of them): writes this call's keys and values there and attends over all
  // past + T positions, each query to the positions up to its own. With past = 0 it is forward's
  // computation; after that, attention is composed (matmul, an offset causal mask when T > 1,
  // softmax, matmul), the same function up to rounding.
  Tensor forward_cached(const Tensor& x, KvCache::Layer& kv, int64_t past);

  int64_t channels() const { return channels_; }
  int64_t heads() const { return heads_; }

  std::shared_ptr<Linear> qkv;          // weight [3C, C]: rows q, then k, then v
  std::shared_ptr<Linear> proj;         // weight [C, C]
  std::shared_ptr<Dropout> attn_drop;   // on the attention probabilities [B, H, T, T]
  std::shared_ptr<Dropout> resid_drop;  // on proj's output

 private:
  // forward (kv null) and forward_cached: one body, so both compute the same projections.
  Tensor attend_heads(const Tensor& x, KvCache::Layer* kv, int64_t past);

  int64_t channels_, heads_;
};

}  // namespace loom::nn
