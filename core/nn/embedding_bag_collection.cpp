// EmbeddingBagCollection: per-table parameters that are views of one flat buffer. See the header.
#include "core/nn/embedding_bag_collection.h"

#include <cmath>

namespace loom::nn {
namespace {

EmbeddingBagLayout layout_of(const std::vector<EmbeddingTableConfig>& tables) {
  std::vector<int64_t> rows, dims;
  std::vector<std::string> names;
  for (const EmbeddingTableConfig& t : tables) {
    rows.push_back(t.rows);
    dims.push_back(t.dim);
    names.push_back(t.name);
  }
  return EmbeddingBagLayout(rows, dims, names);
}

// One table as a module, so its parameter is called "<table>.weight".
class EmbeddingTable : public Module {
 public:
  EmbeddingTable(int64_t rows, int64_t dim) {
    weight = register_parameter("weight", {rows, dim},
                                Init::normal(std::sqrt(1.0 / (3.0 * double(rows)))));
  }
  Tensor weight;  // [rows, dim]
};

}  // namespace

EmbeddingBagCollection::EmbeddingBagCollection(std::vector<EmbeddingTableConfig> tables,
                                               EmbeddingBagCollectionOptions options)
    : configs_(std::move(tables)), options_(options) {
  LOOM_CHECK(!configs_.empty(), "EmbeddingBagCollection: no tables");
  layout_ = layout_of(configs_);
  for (const EmbeddingTableConfig& t : configs_) {
    LOOM_CHECK(t.rows > 0, "EmbeddingBagCollection: table '", t.name, "' has ", t.rows, " rows");
    weights_.push_back(
        register_module(t.name, std::make_shared<EmbeddingTable>(t.rows, t.dim))->weight);
  }
  flatten();
  if (options_.fused.kind != EmbeddingOptimizer::kNone)
    fused_ = std::make_shared<EmbeddingFusedOptimizer>(options_.fused, layout_);
}

void EmbeddingBagCollection::flatten() {
  if (embedding_tables_packed(weights_, layout_)) return;
  Tensor buffer =
      Tensor::empty({layout_.total_elements()}, weights_[0].dtype(), weights_[0].device());
  for (size_t t = 0; t < weights_.size(); ++t) {
    Tensor view = make_view(buffer, weights_[t].shape(), {layout_.dim(int64_t(t)), 1},
                            layout_.weight_offset(int64_t(t)));
    view.copy_(weights_[t].detach());
    weights_[t].set_data(view);  // keeps the parameter's identity (gradient, hooks)
  }
}

Tensor EmbeddingBagCollection::lookup(const Tensor& indices, const Tensor& offsets,
                                      const Tensor& per_sample_weights) {
  flatten();
  EmbeddingBagOptions o;
  o.pooling = options_.pooling;
  o.bounds_check = options_.bounds_check;
  o.fused = fused_;
  return embedding_bag(weights_, layout_, indices, offsets, per_sample_weights, o);
}

}  // namespace loom::nn
