// Learning-rate schedules; the formulas are in lr_schedule.h.
#include "optimizer/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace loom::optim {

LrSchedule LrSchedule::constant(double lr, int64_t warmup_steps) {
  LOOM_CHECK(lr >= 0.0, "LrSchedule: learning rate must be >= 0, got ", lr);
  LOOM_CHECK(warmup_steps >= 0, "LrSchedule: warmup steps must be >= 0, got ", warmup_steps);
  return LrSchedule{Kind::kConstant, lr, lr, warmup_steps, 0};
}

LrSchedule LrSchedule::cosine(double max_lr, double min_lr, int64_t warmup_steps,
                              int64_t total_steps) {
  LOOM_CHECK(max_lr >= 0.0 && min_lr >= 0.0 && min_lr <= max_lr,
             "LrSchedule: need 0 <= min_lr <= max_lr, got min_lr ", min_lr, " max_lr ", max_lr);
  LOOM_CHECK(warmup_steps >= 0, "LrSchedule: warmup steps must be >= 0, got ", warmup_steps);
  LOOM_CHECK(total_steps > warmup_steps, "LrSchedule: total steps (", total_steps,
             ") must exceed warmup steps (", warmup_steps, ")");
  return LrSchedule{Kind::kCosine, max_lr, min_lr, warmup_steps, total_steps};
}

double LrSchedule::lr(int64_t step) const {
  LOOM_CHECK(step >= 0, "LrSchedule: step must be >= 0, got ", step);
  if (step < warmup_steps) return max_lr * double(step + 1) / double(warmup_steps);
  if (kind == Kind::kConstant) return max_lr;
  const double r = std::min(1.0, double(step - warmup_steps) / double(total_steps - warmup_steps));
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * r)) * (max_lr - min_lr);
}

std::string LrSchedule::str() const {
  if (kind == Kind::kConstant)
    return detail::str_cat("constant ", max_lr, " (warmup ", warmup_steps, ")");
  return detail::str_cat("cosine ", max_lr, " -> ", min_lr, " over ", total_steps,
                         " steps (warmup ", warmup_steps, ")");
}

}  // namespace loom::optim
