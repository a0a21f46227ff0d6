// How the runtime being planned for executes a layout: the choices that change a step's time or
// memory without changing the layout. loom's own, and Megatron-LM's as its papers describe it
// (for predicting their published runs).
#pragma once

#include <string>
#include <vector>

namespace loom::planner {

// What "selective" recomputation (Layout::recompute) means in the runtime.
//   kAttention         Korthikanti et al.'s (loom's, Megatron's): the attention's scores,
//                      softmax and context again in the backward; the linears' inputs are kept.
//   kEveryOtherMatmul  torchtitan's op-level policy (selective_ac_option "op"): the outputs of
//                      the matmuls and of the attention kernel are kept, except every second
//                      matmul; those and every element-wise op are recomputed (Note
//                      [Recomputing every other matmul] in memory_model.cpp).
//   kEveryOtherLayer   torchtitan's layer-level policy with frequency 2: every second layer
//                      fully recomputed, the others not at all.
enum class SelectivePolicy { kAttention, kEveryOtherMatmul, kEveryOtherLayer };

// A collective over a group with L of its ranks in each of N > 1 nodes:
//   kOneRing    one ring on its slowest hop: one GPU's link between nodes.
//   kTwoLevels  loom's LOOM_COLL_ALGO=auto (collectives/algorithm.cpp): one ring, or two levels
//               (inside the node, then across nodes over 1/L of the bytes) where those are
//               20% faster.
//   kNicRings   NCCL's rings: one ring channel per NIC, each crossing between nodes on its own
//               GPU's link, so the ring runs at the node's L links together (or NVLink's rate,
//               if slower) with one ring's 2 (n - 1) / n traffic. Two levels cross with
//               2 (N - 1) / N of the bytes over those links: the same for many nodes, 1.9 times
//               less over 2.
enum class SpanningCollectives { kOneRing, kTwoLevels, kNicRings };

struct Execution {
  std::string name;
  double param_bytes = 2.0;       // bf16 weights
  double grad_bytes = 2.0;        // gradient buffer per parameter (Megatron: f32, 4)
  double optimizer_bytes = 12.0;  // f32 master + Adam's two moments
  // What the forward stores for the backward: activations of this many bytes per element, and
  // dropout masks of mask_bytes (0: loom's counter-based dropout regenerates them).
  double activation_bytes = 2.0;
  double mask_bytes = 0.0;
  // The logits and their gradient, per element: f32 where the runtime upcasts them for the loss
  // (Megatron, torchtitan); loom keeps them in the model's dtype (its cross-entropy kernels read
  // bf16 logits and compute in f32), so its bf16 "loom" preset holds 2 bytes.
  double logits_bytes = 4.0;
  // Data-parallel gradient reductions overlap the last micro-batch's backward (loom's buckets
  // launch as they fill); without it they all follow the last backward.
  bool overlap_grad_reduce = true;
  // Collectives progress while the rank computes (a GPU's copy engines and NCCL's kernels beside
  // the compute stream). A CPU rank on one thread either computes or communicates: nothing hides.
  bool comm_overlaps_compute = true;
  double bucket_bytes = 25.0 * 1024 * 1024;
  // Pipeline sends of a tp group carry 1/tp of the activation each and all-gather it inside the
  // receiving node (Narayanan et al.'s scatter/gather optimisation).
  bool scatter_gather_p2p = false;
  // How a collective over a group spanning nodes runs (SpanningCollectives).
  SpanningCollectives spanning = SpanningCollectives::kTwoLevels;
  // The attention keeps its scores for the backward (5 a s^2 b bytes per layer, Korthikanti et
  // al.'s count): true for Megatron's 2021-22 kernels. loom's attention (CPU and CUDA, the flash
  // kernels and the GEMM path alike) keeps only its output and the log-sum-exps and recomputes
  // the scores in the backward (planner/memory_model.cpp).
  bool materialised_scores = false;
  // Under sequence parallelism the column-parallel linears keep their input's shard and gather
  // it again in the backward for their weight gradients (loom's Note [Sequence-parallel linears
  // keep their shard], as Megatron's), one all-reduce's worth more traffic per layer. Megatron
  // overlaps it with the input gradient's GEMM; loom waits for it.
  bool sp_regather_exposed = true;
  // A MoE model with a load-balancing loss (MoeShape::balance_loss), trained in micro-batches
  // (gradient accumulation, or a pipeline), first routes the whole batch: a forward of every
  // micro-batch without gradients (loom's Note [A batch in micro-batches]), before the training
  // pass. Megatron weighs each micro-batch's own balance instead: no such pass.
  bool moe_routing_pass = true;
  SelectivePolicy selective = SelectivePolicy::kAttention;
  // The pipeline schedules the runtime runs (parallel/pipeline/generators.h's names): the search
  // offers no other, and evaluate refuses one (a prediction for a runtime that cannot run it).
  std::vector<std::string> schedules = {"gpipe", "1f1b", "interleaved", "chimera"};
};

// Why the runtime cannot pipeline with `schedule` ("" when it can).
std::string schedule_problem(const Execution& e, const std::string& schedule);

// "loom" (bf16 with f32 masters), "loom-f32" (f32 throughout), "loom-cpu" (f32, CPU ranks: no
// overlap of collectives with compute), "megatron", "torchtitan" (FSDP2 in bf16 with f32
// gradient reduction, its op-level selective recomputation) or "torchtitan-layer-sac" (the same
// with every second layer recomputed); an unknown name lists them.
Execution execution_preset(const std::string& name);

}  // namespace loom::planner
