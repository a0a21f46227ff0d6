#include "collectives/communicator.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>

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
// is a pair of same-sized calls that two ranks make in swapped order. With LOOM_COMM_DEBUG=1 (or
// set_debug(true)) every collective carries a signature: a 64-bit hash of the op, dtype, count,
// root, reduction and, for the symmetric collectives (allreduce, reduce_scatter, allgather,
// all_to_all), the place in the source it was called from (file name and line; a Python
// script's own line through ScopedCallSite), which is what tells two same-sized calls apart.
// Rooted collectives (broadcast, reduce) and barriers leave the place out: a root and the others
// often call them from different branches of a program.
//
// The check is one allreduce (max) of [hash, ~hash] over the group, internal (it does not count
// in the sequence numbers), completed before the collective is posted: every rank learns whether
// the largest and the smallest hash agree, so on a difference every rank knows at once, and all
// of them then allgather the full calls (also internal) and raise the same CommError listing
// which ranks made which call. Nothing of the mismatched collective was started, so nothing hangs,
// no buffer is written, and the group stays usable.
//
// Why it is not on by default: completing the check makes posting a collective wait until every
// rank of the group has posted it too, so a program whose ranks post nonblocking collectives on
// two groups in different orders (legal, since each group's order is what must agree) would wait
// on itself. Posting the check beside the collective instead keeps posting nonblocking, but a
// mismatched collective, once posted, may never complete (MPI's schedules wait for messages that
// never come; an NCCL kernel can hang its stream), which leaves operations only ending the
// process clears. The way to both is to post the check at once and the collective when its check
// has agreed, from a per-group queue that every later call on the group advances. The check's
// cost is measured by loom-bench-collectives (benchmarks/README.md).

namespace {

const char* const kCollectiveOps[] = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                                      "reduce",    "all_to_all",     "barrier",   "split"};

int64_t op_code(const char* op) {
  for (size_t i = 0; i < std::size(kCollectiveOps); ++i)
    if (std::string(op) == kCollectiveOps[i]) return int64_t(i);
  LOOM_ASSERT(false, "unknown collective ", op);
}

// On when LOOM_COMM_DEBUG is set to anything but "0" or "" (See Note [Collective signatures]).
bool debug_from_environment() {
  const char* v = std::getenv("LOOM_COMM_DEBUG");
  return v != nullptr && std::string(v) != "0" && std::string(v) != "";
}

// The file name without its folders: ranks may run the same script by different paths.
const char* base_name(const char* file) {
  const char* base = file;
  for (const char* p = file; *p; ++p)
    if (*p == '/') base = p + 1;
  return base;
}

uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// The site a ScopedCallSite set on this thread (empty: none).
thread_local std::string t_site_file;
thread_local int t_site_line = 0;

constexpr int64_t kFields = 6;      // op, dtype, count, root, reduce, line
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
  LOOM_CHECK(t.dtype() != DType::kU8, op,
             ": u8 buffers cannot be reduced (raw bytes); use f32, "
             "bf16, f16, i32 or i64");
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
    if (t.op == op) return t.count;
  return 0;
}

uint64_t Communicator::op_bytes(const std::string& op) const {
  for (const OpTally& t : op_counts_)
    if (t.op == op) return t.bytes;
  return 0;
}

Communicator::OpInfo Communicator::begin(const char* op, size_t bytes) {
  bool found = false;
  for (OpTally& t : op_counts_)
    if (t.op == op) ++t.count, t.bytes += bytes, found = true;
  if (!found) op_counts_.push_back(OpTally{op, 1, bytes});
  return OpInfo{op, ++sequence_, bytes};
}

WorkPtr Communicator::collective(const Signature& given, size_t bytes,
                                 const std::function<WorkPtr(const OpInfo&)>& post) {
  const OpInfo info = begin(given.op, bytes);
  if (!debug_ || size_ == 1) return post(info);
  Signature sig = given;
  if (sig.file && !t_site_file.empty()) {  // a ScopedCallSite's place replaces the C++ caller's
    sig.file = t_site_file.c_str();
    sig.line = t_site_line;
  }
  const int64_t fields[kFields] = {op_code(sig.op), int64_t(sig.dtype), sig.count,
                                   sig.root,        sig.reduce,         sig.line};
  uint64_t h = fnv1a(14695981039346656037ull, fields, sizeof fields);
  if (sig.file) {
    const char* base = base_name(sig.file);
    h = fnv1a(h, base, std::strlen(base));
  }
  Tensor check = Tensor::from_vector<int64_t>({int64_t(h), int64_t(~h)}, {2});
  const OpInfo check_info{sig.op, info.sequence, info.bytes};  // a timeout names the collective
  allreduce_impl(check, check, AllreduceOptions{ReduceOp::kMax}, check_info)->wait();
  const auto* v = static_cast<const int64_t*>(check.data_ptr());
  if (uint64_t(v[0]) != h || ~uint64_t(v[1]) != h) {
    if (sig.file) sig.file = base_name(sig.file);
    throw CommError(explain_mismatch(info, sig));
  }
  return post(info);
}

std::string Communicator::explain_mismatch(const OpInfo& info, const Signature& sig) {
  // Every rank's call in full: its fields, and its file name.
  Tensor mine = Tensor::from_vector<int64_t>(
      {op_code(sig.op), int64_t(sig.dtype), sig.count, sig.root, sig.reduce, sig.line}, {kFields});
  Tensor all = Tensor::empty({size_ * kFields}, DType::kI64);
  std::vector<uint8_t> name(kSiteBytes, 0);
  if (sig.file) std::strncpy(reinterpret_cast<char*>(name.data()), sig.file, kSiteBytes - 1);
  Tensor my_file = Tensor::from_vector<uint8_t>(name, {kSiteBytes});
  Tensor files = Tensor::empty({size_ * kSiteBytes}, DType::kU8);
  const OpInfo explain{"signature exchange", info.sequence, size_t(all.nbytes())};
  allgather_impl(mine, all, AllgatherOptions{}, explain)->wait();
  allgather_impl(my_file, files, AllgatherOptions{}, explain)->wait();
  const std::vector<int64_t> v = all.to_vector<int64_t>();
  const auto* f_bytes = static_cast<const char*>(files.data_ptr());
  auto call_of = [&](int r) {
    const int64_t* f = &v[size_t(r * kFields)];
    std::string text =
        detail::str_cat(kCollectiveOps[f[0]], " ", dtype_name(DType(f[1])), " count ", f[2]);
    if (f[3] >= 0) text += detail::str_cat(" root ", f[3]);
    if (f[4] >= 0) text += detail::str_cat(" ", reduce_op_name(ReduceOp(f[4])));
    const std::string file(f_bytes + size_t(r) * kSiteBytes);
    if (!file.empty()) text += detail::str_cat(" at ", file, ":", f[5]);
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
      info.sequence, ": ", list,
      same_text ? " (their signatures differ in a way the text does not show)" : "",
      ". Every rank must make the same collective calls in the same order (calls from different "
      "lines count as different calls); this is LOOM_COMM_DEBUG's check");
}

std::string Communicator::describe(const OpInfo& info) const {
  return detail::str_cat("group '", name_, "' (rank ", rank_, " of ", size_, ") ", info.op, " #",
                         info.sequence, ", ", info.bytes, " bytes");
}

WorkPtr Communicator::allreduce(const Tensor& input, Tensor& output,
                                const AllreduceOptions& options, Site site) {
  check_buffer("allreduce", "input", input);
  check_buffer("allreduce", "output", output);
  check_same("allreduce", input, output);
  check_reducible("allreduce", input);
  LOOM_CHECK(input.numel() == output.numel(), "allreduce: input has ", input.numel(),
             " elements but output has ", output.numel());
  return collective({"allreduce", input.dtype(), input.numel(), -1, int(options.op),
                     site.file_name(), int(site.line())},
                    input.nbytes(), [&](const OpInfo& info) {
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
  return collective({"reduce_scatter", input.dtype(), input.numel(), -1, int(options.op),
                     site.file_name(), int(site.line())},
                    input.nbytes(), [&](const OpInfo& info) {
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
  return collective(
      {"allgather", input.dtype(), input.numel(), -1, -1, site.file_name(), int(site.line())},
      output.nbytes(),
      [&](const OpInfo& info) { return allgather_impl(input, output, options, info); });
}

WorkPtr Communicator::broadcast(Tensor& tensor, const BroadcastOptions& options) {
  check_buffer("broadcast", "tensor", tensor);
  LOOM_CHECK(options.root >= 0 && options.root < size_, "broadcast: root ", options.root,
             " outside group '", name_, "' of size ", size_);
  return collective({"broadcast", tensor.dtype(), tensor.numel(), options.root, -1, nullptr, 0},
                    tensor.nbytes(),
                    [&](const OpInfo& info) { return broadcast_impl(tensor, options, info); });
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
      input.nbytes(),
      [&](const OpInfo& info) { return reduce_impl(input, output, options, info); });
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
  // Split sizes may differ per rank; the dtype and the op must not (the count is not compared).
  return collective({"all_to_all", input.dtype(), -1, -1, -1, site.file_name(), int(site.line())},
                    input.nbytes(),
                    [&](const OpInfo& info) { return all_to_all_impl(input, output, o, info); });
}

WorkPtr Communicator::send(const Tensor& tensor, int peer, const PointToPointOptions& options) {
  return batch_p2p({P2POp{P2POp::Kind::kSend, tensor, peer, options.tag}});
}

WorkPtr Communicator::recv(Tensor& tensor, int peer, const PointToPointOptions& options) {
  return batch_p2p({P2POp{P2POp::Kind::kRecv, tensor, peer, options.tag}});
}

WorkPtr Communicator::batch_p2p(const std::vector<P2POp>& ops) {
  size_t bytes = 0;
  for (const P2POp& p : ops) {
    const char* what = p.kind == P2POp::Kind::kSend ? "send" : "recv";
    check_buffer(what, "tensor", p.tensor);
    LOOM_CHECK(p.peer >= 0 && p.peer < size_, what, ": peer ", p.peer, " outside group '", name_,
               "' of size ", size_);
    LOOM_CHECK(p.tag >= 0, what, ": tag must be >= 0, got ", p.tag);
    bytes += p.tensor.nbytes();
  }
  return batch_p2p_impl(
      ops,
      begin(ops.size() == 1 ? (ops[0].kind == P2POp::Kind::kSend ? "send" : "recv") : "batch_p2p",
            bytes));
}

WorkPtr Communicator::barrier(const BarrierOptions& options) {
  return collective({"barrier"}, 0,
                    [&](const OpInfo& info) { return barrier_impl(options, info); });
}

std::shared_ptr<Communicator> Communicator::split(int color, int key, const std::string& name) {
  LOOM_CHECK(color >= 0, "split: color must be >= 0, got ", color);
  collective({"split"}, 0, [](const OpInfo&) { return completed_work(); });
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
