#include "parallel/tensor_parallel/layers.h"

#include "core/autograd.h"
#include "core/ops.h"

namespace loom::parallel {

int64_t per_rank(const char* owner, const char* what, int64_t n, int tp) {
  LOOM_CHECK(tp > 0 && n > 0 && n % tp == 0, owner, ": ", what, " (", n,
             ") must divide evenly over tp ", tp);
  return n / tp;
}

ColumnParallelLinear::ColumnParallelLinear(int64_t in, int64_t out, GroupPtr tp,
                                           const ColumnParallelOptions& o)
    : tp_(std::move(tp)), options_(o) {
  LOOM_CHECK(tp_ != nullptr, "ColumnParallelLinear: the tp group is null");
  LOOM_CHECK(in > 0 && out > 0 && o.blocks > 0 && out % o.blocks == 0,
             "ColumnParallelLinear: features must be positive and out (", out,
             ") a multiple of blocks (", o.blocks, ")");
  const int n = tp_->size(), r = tp_->rank();
  const int64_t block = out / o.blocks;
  const int64_t mine = per_rank("ColumnParallelLinear", "output features per block", block, n);
  nn::ShardSpec w{{out, in}, {o.blocks, block, in}, 1, r * mine, mine};
  weight = register_parameter("weight", {o.blocks * mine, in}, nn::Init::normal(o.init_std), w);
  if (o.bias) {
    nn::ShardSpec b{{out}, {o.blocks, block}, 1, r * mine, mine};
    bias = register_parameter("bias", {o.blocks * mine}, nn::Init::zeros(), b);
  }
}

namespace {

// Note [Sequence-parallel linears keep their shard]
// Under sequence parallelism a column-parallel linear's input arrives split along the sequence
// and is all-gathered for the GEMM. linear(gather_sequence(x), W, b) would keep the gathered
// whole for W's gradient until the backward: tp times the shard, twice per layer (QKV and the
// MLP's first linear), which is what Korthikanti et al.'s sequence-parallel count leaves out.
// As Megatron does, this op keeps only x's shard and gathers it again in the backward, an
// all-gather more per linear and micro-batch; the gradients are linear's own (linear_backward)
// and gather_sequence's reduce-scatter, so the bits are those of the composition
// (tests/mpi/tp_test.cpp).
Tensor sequence_parallel_linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                const GroupPtr& tp) {
  Tensor gathered = all_gather_along(x, *tp, 1);
  Tensor y;
  {
    NoGradGuard no_grad;
    y = linear(gathered, weight, bias);
  }
  gathered = Tensor();  // not kept: the backward gathers it again
  const bool need_x = x.requires_grad(), need_w = weight.requires_grad();
  const bool need_b = bias.defined() && bias.requires_grad();
  autograd::record(
      y, "sequence_parallel_linear", {x, weight, bias}, {x, weight},
      [tp, x = x.detach(), w = weight.detach(), b = bias.defined() ? bias.detach() : Tensor(),
       need_x, need_w, need_b](const Tensor& grad) {
        const Tensor whole = all_gather_along(x, *tp, 1);
        LinearGrads g = linear_backward(whole, w, b, grad, need_x, need_w, need_b);
        if (g.x.defined()) g.x = reduce_scatter_along(g.x, *tp, 1);
        return std::vector<Tensor>{g.x, g.weight, g.bias};
      });
  return y;
}

// local * mask, mask [..., 1] spread over each row of local [..., dim]. mul would keep the mask
// spread to local's shape for the backward, as large as the output; this keeps it as given, and
// the backward's mul spreads it again (the same products, so the same bits).
Tensor mask_rows(const Tensor& local, const Tensor& mask) {
  Tensor out;
  {
    NoGradGuard no_grad;
    out = mul(local, mask);
  }
  autograd::record(out, "mask_rows", {local}, {mask},
                   [mask](const Tensor& g) { return std::vector<Tensor>{mul(g, mask)}; });
  return out;
}

}  // namespace

Tensor ColumnParallelLinear::forward(const Tensor& x) {
  Tensor y = options_.sequence_parallel && tp_->size() > 1
                 ? sequence_parallel_linear(x, weight, bias, tp_)
                 : linear(options_.sequence_parallel ? x : copy_to_tp(x, tp_), weight, bias);
  return options_.gather_output ? gather_from_tp(y, tp_, -1) : y;
}

RowParallelLinear::RowParallelLinear(int64_t in, int64_t out, GroupPtr tp,
                                     const RowParallelOptions& o)
    : tp_(std::move(tp)), options_(o) {
  LOOM_CHECK(tp_ != nullptr, "RowParallelLinear: the tp group is null");
  LOOM_CHECK(in > 0 && out > 0, "RowParallelLinear: features must be positive, got in ", in,
             " out ", out);
  const int n = tp_->size(), r = tp_->rank();
  const int64_t mine = per_rank("RowParallelLinear", "input features", in, n);
  weight = register_parameter("weight", {out, mine}, nn::Init::normal(o.init_std),
                              nn::ShardSpec::along({out, in}, 1, r * mine, mine));
  if (o.bias) bias = register_parameter("bias", {out}, nn::Init::zeros());
}

Tensor RowParallelLinear::forward(const Tensor& x) {
  Tensor partial = linear(x, weight);
  Tensor y = options_.sequence_parallel ? reduce_scatter_sequence(partial, tp_, 1)
                                        : reduce_from_tp(partial, tp_);
  if (!bias.defined()) return y;
  // On a sequence slice each rank's bias gradient is a part: copy_to_tp sums them over tp.
  return add(y, options_.sequence_parallel ? copy_to_tp(bias, tp_) : bias);
}

VocabParallelEmbedding::VocabParallelEmbedding(int64_t rows, int64_t dim, GroupPtr tp,
                                               const nn::Init& init)
    : tp_(std::move(tp)) {
  LOOM_CHECK(tp_ != nullptr, "VocabParallelEmbedding: the tp group is null");
  LOOM_CHECK(dim > 0, "VocabParallelEmbedding: dim must be positive, got ", dim);
  const int n = tp_->size(), r = tp_->rank();
  const int64_t mine = per_rank("VocabParallelEmbedding", "rows", rows, n);
  first_ = r * mine;
  weight = register_parameter("weight", {mine, dim}, init,
                              nn::ShardSpec::along({rows, dim}, 0, first_, mine));
}

Tensor VocabParallelEmbedding::forward(const Tensor& indices) {
  LOOM_CHECK(
      indices.defined() && (indices.dtype() == DType::kI32 || indices.dtype() == DType::kI64),
      "VocabParallelEmbedding: indices must be i32 or i64, got ",
      indices.defined() ? indices.str() : "undefined");
  const int64_t rows = weight.size(0);
  const int64_t full_rows = rows * tp_->size();
  // Ids owned elsewhere look up local row 0 and are zeroed by the mask: one value per id, spread
  // over the row (a whole [..., dim] mask, kept for the backward, was as large as the output).
  std::vector<int64_t> ids = indices.to(DType::kI64).to_vector<int64_t>();
  std::vector<float> keep(ids.size(), 0.0f);
  for (size_t i = 0; i < ids.size(); ++i) {
    LOOM_CHECK(ids[i] >= 0 && ids[i] < full_rows, "VocabParallelEmbedding: index ", ids[i],
               " is outside the table's ", full_rows, " rows");
    const bool mine = ids[i] >= first_ && ids[i] < first_ + rows;
    ids[i] = mine ? ids[i] - first_ : 0;
    if (mine) keep[i] = 1.0f;
  }
  Shape mask_shape = indices.shape();
  mask_shape.push_back(1);
  Tensor local = embedding(weight, Tensor::from_vector(ids, indices.shape(), indices.device()));
  Tensor mask = Tensor::from_vector(keep, mask_shape, indices.device());
  if (weight.dtype() != DType::kF32) mask = mask.to(weight.dtype());
  return reduce_from_tp(mask_rows(local, mask), tp_);
}

}  // namespace loom::parallel
