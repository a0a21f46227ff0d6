// GPT-2 split over a tensor-parallel group (Megatron-LM's layout), with the single-process
// GPT's parameter names (Note [GPT parameter names]) and each parameter a ShardSpec of the
// single-process one:
//   attention  qkv column-parallel (rank r: heads [r H/tp, (r+1) H/tp) of q, k and v), attention
//              on those heads, proj row-parallel;
//   MLP        fc column-parallel, GELU, proj row-parallel;
//   wte        vocab-parallel (rows padded to a multiple of tp), tied to the output head, whose
//              logits stay split by vocabulary into the vocab-parallel cross-entropy;
//   wpe, LayerNorms  whole on every rank.
// Per block: one allreduce forward and one backward for attention, the same for the MLP.
//
// Sequence parallelism (option): the LayerNorm, dropout and residual regions hold [B, T/tp, C]
// (rank r: positions [r T/tp, (r+1) T/tp)); an all-gather along the sequence enters each
// column-parallel layer and a reduce-scatter leaves each row-parallel one, in place of the
// allreduces. The whole parameters used on a sequence slice (LayerNorm weights and biases, the
// row-parallel biases) get their gradient summed over tp by passing through copy_to_tp.
//
// Dropout masks are the single-process ones (Dropout::set_part), so with the same seed and step
// the tp run drops out exactly what one process would.
//
// Mixture of experts (TpGptOptions::moe): a MoE block's experts are whole on every tp rank (the
// feed-forward runs on the block's whole activations, the same on every tp rank, so each rank
// routes and computes alike: no communication over tp, and the gradients that reach the MoE's
// input are whole already). Expert parallelism splits them over dp ranks as without tp
// (make_moe). Under sequence parallelism the MoE takes the whole sequence too: gather_from_tp
// before it (its backward keeps this rank's slice of the gradient, which every rank computes
// alike) and scatter_to_tp after it (its backward all-gathers the slices' gradients), so the
// routing, capacity and auxiliary losses are those of the whole tokens, as without it (Megatron's
// gather with tensor_parallel_output_grad off).
//
// Activation checkpointing (TpGptOptions::checkpoint) keeps each block's input and recomputes the
// block in backward, its tp collectives included (every tp rank recomputes the same blocks in the
// same order), as nn::GPT does (See core/nn/block_checkpointing.h): the same results, bit for
// bit, as without it.
#pragma once

#include <memory>
#include <vector>

#include "core/nn/block_checkpointing.h"
#include "core/nn/dropout.h"
#include "core/nn/embedding.h"
#include "core/nn/gpt_config.h"
#include "core/nn/module.h"
#include "core/nn/moe.h"
#include "parallel/tensor_parallel/layers.h"

namespace loom::parallel {

struct TpGptOptions {
  double dropout = 0.0;
  bool sequence_parallel = false;  // T must then divide by tp
  nn::MoeOptions moe;              // experts > 0: block i's MLP is a MoE when i % moe.every == 0
  nn::MoeFactory make_moe;         // builds those MoE layers (empty: nn::MoE, experts whole)
  bool checkpoint = false;         // activation checkpointing of every block
};

// LayerNorm over the last dim with whole parameters; under sequence parallelism its gradients
// are summed over tp (See the header comment).
class TpLayerNorm : public nn::Module {
 public:
  TpLayerNorm(int64_t channels, GroupPtr tp, bool sequence_parallel);
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;

 private:
  GroupPtr tp_;
  bool sequence_parallel_;
};

class TpAttention : public nn::Module {
 public:
  TpAttention(int64_t channels, int64_t heads, GroupPtr tp, const TpGptOptions& options,
              double proj_std);
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<ColumnParallelLinear> qkv;
  std::shared_ptr<RowParallelLinear> proj;
  std::shared_ptr<nn::Dropout> attn_drop, resid_drop;

 private:
  int64_t channels_, heads_;
  GroupPtr tp_;
};

class TpMLP : public nn::Module {
 public:
  TpMLP(int64_t channels, GroupPtr tp, const TpGptOptions& options, double proj_std);
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<ColumnParallelLinear> fc;
  std::shared_ptr<RowParallelLinear> proj;
  std::shared_ptr<nn::Dropout> drop;
};

class TpBlock : public nn::Module {
 public:
  // `moe`: the feed-forward is options.moe's mixture of experts (See the header comment).
  TpBlock(int64_t channels, int64_t heads, GroupPtr tp, const TpGptOptions& options,
          double proj_std, bool moe = false);
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<TpLayerNorm> ln1, ln2;
  std::shared_ptr<TpAttention> attn;
  std::shared_ptr<TpMLP> mlp;         // null in a MoE block
  std::shared_ptr<nn::MoeLayer> moe;  // null in a dense block

 private:
  GroupPtr tp_;
  bool sequence_parallel_;
};

class TpGPT : public nn::Module {
 public:
  // Collective-free; every rank of `tp` builds it with the same arguments. Throws when heads,
  // channels or 4 * channels do not divide by tp.
  TpGPT(const GptConfig& config, GroupPtr tp, const TpGptOptions& options = {});

  // idx [B, T] -> this rank's vocabulary columns of the logits, [B, T, wte_rows / tp].
  Tensor forward(const Tensor& idx) override;
  // The whole logits [B, T, padded_vocab] on every tp rank (the columns gathered, tp's padding
  // rows dropped): what the single-process GPT returns, for evaluation. Collective over tp. With
  // sequence parallelism a T that tp does not divide (an evaluation row shorter than training's)
  // is padded on the right and cut back: the model is causal, so padding after the last token
  // leaves every real position's logits as they are.
  Tensor full_logits(const Tensor& idx);
  // The single-process GPT::loss: mean cross-entropy over the first `vocab` columns, without
  // gathering the logits, plus the MoE blocks' auxiliary losses. The same scalar on every tp
  // rank.
  Tensor loss(const Tensor& idx, const Tensor& targets);
  // The cross-entropy of the last loss() alone (its MoE losses excluded), as GPT::last_lm_loss.
  double last_lm_loss() const { return last_lm_loss_; }
  std::vector<const nn::MoeLayer*> moe_layers() const;
  // The MoE blocks' auxiliary losses of the last forward, summed (a scalar; 0 for a dense model),
  // as GPT::aux_loss: what loss() adds, and what a trainer weighing them must use.
  Tensor aux_loss() const;

  const GptConfig& config() const { return config_; }
  comm::Communicator& tp() const { return *tp_; }
  // Rows of the full wte: padded_vocab rounded up to a multiple of tp (the rows past
  // padded_vocab exist only here and are zero; checkpoints drop them).
  int64_t wte_rows() const { return wte_rows_; }

  std::shared_ptr<VocabParallelEmbedding> wte;
  std::shared_ptr<nn::Embedding> wpe;
  std::shared_ptr<nn::Dropout> drop;
  std::shared_ptr<nn::ModuleList> blocks;
  std::shared_ptr<TpLayerNorm> ln_f;

 private:
  GptConfig config_;
  TpGptOptions options_;
  GroupPtr tp_;
  int64_t wte_rows_;
  std::vector<std::shared_ptr<TpBlock>> blocks_;
  nn::BlockCheckpointing checkpointing_;  // of the last forward's blocks
  double last_lm_loss_ = 0;
};

}  // namespace loom::parallel
