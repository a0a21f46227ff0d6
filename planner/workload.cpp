#include "planner/workload.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/error.h"

namespace loom::planner {

BlockKind parse_block(const std::string& name) {
  if (name == "gpt") return BlockKind::kGpt;
  if (name == "llama") return BlockKind::kLlama;
  LOOM_FAIL("planner: unknown block '", name, "' (gpt, llama)");
}

const char* block_name(BlockKind b) { return b == BlockKind::kGpt ? "gpt" : "llama"; }

int64_t TransformerShape::mlp_width() const { return ffn_hidden > 0 ? ffn_hidden : 4 * hidden; }

int64_t TransformerShape::key_value_heads() const { return kv_heads > 0 ? kv_heads : heads; }

double TransformerShape::kv_width() const {
  return double(hidden) * double(key_value_heads()) / double(heads);
}

int TransformerShape::mlp_matrices() const { return block == BlockKind::kLlama ? 3 : 2; }

std::vector<Matmul> TransformerShape::layer_matmuls() const {
  const double h = double(hidden), kv = kv_width(), f = double(mlp_width());
  if (block == BlockKind::kGpt) return {{h, h + 2 * kv}, {h, h, true}, {h, f}, {f, h, true}};
  return {{h, h}, {h, kv}, {h, kv}, {h, h, true}, {h, f}, {h, f}, {f, h, true}};
}

double TransformerShape::layer_matrix_parameters() const {
  double n = 0;
  for (const Matmul& mm : layer_matmuls()) n += mm.in * mm.out;
  return n;
}

double TransformerShape::layer_split_vectors() const {
  // GPT's QKV bias (h + 2 kv) and first MLP bias (f); Llama's linears have none.
  return block == BlockKind::kGpt ? double(hidden) + 2.0 * kv_width() + double(mlp_width()) : 0.0;
}

double TransformerShape::layer_whole_vectors() const {
  // GPT: two LayerNorms (4h) and the projection's and second MLP linear's biases; Llama: two
  // RMSNorm weights.
  return block == BlockKind::kGpt ? 6.0 * double(hidden) : 2.0 * double(hidden);
}

double TransformerShape::layer_parameters() const {
  return layer_matrix_parameters() + layer_split_vectors() + layer_whole_vectors();
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

double default_moe_load(double capacity_factor) {
  return capacity_factor > 0 ? std::numeric_limits<double>::infinity() : 1.0;
}

double TransformerShape::rank_expert_load(int ep, int64_t parts) const {
  const double k = double(moe.top_k);
  double most = std::min(double(moe.experts) / ep, k) * ep / k;
  if (moe.capacity_factor > 0) most = std::min(most, moe.capacity_factor * double(parts) / ep);
  return std::min(moe.load, most);
}

double TransformerShape::moe_layer_parameters() const {
  const double h = double(hidden), e = double(moe.experts);
  return 4.0 * h * h + 8.0 * h + h * e + e * expert_parameters();
}

double TransformerShape::embedding_parameters() const {
  const double positions = block == BlockKind::kGpt ? double(seq) * double(hidden) : 0.0;
  return double(vocab) * double(hidden) + positions;
}

double TransformerShape::output_parameters() const {
  return tied_output() ? 0.0 : double(vocab) * double(hidden);
}

double TransformerShape::final_norm_parameters() const {
  return block == BlockKind::kGpt ? 2.0 * double(hidden) : double(hidden);
}

double TransformerShape::parameters() const {
  const double moes = double(moe_layers());
  return (double(layers) - moes) * layer_parameters() + moes * moe_layer_parameters() +
         embedding_parameters() + output_parameters() + final_norm_parameters();
}

double TransformerShape::layer_forward_flops() const {
  const double h = double(hidden), s = double(seq);
  return 2.0 * s * layer_matrix_parameters() + 4.0 * s * s * h;
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
  LOOM_CHECK(ffn_hidden >= 0, "planner: ffn_hidden must be >= 0 (0: 4h), got ", ffn_hidden);
  LOOM_CHECK(kv_heads >= 0 && heads % key_value_heads() == 0, "planner: kv_heads (", kv_heads,
             ") must divide heads (", heads, ")");
  if (moe.experts == 0) return;
  LOOM_CHECK(block == BlockKind::kGpt && key_value_heads() == heads,
             "planner: MoE layers are modelled for the gpt block with as many key/value heads as "
             "heads, got block ",
             block_name(block), " with kv_heads ", key_value_heads());
  LOOM_CHECK(moe.experts > 0 && moe.top_k >= 1 && moe.top_k <= moe.experts, "planner: MoE top_k (",
             moe.top_k, ") must be in [1, experts (", moe.experts, ")]");
  LOOM_CHECK(moe.every >= 1 && moe.expert_hidden >= 0, "planner: MoE every (", moe.every,
             ") must be >= 1 and expert_hidden (", moe.expert_hidden, ") >= 0");
  LOOM_CHECK(moe.load >= 1.0, "planner: MoE load (", moe.load,
             ") must be >= 1: the busiest rank gets at least the balanced share of the rows");
  LOOM_CHECK(moe.capacity_factor >= 0, "planner: MoE capacity factor (", moe.capacity_factor,
             ") must be >= 0 (0: dropless)");
}

std::string TransformerShape::str() const {
  char buf[160];
  std::snprintf(buf, sizeof buf, "layers %lld hidden %lld heads %lld seq %lld vocab %lld (%.2fB)",
                (long long)layers, (long long)hidden, (long long)heads, (long long)seq,
                (long long)vocab, parameters() / 1e9);
  std::string out = buf;
  if (block != BlockKind::kGpt || ffn_hidden > 0 || kv_heads > 0) {
    char form[120];
    std::snprintf(form, sizeof form, ", %s ffn %lld kv-heads %lld", block_name(block),
                  (long long)mlp_width(), (long long)key_value_heads());
    out += form;
  }
  if (!moe.enabled()) return out;
  char extra[120];
  std::snprintf(extra, sizeof extra, ", moe %lld experts top-%lld every %lld width %lld",
                (long long)moe.experts, (long long)moe.top_k, (long long)moe.every,
                (long long)expert_width());
  out += extra;
  if (moe.load != 1.0 && std::isfinite(moe.load)) {
    std::snprintf(extra, sizeof extra, " load %.2f", moe.load);
    out += extra;
  }
  if (moe.capacity_factor > 0) {
    std::snprintf(extra, sizeof extra, " capacity %.2f", moe.capacity_factor);
    out += extra;
  }
  return out;
}

void Workload::check() const {
  model.check();
  LOOM_CHECK(global_batch > 0, "planner: the global batch must be positive, got ", global_batch);
}

}  // namespace loom::planner
