// Schedules as data: the bookkeeping check and the text form (See schedule.h).
//
// parse_schedule reads the file in two passes: the schedule, chunk and mb lines first, so that an
// action line can be checked against its rank's chunks wherever the chunk lines stand; then the
// action lines. Errors name "<source>:<line>"; check_well_formed's errors on a parsed schedule
// name the line of the action too.
#include "parallel/pipeline/schedule.h"

#include "core/io/detail/file.h"

#include <cctype>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <sstream>

#include "core/error.h"

namespace loom::parallel::pipeline {
namespace {

// Bounds every count (ranks, stages, pipelines, micro-batches, chunks), so that a corrupt file is
// an error rather than a huge allocation.
constexpr int kMaxCount = 1 << 20;

// Text from the file as an error quotes it: at most `max_chars` of it, bytes that are not
// printable ASCII as \xNN, and how much was left out (a 100,000-character line, or random bytes,
// must not become the message).
std::string excerpt(const std::string& text, size_t max_chars) {
  std::string out;
  size_t i = 0;
  for (; i < text.size() && out.size() < max_chars; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += char(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02X", unsigned(c));
      out += hex;
    }
  }
  if (i < text.size()) out += "... (" + std::to_string(text.size() - i) + " more bytes)";
  return out;
}

constexpr ActionKind kAllKinds[] = {ActionKind::kForward,        ActionKind::kBackward,
                                    ActionKind::kWeightGrad,     ActionKind::kSendActivation,
                                    ActionKind::kRecvActivation, ActionKind::kSendGrad,
                                    ActionKind::kRecvGrad,       ActionKind::kGradSync};

bool is_compute(ActionKind k) {
  return k == ActionKind::kForward || k == ActionKind::kBackward || k == ActionKind::kWeightGrad;
}
bool is_transfer(ActionKind k) {
  return k == ActionKind::kSendActivation || k == ActionKind::kRecvActivation ||
         k == ActionKind::kSendGrad || k == ActionKind::kRecvGrad;
}

// Says where an action sits: "rank 2 action 5 (B mb 3 chunk 0)", and for a parsed schedule the
// line it came from.
using Locate = std::function<std::string(int rank, int index)>;

void check_impl(const Schedule& s, const std::string& prefix, const Locate& locate) {
  const std::string& name = s.name;
  bool one_word = !name.empty() && name[0] != '#';
  for (char c : name) one_word = one_word && !std::isspace(static_cast<unsigned char>(c));
  LOOM_CHECK(one_word, prefix,
             "the name must be one word (no spaces, not starting with '#'), got '", name, "'");
  const std::pair<const char*, int> counts[] = {{"ranks", s.ranks},
                                                {"pipelines", s.pipelines},
                                                {"stages", s.stages},
                                                {"microbatches", s.microbatches}};
  for (const auto& [what, n] : counts)
    LOOM_CHECK(n >= 1 && n <= kMaxCount, prefix, what, " must be in [1, ", kMaxCount, "], got ", n);

  // Chunk places: the same number on every rank, each stage of each pipeline held exactly once.
  LOOM_CHECK(int(s.chunks.size()) == s.ranks, prefix, "chunks has ", s.chunks.size(),
             " entries, expected one per rank (", s.ranks, ")");
  const int per_rank = s.chunks_per_rank();
  LOOM_CHECK(per_rank >= 1, prefix, "rank 0 holds no chunk");
  LOOM_CHECK(int64_t(per_rank) * s.microbatches <= kMaxCount, prefix, "microbatches (",
             s.microbatches, ") times chunks per rank (", per_rank, ") must be at most ",
             kMaxCount);
  std::vector<std::pair<int, int>> held(size_t(s.pipelines) * size_t(s.stages), {-1, -1});
  for (int r = 0; r < s.ranks; ++r) {
    LOOM_CHECK(int(s.chunks[size_t(r)].size()) == per_rank, prefix, "rank ", r, " holds ",
               s.chunks[size_t(r)].size(), " chunks but rank 0 holds ", per_rank,
               " (every rank holds the same number)");
    for (int c = 0; c < per_rank; ++c) {
      const ChunkPlace& p = s.chunks[size_t(r)][size_t(c)];
      LOOM_CHECK(p.pipeline >= 0 && p.pipeline < s.pipelines, prefix, "rank ", r, " chunk ", c,
                 ": pipeline ", p.pipeline, " out of range [0, ", s.pipelines, ")");
      LOOM_CHECK(p.stage >= 0 && p.stage < s.stages, prefix, "rank ", r, " chunk ", c, ": stage ",
                 p.stage, " out of range [0, ", s.stages, ")");
      auto& h = held[size_t(p.pipeline) * size_t(s.stages) + size_t(p.stage)];
      LOOM_CHECK(h.first < 0, prefix, "stage ", p.stage, " of pipeline ", p.pipeline,
                 " is held twice: by rank ", h.first, " chunk ", h.second, " and by rank ", r,
                 " chunk ", c);
      h = {r, c};
    }
  }
  for (int p = 0; p < s.pipelines; ++p)
    for (int st = 0; st < s.stages; ++st)
      LOOM_CHECK(held[size_t(p) * size_t(s.stages) + size_t(st)].first >= 0, prefix,
                 "no rank holds stage ", st, " of pipeline ", p);

  LOOM_CHECK(int(s.pipeline_of.size()) == s.microbatches, prefix, "pipeline_of has ",
             s.pipeline_of.size(), " entries, expected one per micro-batch (", s.microbatches, ")");
  for (int mb = 0; mb < s.microbatches; ++mb) {
    const int p = s.pipeline_of[size_t(mb)];
    LOOM_CHECK(p >= 0 && p < s.pipelines, prefix, "micro-batch ", mb, " runs through pipeline ", p,
               ", out of range [0, ", s.pipelines, ")");
  }

  // Actions: fields in range; F and B once, W at most once per (micro-batch, chunk); SYNC at most
  // once per chunk. first[kind][mb * per_rank + chunk] is the index of the first such action.
  LOOM_CHECK(int(s.actions.size()) == s.ranks, prefix, "actions has ", s.actions.size(),
             " lists, expected one per rank (", s.ranks, ")");
  const size_t slots = size_t(s.microbatches) * size_t(per_rank);
  for (int r = 0; r < s.ranks; ++r) {
    const std::vector<Action>& list = s.actions[size_t(r)];
    std::vector<std::vector<int>> first(3, std::vector<int>(slots, -1));  // F, B, W
    std::vector<int> sync(size_t(per_rank), -1);
    for (int i = 0; i < int(list.size()); ++i) {
      const Action& a = list[size_t(i)];
      bool known = false;
      for (ActionKind k : kAllKinds) known = known || a.kind == k;
      LOOM_CHECK(known, locate(r, i), ": unknown action kind ", int(a.kind));
      // Built only when a check fails (LOOM_CHECK evaluates its message then).
      const auto at = [&] { return locate(r, i) + " (" + a.str() + ")"; };
      LOOM_CHECK(a.chunk >= 0 && a.chunk < per_rank, at(), ": chunk ", a.chunk,
                 " out of range [0, ", per_rank, ")");
      if (a.kind == ActionKind::kGradSync) {
        LOOM_CHECK(a.microbatch == -1 && a.peer == -1, at(),
                   ": SYNC takes no micro-batch and no peer (both -1), got ", a.microbatch, " and ",
                   a.peer);
        int& seen = sync[size_t(a.chunk)];
        LOOM_CHECK(seen < 0, at(), ": a second SYNC of chunk ", a.chunk, " (the first is action ",
                   seen, ")");
        seen = i;
        continue;
      }
      LOOM_CHECK(a.microbatch >= 0 && a.microbatch < s.microbatches, at(), ": micro-batch ",
                 a.microbatch, " out of range [0, ", s.microbatches, ")");
      const ChunkPlace& place = s.chunks[size_t(r)][size_t(a.chunk)];
      const int mb_pipeline = s.pipeline_of[size_t(a.microbatch)];
      LOOM_CHECK(mb_pipeline == place.pipeline, at(), ": micro-batch ", a.microbatch,
                 " runs through pipeline ", mb_pipeline, " but chunk ", a.chunk, " of rank ", r,
                 " holds stage ", place.stage, " of pipeline ", place.pipeline);
      if (is_transfer(a.kind)) {
        LOOM_CHECK(a.peer >= 0 && a.peer < s.ranks, at(), ": peer ", a.peer, " out of range [0, ",
                   s.ranks, ")");
        continue;
      }
      LOOM_CHECK(a.peer == -1, at(), ": ", action_token(a.kind), " takes no peer (-1), got ",
                 a.peer);
      const int k = a.kind == ActionKind::kForward ? 0 : a.kind == ActionKind::kBackward ? 1 : 2;
      int& seen = first[size_t(k)][size_t(a.microbatch) * size_t(per_rank) + size_t(a.chunk)];
      LOOM_CHECK(seen < 0, at(), ": a second ", action_token(a.kind), " of micro-batch ",
                 a.microbatch, " on chunk ", a.chunk, " (the first is action ", seen, ")");
      seen = i;
    }
    for (int c = 0; c < per_rank; ++c) {
      const ChunkPlace& place = s.chunks[size_t(r)][size_t(c)];
      for (int mb = 0; mb < s.microbatches; ++mb) {
        if (s.pipeline_of[size_t(mb)] != place.pipeline) continue;
        for (int k = 0; k < 2; ++k)
          LOOM_CHECK(first[size_t(k)][size_t(mb) * size_t(per_rank) + size_t(c)] >= 0, prefix,
                     "rank ", r, " has no ", k == 0 ? "F" : "B", " of micro-batch ", mb,
                     " on chunk ", c, " (stage ", place.stage, " of pipeline ", place.pipeline,
                     ")");
      }
    }
  }
}

// ------------------------------------------------------------------------------------- parsing

struct Line {
  int number;
  std::string text;  // as written, for messages
  std::vector<std::string> tokens;
};

std::vector<Line> split_lines(const std::string& text) {
  std::vector<Line> lines;
  std::istringstream in(text);
  std::string raw;
  for (int number = 1; std::getline(in, raw); ++number) {
    if (!raw.empty() && raw.back() == '\r') raw.pop_back();
    const std::string body = raw.substr(0, raw.find('#'));
    std::istringstream words(body);
    Line line{number, raw, {}};
    for (std::string w; words >> w;) line.tokens.push_back(w);
    if (!line.tokens.empty()) lines.push_back(std::move(line));
  }
  return lines;
}

class Parser {
 public:
  Parser(const std::string& text, const std::string& source)
      : lines_(split_lines(text)), source_(source) {}

  Schedule run() {
    LOOM_CHECK(!lines_.empty(), source_,
               ": no schedule in it; expected a line 'schedule <name> stages <S> pipelines <P> "
               "ranks <R> microbatches <M>'");
    header(lines_[0]);
    // rank -> chunk -> (place, line number)
    std::map<int, std::map<int, std::pair<ChunkPlace, int>>> chunk_lines;
    std::vector<int> mb_line(size_t(s_.microbatches), 0);
    s_.pipeline_of.assign(size_t(s_.microbatches), 0);
    std::vector<const Line*> action_lines;
    for (size_t k = 1; k < lines_.size(); ++k) {
      const Line& l = lines_[k];
      const std::string& head = l.tokens[0];
      if (head == "schedule") {
        fail(l, "a second 'schedule' line (the first is line " + std::to_string(lines_[0].number) +
                    ")");
      } else if (head == "chunk") {
        fields(l, 5, "chunk <rank> <chunk> <pipeline> <stage>");
        const int r = number(l, 1, "rank", 0, s_.ranks);
        const int c = number(l, 2, "chunk", 0, kMaxCount);
        const int p = number(l, 3, "pipeline", 0, s_.pipelines);
        const int st = number(l, 4, "stage", 0, s_.stages);
        auto [it, fresh] = chunk_lines[r].try_emplace(c, ChunkPlace{p, st}, l.number);
        if (!fresh)
          fail(l, "a second line for rank " + std::to_string(r) + " chunk " + std::to_string(c) +
                      " (the first is line " + std::to_string(it->second.second) + ")");
      } else if (head == "mb") {
        fields(l, 3, "mb <microbatch> <pipeline>");
        const int mb = number(l, 1, "micro-batch", 0, s_.microbatches);
        const int p = number(l, 2, "pipeline", 0, s_.pipelines);
        if (mb_line[size_t(mb)] != 0)
          fail(l, "a second line for micro-batch " + std::to_string(mb) + " (the first is line " +
                      std::to_string(mb_line[size_t(mb)]) + ")");
        mb_line[size_t(mb)] = l.number;
        s_.pipeline_of[size_t(mb)] = p;
      } else {
        action_lines.push_back(&l);
      }
    }

    // Every rank needs chunk lines 0..n-1, with the same n everywhere.
    s_.chunks.assign(size_t(s_.ranks), {});
    for (int r = 0; r < s_.ranks; ++r) {
      auto it = chunk_lines.find(r);
      LOOM_CHECK(it != chunk_lines.end(), source_, ": no 'chunk ", r, " 0 <pipeline> <stage>' line",
                 " (every rank needs one line per chunk it holds)");
      int expected = 0;
      for (const auto& [c, place_line] : it->second) {
        LOOM_CHECK(c == expected, source_, ":", place_line.second, ": rank ", r, " chunk ", c,
                   " but no 'chunk ", r, " ", expected, " <pipeline> <stage>' line");
        s_.chunks[size_t(r)].push_back(place_line.first);
        ++expected;
      }
      LOOM_CHECK(expected == int(s_.chunks[0].size()), source_, ": rank ", r, " has ", expected,
                 " chunk line(s) but rank 0 has ", s_.chunks[0].size(),
                 " (every rank holds the same number of chunks)");
    }
    if (s_.pipelines > 1)
      for (int mb = 0; mb < s_.microbatches; ++mb)
        LOOM_CHECK(mb_line[size_t(mb)] != 0, source_, ": no 'mb ", mb, " <pipeline>' line (with ",
                   s_.pipelines, " pipelines each micro-batch says which one it runs through)");

    s_.actions.assign(size_t(s_.ranks), {});
    std::vector<std::vector<int>> line_of(size_t(s_.ranks));
    for (const Line* l : action_lines) {
      const auto [r, a] = action(*l);
      s_.actions[size_t(r)].push_back(a);
      line_of[size_t(r)].push_back(l->number);
    }
    const std::string prefix = source_ + ": schedule '" + s_.name + "': ";
    check_impl(s_, prefix, [&](int r, int i) {
      return source_ + ":" + std::to_string(line_of[size_t(r)][size_t(i)]) + ": rank " +
             std::to_string(r) + " action " + std::to_string(i);
    });
    return std::move(s_);
  }

 private:
  [[noreturn]] void fail(const Line& l, const std::string& what) const {
    LOOM_FAIL(source_, ":", l.number, ": ", excerpt(what, 240), ": '", excerpt(l.text, 120), "'");
  }

  void fields(const Line& l, size_t n, const char* form) const {
    if (l.tokens.size() < n) fail(l, "missing field(s): expected '" + std::string(form) + "'");
    if (l.tokens.size() > n) fail(l, "too many fields: expected '" + std::string(form) + "'");
  }

  // Token k as an integer in [lo, hi); `hint` follows the range in the message.
  int number(const Line& l, size_t k, const char* what, int lo, int hi,
             const std::string& hint = "") const {
    const std::string& t = l.tokens[k];
    int v = 0;
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    if (ec != std::errc() || end != t.data() + t.size())
      fail(l, std::string(what) + " '" + t + "' is not an integer");
    if (v < lo || v >= hi)
      fail(l, std::string(what) + " " + t + " out of range [" + std::to_string(lo) + ", " +
                  std::to_string(hi) + ")" + hint);
    return v;
  }

  void header(const Line& l) {
    const std::string form = "schedule <name> stages <S> pipelines <P> ranks <R> microbatches <M>";
    if (l.tokens[0] != "schedule") fail(l, "expected '" + form + "' first");
    if (l.tokens.size() != 10) fail(l, "expected '" + form + "'");
    s_.name = l.tokens[1];
    std::map<std::string, int*> keys = {{"stages", &s_.stages},
                                        {"pipelines", &s_.pipelines},
                                        {"ranks", &s_.ranks},
                                        {"microbatches", &s_.microbatches}};
    std::map<std::string, bool> seen;
    for (size_t k = 2; k + 1 < l.tokens.size(); k += 2) {
      auto it = keys.find(l.tokens[k]);
      if (it == keys.end())
        fail(l,
             "unknown key '" + l.tokens[k] + "' (expected stages, pipelines, ranks, microbatches)");
      if (seen[it->first]) fail(l, "'" + it->first + "' given twice");
      seen[it->first] = true;
      *it->second = number(l, k + 1, it->first.c_str(), 1, kMaxCount + 1);
    }
  }

  std::pair<int, Action> action(const Line& l) const {
    int r = 0;
    const std::string& t = l.tokens[0];
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), r);
    if (ec != std::errc() || end != t.data() + t.size())
      fail(l, "unknown item '" + t +
                  "' (expected 'chunk', 'mb' or an action line '<rank> <action> ...')");
    r = number(l, 0, "rank", 0, s_.ranks);
    if (l.tokens.size() < 2) fail(l, "missing the action after the rank");
    Action a;
    bool known = false;
    for (ActionKind k : kAllKinds)
      if (l.tokens[1] == action_token(k)) {
        a.kind = k;
        known = true;
      }
    if (!known)
      fail(l, "unknown action '" + l.tokens[1] + "' (expected F, B, W, SA, RA, SG, RG or SYNC)");
    const std::string tok = l.tokens[1];
    const int chunks = int(s_.chunks[size_t(r)].size());
    const std::string chunk_hint =
        " (rank " + std::to_string(r) + " has " + std::to_string(chunks) + " chunk line(s))";
    if (a.kind == ActionKind::kGradSync) {
      fields(l, 3, "<rank> SYNC <chunk>");
      a.chunk = number(l, 2, "chunk", 0, chunks, chunk_hint);
    } else if (is_compute(a.kind)) {
      fields(l, 4, ("<rank> " + tok + " <mb> <chunk>").c_str());
      a.microbatch = number(l, 2, "micro-batch", 0, s_.microbatches);
      a.chunk = number(l, 3, "chunk", 0, chunks, chunk_hint);
    } else {
      fields(l, 5, ("<rank> " + tok + " <mb> <chunk> <peer>").c_str());
      a.microbatch = number(l, 2, "micro-batch", 0, s_.microbatches);
      a.chunk = number(l, 3, "chunk", 0, chunks, chunk_hint);
      a.peer = number(l, 4, "peer", 0, s_.ranks);
    }
    return {r, a};
  }

  std::vector<Line> lines_;
  std::string source_;
  Schedule s_;
};

}  // namespace

const char* action_token(ActionKind kind) {
  switch (kind) {
    case ActionKind::kForward:
      return "F";
    case ActionKind::kBackward:
      return "B";
    case ActionKind::kWeightGrad:
      return "W";
    case ActionKind::kSendActivation:
      return "SA";
    case ActionKind::kRecvActivation:
      return "RA";
    case ActionKind::kSendGrad:
      return "SG";
    case ActionKind::kRecvGrad:
      return "RG";
    case ActionKind::kGradSync:
      return "SYNC";
  }
  return "?";
}

std::string Action::str() const {
  std::ostringstream os;
  os << action_token(kind);
  if (kind == ActionKind::kGradSync) {
    os << " chunk " << chunk;
    return os.str();
  }
  os << " mb " << microbatch << " chunk " << chunk;
  if (kind == ActionKind::kSendActivation || kind == ActionKind::kSendGrad)
    os << " -> rank " << peer;
  else if (kind == ActionKind::kRecvActivation || kind == ActionKind::kRecvGrad)
    os << " <- rank " << peer;
  return os.str();
}

std::pair<int, int> Schedule::holder(int pipeline, int stage) const {
  for (size_t r = 0; r < chunks.size(); ++r)
    for (size_t c = 0; c < chunks[r].size(); ++c)
      if (chunks[r][c] == ChunkPlace{pipeline, stage}) return {int(r), int(c)};
  LOOM_FAIL("Schedule::holder: schedule '", name, "': no rank holds stage ", stage, " of pipeline ",
            pipeline, " (", pipelines, " pipeline(s) of ", stages, " stages)");
}

void check_well_formed(const Schedule& s) {
  const std::string prefix = "schedule '" + s.name + "': ";
  check_impl(s, prefix, [&](int r, int i) {
    return prefix + "rank " + std::to_string(r) + " action " + std::to_string(i);
  });
}

std::string format_schedule(const Schedule& s) {
  check_well_formed(s);
  std::ostringstream os;
  os << "# loom pipeline schedule (the format: parallel/pipeline/schedule.h)\n";
  os << "schedule " << s.name << " stages " << s.stages << " pipelines " << s.pipelines << " ranks "
     << s.ranks << " microbatches " << s.microbatches << "\n";
  for (int r = 0; r < s.ranks; ++r)
    for (int c = 0; c < s.chunks_per_rank(); ++c) {
      const ChunkPlace& p = s.chunks[size_t(r)][size_t(c)];
      os << "chunk " << r << " " << c << " " << p.pipeline << " " << p.stage << "\n";
    }
  if (s.pipelines > 1)
    for (int mb = 0; mb < s.microbatches; ++mb)
      os << "mb " << mb << " " << s.pipeline_of[size_t(mb)] << "\n";
  for (int r = 0; r < s.ranks; ++r) {
    os << "# rank " << r << "\n";
    for (const Action& a : s.actions[size_t(r)]) {
      os << r << " " << action_token(a.kind);
      if (a.kind != ActionKind::kGradSync) os << " " << a.microbatch;
      os << " " << a.chunk;
      if (is_transfer(a.kind)) os << " " << a.peer;
      os << "\n";
    }
  }
  return os.str();
}

Schedule parse_schedule(const std::string& text, const std::string& source) {
  return Parser(text, source).run();
}

Schedule read_schedule_file(const std::string& path) {
  io::detail::InFile file(path, "pipeline schedule");
  std::string text(size_t(file.size()), '\0');
  file.read_at(0, text.data(), file.size());
  return parse_schedule(text, path);
}

}  // namespace loom::parallel::pipeline
