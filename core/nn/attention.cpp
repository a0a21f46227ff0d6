#include "core/nn/attention.h"

#include <cmath>
#include <limits>

#include "core/ops.h"

namespace loom::nn {

namespace {

// [T, past + T] additive mask for queries at positions past .. past + T - 1 over keys 0 ..
// past + T - 1: 0 where the key is at or before the query, -inf after it (future positions).
Tensor causal_mask(int64_t t, Device device, int64_t past = 0, DType dtype = DType::kF32) {
  const int64_t keys = past + t;
  std::vector<float> m(size_t(t * keys), 0.0f);
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = past + i + 1; j < keys; ++j)
      m[size_t(i * keys + j)] = -std::numeric_limits<float>::infinity();
  return Tensor::from_vector(m, {t, keys}, device).to(dtype);
}

}  // namespace

Tensor attend(const Tensor& q, const Tensor& k, const Tensor& v, Dropout& attn_drop) {
  if (!attn_drop.is_training() || attn_drop.p() == 0.0)
    return scaled_dot_product_attention(q, k, v, /*causal=*/true);
  const int64_t t = q.size(2), d = q.size(3);
  Tensor scores = scale(matmul(q, k, false, true), 1.0 / std::sqrt(double(d)));  // [B,H,T,T]
  Tensor att = attn_drop(softmax(add(scores, causal_mask(t, q.device()))));
  return matmul(att, v);
}

CausalSelfAttention::CausalSelfAttention(int64_t channels, int64_t heads, double dropout,
                                         double proj_std)
    : channels_(channels), heads_(heads) {
  LOOM_CHECK(channels > 0 && heads > 0 && channels % heads == 0, "CausalSelfAttention: heads (",
             heads, ") must divide dim (", channels, ")");
  qkv = register_module("qkv", std::make_shared<Linear>(channels, 3 * channels));
  proj = register_module("proj", std::make_shared<Linear>(channels, channels, true, proj_std));
  attn_drop = register_module("attn_drop", std::make_shared<Dropout>(dropout));
  resid_drop = register_module("resid_drop", std::make_shared<Dropout>(dropout));
}

Tensor CausalSelfAttention::forward(const Tensor& x) { return attend_heads(x, nullptr, 0); }

Tensor CausalSelfAttention::forward_cached(const Tensor& x, KvCache::Layer& kv, int64_t past) {
  return attend_heads(x, &kv, past);
}

Tensor CausalSelfAttention::attend_heads(const Tensor& x, KvCache::Layer* kv, int64_t past) {
  LOOM_CHECK(x.defined() && x.dim() == 3 && x.size(2) == channels_, "CausalSelfAttention '",
             full_name(), "': input must be [B, T, ", channels_, "], got ",
             x.defined() ? shape_str(x.shape()) : "undefined");
  const int64_t b = x.size(0), t = x.size(1), h = heads_, d = channels_ / heads_;
  std::vector<Tensor> parts = split((*qkv)(x), {channels_, channels_, channels_}, 2);
  auto heads_first = [&](const Tensor& p) {  // [B, T, C] -> [B, H, T, D]
    return transpose(reshape(p, {b, t, h, d}), 1, 2);
  };
  Tensor q = heads_first(parts[0]), k = heads_first(parts[1]), v = heads_first(parts[2]);
  Tensor y;  // [B, H, T, D]
  // [B, H, T, D] <-> the cache's position-major [T, B, H, D] (See kv_cache.h), as views.
  auto positions_first = [](const Tensor& p) { return transpose(transpose(p, 1, 2), 0, 1); };
  auto heads_first_again = [](const Tensor& p) { return transpose(transpose(p, 0, 1), 1, 2); };
  if (kv) {
    if (!kv->keys.defined() || kv->keys.size(1) != b || kv->keys.dtype() != k.dtype() ||
        kv->keys.device() != k.device()) {
      LOOM_CHECK(past == 0, "CausalSelfAttention '", full_name(), "': the cache holds ", past,
                 " positions of another batch, dtype or device; reset it for a new prompt");
      kv->keys = Tensor::empty({kv->capacity, b, h, d}, k.dtype(), k.device());
      kv->values = Tensor::empty(kv->keys.shape(), k.dtype(), k.device());
    }
    LOOM_CHECK(past >= 0 && past + t <= kv->keys.size(0), "CausalSelfAttention '", full_name(),
               "': positions ", past, " + ", t, " exceed the cache's capacity ", kv->keys.size(0));
    narrow(kv->keys, 0, past, t).copy_(positions_first(k));  // a contiguous block
    narrow(kv->values, 0, past, t).copy_(positions_first(v));
  }
  if (!kv || past == 0) {
    y = attend(q, k, v, *attn_drop);
  } else {
    Tensor keys = heads_first_again(narrow(kv->keys, 0, 0, past + t));
    Tensor values = heads_first_again(narrow(kv->values, 0, 0, past + t));
    Tensor scores = scale(matmul(q, keys, false, true), 1.0 / std::sqrt(double(d)));
    if (t > 1) scores = add(scores, causal_mask(t, q.device(), past, scores.dtype()));
    y = matmul((*attn_drop)(softmax(scores)), values);
  }
  Tensor merged = reshape(transpose(y, 1, 2), {b, t, channels_});  // [B, T, C]
  return (*resid_drop)((*proj)(merged));
}

}  // namespace loom::nn
