#include "collectives/communicator.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>

#include "collectives/self_backend.h"
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

// Note [Debug mode]
// A collective that the ranks of a group call differently (another op, dtype, element count,
// root or reduction) is undefined in MPI and NCCL: it hangs, or worse, returns wrong numbers.
// With LOOM_COMM_DEBUG=1 every collective first allgathers a small signature of the call over
// the group (an internal exchange that does not count in the sequence numbers) and compares
// them; on a difference every rank raises the same CommError listing which ranks made which
// call, before the real collective starts, so nothing hangs and nothing is silently wrong. It
// costs one small allgather per collective, so it is off by default.

namespace {

const char* const kCollectiveOps[] = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                                      "reduce",    "all_to_all",     "barrier",   "split"};

int64_t op_code(const char* op) {
  for (size_t i = 0; i < std::size(kCollectiveOps); ++i)
    if (std::string(op) == kCollectiveOps[i]) return int64_t(i);
  LOOM_ASSERT(false, "unknown collective ", op);
}

bool debug_from_environment() {
  const char* v = std::getenv("LOOM_COMM_DEBUG");
  return v != nullptr && std::string(v) != "0" && std::string(v) != "";
}

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

Communicator::OpInfo Communicator::begin_collective(const Signature& signature, size_t bytes) {
  OpInfo info = begin(signature.op, bytes);
  if (debug_) verify_same_call(info, signature);
  return info;
}

void Communicator::verify_same_call(const OpInfo& info, const Signature& sig) {
  constexpr int64_t kFields = 5;
  Tensor mine = Tensor::from_vector<int64_t>(
      {op_code(sig.op), int64_t(sig.dtype), sig.count, sig.root, sig.reduce}, {kFields});
  Tensor all = Tensor::empty({size_ * kFields}, DType::kI64);
  const OpInfo check{"debug check", info.sequence, size_t(all.nbytes())};
  allgather_impl(mine, all, AllgatherOptions{}, check)->wait();
  const std::vector<int64_t> v = all.to_vector<int64_t>();
  auto call_of = [&](int r) {
    const int64_t* f = &v[size_t(r * kFields)];
    std::string text =
        detail::str_cat(kCollectiveOps[f[0]], " ", dtype_name(DType(f[1])), " count ", f[2]);
    if (f[3] >= 0) text += detail::str_cat(" root ", f[3]);
    if (f[4] >= 0) text += detail::str_cat(" ", reduce_op_name(ReduceOp(f[4])));
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
  if (calls.size() == 1) return;
  std::string list;
  for (const auto& [call, ranks] : calls)
    list += detail::str_cat(list.empty() ? "" : "; ", "rank",
                            ranks.find(',') == std::string::npos ? " " : "s ", ranks, ": ", call);
  throw CommError(detail::str_cat("[rank ", error_rank(), "] LOOM_COMM_DEBUG: the ranks of group '",
                                  name_, "' disagree on collective #", info.sequence, ": ", list));
}

std::string Communicator::describe(const OpInfo& info) const {
  return detail::str_cat("group '", name_, "' (rank ", rank_, " of ", size_, ") ", info.op, " #",
                         info.sequence, ", ", info.bytes, " bytes");
}

WorkPtr Communicator::allreduce(const Tensor& input, Tensor& output,
                                const AllreduceOptions& options) {
  check_buffer("allreduce", "input", input);
  check_buffer("allreduce", "output", output);
  check_same("allreduce", input, output);
  check_reducible("allreduce", input);
  LOOM_CHECK(input.numel() == output.numel(), "allreduce: input has ", input.numel(),
             " elements but output has ", output.numel());
  return allreduce_impl(
      input, output, options,
      begin_collective({"allreduce", input.dtype(), input.numel(), -1, int(options.op)},
                       input.nbytes()));
}

WorkPtr Communicator::allreduce(Tensor& tensor, const AllreduceOptions& options) {
  return allreduce(tensor, tensor, options);
}

WorkPtr Communicator::reduce_scatter(const Tensor& input, Tensor& output,
                                     const ReduceScatterOptions& options) {
  check_buffer("reduce_scatter", "input", input);
  check_buffer("reduce_scatter", "output", output);
  check_same("reduce_scatter", input, output);
  check_reducible("reduce_scatter", input);
  LOOM_CHECK(input.numel() == output.numel() * size_, "reduce_scatter: input has ", input.numel(),
             " elements, expected group size ", size_, " x output's ", output.numel(), " = ",
             output.numel() * size_);
  return reduce_scatter_impl(
      input, output, options,
      begin_collective({"reduce_scatter", input.dtype(), input.numel(), -1, int(options.op)},
                       input.nbytes()));
}

WorkPtr Communicator::allgather(const Tensor& input, Tensor& output,
                                const AllgatherOptions& options) {
  check_buffer("allgather", "input", input);
  check_buffer("allgather", "output", output);
  check_same("allgather", input, output);
  LOOM_CHECK(output.numel() == input.numel() * size_, "allgather: output has ", output.numel(),
             " elements, expected group size ", size_, " x input's ", input.numel(), " = ",
             input.numel() * size_);
  return allgather_impl(
      input, output, options,
      begin_collective({"allgather", input.dtype(), input.numel()}, output.nbytes()));
}

WorkPtr Communicator::broadcast(Tensor& tensor, const BroadcastOptions& options) {
  check_buffer("broadcast", "tensor", tensor);
  LOOM_CHECK(options.root >= 0 && options.root < size_, "broadcast: root ", options.root,
             " outside group '", name_, "' of size ", size_);
  return broadcast_impl(
      tensor, options,
      begin_collective({"broadcast", tensor.dtype(), tensor.numel(), options.root},
                       tensor.nbytes()));
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
  return reduce_impl(
      input, output, options,
      begin_collective({"reduce", input.dtype(), input.numel(), options.root, int(options.op)},
                       input.nbytes()));
}

WorkPtr Communicator::all_to_all(const Tensor& input, Tensor& output,
                                 const AllToAllOptions& options) {
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
  return all_to_all_impl(input, output, o,
                         begin_collective({"all_to_all", input.dtype(), -1}, input.nbytes()));
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
  return barrier_impl(options, begin_collective({"barrier"}, 0));
}

std::shared_ptr<Communicator> Communicator::split(int color, int key, const std::string& name) {
  LOOM_CHECK(color >= 0, "split: color must be >= 0, got ", color);
  begin_collective({"split"}, 0);
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
