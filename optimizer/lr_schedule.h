// Learning-rate schedules, as llm.c and nanoGPT use them. Steps count from 0.
//
//   warmup (step < warmup_steps):  lr = max_lr * (step + 1) / warmup_steps
//   constant afterwards:           lr = max_lr
//   cosine afterwards:             r = min(1, (step - warmup_steps) / (total_steps - warmup_steps))
//                                  lr = min_lr + 0.5 * (1 + cos(pi * r)) * (max_lr - min_lr)
// so a cosine schedule reaches max_lr at step warmup_steps and min_lr at step total_steps (and
// stays there past it).
#pragma once

#include <cstdint>
#include <string>

namespace loom::optim {

struct LrSchedule {
  enum class Kind { kConstant, kCosine };
  Kind kind = Kind::kConstant;
  double max_lr = 0.0;
  double min_lr = 0.0;  // cosine only
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;  // cosine only

  static LrSchedule constant(double lr, int64_t warmup_steps = 0);
  // min_lr is usually max_lr times a ratio (llm.c's final_lr_frac, e.g. 0.0 or 0.1).
  static LrSchedule cosine(double max_lr, double min_lr, int64_t warmup_steps, int64_t total_steps);

  double lr(int64_t step) const;
  std::string str() const;
};

}  // namespace loom::optim
