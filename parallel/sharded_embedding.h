// ShardedEmbeddingBagCollection: the tables of an nn::EmbeddingBagCollection spread over a group,
// each with its own placement (TorchRec's table-, row-, column-wise and data-parallel sharding).
// Every rank gives its own batch of B bags per table (the same B on every rank) in the usual CSR
// feature-major form and gets back [B, total_dim]: what one EmbeddingBagCollection with the same
// tables would give for those bags.
//
//   parallel::ShardedEmbeddingBagCollection ebc(
//       {{"user", 1000, 16}, {"item", 5000, 32}, {"country", 200, 16}},
//       {{EmbeddingSharding::kRow}, {EmbeddingSharding::kTable}, {EmbeddingSharding::kData}},
//       world);
//   ebc.init_parameters(seed);       // each shard: its slice of the single-process init
//   Tensor pooled = ebc.lookup(indices, offsets);   // [B, 64], this rank's bags
//   loss.backward();                 // the loss: the mean over this rank's batch
//   ebc.finish_gradients();          // averages the data-parallel tables' gradients
//   opt.step();                      // any loom optimizer over ebc.parameters()
//
// Placements, and what one lookup communicates over the group (W ranks, B bags per table):
//   kTable   the whole table on one rank (given, or by a greedy balance of rows * dim)
//   kRow     rows in contiguous blocks of ceil(rows / W), rank j the j-th (maybe empty) block
//   kColumn  dim in W equal parts, each a multiple of 4 (else an error at construction)
//   kData    replicated; looked up locally, gradients averaged by finish_gradients()
//   forward:  all_to_all of 2 i64 per peer (B and the index count: the split sizes), then one
//             all_to_all(v) of each owner's lengths and indices (and one of the per-sample
//             weights when given); the owners look up all ranks' bags in one embedding_bag call;
//             the pooled [B, w] blocks of table/column shards go back by all_to_all(v), row
//             shards' partial sums [W, B, sum of row-wise dims] by one reduce_scatter.
//   backward: the reverse: output gradients to the owners by all_to_all(v) (table/column) and
//             all_gather (row-wise); the owners' embedding_bag backward gives dense gradients.
// Mean pooling: every shard pools with sum and the requesting rank divides by the bag's global
// length at the end, so mean is exact under row-wise sharding too.
//
// Note [Sharded embedding gradient scale]
// Each rank's loss is the mean over its own batch, as with DistributedDataParallel, which then
// averages the dense gradients over the group so they are those of the global-batch mean. A
// sharded table receives, in its owner's backward, the gradients of every rank's bags, i.e. the
// sum over ranks of the per-rank-mean gradients = W times the gradient of the global mean. So
// the output gradients are scaled by 1/W before they are sent to the owners; data-parallel
// tables get their local gradient in backward and finish_gradients() averages it (like DDP).
// Then every table's gradient is that of the single-process run on the concatenated batches.
//
// Limits: CPU tensors; f32 tables; pooling sum or mean; bounds-check mode error only; no fused
// optimizer; per-sample weights are distributed but get no gradient.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "core/embedding_bag.h"
#include "core/nn/embedding_bag_collection.h"
#include "core/nn/module.h"

namespace loom::parallel {

enum class EmbeddingSharding : uint8_t { kTable, kRow, kColumn, kData };
const char* embedding_sharding_name(EmbeddingSharding kind);  // "table", "row", ...
// The kind named "table", "row", "column" or "data"; anything else is an error naming them.
EmbeddingSharding parse_embedding_sharding(const std::string& name);

struct EmbeddingPlacement {
  EmbeddingSharding kind = EmbeddingSharding::kTable;
  int rank = -1;  // kTable: the owning rank; -1: chosen by the greedy balance
};

// Tables with fewer rows are replicated under `auto` placement: exchanging their lookups would
// cost more than their memory.
constexpr int64_t kAutoReplicateBelow = 100;

// One placement per table of `rows`: `sharding` ("table", "row", "column" or "data") for every
// table alike, or "auto" (tables under kAutoReplicateBelow rows replicated, the others whole on
// the least-loaded rank). loom-dlrm's --sharding.
std::vector<EmbeddingPlacement> embedding_placements(const std::string& sharding,
                                                     const std::vector<int64_t>& rows);

struct ShardedEmbeddingOptions {
  EmbeddingPooling pooling = EmbeddingPooling::kSum;  // kSum or kMean
};

// One piece of a table that lives on one rank (kTable, kRow, kColumn; data-parallel tables have
// none): rows [row_start, row_start + rows) and columns [col_start, col_start + cols).
struct EmbeddingShard {
  int64_t table = 0;
  EmbeddingSharding kind = EmbeddingSharding::kTable;
  int owner = 0;
  int64_t row_start = 0, rows = 0;
  int64_t col_start = 0, cols = 0;
};

namespace detail {
struct ShardingTopology;
}

class ShardedEmbeddingBagCollection : public nn::Module {
 public:
  // One placement per table. Not collective: every rank derives the same shards from the
  // arguments, which must therefore be the same on every rank.
  ShardedEmbeddingBagCollection(std::vector<nn::EmbeddingTableConfig> tables,
                                std::vector<EmbeddingPlacement> placements,
                                std::shared_ptr<comm::Communicator> group,
                                ShardedEmbeddingOptions options = {});
  ~ShardedEmbeddingBagCollection() override;

  // Collective over the group (every rank calls it, in the same order as its other
  // collectives); so is the backward of its output. indices / offsets: this rank's B bags per
  // table, CSR feature-major over all tables (See core/embedding_bag.h). Returns [B, total_dim].
  Tensor lookup(const Tensor& indices, const Tensor& offsets,
                const Tensor& per_sample_weights = Tensor());

  // After backward, before the optimizer step: averages the data-parallel tables' gradients over
  // the group (See Note [Sharded embedding gradient scale]). Collective; does nothing without
  // data-parallel tables.
  void finish_gradients();

  const std::vector<nn::EmbeddingTableConfig>& tables() const;
  // The placements with every kTable owner resolved.
  const std::vector<EmbeddingPlacement>& placements() const;
  // Every rank's non-empty shards, in table order.
  const std::vector<EmbeddingShard>& shards() const;
  comm::Communicator& group() const { return *group_; }

 private:
  std::shared_ptr<comm::Communicator> group_;
  std::shared_ptr<const detail::ShardingTopology> topo_;
  ShardedEmbeddingOptions options_;
  std::vector<Tensor> shard_weights_;  // this rank's shards, in table order: [rows, cols] each
  std::vector<Tensor> data_weights_;   // the data-parallel tables, in table order
  // A leaf that always requires grad and is an input of the output's exchange, so that every
  // rank records it and runs its backward collectives, with or without shards of its own.
  Tensor anchor_;
};

}  // namespace loom::parallel
