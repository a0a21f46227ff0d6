// Plain types shared by the CPU and CUDA table-batched embedding-bag kernels (FBGEMM's TBE
// semantics): one call looks up T tables at once. Both kernels/cpu/embedding_bag.h and
// kernels/cuda/embedding_bag.h take these, so an op can switch device without translating.
//
// Note [Embedding bag layout]
// - Weights of all T tables live in one flat buffer of one dtype: table t is a row-major
//   [rows[t], dims[t]] block starting at element weight_offsets[t]. Per-row optimizer state
//   (row-wise Adagrad) is one f32 per row, table t's rows from row_offsets[t]; per-element
//   state (Adam's m and v) and a dense gradient have the weights' layout, in f32.
// - indices / offsets are CSR, feature-major: offsets has T*B+1 entries and bag b of table t
//   is indices[offsets[t*B+b] : offsets[t*B+b+1]]. Both arrays have one index type (int32 or
//   int64); offsets[0] == 0 and offsets[T*B] == num_indices.
// - Pooled output (sum, mean) is f32 [B, total_dim] row-major; table t's columns start at
//   dim_offsets[t] (dim_offsets[T] == total_dim).
// - Unpooled output (kNone) is packed: table t's lookups form an f32 [L_t, dims[t]] block, one
//   row per lookup in index order, where L_t = offsets[(t+1)*B] - offsets[t*B]; blocks follow
//   each other in table order. Lookup p (of table t) therefore starts at element
//   packed_offset[t] + (p - offsets[t*B]) * dims[t], packed_offset[t] = sum_{t'<t} L_t'*dims[t'].
//   Because indices are feature-major, this is the same as "lookup p's row, in index order".
//   The gradient of the output (dout) has the same layout as the output.
//
// Note [Embedding bounds check]
// - kError (default): the op validates first (validate_embedding_bag) and raises on the first
//   bad entry. Kernels still never read outside a table: should a bad index reach them, it is
//   skipped as in kSkip.
// - kWarn: a bad index (negative or >= rows) is looked up as row 0 of its table, in forward and
//   backward; it counts in a mean's divisor. The forward returns how many there were.
// - kSkip: a bad index is ignored, as if it were absent from its bag: it contributes nothing,
//   is not counted in a mean's divisor (a bag of only bad indices has mean 0), and gets no
//   gradient (its per-sample-weight gradient is 0). The forward returns how many there were.
// Offsets and lengths are structural: validation reports their errors in every mode, and the
// kernels assume they are valid.
#pragma once

#include <cstdint>

namespace loom::kernels {

enum class EmbeddingPooling : int8_t { kSum, kMean, kNone };
enum class EmbeddingBoundsCheck : int8_t { kError, kWarn, kSkip };
// The weights' element type (kernels sit below core, so this is not core's DType).
enum class EmbeddingDType : int8_t { kF32, kBF16, kF16 };
enum class EmbeddingOptimizer : int8_t { kNone, kSgd, kRowwiseAdagrad, kAdam };

// The tables of one batch. Every pointer is to T (or T+1) int64 in memory the executing device
// can read (host memory for the CPU kernels). See Note [Embedding bag layout].
struct EmbeddingTables {
  int64_t num_tables = 0;                   // T
  const int64_t* rows = nullptr;            // [T] rows of table t (may be 0)
  const int64_t* dims = nullptr;            // [T] embedding dim of table t, a multiple of 4, > 0
  const int64_t* weight_offsets = nullptr;  // [T] element offset of table t in the flat weights
  const int64_t* row_offsets = nullptr;     // [T] first row of table t in per-row state
  const int64_t* dim_offsets = nullptr;     // [T+1] output column of table t; [T] = total_dim
  EmbeddingDType dtype = EmbeddingDType::kF32;
};

// One batch of lookups. Lengths are passed separately from B so validation can report
// arrays of the wrong length instead of reading past them.
template <typename Index>
struct EmbeddingBagIndices {
  int64_t batch_size = 0;          // B
  const Index* indices = nullptr;  // [num_indices]
  int64_t num_indices = 0;
  const Index* offsets = nullptr;  // [num_offsets], must be T*B+1
  int64_t num_offsets = 0;
  const float* per_sample_weights = nullptr;  // [num_per_sample_weights] or null (kSum only)
  int64_t num_per_sample_weights = 0;         // must equal num_indices when weights are given
};

struct EmbeddingBagOptions {
  EmbeddingPooling pooling = EmbeddingPooling::kSum;
  EmbeddingBoundsCheck bounds_check = EmbeddingBoundsCheck::kError;
};

// Hyper-parameters of the fused update (FBGEMM's split_embedding_codegen optimizers), applied
// per unique (table, row) with g its reduced gradient row of D = dims[t] elements:
// - kSgd:            g += weight_decay * w (L2); w -= lr * g
// - kRowwiseAdagrad: g += weight_decay * w (L2); state += sum(g*g) / D;
//                    w -= lr * g / (sqrt(state) + eps)          (exact: state updated once per
//                                                                 row per call, after reduction)
// - kAdam:           m = beta1*m + (1-beta1)*g; v = beta2*v + (1-beta2)*g*g;
//                    w -= lr * ((m / (1-beta1^step)) / (sqrt(v / (1-beta2^step)) + eps)
//                               + weight_decay * w)            (decoupled, as FBGEMM's Adam)
// Only rows that were looked up are touched (their state too), as in FBGEMM. Weights may be
// bf16/f16: the row is read into f32, updated, and rounded to nearest even once.
struct EmbeddingOptimizerHyper {
  EmbeddingOptimizer kind = EmbeddingOptimizer::kNone;
  float lr = 0.01f;
  float eps = 1e-8f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float weight_decay = 0.0f;
  int64_t step = 1;  // Adam: 1-based count of updates, for the bias corrections
};

// Optimizer state, f32. See Note [Embedding bag layout] for the layouts.
struct EmbeddingOptimizerState {
  float* momentum1 = nullptr;  // row-wise Adagrad: [total rows]; Adam: m, weights' layout
  float* momentum2 = nullptr;  // Adam: v, weights' layout; otherwise unused
};

// The sparse gradient: unique (table, row) pairs in increasing (table, row) order and their
// reduced gradient rows packed one after another (row k of width dims[tables[k]] starts at
// value_offsets[k]). Capacity: the caller sizes ids for num_indices entries (value_offsets for
// num_indices+1) and values for the packed lookup size sum_t L_t * dims[t]; those bound the
// unique counts from above.
struct EmbeddingSparseGrad {
  int64_t* tables = nullptr;         // [capacity]
  int64_t* rows = nullptr;           // [capacity]
  int64_t* value_offsets = nullptr;  // [capacity + 1]
  float* values = nullptr;           // [packed lookup size]
};

enum class EmbeddingBagErrorKind : int8_t {
  kNone,
  kBadTable,  // dims[t] not a positive multiple of 4, or rows[t] < 0 (value = dim/rows)
  // num_offsets != T*B+1, num_per_sample_weights != num_indices, or a batch too large for the
  // backward's 64-bit sort key (sum of rows * num_indices >= 2^64)
  kWrongLength,
  kWeightsNeedSum,  // per-sample weights with pooling other than sum
  kFirstOffsetNotZero,
  kDecreasingOffsets,   // offsets[position] < offsets[position-1]
  kLastOffsetMismatch,  // offsets[T*B] != num_indices
  kNegativeIndex,
  kIndexOutOfRange,  // index >= rows[table]
};

// The first bad entry found. Structural errors (table, lengths, offsets) come before index
// errors; among index errors, the lowest position. position is into indices for index errors,
// into offsets for offset errors, and -1 otherwise; bag is the bag within the table (0..B-1).
struct EmbeddingBagError {
  EmbeddingBagErrorKind kind = EmbeddingBagErrorKind::kNone;
  int64_t table = -1;
  int64_t bag = -1;
  int64_t position = -1;
  int64_t value = 0;     // the offending index, offset or length
  int64_t expected = 0;  // rows[table] for index errors, the required offset or length
  bool ok() const { return kind == EmbeddingBagErrorKind::kNone; }
};

// Bits needed to write x (0 for 0).
inline int embedding_bit_width(uint64_t x) {
  int bits = 0;
  while (bits < 64 && (x >> bits) != 0) ++bits;
  return bits;
}

// The backwards sort (table, row, position) as one 64-bit key, so total_rows rows (over all
// tables) and num_indices lookups must fit in 64 bits together. The error both validations
// report when they do not (kWrongLength: value = the lookups, expected = the most that fit);
// kNone when they do.
inline EmbeddingBagError embedding_bag_sort_key_check(uint64_t total_rows, int64_t num_indices) {
  EmbeddingBagError e;
  const int row_bits = embedding_bit_width(total_rows);
  const uint64_t last_position = uint64_t(num_indices > 1 ? num_indices - 1 : 0);
  if (row_bits + embedding_bit_width(last_position) > 64) {
    e.kind = EmbeddingBagErrorKind::kWrongLength;
    e.value = num_indices;
    e.expected = int64_t(1) << (64 - row_bits);
  }
  return e;
}

inline const char* embedding_bag_error_name(EmbeddingBagErrorKind kind) {
  switch (kind) {
    case EmbeddingBagErrorKind::kNone:
      return "none";
    case EmbeddingBagErrorKind::kBadTable:
      return "bad table config";
    case EmbeddingBagErrorKind::kWrongLength:
      return "wrong length";
    case EmbeddingBagErrorKind::kWeightsNeedSum:
      return "per-sample weights need sum pooling";
    case EmbeddingBagErrorKind::kFirstOffsetNotZero:
      return "first offset is not 0";
    case EmbeddingBagErrorKind::kDecreasingOffsets:
      return "decreasing offsets";
    case EmbeddingBagErrorKind::kLastOffsetMismatch:
      return "last offset != number of indices";
    case EmbeddingBagErrorKind::kNegativeIndex:
      return "negative index";
    case EmbeddingBagErrorKind::kIndexOutOfRange:
      return "index >= rows";
  }
  return "unknown";
}

// Fills the offsets of dense packing (tables back to back in order) from rows and dims:
// weight_offsets [T+1], row_offsets [T+1], dim_offsets [T+1]; the last entries are the totals
// (elements, rows, output columns). A convenience for ops and tests; any layout works.
inline void embedding_tables_pack(int64_t num_tables, const int64_t* rows, const int64_t* dims,
                                  int64_t* weight_offsets, int64_t* row_offsets,
                                  int64_t* dim_offsets) {
  weight_offsets[0] = row_offsets[0] = dim_offsets[0] = 0;
  for (int64_t t = 0; t < num_tables; ++t) {
    weight_offsets[t + 1] = weight_offsets[t] + rows[t] * dims[t];
    row_offsets[t + 1] = row_offsets[t] + rows[t];
    dim_offsets[t + 1] = dim_offsets[t] + dims[t];
  }
}

}  // namespace loom::kernels
