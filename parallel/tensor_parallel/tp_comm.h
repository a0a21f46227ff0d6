// The communication of tensor parallelism as autograd ops (Megatron's f, g and their sequence-
// parallel counterparts): each is a collective over the tp group in forward and its conjugate in
// backward. Collectives know no autograd; these live in parallel/ and join the two.
//
//   region boundary            forward                      backward
//   copy_to_tp                 identity                     allreduce (sum)
//   reduce_from_tp             allreduce (sum)              identity
//   gather_from_tp(dim)        all-gather along dim         this rank's slice
//   scatter_to_tp(dim)         this rank's slice            all-gather along dim
//   gather_sequence(dim)       all-gather along dim         reduce-scatter (sum) along dim
//   reduce_scatter_sequence    reduce-scatter (sum)         all-gather along dim
//
// Slices along `dim` are in rank order: rank r holds [r * n / tp, (r + 1) * n / tp).
#pragma once

#include <memory>

#include "collectives/communicator.h"
#include "core/tensor.h"

namespace loom::parallel {

using GroupPtr = std::shared_ptr<comm::Communicator>;

Tensor copy_to_tp(const Tensor& x, const GroupPtr& tp);
Tensor reduce_from_tp(const Tensor& x, const GroupPtr& tp);
Tensor gather_from_tp(const Tensor& x, const GroupPtr& tp, int64_t dim);
Tensor scatter_to_tp(const Tensor& x, const GroupPtr& tp, int64_t dim);
Tensor gather_sequence(const Tensor& x, const GroupPtr& tp, int64_t dim);
Tensor reduce_scatter_sequence(const Tensor& x, const GroupPtr& tp, int64_t dim);

// Without autograd: the whole tensor from every rank's slice along dim, and this rank's slice of
// the sum over ranks (x's size at dim must divide by the group size).
Tensor all_gather_along(const Tensor& x, comm::Communicator& group, int64_t dim);
Tensor reduce_scatter_along(const Tensor& x, comm::Communicator& group, int64_t dim);

}  // namespace loom::parallel
