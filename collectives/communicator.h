// Communicator: collectives and point-to-point over a group of ranks, on Tensors. Every call is
// asynchronous and returns a Work; the caller must wait() on it (or test() it to completion)
// before reading an output or reusing an input buffer. The blocking forms (*_sync) wait for you.
//
// The base class owns everything that does not depend on the transport: argument checks (each
// a loom::Error naming the op, the argument and expected vs actual, on the rank that made the
// mistake), the per-group sequence number, and the deadline of every wait
// (See Note [Deadlines]). Backends (self, mpi, nccl) implement the short list of *_impl
// calls, each taking an options struct last so fields can be added without touching
// signatures. A backend that does not support a call fails loudly: "backend X does not
// support Y".
//
// Buffers: contiguous tensors of one dtype on one device, f32 / bf16 / f16 / i32 / i64 (u8 for
// raw bytes where no reduction is involved). bf16 and f16 reductions accumulate in f32.
// Counts are in elements. In-place: pass the same tensor as input and output.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <source_location>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace loom::comm {

// Raised for communication failures (timeouts, a peer that died, mismatched collectives), as
// opposed to argument mistakes, which are loom::Error.
class CommError : public Error {
 public:
  explicit CommError(const std::string& what) : Error(what) {}
};

enum class ReduceOp : uint8_t { kSum, kAvg, kMax, kMin };
const char* reduce_op_name(ReduceOp op);

// Which operation a wait or an error is about: "group 'tp' (rank 1 of 2) allreduce #17, 4096
// bytes". Kept as its parts and formatted only when a message needs it (a small collective's
// whole time is a few microseconds; formatting it on every call was a tenth of that).
struct OpContext {
  std::string group;
  int rank = 0;
  int size = 1;
  const char* op = "";  // a string literal
  uint64_t sequence = 0;
  size_t bytes = 0;
  std::string str() const;
};

// A pending operation. wait() blocks until it completes or its deadline passes (CommError naming
// the group, op, sequence number and bytes); test() polls without blocking. Both are idempotent
// once complete. A Work must be waited on before its buffers are reused; destroying an
// unfinished Work waits for it (never leaves MPI writing into freed memory).
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;
};
using WorkPtr = std::shared_ptr<Work>;

// Waits on every work in order.
void wait_all(const std::vector<WorkPtr>& works);

// Posts every group's queued collectives whose signature checks have agreed (See Note [The
// check queue] in communicator.cpp). Every wait calls it while it polls; nothing else needs to.
void progress_checks();

// While one lives, the collectives this thread posts take (file, line) as their place in the
// source (Note [Collective signatures]) instead of the C++ caller's: the Python binding sets the
// script's line this way.
class ScopedCallSite {
 public:
  ScopedCallSite(std::string file, int line);
  ~ScopedCallSite();
  ScopedCallSite(const ScopedCallSite&) = delete;
  ScopedCallSite& operator=(const ScopedCallSite&) = delete;

 private:
  std::string previous_file_;
  int previous_line_;
};

struct AllreduceOptions {
  ReduceOp op = ReduceOp::kSum;
};
struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::kSum;
};
struct AllgatherOptions {};
struct BroadcastOptions {
  int root = 0;
};
struct ReduceOptions {
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
};
struct AllToAllOptions {
  // Element counts per peer (size() entries each). Empty: equal splits of numel / size().
  std::vector<int64_t> input_splits;
  std::vector<int64_t> output_splits;
};
struct PointToPointOptions {
  int tag = 0;
};
struct BarrierOptions {};

// How a group that spans nodes runs its allreduce, reduce-scatter, all-gather and all-to-all
// (Note [Flat or hierarchical] in collectives/algorithm.cpp): flat (one call on the whole
// group), hierarchical (in two levels, collectives/hierarchical.h), or auto (per call, whichever
// the group's cost table, measured when the algorithm is set, predicts faster).
enum class Algorithm : uint8_t { kFlat, kHierarchical, kAuto };
const char* algorithm_name(Algorithm algorithm);  // "flat", "hier", "auto"
// LOOM_COLL_ALGO: flat, hier (or hierarchical) or auto; unset: `fallback`. Throws loom::Error
// naming the variable for any other value.
Algorithm algorithm_from_env(Algorithm fallback = Algorithm::kAuto);

class Hierarchy;
struct CollectiveCosts;

// One send or recv of a batch (posted together, so pairs of ranks exchanging both ways cannot
// deadlock on ordering).
struct P2POp {
  enum class Kind : uint8_t { kSend, kRecv } kind;
  Tensor tensor;
  int peer;
  int tag = 0;
};

// What a signature check's exchange carries besides its pair: a small collective done by the
// exchange itself (Note [Small collectives in their check]). Host memory: `input` is read
// before check_exchange_impl returns; `output` is written only when the check agrees, before
// the exchange's work completes. Raw memory, not tensors: a carried collective is small, and
// making tensors and closures for it was a visible part of its time.
struct CheckPayload {
  enum class Kind {
    kNone,                  // the check alone (also a barrier's whole work)
    kAllgather,             // output = every rank's input (`block` bytes) in rank order
    kReduceScatter,         // input: size() blocks, block j for rank j; output = op over ranks of
                            // their block for this rank, in rank order
    kAllreduce,             // output = op over ranks of their input, in rank order; the input split
                            // into size() blocks, the last ones short (input_bytes)
    kAllreduceByAllgather,  // the same, each rank reducing every rank's whole input (`block`
                            // bytes): one phase instead of two, for the smallest
  };
  Kind kind = Kind::kNone;
  const void* input = nullptr;
  void* output = nullptr;
  size_t block = 0;        // bytes per rank's block (a whole number of elements)
  size_t input_bytes = 0;  // allreduce: what `input` and `output` hold (<= size() x block)
  DType dtype = DType::kU8;
  ReduceOp op = ReduceOp::kSum;
  // The bytes the exchange holds for it: what check_payload_limit() bounds.
  size_t bytes(int group_size) const { return block * size_t(group_size); }
};

// Whether a signature check's [max hash, max ~hash] over the group says every rank had the same
// hash: the largest equals the smallest (~max ~h). See Note [Collective signatures].
inline bool hashes_agree(const int64_t* pair) { return pair[0] == ~pair[1]; }

class Communicator {
 public:
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }  // "world", "tp", "dp.1", ...
  virtual const char* backend() const = 0;

  // output = op over ranks of input (input and output may be the same tensor).
  // The symmetric collectives (allreduce, reduce_scatter, allgather, all_to_all) take the call's
  // place in the source as their last argument, for Note [Collective signatures]: leave it to
  // its default (the caller's file and line).
  using Site = std::source_location;
  WorkPtr allreduce(const Tensor& input, Tensor& output, const AllreduceOptions& options = {},
                    Site site = Site::current());
  WorkPtr allreduce(Tensor& tensor, const AllreduceOptions& options = {},
                    Site site = Site::current());
  // input: size() * n elements; output: n elements, rank r gets chunk r of the reduction.
  // output may be chunk r of input itself (in place); input's other chunks are then undefined.
  WorkPtr reduce_scatter(const Tensor& input, Tensor& output,
                         const ReduceScatterOptions& options = {}, Site site = Site::current());
  // input: n elements; output: size() * n elements, chunk r from rank r.
  WorkPtr allgather(const Tensor& input, Tensor& output, const AllgatherOptions& options = {},
                    Site site = Site::current());
  WorkPtr broadcast(Tensor& tensor, const BroadcastOptions& options = {});
  // output (significant on the root only; may be undefined elsewhere) = op over ranks of input.
  WorkPtr reduce(const Tensor& input, Tensor& output, const ReduceOptions& options = {});
  // Chunk j of input goes to rank j; chunk i of output comes from rank i (sizes per options).
  WorkPtr all_to_all(const Tensor& input, Tensor& output, const AllToAllOptions& options = {},
                     Site site = Site::current());
  WorkPtr send(const Tensor& tensor, int peer, const PointToPointOptions& options = {});
  WorkPtr recv(Tensor& tensor, int peer, const PointToPointOptions& options = {});
  WorkPtr batch_p2p(const std::vector<P2POp>& ops);
  WorkPtr barrier(const BarrierOptions& options = {});

  // Blocking conveniences.
  void allreduce_sync(Tensor& tensor, ReduceOp op = ReduceOp::kSum, Site site = Site::current()) {
    allreduce(tensor, AllreduceOptions{op}, site)->wait();
  }
  void barrier_sync() { barrier()->wait(); }

  // A sub-group of the ranks that pass the same color, ordered by (key, rank). Collective over
  // this communicator: every rank must call it. `name` names the group in errors.
  std::shared_ptr<Communicator> split(int color, int key, const std::string& name);

  // Collectives issued on this group so far (each rank's count; the same on every rank of a
  // correct program). Also per-op counts, for tests that count communication.
  uint64_t sequence_number() const { return sequence_; }
  uint64_t op_count(const std::string& op) const;
  // Bytes of the whole tensor each call of `op` moved so far: an allreduce's or reduce-scatter's
  // input, an all-gather's output (what bandwidth formulas such as Megatron's count).
  uint64_t op_bytes(const std::string& op) const;

  // See Note [Collective signatures]: on by default (LOOM_COMM_DEBUG=0 or set_debug(false) turns
  // it off), every collective is checked before it is posted: every rank of the group must make
  // the same call (op, dtype, count, root, reduction, the number of collectives before it and,
  // for the symmetric ones, the place in the source), else every rank's wait raises CommError
  // naming the ranks and their calls. A collective is posted once its check has agreed, so the
  // call returns at once and a later call or wait posts it (Note [The check queue]).
  bool debug() const { return debug_; }
  void set_debug(bool on);

  // Sets how this group's allreduce, reduce_scatter, allgather and all_to_all run (Algorithm;
  // a new group is flat). Collective over the group: every rank must pass the same algorithm
  // (else loom::Error on every rank). Not flat: splits the group by node (`node_of_rank`: each
  // group rank's node; empty: comm::node_map) into the two levels of comm::Hierarchy when it
  // spans nodes evenly, and for auto measures the levels' costs (collectives/algorithm.h, a
  // second or so), the same table on every rank, so that every rank picks alike. A group the
  // two levels do not apply to (one node, one rank per node, uneven) stays flat.
  void set_algorithm(Algorithm algorithm, std::vector<int> node_of_rank = {});
  Algorithm algorithm() const { return algorithm_; }
  const Hierarchy* hierarchy() const { return hierarchy_.get(); }  // null when flat
  const CollectiveCosts* costs() const { return costs_.get(); }    // auto's table, else null
  // Whether a call of `op` ("allreduce", "reduce_scatter", "allgather", "all_to_all",
  // "all_to_all(v)": with splits) moving `bytes` (an allreduce's, reduce-scatter's or
  // all-to-all's input, an all-gather's output) runs in two levels now; the same on every rank
  // for the same op and (but for all_to_all(v), which ignores it) bytes.
  bool goes_hierarchical(const char* op, size_t bytes) const;
  // "flat", or e.g. "auto over 2 node(s) x 2 rank(s): allreduce hierarchical from 4 MiB, ...".
  std::string algorithm_str() const;

  // Seconds each wait may take (LOOM_COMM_TIMEOUT, default 300).
  double timeout_seconds() const { return timeout_s_; }
  void set_timeout_seconds(double seconds);

 protected:
  Communicator(int rank, int size, std::string name);

  // What a backend implements. Arguments are already checked: contiguous, same dtype and
  // device, sizes consistent with the group, peers and roots in range.
  struct OpInfo {  // for messages: which collective this is
    const char* op;
    uint64_t sequence;
    size_t bytes;
  };
  virtual WorkPtr allreduce_impl(const Tensor& input, Tensor& output, const AllreduceOptions& o,
                                 const OpInfo& info) = 0;
  virtual WorkPtr reduce_scatter_impl(const Tensor& input, Tensor& output,
                                      const ReduceScatterOptions& o, const OpInfo& info) = 0;
  virtual WorkPtr allgather_impl(const Tensor& input, Tensor& output, const AllgatherOptions& o,
                                 const OpInfo& info) = 0;
  virtual WorkPtr broadcast_impl(Tensor& tensor, const BroadcastOptions& o, const OpInfo& info) = 0;
  virtual WorkPtr reduce_impl(const Tensor& input, Tensor& output, const ReduceOptions& o,
                              const OpInfo& info) = 0;
  virtual WorkPtr all_to_all_impl(const Tensor& input, Tensor& output, const AllToAllOptions& o,
                                  const OpInfo& info) = 0;
  virtual WorkPtr batch_p2p_impl(const std::vector<P2POp>& ops, const OpInfo& info) = 0;
  // One send or receive (send() and recv()): a backend with a quicker path for a single message
  // overrides it (Note [A single message's cost] in mpi_point_to_point.cpp); else a batch of one.
  virtual WorkPtr p2p_impl(const P2POp& op, const OpInfo& info) {
    return batch_p2p_impl({op}, info);
  }
  virtual WorkPtr barrier_impl(const BarrierOptions& o, const OpInfo& info) = 0;
  virtual std::shared_ptr<Communicator> split_impl(int color, int key, const std::string& name) = 0;

  // A communicator over the same ranks whose operations never match this group's own, for the
  // signature checks (Note [Collective signatures]); nullptr when the backend has none, and then
  // each check runs on the group itself and is completed before its collective is posted.
  virtual Communicator* check_channel() { return nullptr; }
  // The signature check's one exchange: `pair` (two i64, kept alive by the caller until the
  // work is complete or destroyed) becomes its elementwise max over the group, and `payload`'s
  // collective is done when the pairs agree (hashes_agree). An allreduce unless the backend has
  // a cheaper way (Note [Collective signatures]); only such a backend carries payloads.
  virtual WorkPtr check_exchange_impl(int64_t* pair, const CheckPayload& payload,
                                      const OpInfo& info) {
    LOOM_ASSERT(payload.kind == CheckPayload::Kind::kNone, "backend ", backend(),
                " carries no payload in its signature check");
    Tensor t = Tensor::from_external(pair, {2}, {1}, DType::kI64, nullptr);
    return allreduce_impl(t, t, AllreduceOptions{ReduceOp::kMax}, info);
  }
  // The most bytes (CheckPayload::bytes) that check_exchange_impl carries; 0: none.
  virtual size_t check_payload_limit() const { return 0; }
  // The largest collective of `kind` (CheckPayload::bytes over the group) worth carrying in its
  // check (Note [Small collectives in their check]): the sizes measured inside one node, unless
  // the backend knows its group is better served otherwise. Every rank of the group must answer
  // alike.
  virtual size_t carried_limit(CheckPayload::Kind kind) const;

  // For the destructor of a backend whose groups queue checked collectives: posts what is still
  // queued (each once its check agrees, as the other ranks expect; a Work dropped unfinished
  // may have left it there), waiting up to the timeout for each. What cannot be posted is
  // dropped; its Work raises.
  void post_queued();

  // "group 'tp' (rank 1 of 2) allreduce #17, 4096 bytes": the context every error names.
  std::string describe(const OpInfo& info) const { return context_of(info).str(); }
  OpContext context_of(const OpInfo& info) const {
    return OpContext{name_, rank_, size_, info.op, info.sequence, info.bytes};
  }

 private:
  // What every rank of a collective must agree on (See Note [Collective signatures]).
  struct Signature {
    const char* op;
    DType dtype = DType::kU8;
    int64_t count = 0;
    int root = -1;               // -1: the op has no root
    int reduce = -1;             // ReduceOp, -1: not a reduction
    const char* file = nullptr;  // the call's place (symmetric collectives), else null
    int line = 0;
  };
  OpInfo begin(const char* op, size_t bytes);
  void tally(const char* op, size_t bytes);  // op_count's and op_bytes' counts
  void check_p2p(const P2POp& op) const;     // a send's or receive's arguments
  // The Hierarchy to run a call on (goes_hierarchical), else null. A routed call is still this
  // group's collective: checked here as a whole, then made in two levels (Note [Two-level calls
  // checked whole] in hierarchical.cpp).
  std::shared_ptr<Hierarchy> route(const char* op, size_t bytes) const;
  // While one lives, the collectives this thread posts have no signature check of their own:
  // each is posted in its group's order, as a checked one would be once its check agreed (a
  // small one still travels in its exchange, compared by length only: Note [Carried when
  // unchecked]). For comm::Hierarchy's steps, whose whole call was checked on the group it
  // serves (Note [Two-level calls checked whole]).
  friend class Hierarchy;
  class CheckedByCaller {
   public:
    CheckedByCaller();
    ~CheckedByCaller();
    CheckedByCaller(const CheckedByCaller&) = delete;
    CheckedByCaller& operator=(const CheckedByCaller&) = delete;

   private:
    bool previous_;
  };
  // A small collective done by its signature check's exchange (Note [Small collectives in their
  // check]): the payload, and the tensors whose memory it points into, kept until it is done.
  struct Carried {
    CheckPayload payload;
    Tensor input, output;
  };
  // Whether a collective travels inside its check: `payload` (bytes() of it) fits the channel
  // and carried_limit(payload's kind), and its buffers are host memory.
  bool carried_by_check(const CheckPayload& payload, bool on_host);
  // Posts a collective: begin(), then post(info) at once, or once its signature check agrees;
  // a carried one is done by its check instead.
  WorkPtr collective(const Signature& signature, size_t bytes,
                     std::function<WorkPtr(const OpInfo&)> post, Carried carried);
  WorkPtr collective(const Signature& signature, size_t bytes,
                     std::function<WorkPtr(const OpInfo&)> post) {
    return collective(signature, bytes, std::move(post), Carried());
  }

  // The checked collectives of this group not yet posted, oldest first, and what their works
  // share with the group (See Note [The check queue] in communicator.cpp).
  friend class CheckedWork;
  friend void progress_checks();
  struct Pending;
  struct CheckQueue;
  // Posts the checks and collectives of the queue as far as their checks have agreed: up to and
  // including `until` (waiting for each check) when given, else as far as they already have.
  void advance(const Pending* until);
  // Posts p's check on `channel` (p is the oldest queued collective).
  void post_check(Pending& p, Communicator& channel);
  // Raises, once, the error of a check that disagreed or of a post that failed, when the
  // collective's Work was dropped before raising it.
  void raise_undelivered();
  // On a check that disagreed: every rank's call, gathered on `channel`, as an error message.
  void post_explanation(Pending& p, Communicator& channel);
  std::string explanation(Pending& p);

  int rank_;
  int size_;
  std::string name_;
  uint64_t sequence_ = 0;
  uint64_t collectives_ = 0;  // the collectives among them: See Note [Collective signatures]
  struct OpTally {
    const char* op;  // a string literal, as OpInfo::op
    uint64_t count = 0, bytes = 0;
  };
  std::vector<OpTally> op_counts_;
  double timeout_s_;
  bool debug_;
  std::shared_ptr<CheckQueue> queue_;
  Algorithm algorithm_ = Algorithm::kFlat;
  std::shared_ptr<Hierarchy> hierarchy_;
  std::shared_ptr<const CollectiveCosts> costs_;
  bool advancing_ = false;  // inside advance(): See Note [The check queue]
};

// The world: the MPI world when the process was launched by mpirun and loom has MPI (MPI is
// initialised on first use and finalised at exit), else a single-process `self` communicator.
// `backend`: "auto", "self", "mpi" or "nccl". Built with NCCL, "auto" under mpirun returns the
// MPI world with NCCL for CUDA tensors (backend "mpi+nccl") when every rank has a GPU of its own,
// and "nccl" requires that (collectives/nccl_backend.h). Sets the rank printed in error messages.
std::shared_ptr<Communicator> world(const std::string& backend = "auto");

// This process's index among the ranks of its node as the launcher says it
// (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID or SLURM_LOCALID); -1 when none does. The GPU a
// rank takes under mpirun (Note [One GPU per rank] in nccl_backend.cpp).
int64_t launcher_local_rank();

// True when the environment says this process was started by an MPI launcher.
bool launched_by_mpi();

}  // namespace loom::comm
