#include "core/nn/embedding.h"

#include "core/ops.h"

namespace loom::nn {

Embedding::Embedding(int64_t num_embeddings, int64_t dim, const Init& init)
    : num_(num_embeddings), dim_(dim) {
  LOOM_CHECK(num_embeddings > 0 && dim > 0, "Embedding: sizes must be positive, got ",
             num_embeddings, " x ", dim);
  weight = register_parameter("weight", {num_embeddings, dim}, init);
}

Tensor Embedding::forward(const Tensor& indices) { return embedding(weight, indices); }

}  // namespace loom::nn
