// EmbeddingBagCollection: T embedding tables looked up together by one table-batched
// embedding_bag call (core/embedding_bag.h), the module a recommendation model (DLRM) holds.
//
//   nn::EmbeddingBagCollection ebc({{"user", 1000, 16}, {"item", 5000, 16}});
//   ebc.init_parameters(seed);
//   Tensor pooled = ebc.lookup(indices, offsets);  // [B, 32]: user's columns, then item's
//
// Each table is a parameter "<name>.weight" [rows, dim] (so state dicts and optimizers see one
// tensor per table), but all of them are views of one flat buffer laid out as the kernels want,
// so a lookup reads them in place and a fused optimizer updates them there. Init: normal with
// std sqrt(1 / (3 rows)), the variance of DLRM's uniform(-sqrt(1/rows), sqrt(1/rows)).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/embedding_bag.h"
#include "core/nn/module.h"

namespace loom::nn {

struct EmbeddingTableConfig {
  std::string name;  // no dots
  int64_t rows = 0;
  int64_t dim = 0;  // a multiple of 4
};

struct EmbeddingBagCollectionOptions {
  EmbeddingPooling pooling = EmbeddingPooling::kSum;
  EmbeddingBoundsCheck bounds_check = EmbeddingBoundsCheck::kError;
  // kNone: the tables get dense gradients, for any loom optimizer. Otherwise the backward
  // updates the looked-up rows in place with these hyper-parameters (FBGEMM's fused backward)
  // and the tables get no gradient.
  kernels::EmbeddingOptimizerHyper fused;
};

class EmbeddingBagCollection : public Module {
 public:
  explicit EmbeddingBagCollection(std::vector<EmbeddingTableConfig> tables,
                                  EmbeddingBagCollectionOptions options = {});

  // indices / offsets: CSR, feature-major over this collection's tables (See
  // core/embedding_bag.h). Returns [B, total_dim] (sum, mean) or the packed rows (none).
  Tensor lookup(const Tensor& indices, const Tensor& offsets,
                const Tensor& per_sample_weights = Tensor());

  const std::vector<EmbeddingTableConfig>& tables() const { return configs_; }
  const EmbeddingBagLayout& layout() const { return layout_; }
  const std::vector<Tensor>& weights() const { return weights_; }  // [rows, dim] per table
  // The fused optimizer's state (null without one).
  const std::shared_ptr<EmbeddingFusedOptimizer>& fused_optimizer() const { return fused_; }

 private:
  // Puts the tables back into one buffer when something (Module::to, load_state_dict through
  // set_data) gave them memory of their own.
  void flatten();

  std::vector<EmbeddingTableConfig> configs_;
  EmbeddingBagCollectionOptions options_;
  EmbeddingBagLayout layout_;
  std::vector<Tensor> weights_;
  std::shared_ptr<EmbeddingFusedOptimizer> fused_;
};

}  // namespace loom::nn
