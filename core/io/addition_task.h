// The built-in synthetic task, loom's default training data: multi-digit addition with the sum
// written least-significant digit first, the order in which a left-to-right model can compute
// carries. Nothing to download, learnable in minutes on two cores, with an exact metric.
//
// Format (D = digits, default 3). One example is 3D + 4 tokens:
//   a (D digits, zero-padded) '+' b (D digits) '=' c (D + 1 digits, reversed) end
// e.g. D = 3, 123 + 45 = 168:  "123+045=8610\n". Every example has the same length, so examples
// can be laid out in aligned rows. Vocabulary: '0'..'9' are tokens 0..9, '+' 10, '=' 11, the end
// of an example 12, padding 13 (reserved; generated data never contains it): 14 tokens, which a
// model may pad to 16 (kPaddedVocab).
//
// Splits: a pair is held out when a hash of the unordered pair {a, b} says so. The hash does not
// depend on the seed, so models trained with any seed are scored on examples none of them saw,
// and a + b is held out together with b + a. The seed only chooses which examples are drawn.
//
// Metric: exact match. An example is right when, at each of its D + 1 answer positions, the
// argmax of the logits (over the task's 14 tokens) is the true digit. The logits are computed with
// teacher forcing (the true earlier digits in the context); for an example all of whose
// argmaxes are right this is the same context greedy decoding would build digit by digit, so
// exact match under teacher forcing equals exact match of greedy decoding.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace loom::io {

struct AdditionOptions {
  int64_t digits = 3;            // D, 1..9: operands are 0 .. 10^D - 1
  uint64_t seed = 1337;          // which examples are drawn (not the split)
  int64_t heldout_percent = 10;  // share of pairs held out, 1..99
};

// Held-out examples as aligned rows, ready to feed to a model.
struct AdditionEvalSet {
  Tensor tokens;  // i32 [rows, examples_per_row * example_len], on the CPU
  int64_t examples_per_row = 1;
  int64_t answer_digits = 0;  // D + 1 per example
  // Positions within a row whose logits predict an answer digit: the logits at position p
  // predict tokens[row, p + 1]. Grouped by example, answer_digits entries each, in row order.
  std::vector<int64_t> answer_positions;

  int64_t rows() const { return tokens.size(0); }
  int64_t num_examples() const { return rows() * examples_per_row; }
  // Inputs a model needs to see: positions 0 .. last answer position (the final end token is
  // never an input whose prediction matters).
  int64_t input_len() const { return answer_positions.back() + 1; }
};

struct ExactMatch {
  int64_t correct = 0;
  int64_t total = 0;
  double accuracy() const { return total ? double(correct) / double(total) : 0.0; }
};

struct AdditionExample {
  int64_t a = 0;
  int64_t b = 0;
  int64_t sum = 0;  // as written in the example (not recomputed)
};

class AdditionTask {
 public:
  static constexpr int32_t kPlus = 10;
  static constexpr int32_t kEquals = 11;
  static constexpr int32_t kEnd = 12;
  static constexpr int32_t kPad = 13;
  static constexpr int64_t kVocab = 14;
  static constexpr int64_t kPaddedVocab = 16;

  // Throws loom::Error for digits outside 1..9 or heldout_percent outside 1..99.
  explicit AdditionTask(AdditionOptions options = {});

  const AdditionOptions& options() const { return options_; }
  int64_t digits() const { return options_.digits; }
  int64_t example_len() const { return 3 * options_.digits + 4; }
  int64_t answer_digits() const { return options_.digits + 1; }

  bool is_heldout(int64_t a, int64_t b) const;
  std::vector<int32_t> encode_example(int64_t a, int64_t b) const;
  // Parses one example (example_len() tokens); throws loom::Error saying what is malformed.
  AdditionExample parse_example(const std::vector<int32_t>& tokens) const;

  // `num_examples` training examples concatenated (none of them held out), deterministic in the
  // seed. Examples may repeat.
  std::vector<int32_t> train_stream(int64_t num_examples) const;
  // Training loss on the answer only (as minGPT's adder does): sets every target of a batch that
  // is not an answer digit or an example's end token to kIgnoreTarget, so the unpredictable
  // operand digits add no gradient noise. Needs rows aligned to examples: the batch's seq length
  // must be a multiple of example_len() (every row then starts at an example boundary, since the
  // stream is whole examples and batches start at multiples of the row length). Throws otherwise.
  static constexpr int32_t kIgnoreTarget = -100;
  void mask_non_answer_targets(Tensor& targets) const;

  // `num_examples` distinct held-out examples, `examples_per_row` to a row (num_examples must be
  // a multiple of it), deterministic in the seed. Throws when there are not that many.
  AdditionEvalSet heldout_set(int64_t num_examples, int64_t examples_per_row = 1) const;

  // Text helpers for printing samples: "123+045=8610\n" <-> tokens. Padding prints as '_',
  // a token outside the vocabulary as '?'; encode throws on any other character.
  static std::string decode(const std::vector<int32_t>& tokens);
  static std::vector<int32_t> encode(const std::string& text);

 private:
  AdditionOptions options_;
  int64_t limit_;  // 10^D
};

// Scores rows [first_row, first_row + logits.size(0)) of `set` given their logits
// [rows, time, vocab] (any floating dtype or device; time >= set.input_len(), vocab >= 14; logits
// past the task's 14 tokens are padding and ignored).
ExactMatch score_exact_match(const AdditionEvalSet& set, const Tensor& logits,
                             int64_t first_row = 0);

// Scores the whole set, calling `logits_of(inputs)` with inputs i32 [n, set.input_len()] for
// chunks of at most `rows_per_call` rows; it must return logits [n, set.input_len(), vocab].
ExactMatch evaluate_exact_match(const AdditionEvalSet& set,
                                const std::function<Tensor(const Tensor& inputs)>& logits_of,
                                int64_t rows_per_call);

}  // namespace loom::io
