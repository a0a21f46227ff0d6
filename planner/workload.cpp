#include "planner/workload.h"

#include <cstdio>

#include "core/error.h"

namespace loom::planner {

double TransformerShape::layer_parameters() const {
  const double h = double(hidden);
  return 12.0 * h * h + 13.0 * h;
}

bool TransformerShape::is_moe_layer(int64_t layer) const {
  return moe.enabled() && layer % moe.every == 0;
}

int64_t TransformerShape::moe_layers() const {
  return moe.enabled() ? (layers + moe.every - 1) / moe.every : 0;
}

int64_t TransformerShape::moe_layers_in(int64_t first, int64_t count) const {
  int64_t n = 0;
  for (int64_t i = first; i < first + count; ++i) n += is_moe_layer(i);
  return n;
}

int64_t TransformerShape::expert_width() const {
  return moe.expert_hidden > 0 ? moe.expert_hidden : 4 * hidden;
}

double TransformerShape::expert_parameters() const {
  const double h = double(hidden), f = double(expert_width());
  return 2.0 * h * f + f + h;
}

double TransformerShape::moe_layer_parameters() const {
  const double h = double(hidden), e = double(moe.experts);
  return 4.0 * h * h + 8.0 * h + h * e + e * expert_parameters();
}

double TransformerShape::embedding_parameters() const {
  return double(vocab) * double(hidden) + double(seq) * double(hidden);
}

double TransformerShape::parameters() const {
  const double moes = double(moe_layers());
  return (double(layers) - moes) * layer_parameters() + moes * moe_layer_parameters() +
         embedding_parameters() + 2.0 * double(hidden);
}

double TransformerShape::layer_forward_flops() const {
  const double h = double(hidden), s = double(seq);
  return 24.0 * s * h * h + 4.0 * s * s * h;
}

double TransformerShape::moe_layer_forward_flops() const {
  const double h = double(hidden), s = double(seq), f = double(expert_width());
  return 8.0 * s * h * h + 4.0 * s * s * h + 2.0 * s * h * double(moe.experts) +
         double(moe.top_k) * 4.0 * s * h * f;
}

double TransformerShape::layers_forward_flops() const {
  const double moes = double(moe_layers());
  return (double(layers) - moes) * layer_forward_flops() + moes * moe_layer_forward_flops();
}

double TransformerShape::logits_forward_flops() const {
  return 2.0 * double(seq) * double(hidden) * double(vocab);
}

double TransformerShape::step_model_flops(int64_t sequences) const {
  return 3.0 * (layers_forward_flops() + logits_forward_flops()) * double(sequences);
}

void TransformerShape::check() const {
  LOOM_CHECK(layers > 0 && hidden > 0 && heads > 0 && seq > 0 && vocab > 0,
             "planner: the model's layers, hidden, heads, seq and vocab must be positive, got ",
             str());
  LOOM_CHECK(hidden % heads == 0, "planner: heads (", heads, ") must divide hidden (", hidden, ")");
  if (moe.experts == 0) return;
  LOOM_CHECK(moe.experts > 0 && moe.top_k >= 1 && moe.top_k <= moe.experts, "planner: MoE top_k (",
             moe.top_k, ") must be in [1, experts (", moe.experts, ")]");
  LOOM_CHECK(moe.every >= 1 && moe.expert_hidden >= 0, "planner: MoE every (", moe.every,
             ") must be >= 1 and expert_hidden (", moe.expert_hidden, ") >= 0");
}

std::string TransformerShape::str() const {
  char buf[160];
  std::snprintf(buf, sizeof buf, "layers %lld hidden %lld heads %lld seq %lld vocab %lld (%.2fB)",
                (long long)layers, (long long)hidden, (long long)heads, (long long)seq,
                (long long)vocab, parameters() / 1e9);
  if (!moe.enabled()) return buf;
  char extra[120];
  std::snprintf(extra, sizeof extra, ", moe %lld experts top-%lld every %lld width %lld",
                (long long)moe.experts, (long long)moe.top_k, (long long)moe.every,
                (long long)expert_width());
  return std::string(buf) + extra;
}

void Workload::check() const {
  model.check();
  LOOM_CHECK(global_batch > 0, "planner: the global batch must be positive, got ", global_batch);
}

}  // namespace loom::planner
