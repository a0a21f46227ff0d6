// Dropout module and the process-wide dropout seed and step; see Note [Dropout keys].
#include "core/nn/dropout.h"

#include <atomic>

#include "core/ops.h"
#include "core/rng.h"

namespace loom::nn {

namespace {
std::atomic<uint64_t> g_dropout_seed{0};
std::atomic<uint64_t> g_dropout_step{0};
DropoutBatchPart g_batch_part;  // set by the training loop's thread
}  // namespace

void set_dropout_seed(uint64_t seed) { g_dropout_seed = seed; }
uint64_t dropout_seed() { return g_dropout_seed; }
void set_dropout_step(uint64_t step) {
  LOOM_CHECK(step < (uint64_t(1) << 32), "set_dropout_step: step ", step,
             " must be below 2^32 (it is the high half of the Philox offset)");
  g_dropout_step = step;
}
uint64_t dropout_step() { return g_dropout_step; }

void set_dropout_batch_part(DropoutBatchPart batch_part) {
  LOOM_CHECK(batch_part.parts >= 1 && batch_part.part >= 0 && batch_part.part < batch_part.parts,
             "set_dropout_batch_part: part ", batch_part.part, " of ", batch_part.parts,
             " is not a part");
  g_batch_part = batch_part;
}
DropoutBatchPart dropout_batch_part() { return g_batch_part; }

DropoutStepGuard::DropoutStepGuard(uint64_t step, DropoutBatchPart batch_part)
    : previous_(dropout_step()), previous_part_(dropout_batch_part()) {
  set_dropout_step(step);
  set_dropout_batch_part(batch_part);
}
DropoutStepGuard::~DropoutStepGuard() {
  g_dropout_step = previous_;
  g_batch_part = previous_part_;
}

Dropout::Dropout(double p) : p_(p) {
  LOOM_CHECK(p >= 0.0 && p < 1.0, "Dropout: probability p must be in [0, 1), got ", p);
}

Tensor Dropout::forward(const Tensor& x) {
  if (!is_training() || p_ == 0.0) return x;
  LOOM_CHECK(x.numel() <= (int64_t(1) << 32), "Dropout '", full_name(), "': ", x.numel(),
             " elements in one call exceed 2^32 (See Note [Dropout keys])");
  const DropoutBatchPart rows = dropout_batch_part();
  const int64_t whole = x.numel() * parts_ * rows.parts;  // elements of the whole tensor
  LOOM_CHECK(whole <= (int64_t(1) << 32), "Dropout '", full_name(), "': ", whole,
             " elements in one call exceed 2^32 (See Note [Dropout keys])");
  DropoutKey key{dropout_seed(),
                 rng::stream_of(full_name()),
                 dropout_step() << 32,
                 part_dim_,
                 part_,
                 parts_,
                 rows.part,
                 rows.parts};
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
