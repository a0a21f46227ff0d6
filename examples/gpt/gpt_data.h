// Where loom-gpt's tokens come from: the built-in addition task (the default), an llm.c token
// file (.bin), or a byte-level text file (anything else).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/io/addition_task.h"
#include "gpt/gpt_options.h"

namespace loom::gpt {

struct GptData {
  std::string description;      // for the start-up banner
  std::vector<int32_t> tokens;  // the stream training and --eval-only read batches from
  int64_t vocab = 0;            // the data's natural vocabulary (task 14, text 256, tokens 50257)
  std::unique_ptr<io::AdditionTask> task;  // set for the built-in task
};

GptData load_gpt_data(const GptOptions& options);

}  // namespace loom::gpt
