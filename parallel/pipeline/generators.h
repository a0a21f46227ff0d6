// The published pipeline schedules, built as data (See schedule.h): each generator decides the
// order of the compute actions (F, B) on every rank; one rule then adds the messages and the
// gradient sync. See Note [Placing sends and receives] in generators.cpp.
//
//   gpipe        all forwards, then all backwards in reverse micro-batch order (GPipe's figure).
//   1f1b         PipeDream-Flush as in Megatron-LM: rank r runs min(p - r - 1, m) forwards, then
//                alternates one forward and one backward, then drains the backwards.
//   interleaved  Megatron-LM's interleaved 1F1B: micro-batches go through the v chunks in groups
//                of p; (p - r - 1) * 2 + (v - 1) * p warm-up forwards.
//   chimera      Li & Hoefler (SC'21): a down and an up pipeline on the same ranks, each running
//                half of every group of p micro-batches; groups are concatenated.
//
// Every generated schedule passes check_well_formed, and the validator (validator.h) completes it.
#pragma once

#include <string>

#include "parallel/pipeline/schedule.h"

namespace loom::parallel::pipeline {

// Each throws loom::Error naming the problem for bad arguments (ranks < 1, microbatches < 1,
// interleaved: virtual_stages < 1 or microbatches not a multiple of ranks (Megatron's rule),
// chimera: an odd number of ranks (= stages) or of microbatches).
Schedule gpipe(int ranks, int microbatches);
// PipeDream-Flush / Megatron 1F1B.
Schedule one_f_one_b(int ranks, int microbatches);
// Megatron interleaved 1F1B; virtual_stages: chunks per rank.
Schedule interleaved(int ranks, int microbatches, int virtual_stages);
// Li & Hoefler, SC'21.
Schedule chimera(int ranks, int microbatches);

// By name: "gpipe", "1f1b", "interleaved", "chimera" (an unknown name lists the choices);
// virtual_stages other than 1 only for "interleaved".
Schedule make_schedule(const std::string& name, int ranks, int microbatches,
                       int virtual_stages = 1);

}  // namespace loom::parallel::pipeline
