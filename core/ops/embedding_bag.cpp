// embedding_bag: argument checks, the flat weight buffer, validation into errors that name the
// table, and the autograd record (dense, fused or per-sample-weight gradients). See
// core/embedding_bag.h; the kernels are kernels/cpu/embedding_bag* and kernels/cuda/embedding_bag*
// (See Note [Embedding bag on CUDA] for what the CUDA path reads back to the host).
#include "core/embedding_bag.h"

#include <algorithm>
#include <cstdio>

#include "core/autograd.h"
#include "core/cuda_dispatch.h"
#include "core/dispatch.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/ops/checks.h"
#include "kernels/cpu/embedding_bag.h"
#if LOOM_WITH_CUDA
#include "kernels/cuda/embedding_bag.h"
#endif

namespace loom {

EmbeddingBagLayout::EmbeddingBagLayout(std::vector<int64_t> rows, std::vector<int64_t> dims,
                                       std::vector<std::string> names)
    : rows_(std::move(rows)), dims_(std::move(dims)), names_(std::move(names)) {
  const size_t t_count = rows_.size();
  LOOM_CHECK(dims_.size() == t_count, "EmbeddingBagLayout: ", t_count, " row counts but ",
             dims_.size(), " dims");
  LOOM_CHECK(names_.empty() || names_.size() == t_count, "EmbeddingBagLayout: ", names_.size(),
             " names for ", t_count, " tables");
  for (size_t t = 0; t < t_count; ++t) {
    LOOM_CHECK(rows_[t] >= 0, "EmbeddingBagLayout: ", table_str(int64_t(t)), " has ", rows_[t],
               " rows");
    LOOM_CHECK(dims_[t] > 0 && dims_[t] % 4 == 0, "EmbeddingBagLayout: ", table_str(int64_t(t)),
               " has dim ", dims_[t], "; dims must be positive multiples of 4");
  }
  weight_offsets_.assign(t_count + 1, 0);
  row_offsets_.assign(t_count + 1, 0);
  dim_offsets_.assign(t_count + 1, 0);
  kernels::embedding_tables_pack(int64_t(t_count), rows_.data(), dims_.data(),
                                 weight_offsets_.data(), row_offsets_.data(), dim_offsets_.data());
}

std::string EmbeddingBagLayout::table_str(int64_t t) const {
  std::string s = "table " + std::to_string(t);
  if (!names_.empty()) s += " ('" + names_[size_t(t)] + "')";
  return s;
}

kernels::EmbeddingTables EmbeddingBagLayout::kernel_tables(DType dtype) const {
  kernels::EmbeddingTables k;
  k.num_tables = num_tables();
  k.rows = rows_.data();
  k.dims = dims_.data();
  k.weight_offsets = weight_offsets_.data();
  k.row_offsets = row_offsets_.data();
  k.dim_offsets = dim_offsets_.data();
  switch (dtype) {
    case DType::kF32:
      k.dtype = kernels::EmbeddingDType::kF32;
      break;
    case DType::kBF16:
      k.dtype = kernels::EmbeddingDType::kBF16;
      break;
    case DType::kF16:
      k.dtype = kernels::EmbeddingDType::kF16;
      break;
    default:
      LOOM_FAIL("embedding_bag: tables must be f32, bf16 or f16, got ", dtype_name(dtype));
  }
  return k;
}

EmbeddingFusedOptimizer::EmbeddingFusedOptimizer(const kernels::EmbeddingOptimizerHyper& h,
                                                 const EmbeddingBagLayout& layout)
    : hyper(h) {
  LOOM_CHECK(hyper.kind != EmbeddingOptimizer::kNone,
             "EmbeddingFusedOptimizer: the optimizer kind is none");
  LOOM_CHECK(hyper.lr >= 0 && hyper.eps >= 0, "EmbeddingFusedOptimizer: lr ", hyper.lr, " and eps ",
             hyper.eps, " must not be negative");
  hyper.step = 1;
  if (hyper.kind == EmbeddingOptimizer::kRowwiseAdagrad)
    momentum1 = Tensor::zeros({layout.total_rows()});
  if (hyper.kind == EmbeddingOptimizer::kAdam) {
    momentum1 = Tensor::zeros({layout.total_elements()});
    momentum2 = Tensor::zeros({layout.total_elements()});
  }
}

bool embedding_tables_packed(const std::vector<Tensor>& tables, const EmbeddingBagLayout& layout) {
  if (tables.empty() || int64_t(tables.size()) != layout.num_tables()) return false;
  const int64_t base = tables[0].offset() - layout.weight_offset(0);
  for (size_t t = 0; t < tables.size(); ++t) {
    const Tensor& w = tables[t];
    if (!w.is_contiguous() || w.storage() != tables[0].storage() ||
        w.offset() != base + layout.weight_offset(int64_t(t)))
      return false;
  }
  return true;
}

namespace {

const char* kOp = "embedding_bag";

// The tables' flat buffer: their common storage when they are laid out there as `layout` says
// (read and updated in place), else a packed copy.
struct FlatWeights {
  Tensor buffer;  // 1-D [total elements] over the memory the kernels read
  bool in_place = false;
};

FlatWeights flat_weights(const std::vector<Tensor>& tables, const EmbeddingBagLayout& layout) {
  const int64_t t_count = layout.num_tables();
  LOOM_CHECK(int64_t(tables.size()) == t_count, kOp, ": ", tables.size(),
             " table tensors for a layout of ", t_count, " tables");
  LOOM_CHECK(t_count > 0, kOp, ": no tables");
  const DType dtype = tables[0].defined() ? tables[0].dtype() : DType::kF32;
  for (int64_t t = 0; t < t_count; ++t) {
    const Tensor& w = tables[size_t(t)];
    LOOM_CHECK(w.defined(), kOp, ": ", layout.table_str(t), "'s weight is undefined");
    LOOM_CHECK(w.dim() == 2 && w.size(0) == layout.rows(t) && w.size(1) == layout.dim(t), kOp, ": ",
               layout.table_str(t), "'s weight is ", shape_str(w.shape()), ", expected [",
               layout.rows(t), ", ", layout.dim(t), "]");
    LOOM_CHECK(w.dtype() == dtype, kOp, ": ", layout.table_str(t), " is ", dtype_name(w.dtype()),
               " but table 0 is ", dtype_name(dtype), "; all tables need one dtype");
    LOOM_CHECK(w.device() == tables[0].device(), kOp, ": ", layout.table_str(t), " is on ",
               w.device().str(), " but table 0 is on ", tables[0].device().str());
  }
  const bool in_place = embedding_tables_packed(tables, layout);
  const int64_t base = tables[0].offset() - layout.weight_offset(0);
  FlatWeights flat;
  flat.in_place = in_place;
  if (in_place) {
    flat.buffer = make_view(tables[0].detach(), {layout.total_elements()}, {1}, base);
  } else {
    flat.buffer = Tensor::empty({layout.total_elements()}, dtype, tables[0].device());
    for (int64_t t = 0; t < t_count; ++t)
      flat.buffer.narrow(0, layout.weight_offset(t), layout.rows(t) * layout.dim(t))
          .copy_(tables[size_t(t)].detach().reshape({layout.rows(t) * layout.dim(t)}));
  }
  return flat;
}

// Raises the first bad entry validation found, naming the table, bag and position.
void raise(const kernels::EmbeddingBagError& e, const EmbeddingBagLayout& layout, int64_t batch) {
  using K = kernels::EmbeddingBagErrorKind;
  const std::string where = e.table >= 0 ? layout.table_str(e.table) : std::string("the batch");
  const std::string bag = e.bag >= 0 ? ", bag " + std::to_string(e.bag) : std::string();
  switch (e.kind) {
    case K::kNegativeIndex:
    case K::kIndexOutOfRange:
      LOOM_FAIL(kOp, ": ", where, bag, ": index ", e.value, " at position ", e.position,
                " of 'indices' is outside [0, ", e.expected, ") (the table has ", e.expected,
                " rows); bounds_check kWarn looks such indices up as row 0, kSkip ignores them");
    case K::kWrongLength:
      LOOM_FAIL(kOp, ": wrong length: got ", e.value, ", expected ", e.expected,
                " ('offsets' needs tables x batch + 1 = T*B+1 entries, 'per_sample_weights' one "
                "per index)");
    case K::kFirstOffsetNotZero:
      LOOM_FAIL(kOp, ": 'offsets'[0] is ", e.value, "; the first offset must be 0");
    case K::kDecreasingOffsets:
      LOOM_FAIL(kOp, ": ", where, bag, ": 'offsets' decrease at position ", e.position, " (",
                e.value, " after ", e.expected, "); offsets must not decrease");
    case K::kLastOffsetMismatch:
      LOOM_FAIL(kOp, ": the last offset (position ", e.position, ") is ", e.value,
                " but there are ", e.expected, " indices; it must equal the number of indices");
    case K::kWeightsNeedSum:
      LOOM_FAIL(kOp, ": per_sample_weights need sum pooling");
    case K::kBadTable:
      LOOM_FAIL(kOp, ": ", where, " is invalid (value ", e.value, ")");
    case K::kNone:
      return;
  }
  LOOM_FAIL(kOp, ": invalid input (", kernels::embedding_bag_error_name(e.kind), ") for batch ",
            batch);
}

struct Checked {
  Tensor indices, offsets, per_sample_weights;  // contiguous
  int64_t batch = 0;
};

// What embedding_bag's backward reads: the indices, offsets and per-sample weights, and the
// tables' values when the per-sample weights' gradient needs them.
std::vector<Tensor> saved_for_backward(const FlatWeights& flat, const Checked& c, bool want_psw) {
  return {c.indices, c.offsets, c.per_sample_weights, want_psw ? flat.buffer : Tensor()};
}

// The arguments must all be where the tables are.
void check_device(const char* arg, const Tensor& t, Device device) {
  LOOM_CHECK(t.device() == device, kOp, ": '", arg, "' is on ", t.device().str(),
             " but the tables are on ", device.str(),
             "; tables, indices, offsets and per_sample_weights must be on one device");
}

Checked check_inputs(const EmbeddingBagLayout& layout, const Tensor& indices, const Tensor& offsets,
                     const Tensor& per_sample_weights, const EmbeddingBagOptions& options,
                     Device device) {
  detail::check_index(kOp, "indices", indices);
  detail::check_index(kOp, "offsets", offsets);
  detail::check_dim(kOp, "indices", indices, 1);
  detail::check_dim(kOp, "offsets", offsets, 1);
  LOOM_CHECK(indices.dtype() == offsets.dtype(), kOp, ": 'indices' are ",
             dtype_name(indices.dtype()), " but 'offsets' are ", dtype_name(offsets.dtype()),
             "; both must be i32 or both i64");
  check_device("indices", indices, device);
  check_device("offsets", offsets, device);
  const int64_t t_count = layout.num_tables();
  LOOM_CHECK(offsets.numel() >= 1 && (offsets.numel() - 1) % t_count == 0, kOp, ": 'offsets' has ",
             offsets.numel(), " entries; it needs tables x batch + 1 = ", t_count,
             " * B + 1 entries");
  Checked c;
  c.batch = (offsets.numel() - 1) / t_count;
  c.indices = indices.detach().contiguous();
  c.offsets = offsets.detach().contiguous();
  if (per_sample_weights.defined()) {
    detail::check_f32(kOp, "per_sample_weights", per_sample_weights);
    detail::check_dim(kOp, "per_sample_weights", per_sample_weights, 1);
    check_device("per_sample_weights", per_sample_weights, device);
    LOOM_CHECK(options.pooling == EmbeddingPooling::kSum, kOp,
               ": per_sample_weights need sum pooling");
    c.per_sample_weights = per_sample_weights.detach().contiguous();
  }
  return c;
}

template <typename I>
kernels::EmbeddingBagIndices<I> kernel_indices(const Checked& c) {
  kernels::EmbeddingBagIndices<I> in;
  in.batch_size = c.batch;
  in.indices = c.indices.data<I>();
  in.num_indices = c.indices.numel();
  in.offsets = c.offsets.data<I>();
  in.num_offsets = c.offsets.numel();
  if (c.per_sample_weights.defined()) {
    in.per_sample_weights = c.per_sample_weights.data<float>();
    in.num_per_sample_weights = c.per_sample_weights.numel();
  }
  return in;
}

kernels::EmbeddingBagOptions kernel_options(const EmbeddingBagOptions& o) {
  return kernels::EmbeddingBagOptions{o.pooling, o.bounds_check};
}

// Validates (raising on the first bad entry) and returns the output's shape.
template <typename I>
Shape validate(const EmbeddingBagLayout& layout, const kernels::EmbeddingTables& k,
               const Checked& c, const EmbeddingBagOptions& options) {
  const kernels::EmbeddingBagIndices<I> in = kernel_indices<I>(c);
  const kernels::EmbeddingBagError e =
      kernels::cpu::validate_embedding_bag(k, in, kernel_options(options));
  if (!e.ok()) raise(e, layout, c.batch);
  if (options.pooling == EmbeddingPooling::kNone)
    return {kernels::cpu::embedding_bag_packed_size(k, in)};
  return {c.batch, layout.total_dim()};
}

void warn_bad(int64_t bad, const EmbeddingBagOptions& options) {
  if (bad == 0 || options.bounds_check != EmbeddingBoundsCheck::kWarn) return;
  std::fprintf(stderr,
               "loom warning: embedding_bag: %lld index(es) outside their table were "
               "looked up as row 0 (bounds_check kWarn)\n",
               static_cast<long long>(bad));
}

// The dense f32 gradient [total elements] as one [rows, dim] gradient per table, in the tables'
// dtype (views of `dense` when that is f32).
std::vector<Tensor> table_grads(const Tensor& dense, const EmbeddingBagLayout& l, DType dtype) {
  std::vector<Tensor> grads(size_t(l.num_tables()));
  for (int64_t t = 0; t < l.num_tables(); ++t) {
    Tensor gt =
        dense.narrow(0, l.weight_offset(t), l.rows(t) * l.dim(t)).reshape({l.rows(t), l.dim(t)});
    grads[size_t(t)] = dtype == DType::kF32 ? gt : gt.to(dtype);
  }
  return grads;
}

// EmbeddingFusedOptimizer makes its state on the CPU; it follows the tables to their device on
// the first call there (once: later calls find it in place).
void fused_state_to(EmbeddingFusedOptimizer& f, Device device) {
  if (f.momentum1.defined() && f.momentum1.device() != device)
    f.momentum1 = f.momentum1.detach().to(device);
  if (f.momentum2.defined() && f.momentum2.device() != device)
    f.momentum2 = f.momentum2.detach().to(device);
}

// Note [Embedding bag on CUDA]
// - The CUDA kernels read the layout's per-table arrays (rows, dims, offsets) from device memory:
//   each call copies them up as one small i64 tensor (5T+1 values, CudaTables), which the
//   backward keeps alive. The layout is a plain value the caller may change between calls, so
//   nothing is cached on it.
// - Host synchronisations per call, each reading back a few bytes: the validation's one
//   EmbeddingBagError (always: offsets are structural and must be valid before a kernel walks
//   them, and kError must raise before the lookup; this is the one sync a lookup costs); the
//   packed size (kNone pooling only, to shape the output); the bad-index count (kWarn only, to
//   print the warning). embedding_bag's backward reads nothing back. embedding_bag_sparse_grad
//   also reads the unique count and the values' length (one copy), which shape its results.
// - The errors are the CPU's: the device validation writes the same EmbeddingBagError the CPU
//   validation returns, and the same raise() turns it into the message.
// - Results stay on the device: the output, the tables' gradients, the per-sample weights'
//   gradient, and embedding_bag_sparse_grad's ids, value_offsets and values.
#if LOOM_WITH_CUDA

struct CudaTables {
  Tensor arrays;               // i64 [5T+1] on the device: rows, dims, weight, row, dim offsets
  kernels::EmbeddingTables k;  // pointers into `arrays`
  kernels::cuda::EmbeddingTablesInfo info;
};

CudaTables cuda_tables(const EmbeddingBagLayout& layout, DType dtype, Device device) {
  const int64_t t_count = layout.num_tables();
  std::vector<int64_t> host;
  host.reserve(size_t(5 * t_count + 1));
  for (int64_t t = 0; t < t_count; ++t) host.push_back(layout.rows(t));
  for (int64_t t = 0; t < t_count; ++t) host.push_back(layout.dim(t));
  for (int64_t t = 0; t < t_count; ++t) host.push_back(layout.weight_offset(t));
  for (int64_t t = 0; t < t_count; ++t) host.push_back(layout.row_offset(t));
  for (int64_t t = 0; t < t_count; ++t) host.push_back(layout.dim_offset(t));
  host.push_back(layout.total_dim());  // dim_offsets[T]
  CudaTables c;
  c.arrays = Tensor::from_vector(host, {int64_t(host.size())}, device);
  const int64_t* base = c.arrays.data<int64_t>();
  c.k = layout.kernel_tables(dtype);  // num_tables and dtype; the pointers are replaced
  c.k.rows = base;
  c.k.dims = base + t_count;
  c.k.weight_offsets = base + 2 * t_count;
  c.k.row_offsets = base + 3 * t_count;
  c.k.dim_offsets = base + 4 * t_count;
  c.info = kernels::cuda::embedding_tables_info(t_count, host.data(), host.data() + t_count);
  return c;
}

// The one check of cpu::validate_embedding_bag the CUDA validation leaves out (its tables are
// device arrays; the rows are known here): the backward's 64-bit sort key. Same report.
kernels::EmbeddingBagError sort_key_error(const EmbeddingBagLayout& layout, int64_t num_indices) {
  uint64_t total_rows = 0;
  for (int64_t t = 0; t < layout.num_tables(); ++t) total_rows += uint64_t(layout.rows(t));
  return kernels::embedding_bag_sort_key_check(total_rows, num_indices);
}

// validate() on the device: the same first bad entry, raised with the same message. Reads the
// error back (one sync), and the packed size for kNone (a second).
template <typename I>
Shape validate_cuda(const EmbeddingBagLayout& layout, const CudaTables& ct, const Checked& c,
                    const EmbeddingBagOptions& options, Device device) {
  using K = kernels::EmbeddingBagErrorKind;
  const kernels::EmbeddingBagIndices<I> in = kernel_indices<I>(c);
  Tensor slot = cuda_workspace(device, sizeof(kernels::EmbeddingBagError));
  kernels::cuda::validate_embedding_bag(ct.k, in, kernel_options(options),
                                        static_cast<kernels::EmbeddingBagError*>(slot.data_ptr()),
                                        cuda_stream(device));
  kernels::EmbeddingBagError e;
  slot.copy_to_host(&e, sizeof(e));  // waits for the validation (See Note [Embedding bag on CUDA])
  // On the CPU the sort-key check comes after the table and length checks, before the offsets.
  if (e.kind != K::kBadTable && e.kind != K::kWrongLength && e.kind != K::kWeightsNeedSum) {
    const kernels::EmbeddingBagError key = sort_key_error(layout, in.num_indices);
    if (!key.ok()) e = key;
  }
  if (!e.ok()) raise(e, layout, c.batch);
  if (options.pooling == EmbeddingPooling::kNone)
    return {kernels::cuda::embedding_bag_packed_size(ct.k, in, cuda_stream(device))};
  return {c.batch, layout.total_dim()};
}

// embedding_bag on CUDA tensors (the checks shared with the CPU path are done).
Tensor embedding_bag_cuda(const std::vector<Tensor>& tables, const FlatWeights& flat,
                          const Checked& c, const std::shared_ptr<EmbeddingBagLayout>& layout,
                          const Tensor& per_sample_weights, const EmbeddingBagOptions& options) {
  const Device device = flat.buffer.device();
  const CudaTables ct = cuda_tables(*layout, flat.buffer.dtype(), device);
  Tensor out;
  visit_index_dtype(c.indices.dtype(), [&](auto tag) {
    using I = decltype(tag);
    out = Tensor::empty(validate_cuda<I>(*layout, ct, c, options, device), DType::kF32, device);
    const bool warn = options.bounds_check == EmbeddingBoundsCheck::kWarn;
    Tensor bad = warn ? Tensor::empty({1}, DType::kI64, device) : Tensor();
    kernels::cuda::embedding_bag_forward(
        ct.k, ct.info, flat.buffer.data_ptr(), kernel_indices<I>(c), out.data<float>(),
        warn ? bad.data<int64_t>() : nullptr, kernel_options(options), cuda_stream(device));
    if (warn) warn_bad(bad.to_vector<int64_t>()[0], options);  // a sync, kWarn only
  });
  std::vector<Tensor> inputs(tables.begin(), tables.end());
  inputs.push_back(per_sample_weights);
  const bool want_psw = per_sample_weights.defined() && per_sample_weights.requires_grad();
  // Saved: the indices, and the tables when the per-sample weights' gradient reads them. A fused
  // optimizer writes the tables in the backward: it bumps their version, as an optimizer step
  // does (See Note [Version counter]).
  autograd::record(
      out, kOp, inputs, saved_for_backward(flat, c, want_psw),
      [flat, c, layout, ct, options, want_psw](const Tensor& g) {
        const EmbeddingBagLayout& l = *layout;
        const Device device = flat.buffer.device();
        const kernels::cuda::Stream stream = cuda_stream(device);
        Tensor dout = g.contiguous();
        LOOM_CHECK(dout.device() == device, kOp, ": the output's gradient is on ",
                   dout.device().str(), " but the tables are on ", device.str());
        Tensor psw_grad =
            want_psw ? Tensor::empty({c.indices.numel()}, DType::kF32, device) : Tensor();
        float* psw = want_psw ? psw_grad.data<float>() : nullptr;
        std::vector<Tensor> grads(size_t(l.num_tables()) + 1);
        visit_index_dtype(c.indices.dtype(), [&](auto tag) {
          using I = decltype(tag);
          const kernels::EmbeddingBagIndices<I> in = kernel_indices<I>(c);
          const size_t bytes =
              kernels::cuda::embedding_bag_backward_workspace_bytes(ct.k, ct.info, in);
          Tensor workspace = cuda_workspace(device, bytes);
          if (options.fused) {
            EmbeddingFusedOptimizer& f = *options.fused;
            fused_state_to(f, device);  // in place since the forward, unless moved away since
            kernels::EmbeddingOptimizerState state;
            if (f.momentum1.defined()) state.momentum1 = f.momentum1.data<float>();
            if (f.momentum2.defined()) state.momentum2 = f.momentum2.data<float>();
            flat.buffer.storage()->bump_version();
            kernels::cuda::embedding_bag_backward_fused(
                ct.k, ct.info, flat.buffer.data_ptr(), in, dout.data<float>(), f.hyper, state, psw,
                kernel_options(options), workspace.data_ptr(), bytes, stream);
            ++f.hyper.step;
            return;
          }
          Tensor dense = Tensor::empty({l.total_elements()}, DType::kF32, device);
          kernels::cuda::embedding_bag_backward_dense(
              ct.k, ct.info, flat.buffer.data_ptr(), in, dout.data<float>(), dense.data<float>(),
              psw, kernel_options(options), workspace.data_ptr(), bytes, stream);
          const std::vector<Tensor> per_table = table_grads(dense, l, flat.buffer.dtype());
          std::copy(per_table.begin(), per_table.end(), grads.begin());
        });
        grads.back() = psw_grad;
        return grads;
      });
  return out;
}

// embedding_bag_sparse_grad on CUDA tensors; the results stay on the device.
EmbeddingSparseGradient sparse_grad_cuda(const FlatWeights& flat, const EmbeddingBagLayout& layout,
                                         const Checked& c, const Tensor& dout,
                                         const EmbeddingBagOptions& options) {
  const Device device = flat.buffer.device();
  const kernels::cuda::Stream stream = cuda_stream(device);
  const CudaTables ct = cuda_tables(layout, flat.buffer.dtype(), device);
  EmbeddingSparseGradient result;
  visit_index_dtype(c.indices.dtype(), [&](auto tag) {
    using I = decltype(tag);
    const Shape out_shape = validate_cuda<I>(layout, ct, c, options, device);
    detail::check_f32(kOp, "dout", dout);
    check_device("dout", dout, device);
    LOOM_CHECK(dout.shape() == out_shape, kOp, ": 'dout' is ", shape_str(dout.shape()),
               " but the output is ", shape_str(out_shape));
    const kernels::EmbeddingBagIndices<I> in = kernel_indices<I>(c);
    const int64_t capacity = c.indices.numel();
    const int64_t packed =
        options.pooling == EmbeddingPooling::kNone
            ? out_shape[0]
            : kernels::cuda::embedding_bag_packed_size(ct.k, in, stream);  // a sync
    Tensor tables_ids = Tensor::empty({capacity}, DType::kI64, device);
    Tensor rows = Tensor::empty({capacity}, DType::kI64, device);
    // [0, capacity]: value_offsets (those past the unique count hold the total, as the kernel
    // promises); [capacity + 1]: the unique count. So one copy reads back both sizes.
    Tensor offsets_and_count = Tensor::empty({capacity + 2}, DType::kI64, device);
    int64_t* value_offsets = offsets_and_count.data<int64_t>();
    Tensor values = Tensor::empty({packed}, DType::kF32, device);
    const kernels::EmbeddingSparseGrad grad{tables_ids.data<int64_t>(), rows.data<int64_t>(),
                                            value_offsets, values.data<float>()};
    Tensor contiguous_dout = dout.detach().contiguous();
    const size_t bytes = kernels::cuda::embedding_bag_backward_workspace_bytes(ct.k, ct.info, in);
    Tensor workspace = cuda_workspace(device, bytes);
    kernels::cuda::embedding_bag_backward_sparse(
        ct.k, ct.info, flat.buffer.data_ptr(), in, contiguous_dout.data<float>(), grad,
        value_offsets + capacity + 1, nullptr, kernel_options(options), workspace.data_ptr(), bytes,
        stream);
    const std::vector<int64_t> sizes =
        offsets_and_count.narrow(0, capacity, 2).to_vector<int64_t>();  // a sync
    const int64_t used = sizes[0], unique = sizes[1];
    LOOM_ASSERT(unique >= 0 && unique <= capacity && used >= 0 && used <= packed, kOp,
                ": the sparse backward reported ", unique, " unique rows and ", used,
                " values for ", capacity, " lookups and ", packed, " values of capacity");
    if (unique > 0) {
      result.ids = cat({tables_ids.narrow(0, 0, unique).reshape({unique, 1}),
                        rows.narrow(0, 0, unique).reshape({unique, 1})},
                       1);
    } else {
      result.ids = Tensor::empty({0, 2}, DType::kI64, device);
    }
    result.value_offsets = offsets_and_count.narrow(0, 0, unique + 1).contiguous();
    result.values = values.narrow(0, 0, used).contiguous();
  });
  return result;
}

#endif  // LOOM_WITH_CUDA

}  // namespace

Tensor embedding_bag(const std::vector<Tensor>& tables, const EmbeddingBagLayout& layout,
                     const Tensor& indices, const Tensor& offsets, const Tensor& per_sample_weights,
                     const EmbeddingBagOptions& options) {
  const FlatWeights flat = flat_weights(tables, layout);
  const Device device = flat.buffer.device();
  const Checked c = check_inputs(layout, indices, offsets, per_sample_weights, options, device);
  LOOM_CHECK(!options.fused || flat.in_place, kOp,
             ": a fused optimizer updates the tables in place, so they must be views of one "
             "buffer laid out as the layout says (nn::EmbeddingBagCollection keeps them so)");
  if (options.fused) fused_state_to(*options.fused, device);
  auto layout_copy = std::make_shared<EmbeddingBagLayout>(layout);
  if (device.is_cuda()) {
    LOOM_IF_CUDA(
        return embedding_bag_cuda(tables, flat, c, layout_copy, per_sample_weights, options));
  }
  const kernels::EmbeddingTables k = layout_copy->kernel_tables(flat.buffer.dtype());
  Tensor out;
  visit_index_dtype(c.indices.dtype(), [&](auto tag) {
    using I = decltype(tag);
    out = Tensor::empty(validate<I>(layout, k, c, options));
    warn_bad(kernels::cpu::embedding_bag_forward(k, flat.buffer.data_ptr(), kernel_indices<I>(c),
                                                 out.data<float>(), kernel_options(options)),
             options);
  });
  std::vector<Tensor> inputs(tables.begin(), tables.end());
  inputs.push_back(per_sample_weights);
  const bool want_psw = per_sample_weights.defined() && per_sample_weights.requires_grad();
  autograd::record(
      out, kOp, inputs, saved_for_backward(flat, c, want_psw),
      [flat, c, layout_copy, options, want_psw](const Tensor& g) {
        const EmbeddingBagLayout& l = *layout_copy;
        const kernels::EmbeddingTables kt = l.kernel_tables(flat.buffer.dtype());
        Tensor dout = g.contiguous();
        Tensor psw_grad = want_psw ? Tensor::empty({c.indices.numel()}) : Tensor();
        float* psw = want_psw ? psw_grad.data<float>() : nullptr;
        std::vector<Tensor> grads(size_t(l.num_tables()) + 1);
        visit_index_dtype(c.indices.dtype(), [&](auto tag) {
          using I = decltype(tag);
          const kernels::EmbeddingBagIndices<I> in = kernel_indices<I>(c);
          if (options.fused) {
            EmbeddingFusedOptimizer& f = *options.fused;
            fused_state_to(f,
                           Device::cpu());  // in place since the forward, unless moved away since
            kernels::EmbeddingOptimizerState state;
            if (f.momentum1.defined()) state.momentum1 = f.momentum1.data<float>();
            if (f.momentum2.defined()) state.momentum2 = f.momentum2.data<float>();
            flat.buffer.storage()->bump_version();
            kernels::cpu::embedding_bag_backward_fused(kt, flat.buffer.data_ptr(), in,
                                                       dout.data<float>(), f.hyper, state, psw,
                                                       kernel_options(options));
            ++f.hyper.step;
            return;
          }
          Tensor dense = Tensor::empty({l.total_elements()});
          kernels::cpu::embedding_bag_backward_dense(kt, flat.buffer.data_ptr(), in,
                                                     dout.data<float>(), dense.data<float>(), psw,
                                                     kernel_options(options));
          const std::vector<Tensor> per_table = table_grads(dense, l, flat.buffer.dtype());
          std::copy(per_table.begin(), per_table.end(), grads.begin());
        });
        grads.back() = psw_grad;
        return grads;
      });
  return out;
}

EmbeddingSparseGradient embedding_bag_sparse_grad(const std::vector<Tensor>& tables,
                                                  const EmbeddingBagLayout& layout,
                                                  const Tensor& indices, const Tensor& offsets,
                                                  const Tensor& dout,
                                                  const Tensor& per_sample_weights,
                                                  const EmbeddingBagOptions& options) {
  const FlatWeights flat = flat_weights(tables, layout);
  const Device device = flat.buffer.device();
  const Checked c = check_inputs(layout, indices, offsets, per_sample_weights, options, device);
  if (device.is_cuda()) {
    LOOM_IF_CUDA(return sparse_grad_cuda(flat, layout, c, dout, options));
  }
  const kernels::EmbeddingTables k = layout.kernel_tables(flat.buffer.dtype());
  EmbeddingSparseGradient result;
  visit_index_dtype(c.indices.dtype(), [&](auto tag) {
    using I = decltype(tag);
    const Shape out_shape = validate<I>(layout, k, c, options);
    detail::check_f32(kOp, "dout", dout);
    check_device("dout", dout, flat.buffer.device());
    LOOM_CHECK(dout.shape() == out_shape, kOp, ": 'dout' is ", shape_str(dout.shape()),
               " but the output is ", shape_str(out_shape));
    const kernels::EmbeddingBagIndices<I> in = kernel_indices<I>(c);
    const int64_t capacity = c.indices.numel();
    Tensor tables_ids = Tensor::empty({capacity}, DType::kI64);
    Tensor rows = Tensor::empty({capacity}, DType::kI64);
    Tensor value_offsets = Tensor::empty({capacity + 1}, DType::kI64);
    Tensor values = Tensor::empty({kernels::cpu::embedding_bag_packed_size(k, in)});
    const kernels::EmbeddingSparseGrad grad{tables_ids.data<int64_t>(), rows.data<int64_t>(),
                                            value_offsets.data<int64_t>(), values.data<float>()};
    Tensor contiguous_dout = dout.detach().contiguous();
    const int64_t unique = kernels::cpu::embedding_bag_backward_sparse(
        k, flat.buffer.data_ptr(), in, contiguous_dout.data<float>(), grad, nullptr,
        kernel_options(options));
    std::vector<int64_t> ids(size_t(unique) * 2);
    const std::vector<int64_t> t_v = tables_ids.to_vector<int64_t>(),
                               r_v = rows.to_vector<int64_t>();
    for (int64_t u = 0; u < unique; ++u) {
      ids[size_t(2 * u)] = t_v[size_t(u)];
      ids[size_t(2 * u + 1)] = r_v[size_t(u)];
    }
    result.ids = Tensor::from_vector(ids, {unique, 2});
    result.value_offsets = value_offsets.narrow(0, 0, unique + 1).contiguous();
    const int64_t used = unique > 0 ? value_offsets.to_vector<int64_t>()[size_t(unique)] : 0;
    result.values = values.narrow(0, 0, used).contiguous();
  });
  return result;
}

}  // namespace loom
