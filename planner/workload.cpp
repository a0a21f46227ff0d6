#include "planner/workload.h"

#include <cstdio>

#include "core/error.h"

namespace loom::planner {

double TransformerShape::layer_parameters() const {
  const double h = double(hidden);
  return 12.0 * h * h + 13.0 * h;
}

double TransformerShape::embedding_parameters() const {
  return double(vocab) * double(hidden) + double(seq) * double(hidden);
}

double TransformerShape::parameters() const {
  return double(layers) * layer_parameters() + embedding_parameters() + 2.0 * double(hidden);
}

double TransformerShape::layer_forward_flops() const {
  const double h = double(hidden), s = double(seq);
  return 24.0 * s * h * h + 4.0 * s * s * h;
}

double TransformerShape::logits_forward_flops() const {
  return 2.0 * double(seq) * double(hidden) * double(vocab);
}

double TransformerShape::step_model_flops(int64_t sequences) const {
  return 3.0 * (double(layers) * layer_forward_flops() + logits_forward_flops()) *
         double(sequences);
}

void TransformerShape::check() const {
  LOOM_CHECK(layers > 0 && hidden > 0 && heads > 0 && seq > 0 && vocab > 0,
             "planner: the model's layers, hidden, heads, seq and vocab must be positive, got ",
             str());
  LOOM_CHECK(hidden % heads == 0, "planner: heads (", heads, ") must divide hidden (", hidden, ")");
}

std::string TransformerShape::str() const {
  char buf[160];
  std::snprintf(buf, sizeof buf, "layers %lld hidden %lld heads %lld seq %lld vocab %lld (%.2fB)",
                (long long)layers, (long long)hidden, (long long)heads, (long long)seq,
                (long long)vocab, parameters() / 1e9);
  return buf;
}

void Workload::check() const {
  model.check();
  LOOM_CHECK(global_batch > 0, "planner: the global batch must be positive, got ", global_batch);
}

}  // namespace loom::planner
