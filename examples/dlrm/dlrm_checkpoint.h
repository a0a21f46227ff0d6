// loom-dlrm's checkpoints (--checkpoint-dir, --save-every, --keep-last, --resume, --resume-from;
// common/checkpointing.h): what the manifest records about the run besides its tensors, and what
// a resume checks against it.
//
// A resumed run continues exactly: the same model (its dims from the checkpoint; an explicit
// --dim must agree), the same data (--seed and --max-bag decide every example), the next
// training example (the position is a count of examples, so it is exact whatever --batch the
// resumed run uses) and the same optimizers (--embedding-optimizer must agree). The layout (ranks,
// --sharding) may differ: the tables and their optimizer state reshard on load
// (parallel/checkpoint/embedding_state.h).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/checkpointing.h"
#include "dlrm/dlrm_model.h"
#include "parallel/sharded_embedding.h"

namespace loom::dlrm {

// What decides the run: the model, the data, the optimizers and the layout.
struct DlrmRun {
  DlrmConfig config;
  std::vector<int64_t> table_rows;
  uint64_t seed = 0;
  int64_t batch = 0, max_bag = 0, steps = 0;
  double lr = 0, embedding_lr = 0;
  std::string embedding_optimizer;  // --embedding-optimizer
  int world_size = 1;
  std::string sharding;                                  // --sharding (under mpirun)
  std::vector<parallel::EmbeddingPlacement> placements;  // resolved; empty on one process
};

// The run's non-tensor state for the manifest; `next_example` is the first training example the
// next step reads.
nlohmann::json run_state(const DlrmRun& run, int64_t next_example);

// The embedding dim of the checkpoint's model. Throws when an explicit --dim (`dim_set`) differs.
int64_t checkpoint_dim(const cli::ResumePoint& point, int64_t dim, bool dim_set);

// Checks that `run` has the checkpoint's model, data and optimizers; returns the training example
// to go on from. Throws naming the flag that differs.
int64_t resume_position(const cli::ResumePoint& point, const DlrmRun& run);

}  // namespace loom::dlrm
