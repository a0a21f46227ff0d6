// The NCCL backend: every op puts its work on the communicator's own CUDA stream, behind an event
// of the compute stream, and returns an NcclWork that polls a completion event with the group's
// deadline (See Note [Deadlines] in communicator.cpp). The decisions that are not obvious:
// See Note [NCCL streams], Note [Nonblocking NCCL], Note [NCCL reductions],
// Note [NCCL point-to-point], Note [NCCL teardown] and Note [One GPU per rank].
#include "collectives/nccl_backend.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "collectives/device_router.h"
#include "collectives/mpi_backend.h"
#include "collectives/nccl_check.h"
#include "collectives/termination.h"
#include "collectives/work.h"
#include "core/cuda_dispatch.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/copy.h"
#include "kernels/cuda/runtime.h"

namespace loom::comm {

// Note [NCCL streams]
// Kernels run on the compute stream (cuda_stream(device), Note [Compute stream]). NCCL
// runs on a stream of its communicator's own, created non-blocking so that it neither waits for
// the legacy stream implicitly nor holds it up: a long transfer overlaps the compute that follows.
// The order between the two is kept with events, never by synchronising the host:
//  - when an op is posted, an event is recorded on the compute stream and the communication
//    stream waits on it, so NCCL reads inputs that every kernel posted before has finished
//    writing (and that Tensor::to's host copies, on the legacy stream, have landed);
//  - the op's last step records a completion event on the communication stream. test() and
//    wait() poll it; once it has completed, the compute stream waits on it as well, so kernels
//    posted after wait() see the result (a no-op on the GPU by then, as the host saw it complete,
//    but it states the order rather than relying on the poll).
// Until wait() or test() has reported completion, inputs and outputs must not be touched, as with
// every backend; the Work holds them (and the scratch buffers) until then, so their memory is not
// freed under NCCL.
//
// Note [Nonblocking NCCL]
// A blocking NCCL communicator may block the host inside a call (ncclGroupEnd, say, while it first
// connects to a peer), and a peer that never comes would make that a hang no deadline can end.
// loom's communicators are nonblocking (ncclConfig_t::blocking = 0): a call that still has work
// returns ncclInProgress and finishes it in the background, ncclCommGetAsyncError saying
// ncclInProgress until then. NCCL requires that state to be ncclSuccess before the next call on
// the communicator and before anything else is put on its stream, so each NCCL call is followed by
// a polled wait for it (settle()) with the group's deadline; past the deadline, or on an error,
// the communicator is aborted and CommError raised. Posting can therefore block while a peer is
// late to its first exchange with this rank (NCCL connects pairs of ranks lazily); afterwards it
// returns at once, and the waiting is the Work's.
//
// Note [NCCL reductions]
// - bf16 and f16: NCCL would add in 16 bits, rounding every partial sum. The values are widened
//   into an f32 scratch buffer on the communication stream (kernels::cuda::convert), reduced in
//   f32, and rounded once into the output: the same numbers as the mpi backend (Note [MPI
//   staging]).
// - avg is ncclAvg. Integers are summed, then divided truncating toward zero (as C++ and the mpi
//   backend do). Floats are each multiplied by 1/size() and then summed: when the group size is a
//   power of two, 1/size() and those products are exact and the result is the mpi backend's
//   sum / size() bit for bit; for other sizes it may differ in the last bit.
//
// Note [NCCL point-to-point]
// NCCL has no tags: the sends from one rank to another match that rank's receives from it in the
// order they are posted, whatever their tags (the tag is ignored here). A program that relies on
// tags to pair messages out of order must post them in matching order instead. A batch_p2p is one
// NCCL group, so both directions of an exchange are in flight together; a send() and a recv()
// are two groups that run one after the other on the stream, so two ranks that each send() to
// the other before they recv() can deadlock on large messages (as with blocking MPI sends): use
// batch_p2p for exchanges. NCCL does not check lengths: a receive must be exactly as long as its
// send. Empty sends and receives are not posted (on either side, so they still match). Messages a
// rank sends itself do not go through NCCL (which takes them only with the receive in the same
// group): they are queued on the device and matched by tag, as on the self backend.
//
// Note [NCCL teardown]
// An NCCL communicator is released when its last Communicator and Work let go of it, with
// ncclCommAbort: that is local, whereas ncclCommDestroy and ncclCommFinalize wait for the peers
// and could hang a destructor on a rank whose peers are gone (every op on it has completed by
// then, so nothing is lost). At process exit nothing is released: the CUDA runtime may be
// unloading while static destructors run, and the OS reclaims the GPU. A Work destroyed before
// it completed first waits for it, up to the group's timeout; if it is still pending then, the
// communicator is aborted (which ends the kernels still waiting for a peer) and the Work's
// buffers are kept forever, since the GPU may still write into them.
//
// Note [One GPU per rank]
// NCCL runs one rank per GPU (it refuses two ranks on one GPU), so the rank with index L among
// the ranks of its node uses GPU L. L is what the launcher says (OMPI_COMM_WORLD_LOCAL_RANK,
// MPI_LOCALRANKID, SLURM_LOCALID), or else the rank's position among the ranks on the same host
// name. Whether every rank has a GPU is decided by all ranks together, from one allgather, so they
// all take the same path: NCCL on every rank, or (world("auto")) the MPI world on every rank, or
// (world("nccl"), make_nccl_communicator) the same error on every rank. So a node with fewer GPUs
// than ranks, such as one GPU under mpirun -np 2, keeps the MPI world and host staging under auto.

namespace {

using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------- process exit

bool g_exiting = false;  // See Note [NCCL teardown]
int g_device = -1;       // nccl_device()
void mark_exiting() { g_exiting = true; }
// Registers mark_exiting once, at the first NCCL communicator: after world()'s static and MPI's
// finalisation have registered theirs, so that it runs before them at exit.
void watch_exit() {
  static const bool registered = (std::atexit(mark_exiting), true);
  (void)registered;
}

// ---------------------------------------------------------------- types and buffers

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
    case DType::kU8:
    case DType::kBool:
      return ncclUint8;
  }
  LOOM_ASSERT(false, "unknown dtype ", int(t));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;  // See Note [NCCL reductions]
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  LOOM_ASSERT(false, "unknown reduce op ", int(op));
}

// bf16 and f16 reductions run in an f32 scratch buffer (See Note [NCCL reductions]).
bool widens(DType t) { return t == DType::kBF16 || t == DType::kF16; }

char* bytes_at(const Tensor& t, int64_t element) {
  return static_cast<char*>(t.data_ptr()) + element * int64_t(dtype_size(t.dtype()));
}

bool overlap(const Tensor& a, const Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const char* x = bytes_at(a, 0);
  const char* y = bytes_at(b, 0);
  return x < y + b.nbytes() && y < x + a.nbytes();
}

ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // See Note [Nonblocking NCCL]
  return config;
}

// ---------------------------------------------------------------- waiting for NCCL

// Polls until `comm` has finished what its last call started (See Note [Nonblocking NCCL]).
// Returns "" once it has, else the CommError text: the error NCCL reported, or the deadline.
std::string settle_state(ncclComm_t comm, double timeout_s, const std::string& context) {
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration<double>(timeout_s);
  const auto patient_until = start + std::chrono::seconds(1);
  WaitingScope waiting;  // See Note [Termination by the launcher]
  waiting.describe(context);
  for (int polls = 0;; ++polls) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm, &state);
    if (rc != ncclSuccess) return nccl_failure(rc, comm, "ncclCommGetAsyncError failed", context);
    if (state == ncclSuccess) return {};
    if (state != ncclInProgress) return nccl_failure(state, comm, "NCCL failed", context);
    if (polls < 1000) continue;
    const auto now = Clock::now();
    if (now > deadline) {
      return detail::str_cat("[rank ", error_rank(), "] timed out after ", timeout_s,
                             " s waiting for ", context,
                             " (NCCL was connecting the ranks): a rank of the group did not join "
                             "it (it may have skipped the call, be stuck elsewhere, or have "
                             "died); LOOM_COMM_TIMEOUT sets the limit");
    }
    if (now < patient_until)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// ---------------------------------------------------------------- the communicator handle

// An NCCL communicator with its stream, shared by its Communicator and its pending works, and
// released when the last of them lets go (See Note [NCCL teardown]).
struct NcclHandle {
  NcclHandle(ncclComm_t c, int d) : comm(c), device(d) {
    LOOM_CUDA_CHECK(cudaSetDevice(device));
    LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  }
  NcclHandle(const NcclHandle&) = delete;
  NcclHandle& operator=(const NcclHandle&) = delete;
  ~NcclHandle() {
    if (g_exiting) return;
    cudaSetDevice(device);
    if (!aborted()) ncclCommAbort(comm);
    cudaEventDestroy(ready);
    cudaStreamDestroy(stream);
  }

  bool aborted() const { return !failure.empty(); }
  // Ends the communicator after a failure: NCCL's kernels still waiting for a peer stop, and every
  // later op on it raises CommError with `why`.
  void abort(const std::string& why) {
    if (aborted()) return;
    failure = why.empty() ? "aborted" : why;
    cudaSetDevice(device);
    ncclCommAbort(comm);
  }

  ncclComm_t comm;
  int device;                     // the GPU of this rank (See Note [One GPU per rank])
  cudaStream_t stream = nullptr;  // the communication stream (See Note [NCCL streams])
  cudaEvent_t ready = nullptr;    // recorded on the compute stream as each op is posted
  std::string failure;            // why it was aborted; empty while it works
  Tensor barrier_value;           // [1] f32 zero on the device: what barrier() sums
};

std::shared_ptr<NcclHandle> make_handle(ncclComm_t comm, int device) {
  try {
    return std::make_shared<NcclHandle>(comm, device);
  } catch (...) {
    ncclCommAbort(comm);
    throw;
  }
}

// ---------------------------------------------------------------- the work

// Buffers of works destroyed before completion: never freed (See Note [NCCL teardown]).
std::vector<std::vector<Tensor>>& abandoned() {
  static auto* list = new std::vector<std::vector<Tensor>>();
  return *list;
}

class NcclWork final : public PollingWork {
 public:
  // The context is formatted at once here: an NCCL op's own cost dwarfs it.
  NcclWork(std::shared_ptr<NcclHandle> handle, const OpContext& context, double timeout_s)
      : PollingWork(context, timeout_s),
        handle(std::move(handle)),
        context_(context.str()),
        timeout_s_(timeout_s) {}
  ~NcclWork() override;

  // A CommError (timed out, or NCCL failed) aborts the communicator: NCCL's state is unknown after
  // it, and the kernels waiting for a missing peer must end.
  void wait() override {
    try {
      PollingWork::wait();
    } catch (const CommError& e) {
      handle->abort(e.what());
      throw;
    }
  }
  bool test() override {
    try {
      return PollingWork::test();
    } catch (const CommError& e) {
      handle->abort(e.what());
      throw;
    }
  }

  const std::string& context() const { return context_; }

  std::shared_ptr<NcclHandle> handle;
  bool enqueued = false;             // work went onto the communication stream
  cudaEvent_t completion = nullptr;  // recorded after the op's last step on that stream
  std::vector<Tensor> buffers;  // every device buffer the stream reads or writes, until complete
  std::vector<std::pair<Tensor, Tensor>> copies;     // (from, to) on the stream before the op
  std::vector<std::pair<Tensor, Tensor>> copy_back;  // (device buffer, CPU tensor) once complete

 protected:
  bool poll() override {
    if (handle->aborted()) {
      throw CommError(detail::str_cat("[rank ", error_rank(), "] ", context_,
                                      ": the NCCL communicator was aborted after an earlier "
                                      "failure: ",
                                      handle->failure));
    }
    ncclResult_t state = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(handle->comm, &state);
    if (rc != ncclSuccess)
      throw CommError(nccl_failure(rc, handle->comm, "ncclCommGetAsyncError failed", context_));
    if (state != ncclSuccess && state != ncclInProgress)
      throw CommError(nccl_failure(state, handle->comm, "NCCL failed", context_));
    const cudaError_t e = cudaEventQuery(completion);
    if (e == cudaSuccess) return true;
    if (e == cudaErrorNotReady) return false;
    throw CommError(detail::str_cat("[rank ", error_rank(), "] cudaEventQuery failed: ",
                                    cudaGetErrorString(e), " in ", context_));
  }

  // The compute stream waits for the op (See Note [NCCL streams]); CPU results come back.
  void finish() override {
    cudaStream_t compute = cuda_stream(Device::cuda(handle->device));
    LOOM_CUDA_CHECK(cudaStreamWaitEvent(compute, completion, 0));
    for (auto& [from, to] : copy_back) to.copy_(from);
    copy_back.clear();
    copies.clear();
    buffers.clear();
  }

 private:
  std::string context_;
  double timeout_s_;
};

NcclWork::~NcclWork() {
  if (!done() && enqueued) {
    // See Note [NCCL teardown].
    bool complete = false;
    if (completion != nullptr && !handle->aborted() && !g_exiting) {
      const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s_);
      while (Clock::now() < deadline) {
        try {
          complete = poll();
        } catch (...) {
          break;
        }
        if (complete) break;
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
    if (complete) {
      try {
        finish();  // the results are as complete as if wait() had been called
      } catch (...) {
      }
    } else {
      if (!g_exiting)
        handle->abort(detail::str_cat("[rank ", error_rank(), "] a Work was destroyed before it ",
                                      "completed, and it did not complete within ", timeout_s_,
                                      " s: ", context_));
      abandoned().push_back(std::move(buffers));  // every device buffer of the op is in there
    }
  }
  if (completion != nullptr) cudaEventDestroy(completion);
}

// ---------------------------------------------------------------- the communicator

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<NcclHandle> handle, int rank, int size, const std::string& name)
      : Communicator(rank, size, name), handle_(std::move(handle)) {}
  const char* backend() const override { return "nccl"; }

 protected:
  WorkPtr allreduce_impl(const Tensor& input, Tensor& output, const AllreduceOptions& o,
                         const OpInfo& info) override {
    auto w = start(info);
    const Tensor in = gpu_input(*w, "input", input);
    const Tensor out = gpu_output(*w, "output", output, input, in);
    const int64_t n = in.numel();
    if (n == 0) return post(w, [] {});
    if (widens(in.dtype())) {
      const Tensor acc = scratch(*w, n);
      return post(w, [&] {
        convert(in, 0, acc, 0, n);
        settle(*w, LOOM_NCCL_CHECK_IN(w->context(), nccl(),
                                      ncclAllReduce(acc.data_ptr(), acc.data_ptr(), size_t(n),
                                                    ncclFloat32, nccl_op(o.op), nccl(), stream())));
        convert(acc, 0, out, 0, n);
      });
    }
    const Tensor send = apart(*w, in, out, in.data_ptr() == out.data_ptr());
    return post(w, [&] {
      settle(*w, LOOM_NCCL_CHECK_IN(
                     w->context(), nccl(),
                     ncclAllReduce(send.data_ptr(), out.data_ptr(), size_t(n),
                                   nccl_type(in.dtype()), nccl_op(o.op), nccl(), stream())));
    });
  }

  // In place for NCCL when the output is this rank's chunk of the input.
  WorkPtr reduce_scatter_impl(const Tensor& input, Tensor& output, const ReduceScatterOptions& o,
                              const OpInfo& info) override {
    auto w = start(info);
    const Tensor in = gpu_input(*w, "input", input);
    const Tensor out = gpu_output(*w, "output", output);
    const int64_t n = out.numel();
    const int64_t mine = int64_t(rank()) * n;  // this rank's chunk of the input
    if (n == 0) return post(w, [] {});
    if (widens(in.dtype())) {
      const Tensor acc = scratch(*w, n * size());
      return post(w, [&] {
        convert(in, 0, acc, 0, n * size());
        settle(*w,
               LOOM_NCCL_CHECK_IN(w->context(), nccl(),
                                  ncclReduceScatter(acc.data_ptr(), bytes_at(acc, mine), size_t(n),
                                                    ncclFloat32, nccl_op(o.op), nccl(), stream())));
        convert(acc, mine, out, 0, n);
      });
    }
    const Tensor send = apart(*w, in, out, out.data_ptr() == bytes_at(in, mine));
    return post(w, [&] {
      settle(*w, LOOM_NCCL_CHECK_IN(
                     w->context(), nccl(),
                     ncclReduceScatter(send.data_ptr(), out.data_ptr(), size_t(n),
                                       nccl_type(in.dtype()), nccl_op(o.op), nccl(), stream())));
    });
  }

  // In place for NCCL when the input is this rank's chunk of the output.
  WorkPtr allgather_impl(const Tensor& input, Tensor& output, const AllgatherOptions&,
                         const OpInfo& info) override {
    auto w = start(info);
    const Tensor in = gpu_input(*w, "input", input);
    const Tensor out = gpu_output(*w, "output", output);
    const int64_t n = in.numel();
    if (n == 0) return post(w, [] {});
    const Tensor send = apart(*w, in, out, in.data_ptr() == bytes_at(out, int64_t(rank()) * n));
    return post(w, [&] {
      settle(*w, LOOM_NCCL_CHECK_IN(w->context(), nccl(),
                                    ncclAllGather(send.data_ptr(), out.data_ptr(), size_t(n),
                                                  nccl_type(in.dtype()), nccl(), stream())));
    });
  }

  WorkPtr broadcast_impl(Tensor& tensor, const BroadcastOptions& o, const OpInfo& info) override {
    auto w = start(info);
    // A CPU tensor: the root sends a staged copy, the others receive into one and copy it back.
    const Tensor buf =
        rank() == o.root ? gpu_input(*w, "tensor", tensor) : gpu_output(*w, "tensor", tensor);
    const int64_t n = buf.numel();
    if (n == 0) return post(w, [] {});
    return post(w, [&] {
      settle(*w,
             LOOM_NCCL_CHECK_IN(w->context(), nccl(),
                                ncclBroadcast(buf.data_ptr(), buf.data_ptr(), size_t(n),
                                              nccl_type(buf.dtype()), o.root, nccl(), stream())));
    });
  }

  // NCCL reads the receive buffer only on the root; the others pass their input in its place.
  WorkPtr reduce_impl(const Tensor& input, Tensor& output, const ReduceOptions& o,
                      const OpInfo& info) override {
    auto w = start(info);
    const bool root = rank() == o.root;
    const Tensor in = gpu_input(*w, "input", input);
    const Tensor out = root ? gpu_output(*w, "output", output, input, in) : Tensor();
    const int64_t n = in.numel();
    if (n == 0) return post(w, [] {});
    if (widens(in.dtype())) {
      const Tensor acc = scratch(*w, n);
      return post(w, [&] {
        convert(in, 0, acc, 0, n);
        settle(*w,
               LOOM_NCCL_CHECK_IN(w->context(), nccl(),
                                  ncclReduce(acc.data_ptr(), acc.data_ptr(), size_t(n), ncclFloat32,
                                             nccl_op(o.op), o.root, nccl(), stream())));
        if (root) convert(acc, 0, out, 0, n);
      });
    }
    const Tensor recv = root ? out : in;
    const Tensor send = root ? apart(*w, in, out, in.data_ptr() == out.data_ptr()) : in;
    return post(w, [&] {
      settle(*w, LOOM_NCCL_CHECK_IN(
                     w->context(), nccl(),
                     ncclReduce(send.data_ptr(), recv.data_ptr(), size_t(n), nccl_type(in.dtype()),
                                nccl_op(o.op), o.root, nccl(), stream())));
    });
  }

  // One NCCL group of a send and a receive per peer with a non-empty part (NCCL has no
  // alltoallv). In place, or with overlapping buffers, the input is copied first.
  WorkPtr all_to_all_impl(const Tensor& input, Tensor& output, const AllToAllOptions& o,
                          const OpInfo& info) override {
    auto w = start(info);
    const Tensor in = gpu_input(*w, "input", input);
    const Tensor out = gpu_output(*w, "output", output);
    const Tensor send = apart(*w, in, out, false);
    const ncclDataType_t type = nccl_type(in.dtype());
    return post(w, [&] {
      settle(*w, grouped(*w, [&] {
        int64_t send_offset = 0, recv_offset = 0;
        for (int peer = 0; peer < size(); ++peer) {
          const int64_t s = o.input_splits[size_t(peer)];
          const int64_t r = o.output_splits[size_t(peer)];
          if (s > 0)
            LOOM_NCCL_CHECK_IN(
                w->context(), nccl(),
                ncclSend(bytes_at(send, send_offset), size_t(s), type, peer, nccl(), stream()));
          if (r > 0)
            LOOM_NCCL_CHECK_IN(
                w->context(), nccl(),
                ncclRecv(bytes_at(out, recv_offset), size_t(r), type, peer, nccl(), stream()));
          send_offset += s;
          recv_offset += r;
        }
      }));
    });
  }

  // See Note [NCCL point-to-point]: one group, in the order given; tags are not NCCL's. Messages
  // to this rank itself do not go through NCCL, which takes a send to self only with its receive
  // in the same group: a send to self is copied into a queue (on the stream), and a receive from
  // self takes the oldest message queued with its tag, as the self backend does.
  WorkPtr batch_p2p_impl(const std::vector<P2POp>& ops, const OpInfo& info) override {
    auto w = start(info);
    std::vector<Tensor> bufs;
    bufs.reserve(ops.size());
    for (const P2POp& p : ops)
      bufs.push_back(p.kind == P2POp::Kind::kSend ? gpu_input(*w, "send tensor", p.tensor)
                                                  : gpu_output(*w, "recv tensor", p.tensor));
    // Sends to self first, so a batch holding both halves of a self exchange completes. The
    // queue changes only once every receive from self has found its message.
    std::map<int, std::deque<Tensor>> queued = self_messages_;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].kind != P2POp::Kind::kSend || ops[i].peer != rank()) continue;
      Tensor message = Tensor::empty(bufs[i].shape(), bufs[i].dtype(), bufs[i].device());
      w->buffers.push_back(message);
      w->copies.emplace_back(bufs[i], message);
      queued[ops[i].tag].push_back(message);
    }
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].kind != P2POp::Kind::kRecv || ops[i].peer != rank()) continue;
      auto it = queued.find(ops[i].tag);
      LOOM_CHECK(it != queued.end() && !it->second.empty(), w->context(),
                 ": recv from self with tag ", ops[i].tag,
                 " has no matching send (it would wait forever)");
      Tensor message = it->second.front();
      it->second.pop_front();
      LOOM_CHECK(message.nbytes() == bufs[i].nbytes() && message.dtype() == bufs[i].dtype(),
                 w->context(), ": recv of ", ops[i].tensor.str(), " from self matched a send of ",
                 message.str());
      w->buffers.push_back(message);
      w->copies.emplace_back(message, bufs[i]);
    }
    self_messages_ = std::move(queued);
    bool to_peers = false;
    for (size_t i = 0; i < ops.size(); ++i)
      to_peers |= ops[i].peer != rank() && bufs[i].numel() > 0;
    if (!to_peers) return post(w, [] {});
    return post(w, [&] {
      settle(*w, grouped(*w, [&] {
        for (size_t i = 0; i < ops.size(); ++i) {
          const Tensor& b = bufs[i];
          if (ops[i].peer == rank() || b.numel() == 0) continue;
          if (ops[i].kind == P2POp::Kind::kSend)
            LOOM_NCCL_CHECK_IN(w->context(), nccl(),
                               ncclSend(b.data_ptr(), size_t(b.numel()), nccl_type(b.dtype()),
                                        ops[i].peer, nccl(), stream()));
          else
            LOOM_NCCL_CHECK_IN(w->context(), nccl(),
                               ncclRecv(b.data_ptr(), size_t(b.numel()), nccl_type(b.dtype()),
                                        ops[i].peer, nccl(), stream()));
        }
      }));
    });
  }

  // A one-element allreduce: complete on a rank once every rank has reached it.
  WorkPtr barrier_impl(const BarrierOptions&, const OpInfo& info) override {
    auto w = start(info);
    if (!handle_->barrier_value.defined())
      handle_->barrier_value = Tensor::zeros({1}, DType::kF32, Device::cuda(handle_->device));
    const Tensor value = handle_->barrier_value;
    w->buffers.push_back(value);
    return post(w, [&] {
      settle(*w, LOOM_NCCL_CHECK_IN(w->context(), nccl(),
                                    ncclAllReduce(value.data_ptr(), value.data_ptr(), 1,
                                                  ncclFloat32, ncclSum, nccl(), stream())));
    });
  }

  // ncclCommSplit orders the new group by (key, rank here), as MPI_Comm_split does, so a device
  // router's two halves agree on the sub-group's ranks.
  std::shared_ptr<Communicator> split_impl(int color, int key, const std::string& name) override {
    const std::string context = describe(OpInfo{"split", sequence_number(), 0});
    check_usable(context);
    LOOM_CUDA_CHECK(cudaSetDevice(handle_->device));
    ncclConfig_t config = nonblocking_config();
    ncclComm_t child = nullptr;
    std::string failure;
    try {
      LOOM_NCCL_CHECK_IN(context, nccl(), ncclCommSplit(nccl(), color, key, &child, &config));
    } catch (const CommError& e) {
      failure = e.what();
    }
    if (failure.empty()) failure = settle_state(nccl(), timeout_seconds(), context);
    if (failure.empty() && child != nullptr)
      failure = settle_state(child, timeout_seconds(), context + " (the new group '" + name + "')");
    if (failure.empty() && child == nullptr)
      failure = detail::str_cat("[rank ", error_rank(), "] ncclCommSplit returned no communicator",
                                " in ", context);
    if (!failure.empty()) {
      if (child != nullptr) ncclCommAbort(child);
      handle_->abort(failure);
      throw CommError(failure);
    }
    int child_rank = 0, child_size = 0;
    LOOM_NCCL_CHECK_IN(context, child, ncclCommUserRank(child, &child_rank));
    LOOM_NCCL_CHECK_IN(context, child, ncclCommCount(child, &child_size));
    return std::make_shared<NcclCommunicator>(make_handle(child, handle_->device), child_rank,
                                              child_size, name);
  }

 private:
  ncclComm_t nccl() const { return handle_->comm; }
  cudaStream_t stream() const { return handle_->stream; }

  void check_usable(const std::string& context) const {
    if (handle_->aborted()) {
      throw CommError(detail::str_cat("[rank ", error_rank(), "] ", context,
                                      ": the NCCL communicator of this group was aborted after an "
                                      "earlier failure, and cannot be used again (",
                                      handle_->failure, ")"));
    }
  }

  // The steps of an op, in this order (See Note [NCCL streams]): start; gpu_input, gpu_output,
  // scratch and apart, which prepare buffers and check devices before anything is posted; then
  // post, which orders the communication stream after the compute stream, runs the op's stream
  // steps and records the completion.
  std::shared_ptr<NcclWork> start(const OpInfo& info) {
    check_usable(describe(info));
    LOOM_CUDA_CHECK(cudaSetDevice(handle_->device));
    return std::make_shared<NcclWork>(handle_, context_of(info), timeout_seconds());
  }

  void check_device(const NcclWork& w, const char* what, const Tensor& t) const {
    LOOM_CHECK(t.device().index == handle_->device, w.context(), ": ", what, " is on ",
               t.device().str(), " but this rank's NCCL communicator uses cuda:", handle_->device,
               " (one GPU per rank: move the tensor there)");
  }

  // t on this GPU: itself, or for a CPU tensor a copy staged now (before the op is posted).
  Tensor gpu_input(NcclWork& w, const char* what, const Tensor& t) {
    Tensor d = t.detach();
    if (d.device().is_cpu())
      d = d.to(Device::cuda(handle_->device));
    else
      check_device(w, what, d);
    w.buffers.push_back(d);
    return d;
  }

  // A buffer on this GPU for the result t: t itself, or for a CPU tensor a device buffer that is
  // copied into t once the op completes; that buffer is `staged_input` when t is `input` itself
  // (an in-place op on a CPU tensor).
  Tensor gpu_output(NcclWork& w, const char* what, const Tensor& t, const Tensor& input = Tensor(),
                    const Tensor& staged_input = Tensor()) {
    Tensor d = t.detach();
    if (d.device().is_cuda()) {
      check_device(w, what, d);
      w.buffers.push_back(d);
      return d;
    }
    const bool in_place = staged_input.defined() && input.device().is_cpu() &&
                          input.data_ptr() == t.data_ptr() && input.numel() == t.numel();
    Tensor buf = in_place ? staged_input.reshape(t.shape())
                          : Tensor::empty(t.shape(), t.dtype(), Device::cuda(handle_->device));
    w.buffers.push_back(buf);
    w.copy_back.emplace_back(buf, d);
    return buf;
  }

  // An f32 scratch buffer of n elements (See Note [NCCL reductions]).
  Tensor scratch(NcclWork& w, int64_t n) {
    Tensor s = Tensor::empty({n}, DType::kF32, Device::cuda(handle_->device));
    w.buffers.push_back(s);
    return s;
  }

  // What to send from `send` when the op writes `recv`: send itself when the two do not overlap or
  // overlap the way the NCCL call takes in place; else a copy, made on the stream by post().
  Tensor apart(NcclWork& w, const Tensor& send, const Tensor& recv, bool in_place) {
    if (in_place || !overlap(send, recv)) return send;
    Tensor copy = Tensor::empty(send.shape(), send.dtype(), Device::cuda(handle_->device));
    w.buffers.push_back(copy);
    w.copies.emplace_back(send, copy);
    return copy;
  }

  // Converts n elements from src (from element src_at) into dst (from dst_at), on the stream.
  void convert(const Tensor& src, int64_t src_at, const Tensor& dst, int64_t dst_at,
               int64_t n) const {
    kernels::cuda::convert(bytes_at(src, src_at), int(src.dtype()), bytes_at(dst, dst_at),
                           int(dst.dtype()), n, stream());
  }

  // Waits until NCCL has taken the call that returned `posted` (See Note [Nonblocking NCCL]).
  void settle(NcclWork& w, ncclResult_t posted) {
    if (posted != ncclInProgress) return;
    const std::string failure = settle_state(nccl(), timeout_seconds(), w.context());
    if (!failure.empty()) throw CommError(failure);  // post() aborts the communicator
  }

  // calls() between ncclGroupStart and ncclGroupEnd; the group is closed even when a call fails.
  ncclResult_t grouped(NcclWork& w, const std::function<void()>& calls) {
    LOOM_NCCL_CHECK_IN(w.context(), nccl(), ncclGroupStart());
    try {
      calls();
    } catch (...) {
      ncclGroupEnd();
      throw;
    }
    return LOOM_NCCL_CHECK_IN(w.context(), nccl(), ncclGroupEnd());
  }

  // Orders the communication stream after the compute stream, runs the op's `steps` on it
  // (after the copies the op asked for: apart(), messages to self) and records the completion
  // event. A failure here leaves
  // NCCL and the stream in an unknown state: the communicator is aborted with it.
  WorkPtr post(const std::shared_ptr<NcclWork>& w, const std::function<void()>& steps) {
    cudaStream_t compute = cuda_stream(Device::cuda(handle_->device));
    LOOM_CUDA_CHECK(cudaEventRecord(handle_->ready, compute));
    LOOM_CUDA_CHECK(cudaStreamWaitEvent(stream(), handle_->ready, 0));
    w->enqueued = true;
    try {
      for (const auto& [from, to] : w->copies)
        if (from.nbytes() > 0)
          LOOM_CUDA_CHECK(cudaMemcpyAsync(to.data_ptr(), from.data_ptr(), from.nbytes(),
                                          cudaMemcpyDeviceToDevice, stream()));
      steps();
      LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&w->completion, cudaEventDisableTiming));
      LOOM_CUDA_CHECK(cudaEventRecord(w->completion, stream()));
    } catch (const std::exception& e) {
      handle_->abort(e.what());
      throw;
    }
    return w;
  }

  std::shared_ptr<NcclHandle> handle_;
  std::map<int, std::deque<Tensor>> self_messages_;  // tag -> sends to self not yet received
};

// ---------------------------------------------------------------- creation

// The node this rank runs on: a 64-bit FNV-1a hash of its host name.
int64_t node_id() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  uint64_t h = 1469598103934665603ull;
  for (const char* p = name; *p; ++p) h = (h ^ uint64_t(uint8_t(*p))) * 1099511628211ull;
  int64_t id;
  std::memcpy(&id, &h, sizeof id);
  return id;
}

struct GpuPlan {
  int local_rank = 0;   // this rank's GPU
  std::string missing;  // empty when every rank has a GPU of its own, else which ranks have none
};

// Collective over host: every rank learns, from one allgather, which GPU each rank would use and
// whether it has one (See Note [One GPU per rank]).
GpuPlan plan_gpus(Communicator& host) {
  constexpr int64_t kFields = 3;  // node, local rank (-1: the launcher did not say), GPU count
  Tensor mine = Tensor::from_vector<int64_t>(
      {node_id(), launcher_local_rank(), int64_t(cuda_rt::device_count())}, {kFields});
  Tensor all = Tensor::empty({host.size() * kFields}, DType::kI64);
  host.allgather(mine, all)->wait();
  const std::vector<int64_t> v = all.to_vector<int64_t>();
  auto field = [&](int r, int f) { return v[size_t(r * kFields + f)]; };
  std::vector<int64_t> local(size_t(host.size()));
  for (int r = 0; r < host.size(); ++r) {
    local[size_t(r)] = field(r, 1);
    if (local[size_t(r)] < 0) {  // its position among the ranks on its node
      local[size_t(r)] = 0;
      for (int q = 0; q < r; ++q) local[size_t(r)] += field(q, 0) == field(r, 0);
    }
  }
  GpuPlan plan;
  plan.local_rank = int(local[size_t(host.rank())]);
  int problems = 0;
  auto note = [&](const std::string& text) {
    if (++problems <= 4) plan.missing += (plan.missing.empty() ? "" : "; ") + text;
  };
  for (int r = 0; r < host.size(); ++r) {
    const int64_t l = local[size_t(r)];
    if (l >= field(r, 2)) {
      note(detail::str_cat("rank ", r, " is local rank ", l, " on a node with ", field(r, 2),
                           " GPU(s)"));
      continue;
    }
    for (int q = 0; q < r; ++q)
      if (field(q, 0) == field(r, 0) && local[size_t(q)] == l)
        note(detail::str_cat("ranks ", q, " and ", r, " would share GPU ", l,
                             " of one node (the launcher gave both local rank ", l, ")"));
  }
  if (problems > 4) plan.missing += detail::str_cat(" and ", problems - 4, " more");
  return plan;
}

// The NCCL communicator over host's ranks, on GPU `local_rank`, once every rank has one.
std::shared_ptr<Communicator> create(const std::shared_ptr<Communicator>& host, int local_rank) {
  const int device = cuda_rt::select_device_for_local_rank(local_rank);
  g_device = device;
  watch_exit();
  const std::string context =
      detail::str_cat("the creation of the NCCL communicator of group '", host->name(), "' (rank ",
                      host->rank(), " of ", host->size(), ")");
  ncclUniqueId id{};
  if (host->rank() == 0) LOOM_NCCL_CHECK_IN(context, nullptr, ncclGetUniqueId(&id));
  Tensor bytes = Tensor::zeros({int64_t(sizeof id)}, DType::kU8);
  std::memcpy(bytes.data_ptr(), &id, sizeof id);
  host->broadcast(bytes, BroadcastOptions{0})->wait();
  std::memcpy(&id, bytes.data_ptr(), sizeof id);

  ncclConfig_t config = nonblocking_config();
  ncclComm_t comm = nullptr;
  std::string failure;
  try {
    LOOM_NCCL_CHECK_IN(context, nullptr,
                       ncclCommInitRankConfig(&comm, host->size(), id, host->rank(), &config));
  } catch (const CommError& e) {
    failure = e.what();
  }
  if (failure.empty()) failure = settle_state(comm, host->timeout_seconds(), context);
  if (!failure.empty()) {
    if (comm != nullptr) ncclCommAbort(comm);
    throw CommError(failure);
  }
  return std::make_shared<NcclCommunicator>(make_handle(comm, device), host->rank(), host->size(),
                                            host->name());
}

constexpr const char* kOneGpuHint =
    " (use backend mpi, which stages CUDA tensors through the host, or fewer ranks per node)";

}  // namespace

int nccl_device() { return g_device; }

std::shared_ptr<Communicator> make_nccl_communicator(const std::shared_ptr<Communicator>& host) {
  LOOM_CHECK(host != nullptr, "make_nccl_communicator: the host communicator is null");
  const GpuPlan plan = plan_gpus(*host);
  LOOM_CHECK(plan.missing.empty(), "make_nccl_communicator over group '", host->name(),
             "': NCCL needs a GPU of its own for every rank, but ", plan.missing, kOneGpuHint);
  return create(host, plan.local_rank);
}

std::shared_ptr<Communicator> make_mpi_nccl_world(bool required) {
  std::shared_ptr<Communicator> host = make_mpi_world();
  const GpuPlan plan = plan_gpus(*host);
  if (!plan.missing.empty()) {
    LOOM_CHECK(!required, "world: backend nccl needs a GPU of its own for every rank, but ",
               plan.missing, kOneGpuHint);
    // A fresh world: the allgather above must not show in its sequence numbers.
    return make_mpi_world();
  }
  std::shared_ptr<Communicator> nccl = create(host, plan.local_rank);
  return make_device_router(std::move(host), std::move(nccl));
}

}  // namespace loom::comm
