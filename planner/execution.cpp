#include "planner/execution.h"

#include <algorithm>

#include "core/error.h"

namespace loom::planner {

Execution execution_preset(const std::string& name) {
  Execution e;
  e.name = name;
  if (name == "loom") {
    // MixedPrecisionOptimizer / ZeRO in bf16: gradients in the parameters' dtype, f32 masters;
    // GradReducer's buckets overlap the backward; point-to-point sends carry whole activations.
    e.logits_bytes = e.activation_bytes;
    return e;
  }
  if (name == "loom-f32") {  // f32 training: weights, gradients, Adam's two moments, no masters
    e.param_bytes = 4.0;
    e.grad_bytes = 4.0;
    e.optimizer_bytes = 8.0;
    e.activation_bytes = 4.0;
    return e;
  }
  if (name == "loom-cpu") {
    e = execution_preset("loom-f32");
    e.name = name;
    e.overlap_grad_reduce = false;
    e.comm_overlaps_compute = false;
    return e;
  }
  if (name == "megatron") {
    // Narayanan et al. (SC'21) and Korthikanti et al. (2022): f32 gradient accumulation buffers,
    // the data-parallel all-reduce after the backward, scatter/gather pipeline sends.
    e.grad_bytes = 4.0;
    e.mask_bytes = 1.0;  // Korthikanti et al.'s count: 1-byte dropout masks
    e.overlap_grad_reduce = false;
    e.scatter_gather_p2p = true;
    e.materialised_scores = true;  // their 2021-22 attention (no FlashAttention)
    e.sp_regather_exposed = false;
    e.moe_routing_pass = false;
    e.spanning = SpanningCollectives::kNicRings;
    e.schedules = {"1f1b", "interleaved"};  // its two pipelined forward-backward functions
    return e;
  }
  if (name == "torchtitan" || name == "torchtitan-layer-sac") {
    // torchtitan's Llama training as its published runs were made (FSDP2, no float8, no
    // torch.compile): bf16 weights gathered for compute, f32 sharded weights and Adam moments,
    // gradients reduce-scattered in f32; FSDP2 prefetches the next block's gather and overlaps
    // the reduce-scatters with the backward; SDPA's flash attention; no dropout. Across nodes
    // NCCL runs one ring channel per NIC, so a node's crossing traffic spreads over all of its
    // GPUs' links (kNicRings), not one ring on one GPU's link (which predicted Llama 2 70B on 64
    // A100s 47% slow).
    e.grad_bytes = 4.0;
    e.spanning = SpanningCollectives::kNicRings;
    e.moe_routing_pass = false;
    e.selective = name == "torchtitan" ? SelectivePolicy::kEveryOtherMatmul
                                       : SelectivePolicy::kEveryOtherLayer;
    e.schedules = {"gpipe", "1f1b", "interleaved"};  // torch.distributed.pipelining's, no Chimera
    return e;
  }
  LOOM_FAIL("planner: unknown execution '", name,
            "' (loom, loom-f32, loom-cpu, megatron, torchtitan, torchtitan-layer-sac)");
}

std::string schedule_problem(const Execution& e, const std::string& schedule) {
  if (std::find(e.schedules.begin(), e.schedules.end(), schedule) != e.schedules.end()) return "";
  std::string runs;
  for (const std::string& s : e.schedules) runs += (runs.empty() ? "" : ", ") + s;
  return "the " + e.name + " execution has no '" + schedule + "' pipeline schedule (it runs " +
         runs + ")";
}

}  // namespace loom::planner
