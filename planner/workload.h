// What the planner plans for: a GPT-style decoder (Megatron's and loom-gpt's block: attention
// with QKV and output projections, a 4h GELU MLP, two LayerNorms, learned positions, the output
// layer tied to the embedding) trained on a global batch of sequences.
//
// Counts follow Narayanan et al. (SC'21, "Efficient Large-Scale Language Model Training on GPU
// Clusters Using Megatron-LM"), section 5.1: a layer holds 12h^2 + 13h parameters, and one
// sequence's forward costs 24 s h^2 + 4 s^2 h FLOPs per layer (QKV 6sh^2, scores and context
// 4s^2h, projection 2sh^2, MLP 16sh^2) plus 2 s h V for the logits. A training step is three
// forwards' worth (the backward costs two), which gives their model-FLOPs formula
// 72 B s l h^2 (1 + s/6h + V/12lh).
#pragma once

#include <cstdint>
#include <string>

namespace loom::planner {

struct TransformerShape {
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t seq = 0;
  int64_t vocab = 0;

  double layer_parameters() const;      // 12h^2 + 13h
  double embedding_parameters() const;  // V h + s h (token and position tables)
  double parameters() const;            // every layer, the embeddings, the final LayerNorm
  // One sequence's forward through one layer: 24 s h^2 + 4 s^2 h.
  double layer_forward_flops() const;
  double logits_forward_flops() const;  // 2 s h V
  // Model FLOPs of one training step on `sequences` sequences (forward + backward, no
  // recomputation): 3 * (layers * layer_forward_flops + logits_forward_flops) * sequences.
  double step_model_flops(int64_t sequences) const;
  // Throws loom::Error naming the field for a non-positive size or heads not dividing hidden.
  void check() const;
  std::string str() const;  // "layers 96 hidden 12288 heads 96 seq 2048 vocab 51200 (174.6B)"
};

struct Workload {
  TransformerShape model;
  int64_t global_batch = 0;  // sequences per optimizer step
  void check() const;
};

}  // namespace loom::planner
