// Data formats and loaders (core/io): llm.c token files, byte-level text, the batch loader
// against llm.c's own loader rule, and the built-in addition task. Files are written by hand,
// byte by byte, so the tests pin the formats, not just our round trips.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/io/addition_task.h"
#include "core/io/batch_loader.h"
#include "core/io/text_file.h"
#include "core/io/token_file.h"
#include "testing/files.h"

namespace loom::io {
namespace {

using IoTest = testing::TempDirTest;
using testing::append;
using testing::expect_error;
using testing::read_bytes;
using testing::write_bytes;

// An llm.c token-file header: 256 int32, the first three given.
std::string token_header(int32_t magic, int32_t version, int32_t count) {
  std::string h;
  append(h, magic);
  append(h, version);
  append(h, count);
  for (int i = 3; i < 256; ++i) append(h, int32_t(0));
  return h;
}

// ---------------------------------------------------------------- llm.c token files

TEST_F(IoTest, TokenFileWrittenByHandReads) {
  std::string bytes = token_header(20240520, 1, 4);
  for (uint16_t t : {uint16_t(0), uint16_t(7), uint16_t(50256), uint16_t(65535)}) append(bytes, t);
  write_bytes(path("hand.bin"), bytes);
  EXPECT_EQ(read_token_file(path("hand.bin")), (std::vector<int32_t>{0, 7, 50256, 65535}));
}

TEST_F(IoTest, TokenFileWritesLlmcLayout) {
  const std::vector<int32_t> tokens = {3, 1, 4, 1, 5, 65535, 0};
  write_token_file(path("t.bin"), tokens);
  std::string expected = token_header(20240520, 1, 7);
  for (int32_t t : tokens) append(expected, uint16_t(t));
  EXPECT_EQ(read_bytes(path("t.bin")), expected);
  EXPECT_EQ(read_token_file(path("t.bin")), tokens);

  write_token_file(path("empty.bin"), {});
  EXPECT_EQ(read_token_file(path("empty.bin")), std::vector<int32_t>{});
}

TEST_F(IoTest, TokenFileBadInputNamesFileAndProblem) {
  const std::string p = path("bad.bin");
  expect_error([&] { read_token_file(path("missing.bin")); },
               {"cannot open", "missing.bin", "No such file"});

  write_bytes(p, std::string(100, '\0'));
  expect_error([&] { read_token_file(p); }, {p, "100 bytes", "shorter than the 1024-byte header"});

  write_bytes(p, token_header(12345, 1, 0));
  expect_error([&] { read_token_file(p); },
               {p + " is not an llm.c token file: magic 12345, expected 20240520"});

  write_bytes(p, token_header(20240326, 3, 0));  // a model file
  expect_error([&] { read_token_file(p); }, {"magic 20240326", "llm.c model file"});

  write_bytes(p, token_header(20240520, 2, 0));
  expect_error([&] { read_token_file(p); }, {p, "version 2, expected 1"});

  std::string truncated = token_header(20240520, 1, 10);
  for (int i = 0; i < 4; ++i) append(truncated, uint16_t(i));
  write_bytes(p, truncated);
  expect_error([&] { read_token_file(p); },
               {p, "truncated", "header says 10 tokens", "holds 8 bytes", "(4 tokens)"});

  std::string trailing = token_header(20240520, 1, 1);
  append(trailing, uint16_t(1));
  append(trailing, uint8_t(9));
  write_bytes(p, trailing);
  expect_error([&] { read_token_file(p); }, {p, "trailing bytes", "header says 1 tokens"});

  expect_error([&] { read_token_file(dir_); }, {"not a regular file"});
}

TEST_F(IoTest, TokenFileRefusesTokensOutsideUint16AndLeavesNoFile) {
  const std::string p = path("out.bin");
  expect_error(
      [&] {
        write_token_file(p, {1, 70000});
      },
      {p, "token 70000 at position 1", "uint16"});
  expect_error([&] { write_token_file(p, {-1}); }, {"token -1 at position 0"});
  EXPECT_TRUE(std::filesystem::is_empty(dir_)) << "a failed write left a file behind";
}

// ---------------------------------------------------------------- byte-level text

TEST_F(IoTest, TextFileEveryByteIsAToken) {
  std::string text = "hi\n";
  text.push_back('\0');
  text.push_back(char(0xff));
  text.push_back(char(0x80));
  write_bytes(path("t.txt"), text);
  EXPECT_EQ(read_text_file(path("t.txt")), (std::vector<int32_t>{'h', 'i', '\n', 0, 255, 128}));
  EXPECT_EQ(tokens_to_text(text_to_tokens(text)), text);
  expect_error([&] { tokens_to_text({65, 256}); }, {"token 256 at position 1"});
  expect_error([&] { read_text_file(path("none.txt")); }, {"cannot open text file", "none.txt"});
}

// ---------------------------------------------------------------- batch loader

std::vector<int32_t> iota_tokens(int64_t n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[size_t(i)] = int32_t(i);
  return t;
}

// A writer killed mid-save leaves "<path>.tmp.<host>.<pid>" behind; the next write of the path
// removes those whose process is gone, and keeps a live writer's and another host's.
TEST_F(IoTest, StaleTemporaryFilesOfKilledWritersAreRemoved) {
  char host[256] = {0};
  ASSERT_EQ(::gethostname(host, sizeof host - 1), 0);
  std::string h = host;
  for (char& c : h)
    if (c == '/' || c == '.') c = '_';
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);  // now a process id nobody holds
  const std::string target = path("tokens.bin");
  const std::string dead = target + ".tmp." + h + "." + std::to_string(child);
  const std::string live = target + ".tmp." + h + "." + std::to_string(::getppid());
  const std::string other_host = target + ".tmp.elsewhere." + std::to_string(child);
  namespace fs = std::filesystem;
  for (const std::string& f : {dead, live, other_host}) write_bytes(f, std::string(100, 'x'));
  write_token_file(target, {1, 2, 3});
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(other_host));
  EXPECT_EQ(read_token_file(target).size(), 3u);
}

TEST(BatchLoader, DocumentedBatchesAndWrap) {
  // 20 tokens, B = 2, T = 3: batches start at 0, 6, 12; the next would need tokens 18..24, so
  // batch 3 is batch 0 again.
  BatchLoader loader(iota_tokens(20), 2, 3);
  EXPECT_EQ(loader.batches_per_pass(), 3);
  const std::vector<std::vector<int32_t>> inputs = {
      {0, 1, 2, 3, 4, 5}, {6, 7, 8, 9, 10, 11}, {12, 13, 14, 15, 16, 17}};
  for (int k = 0; k < 7; ++k) {
    Batch b = loader.next_batch();
    EXPECT_EQ(b.inputs.shape(), (Shape{2, 3}));
    EXPECT_EQ(b.inputs.dtype(), DType::kI32);
    EXPECT_EQ(b.inputs.to_vector<int32_t>(), inputs[size_t(k % 3)]) << "batch " << k;
    std::vector<int32_t> targets = inputs[size_t(k % 3)];
    for (int32_t& t : targets) ++t;
    EXPECT_EQ(b.targets.to_vector<int32_t>(), targets) << "batch " << k;
  }
  EXPECT_EQ(loader.index(), 7);
  loader.reset();
  EXPECT_EQ(loader.next_batch().inputs.to_vector<int32_t>(), inputs[0]);
}

TEST(BatchLoader, LastTargetMayBeTheLastToken) {
  // 19 tokens: batch 2 reads 12..18 inclusive, exactly the end; 18 tokens leave room for two.
  EXPECT_EQ(BatchLoader(iota_tokens(19), 2, 3).batches_per_pass(), 3);
  EXPECT_EQ(BatchLoader(iota_tokens(19), 2, 3).batch_at(2).targets.to_vector<int32_t>().back(), 18);
  EXPECT_EQ(BatchLoader(iota_tokens(18), 2, 3).batches_per_pass(), 2);
  BatchLoader one(iota_tokens(7), 2, 3);  // exactly B*T + 1 tokens: one batch, forever
  for (int k = 0; k < 3; ++k)
    EXPECT_EQ(one.next_batch().targets.to_vector<int32_t>(),
              (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
}

TEST(BatchLoader, MatchesLlmcLoaderRule) {
  // llm.c's dataloader_next_batch: read B*T+1 tokens at the current position, advance by B*T,
  // and go back to 0 when the next read would pass the end.
  for (auto [n, B, T] : {std::tuple<int64_t, int64_t, int64_t>{100, 4, 8},
                         {33, 4, 8},
                         {1000, 3, 7},
                         {64, 1, 63},
                         {97, 2, 16}}) {
    std::vector<int32_t> tokens(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) tokens[size_t(i)] = int32_t((i * 7919) % 50257);
    BatchLoader loader(tokens, B, T);
    int64_t pos = 0;
    for (int step = 0; step < 40; ++step) {
      if (pos + B * T + 1 > n) pos = 0;
      std::vector<int32_t> x(tokens.begin() + pos, tokens.begin() + pos + B * T);
      std::vector<int32_t> y(tokens.begin() + pos + 1, tokens.begin() + pos + B * T + 1);
      pos += B * T;
      Batch b = loader.next_batch();
      ASSERT_EQ(b.inputs.to_vector<int32_t>(), x) << "n " << n << " step " << step;
      ASSERT_EQ(b.targets.to_vector<int32_t>(), y) << "n " << n << " step " << step;
    }
  }
}

TEST(BatchLoader, BadInputIsAClearError) {
  expect_error([] { BatchLoader(iota_tokens(100), 4, 64); },
               {"data: the stream has 100 tokens; a batch of 4 x 64 needs 257"});
  expect_error([] { BatchLoader(iota_tokens(6), 2, 3, "train.bin"); },
               {"data train.bin: the stream has 6 tokens; a batch of 2 x 3 needs 7"});
  expect_error([] { BatchLoader(iota_tokens(100), 0, 4); }, {"must be positive"});
  expect_error(
      [] {
        check_token_range({1, 2, 300, 4}, 256, "x.bin");
      },
      {"data x.bin", "token 300 at position 2", "0..255"});
  expect_error([] { check_token_range({-1}, 256); }, {"token -1 at position 0"});
  EXPECT_NO_THROW(check_token_range({0, 255}, 256));
}

// ---------------------------------------------------------------- addition task

TEST(AdditionTask, ExampleFormat) {
  AdditionTask task;  // 3 digits
  EXPECT_EQ(task.example_len(), 13);
  EXPECT_EQ(AdditionTask::decode(task.encode_example(123, 45)), "123+045=8610\n");
  EXPECT_EQ(AdditionTask::decode(task.encode_example(999, 999)), "999+999=8991\n");
  EXPECT_EQ(AdditionTask::decode(task.encode_example(0, 0)), "000+000=0000\n");
  EXPECT_EQ(AdditionTask::encode("123+045=8610\n"), task.encode_example(123, 45));
  EXPECT_EQ(AdditionTask::decode({13, 14, -1}), "_??");
  AdditionExample ex = task.parse_example(task.encode_example(987, 654));
  EXPECT_EQ(ex.a, 987);
  EXPECT_EQ(ex.b, 654);
  EXPECT_EQ(ex.sum, 1641);
  AdditionTask two({.digits = 2});
  EXPECT_EQ(AdditionTask::decode(two.encode_example(7, 95)), "07+95=201\n");
}

TEST(AdditionTask, TrainStreamIsWellFormedDeterministicAndNeverHeldOut) {
  AdditionTask task({.digits = 3, .seed = 5});
  const int64_t n = 2000, len = task.example_len();
  std::vector<int32_t> stream = task.train_stream(n);
  ASSERT_EQ(int64_t(stream.size()), n * len);
  std::set<std::pair<int64_t, int64_t>> pairs;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int32_t> ex(stream.begin() + i * len, stream.begin() + (i + 1) * len);
    AdditionExample e = task.parse_example(ex);
    EXPECT_EQ(e.a + e.b, e.sum) << AdditionTask::decode(ex);
    EXPECT_FALSE(task.is_heldout(e.a, e.b));
    pairs.insert({e.a, e.b});
  }
  EXPECT_GT(pairs.size(), size_t(1900)) << "draws should rarely repeat among 10^6 pairs";
  EXPECT_EQ(task.train_stream(n), stream);
  EXPECT_NE(AdditionTask({.digits = 3, .seed = 6}).train_stream(n), stream);
}

TEST(AdditionTask, SplitIsSymmetricAboutTheRequestedSizeAndSeedIndependent) {
  AdditionTask task({.digits = 2, .seed = 1});
  AdditionTask other({.digits = 2, .seed = 99});
  int64_t held = 0;
  for (int64_t a = 0; a < 100; ++a)
    for (int64_t b = 0; b < 100; ++b) {
      held += task.is_heldout(a, b);
      EXPECT_EQ(task.is_heldout(a, b), task.is_heldout(b, a));
      EXPECT_EQ(task.is_heldout(a, b), other.is_heldout(a, b));
    }
  EXPECT_GT(held, 700);  // 10% of 10^4, give or take
  EXPECT_LT(held, 1300);
}

TEST(AdditionTask, HeldOutSetIsDisjointFromTrainingAndAligned) {
  AdditionTask task({.digits = 3, .seed = 7});
  AdditionEvalSet set = task.heldout_set(300);
  ASSERT_EQ(set.tokens.shape(), (Shape{300, 13}));
  EXPECT_EQ(set.answer_positions, (std::vector<int64_t>{7, 8, 9, 10}));
  EXPECT_EQ(set.input_len(), 11);
  std::vector<int32_t> rows = set.tokens.to_vector<int32_t>();
  std::set<std::pair<int64_t, int64_t>> distinct, held;  // held: unordered pairs
  for (int64_t r = 0; r < 300; ++r) {
    std::vector<int32_t> ex(rows.begin() + r * 13, rows.begin() + (r + 1) * 13);
    AdditionExample e = task.parse_example(ex);
    EXPECT_EQ(e.a + e.b, e.sum);
    EXPECT_EQ(ex[7], AdditionTask::kEquals);
    EXPECT_TRUE(distinct.insert({e.a, e.b}).second) << "held-out examples repeat";
    held.insert({std::min(e.a, e.b), std::max(e.a, e.b)});
  }
  std::vector<int32_t> stream = task.train_stream(20000);
  for (size_t i = 0; i < stream.size(); i += 13) {
    AdditionExample e =
        task.parse_example(std::vector<int32_t>(stream.begin() + i, stream.begin() + i + 13));
    EXPECT_EQ(held.count({std::min(e.a, e.b), std::max(e.a, e.b)}), 0u)
        << e.a << "+" << e.b << " is in both splits";
  }
  EXPECT_EQ(task.heldout_set(300).tokens.to_vector<int32_t>(), rows);  // deterministic

  AdditionEvalSet packed = task.heldout_set(300, 4);
  ASSERT_EQ(packed.tokens.shape(), (Shape{75, 52}));
  EXPECT_EQ(packed.tokens.to_vector<int32_t>(), rows);  // the same examples, four to a row
  EXPECT_EQ(packed.answer_positions,
            (std::vector<int64_t>{7, 8, 9, 10, 20, 21, 22, 23, 33, 34, 35, 36, 46, 47, 48, 49}));
}

TEST(AdditionTask, BadInputIsAClearError) {
  expect_error([] { AdditionTask({.digits = 0}); }, {"digits must be 1..9, got 0"});
  expect_error([] { AdditionTask({.digits = 1}).heldout_set(1000); },
               {"1000 held-out examples requested", "only"});
  expect_error([] { AdditionTask().heldout_set(10, 3); }, {"multiple of examples per row"});
  expect_error([] { AdditionTask().encode_example(1000, 1); }, {"0..999"});
  expect_error([] { AdditionTask::encode("12*3"); }, {"character '*' at position 2"});
  AdditionTask task;
  expect_error([&] { task.parse_example(AdditionTask::encode("123-045=8610\n")); },
               {"not in the vocabulary"});
  expect_error([&] { task.parse_example(AdditionTask::encode("123=045=8610\n")); },
               {"malformed", "expected '+' at position 3"});
}

// Logits [rows, time, vocab] with a one-hot "prediction" of `predicted[r][p]` at each position.
Tensor one_hot_logits(const std::vector<std::vector<int32_t>>& predicted, int64_t vocab) {
  const int64_t rows = int64_t(predicted.size()), time = int64_t(predicted[0].size());
  std::vector<float> l(size_t(rows * time * vocab), 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t p = 0; p < time; ++p) l[size_t((r * time + p) * vocab + predicted[r][p])] = 1.0f;
  return Tensor::from_vector(l, {rows, time, vocab});
}

TEST(AdditionTask, ExactMatchCountsWholeAnswers) {
  AdditionTask task({.digits = 2});
  AdditionEvalSet set = task.heldout_set(4);  // rows of 10: answers predicted at 5, 6, 7
  ASSERT_EQ(set.answer_positions, (std::vector<int64_t>{5, 6, 7}));
  std::vector<int32_t> rows = set.tokens.to_vector<int32_t>();
  // Perfect predictions: each position predicts the next token of its row.
  std::vector<std::vector<int32_t>> pred(4, std::vector<int32_t>(10, 0));
  for (int r = 0; r < 4; ++r)
    for (int p = 0; p + 1 < 10; ++p) pred[size_t(r)][size_t(p)] = rows[size_t(r * 10 + p + 1)];
  for (int r = 0; r < 4; ++r) pred[size_t(r)][0] = AdditionTask::kPlus;  // not an answer position
  pred[1][7] = (pred[1][7] + 1) % 10;                                    // last digit wrong
  pred[2][5] = (pred[2][5] + 1) % 10;                                    // first digit wrong
  Tensor logits = one_hot_logits(pred, AdditionTask::kPaddedVocab);
  // Row 3: a huge logit on a padding token is not a candidate.
  logits.data<float>()[(3 * 10 + 6) * 16 + 15] = 100.0f;
  ExactMatch m = score_exact_match(set, logits);
  EXPECT_EQ(m.correct, 2);
  EXPECT_EQ(m.total, 4);
  EXPECT_DOUBLE_EQ(m.accuracy(), 0.5);
  // Rows 2..3 alone, with logits only up to the last answer position.
  ExactMatch tail = score_exact_match(set, logits.narrow(0, 2, 2).narrow(1, 0, 8), 2);
  EXPECT_EQ(tail.correct, 1);
  EXPECT_EQ(tail.total, 2);

  expect_error([&] { score_exact_match(set, logits.narrow(1, 0, 7)); },
               {"logits cover 7 positions, expected 8..10"});
  expect_error([&] { score_exact_match(set, logits, 1); }, {"outside the set's 4 rows"});
  expect_error([&] { score_exact_match(set, logits.narrow(2, 0, 10)); }, {"the task needs 14"});
}

TEST(AdditionTask, EvaluateThroughACallbackThatAdds) {
  // A "model" that really adds (reading a and b from its inputs) scores 100%; one that is wrong
  // whenever a is odd scores exactly the share of even a.
  AdditionTask task({.digits = 3, .seed = 3});
  AdditionEvalSet set = task.heldout_set(50);
  auto adder = [&](bool fail_odd) {
    return [&, fail_odd](const Tensor& inputs) {
      EXPECT_EQ(inputs.dim(), 2);
      EXPECT_EQ(inputs.size(1), set.input_len());
      const int64_t n = inputs.size(0), t = inputs.size(1);
      std::vector<int32_t> x = inputs.to_vector<int32_t>();
      std::vector<std::vector<int32_t>> pred(size_t(n), std::vector<int32_t>(size_t(t), 0));
      for (int64_t r = 0; r < n; ++r) {
        const int32_t* row = x.data() + r * t;
        int64_t a = row[0] * 100 + row[1] * 10 + row[2], b = row[4] * 100 + row[5] * 10 + row[6];
        int64_t sum = a + b + (fail_odd && a % 2 ? 1 : 0);
        for (int64_t i = 0; i < 4; ++i, sum /= 10)
          pred[size_t(r)][size_t(7 + i)] = int32_t(sum % 10);
      }
      return one_hot_logits(pred, AdditionTask::kVocab);
    };
  };
  ExactMatch perfect = evaluate_exact_match(set, adder(false), 7);
  EXPECT_EQ(perfect.correct, 50);
  EXPECT_EQ(perfect.total, 50);
  int64_t even = 0;
  for (int64_t r = 0; r < 50; ++r)
    even += set.tokens.to_vector<int32_t>()[size_t(r * 13 + 2)] % 2 == 0;
  ExactMatch half = evaluate_exact_match(set, adder(true), 16);
  EXPECT_EQ(half.correct, even);
}

TEST(AdditionTask, LossMaskKeepsExactlyTheAnswerDigitsAndTheEndToken) {
  AdditionTask task({/*digits=*/2, /*seed=*/5, /*heldout_percent=*/10});
  const int64_t len = task.example_len();  // "12+34=6400\n": 10 tokens
  BatchLoader loader(task.train_stream(50), /*batch=*/3, /*seq=*/2 * len);
  Batch b = loader.next_batch();
  std::vector<int32_t> before = b.targets.to_vector<int32_t>();
  std::vector<int32_t> inputs = b.inputs.to_vector<int32_t>();
  task.mask_non_answer_targets(b.targets);
  std::vector<int32_t> after = b.targets.to_vector<int32_t>();
  for (size_t i = 0; i < after.size(); ++i) {
    // The target is kept exactly when the input at i is '=' or an answer digit before the end:
    // positions 2D+1 .. 3D+2 of an example, i.e. the targets are the D+1 digits and the end.
    const int64_t offset = int64_t(i % size_t(2 * len)) % len;
    const bool answer = offset >= 2 * 2 + 1 && offset <= 3 * 2 + 2;
    if (answer) {
      EXPECT_EQ(after[i], before[i]) << "position " << i;
      EXPECT_TRUE(before[i] == AdditionTask::kEnd || (before[i] >= 0 && before[i] <= 9));
    } else {
      EXPECT_EQ(after[i], AdditionTask::kIgnoreTarget) << "position " << i;
    }
    if (offset == 2 * 2 + 1) EXPECT_EQ(inputs[i], AdditionTask::kEquals) << "position " << i;
  }
  Tensor unaligned = Tensor::zeros({2, len + 1}, DType::kI32);
  EXPECT_THROW(task.mask_non_answer_targets(unaligned), Error);
}

}  // namespace
}  // namespace loom::io
