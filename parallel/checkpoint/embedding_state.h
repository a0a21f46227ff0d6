// Embedding-bag tables as checkpoint pieces (parallel/checkpoint/checkpoint.h): each table is one
// global tensor whatever its placement, and so is each tensor of the optimizer that trains it, so
// a checkpoint saved by one placement loads into any other, and into one process.
//
//   model.<table>.weight               [rows, dim]   the table (its parameter's name, as in
//                                                     nn::EmbeddingBagCollection::state_dict)
//   optim.<table>.weight.momentum1     [rows]        fused row-wise Adagrad: the accumulators
//   optim.<table>.weight.exp_avg       [rows, dim]   fused Adam: m
//   optim.<table>.weight.exp_avg_sq    [rows, dim]   fused Adam: v
//   state["embedding_optimizer"]       {"kind": "adam", "updates": 12}
// or, for tables trained by a loom optimizer on dense gradients, that optimizer's state as
// training_state.h names it (optim.<table>.weight.exp_avg, state["optimizer_steps"]), with
// state["embedding_optimizer"] = {"kind": "dense"}.
//
// Where a rank's pieces sit (parallel::ShardedEmbeddingBagCollection::local_parts): table-wise,
// the whole table on its owner; row-wise, the rank's block of rows; column-wise, its block of
// columns; data-parallel, the whole table on every rank (save writes it once). Optimizer state
// has its weight's box; row-wise Adagrad's accumulators that of the rows (column-wise parts each
// hold the whole rows' accumulators, the same on every rank: See Note [Sharded fused optimizers]).
//
//   checkpoint::EmbeddingState tables(sharded);     // or nn::EmbeddingBagCollection, or
//                                                   // (tables, &dense_optimizer)
//   auto pieces = tables.save_pieces(state);        // snapshots
//   tables.load(path, manifest, *world);            // into the live tables and state
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/nn/embedding_bag_collection.h"
#include "optimizer/optimizer.h"
#include "parallel/checkpoint/checkpoint.h"
#include "parallel/checkpoint/training_state.h"
#include "parallel/sharded_embedding.h"

namespace loom::parallel::checkpoint {

// The name state["embedding_optimizer"]["kind"] records: "sgd", "rowwise_adagrad", "adam", or
// "dense" for kNone (a loom optimizer on dense gradients).
const char* embedding_optimizer_name(EmbeddingOptimizer kind);

class EmbeddingState {
 public:
  // The tables of one process, or this rank's parts of sharded ones. `dense`: the optimizer over
  // the module's parameters when the tables have no fused optimizer (null: save and load the
  // tables alone). The module (and optimizer) must outlive this object.
  explicit EmbeddingState(nn::EmbeddingBagCollection& tables, optim::Optimizer* dense = nullptr);
  explicit EmbeddingState(ShardedEmbeddingBagCollection& tables, optim::Optimizer* dense = nullptr);

  // The pieces and per-rank state to save (snapshots). The tables alone (no optimizer) record
  // no state["embedding_optimizer"], and their load checks none.
  std::vector<StatePiece> save_pieces(nlohmann::json& state) const;
  // Loads a checkpoint (saved by any placement) into the live tables and optimizer state. Throws
  // naming the checkpoint when its tables were trained by another optimizer. Collective over
  // `group`.
  void load(const std::string& path, const io::CheckpointManifest& manifest,
            comm::Communicator& group);

  // One table's part held here: views of the live tensors (See ShardedEmbeddingBagCollection's
  // EmbeddingTablePart).
  struct Part {
    std::string name;  // the parameter: "<table>.weight"
    Shape shape;       // the whole table's [rows, dim]
    int64_t row_start = 0, rows = 0, col_start = 0, cols = 0;
    Tensor weight, momentum1, momentum2;
  };

 private:
  std::vector<StatePiece> pieces(bool snapshot) const;
  std::vector<ParamPlace> places(const std::vector<Part>& parts) const;

  std::function<std::vector<Part>()> parts_;  // taken afresh each time: the tables may move
  EmbeddingOptimizer fused_;
  std::function<int64_t()> fused_updates_;
  std::function<void(int64_t)> set_fused_updates_;
  optim::Optimizer* dense_;
};

}  // namespace loom::parallel::checkpoint
