// loom-gpt --plan auto: the planner (planner/) chooses dp, tp, pp, the schedule and its virtual
// stages, the micro-batches, the ZeRO stage, recomputation and sequence parallelism for the ranks
// launched, among the layouts loom-gpt can run, and writes them into the options before the mesh
// is built. The machine's rates come from --plan-profile (a `loom-plan --calibrate` file) or,
// without one, from calibrating here first (every rank takes part, a few seconds).
#pragma once

#include <memory>
#include <string>

#include "collectives/communicator.h"
#include "core/device.h"
#include "core/nn/gpt_config.h"
#include "gpt/gpt_options.h"
#include "planner/evaluate.h"

namespace loom::gpt {

// Why loom-gpt cannot run `layout` with the options' dtype and device ("" when it can): pipelines
// run on the CPU (f32, bf16 or f16, every ZeRO stage); recomputation is full or none
// (--checkpoint-activations, with every dp, tp and pp); the planner's selective recomputation is
// not loom-gpt's.
std::string unsupported_by_loom_gpt(const planner::Layout& layout, const GptOptions& o,
                                    const Device& device);

// Chooses the layout (See above), prints it with its prediction and the runners-up, and sets
// o.dp, tp, pp, schedule, virtual_stages, microbatches, grad_accum, zero, sequence_parallel and
// checkpoint_activations (and for a MoE model o.ep; the experts stay whole over tp). Refuses
// explicit layout flags beside --plan auto, naming them. Every rank calls it.
void plan_layout(GptOptions& o, const GptConfig& config,
                 const std::shared_ptr<comm::Communicator>& world, const Device& device);

}  // namespace loom::gpt
