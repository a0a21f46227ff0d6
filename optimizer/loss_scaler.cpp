#include "optimizer/loss_scaler.h"

#include <cmath>

#include "core/error.h"

namespace loom::optim {

LossScaler::LossScaler(const LossScalerOptions& options)
    : options_(options), scale_(options.init_scale) {
  LOOM_CHECK(std::isfinite(options.init_scale) && options.init_scale > 0,
             "LossScaler: init_scale must be positive, got ", options.init_scale);
  LOOM_CHECK(options.growth_factor >= 1, "LossScaler: growth_factor must be >= 1, got ",
             options.growth_factor);
  LOOM_CHECK(options.backoff_factor > 0 && options.backoff_factor <= 1,
             "LossScaler: backoff_factor must be in (0, 1], got ", options.backoff_factor);
  LOOM_CHECK(options.growth_interval >= 1, "LossScaler: growth_interval must be >= 1, got ",
             options.growth_interval);
}

LossScaler LossScaler::none() {
  LossScalerOptions o;
  o.init_scale = 1.0;
  o.dynamic = false;
  return LossScaler(o);
}

void LossScaler::update(bool found_nonfinite) {
  last_skipped_ = found_nonfinite;
  if (found_nonfinite) {
    ++skipped_;
    good_in_a_row_ = 0;
    if (options_.dynamic) scale_ *= options_.backoff_factor;
    return;
  }
  if (options_.dynamic && ++good_in_a_row_ == options_.growth_interval) {
    scale_ *= options_.growth_factor;
    good_in_a_row_ = 0;
  }
}

void LossScaler::restore(const LossScalerState& state) {
  LOOM_CHECK(std::isfinite(state.scale) && state.scale > 0 && state.good_in_a_row >= 0 &&
                 state.skipped >= 0,
             "LossScaler::restore: scale ", state.scale, ", ", state.good_in_a_row,
             " good steps in a row and ", state.skipped,
             " skipped are not a scaler's state (a positive scale, counts >= 0)");
  scale_ = state.scale;
  good_in_a_row_ = state.good_in_a_row;
  skipped_ = state.skipped;
  last_skipped_ = false;
}

std::string LossScaler::str() const {
  if (!options_.dynamic && scale_ == 1.0) return "none";
  return detail::str_cat(options_.dynamic ? "dynamic" : "static", ", scale ", scale_);
}

}  // namespace loom::optim
