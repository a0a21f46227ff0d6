// GPT-2: token + learned position embeddings, pre-LayerNorm blocks, a final LayerNorm, and an
// output head tied to the token embedding (logits = x wte^T over the padded vocabulary).
// Parameter names are exactly Note [GPT parameter names] (core/nn/gpt_config.h).
//
// GPT-2 init (init_parameters): weights normal(0, 0.02); the residual projections
// (attn.proj.weight, mlp.proj.weight) normal(0, 0.02 / sqrt(2 * layers)); biases 0; LayerNorm
// weight 1, bias 0; wte rows past `vocab` (padding) 0.
//
// Activation checkpointing (per block) keeps only each block's input in forward and recomputes
// the block in backward; results and gradients are bit-identical to running without it (dropout
// masks are re-drawn from the same key, See Note [Dropout keys]; MoE blocks replay their routing,
// See Note [Checkpointed MoE blocks] in block_checkpointing.h).
#pragma once

#include <memory>
#include <vector>

#include "core/nn/block.h"
#include "core/nn/block_checkpointing.h"
#include "core/nn/embedding.h"
#include "core/nn/gpt_config.h"

namespace loom::nn {

struct GptOptions {
  double dropout = 0.0;     // embedding, attention-probability and residual dropout
  bool checkpoint = false;  // activation checkpointing of every block
  MoeOptions moe;           // experts > 0: block i's MLP is a MoE when i % moe.every == 0
  MoeFactory make_moe;      // builds those MoE layers (empty: nn::MoE, on this process)
};

class GPT : public Module {
 public:
  explicit GPT(const GptConfig& config, const GptOptions& options = {});

  // idx: token ids [B, T] (i32/i64), T <= max_seq_len, ids in [0, vocab) -> logits [B, T, Vp]
  // (Vp = padded_vocab; the padding columns are not classes).
  Tensor forward(const Tensor& idx) override;
  // Mean next-token cross-entropy of forward(idx) against targets [B, T] over the first `vocab`
  // columns; targets equal to -100 are ignored. A scalar. With MoE blocks, plus their auxiliary
  // losses (core/nn/moe.h); lm_loss() of the same call is the cross-entropy alone.
  Tensor loss(const Tensor& idx, const Tensor& targets);
  double last_lm_loss() const { return last_lm_loss_; }
  // The MoE blocks (in block order; empty for a dense model), for their stats() and aux_loss().
  std::vector<const MoeLayer*> moe_layers() const;
  // The MoE blocks' auxiliary losses of the last forward, summed (a scalar; 0 for a dense model):
  // what loss() adds to the cross-entropy. Use it rather than the layers' aux_loss() to weigh
  // them: a checkpointed block's gradient reaches its router only through this one (See Note
  // [Checkpointed MoE blocks] in block_checkpointing.h).
  Tensor aux_loss() const;
  // Logits [B, T, Vp] of idx [B, T] as positions cache.length() .. + T - 1 of sequences whose
  // earlier positions are in `cache` (made with make_kv_cache), which it then extends by T. On an
  // empty cache it computes forward(idx); afterwards each position attends to the cached ones,
  // as forward on the whole sequence would (up to rounding). For inference: use it under
  // NoGradGuard (See generate.h).
  Tensor forward_cached(const Tensor& idx, KvCache& cache);
  KvCache make_kv_cache() const { return KvCache(config_.layers, config_.max_seq_len); }

  const GptConfig& config() const { return config_; }
  const GptOptions& options() const { return options_; }
  void set_checkpointing(bool on) { options_.checkpoint = on; }
  Block& block(size_t i) const { return *blocks_.at(i); }

  std::shared_ptr<Embedding> wte;  // weight [padded_vocab, C], tied to the output head
  std::shared_ptr<Embedding> wpe;  // weight [max_seq_len, C]
  std::shared_ptr<Dropout> drop;   // on the summed embeddings
  std::shared_ptr<ModuleList> blocks;
  std::shared_ptr<LayerNorm> ln_f;

 private:
  void check_tokens(const Tensor& idx) const;

  GptConfig config_;
  GptOptions options_;
  double last_lm_loss_ = 0;
  BlockCheckpointing checkpointing_;            // of the last forward's blocks
  std::vector<std::shared_ptr<Block>> blocks_;  // the same modules as `blocks`, typed
};

}  // namespace loom::nn
