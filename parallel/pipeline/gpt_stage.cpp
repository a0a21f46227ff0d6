#include "parallel/pipeline/gpt_stage.h"

#include <cmath>

#include "core/ops.h"

namespace loom::parallel::pipeline {
namespace {

// The "blocks" container of a stage: children named by their global block index.
class BlockRange : public nn::Module {
 public:
  void add(int64_t index, std::shared_ptr<nn::Block> block) {
    register_module(std::to_string(index), std::move(block));
  }
};

}  // namespace

std::pair<int64_t, int64_t> stage_layers(int64_t layers, int stage, int stages) {
  LOOM_CHECK(stages >= 1 && stage >= 0 && stage < stages, "pipeline: stage ", stage,
             " is not one of ", stages);
  LOOM_CHECK(layers >= stages, "pipeline: ", layers, " blocks cannot be split into ", stages,
             " stages (each stage needs a block)");
  const int64_t base = layers / stages, extra = layers % stages;
  const int64_t first = stage * base + std::min<int64_t>(stage, extra);
  return {first, base + (stage < extra ? 1 : 0)};
}

GptStage::GptStage(const GptConfig& config, int stage, int stages, double dropout)
    : config_(config), stage_(stage), stages_(stages) {
  config.validate();
  const auto [first, count] = stage_layers(config.layers, stage, stages);
  const int64_t c = config.channels;
  const double proj_std = 0.02 / std::sqrt(2.0 * double(config.layers));
  // Registration order follows the single-process GPT's (Note [GPT parameter names]).
  if (is_first() || is_last())
    wte = register_module("wte", std::make_shared<nn::Embedding>(
                                     config.padded_vocab, c,
                                     nn::Init::normal(0.02).with_zero_rows_from(config.vocab)));
  if (is_first()) {
    wpe = register_module("wpe", std::make_shared<nn::Embedding>(config.max_seq_len, c));
    drop = register_module("drop", std::make_shared<nn::Dropout>(dropout));
  }
  auto range = register_module("blocks", std::make_shared<BlockRange>());
  for (int64_t i = first; i < first + count; ++i) {
    blocks.push_back(std::make_shared<nn::Block>(c, config.heads, dropout, proj_std));
    range->add(i, blocks.back());
  }
  if (is_last()) ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(c));
}

Tensor GptStage::forward(const Tensor& x) {
  Tensor h = x;
  if (is_first()) {
    LOOM_CHECK(x.defined() && x.dim() == 2, "GptStage: the first stage takes token ids [B, T]");
    Tensor pos = Tensor::arange(x.size(1), DType::kI64, x.device());
    h = (*drop)(add((*wte)(x), (*wpe)(pos)));
  }
  for (const auto& block : blocks) h = (*block)(h);
  if (!is_last()) return h;
  return matmul((*ln_f)(h), wte->weight, false, /*transpose_b=*/true);
}

Tensor GptStage::loss(const Tensor& logits, const Tensor& targets) const {
  LOOM_CHECK(is_last(), "GptStage::loss: only the last stage computes the loss");
  const int64_t n = targets.numel();
  CrossEntropyOptions o;
  o.num_classes = config_.vocab;
  return cross_entropy(reshape(logits, {n, config_.padded_vocab}), reshape(targets, {n}), o);
}

void sync_tied_embedding(const std::vector<GptStage*>& local, comm::Communicator* group) {
  NoGradGuard no_grad;
  std::vector<Tensor> copies;
  for (GptStage* stage : local)
    if (stage->wte) copies.push_back(stage->wte->weight);
  Tensor sum;
  for (const Tensor& w : copies) {
    LOOM_CHECK(w.grad().defined(), "sync_tied_embedding: a copy of wte.weight has no gradient");
    sum = sum.defined() ? add(sum, w.grad()) : w.grad().detach().clone();
  }
  if (group && group->size() > 1) {
    if (!sum.defined()) return;  // not a member: the group was made for the others
    group->allreduce(sum)->wait();
  }
  for (Tensor w : copies) w.set_grad(copies.size() == 1 ? sum : sum.clone());
}

}  // namespace loom::parallel::pipeline
