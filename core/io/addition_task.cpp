// See core/io/addition_task.h for the format, the split and the metric.
#include "core/io/addition_task.h"

#include <algorithm>
#include <unordered_set>

#include "core/error.h"

namespace loom::io {
namespace {

// splitmix64: a full-avalanche 64-bit mix, used both as the split hash and as the generator.
uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Fixed salts: the split must not move with the seed, and the train and held-out draws use
// different streams of the same seed.
constexpr uint64_t kSplitSalt = 0x6c6f6f6d2d616464ull;  // "loom-add"
constexpr uint64_t kTrainStream = 0x747261696eull;      // "train"
constexpr uint64_t kHeldoutStream = 0x68656c64ull;      // "held"

// Enumerate every pair (and shuffle) below this many pairs; sample with rejection above it.
constexpr int64_t kEnumerateLimit = 4'000'000;

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(mix64(seed)) {}
  uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ull;
    return mix64(state_);
  }
  // Uniform in [0, n) without modulo bias (Lemire's multiply-and-reject).
  uint64_t below(uint64_t n) {
    while (true) {
      unsigned __int128 m = (unsigned __int128)next() * n;
      uint64_t low = uint64_t(m);
      if (low >= n || low >= (0 - n) % n) return uint64_t(m >> 64);
    }
  }

 private:
  uint64_t state_;
};

void put_digits(std::vector<int32_t>& out, int64_t value, int64_t width, bool reversed) {
  std::vector<int32_t> digits(static_cast<size_t>(width));
  for (int64_t i = width - 1; i >= 0; --i, value /= 10) digits[size_t(i)] = int32_t(value % 10);
  if (reversed) std::reverse(digits.begin(), digits.end());
  out.insert(out.end(), digits.begin(), digits.end());
}

}  // namespace

AdditionTask::AdditionTask(AdditionOptions options) : options_(options) {
  LOOM_CHECK(options.digits >= 1 && options.digits <= 9, "addition task: digits must be 1..9, got ",
             options.digits);
  LOOM_CHECK(options.heldout_percent >= 1 && options.heldout_percent <= 99,
             "addition task: heldout_percent must be 1..99, got ", options.heldout_percent);
  limit_ = 1;
  for (int64_t i = 0; i < options.digits; ++i) limit_ *= 10;
}

bool AdditionTask::is_heldout(int64_t a, int64_t b) const {
  uint64_t lo = uint64_t(std::min(a, b)), hi = uint64_t(std::max(a, b));
  uint64_t h = mix64(kSplitSalt ^ mix64(lo * uint64_t(limit_) + hi));
  return int64_t(h % 100) < options_.heldout_percent;
}

std::vector<int32_t> AdditionTask::encode_example(int64_t a, int64_t b) const {
  LOOM_CHECK(a >= 0 && a < limit_ && b >= 0 && b < limit_, "addition task: operands ", a, " and ",
             b, " must be in 0..", limit_ - 1, " for ", options_.digits, " digits");
  std::vector<int32_t> out;
  out.reserve(size_t(example_len()));
  put_digits(out, a, digits(), false);
  out.push_back(kPlus);
  put_digits(out, b, digits(), false);
  out.push_back(kEquals);
  put_digits(out, a + b, answer_digits(), true);
  out.push_back(kEnd);
  return out;
}

AdditionExample AdditionTask::parse_example(const std::vector<int32_t>& tokens) const {
  const int64_t d = digits();
  LOOM_CHECK(int64_t(tokens.size()) == example_len(), "addition task: an example has ",
             example_len(), " tokens, got ", tokens.size(), " (", decode(tokens), ")");
  auto expect = [&](int64_t pos, int32_t token) {
    LOOM_CHECK(tokens[size_t(pos)] == token, "addition task: malformed example '", decode(tokens),
               "': expected '", decode({token}), "' at position ", pos);
  };
  auto number = [&](int64_t start, int64_t width, bool reversed) {
    int64_t value = 0;
    for (int64_t i = 0; i < width; ++i) {
      int64_t pos = reversed ? start + width - 1 - i : start + i;
      int32_t t = tokens[size_t(pos)];
      LOOM_CHECK(t >= 0 && t <= 9, "addition task: malformed example '", decode(tokens),
                 "': expected a digit at position ", pos);
      value = value * 10 + t;
    }
    return value;
  };
  expect(d, kPlus);
  expect(2 * d + 1, kEquals);
  expect(3 * d + 3, kEnd);
  return AdditionExample{number(0, d, false), number(d + 1, d, false),
                         number(2 * d + 2, d + 1, true)};
}

std::vector<int32_t> AdditionTask::train_stream(int64_t num_examples) const {
  LOOM_CHECK(num_examples > 0, "addition task: the training stream needs at least one example, ",
             "got ", num_examples);
  Rng rng(options_.seed ^ kTrainStream);
  std::vector<int32_t> out;
  out.reserve(size_t(num_examples * example_len()));
  for (int64_t i = 0; i < num_examples;) {
    int64_t a = int64_t(rng.below(uint64_t(limit_)));
    int64_t b = int64_t(rng.below(uint64_t(limit_)));
    if (is_heldout(a, b)) continue;
    std::vector<int32_t> ex = encode_example(a, b);
    out.insert(out.end(), ex.begin(), ex.end());
    ++i;
  }
  return out;
}

void AdditionTask::mask_non_answer_targets(Tensor& targets) const {
  LOOM_CHECK(targets.defined() && targets.dim() == 2 && targets.dtype() == DType::kI32 &&
                 targets.device().is_cpu() && targets.is_contiguous(),
             "addition task: targets must be a contiguous i32 CPU tensor [B, T], got ",
             targets.str());
  const int64_t len = example_len(), seq = targets.size(1);
  LOOM_CHECK(seq % len == 0, "addition task: loss masking needs the sequence length (", seq,
             ") to be a multiple of the example length (", len, ")");
  // target[p] is token p + 1; the answer digits and the end token sit at offsets
  // 2D + 2 .. 3D + 3 of an example ('=' is at 2D + 1), so p % len must be in [2D + 1, 3D + 2].
  const int64_t first = 2 * options_.digits + 1, last = 3 * options_.digits + 2;
  int32_t* t = targets.data<int32_t>();
  for (int64_t i = 0, n = targets.numel(); i < n; ++i) {
    const int64_t offset = (i % seq) % len;
    if (offset < first || offset > last) t[i] = kIgnoreTarget;
  }
}

AdditionEvalSet AdditionTask::heldout_set(int64_t num_examples, int64_t examples_per_row) const {
  LOOM_CHECK(examples_per_row > 0 && num_examples > 0 && num_examples % examples_per_row == 0,
             "addition task: held-out examples (", num_examples,
             ") must be a positive multiple of examples per row (", examples_per_row, ")");
  Rng rng(options_.seed ^ kHeldoutStream);
  std::vector<std::pair<int64_t, int64_t>> pairs;
  const int64_t space = limit_ * limit_;
  if (space <= kEnumerateLimit) {
    // Small spaces: list every held-out pair, then a partial Fisher-Yates shuffle picks them.
    for (int64_t a = 0; a < limit_; ++a)
      for (int64_t b = 0; b < limit_; ++b)
        if (is_heldout(a, b)) pairs.emplace_back(a, b);
    LOOM_CHECK(num_examples <= int64_t(pairs.size()), "addition task: ", num_examples,
               " held-out examples requested, but ", options_.digits, "-digit addition has only ",
               pairs.size(), " held-out pairs");
    for (int64_t i = 0; i < num_examples; ++i) {
      int64_t j = i + int64_t(rng.below(uint64_t(int64_t(pairs.size()) - i)));
      std::swap(pairs[size_t(i)], pairs[size_t(j)]);
    }
    pairs.resize(size_t(num_examples));
  } else {
    // Large spaces: held-out pairs are plentiful, draw until enough distinct ones.
    std::unordered_set<int64_t> seen;
    while (int64_t(pairs.size()) < num_examples) {
      int64_t a = int64_t(rng.below(uint64_t(limit_)));
      int64_t b = int64_t(rng.below(uint64_t(limit_)));
      if (is_heldout(a, b) && seen.insert(a * limit_ + b).second) pairs.emplace_back(a, b);
    }
  }

  const int64_t len = example_len();
  const int64_t rows = num_examples / examples_per_row;
  AdditionEvalSet set;
  set.examples_per_row = examples_per_row;
  set.answer_digits = answer_digits();
  std::vector<int32_t> flat;
  flat.reserve(size_t(num_examples * len));
  for (const auto& [a, b] : pairs) {
    std::vector<int32_t> ex = encode_example(a, b);
    flat.insert(flat.end(), ex.begin(), ex.end());
  }
  set.tokens = Tensor::from_vector(flat, {rows, examples_per_row * len});
  // '=' sits at 2D + 1 and predicts the first answer digit; the last digit is predicted at 3D + 1.
  for (int64_t e = 0; e < examples_per_row; ++e)
    for (int64_t i = 0; i < answer_digits(); ++i)
      set.answer_positions.push_back(e * len + 2 * digits() + 1 + i);
  return set;
}

std::string AdditionTask::decode(const std::vector<int32_t>& tokens) {
  std::string text;
  text.reserve(tokens.size());
  for (int32_t t : tokens) {
    if (t >= 0 && t <= 9)
      text.push_back(char('0' + t));
    else if (t == kPlus)
      text.push_back('+');
    else if (t == kEquals)
      text.push_back('=');
    else if (t == kEnd)
      text.push_back('\n');
    else if (t == kPad)
      text.push_back('_');
    else
      text.push_back('?');
  }
  return text;
}

std::vector<int32_t> AdditionTask::encode(const std::string& text) {
  std::vector<int32_t> tokens;
  tokens.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c >= '0' && c <= '9')
      tokens.push_back(c - '0');
    else if (c == '+')
      tokens.push_back(kPlus);
    else if (c == '=')
      tokens.push_back(kEquals);
    else if (c == '\n')
      tokens.push_back(kEnd);
    else if (c == '_')
      tokens.push_back(kPad);
    else
      LOOM_FAIL("addition task: character '", c, "' at position ", i,
                " is not in the vocabulary (digits, '+', '=', newline, '_')");
  }
  return tokens;
}

ExactMatch score_exact_match(const AdditionEvalSet& set, const Tensor& logits, int64_t first_row) {
  LOOM_CHECK(logits.defined() && logits.dim() == 3,
             "addition exact match: logits must be [rows, time, vocab], got ",
             logits.defined() ? shape_str(logits.shape()) : std::string("an undefined tensor"));
  const int64_t rows = logits.size(0), time = logits.size(1), vocab = logits.size(2);
  const int64_t row_len = set.tokens.size(1);
  LOOM_CHECK(first_row >= 0 && first_row + rows <= set.rows(), "addition exact match: rows ",
             first_row, "..", first_row + rows - 1, " are outside the set's ", set.rows(), " rows");
  LOOM_CHECK(time >= set.input_len() && time <= row_len, "addition exact match: logits cover ",
             time, " positions, expected ", set.input_len(), "..", row_len);
  LOOM_CHECK(vocab >= AdditionTask::kVocab, "addition exact match: logits have ", vocab,
             " entries per position, the task needs ", AdditionTask::kVocab);
  LOOM_CHECK(is_floating(logits.dtype()), "addition exact match: logits must be floating, got ",
             dtype_name(logits.dtype()));

  const std::vector<float> l = logits.detach().to(DType::kF32).to_vector<float>();
  const std::vector<int32_t> tokens = set.tokens.to_vector<int32_t>();
  ExactMatch result;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t* row = tokens.data() + (first_row + r) * row_len;
    for (int64_t e = 0; e < set.examples_per_row; ++e) {
      bool right = true;
      for (int64_t i = 0; i < set.answer_digits && right; ++i) {
        int64_t p = set.answer_positions[size_t(e * set.answer_digits + i)];
        const float* v = l.data() + (r * time + p) * vocab;
        // The first maximum, as greedy decoding takes it; padding logits are not candidates.
        int32_t best = int32_t(std::max_element(v, v + AdditionTask::kVocab) - v);
        right = best == row[p + 1];
      }
      result.correct += right ? 1 : 0;
      result.total += 1;
    }
  }
  return result;
}

ExactMatch evaluate_exact_match(const AdditionEvalSet& set,
                                const std::function<Tensor(const Tensor& inputs)>& logits_of,
                                int64_t rows_per_call) {
  LOOM_CHECK(rows_per_call > 0, "addition exact match: rows per call must be positive, got ",
             rows_per_call);
  ExactMatch total;
  for (int64_t r = 0; r < set.rows(); r += rows_per_call) {
    int64_t n = std::min(rows_per_call, set.rows() - r);
    Tensor inputs = set.tokens.narrow(0, r, n).narrow(1, 0, set.input_len()).contiguous();
    ExactMatch part = score_exact_match(set, logits_of(inputs), r);
    total.correct += part.correct;
    total.total += part.total;
  }
  return total;
}

}  // namespace loom::io
