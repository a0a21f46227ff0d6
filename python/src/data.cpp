// The built-in data as loom._loom.data (re-exported as loom.data): the addition task
// (core/io/addition_task.h), the llm.c-order batch loader (core/io/batch_loader.h), the token and
// byte-level text files, and the synthetic click logs (core/io/click_data.h); plus the
// learning-rate schedules (optimizer/lr_schedule.h) under loom._loom.optim. Argument conversion
// only: token streams cross as i32 loom tensors (a list of ints or a 1-d integer tensor is
// accepted), and every figure is the C++ one, so a Python script reads exactly the batches loom-gpt
// and loom-dlrm read.
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "core/io/addition_task.h"
#include "core/io/batch_loader.h"
#include "core/io/click_data.h"
#include "core/io/text_file.h"
#include "core/io/token_file.h"
#include "optimizer/lr_schedule.h"

namespace loom::python {
namespace {

using Release = py::call_guard<py::gil_scoped_release>;

// A token stream from Python: a loom.Tensor of integers (any shape, read row-major) or any
// sequence of ints.
std::vector<int32_t> tokens_arg(py::handle obj, const char* what) {
  if (py::isinstance<Tensor>(obj)) {
    Tensor t = obj.cast<Tensor>();
    if (t.dtype() == DType::kI32) return t.to_vector<int32_t>();
    if (t.dtype() == DType::kI64) {
      std::vector<int32_t> out;
      for (int64_t v : t.to_vector<int64_t>()) {
        if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
          throw py::value_error(std::string(what) + ": token " + std::to_string(v) +
                                " does not fit in int32");
        out.push_back(int32_t(v));
      }
      return out;
    }
    throw py::type_error(std::string(what) + ": expected an int32 or int64 tensor, got " +
                         dtype_name(t.dtype()));
  }
  try {
    return obj.cast<std::vector<int32_t>>();
  } catch (const py::cast_error&) {
    throw py::type_error(std::string(what) + ": expected a loom.Tensor of tokens or a sequence " +
                         "of ints, got " +
                         std::string(py::str(py::type::of(obj).attr("__name__"))));
  }
}

Tensor tokens_tensor(const std::vector<int32_t>& tokens) {
  return Tensor::from_vector(tokens, {int64_t(tokens.size())});
}

io::ClickSplit split_arg(const std::string& name) {
  if (name == "train") return io::ClickSplit::kTrain;
  if (name == "eval") return io::ClickSplit::kEval;
  throw py::value_error("ClickDataset: split must be 'train' or 'eval', got '" + name + "'");
}

}  // namespace

void init_data(py::module_& m) {
  py::module_ d = m.def_submodule("data", "loom's built-in data (import loom.data instead)");

  // ---------------------------------------------------------------- addition task
  py::class_<io::AdditionOptions>(d, "AdditionOptions",
                                  "digits (1..9), seed (which examples are drawn), "
                                  "heldout_percent (1..99; the split does not depend on the seed)")
      .def(py::init([](int64_t digits, uint64_t seed, int64_t heldout_percent) {
             io::AdditionOptions o;
             o.digits = digits;
             o.seed = seed;
             o.heldout_percent = heldout_percent;
             return o;
           }),
           py::arg("digits") = 3, py::arg("seed") = 1337, py::arg("heldout_percent") = 10)
      .def_readwrite("digits", &io::AdditionOptions::digits)
      .def_readwrite("seed", &io::AdditionOptions::seed)
      .def_readwrite("heldout_percent", &io::AdditionOptions::heldout_percent)
      .def("__repr__", [](const io::AdditionOptions& o) {
        return "AdditionOptions(digits=" + std::to_string(o.digits) +
               ", seed=" + std::to_string(o.seed) +
               ", heldout_percent=" + std::to_string(o.heldout_percent) + ")";
      });

  py::class_<io::AdditionEvalSet>(d, "AdditionEvalSet",
                                  "Held-out examples as aligned rows (AdditionTask.heldout_set).")
      .def_readonly("tokens", &io::AdditionEvalSet::tokens)
      .def_readonly("examples_per_row", &io::AdditionEvalSet::examples_per_row)
      .def_readonly("answer_digits", &io::AdditionEvalSet::answer_digits)
      .def_readonly("answer_positions", &io::AdditionEvalSet::answer_positions)
      .def_property_readonly("rows", &io::AdditionEvalSet::rows)
      .def_property_readonly("num_examples", &io::AdditionEvalSet::num_examples)
      .def_property_readonly("input_len", &io::AdditionEvalSet::input_len);

  py::class_<io::ExactMatch>(d, "ExactMatch")
      .def_readonly("correct", &io::ExactMatch::correct)
      .def_readonly("total", &io::ExactMatch::total)
      .def_property_readonly("accuracy", &io::ExactMatch::accuracy)
      .def("__repr__", [](const io::ExactMatch& e) {
        return "ExactMatch(correct=" + std::to_string(e.correct) +
               ", total=" + std::to_string(e.total) + ")";
      });

  py::class_<io::AdditionExample>(d, "AdditionExample")
      .def_readonly("a", &io::AdditionExample::a)
      .def_readonly("b", &io::AdditionExample::b)
      .def_readonly("sum", &io::AdditionExample::sum)
      .def("__repr__", [](const io::AdditionExample& e) {
        return "AdditionExample(a=" + std::to_string(e.a) + ", b=" + std::to_string(e.b) +
               ", sum=" + std::to_string(e.sum) + ")";
      });

  py::class_<io::AdditionTask, std::shared_ptr<io::AdditionTask>> task(d, "AdditionTask",
                                                                       R"doc(
Multi-digit addition with the sum reversed, loom-gpt's default data (core/io/addition_task.h).

    >>> task = loom.data.AdditionTask(digits=3, seed=1337)
    >>> loom.data.AdditionTask.decode(task.encode_example(123, 45))
    '123+045=8610\n'
    >>> tokens = task.train_stream(1000)            # i32 [1000 * 13]
    >>> loader = loom.data.BatchLoader(tokens, batch=4, seq=13)
    >>> b = loader.next_batch()
    >>> task.mask_non_answer_targets(b.targets)     # in place: loss on the answers only
)doc");
  task.def(py::init([](std::optional<io::AdditionOptions> options, std::optional<int64_t> digits,
                       std::optional<uint64_t> seed, std::optional<int64_t> heldout_percent) {
             io::AdditionOptions o = options.value_or(io::AdditionOptions{});
             if (digits) o.digits = *digits;
             if (seed) o.seed = *seed;
             if (heldout_percent) o.heldout_percent = *heldout_percent;
             return std::make_shared<io::AdditionTask>(o);
           }),
           py::arg("options") = py::none(), py::kw_only(), py::arg("digits") = py::none(),
           py::arg("seed") = py::none(), py::arg("heldout_percent") = py::none())
      .def_readonly_static("PLUS", &io::AdditionTask::kPlus)
      .def_readonly_static("EQUALS", &io::AdditionTask::kEquals)
      .def_readonly_static("END", &io::AdditionTask::kEnd)
      .def_readonly_static("PAD", &io::AdditionTask::kPad)
      .def_readonly_static("VOCAB", &io::AdditionTask::kVocab)
      .def_readonly_static("PADDED_VOCAB", &io::AdditionTask::kPaddedVocab)
      .def_readonly_static("IGNORE_TARGET", &io::AdditionTask::kIgnoreTarget)
      .def_property_readonly("options", &io::AdditionTask::options)
      .def_property_readonly("digits", &io::AdditionTask::digits)
      .def_property_readonly("example_len", &io::AdditionTask::example_len)
      .def_property_readonly("answer_digits", &io::AdditionTask::answer_digits)
      .def("is_heldout", &io::AdditionTask::is_heldout, py::arg("a"), py::arg("b"))
      .def(
          "encode_example",
          [](const io::AdditionTask& self, int64_t a, int64_t b) {
            return self.encode_example(a, b);
          },
          py::arg("a"), py::arg("b"), "The example a + b as a list of example_len tokens.")
      .def(
          "parse_example",
          [](const io::AdditionTask& self, py::handle tokens) {
            return self.parse_example(tokens_arg(tokens, "parse_example"));
          },
          py::arg("tokens"))
      .def(
          "train_stream",
          [](const io::AdditionTask& self, int64_t num_examples) {
            if (num_examples < 0)
              throw py::value_error("train_stream: num_examples must be >= 0, got " +
                                    std::to_string(num_examples));
            std::vector<int32_t> tokens;
            {
              py::gil_scoped_release release;
              tokens = self.train_stream(num_examples);
            }
            return tokens_tensor(tokens);
          },
          py::arg("num_examples"),
          "num_examples training examples end to end (none held out): i32 [num_examples * "
          "example_len], deterministic in the seed.")
      .def(
          "mask_non_answer_targets",
          [](const io::AdditionTask& self, Tensor& targets) {
            self.mask_non_answer_targets(targets);
            return targets;
          },
          py::arg("targets"), Release(),
          "In place (and returned): every target that is not an answer digit or an example's "
          "end becomes IGNORE_TARGET (-100). seq must be a multiple of example_len.")
      .def("heldout_set", &io::AdditionTask::heldout_set, py::arg("num_examples"),
           py::arg("examples_per_row") = 1, Release())
      .def_static("decode", &io::AdditionTask::decode, py::arg("tokens"))
      .def_static(
          "encode", [](const std::string& text) { return io::AdditionTask::encode(text); },
          py::arg("text"));

  d.def(
      "score_exact_match",
      [](const io::AdditionEvalSet& set, const Tensor& logits, int64_t first_row) {
        return io::score_exact_match(set, logits, first_row);
      },
      py::arg("set"), py::arg("logits"), py::arg("first_row") = 0, Release(),
      "Exact match of rows [first_row, first_row + logits.shape[0]) of set given their logits "
      "[rows, time, vocab].");
  d.def(
      "evaluate_exact_match",
      [](const io::AdditionEvalSet& set, py::function logits_of, int64_t rows_per_call) {
        if (rows_per_call < 1)
          throw py::value_error("evaluate_exact_match: rows_per_call must be >= 1, got " +
                                std::to_string(rows_per_call));
        // logits_of lives in this frame (captured by reference, so copies of fn touch no
        // reference count without the GIL); the GIL is taken only to call it.
        std::function<Tensor(const Tensor&)> fn = [&logits_of](const Tensor& inputs) {
          py::gil_scoped_acquire acquire;
          py::object out = logits_of(inputs);
          if (!py::isinstance<Tensor>(out))
            throw py::type_error("evaluate_exact_match: logits_of must return a loom.Tensor, got " +
                                 std::string(py::str(py::type::of(out).attr("__name__"))));
          return out.cast<Tensor>();
        };
        py::gil_scoped_release release;
        return io::evaluate_exact_match(set, fn, rows_per_call);
      },
      py::arg("set"), py::arg("logits_of"), py::arg("rows_per_call"),
      "Scores the whole set, calling logits_of(inputs i32 [n, set.input_len]) -> logits "
      "[n, set.input_len, vocab] for chunks of at most rows_per_call rows (loom-gpt's metric).");

  // ---------------------------------------------------------------- batches
  py::class_<io::Batch>(d, "Batch", "inputs and targets, i32 [B, T]; targets shifted by one.")
      .def_readonly("inputs", &io::Batch::inputs)
      .def_readonly("targets", &io::Batch::targets)
      .def("__iter__",
           [](const io::Batch& b) { return py::iter(py::make_tuple(b.inputs, b.targets)); });

  py::class_<io::BatchLoader>(d, "BatchLoader", R"doc(
Batches from a token stream in llm.c's order (Note [Batch order] in core/io/batch_loader.h):
batch k holds inputs[b, t] = tokens[p_k + b*T + t], targets one position on, with
p_k = (k mod batches_per_pass) * B*T.

    >>> loader = loom.data.BatchLoader(loom.data.read_token_file("train.bin"), 4, 64, "train.bin")
    >>> x, y = loader.next_batch()
)doc")
      .def(py::init([](py::handle tokens, int64_t batch, int64_t seq, const std::string& name) {
             return io::BatchLoader(tokens_arg(tokens, "BatchLoader"), batch, seq, name);
           }),
           py::arg("tokens"), py::arg("batch"), py::arg("seq"), py::arg("name") = "")
      .def("next_batch", &io::BatchLoader::next_batch, Release())
      .def("batch_at", &io::BatchLoader::batch_at, py::arg("k"), Release())
      .def("reset", &io::BatchLoader::reset)
      .def("seek", &io::BatchLoader::seek, py::arg("k"),
           "next_batch() returns batch k next (a resumed run's data position; k >= 0).")
      .def_property_readonly("index", &io::BatchLoader::index)
      .def_property_readonly("batches_per_pass", &io::BatchLoader::batches_per_pass)
      .def_property_readonly("batch", &io::BatchLoader::batch)
      .def_property_readonly("seq", &io::BatchLoader::seq)
      .def_property_readonly("num_tokens",
                             [](const io::BatchLoader& self) { return self.tokens().size(); })
      .def("tokens", [](const io::BatchLoader& self) { return tokens_tensor(self.tokens()); });

  d.def(
      "check_token_range",
      [](py::handle tokens, int64_t vocab, const std::string& name) {
        io::check_token_range(tokens_arg(tokens, "check_token_range"), vocab, name);
      },
      py::arg("tokens"), py::arg("vocab"), py::arg("name") = "",
      "Raises ValueError naming the token and its position when a token is outside [0, vocab).");

  // ---------------------------------------------------------------- files
  d.def(
      "read_token_file",
      [](const std::string& path) { return tokens_tensor(io::read_token_file(path)); },
      py::arg("path"), "An llm.c token file (.bin) as i32 [n].");
  d.def(
      "write_token_file",
      [](const std::string& path, py::handle tokens) {
        io::write_token_file(path, tokens_arg(tokens, "write_token_file"));
      },
      py::arg("path"), py::arg("tokens"));
  d.def(
      "read_text_file",
      [](const std::string& path) { return tokens_tensor(io::read_text_file(path)); },
      py::arg("path"), "A file's bytes as tokens 0..255, i32 [n].");
  d.def(
      "text_to_tokens",
      [](const std::string& text) { return tokens_tensor(io::text_to_tokens(text)); },
      py::arg("text"));
  d.def(
      "tokens_to_text",
      [](py::handle tokens) {
        return py::bytes(io::tokens_to_text(tokens_arg(tokens, "tokens_to_text")));
      },
      py::arg("tokens"), "Tokens 0..255 back to bytes.");
  d.attr("BYTE_VOCAB") = io::kByteVocab;

  // ---------------------------------------------------------------- click logs
  py::class_<io::ClickDataConfig>(d, "ClickDataConfig",
                                  "The synthetic click logs' options (core/io/click_data.h).")
      .def(py::init([](uint64_t seed, int64_t num_dense, std::vector<int64_t> table_rows,
                       int64_t batch_size, int64_t max_bag_size, double bias, double dense_variance,
                       double categorical_variance, double interaction_variance,
                       int64_t latent_dim) {
             io::ClickDataConfig c;
             c.seed = seed;
             c.num_dense = num_dense;
             c.table_rows = std::move(table_rows);
             c.batch_size = batch_size;
             c.max_bag_size = max_bag_size;
             c.bias = bias;
             c.dense_variance = dense_variance;
             c.categorical_variance = categorical_variance;
             c.interaction_variance = interaction_variance;
             c.latent_dim = latent_dim;
             return c;
           }),
           py::kw_only(), py::arg("seed") = io::ClickDataConfig{}.seed,
           py::arg("num_dense") = io::ClickDataConfig{}.num_dense,
           py::arg("table_rows") = io::ClickDataConfig{}.table_rows,
           py::arg("batch_size") = io::ClickDataConfig{}.batch_size,
           py::arg("max_bag_size") = io::ClickDataConfig{}.max_bag_size,
           py::arg("bias") = io::ClickDataConfig{}.bias,
           py::arg("dense_variance") = io::ClickDataConfig{}.dense_variance,
           py::arg("categorical_variance") = io::ClickDataConfig{}.categorical_variance,
           py::arg("interaction_variance") = io::ClickDataConfig{}.interaction_variance,
           py::arg("latent_dim") = io::ClickDataConfig{}.latent_dim)
      .def_readwrite("seed", &io::ClickDataConfig::seed)
      .def_readwrite("num_dense", &io::ClickDataConfig::num_dense)
      .def_readwrite("table_rows", &io::ClickDataConfig::table_rows)
      .def_readwrite("batch_size", &io::ClickDataConfig::batch_size)
      .def_readwrite("max_bag_size", &io::ClickDataConfig::max_bag_size)
      .def_readwrite("bias", &io::ClickDataConfig::bias)
      .def_readwrite("dense_variance", &io::ClickDataConfig::dense_variance)
      .def_readwrite("categorical_variance", &io::ClickDataConfig::categorical_variance)
      .def_readwrite("interaction_variance", &io::ClickDataConfig::interaction_variance)
      .def_readwrite("latent_dim", &io::ClickDataConfig::latent_dim);

  py::class_<io::ClickBatch>(d, "ClickBatch", R"doc(
One batch of B examples over T tables, on the CPU: dense f32 [B, num_dense], indices i64 [N],
offsets i64 [T*B + 1] (CSR, feature-major: the bag of example b in table t is
indices[offsets[t*B + b] : offsets[t*B + b + 1]]), labels f32 [B] (0 or 1) and the hidden click
probabilities f32 [B] (not an input).)doc")
      .def_readonly("dense", &io::ClickBatch::dense)
      .def_readonly("indices", &io::ClickBatch::indices)
      .def_readonly("offsets", &io::ClickBatch::offsets)
      .def_readonly("labels", &io::ClickBatch::labels)
      .def_readonly("probabilities", &io::ClickBatch::probabilities)
      .def_property_readonly("batch_size", &io::ClickBatch::batch_size);

  py::class_<io::ClickCeiling>(d, "ClickCeiling", "The Bayes-optimal figures on held-out examples.")
      .def_readonly("accuracy", &io::ClickCeiling::accuracy)
      .def_readonly("auc", &io::ClickCeiling::auc)
      .def_readonly("positive_rate", &io::ClickCeiling::positive_rate)
      .def_readonly("num_examples", &io::ClickCeiling::num_examples)
      .def("__repr__", [](const io::ClickCeiling& c) {
        return "ClickCeiling(accuracy=" + std::to_string(c.accuracy) +
               ", auc=" + std::to_string(c.auc) +
               ", positive_rate=" + std::to_string(c.positive_rate) +
               ", num_examples=" + std::to_string(c.num_examples) + ")";
      });

  py::class_<io::ClickDataset, std::shared_ptr<io::ClickDataset>>(d, "ClickDataset", R"doc(
Synthetic click logs with a known accuracy/AUC ceiling, loom-dlrm's data (Note [Hidden click
model] in core/io/click_data.h). Every example is a pure function of (seed, split, index).

    >>> data = loom.data.ClickDataset(loom.data.ClickDataConfig(seed=1234, batch_size=256))
    >>> b = data.batch("train", 0)                        # b.dense, b.indices, b.offsets, b.labels
    >>> part = data.examples("train", first=128, count=128)   # a rank's half of batch 0
    >>> data.ceiling().auc                                 # the best any model can do
)doc")
      .def(py::init([](std::optional<io::ClickDataConfig> config) {
             return std::make_shared<io::ClickDataset>(config.value_or(io::ClickDataConfig{}));
           }),
           py::arg("config") = py::none())
      .def_property_readonly("config", &io::ClickDataset::config)
      .def_property_readonly("num_tables", &io::ClickDataset::num_tables)
      .def(
          "batch",
          [](const io::ClickDataset& self, const std::string& split, int64_t index) {
            const io::ClickSplit s = split_arg(split);
            py::gil_scoped_release release;
            return self.batch(s, index);
          },
          py::arg("split"), py::arg("index"),
          "Batch index of split 'train' or 'eval': examples [index*B, (index+1)*B).")
      .def(
          "examples",
          [](const io::ClickDataset& self, const std::string& split, int64_t first, int64_t count) {
            const io::ClickSplit s = split_arg(split);
            py::gil_scoped_release release;
            return self.examples(s, first, count);
          },
          py::arg("split"), py::arg("first"), py::arg("count"),
          "Examples [first, first + count) of a split as one batch of count.")
      .def("ceiling", &io::ClickDataset::ceiling, py::arg("num_examples") = int64_t(1) << 18,
           Release(), "Bayes accuracy and AUC on held-out examples [0, num_examples).");

  d.def(
      "auc",
      [](py::handle scores, py::handle labels) {
        if (py::isinstance<Tensor>(scores) && py::isinstance<Tensor>(labels)) {
          const Tensor s = scores.cast<Tensor>(), l = labels.cast<Tensor>();
          py::gil_scoped_release release;
          return io::auc(s, l);
        }
        return io::auc(scores.cast<std::vector<float>>(), labels.cast<std::vector<float>>());
      },
      py::arg("scores"), py::arg("labels"),
      "Exact ROC AUC of scores against labels in {0, 1} (ties count one half): f32 tensors of "
      "equal numel, or sequences of floats.");
  d.def("bayes_accuracy", &io::bayes_accuracy, py::arg("p"),
        "The mean of max(p, 1 - p) over click probabilities p.");
  d.def("bayes_auc", &io::bayes_auc, py::arg("p"),
        "The AUC of the scorer p on the population where each example is a positive with weight "
        "p and a negative with weight 1 - p.");

  // ---------------------------------------------------------------- lr schedules
  py::module_ o = m.def_submodule("optim");
  py::class_<optim::LrSchedule> schedule(o, "LrSchedule", R"doc(
A learning-rate schedule as llm.c and nanoGPT use them (optimizer/lr_schedule.h); steps count
from 0. Warmup: max_lr * (step + 1) / warmup_steps; then constant, or cosine from max_lr at
warmup_steps down to min_lr at total_steps.

    >>> s = loom.optim.LrSchedule.cosine(6e-4, 6e-5, warmup_steps=10, total_steps=100)
    >>> for step in range(100):
    ...     opt.lr = s.lr(step)
)doc");
  py::enum_<optim::LrSchedule::Kind>(schedule, "Kind")
      .value("constant", optim::LrSchedule::Kind::kConstant)
      .value("cosine", optim::LrSchedule::Kind::kCosine);
  // The C++ checks (lr >= 0, min_lr <= max_lr, total_steps > warmup_steps, step >= 0) raise
  // ValueError naming the value.
  schedule
      .def_static("constant", &optim::LrSchedule::constant, py::arg("lr"),
                  py::arg("warmup_steps") = 0)
      .def_static("cosine", &optim::LrSchedule::cosine, py::arg("max_lr"), py::arg("min_lr"),
                  py::arg("warmup_steps"), py::arg("total_steps"))
      .def("lr", &optim::LrSchedule::lr, py::arg("step"))
      .def("__call__", &optim::LrSchedule::lr, py::arg("step"))
      .def_readonly("kind", &optim::LrSchedule::kind)
      .def_readonly("max_lr", &optim::LrSchedule::max_lr)
      .def_readonly("min_lr", &optim::LrSchedule::min_lr)
      .def_readonly("warmup_steps", &optim::LrSchedule::warmup_steps)
      .def_readonly("total_steps", &optim::LrSchedule::total_steps)
      .def("str", &optim::LrSchedule::str)
      .def("__str__", &optim::LrSchedule::str)
      .def("__repr__",
           [](const optim::LrSchedule& self) { return "LrSchedule(" + self.str() + ")"; });
}

}  // namespace loom::python
