// loom-gpt's checkpoints (the flags of common/checkpointing.h): what the manifest records about
// the run besides its tensors, and what a resume checks against it.
//
// A resumed run continues exactly: the same model (from the checkpoint; explicit flags must
// agree), the next batch of the same data (the batch index is saved, and --batch, --seq, --data
// and --seed must agree, since they decide which tokens a batch index means), the learning rate
// of the next step (a function of the step) and the dropout masks (keyed by seed and step). The
// layout (--dp, --tp, --zero, ranks) may differ: the tensors reshard on load.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/checkpointing.h"
#include "core/io/checkpoint_manifest.h"
#include "core/nn/gpt_config.h"
#include "gpt/gpt_options.h"
#include "parallel/checkpoint/checkpoint.h"

namespace loom::gpt {

using ResumePoint = cli::ResumePoint;

// The model the checkpoint holds.
GptConfig checkpoint_config(const ResumePoint& point);

// The run's non-tensor state for the manifest: the model, the layout that saved it, the data
// position and what decides the data, the schedule and the seed.
nlohmann::json run_state(const GptConfig& config, const GptOptions& o, int world_size,
                         int64_t batch_index, const std::string& lr_schedule);

// What rank `world_rank` of the layout in `o` (--dp, --tp, --pp, --zero, the schedule, --dtype,
// --bucket-mb, --sequence-parallel) asks a checkpoint for when it resumes, worked out in this
// process without running that layout: the modules the rank builds, over planning groups
// (parallel::DeviceMesh::plan), and ZeRO's pieces of them. Throws naming what the layout cannot
// hold (heads that --tp does not divide, more stages than blocks, ...). With `whole_parameters`,
// ZeRO stages 1 and 2 ask for every parameter whole where their pieces view the whole
// parameters, as a resume does when the checkpoint is in the page cache (Note [ZeRO's
// parameters read whole when cached]); other layouts ask as without.
std::vector<parallel::checkpoint::PieceRequest> planned_load(const GptConfig& config,
                                                             const GptOptions& o, int world_rank,
                                                             const io::CheckpointManifest& manifest,
                                                             bool whole_parameters = false);

// Checks that the flags read the same data as the saved run; returns the batch index to go on
// from. Throws naming the flag that differs.
int64_t resume_batch_index(const ResumePoint& point, const GptOptions& o);

}  // namespace loom::gpt
