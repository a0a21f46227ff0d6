// Global-norm gradient clipping of a tensor-parallel model, equal to clipping the single-process
// model: the squares of a tp-sharded parameter's gradient (one with a ShardSpec) add over the tp
// ranks, while a whole parameter's gradient (LayerNorms, wpe, row-parallel biases), the same on
// every tp rank, counts once. (ZeroOptimizer does the same over its shards given ZeroOptions::tp.)
#pragma once

#include <functional>
#include <string>

#include "core/nn/module.h"
#include "parallel/tensor_parallel/tp_comm.h"

namespace loom::parallel {

// The model's squared gradient norm, the same on every rank of `tp`. Collective over tp.
double tp_grad_sum_of_squares(const nn::Module& model, comm::Communicator& tp);
// The same over the parameters whose names `counted` accepts (e.g. a MoE's experts, or all but
// them). Collective over tp.
double tp_grad_sum_of_squares(const nn::Module& model, comm::Communicator& tp,
                              const std::function<bool(const std::string&)>& counted);

// Scales every gradient so the global norm is at most max_norm (as optim::clip_grad_norm);
// returns the norm before clipping. Collective over tp.
double tp_clip_grad_norm(const nn::Module& model, double max_norm, comm::Communicator& tp);

}  // namespace loom::parallel
