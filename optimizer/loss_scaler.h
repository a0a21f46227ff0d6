// Loss scaling for f16 training (Micikevicius et al., "Mixed Precision Training"): the loss is
// multiplied by `scale` before backward so small gradients survive f16's narrow range, and the
// gradients are divided by it before the update. Dynamic scaling, as torch.cuda.amp.GradScaler:
// a step whose gradients hold an inf or nan is skipped and the scale backs off; after
// growth_interval good steps in a row the scale grows.
//
// bf16 has f32's range, so it needs no scaling: LossScaler::none() keeps the scale at 1, but a
// non-finite gradient still skips the step (and is counted), so a bad step never reaches the
// weights in any dtype.
#pragma once

#include <cstdint>
#include <string>

namespace loom::optim {

struct LossScalerOptions {  // torch.cuda.amp.GradScaler's defaults
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool dynamic = true;  // false: the scale stays init_scale
};

// What a checkpoint keeps of a scaler so a resumed run scales, skips and grows as the
// uninterrupted one would.
struct LossScalerState {
  double scale = 1.0;
  int64_t good_in_a_row = 0;
  int64_t skipped = 0;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerOptions& options = {});
  // Scale 1, never changing (bf16, f32).
  static LossScaler none();

  double scale() const { return scale_; }
  // After each step: found_nonfinite means the step was skipped.
  void update(bool found_nonfinite);
  int64_t skipped_steps() const { return skipped_; }
  bool last_step_skipped() const { return last_skipped_; }
  // "dynamic, scale 65536" or "none"
  std::string str() const;
  LossScalerState state() const { return {scale_, good_in_a_row_, skipped_}; }
  // Throws, changing nothing, for a scale that is not positive and finite or negative counts.
  void restore(const LossScalerState& state);

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t good_in_a_row_ = 0;
  int64_t skipped_ = 0;
  bool last_skipped_ = false;
};

}  // namespace loom::optim
