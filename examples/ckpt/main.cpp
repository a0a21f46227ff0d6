// loom-ckpt: looks into loom's distributed training checkpoints (parallel/checkpoint/).
//
//   loom-ckpt inspect ckpt/                      # the latest: step, layout, model, tensors
//   loom-ckpt inspect ckpt/step-00000100 --json  # that step's run state as JSON
//   loom-ckpt verify ckpt/                       # every file's size and every checksum
//   loom-ckpt check ckpt/ --dp 4 --zero 3        # would this layout resume from it?
//   loom-ckpt export ckpt/ --hf gpt2-out/        # the model as a Hugging Face GPT-2 directory
//
// Everything goes through the manifest, so one process handles a checkpoint saved by any layout
// (dp, tp, pp, ZeRO, any number of ranks). cli::Flags parses flags only; a command's positional
// DIR is taken out of argv first, knowing which of its flags take a value.
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "ckpt/hf_export.h"
#include "ckpt/layout_check.h"
#include "common/flags.h"
#include "common/progress.h"
#include "core/error.h"
#include "gpt/gpt_options.h"
#include "parallel/checkpoint/checkpoint.h"

namespace loom::ckpt {
namespace {

namespace checkpoint = parallel::checkpoint;

constexpr const char* kUsage =
    "usage: loom-ckpt COMMAND DIR [flags]\n"
    "Inspects, verifies and exports loom training checkpoints (loom-gpt --checkpoint-dir).\n"
    "\n"
    "commands:\n"
    "  inspect DIR [--json]   step, saving layout, model config, files and a table of tensors\n"
    "  verify DIR             reads every data file and checks its size and every checksum\n"
    "  check DIR --dp A --tp B --pp C [loom-gpt flags]\n"
    "                         plans how each rank of that layout would load the checkpoint:\n"
    "                         proves every element is found once and loaded, prints the bytes\n"
    "                         each rank reads\n"
    "  export DIR --hf OUT    the model's weights, consolidated from any layout, as a Hugging\n"
    "                         Face GPT-2 directory OUT/ (config.json, model.safetensors)\n"
    "\n"
    "DIR is a step directory (DIR/manifest.json) or a checkpoint root, whose latest committed\n"
    "checkpoint is taken. `loom-ckpt COMMAND --help` lists a command's flags.\n";

std::string format_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[64];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%" PRIu64 " B", bytes);
  else
    std::snprintf(buf, sizeof buf, "%" PRIu64 " bytes (%.1f %s)", bytes, v, units[u]);
  return buf;
}

// A JSON leaf as a person writes it: strings without quotes.
std::string plain(const nlohmann::json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}

// "key value  key value ..." with the keys of `first` (those present) before the others.
std::string key_values(const nlohmann::json& object, const std::vector<std::string>& first) {
  if (!object.is_object()) return plain(object);
  std::string out;
  auto add = [&](const std::string& key) {
    out += (out.empty() ? "" : "  ") + key + " " + plain(object[key]);
  };
  for (const std::string& key : first)
    if (object.contains(key)) add(key);
  for (const auto& [key, value] : object.items())
    if (std::find(first.begin(), first.end(), key) == first.end()) add(key);
  return out;
}

// A command's arguments once its positionals are taken out: argv for cli::Flags.
struct CommandArgs {
  std::vector<std::string> positional;
  std::vector<std::string> flag_args;  // [0] is the program name
  bool help = false;

  bool parse(cli::Flags& flags) {
    std::vector<char*> argv;
    for (std::string& a : flag_args) argv.push_back(a.data());
    return flags.parse(int(argv.size()), argv.data());
  }
};

// The value of a flag of `flags` that takes one (`--hf OUT`) is not positional.
CommandArgs split_args(const std::string& program, int argc, char** argv, const cli::Flags& flags) {
  CommandArgs args;
  args.flag_args.push_back(program);
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") args.help = true;
    if (a.empty() || a[0] != '-' || a == "-") {
      args.positional.push_back(a);
      continue;
    }
    args.flag_args.push_back(a);
    if (a.find('=') == std::string::npos && flags.takes_value(a.substr(2)) && i + 1 < argc)
      args.flag_args.push_back(argv[++i]);
  }
  return args;
}

// Prints a command's help (its usage line, then cli::Flags' list of flags).
void print_help(const std::string& usage, const std::string& summary, const cli::Flags& flags) {
  std::string list = flags.help();
  const size_t at = list.find("\nflags:\n");
  list = at == std::string::npos ? "" : list.substr(at);
  std::printf("usage: %s\n%s\n%s", usage.c_str(), summary.c_str(),
              list == "\nflags:\n" ? "" : list.c_str());
}

// The one DIR a command takes.
std::string the_dir(const std::string& command, const CommandArgs& args) {
  LOOM_CHECK(!args.positional.empty(), "loom-ckpt ", command,
             ": missing DIR (a checkpoint root or step directory); see loom-ckpt ", command,
             " --help");
  LOOM_CHECK(args.positional.size() == 1, "loom-ckpt ", command, ": expected one DIR, got ",
             args.positional.size(), " arguments ('", args.positional[0], "', '",
             args.positional[1], "'", args.positional.size() > 2 ? ", ..." : "", ")");
  return args.positional[0];
}

struct Opened {
  std::string path;  // the committed step directory
  io::CheckpointManifest manifest;
};

// DIR as a committed checkpoint: a step directory, or a root whose latest is taken.
Opened open_checkpoint(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  LOOM_CHECK(fs::exists(dir, ec), "loom-ckpt: ", dir, " does not exist");
  LOOM_CHECK(fs::is_directory(dir, ec), "loom-ckpt: ", dir,
             " is not a directory; expected a checkpoint root or one of its step-NNNNNNNN "
             "directories");
  std::string path = dir;
  fs::path normal = fs::path(dir).lexically_normal();
  if (!normal.has_filename()) normal = normal.parent_path();  // "ckpt/step-00000100/"
  const std::string base = normal.filename().string();
  // A step directory is read as it is (read_manifest says when its save never finished).
  if (!fs::exists(fs::path(dir) / "manifest.json", ec) && base.rfind("step-", 0) != 0) {
    path = checkpoint::latest_checkpoint(dir);
    LOOM_CHECK(!path.empty(), "loom-ckpt: ", dir,
               " is not a checkpoint: it has no manifest.json and no committed step-NNNNNNNN "
               "directory");
  }
  return {path, checkpoint::read_manifest(path)};
}

// Names in reading order: digit runs compare as numbers, so blocks.2 comes before blocks.10.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  while (i < a.size() && j < b.size()) {
    if (digit(a[i]) && digit(b[j])) {
      size_t ie = i, je = j;
      while (ie < a.size() && digit(a[ie])) ++ie;
      while (je < b.size() && digit(b[je])) ++je;
      const std::string x = a.substr(i, ie - i), y = b.substr(j, je - j);
      const size_t xz = std::min(x.find_first_not_of('0'), x.size() - 1);
      const size_t yz = std::min(y.find_first_not_of('0'), y.size() - 1);
      const std::string xs = x.substr(xz), ys = y.substr(yz);  // without leading zeros
      if (xs.size() != ys.size()) return xs.size() < ys.size();
      if (xs != ys) return xs < ys;
      i = ie;
      j = je;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j || (a.size() - i == b.size() - j && a < b);
}

uint64_t total_file_bytes(const io::CheckpointManifest& m) {
  uint64_t bytes = 0;
  for (const io::CheckpointFile& f : m.files) bytes += f.bytes;
  return bytes;
}

int inspect(int argc, char** argv) {
  cli::Flags flags("loom-ckpt inspect", "");
  flags.add_bool("json", "print the checkpoint's run state (the manifest's \"state\") as JSON");
  CommandArgs args = split_args("loom-ckpt inspect", argc, argv, flags);
  const char* summary =
      "Prints a checkpoint's step, format, saving layout, model config, files, and a table of\n"
      "its tensors (name, dtype, global shape, stored pieces, bytes).";
  if (args.help) {
    print_help("loom-ckpt inspect DIR [--json]", summary, flags);
    return 0;
  }
  args.parse(flags);
  const Opened c = open_checkpoint(the_dir("inspect", args));
  const io::CheckpointManifest& m = c.manifest;
  if (flags.get_bool("json")) {
    std::printf("%s\n", m.state.dump(2).c_str());
    return 0;
  }
  std::printf("checkpoint  %s\n", c.path.c_str());
  std::printf("step        %" PRId64 "\n", m.step);
  std::printf("format      loom checkpoint v%d\n", m.format_version);
  if (m.state.contains("layout"))
    std::printf(
        "layout      %s\n",
        key_values(m.state["layout"], {"world_size", "dp", "tp", "pp", "zero", "dtype"}).c_str());
  if (m.state.contains("model")) {
    std::string model;
    try {
      const GptConfig config = checkpoint_gpt_config(m, c.path);
      model =
          "GPT " + config.str() + ", " + std::to_string(config.num_parameters()) + " parameters";
    } catch (const Error&) {  // not a complete GPT config: shown as it is
      model = key_values(m.state["model"], {});
    }
    std::printf("model       %s\n", model.c_str());
  }
  std::string others;
  for (const auto& [key, value] : m.state.items())
    if (key != "layout" && key != "model") others += (others.empty() ? "" : ", ") + key;
  if (!others.empty()) std::printf("state       %s (--json prints them)\n", others.c_str());
  std::printf("files       %zu, %s\n", m.files.size(), format_bytes(total_file_bytes(m)).c_str());

  struct Row {
    std::string name, dtype, shape, pieces, bytes;
  };
  std::vector<Row> rows = {{"tensor", "dtype", "shape", "pieces", "bytes"}};
  size_t pieces = 0;
  uint64_t bytes = 0;
  std::vector<std::string> names;
  for (const auto& [name, t] : m.tensors) names.push_back(name);
  std::sort(names.begin(), names.end(), natural_less);
  for (const std::string& name : names) {
    const io::TensorEntry& t = m.tensors.at(name);
    uint64_t b = 0;
    for (const io::StoredPiece& p : t.pieces) b += p.nbytes;
    pieces += t.pieces.size();
    bytes += b;
    rows.push_back({name, dtype_name(t.dtype), shape_str(t.shape), std::to_string(t.pieces.size()),
                    std::to_string(b)});
  }
  size_t w[5] = {0, 0, 0, 0, 0};
  for (const Row& r : rows) {
    w[0] = std::max(w[0], r.name.size());
    w[1] = std::max(w[1], r.dtype.size());
    w[2] = std::max(w[2], r.shape.size());
    w[3] = std::max(w[3], r.pieces.size());
    w[4] = std::max(w[4], r.bytes.size());
  }
  std::printf("\n");
  for (const Row& r : rows)
    std::printf("%-*s  %-*s  %-*s  %*s  %*s\n", int(w[0]), r.name.c_str(), int(w[1]),
                r.dtype.c_str(), int(w[2]), r.shape.c_str(), int(w[3]), r.pieces.c_str(), int(w[4]),
                r.bytes.c_str());
  std::printf("total: %zu tensors, %zu pieces, %s\n", m.tensors.size(), pieces,
              format_bytes(bytes).c_str());
  return 0;
}

int verify(int argc, char** argv) {
  cli::Flags flags("loom-ckpt verify", "");
  CommandArgs args = split_args("loom-ckpt verify", argc, argv, flags);
  const char* summary =
      "Reads every data file of a checkpoint and checks its size and the crc32c checksum of\n"
      "every chunk against the manifest. Exits 1 naming the first damaged file and tensor.";
  if (args.help) {
    print_help("loom-ckpt verify DIR", summary, flags);
    return 0;
  }
  args.parse(flags);
  const auto start = std::chrono::steady_clock::now();
  const Opened c = open_checkpoint(the_dir("verify", args));
  std::printf("verifying %s (step %" PRId64 ")\n", c.path.c_str(), c.manifest.step);
  std::fflush(stdout);
  checkpoint::verify(c.path, c.manifest);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("ok: %zu files, %" PRIu64 " bytes, %zu tensors verified in %.2f s\n",
              c.manifest.files.size(), total_file_bytes(c.manifest), c.manifest.tensors.size(), s);
  return 0;
}

int export_command(int argc, char** argv) {
  cli::Flags flags("loom-ckpt export", "");
  flags.add_string("hf", "",
                   "write the model as a Hugging Face GPT-2 directory: OUT/config.json and "
                   "OUT/model.safetensors (created when missing; files in it are replaced)");
  CommandArgs args = split_args("loom-ckpt export", argc, argv, flags);
  const char* summary =
      "Consolidates a checkpoint's GPT parameters from whatever layout saved them (any dp, tp,\n"
      "pp, ZeRO stage) into one process and writes them for other tools. The config comes from\n"
      "the checkpoint's state[\"model\"]; bf16 / f16 runs export their f32 master weights.";
  if (args.help) {
    print_help("loom-ckpt export DIR --hf OUT", summary, flags);
    return 0;
  }
  args.parse(flags);
  const std::string dir = the_dir("export", args);
  LOOM_CHECK(!flags.get_string("hf").empty(),
             "loom-ckpt export: say where to write with --hf OUT (a Hugging Face GPT-2 "
             "directory)");
  const std::string out = flags.get_string("hf");
  const auto start = std::chrono::steady_clock::now();
  const Opened c = open_checkpoint(dir);
  const ConsolidatedGpt gpt = consolidate_gpt(c.path, c.manifest);
  std::printf("loaded %s (step %" PRId64 "): GPT %s from %s (%s)\n", c.path.c_str(),
              c.manifest.step, gpt.weights.config.str().c_str(), gpt.source.c_str(),
              dtype_name(gpt.stored_dtype));
  write_hf_gpt2(out, gpt.weights);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::filesystem::path o(out);
  std::printf("wrote %s and %s (%" PRId64 " parameters) in %s\n",
              (o / "config.json").string().c_str(), (o / "model.safetensors").string().c_str(),
              gpt.weights.config.num_parameters(), cli::format_duration(s).c_str());
  return 0;
}

// check's flags are loom-gpt's: a resume's command line can be pasted as it is.
int check(int argc, char** argv) {
  cli::Flags flags("loom-ckpt check", "");
  gpt::declare_gpt_flags(flags);
  CommandArgs args = split_args("loom-ckpt check", argc, argv, flags);
  if (args.help) {
    std::printf(
        "usage: loom-ckpt check DIR --dp A --tp B --pp C [--zero Z] [loom-gpt flags]\n"
        "Plans, from the manifest alone, how every rank of a loom-gpt layout would load the\n"
        "checkpoint on --resume, as that rank's load plans it: proves that each rank finds\n"
        "every element it needs in exactly one stored piece and that the ranks together load\n"
        "every element of the training state, and prints the bytes each rank reads. Exits 1\n"
        "naming the rank and the reason when the layout cannot resume from the checkpoint.\n"
        "\n"
        "It takes loom-gpt's flags (a resume's command line can be pasted); those that decide\n"
        "what a rank holds: --dp, --tp, --pp, --zero, --sequence-parallel, --schedule,\n"
        "--schedule-file, --microbatches, --virtual-stages, --dtype and --bucket-mb. --dtype\n"
        "defaults to the checkpoint's, --dp to 1.\n");
    return 0;
  }
  args.parse(flags);
  const Opened c = open_checkpoint(the_dir("check", args));
  gpt::GptOptions o = gpt::read_gpt_options(flags);
  if (o.dp == 0) o.dp = 1;  // loom-gpt's "every rank launched": here nothing is launched
  if (!flags.was_set("dtype") && c.manifest.state.contains("layout") &&
      c.manifest.state["layout"].value("dtype", nlohmann::json()).is_string())
    o.dtype = c.manifest.state["layout"]["dtype"].get<std::string>();
  const auto start = std::chrono::steady_clock::now();
  std::string saved = "an unknown layout";
  if (c.manifest.state.contains("layout"))
    saved =
        key_values(c.manifest.state["layout"], {"world_size", "dp", "tp", "pp", "zero", "dtype"});
  std::printf("checkpoint %s (step %" PRId64 ", saved by %s)\n", c.path.c_str(), c.manifest.step,
              saved.c_str());
  std::printf("target     %" PRId64 " ranks: dp %" PRId64 " tp %" PRId64 " pp %" PRId64
              " zero %" PRId64 " dtype %s%s%s\n",
              o.dp * o.tp * o.pp, o.dp, o.tp, o.pp, o.zero, o.dtype.c_str(),
              o.pp > 1 ? (" schedule " + o.schedule).c_str() : "",
              o.sequence_parallel ? " sequence-parallel" : "");
  std::fflush(stdout);
  const LayoutCheck r = check_layout(c.path, c.manifest, o);
  // Tensors the layout does not load must be explained, or the resume would lose state.
  size_t replaced = 0;
  for (const std::string& name : r.unused) {
    const bool by_master = name.rfind("model.", 0) == 0 &&
                           c.manifest.tensors.count("optim." + name.substr(6) + ".master");
    LOOM_CHECK(by_master, "checkpoint ", c.path, ": no rank of the layout loads tensor ", name,
               " (the resume would lose it: a different optimizer or model?)");
    ++replaced;
  }
  std::printf("\n%5s  %3s %3s %3s  %8s  %7s  %6s  %14s  %s\n", "rank", "pp", "dp", "tp", "tensors",
              "pieces", "files", "elements", "bytes read");
  for (const RankRead& x : r.ranks)
    std::printf("%5d  %3d %3d %3d  %8zu  %7zu  %6zu  %14" PRIu64 "  %s\n", x.rank, x.pp, x.dp, x.tp,
                x.tensors, x.pieces, x.files, x.elements, format_bytes(x.bytes).c_str());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "\nok: every rank finds each element it loads in exactly one stored piece, and the %zu "
      "ranks together load every element of %zu tensors (%" PRIu64
      " elements, %.2f copies "
      "each on average: replicas)\n",
      r.ranks.size(), r.tensors, r.elements,
      r.elements ? double(r.element_loads) / double(r.elements) : 0.0);
  if (replaced)
    std::printf(
        "not loaded: %zu bf16 / f16 parameter tensors, whose f32 masters are loaded in "
        "their place\n",
        replaced);
  std::printf(
      "read: %s in all, at most %s on one rank, of the checkpoint's %s (planned in %.2f s)\n",
      format_bytes(r.bytes()).c_str(), format_bytes(r.max_bytes()).c_str(),
      format_bytes(total_file_bytes(c.manifest)).c_str(), s);
  std::printf("bytes in all: %" PRIu64 ", most on one rank: %" PRIu64 "\n", r.bytes(),
              r.max_bytes());
  if (r.whole_bytes() != r.bytes())
    std::printf(
        "from the page cache (ZeRO stage %" PRId64
        " reads the parameters whole when every rank has them cached): bytes in all: %" PRIu64
        ", most on one rank: %" PRIu64 "\n",
        o.zero, r.whole_bytes(), r.max_whole_bytes());
  return 0;
}

int run(int argc, char** argv) {
  const std::string command = argc > 1 ? argv[1] : "";
  if (command == "--help" || command == "-h" || command == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  LOOM_CHECK(!command.empty(),
             "loom-ckpt: missing command: inspect, verify, check or export (see loom-ckpt --help)");
  if (command == "inspect") return inspect(argc, argv);
  if (command == "verify") return verify(argc, argv);
  if (command == "export") return export_command(argc, argv);
  if (command == "check") return check(argc, argv);
  LOOM_FAIL("loom-ckpt: unknown command '", command,
            "': expected inspect, verify, check or export (see loom-ckpt --help)");
}

}  // namespace
}  // namespace loom::ckpt

int main(int argc, char** argv) {
  try {
    return loom::ckpt::run(argc, argv);
  } catch (const loom::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "loom-ckpt: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "loom-ckpt: error: %s\n", e.what());
    return 1;
  }
}
