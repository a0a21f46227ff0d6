// What a rank keeps in memory for training, by kind: the figures ZeRO's savings are stated in
// (bytes per parameter: f32 with Adam, 16 replicated; stage 1, 8 + 8/N; stage 2, 4 + 12/N;
// stage 3, 16/N).
#pragma once

#include <cstddef>
#include <string>

#include <cstdio>

#include "core/error.h"

namespace loom::parallel {

struct TrainingMemory {
  size_t parameters = 0;
  size_t gradients = 0;
  size_t optimizer_state = 0;
  size_t total() const { return parameters + gradients + optimizer_state; }
  // "parameters 1.2 MB, gradients 1.2 MB, optimizer state 0.6 MB (3.0 MB)"
  std::string str() const {
    auto mb = [](size_t b) { return double(b) / 1e6; };
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "parameters %.2f MB, gradients %.2f MB, optimizer state %.2f MB (%.2f MB)",
                  mb(parameters), mb(gradients), mb(optimizer_state), mb(total()));
    return buf;
  }
};

}  // namespace loom::parallel
