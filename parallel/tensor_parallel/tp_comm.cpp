#include "parallel/tensor_parallel/tp_comm.h"

#include "core/autograd.h"
#include "core/ops.h"

namespace loom::parallel {
namespace {

int64_t wrap(const char* op, int64_t dim, const Tensor& x) {
  const int64_t n = x.dim();
  LOOM_CHECK(dim >= -n && dim < n, op, ": dim ", dim, " out of range for ", x.str());
  return dim < 0 ? dim + n : dim;
}

void check_group(const char* op, const GroupPtr& tp, const Tensor& x) {
  LOOM_CHECK(tp != nullptr, op, ": the tp group is null");
  LOOM_CHECK(x.defined(), op, ": the input is undefined");
}

// This rank's slice along dim (a contiguous copy).
Tensor own_slice(const char* op, const Tensor& x, const comm::Communicator& group, int64_t dim) {
  const int64_t n = group.size(), len = x.size(dim);
  LOOM_CHECK(len % n == 0, op, ": size ", len, " of dim ", dim, " of ", x.str(),
             " does not divide over the ", n, " ranks of group '", group.name(), "'");
  return x.detach().narrow(dim, group.rank() * (len / n), len / n).contiguous();
}

}  // namespace

Tensor all_gather_along(const Tensor& x, comm::Communicator& group, int64_t dim) {
  dim = wrap("all_gather_along", dim, x);
  NoGradGuard no_grad;
  const int64_t n = group.size();
  Tensor in = x.detach().contiguous();
  if (n == 1) return in.clone();
  Tensor flat = Tensor::empty({n * in.numel()}, in.dtype(), in.device());
  group.allgather(in.reshape({in.numel()}), flat)->wait();
  if (dim == 0) {
    Shape shape = in.shape();
    shape[0] *= n;
    return flat.reshape(shape);
  }
  std::vector<Tensor> pieces;
  for (int64_t r = 0; r < n; ++r)
    pieces.push_back(flat.narrow(0, r * in.numel(), in.numel()).reshape(in.shape()));
  return cat(pieces, dim);
}

Tensor reduce_scatter_along(const Tensor& x, comm::Communicator& group, int64_t dim) {
  dim = wrap("reduce_scatter_along", dim, x);
  NoGradGuard no_grad;
  const int64_t n = group.size(), len = x.size(dim);
  LOOM_CHECK(len % n == 0, "reduce_scatter_along: size ", len, " of dim ", dim, " of ", x.str(),
             " does not divide over the ", n, " ranks of group '", group.name(), "'");
  Tensor in = x.detach().contiguous();
  if (n == 1) return in.clone();
  Shape local = in.shape();
  local[size_t(dim)] = len / n;
  // Rank r's chunk of the flat input must be slice r along dim.
  Tensor flat;
  if (dim == 0) {
    flat = in.reshape({in.numel()});
  } else {
    std::vector<Tensor> pieces;
    for (int64_t r = 0; r < n; ++r)
      pieces.push_back(in.narrow(dim, r * (len / n), len / n).contiguous().reshape({-1}));
    flat = cat(pieces, 0);
  }
  Tensor out = Tensor::empty({flat.numel() / n}, in.dtype(), in.device());
  group.reduce_scatter(flat, out)->wait();
  return out.reshape(local);
}

Tensor copy_to_tp(const Tensor& x, const GroupPtr& tp) {
  check_group("copy_to_tp", tp, x);
  if (tp->size() == 1) return x;
  Tensor out = make_view(x, x.shape(), x.strides(), x.offset());
  autograd::record(out, "copy_to_tp", {x}, {}, [tp](const Tensor& g) {
    Tensor sum = g.detach().contiguous().clone();
    tp->allreduce(sum)->wait();
    return std::vector<Tensor>{sum};
  });
  autograd::mark_view(out, x);  // it shares x's memory
  return out;
}

Tensor reduce_from_tp(const Tensor& x, const GroupPtr& tp) {
  check_group("reduce_from_tp", tp, x);
  if (tp->size() == 1) return x;
  Tensor out = x.detach().contiguous().clone();
  tp->allreduce(out)->wait();
  autograd::record(out, "reduce_from_tp", {x}, {},
                   [](const Tensor& g) { return std::vector<Tensor>{g}; });
  return out;
}

Tensor gather_from_tp(const Tensor& x, const GroupPtr& tp, int64_t dim) {
  check_group("gather_from_tp", tp, x);
  dim = wrap("gather_from_tp", dim, x);
  if (tp->size() == 1) return x;
  Tensor out = all_gather_along(x, *tp, dim);
  autograd::record(out, "gather_from_tp", {x}, {}, [tp, dim](const Tensor& g) {
    return std::vector<Tensor>{own_slice("gather_from_tp backward", g, *tp, dim)};
  });
  return out;
}

Tensor scatter_to_tp(const Tensor& x, const GroupPtr& tp, int64_t dim) {
  check_group("scatter_to_tp", tp, x);
  dim = wrap("scatter_to_tp", dim, x);
  if (tp->size() == 1) return x;
  Tensor out = own_slice("scatter_to_tp", x, *tp, dim);
  autograd::record(out, "scatter_to_tp", {x}, {}, [tp, dim](const Tensor& g) {
    return std::vector<Tensor>{all_gather_along(g, *tp, dim)};
  });
  return out;
}

Tensor gather_sequence(const Tensor& x, const GroupPtr& tp, int64_t dim) {
  check_group("gather_sequence", tp, x);
  dim = wrap("gather_sequence", dim, x);
  if (tp->size() == 1) return x;
  Tensor out = all_gather_along(x, *tp, dim);
  autograd::record(out, "gather_sequence", {x}, {}, [tp, dim](const Tensor& g) {
    return std::vector<Tensor>{reduce_scatter_along(g, *tp, dim)};
  });
  return out;
}

Tensor reduce_scatter_sequence(const Tensor& x, const GroupPtr& tp, int64_t dim) {
  check_group("reduce_scatter_sequence", tp, x);
  dim = wrap("reduce_scatter_sequence", dim, x);
  if (tp->size() == 1) return x;
  Tensor out = reduce_scatter_along(x, *tp, dim);
  autograd::record(out, "reduce_scatter_sequence", {x}, {}, [tp, dim](const Tensor& g) {
    return std::vector<Tensor>{all_gather_along(g, *tp, dim)};
  });
  return out;
}

}  // namespace loom::parallel
