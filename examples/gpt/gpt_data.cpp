#include "gpt/gpt_data.h"

#include <algorithm>

#include "core/io/text_file.h"
#include "core/io/token_file.h"

namespace loom::gpt {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

constexpr int64_t kGpt2Vocab = 50257;

}  // namespace

GptData load_gpt_data(const GptOptions& o) {
  GptData d;
  if (o.data.empty()) {
    io::AdditionOptions task_options;
    task_options.digits = o.digits;
    task_options.seed = o.seed;
    d.task = std::make_unique<io::AdditionTask>(task_options);
    if (o.eval_only) {
      // --eval-only on the task measures held-out examples, laid end to end as in training.
      io::AdditionEvalSet set = d.task->heldout_set(o.eval_examples);
      d.tokens = set.tokens.to_vector<int32_t>();
    } else {
      // Enough examples that training never wraps (it would still be correct, only repetitive).
      const int64_t needed =
          (std::max<int64_t>(o.steps, 1) * o.batch * o.seq) / d.task->example_len() + 2;
      d.tokens = d.task->train_stream(std::max<int64_t>(needed, 1000));
    }
    d.vocab = io::AdditionTask::kVocab;
    int64_t operand_limit = 1;  // 10^digits: the banner's example must fit any --digits
    for (int64_t k = 0; k < o.digits; ++k) operand_limit *= 10;
    d.description = detail::str_cat(
        "built-in task: ", o.digits, "-digit addition, reversed sum (", d.task->example_len(),
        " tokens per example, e.g. ",
        io::AdditionTask::decode(d.task->encode_example(123 % operand_limit, 45 % operand_limit)),
        ")");
    // The decoded example ends with a newline; drop it for a one-line banner.
    d.description.erase(std::remove(d.description.begin(), d.description.end(), '\n'),
                        d.description.end());
  } else if (ends_with(o.data, ".bin")) {
    d.tokens = io::read_token_file(o.data);
    d.vocab = kGpt2Vocab;
    d.description = detail::str_cat("llm.c token file ", o.data, " (", d.tokens.size(), " tokens)");
  } else {
    d.tokens = io::read_text_file(o.data);
    d.vocab = io::kByteVocab;
    d.description = detail::str_cat("byte-level text ", o.data, " (", d.tokens.size(), " bytes)");
  }
  return d;
}

}  // namespace loom::gpt
