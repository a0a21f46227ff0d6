// embedding_bag: argument checks, the flat weight buffer, validation into errors that name the
// table, and the autograd record (dense, fused or per-sample-weight gradients). See
// core/embedding_bag.h; the kernels are kernels/cpu/embedding_bag*.
#include "core/embedding_bag.h"

#include <cstdio>

#include "core/autograd.h"
#include "core/dispatch.h"
#include "core/error.h"
#include "core/ops/checks.h"
#include "kernels/cpu/embedding_bag.h"

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
  LOOM_CHECK(tables[0].device().is_cpu(), kOp,
             ": CUDA tables are not supported by the op yet (the CUDA kernels exist in "
             "kernels/cuda/embedding_bag*; their op path has not run on a GPU)");
  const bool in_place = embedding_tables_packed(tables, layout);
  const int64_t base = tables[0].offset() - layout.weight_offset(0);
  FlatWeights flat;
  flat.in_place = in_place;
  if (in_place) {
    flat.buffer = make_view(tables[0].detach(), {layout.total_elements()}, {1}, base);
  } else {
    flat.buffer = Tensor::empty({layout.total_elements()}, dtype);
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

Checked check_inputs(const EmbeddingBagLayout& layout, const Tensor& indices, const Tensor& offsets,
                     const Tensor& per_sample_weights, const EmbeddingBagOptions& options) {
  detail::check_index(kOp, "indices", indices);
  detail::check_index(kOp, "offsets", offsets);
  detail::check_dim(kOp, "indices", indices, 1);
  detail::check_dim(kOp, "offsets", offsets, 1);
  LOOM_CHECK(indices.dtype() == offsets.dtype(), kOp, ": 'indices' are ",
             dtype_name(indices.dtype()), " but 'offsets' are ", dtype_name(offsets.dtype()),
             "; both must be i32 or both i64");
  LOOM_CHECK(indices.device().is_cpu() && offsets.device().is_cpu(), kOp,
             ": CUDA indices are not supported by the op yet");
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

}  // namespace

Tensor embedding_bag(const std::vector<Tensor>& tables, const EmbeddingBagLayout& layout,
                     const Tensor& indices, const Tensor& offsets, const Tensor& per_sample_weights,
                     const EmbeddingBagOptions& options) {
  const FlatWeights flat = flat_weights(tables, layout);
  const Checked c = check_inputs(layout, indices, offsets, per_sample_weights, options);
  LOOM_CHECK(!options.fused || flat.in_place, kOp,
             ": a fused optimizer updates the tables in place, so they must be views of one "
             "buffer laid out as the layout says (nn::EmbeddingBagCollection keeps them so)");
  auto layout_copy = std::make_shared<EmbeddingBagLayout>(layout);
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
  autograd::record(out, kOp, inputs, [flat, c, layout_copy, options, want_psw](const Tensor& g) {
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
        kernels::EmbeddingOptimizerState state;
        if (f.momentum1.defined()) state.momentum1 = f.momentum1.data<float>();
        if (f.momentum2.defined()) state.momentum2 = f.momentum2.data<float>();
        kernels::cpu::embedding_bag_backward_fused(kt, flat.buffer.data_ptr(), in,
                                                   dout.data<float>(), f.hyper, state, psw,
                                                   kernel_options(options));
        ++f.hyper.step;
        return;
      }
      Tensor dense = Tensor::empty({l.total_elements()});
      kernels::cpu::embedding_bag_backward_dense(kt, flat.buffer.data_ptr(), in, dout.data<float>(),
                                                 dense.data<float>(), psw, kernel_options(options));
      for (int64_t t = 0; t < l.num_tables(); ++t) {
        Tensor gt = dense.narrow(0, l.weight_offset(t), l.rows(t) * l.dim(t))
                        .reshape({l.rows(t), l.dim(t)});
        grads[size_t(t)] = flat.buffer.dtype() == DType::kF32 ? gt : gt.to(flat.buffer.dtype());
      }
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
  const Checked c = check_inputs(layout, indices, offsets, per_sample_weights, options);
  const kernels::EmbeddingTables k = layout.kernel_tables(flat.buffer.dtype());
  EmbeddingSparseGradient result;
  visit_index_dtype(c.indices.dtype(), [&](auto tag) {
    using I = decltype(tag);
    const Shape out_shape = validate<I>(layout, k, c, options);
    detail::check_f32(kOp, "dout", dout);
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
