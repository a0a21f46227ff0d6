#include "core/nn/gpt.h"

#include <cmath>

#include "core/autograd.h"
#include "core/ops.h"

namespace loom::nn {

GPT::GPT(const GptConfig& config, const GptOptions& options) : config_(config), options_(options) {
  config.validate();
  const int64_t c = config.channels;
  const double proj_std = 0.02 / std::sqrt(2.0 * double(config.layers));
  wte = register_module(
      "wte", std::make_shared<Embedding>(config.padded_vocab, c,
                                         Init::normal(0.02).with_zero_rows_from(config.vocab)));
  wpe = register_module("wpe", std::make_shared<Embedding>(config.max_seq_len, c));
  drop = register_module("drop", std::make_shared<Dropout>(options.dropout));
  blocks = register_module("blocks", std::make_shared<ModuleList>());
  options.moe.validate();
  for (int64_t i = 0; i < config.layers; ++i) {
    const bool moe = options.moe.enabled() && i % options.moe.every == 0;
    blocks_.push_back(std::make_shared<Block>(c, config.heads, options.dropout, proj_std,
                                              moe ? options.moe : MoeOptions{}, options.make_moe));
    blocks->push_back(blocks_.back());
  }
  ln_f = register_module("ln_f", std::make_shared<LayerNorm>(c));
}

std::vector<const MoeLayer*> GPT::moe_layers() const {
  std::vector<const MoeLayer*> out;
  for (const auto& b : blocks_)
    if (b->moe) out.push_back(b->moe.get());
  return out;
}

void GPT::check_tokens(const Tensor& idx) const {
  LOOM_CHECK(idx.defined() && idx.dim() == 2, "GPT: idx must be token ids [B, T], got ",
             idx.defined() ? shape_str(idx.shape()) : "undefined");
  LOOM_CHECK(idx.dtype() == DType::kI32 || idx.dtype() == DType::kI64,
             "GPT: idx must be i32 or i64 token ids, got ", dtype_name(idx.dtype()));
  LOOM_CHECK(idx.size(1) <= config_.max_seq_len, "GPT: sequence length ", idx.size(1),
             " exceeds max_seq_len ", config_.max_seq_len);
  // The embedding op accepts any row of wte, padding included; a real token must be < vocab.
  Tensor ids = idx.dtype() == DType::kI64 ? idx : idx.to(DType::kI64);
  const std::vector<int64_t> v = ids.to_vector<int64_t>();
  for (size_t i = 0; i < v.size(); ++i) {
    LOOM_CHECK(v[i] >= 0 && v[i] < config_.vocab, "GPT: token ", v[i], " at [",
               int64_t(i) / idx.size(1), ", ", int64_t(i) % idx.size(1),
               "] is outside the vocabulary [0, ", config_.vocab, ")");
  }
}

Tensor GPT::forward(const Tensor& idx) {
  check_tokens(idx);
  const int64_t t = idx.size(1);
  Tensor pos = Tensor::arange(t, DType::kI64, idx.device());
  Tensor x = (*drop)(add((*wte)(idx), (*wpe)(pos)));  // [B, T, C]
  checkpointing_.begin(blocks_.size());
  for (size_t i = 0; i < blocks_.size(); ++i)
    x = checkpointing_.run(i, blocks_[i], blocks_[i]->moe.get(), x, options_.checkpoint);
  x = (*ln_f)(x);
  return matmul(x, wte->weight, false, /*transpose_b=*/true);  // [B, T, Vp]
}

Tensor GPT::forward_cached(const Tensor& idx, KvCache& cache) {
  check_tokens(idx);
  const int64_t past = cache.length(), t = idx.size(1);
  LOOM_CHECK(cache.layers() == blocks_.size() && cache.capacity() == config_.max_seq_len,
             "GPT::forward_cached: the cache (", cache.layers(), " layers, capacity ",
             cache.capacity(), ") was not made for this model (", blocks_.size(), " layers, ",
             config_.max_seq_len, " positions): use make_kv_cache()");
  LOOM_CHECK(past + t <= config_.max_seq_len, "GPT::forward_cached: ", past, " cached + ", t,
             " new positions exceed max_seq_len ", config_.max_seq_len);
  std::vector<int64_t> positions(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) positions[size_t(i)] = past + i;
  Tensor pos = Tensor::from_vector(positions, {t}, idx.device());
  Tensor x = (*drop)(add((*wte)(idx), (*wpe)(pos)));  // [B, T, C]
  for (size_t i = 0; i < blocks_.size(); ++i)
    x = blocks_[i]->forward_cached(x, cache.layer(i), past);
  x = (*ln_f)(x);
  cache.advance(t);
  return matmul(x, wte->weight, false, /*transpose_b=*/true);  // [B, T, Vp]
}

Tensor GPT::aux_loss() const {
  Tensor total = Tensor::zeros({}, DType::kF32, wte->weight.device());
  for (const Tensor& term : checkpointing_.aux_terms()) total = add(total, term);
  return total;
}

Tensor GPT::loss(const Tensor& idx, const Tensor& targets) {
  LOOM_CHECK(targets.defined() && idx.defined() && targets.shape() == idx.shape(),
             "GPT::loss: targets ", targets.defined() ? shape_str(targets.shape()) : "undefined",
             " must have the shape of idx ", idx.defined() ? shape_str(idx.shape()) : "undefined");
  Tensor logits = (*this)(idx);  // through the hooks, as a caller's model(idx)
  const int64_t n = idx.size(0) * idx.size(1);
  CrossEntropyOptions options;
  options.num_classes = config_.vocab;
  Tensor lm =
      cross_entropy(reshape(logits, {n, config_.padded_vocab}), reshape(targets, {n}), options);
  const std::vector<const MoeLayer*> moes = moe_layers();
  if (moes.empty()) return lm;
  last_lm_loss_ = lm.item();
  Tensor total = lm;
  for (const Tensor& term : checkpointing_.aux_terms()) total = add(total, term);
  return total;
}

}  // namespace loom::nn
