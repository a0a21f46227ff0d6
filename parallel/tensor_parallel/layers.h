// Megatron-style tensor-parallel layers over a tp group. Each weight is a shard of the
// single-process parameter of the same name (See ShardSpec), so init_parameters gives every rank
// exactly its slice of the single-process initialisation, and a checkpoint is cut and reassembled
// without renaming anything.
//
//   ColumnParallelLinear   y = x W^T + b with W's output rows split over tp: rank r computes
//                          output features [r out/tp, (r+1) out/tp). The input is replicated
//                          (copy_to_tp: its gradient is allreduced) or, with sequence
//                          parallelism, all-gathered along the sequence.
//   RowParallelLinear      W's input columns split over tp: each rank multiplies its slice of the
//                          input features and the partial outputs are summed (allreduce, or with
//                          sequence parallelism a reduce-scatter along the sequence); the bias is
//                          whole and added once, after the sum.
//   VocabParallelEmbedding rank r owns rows [r V/tp, (r+1) V/tp) of the (padded) vocabulary; a
//                          lookup of a row another rank owns gives zeros, and the allreduce sums
//                          the one rank that had it.
#pragma once

#include <memory>

#include "core/nn/module.h"
#include "parallel/tensor_parallel/tp_comm.h"

namespace loom::parallel {

struct ColumnParallelOptions {
  bool bias = true;
  double init_std = 0.02;
  bool gather_output = false;      // all-gather the output features (else each rank keeps its own)
  bool sequence_parallel = false;  // the input is split along dim 1 (the sequence) over tp
  // The full weight's output rows are `blocks` equal blocks, each split over tp (attention's
  // fused qkv: 3, so rank r gets its heads' rows of q, of k and of v).
  int64_t blocks = 1;
};

class ColumnParallelLinear : public nn::Module {
 public:
  ColumnParallelLinear(int64_t in_features, int64_t out_features, GroupPtr tp,
                       const ColumnParallelOptions& options = {});
  // [..., in] -> [..., out / tp] (or [..., out] with gather_output)
  Tensor forward(const Tensor& x) override;

  Tensor weight;  // [out / tp, in]
  Tensor bias;    // [out / tp]

 private:
  GroupPtr tp_;
  ColumnParallelOptions options_;
};

struct RowParallelOptions {
  bool bias = true;
  double init_std = 0.02;
  bool sequence_parallel = false;  // reduce-scatter the output along dim 1 instead of allreduce
};

class RowParallelLinear : public nn::Module {
 public:
  RowParallelLinear(int64_t in_features, int64_t out_features, GroupPtr tp,
                    const RowParallelOptions& options = {});
  // [..., in / tp] (this rank's input features) -> [..., out] summed over tp (with sequence
  // parallelism: [B, T / tp, out])
  Tensor forward(const Tensor& x) override;

  Tensor weight;  // [out, in / tp]
  Tensor bias;    // [out], whole

 private:
  GroupPtr tp_;
  RowParallelOptions options_;
};

class VocabParallelEmbedding : public nn::Module {
 public:
  // `rows`: the full table's rows, a multiple of tp. `init` applies to the full table (its
  // zero_rows_from counts full rows).
  VocabParallelEmbedding(int64_t rows, int64_t dim, GroupPtr tp,
                         const nn::Init& init = nn::Init::normal(0.02));
  // i32/i64 [...] of full row ids -> [..., dim], the same on every rank
  Tensor forward(const Tensor& indices) override;

  int64_t rows_per_rank() const { return weight.size(0); }
  int64_t first_row() const { return first_; }

  Tensor weight;  // [rows / tp, dim]

 private:
  GroupPtr tp_;
  int64_t first_;
};

// The size of `what` on each of `tp` ranks; throws naming `owner` and `what` when it does not
// divide.
int64_t per_rank(const char* owner, const char* what, int64_t n, int tp);

}  // namespace loom::parallel
