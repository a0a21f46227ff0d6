#include "parallel/pipeline/gpt_stage.h"

#include <algorithm>
#include <cmath>

#include "core/ops.h"
#include "parallel/expert_parallel.h"
#include "parallel/tensor_parallel/tp_gpt.h"
#include "parallel/tensor_parallel/vocab_parallel_cross_entropy.h"

namespace loom::parallel::pipeline {
namespace {

using parallel::TpBlock;
using parallel::TpLayerNorm;
using parallel::VocabParallelEmbedding;

// The "blocks" container of a stage: children named by their global block index. A ModuleList,
// so ZeRO-3 makes each block a unit of its own (See zero3_layout), as in the whole GPT.
class BlockRange : public nn::ModuleList {
 public:
  void add(int64_t index, std::shared_ptr<nn::Module> block) {
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

namespace {

struct Partition {
  std::vector<int64_t> counts;  // blocks per stage
  std::vector<double> costs;    // per stage, in blocks
};

Partition partition(const GptConfig& c, int stages) {
  LOOM_CHECK(stages >= 1 && c.layers >= stages, "pipeline: ", c.layers,
             " blocks cannot be split into ", stages, " stages (each stage needs a block)");
  const double ch = double(c.channels), block = 12 * ch * ch + 2 * double(c.max_seq_len) * ch;
  const double head = (ch * double(c.padded_vocab) + 3 * double(c.padded_vocab)) / block;
  const double embed = ch / block;
  const int64_t layers = c.layers;
  auto extra = [&](int s) { return (s == 0 ? embed : 0.0) + (s == stages - 1 ? head : 0.0); };
  auto cost_of = [&](const std::vector<int64_t>& counts) {
    std::vector<double> out;
    for (int s = 0; s < stages; ++s) out.push_back(double(counts[size_t(s)]) + extra(s));
    return out;
  };
  auto worst = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
  std::vector<int64_t> even;
  for (int s = 0; s < stages; ++s) even.push_back(stage_layers(layers, s, stages).second);
  // best[s][n]: for stages s.. holding the last n blocks, the least (worst stage cost, sum of
  // squared stage costs): the worst stage first, then the most even; on a tie the earlier stage
  // takes more blocks (k runs down), as stage_layers does.
  using Score = std::pair<double, double>;
  const Score none{1e300, 1e300};
  std::vector<std::vector<Score>> best(size_t(stages) + 1,
                                       std::vector<Score>(size_t(layers) + 1, none));
  std::vector<std::vector<int64_t>> take(size_t(stages),
                                         std::vector<int64_t>(size_t(layers) + 1, 0));
  best[size_t(stages)][0] = {0, 0};
  for (int s = stages - 1; s >= 0; --s)
    for (int64_t n = 1; n <= layers; ++n)
      for (int64_t k = n - (stages - 1 - s); k >= 1; --k) {
        const Score& rest = best[size_t(s) + 1][size_t(n - k)];
        if (rest == none) continue;
        const double mine = double(k) + extra(s);
        const Score score{std::max(mine, rest.first), rest.second + mine * mine};
        if (score.first < best[size_t(s)][size_t(n)].first - 1e-12 ||
            (score.first <= best[size_t(s)][size_t(n)].first + 1e-12 &&
             score.second < best[size_t(s)][size_t(n)].second - 1e-12)) {
          best[size_t(s)][size_t(n)] = score;
          take[size_t(s)][size_t(n)] = k;
        }
      }
  std::vector<int64_t> counts;
  for (int s = 0, n = int(layers); s < stages; ++s) {
    counts.push_back(take[size_t(s)][size_t(n)]);
    n -= int(counts.back());
  }
  const std::vector<double> even_costs = cost_of(even), costs = cost_of(counts);
  if (worst(even_costs) <= worst(costs) + 1e-12) return {even, even_costs};
  return {counts, costs};
}

}  // namespace

std::pair<int64_t, int64_t> stage_layers(const GptConfig& config, int stage, int stages) {
  LOOM_CHECK(stage >= 0 && stage < stages, "pipeline: stage ", stage, " is not one of ", stages);
  const Partition p = partition(config, stages);
  int64_t first = 0;
  for (int s = 0; s < stage; ++s) first += p.counts[size_t(s)];
  return {first, p.counts[size_t(stage)]};
}

std::vector<double> stage_costs(const GptConfig& config, int stages) {
  return partition(config, stages).costs;
}

GptStage::GptStage(const GptConfig& config, int stage, int stages, double dropout,
                   std::shared_ptr<comm::Communicator> tp, bool sequence_parallel,
                   const nn::MoeOptions& moe, const nn::MoeFactory& make_moe)
    : config_(config),
      stage_(stage),
      stages_(stages),
      tp_(std::move(tp)),
      sequence_parallel_(sequence_parallel) {
  config.validate();
  LOOM_CHECK(tp_ || !sequence_parallel, "GptStage: sequence parallelism needs a tp group");
  const auto [first, count] = stage_layers(config, stage, stages);  // Note [Stage partition]
  const int64_t c = config.channels;
  const double proj_std = 0.02 / std::sqrt(2.0 * double(config.layers));
  const nn::Init wte_init = nn::Init::normal(0.02).with_zero_rows_from(config.vocab);
  moe.validate();
  const parallel::TpGptOptions tp_options{dropout, sequence_parallel, moe, make_moe};
  if (tp_) {
    per_rank("GptStage", "heads", config.heads, tp_->size());
    per_rank("GptStage", "dim", c, tp_->size());
  }
  // Registration order follows the single-process GPT's (Note [GPT parameter names]).
  if (is_first() || is_last()) {
    const int n = tp_ ? tp_->size() : 1;
    const int64_t rows = (config.padded_vocab + n - 1) / n * n;  // See TpGPT::wte_rows
    if (tp_)
      wte =
          register_module("wte", std::make_shared<VocabParallelEmbedding>(rows, c, tp_, wte_init));
    else
      wte =
          register_module("wte", std::make_shared<nn::Embedding>(config.padded_vocab, c, wte_init));
  }
  if (is_first()) {
    wpe = register_module("wpe", std::make_shared<nn::Embedding>(config.max_seq_len, c));
    drop = register_module("drop", std::make_shared<nn::Dropout>(dropout));
    if (sequence_parallel) drop->set_part(1, tp_->rank(), tp_->size());
  }
  auto range = register_module("blocks", std::make_shared<BlockRange>());
  for (int64_t i = first; i < first + count; ++i) {
    const bool use_moe = moe.enabled() && i % moe.every == 0;
    if (tp_) {
      auto block = std::make_shared<TpBlock>(c, config.heads, tp_, tp_options, proj_std, use_moe);
      block_moe_.push_back(block->moe.get());
      blocks.push_back(block);
    } else {
      auto block = std::make_shared<nn::Block>(c, config.heads, dropout, proj_std,
                                               use_moe ? moe : nn::MoeOptions{}, make_moe);
      block_moe_.push_back(block->moe.get());
      blocks.push_back(block);
    }
    range->add(i, blocks.back());
  }
  if (is_last()) {
    if (tp_)
      ln_f = register_module("ln_f", std::make_shared<TpLayerNorm>(c, tp_, sequence_parallel));
    else
      ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(c));
  }
}

std::vector<nn::MoeLayer*> GptStage::moe_layers() const {
  std::vector<nn::MoeLayer*> out;
  for (nn::MoeLayer* m : block_moe_)
    if (m) out.push_back(m);
  return out;
}

Tensor GptStage::moe_aux_loss() const {
  Tensor total;
  for (const Tensor& term : checkpointing_.aux_terms())
    total = total.defined() ? add(total, term) : term;
  return total;
}

Tensor GptStage::wte_weight() const {
  if (!wte) return Tensor();
  if (tp_) return std::static_pointer_cast<VocabParallelEmbedding>(wte)->weight;
  return std::static_pointer_cast<nn::Embedding>(wte)->weight;
}

Shape GptStage::activation_shape(int64_t rows, int64_t seq) const {
  return {rows, sequence_parallel_ ? seq / tp_->size() : seq, config_.channels};
}

Tensor GptStage::forward(const Tensor& x) {
  Tensor h = x;
  if (is_first()) {
    LOOM_CHECK(x.defined() && x.dim() == 2, "GptStage: the first stage takes token ids [B, T]");
    Tensor pos = Tensor::arange(x.size(1), DType::kI64, x.device());
    h = add((*wte)(x), (*wpe)(pos));
    if (sequence_parallel_) h = scatter_to_tp(h, tp_, 1);
    h = (*drop)(h);
  }
  checkpointing_.begin(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i)
    h = checkpointing_.run(i, blocks[i], block_moe_[i], h, checkpoint_);
  if (!is_last()) return h;
  h = (*ln_f)(h);
  if (tp_) h = sequence_parallel_ ? gather_sequence(h, tp_, 1) : copy_to_tp(h, tp_);
  return matmul(h, wte_weight(), false, /*transpose_b=*/true);
}

Tensor GptStage::loss(const Tensor& logits, const Tensor& targets) const {
  LOOM_CHECK(is_last(), "GptStage::loss: only the last stage computes the loss");
  const int64_t n = targets.numel();
  if (tp_)
    return vocab_parallel_cross_entropy(reshape(logits, {n, logits.size(-1)}),
                                        reshape(targets, {n}), tp_, config_.vocab);
  CrossEntropyOptions o;
  o.num_classes = config_.vocab;
  return cross_entropy(reshape(logits, {n, config_.padded_vocab}), reshape(targets, {n}), o);
}

void sync_tied_embedding(const std::vector<GptStage*>& local, comm::Communicator* group) {
  NoGradGuard no_grad;
  std::vector<Tensor> copies;
  for (GptStage* stage : local)
    if (stage->wte) copies.push_back(stage->wte_weight());
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

std::string StageSet::single_process_name(const std::string& name) {
  const size_t dot = name.find('.');
  LOOM_ASSERT(name.rfind("chunk", 0) == 0 && dot != std::string::npos,
              "a StageSet parameter named ", name);
  return name.substr(dot + 1);
}

void StageSet::add(std::shared_ptr<GptStage> stage) {
  GptStage* raw = stage.get();
  register_module("chunk" + std::to_string(children().size()), std::move(stage));
  raw->set_full_name("");
}

std::vector<std::shared_ptr<comm::Communicator>> replica_pairs(const Schedule& s,
                                                               comm::Communicator& pp) {
  std::vector<std::shared_ptr<comm::Communicator>> out(size_t(s.stages));
  if (s.pipelines != 2) return out;
  const int rank = pp.rank();
  for (int k = 0; k < s.stages; ++k) {
    const bool member = s.holder(0, k).first == rank || s.holder(1, k).first == rank;
    auto group = pp.split(member ? 0 : 1, rank, member ? "replicas" : "replicas.others");
    if (member) out[size_t(k)] = std::move(group);
  }
  return out;
}

StageChunk stage_chunk(const std::shared_ptr<GptStage>& stage,
                       std::shared_ptr<comm::Communicator> replica_pair,
                       std::shared_ptr<comm::Communicator> dp_average,
                       std::shared_ptr<comm::Communicator> expert_replicas,
                       const std::function<bool(const std::string&)>& summed_at_sync) {
  GptStage* raw = stage.get();
  StageChunk chunk;
  chunk.forward = [raw](const Tensor& x) { return (*raw)(x); };
  chunk.loss = [raw](const Tensor& y, const Tensor& t) { return raw->loss(y, t); };
  if (!stage->moe_layers().empty()) chunk.extra_loss = [raw] { return raw->moe_aux_loss(); };
  std::vector<Tensor> synced, experts, paired;  // paired: the synced ones SYNC sums over the pair
  for (const auto& [name, p] : stage->named_parameters()) {
    if (name == "wte.weight") continue;
    const bool expert = expert_replicas && is_expert_parameter(name);
    (expert ? experts : synced).push_back(p);
    if (!expert && (!summed_at_sync || summed_at_sync(name))) paired.push_back(p);
  }
  std::shared_ptr<GradientSum> replicas, data, expert_pair, expert;
  if (replica_pair) {
    if (!paired.empty()) replicas = std::make_shared<GradientSum>(paired, replica_pair);
    if (!experts.empty()) expert_pair = std::make_shared<GradientSum>(experts, replica_pair);
  }
  const int dp = dp_average ? dp_average->size() : 1;
  if (dp_average && dp > 1)
    data = std::make_shared<GradientSum>(synced, std::move(dp_average), /*average=*/true);
  if (!experts.empty() && dp > 1)
    expert = std::make_shared<GradientSum>(experts, std::move(expert_replicas),
                                           /*average=*/false, 1.0 / double(dp));
  if (!replicas && !data && !expert) return chunk;
  // The replica sums (Chimera's pair) start at SYNC; the dp reductions follow once they are done.
  chunk.sync = [replicas, data, expert_pair, expert] {
    if (replicas || data) (replicas ? replicas : data)->start();
    if (expert_pair || expert) (expert_pair ? expert_pair : expert)->start();
  };
  chunk.sync_wait = [replicas, data, expert_pair, expert] {
    if (replicas) {
      replicas->wait();
      if (data) data->start();
    }
    if (expert_pair) {
      expert_pair->wait();
      if (expert) expert->start();
    }
    if (data) data->wait();
    if (expert) expert->wait();
  };
  return chunk;
}

std::shared_ptr<comm::Communicator> embedding_group(const Schedule& schedule,
                                                    comm::Communicator& pp) {
  const int first = schedule.holder(0, 0).first,
            last = schedule.holder(0, schedule.stages - 1).first;
  const bool member = pp.rank() == first || pp.rank() == last;
  auto group = pp.split(member ? 0 : 1, pp.rank(), member ? "embedding" : "embedding.others");
  return member && first != last ? group : nullptr;
}

}  // namespace loom::parallel::pipeline
