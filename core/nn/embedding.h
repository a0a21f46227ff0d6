// Embedding: a lookup table of rows. GPT-2 init: normal(0, 0.02); a padded vocabulary's extra
// rows can be kept zero with Init::with_zero_rows_from.
#pragma once

#include "core/nn/module.h"

namespace loom::nn {

class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim, const Init& init = Init::normal(0.02));
  Tensor forward(const Tensor& indices) override;  // i32/i64 [...] -> [..., dim]

  int64_t num_embeddings() const { return num_; }
  int64_t dim() const { return dim_; }

  Tensor weight;  // [num_embeddings, dim]

 protected:
  void parameter_tied(const std::string&, const Tensor& tensor) override { weight = tensor; }

 private:
  int64_t num_, dim_;
};

}  // namespace loom::nn
