// What the planner plans for: a decoder-only transformer trained on a global batch of sequences,
// in one of two block forms (BlockKind): GPT's (Megatron's and loom-gpt's block: attention with
// QKV and output projections, a 4h GELU MLP, two LayerNorms, learned positions, the output layer
// tied to the embedding) or Llama's (for predicting published Llama runs, torchtitan's).
//
// Counts follow Narayanan et al. (SC'21, "Efficient Large-Scale Language Model Training on GPU
// Clusters Using Megatron-LM"), section 5.1: a layer holds 12h^2 + 13h parameters, and one
// sequence's forward costs 24 s h^2 + 4 s^2 h FLOPs per layer (QKV 6sh^2, scores and context
// 4s^2h, projection 2sh^2, MLP 16sh^2) plus 2 s h V for the logits. A training step is three
// forwards' worth (the backward costs two), which gives their model-FLOPs formula
// 72 B s l h^2 (1 + s/6h + V/12lh). In general (any MLP width f, grouped-query attention with
// kv of the h query columns for keys and values, a gated MLP's third matrix) a layer's forward
// is 2 s (its weight elements) + 4 s^2 h, the count torchtitan's and Megatron's MFU use.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::planner {

// Mixture-of-experts blocks (loom-gpt's --moe-*, core/nn/moe.h): block i's MLP is `experts`
// MLPs of width f (expert_hidden, 0: 4h) behind a router (h x experts, no bias) that sends each
// token to top_k of them, when i % every == 0. Routing is balanced unless `load` says otherwise
// (TransformerShape::rank_expert_load).
struct MoeShape {
  int64_t experts = 0;  // 0: a dense model
  int64_t top_k = 1;
  int64_t every = 1;
  int64_t expert_hidden = 0;
  // A load-balancing loss over the whole batch (loom-gpt's --moe-aux-loss > 0, its default): with
  // micro-batches loom routes the batch once without gradients first (Execution::
  // moe_routing_pass).
  bool balance_loss = true;
  // The busiest rank's routed rows as a multiple of the balanced share (>= 1; 1: balanced;
  // infinity: as many as routing and the capacity allow). A router does not balance perfectly,
  // and the slowest rank sets an all-to-all's pace and the largest expert activations.
  double load = 1.0;
  // loom-gpt's --moe-capacity-factor (0: dropless): each expert takes at most c times its share
  // of the whole batch's rows, which bounds the load (TransformerShape::rank_expert_load).
  double capacity_factor = 0;

  bool enabled() const { return experts > 0; }
};

// MoeShape::load when none is given: with a capacity factor, as many rows as it lets through
// (infinity: rank_expert_load's bound), the plan's worst case; dropless, balanced (1).
double default_moe_load(double capacity_factor);

// The block's form.
//   kGpt    LayerNorms, a bias on every linear, a GELU MLP of two h x f matrices, a learned
//           position table, the output layer tied to the token embedding (GPT-2/3, Megatron's
//           GPT, loom-gpt).
//   kLlama  RMSNorms, no biases, a SwiGLU MLP of three h x f matrices (W2 (silu(x W1) * x W3)),
//           rotary positions (no table), an output layer of its own (Llama 2 and 3).
enum class BlockKind { kGpt, kLlama };
BlockKind parse_block(const std::string& name);  // "gpt" or "llama"; else names both
const char* block_name(BlockKind b);

// One of a layer's matmuls, per token: `in` columns to `out`. Row-parallel ones (the attention's
// output projection, the MLP's last) give each tp rank whole `out`-wide partial sums; the others
// are column-parallel, `out / tp` wide.
struct Matmul {
  double in = 0, out = 0;
  bool row_parallel = false;
};

struct TransformerShape {
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t seq = 0;
  int64_t vocab = 0;
  MoeShape moe;
  BlockKind block = BlockKind::kGpt;
  int64_t ffn_hidden = 0;  // f: the MLP's width (0: 4h)
  int64_t kv_heads = 0;    // grouped-query attention's key/value heads (0: heads)

  int64_t mlp_width() const;        // f
  int64_t key_value_heads() const;  // kv_heads, or heads
  double kv_width() const;          // h kv_heads / heads: the columns of K and of V
  int mlp_matrices() const;         // 2, or 3 for the gated MLP
  // A dense layer's matmuls in the order its forward runs them: GPT's fused QKV, projection, MLP
  // in and out; Llama's Q, K, V, output, W1, W3, W2 (as torchtitan's block issues them).
  std::vector<Matmul> layer_matmuls() const;
  // One dense layer's weight matrices (2 h^2 + 2 h kv + mlp_matrices h f: QKV, the output
  // projection and the MLP) and its vectors: those tp splits with the matrices (the QKV and
  // first MLP biases) and those every tp rank holds whole (norms, the other biases).
  double layer_matrix_parameters() const;
  double layer_split_vectors() const;
  double layer_whole_vectors() const;
  bool tied_output() const { return block == BlockKind::kGpt; }
  double layer_parameters() const;         // a dense layer: 12h^2 + 13h for GPT's
  bool is_moe_layer(int64_t layer) const;  // layer (0-based) has a MoE MLP
  int64_t moe_layers() const;              // how many do
  // How many of layers [first, first + count) have a MoE MLP (a pipeline stage's).
  int64_t moe_layers_in(int64_t first, int64_t count) const;
  int64_t expert_width() const;      // f: expert_hidden, or 4h
  double expert_parameters() const;  // one expert: 2hf + f + h
  // The busiest rank's expert rows in one forward, as a multiple of the balanced top_k rows per
  // token, with the experts split over ep ranks and the batch in `parts` (dp ranks' micro-batches:
  // dp x micro-batches per step): moe.load, but at most what routing can send one rank (a token
  // sends it at most min(experts / ep, top_k) of its rows, from each of ep ranks' tokens: 1 when
  // ep is 1, where every row is local) and, with a capacity factor c, what the capacity lets
  // through: its experts' c times their share of the whole batch's rows (loom counts capacity
  // over the batch, Note [A batch in micro-batches] in core/nn/moe.h), all of which one forward
  // of its ep group may bring, c parts / ep.
  double rank_expert_load(int ep, int64_t parts) const;
  // A MoE layer: attention and LayerNorms 4h^2 + 8h, the router h E, E experts.
  double moe_layer_parameters() const;
  double embedding_parameters() const;   // V h + s h (token and position tables; Llama: V h)
  double output_parameters() const;      // an untied output layer's V h (0 when tied)
  double final_norm_parameters() const;  // 2h (LayerNorm) or h (RMSNorm)
  // Every layer, the embeddings, the output layer, the final norm.
  double parameters() const;
  // One sequence's forward through one dense layer: 2 s layer_matrix_parameters + 4 s^2 h
  // (24 s h^2 + 4 s^2 h for GPT's).
  double layer_forward_flops() const;
  // Through one MoE layer: the attention's 8 s h^2 + 4 s^2 h, the router's 2 s h E and top_k
  // experts' 4 s h f per token.
  double moe_layer_forward_flops() const;
  // Every layer's forward, dense and MoE, for one sequence.
  double layers_forward_flops() const;
  double logits_forward_flops() const;  // 2 s h V
  // Model FLOPs of one training step on `sequences` sequences (forward + backward, no
  // recomputation): 3 * (layers_forward_flops + logits_forward_flops) * sequences (a MoE layer
  // counts the FLOPs of the experts a token goes through, not of all of them).
  double step_model_flops(int64_t sequences) const;
  // Throws loom::Error naming the field for a non-positive size or heads not dividing hidden,
  // kv_heads not dividing heads, or MoE fields out of range (top_k in [1, experts], every >= 1,
  // expert_hidden >= 0, load >= 1, capacity_factor >= 0); MoE layers are modelled for GPT's block
  // with whole attention only.
  void check() const;
  // "layers 96 hidden 12288 heads 96 seq 2048 vocab 51200 (174.6B)", with ", llama ffn 14336
  // kv-heads 8" for a Llama block and ", moe 8 experts top-2 every 2 width 4096" for a MoE model
  // (" load 1.25" after it when routing is not balanced, " capacity 1.25" with a capacity).
  std::string str() const;
};

struct Workload {
  TransformerShape model;
  int64_t global_batch = 0;  // sequences per optimizer step
  void check() const;
};

}  // namespace loom::planner
