// Differentiable operations on Tensors. Each op checks its arguments (shape, dtype, device) with
// LOOM_CHECK, naming itself and the argument, makes its inputs contiguous, dispatches to
// kernels/cpu or kernels/cuda, and records its backward with autograd::record.
//
// Implementations, one file per family under core/ops/: shape.cpp, elementwise.cpp, reduce.cpp,
// matmul.cpp, gelu.cpp, softmax.cpp, dropout.cpp, norm.cpp, attention.cpp, loss.cpp,
// embedding.cpp.
//
// Broadcasting, numpy's rule: shapes are aligned at their last dims and each pair of sizes must be
// equal or one of them 1; the result takes the larger size of each pair. An operand whose shape
// is a suffix of the result's (b of shape [C] against a of shape [B, T, C]) is read in place,
// repeating; any other broadcast operand (x - x.mean(1, keepdim=True)) is first expanded into a
// contiguous copy. Gradients are summed back to each operand's shape.
//
// Dtypes: f32, and bf16 / f16 computed in f32 and rounded (See Note [Low-precision compute] in
// core/ops/low_precision.h); cross_entropy's loss is f32 whatever the logits' dtype.
#pragma once

#include <cstdint>
#include <vector>

#include "core/autograd.h"
#include "core/tensor.h"

namespace loom {

// ---------------- shape (views where possible) ----------------
Tensor reshape(const Tensor& x, const Shape& shape);  // one -1 allowed; view when contiguous
// PyTorch's view: x's elements under `shape` (one -1 allowed) without copying, also for a
// non-contiguous x whose strides allow it (a part of a split split further: q.view(B, T, H, D));
// an error naming both shapes when no view exists. The result may be non-contiguous.
Tensor view(const Tensor& x, const Shape& shape);
// PyTorch's reshape: view(x, shape) where x's strides allow it, else reshape (a copy). loom's
// own reshape always returns contiguous memory (its callers may rely on that); the Python
// binding's reshape, flatten, squeeze and unsqueeze are this.
Tensor view_or_reshape(const Tensor& x, const Shape& shape);
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);                   // view
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);  // view
// Elements start, start + step, ... (`length` of them) along dim: a view (PyTorch's t[a:b:step]).
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t length, int64_t step);
Tensor cat(const std::vector<Tensor>& xs, int64_t dim);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim);  // equal sizes
// x broadcast to `shape` (numpy's rule: x's dims aligned at the end, each 1 or equal), as a
// contiguous copy; the gradient is summed back to x's shape.
Tensor expand(const Tensor& x, const Shape& shape);

// ---------------- elementwise ----------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);  // IEEE a / b, the same broadcasting
Tensor scale(const Tensor& x, double s);       // x * s
Tensor gelu(const Tensor& x);                  // tanh approximation, as GPT-2

// Elementwise math, PyTorch's exp log sqrt rsqrt abs neg tanh sin cos erf log1p expm1,
// differentiable. abs's
// gradient is 0 at 0 (as PyTorch's sign). Domain errors give NaN / inf as in C (log(-1) = NaN).
// floor ceil round (half to even) trunc too: their gradient is 0; of an integer tensor, a copy.
enum class Unary {
  kExp,
  kLog,
  kSqrt,
  kRsqrt,
  kAbs,
  kNeg,
  kTanh,
  kSin,
  kCos,
  kErf,
  kLog1p,
  kExpm1,
  kFloor,
  kCeil,
  kRound,
  kTrunc
};
Tensor unary(const Tensor& x, Unary op);
Tensor pow(const Tensor& x, double exponent);  // x ** exponent; gradient e * x^(e-1)
// min(max(x, lo), hi) with either bound optional (NaN for "none"); the gradient passes where
// lo <= x <= hi, as PyTorch's. lo > hi gives hi everywhere, as PyTorch.
Tensor clamp(const Tensor& x, double lo, double hi);
// condition ? a : b elementwise; condition bool (or u8, nonzero = true); the three broadcast
// together.
// Differentiable in a and b.
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b);
// x with `value` where mask (bool, or u8 nonzero, broadcast to x's shape) is true;
// differentiable in x.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

// Elementwise comparisons, PyTorch's eq ne lt le gt ge: a bool tensor, true where `a op b`
// holds, with add's broadcasting. f32, i32, i64, u8 and bool compared as they are, bf16/f16 by
// value (exact, through f32); operands of two dtypes are promoted first as PyTorch's (integers
// and bools meet in i64, an integer and a float in the float's dtype). NaN compares unequal to
// everything. Not differentiable: no autograd.
enum class Compare { kEq, kNe, kLt, kLe, kGt, kGe };
Tensor compare(const Tensor& a, const Tensor& b, Compare op);

// Integer tensors (i32, i64, u8): add, sub and mul of two give their dtype (wrapping), a floating
// tensor with an integer one computes in the floating dtype, div and t * non-integral number give
// f32, sum gives i64 (See Note [Integer operands] in core/ops/integer.cpp). Python's // and %:
// the quotient rounds toward minus infinity, the remainder takes the divisor's sign; integers
// only; a zero divisor is an error. Not differentiable.
Tensor floor_divide(const Tensor& a, const Tensor& b);
Tensor remainder(const Tensor& a, const Tensor& b);

// ---------------- reductions ----------------
Tensor sum(const Tensor& x);   // all elements -> shape []
Tensor mean(const Tensor& x);  // all elements -> shape []
Tensor sum(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor mean(const Tensor& x, int64_t dim, bool keepdim = false);
// The largest (smallest) element along `dim` and its index, as torch.max(x, dim) / torch.min:
// the first index among equal extremes; a NaN counts as the extreme (it propagates). The values
// are differentiable: the gradient goes to the chosen index. indices are i64. The names avoid
// std::max / std::min at unqualified call sites.
struct ValuesIndices {
  Tensor values, indices;
};
ValuesIndices max_dim(const Tensor& x, int64_t dim, bool keepdim = false);
ValuesIndices min_dim(const Tensor& x, int64_t dim, bool keepdim = false);
// The k largest (or smallest) elements along dim and their indices, sorted: PyTorch's topk with
// sorted=True. Ties go to the lower index first; NaN counts as larger than every number
// (kernels/extreme.h ranks_before). Differentiable in the values.
ValuesIndices topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true);

// ---------------- linear algebra ----------------
// a: [..., M, K] ([..., K, M] with transpose_a); b: [K, N] ([N, K] with transpose_b) shared by
// every batch entry, or with a's leading dims. Result [..., M, N].
Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);
// x: [..., in], weight: [out, in], bias: [out] or undefined. Result [..., out].
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
// The gradients linear(x, weight, bias)'s backward computes from `grad` (the output's), bit for
// bit, each only if asked for (undefined otherwise; bias's also when bias is undefined). Not
// differentiable. For an op that keeps less than linear does and rebuilds x for its backward
// (a sequence-parallel linear gathers its input again: parallel/tensor_parallel/layers.cpp).
struct LinearGrads {
  Tensor x, weight, bias;
};
LinearGrads linear_backward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                            const Tensor& grad, bool need_x, bool need_weight, bool need_bias);
// A linear per group of consecutive rows (a mixture of experts' rows sorted by expert): x [R, in]
// in groups of row_counts[g] rows (adding up to R), weights[g] [out, in], biases[g] [out] (all
// or none). Result [R, out]: group g's rows are linear(its rows, weights[g], biases[g]), bit for
// bit on the CPU in f32; one grouped GEMM per product (See Note [Grouped linear]).
Tensor grouped_linear(const Tensor& x, const std::vector<int64_t>& row_counts,
                      const std::vector<Tensor>& weights, const std::vector<Tensor>& biases = {});

// ---------------- neural-network functions ----------------
Tensor softmax(const Tensor& x);  // over the last dim
// Over the last dim C; weight and bias [C] (either may be undefined: scale 1 / shift 0).
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
// q, k, v: [B, H, T, D]; softmax(q k^T / sqrt(D)) v with a causal mask when `causal`.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    bool causal = true);

struct CrossEntropyOptions {
  int64_t ignore_index = -100;  // targets equal to this add nothing and count for nothing
  // Only the first num_classes columns are classes (a padded vocabulary's extra columns are
  // ignored: they take no probability and get zero gradient). -1: all columns.
  int64_t num_classes = -1;
};
// logits [N, V] (f32, bf16 or f16), targets [N] i32/i64 -> mean over non-ignored rows of -log
// softmax[target], a scalar (shape []). Fused: never stores more than the logits' size (the
// backward recomputes softmax from the saved logits and the saved per-row log-sum-exp). A target
// outside [0, num_classes) that is not ignore_index is an error.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets,
                     const CrossEntropyOptions& options = {});

// For recommendation models (DLRM); core/ops/{relu,sigmoid,binary_cross_entropy,
// dot_interaction}.cpp, on the CPU and on CUDA (tests/unit/cuda_dlrm_ops_test.cpp).
Tensor relu(const Tensor& x);     // max(x, 0); gradient 0 at x == 0
Tensor sigmoid(const Tensor& x);  // 1 / (1 + exp(-x))
// logits and targets of one shape (targets: probabilities in [0, 1]) -> the mean over elements of
// max(x, 0) - x y + log1p(exp(-|x|)), a scalar (shape [], f32 whatever the logits' dtype, as
// cross_entropy). Differentiable in both; no elements gives 0.
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& targets);
// features [B, F, D] -> [B, F*(F-1)/2]: out[b, i*(i-1)/2 + j] = <features[b,i], features[b,j]>
// for i > j, i.e. the strictly lower triangle of x x^T row by row: (1,0), (2,0), (2,1), (3,0), ...
// (the DLRM reference's order).
Tensor dot_interaction(const Tensor& features);

// weight [V, C], indices i32/i64 of any shape -> [..., C]. Backward scatter-adds into weight's
// gradient. An index outside [0, V) is an error naming it.
Tensor embedding(const Tensor& weight, const Tensor& indices);
// embedding's transpose: x [V, C] with the rows of src [..., C] added at rows indices [...] (f32;
// an index used twice adds both, summed in index order first, then added to x: delta = the
// rows' sum, out = x + delta, on CPU and CUDA alike). Differentiable in x (the gradient itself)
// and in src (the gradient's rows at indices). An index outside [0, V) is an error naming it.
// The building block of Python's index_add and scatter_add.
Tensor index_add_rows(const Tensor& x, const Tensor& indices, const Tensor& src);
// x's elements at `positions` (i64, places in x's row-major order, each in range and at most
// once: a place named twice is an error) set to `values` (one per position, converted to x's
// dtype and device), in place; x may be a view. Not recorded by autograd: x must not require
// grad while grad is on. The core of Python's t[mask] = v and t[index] = v.
void put_(Tensor& x, const Tensor& positions, const Tensor& values);

// Counter-based dropout: element i is kept iff uniform(philox(seed, stream, offset + i)) >= p,
// and kept elements are scaled by 1/(1-p). The same key gives the same mask on any device and
// in any recomputation. Identity when !training or p == 0.
struct DropoutKey {
  uint64_t seed = 0;
  uint64_t stream = 0;
  uint64_t offset = 0;
  // x may be part `part` of `parts` equal parts along dim `part_dim` of a larger tensor (a
  // tensor-parallel rank's heads, a sequence-parallel rank's positions): its elements then take
  // the mask bits of their places in that whole tensor, so the ranks together draw the mask one
  // process draws. parts == 1: x is the whole tensor.
  int64_t part_dim = 0;
  int64_t part = 0;
  int64_t parts = 1;
  // Independently, x may be part `batch_part` of `batch_parts` equal parts along dim 0 (the
  // batch) of the whole: a data-parallel rank's rows, or a micro-batch's. Combines with the part
  // above, which must then lie along another dim.
  int64_t batch_part = 0;
  int64_t batch_parts = 1;
};
Tensor dropout(const Tensor& x, double p, bool training, const DropoutKey& key);

// ---------------- in-place, no autograd (optimizers, gradient handling) ----------------
void add_(Tensor& x, const Tensor& y, double alpha = 1.0);  // x += alpha * y
void scale_(Tensor& x, double s);                           // x *= s
double sum_of_squares(const Tensor& x);                     // f64 accumulation

}  // namespace loom
