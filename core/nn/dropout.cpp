// Dropout module and the process-wide dropout seed and step; see Note [Dropout keys].
#include "core/nn/dropout.h"

#include <atomic>

#include "core/ops.h"
#include "core/rng.h"

namespace loom::nn {

namespace {
std::atomic<uint64_t> g_dropout_seed{0};
std::atomic<uint64_t> g_dropout_step{0};
}  // namespace

void set_dropout_seed(uint64_t seed) { g_dropout_seed = seed; }
uint64_t dropout_seed() { return g_dropout_seed; }
void set_dropout_step(uint64_t step) {
  LOOM_CHECK(step < (uint64_t(1) << 32), "set_dropout_step: step ", step,
             " must be below 2^32 (it is the high half of the Philox offset)");
  g_dropout_step = step;
}
uint64_t dropout_step() { return g_dropout_step; }

DropoutStepGuard::DropoutStepGuard(uint64_t step) : previous_(dropout_step()) {
  set_dropout_step(step);
}
DropoutStepGuard::~DropoutStepGuard() { g_dropout_step = previous_; }

Dropout::Dropout(double p) : p_(p) {
  LOOM_CHECK(p >= 0.0 && p < 1.0, "Dropout: probability p must be in [0, 1), got ", p);
}

Tensor Dropout::forward(const Tensor& x) {
  if (!is_training() || p_ == 0.0) return x;
  LOOM_CHECK(x.numel() <= (int64_t(1) << 32), "Dropout '", full_name(), "': ", x.numel(),
             " elements in one call exceed 2^32 (See Note [Dropout keys])");
  LOOM_CHECK(x.numel() * parts_ <= (int64_t(1) << 32), "Dropout '", full_name(),
             "': ", x.numel() * parts_,
             " elements in one call exceed 2^32 (See Note [Dropout keys])");
  DropoutKey key{
      dropout_seed(), rng::stream_of(full_name()), dropout_step() << 32, part_dim_, part_, parts_};
  return dropout(x, p_, true, key);
}

void Dropout::set_part(int64_t dim, int64_t part, int64_t parts) {
  LOOM_CHECK(dim >= 0 && parts >= 1 && part >= 0 && part < parts, "Dropout '", full_name(),
             "': part ", part, " of ", parts, " along dim ", dim, " is not a part");
  part_dim_ = dim;
  part_ = part;
  parts_ = parts;
}

}  // namespace loom::nn
