// Table-batched embedding bags on CUDA: the twins of kernels/cpu/embedding_bag.h, with the same
// semantics (layouts, pooling, bounds-check modes: kernels/embedding_bag_types.h) and a trailing
// stream. Every pointer is device memory: the EmbeddingTables arrays, indices, offsets,
// per-sample weights, outputs, optimizer state, and the slots results are written to.
//
// Where this differs from the CPU interface, and why:
// - Nothing is read back to the host, so nothing synchronises (embedding_bag_packed_size alone
//   returns a host number and waits for it). Results the CPU returns (the bad-index count, the
//   number of unique rows, the validation error) are written (=) to device slots instead.
// - The launchers cannot read the device table arrays, so they take EmbeddingTablesInfo, two host
//   facts about the same tables (see there).
// - The backward needs scratch (radix-sort buffers, segment lists): ask
//   embedding_bag_backward_workspace_bytes and pass at least that many bytes of device memory.
// - Positions are int32 in the backward: at most 2^31-1 lookups and T*B < 2^31 bags per call.
// - The backward sums a row's contributions in a fixed order that is not always the CPU's (long
//   segments are split over the warps of a block), so results equal the CPU's to f32 rounding,
//   and are bit-identical from run to run on one GPU.
//
// Every function is a template over the index type, instantiated for int32_t and int64_t.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/stream.h"
#include "kernels/embedding_bag_types.h"

namespace loom::kernels::cuda {

// Host facts about the device tables. max_dim only picks how many threads share a bag or a row
// (any value gives correct results; 0 = unknown: a full warp). total_rows bounds the backward's
// radix-sort keys: it must be >= sum of rows[t] (a smaller value gives wrong gradients);
// -1 = unknown: all 64 key bits are sorted (8 radix passes where a few million rows need 3).
struct EmbeddingTablesInfo {
  int64_t max_dim = 0;
  int64_t total_rows = -1;
};

// From host copies of rows[T] and dims[T].
EmbeddingTablesInfo embedding_tables_info(int64_t num_tables, const int64_t* rows,
                                          const int64_t* dims);

// The CPU's validation on the device: *error (device memory) gets (=) the same first bad entry
// as cpu::validate_embedding_bag, or kind kNone. The op copies it back when it needs to raise.
template <typename Index>
void validate_embedding_bag(const EmbeddingTables& tables, const EmbeddingBagIndices<Index>& in,
                            const EmbeddingBagOptions& opt, EmbeddingBagError* error,
                            Stream stream);

// sum_t L_t * dims[t] (see the CPU twin). Synchronises the stream: call it where the op needs
// the size on the host anyway.
template <typename Index>
int64_t embedding_bag_packed_size(const EmbeddingTables& tables,
                                  const EmbeddingBagIndices<Index>& in, Stream stream);

// out as in the CPU twin (every element written once). *num_bad (may be null) gets (=) the number
// of bad indices met.
template <typename Index>
void embedding_bag_forward(const EmbeddingTables& tables, const EmbeddingTablesInfo& info,
                           const void* weights, const EmbeddingBagIndices<Index>& in, float* out,
                           int64_t* num_bad, const EmbeddingBagOptions& opt, Stream stream);

// Scratch bytes the backwards need for this batch (depends on T, B, num_indices and
// info.total_rows only). Queries the current device; call with a GPU.
template <typename Index>
size_t embedding_bag_backward_workspace_bytes(const EmbeddingTables& tables,
                                              const EmbeddingTablesInfo& info,
                                              const EmbeddingBagIndices<Index>& in);

// The three backwards of the CPU twin, with the same outputs; workspace holds workspace_bytes
// (at least the query's answer) and is 256-byte aligned (as cudaMalloc's); loom::Error otherwise.
// Only the stream's order protects the workspace: do not reuse it on another stream before
// this call's work is done.
template <typename Index>
void embedding_bag_backward_dense(const EmbeddingTables& tables, const EmbeddingTablesInfo& info,
                                  const void* weights, const EmbeddingBagIndices<Index>& in,
                                  const float* dout, float* grad_weights,
                                  float* grad_per_sample_weights, const EmbeddingBagOptions& opt,
                                  void* workspace, size_t workspace_bytes, Stream stream);

// *num_unique (device) gets (=) the number of unique (table, row) pairs. value_offsets is written
// up to its capacity (num_indices + 1 entries; those past the unique count hold the total).
template <typename Index>
void embedding_bag_backward_sparse(const EmbeddingTables& tables, const EmbeddingTablesInfo& info,
                                   const void* weights, const EmbeddingBagIndices<Index>& in,
                                   const float* dout, const EmbeddingSparseGrad& grad,
                                   int64_t* num_unique, float* grad_per_sample_weights,
                                   const EmbeddingBagOptions& opt, void* workspace,
                                   size_t workspace_bytes, Stream stream);

template <typename Index>
void embedding_bag_backward_fused(const EmbeddingTables& tables, const EmbeddingTablesInfo& info,
                                  void* weights, const EmbeddingBagIndices<Index>& in,
                                  const float* dout, const EmbeddingOptimizerHyper& hyper,
                                  const EmbeddingOptimizerState& state,
                                  float* grad_per_sample_weights, const EmbeddingBagOptions& opt,
                                  void* workspace, size_t workspace_bytes, Stream stream);

}  // namespace loom::kernels::cuda
