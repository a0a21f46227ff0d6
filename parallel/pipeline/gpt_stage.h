// One pipeline stage of a GPT: a contiguous range of its blocks, plus the embeddings on the first
// stage and the final LayerNorm and tied output head on the last. Parameters keep their
// single-process names ("blocks.5.attn.qkv.weight"), so init_parameters(seed) gives each stage
// exactly the single-process values and checkpoints need no renaming.
//
// With a tp group the stage is tensor-parallel too (See parallel::TpGPT): vocab-parallel wte,
// Megatron blocks, the vocab-parallel loss; with sequence parallelism the activation passed
// between stages is this rank's sequence slice [B, T/tp, C].
//
// The output head is tied to wte, which lives on the first stage. With more than one stage the
// last stage holds its own copy of wte (initialised identically); after each step's backwards the
// two copies' gradients are summed over the embedding group (first and last stage), as in
// Megatron-LM, so both take the same update and stay equal.
#pragma once

#include <memory>
#include <vector>

#include "collectives/communicator.h"
#include "core/nn/block.h"
#include "core/nn/block_checkpointing.h"
#include "core/nn/dropout.h"
#include "core/nn/embedding.h"
#include "core/nn/gpt_config.h"
#include "core/nn/layer_norm.h"
#include "core/nn/module.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/schedule.h"

namespace loom::parallel::pipeline {

// Blocks [first, first + count) of `layers` for stage `stage` of `stages`, split as evenly as
// possible (the earlier stages get the extra blocks). Throws when a stage would get none.
std::pair<int64_t, int64_t> stage_layers(int64_t layers, int stage, int stages);

// Note [Stage partition]
// The first stage also embeds and the last also computes the head and the loss, whose cost grows
// with the vocabulary: with GPT-2's 50304 rows the head costs about 4.5 blocks. The partition is
// the contiguous split of the blocks (at least one per stage) that minimises the costliest stage
// under an estimate in multiply-adds per token: a block 12 C^2 + 2 T C (its four matrices and
// attention), the head and loss C Vp + 3 Vp, the embeddings C. An even split is kept whenever it
// is as good, so small vocabularies split as stage_layers does.
std::pair<int64_t, int64_t> stage_layers(const GptConfig& config, int stage, int stages);
// The estimated cost of each stage of that partition, in blocks.
std::vector<double> stage_costs(const GptConfig& config, int stages);

class GptStage : public nn::Module {
 public:
  // With `moe` enabled, block i's MLP is a mixture of experts when i % moe.every == 0 (i its
  // single-process index), built by `make_moe` (empty: nn::MoE, every expert here).
  GptStage(const GptConfig& config, int stage, int stages, double dropout = 0.0,
           std::shared_ptr<comm::Communicator> tp = nullptr, bool sequence_parallel = false,
           const nn::MoeOptions& moe = {}, const nn::MoeFactory& make_moe = {});

  int stage() const { return stage_; }  // its index in the pipeline
  bool is_first() const { return stage_ == 0; }
  bool is_last() const { return stage_ == stages_ - 1; }
  // First stage: token ids [B, T] -> hidden [B, T, C]; other stages: hidden -> hidden; the last
  // stage returns the logits [B, T, padded_vocab].
  Tensor forward(const Tensor& x) override;
  // The last stage: mean cross-entropy of its logits over the first `vocab` columns.
  Tensor loss(const Tensor& logits, const Tensor& targets) const;

  const GptConfig& config() const { return config_; }
  // The stage's MoE layers, in block order (empty: dense blocks).
  std::vector<nn::MoeLayer*> moe_layers() const;
  // The sum of their auxiliary losses of the last forward (undefined without MoE layers); a
  // checkpointed block's gradient reaches its router only through this one.
  Tensor moe_aux_loss() const;
  // Activation checkpointing of every block (See core/nn/block_checkpointing.h): each block keeps
  // its input and is recomputed in its micro-batch's backward; the same results, bit for bit.
  void set_checkpointing(bool on) { checkpoint_ = on; }
  // wte's weight (this rank's vocabulary rows with tp), undefined on middle stages.
  Tensor wte_weight() const;
  // The activation one micro-batch of `rows` sequences of length `seq` passes to the next stage.
  Shape activation_shape(int64_t rows, int64_t seq) const;

  std::shared_ptr<nn::Module> wte;     // first stage, and the last (the tied head)
  std::shared_ptr<nn::Embedding> wpe;  // first stage
  std::shared_ptr<nn::Dropout> drop;   // first stage
  std::vector<std::shared_ptr<nn::Module>> blocks;
  std::shared_ptr<nn::Module> ln_f;  // last stage

 private:
  GptConfig config_;
  int stage_, stages_;
  std::shared_ptr<comm::Communicator> tp_;
  bool sequence_parallel_;
  std::vector<nn::MoeLayer*> block_moe_;  // per block: its MoE layer, or null
  bool checkpoint_ = false;
  nn::BlockCheckpointing checkpointing_;  // of the last forward's blocks
};

// Chimera's replica pairs: for each stage k, a group of the two ranks holding its replicas (the
// down pipeline's and the up pipeline's), or null where this rank holds neither or the schedule
// has one pipeline. A group per stage keeps the two stages a pair of ranks shares from mixing
// their collectives. Collective over `pp`.
std::vector<std::shared_ptr<comm::Communicator>> replica_pairs(const Schedule& schedule,
                                                               comm::Communicator& pp);

// The executor's view of a stage: its forward and loss, and at SYNC its gradient reductions:
// the sum over its replica pair (Chimera; null: none), then the average over `dp_average` (null:
// none). wte is left out of both: its copies are summed by sync_tied_embedding after the actions.
// With expert parallelism (`expert_replicas`: the dp ranks holding this rank's experts), the
// experts' gradients are summed over expert_replicas and divided by dp_average's size instead
// (See Note [Own parameters under data parallelism]). The chunk's extra loss is the stage's MoE
// auxiliary losses (See GptStage::moe_aux_loss). `summed_at_sync` (default: every one) names
// the stage's parameters (its own names) whose gradients SYNC sums over the replica pair; the
// others are summed by someone else (ZeRO-2 and 3 sum their shards, See ZeroOptions::chunk_sums).
StageChunk stage_chunk(const std::shared_ptr<GptStage>& stage,
                       std::shared_ptr<comm::Communicator> replica_pair,
                       std::shared_ptr<comm::Communicator> dp_average,
                       std::shared_ptr<comm::Communicator> expert_replicas = nullptr,
                       const std::function<bool(const std::string&)>& summed_at_sync = {});

// A rank's stages under one module, for wrappers that take one (ZeroOptimizer): child k is
// "chunk{k}", so the set's parameter names are unique even when two chunks hold the same
// single-process parameter (the tied wte, Chimera's replicas), while each stage keeps its own
// full name (its initialisation and dropout masks stay the single-process ones).
class StageSet : public nn::Module {
 public:
  void add(std::shared_ptr<GptStage> stage);
  // The single-process name of the set's parameter "chunk{k}.<name>": <name> (what checkpoints
  // store it under).
  static std::string single_process_name(const std::string& name);
};

// The tied embedding: sums the gradients of every copy of wte.weight among `local` (this rank's
// stages) and, when `group` is given, over its ranks (the ranks holding the first or last stage),
// and gives every copy the sum. Collective over `group`.
void sync_tied_embedding(const std::vector<GptStage*>& local, comm::Communicator* group);

// sync_tied_embedding's group: the ranks of `pp` holding pipeline 0's first and last stages (the
// tied wte's copies); null on the other ranks, and when one rank holds both. Collective over pp
// (every rank splits it).
std::shared_ptr<comm::Communicator> embedding_group(const Schedule& schedule,
                                                    comm::Communicator& pp);

}  // namespace loom::parallel::pipeline
