// Table-batched embedding bags on the CPU (FBGEMM TBE semantics): T tables, one call, CSR
// indices, sum / mean / none pooling, per-sample weights, f32 / bf16 / f16 weights with f32
// accumulation, int32 / int64 indices, and a deterministic backward that can apply SGD,
// row-wise Adagrad or Adam in place. Layouts and bounds-check modes are in
// kernels/embedding_bag_types.h (Note [Embedding bag layout], Note [Embedding bounds check]).
// INTERFACE READY
//
// Every function is a template over the index type, instantiated for int32_t and int64_t.
// Kernels throw nothing: the op validates with validate_embedding_bag and raises from its result.
#pragma once

#include <cstdint>

#include "kernels/embedding_bag_types.h"

namespace loom::kernels::cpu {

// Checks table configs, lengths, offsets and (in kError mode only) every index; returns the
// first bad entry, or ok(). Cheap next to the lookup (reads indices and offsets once).
template <typename Index>
EmbeddingBagError validate_embedding_bag(const EmbeddingTables& tables,
                                         const EmbeddingBagIndices<Index>& in,
                                         const EmbeddingBagOptions& opt);

// sum_t L_t * dims[t]: elements of the unpooled (kNone) output and of its dout, and the
// capacity EmbeddingSparseGrad::values needs.
template <typename Index>
int64_t embedding_bag_packed_size(const EmbeddingTables& tables,
                                  const EmbeddingBagIndices<Index>& in);

// out: f32 [B, total_dim] for kSum / kMean, packed [embedding_bag_packed_size] for kNone;
// every element written once (=). weights: the flat buffer in tables.dtype.
// Returns the number of bad indices met (treated per opt.bounds_check).
template <typename Index>
int64_t embedding_bag_forward(const EmbeddingTables& tables, const void* weights,
                              const EmbeddingBagIndices<Index>& in, float* out,
                              const EmbeddingBagOptions& opt);

// The backwards take dout in the forward output's layout. grad_per_sample_weights [num_indices]
// (may be null; then weights may be null for the dense and sparse forms) gets, for lookup p of
// bag b, dot(dout[b, table's columns], weight row) (=, 0 for skipped lookups). All results are
// bit-identical whatever the thread count: lookups are sorted by (table, row) with a stable
// sort and each row's contributions are added in index order. Each calling thread keeps its sort
// buffers (about 40 bytes per lookup) for its next call (Note [Embedding backward workspace]).

// (a) Dense gradient: grad_weights (f32, the weights' layout) gets every table's
// [rows[t], dims[t]] block written (=), zero for rows not looked up.
template <typename Index>
void embedding_bag_backward_dense(const EmbeddingTables& tables, const void* weights,
                                  const EmbeddingBagIndices<Index>& in, const float* dout,
                                  float* grad_weights, float* grad_per_sample_weights,
                                  const EmbeddingBagOptions& opt);

// (b) Sparse gradient, written into grad (capacity in EmbeddingSparseGrad). Returns the number
// of unique (table, row) pairs.
template <typename Index>
int64_t embedding_bag_backward_sparse(const EmbeddingTables& tables, const void* weights,
                                      const EmbeddingBagIndices<Index>& in, const float* dout,
                                      const EmbeddingSparseGrad& grad,
                                      float* grad_per_sample_weights,
                                      const EmbeddingBagOptions& opt);

// (c) Fused optimizer: updates weights (and state) in place per unique row, never holding
// more than one row's gradient per thread. grad_per_sample_weights uses the weights before the
// update. hyper.kind == kNone leaves weights untouched (only grad_per_sample_weights).
template <typename Index>
void embedding_bag_backward_fused(const EmbeddingTables& tables, void* weights,
                                  const EmbeddingBagIndices<Index>& in, const float* dout,
                                  const EmbeddingOptimizerHyper& hyper,
                                  const EmbeddingOptimizerState& state,
                                  float* grad_per_sample_weights, const EmbeddingBagOptions& opt);

}  // namespace loom::kernels::cpu
