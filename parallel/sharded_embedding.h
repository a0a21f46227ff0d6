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
// Note [Sharded fused optimizers]
// With ShardedEmbeddingOptions::fused the tables train as nn::EmbeddingBagCollection's do with
// one: the backward applies SGD, row-wise Adagrad or Adam to the looked-up rows in place and the
// tables get no gradient (finish_gradients() then has nothing to do). Each update is the
// single-process one on the global batch:
//   table/row/column shards  the owner's embedding_bag backward already sees every rank's bags
//                            (gradients scaled by 1/W), so the kernel's fused backward updates
//                            the shard: every row's reduced gradient is the single-process one.
//   column + row-wise Adagrad  a row's accumulator grows by the mean of g*g over the whole row,
//                            whose columns lie on every rank: each owner sums g*g over its
//                            columns of each looked-up row, the sums are all-gathered and added
//                            in rank order (the same bits on every rank), and each owner applies
//                            the update to its columns. The accumulator [rows] is replicated.
//   data-parallel            while gradients are recorded, the ranks all-gather the data tables'
//                            bags (lengths, indices, weights) and each looks up all W*B of them
//                            with the fused optimizer; in backward the output gradients are
//                            all-gathered, so every rank applies the same update of the global
//                            batch to its replica. (Without gradients, lookups stay local.)
// Adam's step counts the backwards (fused_updates()).
//
// Limits: CPU tensors; f32 tables; pooling sum or mean; bounds-check mode error only;
// per-sample weights are distributed but get no gradient.
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
  // kNone: the tables get dense gradients, for any loom optimizer over parameters(). Otherwise
  // the backward updates them in place with these hyper-parameters (See Note [Sharded fused
  // optimizers]) and they get no gradient.
  kernels::EmbeddingOptimizerHyper fused;
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

// This rank's part of one table as it trains: views of the live tensors (writing them changes the
// module), for checkpoints and tests. A data-parallel table is one whole part on every rank.
struct EmbeddingTablePart {
  int64_t table = 0;
  EmbeddingSharding kind = EmbeddingSharding::kTable;
  int64_t row_start = 0, rows = 0;  // the box of the [rows, dim] table this part is
  int64_t col_start = 0, cols = 0;
  Tensor weight;  // [rows, cols], the parameter
  // The fused optimizer's f32 state of this part (undefined without one, or for SGD):
  Tensor momentum1;  // row-wise Adagrad: [rows], the accumulators of the part's rows (of whole
                     // rows: column parts hold the same values); Adam: m [rows, cols]
  Tensor momentum2;  // Adam: v [rows, cols]
};

namespace detail {
struct ShardingTopology;
struct LocalTables;
}  // namespace detail

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
  // data-parallel tables or with a fused optimizer.
  void finish_gradients();

  const std::vector<nn::EmbeddingTableConfig>& tables() const;
  // The placements with every kTable owner resolved.
  const std::vector<EmbeddingPlacement>& placements() const;
  // Every rank's non-empty shards, in table order.
  const std::vector<EmbeddingShard>& shards() const;
  comm::Communicator& group() const { return *group_; }

  // This rank's parts of the tables, in table order (at most one per table).
  std::vector<EmbeddingTablePart> local_parts() const;
  // The fused optimizer (kind kNone without one).
  const kernels::EmbeddingOptimizerHyper& fused_optimizer() const { return options_.fused; }
  // The fused updates applied so far (one per backward); Adam's bias correction counts them.
  int64_t fused_updates() const { return *fused_updates_; }
  // Sets that count (a checkpoint's), so the next update is number n + 1.
  void set_fused_updates(int64_t n);

 private:
  std::shared_ptr<comm::Communicator> group_;
  std::shared_ptr<const detail::ShardingTopology> topo_;
  ShardedEmbeddingOptions options_;
  // This rank's tables as embedding_bag looks them up, each group packed in one buffer: its
  // shards updated by the kernel (or given dense gradients), its column shards under row-wise
  // Adagrad (updated by the output exchange, See Note [Sharded fused optimizers]), and the
  // data-parallel tables. Null when empty.
  std::shared_ptr<detail::LocalTables> shards_, split_rows_, data_;
  std::shared_ptr<int64_t> fused_updates_;
  // A leaf that always requires grad and is an input of the output's exchange, so that every
  // rank records it and runs its backward collectives, with or without shards of its own.
  Tensor anchor_;
};

}  // namespace loom::parallel
