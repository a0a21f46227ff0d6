#include "parallel/tensor_parallel/tp_gpt.h"

#include <cmath>

#include "core/nn/attention.h"
#include "core/ops.h"
#include "parallel/tensor_parallel/vocab_parallel_cross_entropy.h"

namespace loom::parallel {

TpLayerNorm::TpLayerNorm(int64_t channels, GroupPtr tp, bool sequence_parallel)
    : tp_(std::move(tp)), sequence_parallel_(sequence_parallel) {
  weight = register_parameter("weight", {channels}, nn::Init::ones());
  bias = register_parameter("bias", {channels}, nn::Init::zeros());
}

Tensor TpLayerNorm::forward(const Tensor& x) {
  if (!sequence_parallel_) return layer_norm(x, weight, bias);
  return layer_norm(x, copy_to_tp(weight, tp_), copy_to_tp(bias, tp_));
}

TpAttention::TpAttention(int64_t channels, int64_t heads, GroupPtr tp, const TpGptOptions& o,
                         double proj_std)
    : channels_(channels), heads_(heads), tp_(std::move(tp)) {
  LOOM_CHECK(heads > 0 && channels % heads == 0, "TpAttention: heads (", heads,
             ") must divide dim (", channels, ")");
  per_rank("TpAttention", "heads", heads, tp_->size());
  ColumnParallelOptions c;
  c.blocks = 3;  // q, k, v
  c.sequence_parallel = o.sequence_parallel;
  qkv = register_module("qkv",
                        std::make_shared<ColumnParallelLinear>(channels, 3 * channels, tp_, c));
  RowParallelOptions r;
  r.init_std = proj_std;
  r.sequence_parallel = o.sequence_parallel;
  proj = register_module("proj", std::make_shared<RowParallelLinear>(channels, channels, tp_, r));
  attn_drop = register_module("attn_drop", std::make_shared<nn::Dropout>(o.dropout));
  resid_drop = register_module("resid_drop", std::make_shared<nn::Dropout>(o.dropout));
  attn_drop->set_part(1, tp_->rank(), tp_->size());  // [B, H/tp, T, T]: this rank's heads
  if (o.sequence_parallel) resid_drop->set_part(1, tp_->rank(), tp_->size());
}

Tensor TpAttention::forward(const Tensor& x) {
  Tensor y = (*qkv)(x);  // [B, T, 3 C/tp]: this rank's heads of q, k, v
  const int64_t b = y.size(0), t = y.size(1), local = y.size(2) / 3;
  const int64_t h = heads_ / tp_->size(), d = channels_ / heads_;
  std::vector<Tensor> parts = split(y, {local, local, local}, 2);
  auto heads_first = [&](const Tensor& p) { return transpose(reshape(p, {b, t, h, d}), 1, 2); };
  Tensor att =
      nn::attend(heads_first(parts[0]), heads_first(parts[1]), heads_first(parts[2]), *attn_drop);
  Tensor merged = reshape(transpose(att, 1, 2), {b, t, local});
  return (*resid_drop)((*proj)(merged));
}

TpMLP::TpMLP(int64_t channels, GroupPtr tp, const TpGptOptions& o, double proj_std) {
  ColumnParallelOptions c;
  c.sequence_parallel = o.sequence_parallel;
  fc = register_module("fc", std::make_shared<ColumnParallelLinear>(channels, 4 * channels, tp, c));
  RowParallelOptions r;
  r.init_std = proj_std;
  r.sequence_parallel = o.sequence_parallel;
  proj =
      register_module("proj", std::make_shared<RowParallelLinear>(4 * channels, channels, tp, r));
  drop = register_module("drop", std::make_shared<nn::Dropout>(o.dropout));
  if (o.sequence_parallel) drop->set_part(1, tp->rank(), tp->size());
}

Tensor TpMLP::forward(const Tensor& x) { return (*drop)((*proj)(gelu((*fc)(x)))); }

TpBlock::TpBlock(int64_t channels, int64_t heads, GroupPtr tp, const TpGptOptions& o,
                 double proj_std, bool use_moe)
    : tp_(tp), sequence_parallel_(o.sequence_parallel) {
  ln1 = register_module("ln1", std::make_shared<TpLayerNorm>(channels, tp, o.sequence_parallel));
  attn = register_module("attn", std::make_shared<TpAttention>(channels, heads, tp, o, proj_std));
  ln2 = register_module("ln2", std::make_shared<TpLayerNorm>(channels, tp, o.sequence_parallel));
  if (use_moe)  // experts whole on every tp rank (See the header comment)
    moe = register_module<nn::MoeLayer>(
        "mlp", o.make_moe ? o.make_moe(channels, o.moe, o.dropout, proj_std)
                          : std::make_shared<nn::MoE>(channels, o.moe, o.dropout, proj_std));
  else
    mlp = register_module("mlp", std::make_shared<TpMLP>(channels, tp, o, proj_std));
}

Tensor TpBlock::forward(const Tensor& x) {
  Tensor h = add(x, (*attn)((*ln1)(x)));
  Tensor in = (*ln2)(h);
  if (!moe) return add(h, (*mlp)(in));
  if (!sequence_parallel_) return add(h, (*moe)(in));
  // The whole sequence through the MoE, this rank's slice out (See the header comment).
  return add(h, scatter_to_tp((*moe)(gather_from_tp(in, tp_, 1)), tp_, 1));
}

TpGPT::TpGPT(const GptConfig& config, GroupPtr tp, const TpGptOptions& options)
    : config_(config), options_(options), tp_(std::move(tp)) {
  config.validate();
  LOOM_CHECK(tp_ != nullptr, "TpGPT: the tp group is null");
  const int n = tp_->size();
  const int64_t c = config.channels;
  per_rank("TpGPT", "heads", config.heads, n);
  per_rank("TpGPT", "dim", c, n);
  per_rank("TpGPT", "MLP hidden size (4 x dim)", 4 * c, n);
  options.moe.validate();
  wte_rows_ = (config.padded_vocab + n - 1) / n * n;
  const double proj_std = 0.02 / std::sqrt(2.0 * double(config.layers));
  wte = register_module(
      "wte", std::make_shared<VocabParallelEmbedding>(
                 wte_rows_, c, tp_, nn::Init::normal(0.02).with_zero_rows_from(config.vocab)));
  wpe = register_module("wpe", std::make_shared<nn::Embedding>(config.max_seq_len, c));
  drop = register_module("drop", std::make_shared<nn::Dropout>(options.dropout));
  if (options.sequence_parallel) drop->set_part(1, tp_->rank(), n);
  blocks = register_module("blocks", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < config.layers; ++i) {
    const bool moe = options.moe.enabled() && i % options.moe.every == 0;
    blocks_.push_back(std::make_shared<TpBlock>(c, config.heads, tp_, options, proj_std, moe));
    blocks->push_back(blocks_.back());
  }
  ln_f = register_module("ln_f", std::make_shared<TpLayerNorm>(c, tp_, options.sequence_parallel));
}

Tensor TpGPT::forward(const Tensor& idx) {
  LOOM_CHECK(idx.defined() && idx.dim() == 2, "TpGPT: idx must be token ids [B, T], got ",
             idx.defined() ? shape_str(idx.shape()) : "undefined");
  const int64_t t = idx.size(1);
  LOOM_CHECK(t <= config_.max_seq_len, "TpGPT: sequence length ", t, " exceeds max_seq_len ",
             config_.max_seq_len);
  if (options_.sequence_parallel)
    per_rank("TpGPT (sequence parallel)", "sequence length", t, tp_->size());
  Tensor pos = Tensor::arange(t, DType::kI64, idx.device());
  Tensor x = add((*wte)(idx), (*wpe)(pos));  // [B, T, C], the same on every rank
  if (options_.sequence_parallel) x = scatter_to_tp(x, tp_, 1);  // [B, T/tp, C]
  x = (*drop)(x);
  checkpointing_.begin(blocks_.size());
  for (size_t i = 0; i < blocks_.size(); ++i)
    x = checkpointing_.run(i, blocks_[i], blocks_[i]->moe.get(), x, options_.checkpoint);
  x = (*ln_f)(x);
  // Under sp the output layer keeps its gathered input, unlike the column-parallel linears
  // (Note [Sequence-parallel linears keep their shard]): its backward comes right after its
  // forward wherever it is the peak (no pipeline, a 1F1B last stage), and there gathering again
  // would hold the shard beside the whole: tried, tp 2 sp's peak rose 59.85 -> 60.38 MB.
  x = options_.sequence_parallel ? gather_sequence(x, tp_, 1) : copy_to_tp(x, tp_);
  return matmul(x, wte->weight, false, /*transpose_b=*/true);  // [B, T, rows/tp]
}

Tensor TpGPT::full_logits(const Tensor& idx) {
  LOOM_CHECK(idx.defined() && idx.dim() == 2, "TpGPT: idx must be token ids [B, T], got ",
             idx.defined() ? shape_str(idx.shape()) : "undefined");
  const int64_t t = idx.size(1), parts = tp_->size();
  Tensor in = idx;
  if (options_.sequence_parallel && t % parts != 0) {
    const int64_t padded = (t + parts - 1) / parts * parts;
    LOOM_CHECK(padded <= config_.max_seq_len, "TpGPT (sequence parallel): sequence length ", t,
               " does not divide over tp ", parts, " and padding it to ", padded,
               " exceeds max_seq_len ", config_.max_seq_len);
    in = Tensor::zeros({idx.size(0), padded}, idx.dtype(), idx.device());
    in.narrow(1, 0, t).copy_(idx);
  }
  Tensor whole = gather_from_tp((*this)(in), tp_, -1).narrow(-1, 0, config_.padded_vocab);
  return in.size(1) == t ? whole : whole.narrow(1, 0, t);
}

Tensor TpGPT::loss(const Tensor& idx, const Tensor& targets) {
  LOOM_CHECK(targets.defined() && idx.defined() && targets.shape() == idx.shape(),
             "TpGPT::loss: targets ", targets.defined() ? shape_str(targets.shape()) : "undefined",
             " must have the shape of idx ", idx.defined() ? shape_str(idx.shape()) : "undefined");
  Tensor logits = (*this)(idx);
  const int64_t n = idx.size(0) * idx.size(1);
  Tensor lm = vocab_parallel_cross_entropy(reshape(logits, {n, logits.size(2)}),
                                           reshape(targets, {n}), tp_, config_.vocab);
  if (moe_layers().empty()) return lm;
  last_lm_loss_ = lm.item();
  Tensor total = lm;  // the terms added in GPT::loss's order
  for (const Tensor& term : checkpointing_.aux_terms()) total = add(total, term);
  return total;
}

Tensor TpGPT::aux_loss() const {
  Tensor total = Tensor::zeros({}, DType::kF32, wpe->weight.device());
  for (const Tensor& term : checkpointing_.aux_terms()) total = add(total, term);
  return total;
}

std::vector<const nn::MoeLayer*> TpGPT::moe_layers() const {
  std::vector<const nn::MoeLayer*> out;
  for (const auto& b : blocks_)
    if (b->moe) out.push_back(b->moe.get());
  return out;
}

}  // namespace loom::parallel
