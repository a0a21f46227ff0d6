// DLRM's dense part (Naumov et al. 2019): a bottom MLP on the dense features, a pairwise dot
// interaction of its output with the pooled embeddings, and a top MLP that gives one logit.
// The embeddings themselves are looked up outside (an nn::EmbeddingBagCollection on one process,
// parallel::ShardedEmbeddingBagCollection under mpirun), so this module is the data-parallel part.
//
//   dense [B, num_dense] -> bottom MLP -> x [B, D]
//   pooled [B, T*D] -> [B, T, D];  z = dot_interaction([x; pooled]) [B, (T+1)T/2]
//   top MLP([x, z]) -> logit [B]
#pragma once

#include <memory>
#include <vector>

#include "core/nn/linear.h"
#include "core/nn/module.h"

namespace loom::dlrm {

struct DlrmConfig {
  int64_t num_dense = 13;
  int64_t num_tables = 8;
  int64_t dim = 16;                    // D: every table's embedding dim (the interaction needs one)
  std::vector<int64_t> bottom = {64};  // hidden widths; the bottom MLP ends at D
  std::vector<int64_t> top = {64, 32};  // hidden widths; the top MLP ends at 1
};

// Linear layers with ReLU between them (and after the last when relu_last).
class Mlp : public nn::Module {
 public:
  Mlp(const std::vector<int64_t>& widths, bool relu_last);
  Tensor forward(const Tensor& x) override;

 private:
  std::vector<std::shared_ptr<nn::Linear>> layers_;
  bool relu_last_;
};

class DlrmDense : public nn::Module {
 public:
  explicit DlrmDense(const DlrmConfig& config);
  // dense [B, num_dense], pooled [B, T*D] -> logits [B].
  Tensor logits(const Tensor& dense, const Tensor& pooled);
  const DlrmConfig& config() const { return config_; }

 private:
  DlrmConfig config_;
  std::shared_ptr<Mlp> bottom_, top_;
};

}  // namespace loom::dlrm
