#include "collectives/communicator.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iterator>

#include "collectives/hierarchical.h"
#include "collectives/recycled.h"
#include "collectives/self_backend.h"
#include "collectives/work.h"
#if LOOM_WITH_MPI
#include "collectives/mpi_backend.h"
#endif
#if LOOM_WITH_NCCL
#include "collectives/nccl_backend.h"
#endif

namespace loom::comm {

// Note [Deadlines]
// No wait in loom may hang. Every Work polls its operation (MPI_Test) instead of blocking in it,
// with a deadline of timeout_seconds() from the start of the wait (LOOM_COMM_TIMEOUT, default
// 300 s). Past the deadline the wait raises CommError naming the group, the op, its per-group
// sequence number and its size, so a rank that skipped a collective or died shows up as a clear
// error on every rank still waiting for it, rather than as a silent hang.

// Note [Collective signatures]
// A collective that the ranks of a group call differently (another op, dtype, element count,
// root or reduction) is undefined in MPI and NCCL: it hangs, or worse, returns wrong numbers. So
// is a pair of same-sized calls that two ranks make in swapped order. So, unless LOOM_COMM_DEBUG=0
// (or set_debug(false)), every collective carries a signature: a 64-bit hash of the op, dtype,
// count, root, reduction, how many collectives the group made before it (not its sequence
// number, which counts a rank's sends and receives too) and, for the symmetric collectives
// (allreduce, reduce_scatter, allgather, all_to_all), the place in the source it was called from
// (file name and line; a Python script's own line through ScopedCallSite), which is what tells
// two same-sized calls apart. Rooted collectives (broadcast, reduce) and barriers leave the place
// out: a root and the others often call them from different branches of a program.
//
// The check is one allreduce (max) of [hash, ~hash] over the group, on the group's check channel
// (a second communicator over the same ranks, so the checks never match the group's own
// collectives), completed before the collective is posted: every rank learns whether the
// largest and the smallest hash agree, so on a difference every rank knows, and all of them then
// allgather the full calls (on the channel too) and raise the same CommError from their wait,
// listing which ranks made which call. Nothing of the mismatched collective was posted, so
// nothing hangs and no buffer is written; every rank drops it, and the group stays usable.
//
// Note [Carried when unchecked]
// With checks off a small collective still travels in the check channel's exchange (Note [Small
// collectives in their check]), under one hash every rank shares, rather than through MPI's
// nonblocking call: Open MPI's coll/libnbc took 2.18 us for a 1 KiB allreduce on two ranks of
// the Zen 4 VM where the exchange took 0.90 (medians of three runs of loom-bench-collectives, its
// "unchecked" column; benchmarks/README.md).
// Nothing is compared but the payload's length: swapped calls of one size go unnoticed, as the
// check's absence means (tests/mpi/debug_test.cpp), and a call of another size still fails on
// every rank instead of reading a short message.
//
// Note [The check queue]
// Posting a collective must not wait for the other ranks: a program may post nonblocking
// collectives on two groups in different orders on different ranks (legal: only each group's
// own order must agree), and a rank that waited in the first for its peers would never post the
// second, which they wait for. So a checked collective returns at once, queued behind the
// group's earlier ones, and is posted when its check has agreed. One check per group is in
// flight, the oldest's: the next is posted when it completes, so the checks go out on the
// channel in the group's call order on every rank, whatever the timing. The queue advances
// (tests the head's check; on agreement posts the collective and the next check) on every later
// call and every wait or test on the group, and, through progress_checks(), from every wait on
// any group of the process: a rank blocked receiving from a peer that waits for this rank's
// queued allreduce must still post it, as MPI's own progress would have completed it had it
// been posted at once. Without a channel (the nccl backend alone) the check runs on the group
// itself and completes before the collective is posted.
//
// The cost is one exchange of a few bytes per collective (over MPI: point-to-point rounds, Note
// [Signature exchange]): 1.2-3.4 us on two ranks of the development VM, 1.2-1.7% of a 1 MiB
// allreduce, and nothing for the small collectives the check carries (below)
// (loom-bench-collectives measures it A/B; benchmarks/README.md).
//
// Note [Small collectives in their check]
// For a small collective that round trip would be most of its time, so the check carries the
// collective itself (a CheckPayload): an allreduce, reduce_scatter or allgather of host tensors
// up to a size (below) travels inside its check's messages, and the exchange writes the outputs
// once the check has agreed. An allgather's inputs and the smallest allreduces' reach every rank
// (each rank then reduces all of them); a reduce_scatter's blocks go each to its rank and are
// reduced there; a larger allreduce does that and then gathers the reduced blocks, in a second
// phase only a group whose check agreed runs (Note [Signature exchange] in mpi_exchange.cpp).
// Reductions combine the ranks' values in rank order (collectives/carried.h), so every rank gets
// the same bits whatever the message pattern. A barrier is its check alone: the exchange reaches
// every rank from every rank. Nothing else is posted, so a small collective costs one exchange
// (an allreduce two), not a check and then MPI's collective. Every rank decides alike (the
// decision depends on the op, dtype, count and group size, all in the signature), and a rank
// whose peer sent a message of another length (another call) marks the check failed, so the
// mismatches above still raise on every rank and still write no output.
//
// The sizes (CheckPayload::bytes over the group), measured against MPI's own calls on 2 and 4
// ranks of the development VMs (benchmarks/README.md, "Small collectives"): an allgather is
// carried up to 8 KiB of output (above, its copies in and out of the messages cost more than
// MPI's allgather); an allreduce as one allgather of the inputs up to 16 KiB over the group, in
// two phases up to 32 KiB (at 64 KiB its copies made it 0.65-0.67x of MPI's where MPI's own
// call after a check was 0.67-0.77x, at 128-256 KiB 0.58-0.69x against 0.83-0.90x); a
// reduce_scatter up to 64 KiB of input (0.83x there against 0.56x). Two ranks carry more. An
// allreduce goes as the allgather of the inputs up to the two phases' limit: there each rank
// sends the same bytes either way (its whole input, or half of it twice), in one round trip
// instead of two (on the Zen 3 VM, 16 KiB: 0.70-0.72x -> 0.89x of MPI's; 32 KiB: 0.64-0.67x ->
// 0.72-0.79x; medians of 5 and 10 runs). An allgather is carried up to 16 KiB of output (16 KiB:
// 0.54x -> 0.65x; at 32-64 KiB carried was slower, 0.58-0.59x against 0.61-0.69x; 6 runs).
// A backend may carry more (carried_limit): the MPI backend's groups inside one node, whose
// exchanges go through mailboxes in shared memory, carry every kind up to 64 KiB, and groups
// spanning nodes carry larger allgathers and allreduces (mpi_backend.cpp).

namespace {

const char* const kCollectiveOps[] = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                                      "reduce",    "all_to_all",     "barrier",   "split"};

// The largest carried collectives: See Note [Small collectives in their check].
constexpr size_t kCarriedAllgatherBytes = 8 * 1024;
constexpr size_t kAllreduceByAllgatherBytes = 16 * 1024;
constexpr size_t kCarriedAllreduceBytes = 32 * 1024;
constexpr size_t kCarriedReduceScatterBytes = 64 * 1024;

int64_t op_code(const char* op) {
  for (size_t i = 0; i < std::size(kCollectiveOps); ++i)
    if (op == kCollectiveOps[i] || std::strcmp(op, kCollectiveOps[i]) == 0) return int64_t(i);
  LOOM_ASSERT(false, "unknown collective ", op);
}

// What a collective's check carries (Note [Small collectives in their check]): `block` bytes of
// each rank's share of `input`; the op is ignored by an allgather.
CheckPayload payload_of(CheckPayload::Kind kind, const Tensor& input, const Tensor& output,
                        size_t block, ReduceOp op) {
  return {kind,
          input.numel() > 0 ? input.data_ptr() : nullptr,
          output.numel() > 0 ? output.data_ptr() : nullptr,
          block,
          input.nbytes(),
          input.dtype(),
          op};
}

// On unless LOOM_COMM_DEBUG is "0" (See Note [Collective signatures]).
bool debug_from_environment() {
  const char* v = std::getenv("LOOM_COMM_DEBUG");
  return v == nullptr || std::string(v) != "0";
}

// The file name without its folders: ranks may run the same script by different paths.
const char* base_name(const char* file) {
  const char* base = file;
  for (const char* p = file; *p; ++p)
    if (*p == '/') base = p + 1;
  return base;
}

// Mixes n bytes into h, eight at a time (FNV-1a's byte loop was a visible part of a small
// collective's time); the last partial word carries its length.
uint64_t hash_bytes(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  auto mix = [&h](uint64_t word) {
    h = (h ^ word) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
  };
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    mix(word);
  }
  if (n > 0) {
    uint64_t word = 0;
    std::memcpy(&word, p, n);
    mix(word ^ (uint64_t(n) << 56));
  }
  return h;
}

// The hash of a call's file name (its base name) in a signature.
uint64_t site_hash(const char* base) { return hash_bytes(0, base, std::strlen(base)); }

// A C++ call's file: its base name and that name's hash.
struct SiteFile {
  const char* file = nullptr;  // as std::source_location gave it
  const char* base = "";
  uint64_t hash = 0;
};

// The SiteFile of `file`, a std::source_location's file name. Those are static strings, so a
// few recent ones are kept by address: scanning a path for its base name and hashing it were a
// seventh of loom's own instructions in a 1 KiB allreduce.
const SiteFile& site_file(const char* file) {
  thread_local std::array<SiteFile, 16> recent;
  SiteFile& s = recent[(reinterpret_cast<uintptr_t>(file) >> 3) % recent.size()];
  if (s.file != file) s = SiteFile{file, base_name(file), site_hash(base_name(file))};
  return s;
}

// The site a ScopedCallSite set on this thread (empty: none).
thread_local std::string t_site_file;
thread_local int t_site_line = 0;
// Set while a Communicator::CheckedByCaller lives on this thread.
thread_local bool t_checked_by_caller = false;

constexpr int64_t kFields = 7;      // op, dtype, count, root, reduce, line, collectives before
constexpr int64_t kSiteBytes = 48;  // the file name, truncated, zero-padded

double timeout_from_environment() {
  if (const char* v = std::getenv("LOOM_COMM_TIMEOUT")) {
    char* end = nullptr;
    double s = std::strtod(v, &end);
    LOOM_CHECK(end != v && *end == '\0' && s > 0,
               "LOOM_COMM_TIMEOUT must be a positive number "
               "of seconds, got '",
               v, "'");
    return s;
  }
  return 300.0;
}

void check_buffer(const char* op, const char* arg, const Tensor& t) {
  LOOM_CHECK(t.defined(), op, ": '", arg, "' is undefined");
  LOOM_CHECK(t.is_contiguous(), op, ": '", arg, "' ", t.str(), " is not contiguous");
}

void check_reducible(const char* op, const Tensor& t) {
  LOOM_CHECK(t.dtype() != DType::kU8 && t.dtype() != DType::kBool, op, ": ", dtype_name(t.dtype()),
             " buffers cannot be reduced (raw bytes, masks); use f32, bf16, f16, i32 or i64 (a "
             "bool mask as i32 or i64 sums to a count)");
}

bool on_host(const Tensor& a, const Tensor& b) {
  return a.device().is_cpu() && b.device().is_cpu();
}

void check_same(const char* op, const Tensor& in, const Tensor& out) {
  LOOM_CHECK(in.dtype() == out.dtype(), op, ": input is ", dtype_name(in.dtype()),
             " but output is ", dtype_name(out.dtype()));
  LOOM_CHECK(in.device() == out.device(), op, ": input is on ", in.device().str(),
             " but output on ", out.device().str());
}

}  // namespace

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

void wait_all(const std::vector<WorkPtr>& works) {
  for (const WorkPtr& w : works)
    if (w) w->wait();
}

ScopedCallSite::ScopedCallSite(std::string file, int line)
    : previous_file_(std::move(t_site_file)), previous_line_(t_site_line) {
  t_site_file = std::move(file);
  t_site_line = line;
}

ScopedCallSite::~ScopedCallSite() {
  t_site_file = std::move(previous_file_);
  t_site_line = previous_line_;
}

Communicator::CheckedByCaller::CheckedByCaller() : previous_(t_checked_by_caller) {
  t_checked_by_caller = true;
}

Communicator::CheckedByCaller::~CheckedByCaller() { t_checked_by_caller = previous_; }

Communicator::Communicator(int rank, int size, std::string name)
    : rank_(rank),
      size_(size),
      name_(std::move(name)),
      timeout_s_(timeout_from_environment()),
      debug_(debug_from_environment()) {
  LOOM_ASSERT(size > 0 && rank >= 0 && rank < size, "rank ", rank, " of ", size);
}

void Communicator::set_timeout_seconds(double seconds) {
  LOOM_CHECK(seconds > 0, "Communicator::set_timeout_seconds: must be positive, got ", seconds);
  timeout_s_ = seconds;
}

uint64_t Communicator::op_count(const std::string& op) const {
  for (const OpTally& t : op_counts_)
    if (op == t.op) return t.count;
  return 0;
}

uint64_t Communicator::op_bytes(const std::string& op) const {
  for (const OpTally& t : op_counts_)
    if (op == t.op) return t.bytes;
  return 0;
}

void Communicator::tally(const char* op, size_t bytes) {
  // A literal is found by its address (comparing "send" as strings was 1% of a send's time), and
  // by its text only when another file's copy of it has another address.
  auto it = std::find_if(op_counts_.begin(), op_counts_.end(),
                         [op](const OpTally& t) { return t.op == op; });
  if (it == op_counts_.end())
    it = std::find_if(op_counts_.begin(), op_counts_.end(),
                      [op](const OpTally& t) { return std::strcmp(t.op, op) == 0; });
  if (it == op_counts_.end()) {
    op_counts_.push_back(OpTally{op, 1, bytes});
    return;
  }
  ++it->count, it->bytes += bytes;
}

Communicator::OpInfo Communicator::begin(const char* op, size_t bytes) {
  tally(op, bytes);
  return OpInfo{op, ++sequence_, bytes};
}

// ---------------------------------------------------------------- signature checks

// A checked collective not yet posted (See Note [The check queue]).
struct Communicator::Pending {
  OpInfo info;
  Signature sig;
  // The call's file name without its folders ("": none): in the C++ caller's static
  // source_location string, or in `site_file` for a ScopedCallSite's (which may end first).
  const char* file = "";
  std::string site_file;
  // What the hash covers besides `file`: op, dtype, count, root, reduce, line, and the group's
  // collectives before this one (not its sequence number, which counts sends too).
  std::array<int64_t, kFields> fields;
  std::function<WorkPtr(const OpInfo&)> post;  // empty for a carried collective
  std::array<int64_t, 2> check{};              // [hash, ~hash], reduced with max over the group
  // A carried collective (Note [Small collectives in their check]); kind kNone otherwise.
  Carried carried;
  WorkPtr check_work;  // null until it is the group's oldest
  WorkPtr posted;      // the collective, once its check agreed
  // Why it will never be posted: its check disagreed (`error`, empty while the explanation is
  // still being gathered), its post raised (`post_error`, raised again as it was: an argument
  // the backend cannot carry is a loom::Error), or the group went away.
  bool failed = false;
  std::string error;
  std::exception_ptr post_error;
  bool dropped = false;    // its Work is gone: the group's next call raises its error instead
  bool unchecked = false;  // carried with checks off: only its length was compared
  // Posted in turn with no exchange at all (a CheckedByCaller step queued behind others).
  bool no_check = false;
  // A wait for its check raised (a timeout: a rank did not join). Its Work's destructor then does
  // not wait again: the late rank's check, arriving during that wait, would post the collective
  // on both ranks after this one had already raised (both ranks must see the same outcome; the
  // late rank's own check times out instead, naming this one).
  bool wait_raised = false;
  Tensor my_fields, all_fields, my_file, files;  // the explanation: every rank's call
  WorkPtr fields_work, files_work;
};

struct Communicator::CheckQueue {
  Communicator* owner;                           // null once the group is destroyed
  std::deque<std::shared_ptr<Pending>> waiting;  // not yet posted, oldest first
  std::shared_ptr<Pending> undelivered;          // failed, its error not raised yet
};

namespace {

// Every group with a check queue, for progress_checks(); the collectives queued in all of them.
std::vector<Communicator*>& checked_groups() {
  static auto* groups = new std::vector<Communicator*>();  // never freed: used at exit too
  return *groups;
}
size_t g_queued = 0;

}  // namespace

// The Work of a checked collective: waits for its check (posting the group's earlier ones on
// the way), then for the collective itself.
class CheckedWork final : public Work {
 public:
  CheckedWork(std::shared_ptr<Communicator::CheckQueue> queue,
              std::shared_ptr<Communicator::Pending> pending)
      : queue_(std::move(queue)), p_(std::move(pending)) {}

  // Like every Work, one destroyed unfinished is waited for (its collective posted first, as
  // the other ranks expect), up to the timeouts; unless a wait for its check already raised
  // (Pending::wait_raised).
  ~CheckedWork() override {
    try {
      if (!p_->posted && !p_->failed && !p_->wait_raised && queue_->owner)
        queue_->owner->advance(p_.get());
    } catch (...) {
    }
    p_->dropped = true;
  }
  CheckedWork(const CheckedWork&) = delete;
  CheckedWork& operator=(const CheckedWork&) = delete;

  void wait() override {
    if (!p_->posted && !p_->failed) {
      try {
        queue_->owner->advance(p_.get());
      } catch (...) {
        p_->wait_raised = true;
        throw;
      }
    }
    raise_if_failed();
    LOOM_ASSERT(p_->posted, "a checked collective waited on from inside its group's queue");
    p_->posted->wait();
  }
  bool test() override {
    if (!p_->posted && !p_->failed) queue_->owner->advance(nullptr);
    raise_if_failed();
    return p_->posted && p_->posted->test();
  }

 private:
  void raise_if_failed() {
    if (!p_->failed) return;
    if (queue_->undelivered == p_) queue_->undelivered.reset();
    if (p_->post_error) std::rethrow_exception(p_->post_error);
    if (p_->error.empty())
      p_->error = queue_->owner ? queue_->owner->explanation(*p_)
                                : std::string(
                                      "the group was destroyed before this collective's "
                                      "signature check completed");
    throw CommError(p_->error);
  }

  std::shared_ptr<Communicator::CheckQueue> queue_;
  std::shared_ptr<Communicator::Pending> p_;
};

void progress_checks() {
  if (g_queued == 0) return;
  // By index: a post may make or destroy groups. A group waiting inside its own advance (for a
  // check) is left to it; the others advance, since the check may wait for them.
  auto& groups = checked_groups();
  for (size_t i = 0; i < groups.size(); ++i)
    if (!groups[i]->advancing_ && !groups[i]->queue_->waiting.empty()) groups[i]->advance(nullptr);
}

Communicator::~Communicator() {
  if (!queue_) return;
  // Whatever is still queued will never be posted: its work says why.
  for (const auto& p : queue_->waiting) {
    p->failed = true;
    p->post = nullptr;
  }
  g_queued -= queue_->waiting.size();
  queue_->waiting.clear();
  queue_->owner = nullptr;
  auto& groups = checked_groups();
  groups.erase(std::remove(groups.begin(), groups.end(), this), groups.end());
}

void Communicator::post_queued() {
  try {
    // Not past a check that already timed out (Pending::wait_raised): the group is broken.
    if (queue_ && !queue_->waiting.empty() && !queue_->waiting.front()->wait_raised)
      advance(queue_->waiting.back().get());
  } catch (...) {  // a destructor's: what is left is dropped by ~Communicator
  }
}

void Communicator::set_debug(bool on) {
  if (!on && queue_ && !queue_->waiting.empty()) advance(queue_->waiting.back().get());
  debug_ = on;
}

size_t Communicator::carried_limit(CheckPayload::Kind kind) const {
  switch (kind) {
    case CheckPayload::Kind::kNone:
      return 0;
    case CheckPayload::Kind::kAllgather:
      return size_ == 2 ? 2 * kCarriedAllgatherBytes : kCarriedAllgatherBytes;
    case CheckPayload::Kind::kAllreduceByAllgather:
      return size_ == 2 ? 2 * kCarriedAllreduceBytes : kAllreduceByAllgatherBytes;
    case CheckPayload::Kind::kAllreduce:
      return kCarriedAllreduceBytes;
    case CheckPayload::Kind::kReduceScatter:
      return kCarriedReduceScatterBytes;
  }
  return 0;
}

bool Communicator::carried_by_check(const CheckPayload& payload, bool on_host) {
  if (size_ == 1 || !on_host) return false;  // checks off too: Note [Carried when unchecked]
  Communicator* channel = check_channel();
  const size_t bytes = payload.bytes(size_);
  return channel && bytes <= carried_limit(payload.kind) && bytes <= channel->check_payload_limit();
}

WorkPtr Communicator::collective(const Signature& given, size_t bytes,
                                 std::function<WorkPtr(const OpInfo&)> post, Carried carried) {
  raise_undelivered();
  const OpInfo info = begin(given.op, bytes);
  const uint64_t nth = collectives_++;
  // A carried collective goes through the queue with checks off too (Note [Carried when
  // unchecked]), under a hash every rank shares.
  if (size_ == 1 || (!debug_ && post)) return post(info);
  // A step of a call checked whole elsewhere: posted at once unless earlier collectives of
  // the group wait for their checks, which it must not pass.
  const bool by_caller = t_checked_by_caller;
  if (by_caller && post && (!queue_ || queue_->waiting.empty())) return post(info);
  auto p = make_recycled<Pending>();
  p->info = info;
  p->sig = given;
  uint64_t file_hash = 0;  // no place: a rooted collective or a barrier
  if (given.file) {        // a ScopedCallSite's place replaces the C++ caller's
    if (t_site_file.empty()) {
      const SiteFile& site = site_file(given.file);
      p->file = site.base;
      file_hash = site.hash;
    } else {
      p->site_file = base_name(t_site_file.c_str());
      p->file = p->site_file.c_str();
      p->sig.line = t_site_line;
      file_hash = site_hash(p->file);
    }
    p->sig.file = p->file;
  }
  const Signature& sig = p->sig;
  p->fields = {op_code(sig.op), int64_t(sig.dtype), sig.count,   sig.root,
               sig.reduce,      sig.line,           int64_t(nth)};
  uint64_t h = hash_bytes(14695981039346656037ull, p->fields.data(), sizeof p->fields);
  h = hash_bytes(h, &file_hash, sizeof file_hash);
  p->unchecked = !debug_ || by_caller;
  p->no_check = by_caller && post;
  if (p->unchecked) h = 0;  // every rank's call agrees
  p->check = {int64_t(h), int64_t(~h)};

  Communicator* channel = check_channel();
  if (!channel) {                      // checked on the group itself, before posting
    if (by_caller) return post(info);  // (a carried one needs a channel: there is none here)
    Tensor check = Tensor::from_external(p->check.data(), {2}, {1}, DType::kI64, nullptr);
    allreduce_impl(check, check, AllreduceOptions{ReduceOp::kMax},
                   OpInfo{sig.op, info.sequence, info.bytes})
        ->wait();
    if (!hashes_agree(p->check.data())) {
      post_explanation(*p, *this);
      throw CommError(explanation(*p));
    }
    return post(info);
  }
  if (!queue_) {
    queue_ = std::make_shared<CheckQueue>();
    queue_->owner = this;
    checked_groups().push_back(this);
  }
  if (post)
    p->post = std::move(post);
  else
    p->carried = std::move(carried);
  const bool first = queue_->waiting.empty();
  if (first) post_check(*p, *channel);
  queue_->waiting.push_back(p);
  ++g_queued;
  // A carried collective whose exchange this call just posted has nothing to post when it
  // completes: its wait or the group's next call finds it done. Any other may let the group's
  // collectives go out now (a posted one overlaps what the caller does next).
  if (!first || p->post) advance(nullptr);
  return make_recycled<CheckedWork>(queue_, std::move(p));
}

void Communicator::post_check(Pending& p, Communicator& channel) {
  if (p.no_check) {  // its pair already agrees
    p.check_work = completed_work();
    return;
  }
  if (channel.timeout_seconds() != timeout_s_) channel.set_timeout_seconds(timeout_s_);
  // Named as the collective it checks: a timeout reads "allreduce #17" of this group.
  p.check_work = channel.check_exchange_impl(p.check.data(), p.carried.payload,
                                             OpInfo{p.sig.op, p.info.sequence, p.info.bytes});
}

void Communicator::advance(const Pending* until) {
  if (advancing_) return;  // a wait inside this advance: the outer call goes on
  struct Advancing {
    bool& flag;
    explicit Advancing(bool& f) : flag(f) { flag = true; }
    ~Advancing() { flag = false; }
  } advancing(advancing_);
  Communicator& channel = *check_channel();
  auto& waiting = queue_->waiting;
  while (!waiting.empty()) {
    // A check that times out stays at the head: waiting again resumes it, as for any Work. The
    // head stays queued while its check runs (a routed call made meanwhile must queue behind it).
    if (until)
      waiting.front()->check_work->wait();
    else if (!waiting.front()->check_work->test())
      return;
    const std::shared_ptr<Pending> head = std::move(waiting.front());
    waiting.pop_front();
    --g_queued;
    if (hashes_agree(head->check.data())) {
      try {
        if (head->post) {
          head->posted = head->post(head->info);
        } else {  // carried: its exchange has written the outputs
          head->posted = completed_work();
          head->carried = Carried();
        }
      } catch (...) {
        head->failed = true;
        head->post_error = std::current_exception();
        queue_->undelivered = head;
      }
    } else {
      head->failed = true;
      post_explanation(*head, channel);
      queue_->undelivered = head;
    }
    head->post = nullptr;
    if (!waiting.empty()) post_check(*waiting.front(), channel);
    if (head.get() == until) return;
  }
}

void Communicator::raise_undelivered() {
  // Only a failure whose Work is gone: one still held raises from its wait, on every rank alike
  // (raising it here instead would skip this call on the ranks that found it first).
  if (!queue_ || !queue_->undelivered || !queue_->undelivered->dropped) return;
  Pending& p = *queue_->undelivered;
  queue_->undelivered.reset();
  if (p.post_error) std::rethrow_exception(p.post_error);
  if (p.error.empty()) p.error = explanation(p);
  throw CommError(p.error);
}

void Communicator::post_explanation(Pending& p, Communicator& channel) {
  p.my_fields = Tensor::from_vector<int64_t>({p.fields.begin(), p.fields.end()}, {kFields});
  p.all_fields = Tensor::empty({size_ * kFields}, DType::kI64);
  std::vector<uint8_t> name(kSiteBytes, 0);
  std::strncpy(reinterpret_cast<char*>(name.data()), p.file, kSiteBytes - 1);
  p.my_file = Tensor::from_vector<uint8_t>(name, {kSiteBytes});
  p.files = Tensor::empty({size_ * kSiteBytes}, DType::kU8);
  const OpInfo explain{"signature exchange", p.info.sequence, size_t(p.all_fields.nbytes())};
  p.fields_work = channel.allgather_impl(p.my_fields, p.all_fields, AllgatherOptions{}, explain);
  p.files_work = channel.allgather_impl(p.my_file, p.files, AllgatherOptions{}, explain);
}

std::string Communicator::explanation(Pending& p) {
  p.fields_work->wait();
  p.files_work->wait();
  const std::vector<int64_t> v = p.all_fields.to_vector<int64_t>();
  const auto* f_bytes = static_cast<const char*>(p.files.data_ptr());
  auto call_of = [&](int r) {
    const int64_t* f = &v[size_t(r * kFields)];
    // No count: an all-to-all with splits, whose sizes may differ by rank.
    std::string text =
        detail::str_cat(kCollectiveOps[f[0]], " ", dtype_name(DType(f[1])),
                        f[2] >= 0 ? detail::str_cat(" count ", f[2]) : " with splits");
    if (f[3] >= 0) text += detail::str_cat(" root ", f[3]);
    if (f[4] >= 0) text += detail::str_cat(" ", reduce_op_name(ReduceOp(f[4])));
    const std::string file(f_bytes + size_t(r) * kSiteBytes);
    if (!file.empty()) text += detail::str_cat(" at ", file, ":", f[5]);
    if (f[6] != p.fields[6])
      text += detail::str_cat(" after ", f[6],
                              " collectives on the group (this rank: ", p.fields[6], ")");
    return text;
  };
  // Group the ranks by the call they made, in order of first appearance.
  std::vector<std::pair<std::string, std::string>> calls;  // call -> "0, 1, 3"
  for (int r = 0; r < size_; ++r) {
    const std::string c = call_of(r);
    auto it = std::find_if(calls.begin(), calls.end(), [&](const auto& p) { return p.first == c; });
    if (it == calls.end())
      calls.emplace_back(c, std::to_string(r));
    else
      it->second += detail::str_cat(", ", r);
  }
  std::string list;
  for (const auto& [call, ranks] : calls)
    list += detail::str_cat(list.empty() ? "" : "; ", "rank",
                            ranks.find(',') == std::string::npos ? " " : "s ", ranks, ": ", call);
  const bool same_text = calls.size() == 1;  // the hashes differed, the text cannot show how
  return detail::str_cat(
      "[rank ", error_rank(), "] the ranks of group '", name_, "' disagree on collective #",
      p.info.sequence, ": ", list,
      same_text ? " (their signatures differ in a way the text does not show)" : "",
      ". Every rank must make the same collective calls in the same order (calls from different "
      "lines count as different calls)",
      p.unchecked ? "; checks are off (LOOM_COMM_DEBUG=0), but a small collective's exchange "
                    "still compares lengths"
                  : "; LOOM_COMM_DEBUG=0 turns this check off");
}

std::string OpContext::str() const {
  return detail::str_cat("group '", group, "' (rank ", rank, " of ", size, ") ", op, " #", sequence,
                         ", ", bytes, " bytes");
}

WorkPtr Communicator::allreduce(const Tensor& input, Tensor& output,
                                const AllreduceOptions& options, Site site) {
  check_buffer("allreduce", "input", input);
  check_buffer("allreduce", "output", output);
  check_same("allreduce", input, output);
  check_reducible("allreduce", input);
  LOOM_CHECK(input.numel() == output.numel(), "allreduce: input has ", input.numel(),
             " elements but output has ", output.numel());
  const Signature sig{"allreduce",     input.dtype(),    input.numel(),   -1,
                      int(options.op), site.file_name(), int(site.line())};
  if (options.op != ReduceOp::kAvg || is_floating(input.dtype()))
    if (std::shared_ptr<Hierarchy> h = route("allreduce", input.nbytes()))
      return collective(sig, input.nbytes(), [=, output = output](const OpInfo&) mutable {
        return h->allreduce(input, output, options.op, Hierarchy::Checks::kByCaller);
      });
  // The smallest as one allgather of the inputs, the others in two phases (reduce-scatter
  // inside the check, then allgather): See Note [Signature exchange] in mpi_exchange.cpp.
  const int64_t chunk = (input.numel() + size_ - 1) / size_;  // elements per rank's block
  CheckPayload carried = payload_of(CheckPayload::Kind::kAllreduceByAllgather, input, output,
                                    input.nbytes(), options.op);
  if (carried_by_check(carried, on_host(input, output)))
    return collective(sig, input.nbytes(), nullptr, Carried{carried, input, output});
  carried.kind = CheckPayload::Kind::kAllreduce;
  carried.block = size_t(chunk) * dtype_size(input.dtype());
  if (carried_by_check(carried, on_host(input, output)))
    return collective(sig, input.nbytes(), nullptr, Carried{carried, input, output});
  return collective(sig, input.nbytes(), [=, this, output = output](const OpInfo& info) mutable {
    return allreduce_impl(input, output, options, info);
  });
}

WorkPtr Communicator::allreduce(Tensor& tensor, const AllreduceOptions& options, Site site) {
  return allreduce(tensor, tensor, options, site);
}

WorkPtr Communicator::reduce_scatter(const Tensor& input, Tensor& output,
                                     const ReduceScatterOptions& options, Site site) {
  check_buffer("reduce_scatter", "input", input);
  check_buffer("reduce_scatter", "output", output);
  check_same("reduce_scatter", input, output);
  check_reducible("reduce_scatter", input);
  LOOM_CHECK(input.numel() == output.numel() * size_, "reduce_scatter: input has ", input.numel(),
             " elements, expected group size ", size_, " x output's ", output.numel(), " = ",
             output.numel() * size_);
  const Signature sig{"reduce_scatter", input.dtype(),    input.numel(),   -1,
                      int(options.op),  site.file_name(), int(site.line())};
  if (options.op != ReduceOp::kAvg || is_floating(input.dtype()))
    if (std::shared_ptr<Hierarchy> h = route("reduce_scatter", input.nbytes()))
      return collective(sig, input.nbytes(), [=, output = output](const OpInfo&) mutable {
        return h->reduce_scatter(input, output, options.op, Hierarchy::Checks::kByCaller);
      });
  const CheckPayload carried =
      payload_of(CheckPayload::Kind::kReduceScatter, input, output, output.nbytes(), options.op);
  if (carried_by_check(carried, on_host(input, output)))
    return collective(sig, input.nbytes(), nullptr, Carried{carried, input, output});
  return collective(sig, input.nbytes(), [=, this, output = output](const OpInfo& info) mutable {
    return reduce_scatter_impl(input, output, options, info);
  });
}

WorkPtr Communicator::allgather(const Tensor& input, Tensor& output,
                                const AllgatherOptions& options, Site site) {
  check_buffer("allgather", "input", input);
  check_buffer("allgather", "output", output);
  check_same("allgather", input, output);
  LOOM_CHECK(output.numel() == input.numel() * size_, "allgather: output has ", output.numel(),
             " elements, expected group size ", size_, " x input's ", input.numel(), " = ",
             input.numel() * size_);
  const Signature sig{"allgather", input.dtype(),    input.numel(),   -1,
                      -1,          site.file_name(), int(site.line())};
  if (std::shared_ptr<Hierarchy> h = route("allgather", output.nbytes()))
    return collective(sig, output.nbytes(), [=, output = output](const OpInfo&) mutable {
      return h->allgather(input, output, Hierarchy::Checks::kByCaller);
    });
  const CheckPayload carried =
      payload_of(CheckPayload::Kind::kAllgather, input, output, input.nbytes(), ReduceOp::kSum);
  if (carried_by_check(carried, on_host(input, output)))
    return collective(sig, output.nbytes(), nullptr, Carried{carried, input, output});
  return collective(sig, output.nbytes(), [=, this, output = output](const OpInfo& info) mutable {
    return allgather_impl(input, output, options, info);
  });
}

WorkPtr Communicator::broadcast(Tensor& tensor, const BroadcastOptions& options) {
  check_buffer("broadcast", "tensor", tensor);
  LOOM_CHECK(options.root >= 0 && options.root < size_, "broadcast: root ", options.root,
             " outside group '", name_, "' of size ", size_);
  return collective({"broadcast", tensor.dtype(), tensor.numel(), options.root, -1, nullptr, 0},
                    tensor.nbytes(), [=, this, tensor = tensor](const OpInfo& info) mutable {
                      return broadcast_impl(tensor, options, info);
                    });
}

WorkPtr Communicator::reduce(const Tensor& input, Tensor& output, const ReduceOptions& options) {
  check_buffer("reduce", "input", input);
  check_reducible("reduce", input);
  LOOM_CHECK(options.root >= 0 && options.root < size_, "reduce: root ", options.root,
             " outside group '", name_, "' of size ", size_);
  if (rank_ == options.root) {
    check_buffer("reduce", "output", output);
    check_same("reduce", input, output);
    LOOM_CHECK(input.numel() == output.numel(), "reduce: input has ", input.numel(),
               " elements but output has ", output.numel());
  }
  return collective(
      {"reduce", input.dtype(), input.numel(), options.root, int(options.op), nullptr, 0},
      input.nbytes(), [=, this, output = output](const OpInfo& info) mutable {
        return reduce_impl(input, output, options, info);
      });
}

WorkPtr Communicator::all_to_all(const Tensor& input, Tensor& output,
                                 const AllToAllOptions& options, Site site) {
  check_buffer("all_to_all", "input", input);
  check_buffer("all_to_all", "output", output);
  check_same("all_to_all", input, output);
  AllToAllOptions o = options;
  auto resolve = [&](std::vector<int64_t>& splits, const Tensor& t, const char* which) {
    if (splits.empty()) {
      LOOM_CHECK(t.numel() % size_ == 0, "all_to_all: ", which, " has ", t.numel(),
                 " elements, not divisible into ", size_, " equal splits (pass ", which,
                 "_splits)");
      splits.assign(size_t(size_), t.numel() / size_);
    }
    LOOM_CHECK(int64_t(splits.size()) == size_, "all_to_all: ", which, "_splits has ",
               splits.size(), " entries, expected group size ", size_);
    int64_t total = 0;
    for (int64_t s : splits) {
      LOOM_CHECK(s >= 0, "all_to_all: negative split ", s, " in ", which, "_splits");
      total += s;
    }
    LOOM_CHECK(total == t.numel(), "all_to_all: ", which, "_splits add up to ", total, " but ",
               which, " has ", t.numel(), " elements");
  };
  resolve(o.input_splits, input, "input");
  resolve(o.output_splits, output, "output");
  // With splits, ranks move different byte counts: the choice must not depend on them
  // (Note [Flat or hierarchical]).
  const bool equal = options.input_splits.empty() && options.output_splits.empty();
  // With splits, sizes may differ per rank and the count is not compared; without, every rank
  // sends and receives numel / size per peer, so the counts must agree.
  const Signature sig{"all_to_all",     input.dtype(),   equal ? input.numel() : -1, -1, -1,
                      site.file_name(), int(site.line())};
  if (std::shared_ptr<Hierarchy> h = route(equal ? "all_to_all" : "all_to_all(v)", input.nbytes()))
    return collective(sig, input.nbytes(), [=, output = output](const OpInfo&) mutable {
      // Without splits, the equal form: no exchange of split sizes, its steps unchecked.
      return h->all_to_all(input, output, equal ? AllToAllOptions{} : o,
                           Hierarchy::Checks::kByCaller);
    });
  return collective(sig, input.nbytes(), [=, this, output = output](const OpInfo& info) mutable {
    return all_to_all_impl(input, output, o, info);
  });
}

void Communicator::check_p2p(const P2POp& p) const {
  const char* what = p.kind == P2POp::Kind::kSend ? "send" : "recv";
  check_buffer(what, "tensor", p.tensor);
  LOOM_CHECK(p.peer >= 0 && p.peer < size_, what, ": peer ", p.peer, " outside group '", name_,
             "' of size ", size_);
  LOOM_CHECK(p.tag >= 0, what, ": tag must be >= 0, got ", p.tag);
}

WorkPtr Communicator::send(const Tensor& tensor, int peer, const PointToPointOptions& options) {
  const P2POp op{P2POp::Kind::kSend, tensor, peer, options.tag};
  check_p2p(op);
  return p2p_impl(op, begin("send", tensor.nbytes()));
}

WorkPtr Communicator::recv(Tensor& tensor, int peer, const PointToPointOptions& options) {
  const P2POp op{P2POp::Kind::kRecv, tensor, peer, options.tag};
  check_p2p(op);
  return p2p_impl(op, begin("recv", tensor.nbytes()));
}

WorkPtr Communicator::batch_p2p(const std::vector<P2POp>& ops) {
  size_t bytes = 0;
  for (const P2POp& p : ops) {
    check_p2p(p);
    bytes += p.tensor.nbytes();
  }
  return batch_p2p_impl(
      ops,
      begin(ops.size() == 1 ? (ops[0].kind == P2POp::Kind::kSend ? "send" : "recv") : "batch_p2p",
            bytes));
}

WorkPtr Communicator::barrier(const BarrierOptions& options) {
  if (carried_by_check(CheckPayload{}, true))  // the check is the barrier
    return collective({"barrier"}, 0, nullptr, Carried{});
  return collective({"barrier"}, 0,
                    [=, this](const OpInfo& info) { return barrier_impl(options, info); });
}

std::shared_ptr<Communicator> Communicator::split(int color, int key, const std::string& name) {
  LOOM_CHECK(color >= 0, "split: color must be >= 0, got ", color);
  // Checked and posted in the group's order before split_impl, which runs at once.
  collective({"split"}, 0, [](const OpInfo&) { return completed_work(); })->wait();
  return split_impl(color, key, name);
}

bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr ||
         std::getenv("PMIX_RANK") != nullptr;
}

int64_t launcher_local_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    if (const char* v = std::getenv(name)) {
      char* end = nullptr;
      const long r = std::strtol(v, &end, 10);
      if (end != v && *end == '\0' && r >= 0) return r;
    }
  }
  return -1;
}

std::shared_ptr<Communicator> world(const std::string& backend) {
  LOOM_CHECK(backend == "auto" || backend == "self" || backend == "mpi" || backend == "nccl",
             "world: unknown backend '", backend, "' (expected auto, self, mpi or nccl)");
  static std::shared_ptr<Communicator> instance;
  if (instance) {
    // "nccl" asks for the world that routes CUDA tensors to NCCL: "mpi+nccl".
    const std::string have = instance->backend();
    LOOM_CHECK(backend == "auto" || backend == have || (backend == "nccl" && have == "mpi+nccl"),
               "world: already created with backend ", have, ", cannot switch to ", backend);
    return instance;
  }
  if (backend == "nccl") {
    // Also without mpirun: MPI then starts as a world of one (a singleton), which still carries
    // NCCL's unique id.
#if LOOM_WITH_NCCL
    instance = make_mpi_nccl_world(/*required=*/true);
#else
    LOOM_FAIL(
        "world: backend nccl requested but loom was built without NCCL (it needs CUDA, MPI and "
        "NCCL at configure time: see the NCCL line of the configure summary)");
#endif
  } else if (backend == "mpi" || (backend == "auto" && launched_by_mpi())) {
#if LOOM_WITH_NCCL
    // auto: NCCL for CUDA tensors when every rank has a GPU of its own, else the MPI world.
    instance = backend == "auto" ? make_mpi_nccl_world(/*required=*/false) : make_mpi_world();
#elif LOOM_WITH_MPI
    instance = make_mpi_world();
#else
    LOOM_CHECK(backend != "mpi",
               "world: backend mpi requested but loom was built without MPI "
               "(install libopenmpi-dev and reconfigure)");
    LOOM_FAIL(
        "world: this process was started by mpirun but loom was built without MPI, so it "
        "cannot join the other ranks (install libopenmpi-dev and reconfigure)");
#endif
  } else {
    instance = make_self_communicator("world");
  }
  set_error_rank(instance->rank());
  return instance;
}

}  // namespace loom::comm
