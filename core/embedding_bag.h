// Table-batched embedding bags as a Tensor op (FBGEMM's TBE semantics; the kernels are
// kernels/{cpu,cuda}/embedding_bag*): T tables looked up in one call with CSR indices.
//
//   Tensor out = embedding_bag(tables, layout, indices, offsets);   // [B, sum of dims]
//
// `tables` are the T weights, [rows[t], dims[t]] each, of one dtype (f32, bf16, f16). The kernels
// read one flat buffer, so when the tables are views of one storage laid out as the layout says
// (what nn::EmbeddingBagCollection keeps) they are read in place; otherwise they are packed into
// a temporary copy first. indices and offsets: 1-D, both i32 or both i64, feature-major (bag b of
// table t is indices[offsets[t*B+b] : offsets[t*B+b+1]]), see Note [Embedding bag layout] in
// kernels/embedding_bag_types.h, which also gives the unpooled (kNone) output's packed layout.
//
// Gradients: the backward is deterministic (bit-identical run to run, whatever the threads). Each
// table gets a dense f32 gradient, or, with a fused optimizer (EmbeddingBagOptions::fused), the
// backward applies SGD / row-wise Adagrad / Adam to the looked-up rows in place and gives the
// tables no gradient (FBGEMM's fused backward: the weight gradient is never materialised).
// embedding_bag_sparse_grad returns the gradient as unique rows and values instead.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/embedding_bag_types.h"

namespace loom {

using EmbeddingPooling = kernels::EmbeddingPooling;
using EmbeddingBoundsCheck = kernels::EmbeddingBoundsCheck;
using EmbeddingOptimizer = kernels::EmbeddingOptimizer;

// Where T tables sit in one flat buffer, packed back to back in table order.
class EmbeddingBagLayout {
 public:
  EmbeddingBagLayout() = default;
  // names may be empty (tables are then called "table t" in errors).
  EmbeddingBagLayout(std::vector<int64_t> rows, std::vector<int64_t> dims,
                     std::vector<std::string> names = {});

  int64_t num_tables() const { return int64_t(rows_.size()); }
  int64_t rows(int64_t t) const { return rows_[size_t(t)]; }
  int64_t dim(int64_t t) const { return dims_[size_t(t)]; }
  int64_t total_dim() const { return dim_offsets_.back(); }
  int64_t total_rows() const { return row_offsets_.back(); }
  int64_t total_elements() const { return weight_offsets_.back(); }
  int64_t weight_offset(int64_t t) const { return weight_offsets_[size_t(t)]; }
  int64_t dim_offset(int64_t t) const { return dim_offsets_[size_t(t)]; }
  int64_t row_offset(int64_t t) const { return row_offsets_[size_t(t)]; }
  // "table 2 ('user')", or "table 2" without names: how errors name a table.
  std::string table_str(int64_t t) const;
  // The kernels' view (its arrays point into this object: keep it alive).
  kernels::EmbeddingTables kernel_tables(DType dtype) const;

 private:
  std::vector<int64_t> rows_, dims_;
  std::vector<std::string> names_;
  std::vector<int64_t> weight_offsets_, row_offsets_, dim_offsets_;  // [T+1] each
};

// A fused optimizer's hyper-parameters and f32 state (See EmbeddingOptimizerHyper for the
// update formulas). Shared by the forwards whose backwards update the tables.
struct EmbeddingFusedOptimizer {
  kernels::EmbeddingOptimizerHyper hyper;
  Tensor momentum1;  // row-wise Adagrad: [total rows]; Adam: m [total elements]
  Tensor momentum2;  // Adam: v [total elements]
  // kind and hyper-parameters; the state is zeroed for `layout` (Adam's step starts at 1).
  EmbeddingFusedOptimizer(const kernels::EmbeddingOptimizerHyper& hyper,
                          const EmbeddingBagLayout& layout);
};

struct EmbeddingBagOptions {
  EmbeddingPooling pooling = EmbeddingPooling::kSum;
  EmbeddingBoundsCheck bounds_check = EmbeddingBoundsCheck::kError;
  // Set: the backward updates the tables in place with it (and then counts its step) and the
  // tables get no gradient. Needs the tables in one storage (See embedding_bag).
  std::shared_ptr<EmbeddingFusedOptimizer> fused;
};

// True when the tables are contiguous views of one storage at the layout's offsets (one flat
// buffer the kernels read, and a fused optimizer updates, in place).
bool embedding_tables_packed(const std::vector<Tensor>& tables, const EmbeddingBagLayout& layout);

// The lookup. per_sample_weights (optional, f32 [num indices], sum pooling only) gets a gradient
// when it requires one. Output f32: [B, total_dim] (sum, mean), or [packed] (kNone). Errors name
// the table, bag and position of a bad index or offset (kError), or warn once per call with the
// count (kWarn).
Tensor embedding_bag(const std::vector<Tensor>& tables, const EmbeddingBagLayout& layout,
                     const Tensor& indices, const Tensor& offsets,
                     const Tensor& per_sample_weights = Tensor(),
                     const EmbeddingBagOptions& options = {});

// The gradient of sum(out * dout) with respect to the tables, as unique (table, row) pairs in
// increasing order: rows [U, 2] i64 (table, row), values[k] the reduced gradient of that row,
// packed (row k of width dims[table] at value_offsets[k]). Not recorded by autograd.
struct EmbeddingSparseGradient {
  Tensor ids;            // i64 [U, 2]: (table, row)
  Tensor value_offsets;  // i64 [U + 1]
  Tensor values;         // f32 [value_offsets[U]]
};
EmbeddingSparseGradient embedding_bag_sparse_grad(const std::vector<Tensor>& tables,
                                                  const EmbeddingBagLayout& layout,
                                                  const Tensor& indices, const Tensor& offsets,
                                                  const Tensor& dout,
                                                  const Tensor& per_sample_weights = Tensor(),
                                                  const EmbeddingBagOptions& options = {});

}  // namespace loom
