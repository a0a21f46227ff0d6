// The MPI backend: every op posts nonblocking MPI calls (MPI_Iallreduce, ...; or, for the host
// reductions and allgathers of a group inside one node, loom's own point-to-point messages: Note
// [Direct collectives inside one node]) and returns a work that polls them with MPI_Testall until
// done or past its deadline (See Note [Deadlines] in communicator.cpp). Three decisions that are
// not obvious: See Note [MPI staging] and Note [Abandoned operations] (mpi_work.cpp), and
// all_to_all_impl on why it always posts MPI_Ialltoallv. The works it shares, and the census of
// late ranks, are in mpi_work.{h,cpp}; point-to-point messages in mpi_point_to_point.{h,cpp}; the
// signature check's exchange in mpi_exchange.{h,cpp}; the direct collectives in
// mpi_direct.{h,cpp}.
#include "collectives/mpi_backend.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "collectives/mpi_check.h"
#include "collectives/mpi_direct.h"
#include "collectives/mpi_exchange.h"
#include "collectives/mpi_point_to_point.h"
#include "collectives/mpi_work.h"
#include "collectives/pair_channels.h"
#include "collectives/shared_mailbox.h"
#include "collectives/termination.h"
#include "collectives/topology.h"
#include "collectives/work.h"

namespace loom::comm {

namespace {
int64_t g_max_count = INT_MAX;
}
int64_t mpi_max_count() { return g_max_count; }
void set_mpi_max_count(int64_t count) {
  LOOM_CHECK(count >= 1 && count <= INT_MAX, "set_mpi_max_count: must be in [1, ", INT_MAX,
             "], got ", count);
  g_max_count = count;
}

namespace {

using namespace mpi_impl;  // NOLINT: the backend's own pieces (mpi_*.h)

// How many abandoned ops are still pending (those that finished are dropped).
size_t pending_abandoned() {
  auto& list = abandoned();
  list.erase(std::remove_if(list.begin(), list.end(),
                            [](Abandoned& a) {
                              int flag = 0;
                              int rc = MPI_Testall(int(a.requests.size()), a.requests.data(), &flag,
                                                   MPI_STATUSES_IGNORE);
                              return rc != MPI_SUCCESS || flag != 0;
                            }),
             list.end());
  return list.size();
}

// ---------------------------------------------------------------- leaving the job

// A duplicate of MPI_COMM_WORLD for the exit barrier alone, so it cannot match a collective a
// rank left pending on another communicator. Made when loom initialises MPI.
MPI_Comm g_exit_comm = MPI_COMM_NULL;

[[noreturn]] void mpi_abort_job(int status) {
  if (!mpi_finalized()) MPI_Abort(MPI_COMM_WORLD, status);
  std::_Exit(status);
}

// LOOM_COMM_TIMEOUT as the communicators read it (the world itself is gone by now: it lives in a
// static destroyed before this handler runs); 300 s when unset or unreadable.
double exit_timeout_seconds() {
  if (const char* v = std::getenv("LOOM_COMM_TIMEOUT")) {
    char* end = nullptr;
    const double s = std::strtod(v, &end);
    if (end != v && *end == '\0' && s > 0) return s;
  }
  return 300;
}

// Waits until every rank has reached its exit, up to the collective deadline. False on timeout.
// See Note [Leaving the job] (termination.cpp).
bool exit_barrier(double timeout_s) {
  if (g_exit_comm == MPI_COMM_NULL) return true;
  MPI_Request request = MPI_REQUEST_NULL;
  if (MPI_Ibarrier(g_exit_comm, &request) != MPI_SUCCESS) return true;  // let MPI_Finalize decide
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration<double>(timeout_s);
  const auto note_at = start + std::chrono::seconds(10);
  bool noted = false;
  auto pause = std::chrono::microseconds(50);
  for (;;) {
    int done = 0;
    if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done) return true;
    const auto now = Clock::now();
    if (now >= deadline) return false;
    if (!noted && now >= note_at) {
      noted = true;
      std::fprintf(stderr,
                   "[rank %d] loom: finished; waiting for the other ranks to finish too "
                   "(MPI_Finalize is collective); the job is aborted if they have not within "
                   "%.0f s (LOOM_COMM_TIMEOUT)\n",
                   error_rank(), timeout_s);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(20000));
  }
}

// Runs at exit when loom initialised MPI. See Note [Leaving the job] (termination.cpp).
void finalize_at_exit(int status) {
  if (mpi_finalized()) return;
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size > 1 && status != 0 && !exit_agreed())
    abort_job(status,
              detail::str_cat("this rank is exiting with status ", status, " while the other ",
                              size - 1, " rank(s) may still be waiting for it"));
  if (size_t n = pending_abandoned()) {
    std::fprintf(stderr,
                 "[rank %d] loom: %zu MPI operation(s) never completed (a peer did not join "
                 "them); exiting without MPI_Finalize, which would wait for them\n",
                 error_rank(), n);
    return;
  }
  if (size > 1) {
    const double timeout_s = exit_timeout_seconds();
    if (!exit_barrier(timeout_s))
      abort_job(status != 0 ? status : 1,
                detail::str_cat("this rank exited with status ", status, ", but after ", timeout_s,
                                " s (LOOM_COMM_TIMEOUT) some of the other ranks have neither "
                                "exited nor failed; they are probably waiting for this rank in "
                                "a collective it left (an early sys.exit(0) or return on one "
                                "rank?)"));
  }
  if (g_exit_comm != MPI_COMM_NULL) MPI_Comm_free(&g_exit_comm);
  register_job(1, nullptr);
  MPI_Finalize();
}

#if defined(__GLIBC__)
void finalize_on_exit(int status, void*) { finalize_at_exit(status); }
#else
void finalize_atexit() { finalize_at_exit(0); }  // the status is not known here
#endif

// ---------------------------------------------------------------- types and buffers

// The dtype a reduction runs in: f32 for bf16/f16, else the dtype itself.
DType reduction_dtype(DType t) { return t == DType::kBF16 || t == DType::kF16 ? DType::kF32 : t; }

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return MPI_SUM;  // avg divides in finish()
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
  }
  LOOM_ASSERT(false, "unknown reduce op ", int(op));
}

// avg = sum / group size. Integers use C++ integer division (truncates toward zero).
void divide(const Tensor& host, int n) {
  const int64_t count = host.numel();
  switch (host.dtype()) {
    case DType::kF32: {
      float* p = host.data<float>();
      for (int64_t i = 0; i < count; ++i) p[i] /= float(n);
      break;
    }
    case DType::kI32: {
      int32_t* p = host.data<int32_t>();
      for (int64_t i = 0; i < count; ++i) p[i] /= n;
      break;
    }
    case DType::kI64: {
      int64_t* p = host.data<int64_t>();
      for (int64_t i = 0; i < count; ++i) p[i] /= n;
      break;
    }
    default:
      LOOM_ASSERT(false, "avg on ", dtype_name(host.dtype()));
  }
}

// [offset, count) pieces of n elements, each at most mpi_max_count() long. One (empty) piece
// when n is 0, so that every rank still takes part in the collective.
std::vector<std::pair<int64_t, int>> pieces(int64_t n) {
  const int64_t max = mpi_max_count();
  std::vector<std::pair<int64_t, int>> out;
  for (int64_t offset = 0; offset < n || out.empty(); offset += max)
    out.emplace_back(offset, int(std::min(max, n - offset)));
  return out;
}

// MPI forbids a send buffer that overlaps the receive buffer (outside MPI_IN_PLACE): such a send
// buffer (an output that is a view of the input, say) is copied first.
//
// Note [Reduce-scatter in place]
// ZeRO's buckets are reduce-scattered into their own shards (GradMode::kShardKeep: rank r's
// output is chunk r of its input). Copying the input apart, as above, would hold a whole
// bucket's copy (at ZeRO-1, the whole model's gradients once more) for the call. MPI's in-place
// form takes the input from the receive buffer, the whole input, and leaves this rank's result
// at its start: moved into chunk r once the call completes. The input's other chunks are then
// undefined, as Communicator::reduce_scatter says.
Tensor separate(const Tensor& send, const Tensor& recv) {
  if (send.numel() == 0 || recv.numel() == 0) return send;
  const char* s = bytes_at(send, 0);
  const char* r = bytes_at(recv, 0);
  const bool overlap = s < r + recv.nbytes() && r < s + send.nbytes();
  return overlap ? send.clone() : send;
}

// ---------------------------------------------------------------- the communicator

int comm_rank(MPI_Comm comm) {
  int r = 0;
  LOOM_MPI_CHECK(MPI_Comm_rank(comm, &r));
  return r;
}
int comm_size(MPI_Comm comm) {
  int s = 0;
  LOOM_MPI_CHECK(MPI_Comm_size(comm, &s));
  return s;
}

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (a dup or split; See CommHandle). A group of more than one rank
  // also makes its check channel (Note [Collective signatures]): a duplicate of `comm`, so every
  // rank of the group must construct it at the same point, as after a split.
  MpiCommunicator(MPI_Comm comm, const std::string& name, bool with_check_channel = true)
      : Communicator(comm_rank(comm), comm_size(comm), name),
        handle_(std::make_shared<CommHandle>(comm)),
        comm_(comm) {
    LOOM_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    std::string mpi_name = "loom:" + name;
    LOOM_MPI_CHECK(MPI_Comm_set_name(comm_, mpi_name.c_str()));
    void* value = nullptr;
    int flag = 0;
    LOOM_MPI_CHECK(MPI_Comm_get_attr(comm_, MPI_TAG_UB, &value, &flag));
    tag_ub_ = flag ? *static_cast<int*>(value) : 32767;  // 32767: the least MPI guarantees
    if (with_check_channel && size() > 1) {
      MPI_Comm checks = MPI_COMM_NULL;
      LOOM_MPI_CHECK(MPI_Comm_dup(comm_, &checks));
      checks_ = std::make_unique<MpiCommunicator>(checks, name, false);
      // See Note [Direct collectives inside one node].
      MPI_Comm local = MPI_COMM_NULL;
      LOOM_MPI_CHECK(
          MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank(), MPI_INFO_NULL, &local));
      one_node_ = comm_size(local) == size();
      if (one_node_ && mailboxes_enabled()) {
        const MailboxLayout exchange{size(), exchange_rounds(size()),
                                     size_t(kCheckHeader) + kMailboxCarriedBytes, 2};
        checks_->mailboxes_ = make_segment(exchange, "signature checks");
        // See Note [Point-to-point through mailboxes] (pair_channels.cpp).
        if (size() <= PairChannels::kMaxRanks)
          if (auto boxes = make_segment(PairChannels::layout(size()), "point-to-point messages"))
            channels_ = std::make_shared<PairChannels>(std::move(boxes), rank(), size());
      }
      // See Note [Node-interleaved exchange order] (topology.h).
      if (!one_node_)
        checks_->exchange_order_ =
            std::make_shared<ExchangeOrder>(exchange_order(node_of_ranks(local)));
      LOOM_MPI_CHECK(MPI_Comm_free(&local));
    }
  }
  ~MpiCommunicator() override { post_queued(); }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;
  const char* backend() const override { return "mpi"; }

 protected:
  WorkPtr allreduce_impl(const Tensor& input, Tensor& output, const AllreduceOptions& o,
                         const OpInfo& info) override {
    // See Note [Direct allreduce].
    if (one_node_ && input.device().is_cpu() && output.device().is_cpu() &&
        direct_allreduce_fits(int64_t(input.nbytes()), size()))
      return direct_reduction(DirectReductionKind::kAllreduce, checks_->handle_, context_of(info),
                              timeout_seconds(), rank(), size(), input, output, o.op,
                              next_direct_tag(), spare_direct_);
    const DType rd = reduction_dtype(input.dtype());
    auto w = make_work(info, {input, output});
    Tensor send, recv;  // send undefined: MPI_IN_PLACE on recv
    if (needs_staging(output, rd)) {
      recv = host_values(input, rd);  // a fresh host copy, reduced in place
    } else {
      recv = output.detach();
      if (input.data_ptr() != output.data_ptr()) send = separate(input.detach(), recv);
    }
    w->buffers.insert(w->buffers.end(), {send, recv});
    for (auto [offset, count] : pieces(input.numel())) {
      const void* s = send.defined() ? bytes_at(send, offset) : MPI_IN_PLACE;
      LOOM_MPI_CHECK_IN(w->context(),
                        MPI_Iallreduce(s, bytes_at(recv, offset), count, transport_type(rd),
                                       mpi_op(o.op), comm_, w->next_request()));
    }
    w->then = finish_reduction(recv, output, o.op);
    return w;
  }

  // A reduction's completion: avg divides the sum by the group size, then the result goes from
  // the receive buffer (an f32 or host staging copy, or the output itself) to the output.
  std::function<void()> finish_reduction(const Tensor& recv, const Tensor& output,
                                         ReduceOp op) const {
    return [recv, out = output, op, n = size()] {
      if (op == ReduceOp::kAvg) divide(recv, n);
      store(recv, out);
    };
  }

  WorkPtr reduce_scatter_impl(const Tensor& input, Tensor& output, const ReduceScatterOptions& o,
                              const OpInfo& info) override {
    // See Note [Direct reduce-scatter] (a block MPI's calls would refuse is refused below).
    // A group of one has no check channel for the messages (MPI's call copies).
    if (size() > 1 && input.device().is_cpu() && output.device().is_cpu() &&
        output.numel() <= mpi_max_count() && output.numel() > 0)
      return direct_reduction(DirectReductionKind::kReduceScatter, checks_->handle_,
                              context_of(info), timeout_seconds(), rank(), size(), input, output,
                              o.op, next_direct_tag(), spare_direct_);
    const int count = fits_one_call(info, "output", output.numel());
    const DType rd = reduction_dtype(input.dtype());
    auto w = make_work(info, {input, output});
    // In place (Note [Reduce-scatter in place]): the output is this rank's chunk of the input.
    const bool in_place = !needs_staging(input, rd) && !needs_staging(output, rd) && count > 0 &&
                          input.is_contiguous() &&
                          output.data_ptr() == bytes_at(input, int64_t(rank()) * count);
    if (in_place) {
      Tensor whole = input.detach();
      w->buffers.push_back(whole);
      LOOM_MPI_CHECK_IN(
          w->context(),
          MPI_Ireduce_scatter_block(MPI_IN_PLACE, bytes_at(whole, 0), count, transport_type(rd),
                                    mpi_op(o.op), comm_, w->next_request()));
      const Tensor first = whole.reshape({whole.numel()}).narrow(0, 0, count);
      w->then = [first, out = output, op = o.op, n = size(), r = rank()]() mutable {
        if (op == ReduceOp::kAvg) divide(first, n);
        if (r != 0) out.copy_(first.reshape(out.shape()));  // disjoint chunks: no overlap
      };
      return w;
    }
    Tensor recv = host_buffer(output, rd);
    Tensor send = separate(host_values(input, rd), recv);
    w->buffers.insert(w->buffers.end(), {send, recv});
    LOOM_MPI_CHECK_IN(
        w->context(),
        MPI_Ireduce_scatter_block(bytes_at(send, 0), bytes_at(recv, 0), count, transport_type(rd),
                                  mpi_op(o.op), comm_, w->next_request()));
    w->then = finish_reduction(recv, output, o.op);
    return w;
  }

  WorkPtr allgather_impl(const Tensor& input, Tensor& output, const AllgatherOptions&,
                         const OpInfo& info) override {
    // See Note [Direct allgather].
    if (one_node_ && input.device().is_cpu() && output.device().is_cpu() && input.numel() > 0 &&
        input.numel() <= mpi_max_count() && input.nbytes() <= size_t(INT_MAX))
      return direct_allgather(checks_->handle_, context_of(info), timeout_seconds(), rank(), size(),
                              input, output, next_direct_tag());
    const int count = fits_one_call(info, "input", input.numel());
    const DType dt = input.dtype();
    // In place: the input is this rank's chunk of the output, where MPI_IN_PLACE expects it.
    const bool in_place = !needs_staging(output, dt) && count > 0 &&
                          input.data_ptr() == bytes_at(output, int64_t(rank()) * count);
    auto w = make_work(info, {input, output});
    Tensor recv = host_buffer(output, dt);
    Tensor send = in_place ? Tensor() : separate(host_values(input, dt), recv);
    w->buffers.insert(w->buffers.end(), {send, recv});
    LOOM_MPI_CHECK_IN(
        w->context(),
        MPI_Iallgather(send.defined() ? bytes_at(send, 0) : MPI_IN_PLACE, count, transport_type(dt),
                       bytes_at(recv, 0), count, transport_type(dt), comm_, w->next_request()));
    w->then = [recv, out = output] { store(recv, out); };
    return w;
  }

  WorkPtr broadcast_impl(Tensor& tensor, const BroadcastOptions& o, const OpInfo& info) override {
    const DType dt = tensor.dtype();
    const bool root = rank() == o.root;
    auto w = make_work(info, {tensor});
    Tensor buf = root ? host_values(tensor, dt) : host_buffer(tensor, dt);
    w->buffers.push_back(buf);
    for (auto [offset, count] : pieces(tensor.numel()))
      LOOM_MPI_CHECK_IN(w->context(), MPI_Ibcast(bytes_at(buf, offset), count, transport_type(dt),
                                                 o.root, comm_, w->next_request()));
    if (!root) w->then = [buf, t = tensor] { store(buf, t); };
    return w;
  }

  WorkPtr reduce_impl(const Tensor& input, Tensor& output, const ReduceOptions& o,
                      const OpInfo& info) override {
    const DType rd = reduction_dtype(input.dtype());
    const bool root = rank() == o.root;
    auto w = make_work(info, {input, output});
    Tensor send, recv;  // on the root, send undefined: MPI_IN_PLACE on recv
    if (!root) {
      send = host_values(input, rd);  // recv stays undefined: MPI ignores it off the root
    } else if (needs_staging(output, rd)) {
      recv = host_values(input, rd);
    } else {
      recv = output.detach();
      if (input.data_ptr() != output.data_ptr()) send = separate(input.detach(), recv);
    }
    w->buffers.insert(w->buffers.end(), {send, recv});
    for (auto [offset, count] : pieces(input.numel())) {
      const void* s = send.defined() ? bytes_at(send, offset) : MPI_IN_PLACE;
      void* r = recv.defined() ? bytes_at(recv, offset) : nullptr;
      LOOM_MPI_CHECK_IN(w->context(), MPI_Ireduce(s, r, count, transport_type(rd), mpi_op(o.op),
                                                  o.root, comm_, w->next_request()));
    }
    if (root) {
      w->then = finish_reduction(recv, output, o.op);
    }
    return w;
  }

  // Always MPI_Ialltoallv, even when this rank's splits are all equal: whether the splits are
  // equal is a per-rank fact (a rank may send equal parts yet receive unequal ones), and MPI
  // requires every rank to call the same collective. Open MPI runs equal counts through
  // alltoallv at the same speed in practice.
  WorkPtr all_to_all_impl(const Tensor& input, Tensor& output, const AllToAllOptions& o,
                          const OpInfo& info) override {
    fits_one_call(info, "input", input.numel());  // displacements are ints too
    fits_one_call(info, "output", output.numel());
    const DType dt = input.dtype();
    auto w = make_work(info, {input, output});
    // In place too the input is copied: MPI_IN_PLACE for alltoallv is not in every MPI's
    // nonblocking path, and it would still need a temporary buffer.
    Tensor recv = host_buffer(output, dt);
    Tensor send = separate(host_values(input, dt), recv);
    w->buffers.insert(w->buffers.end(), {send, recv});
    const int n = size();
    w->ints.resize(4 * size_t(n));
    int* send_counts = w->ints.data();
    int* send_displs = send_counts + n;
    int* recv_counts = send_displs + n;
    int* recv_displs = recv_counts + n;
    for (int i = 0, s = 0, r = 0; i < n; ++i) {
      send_counts[i] = int(o.input_splits[size_t(i)]);
      recv_counts[i] = int(o.output_splits[size_t(i)]);
      send_displs[i] = s;
      recv_displs[i] = r;
      s += send_counts[i];
      r += recv_counts[i];
    }
    LOOM_MPI_CHECK_IN(w->context(),
                      MPI_Ialltoallv(bytes_at(send, 0), send_counts, send_displs,
                                     transport_type(dt), bytes_at(recv, 0), recv_counts,
                                     recv_displs, transport_type(dt), comm_, w->next_request()));
    w->then = [recv, out = output] { store(recv, out); };
    return w;
  }

  // Whether MPI carries `op`'s tensor as it is: on the host, of a type MPI has, in one message.
  static bool carried_as_is(const P2POp& op) {
    return !needs_staging(op.tensor, op.tensor.dtype()) && op.tensor.numel() <= mpi_max_count();
  }

  // See Note [A single message's cost].
  WorkPtr p2p_impl(const P2POp& op, const OpInfo& info) override {
    // The rest, and a tag beyond MPI's (which batch_p2p_impl names), go the general way.
    if (op.tag > tag_ub_ || !carried_as_is(op)) return batch_p2p_impl({op}, info);
    if (channels_) return channel_p2p(op, info);
    const bool recv = op.kind == P2POp::Kind::kRecv;
    const int count = int(op.tensor.numel());
    const MPI_Datatype type = transport_type(op.tensor.dtype());
    void* data = count > 0 ? op.tensor.data_ptr() : nullptr;
    MPI_Request request = MPI_REQUEST_NULL;
    const int posted = recv ? MPI_Irecv(data, count, type, op.peer, op.tag, comm_, &request)
                            : MPI_Isend(data, count, type, op.peer, op.tag, comm_, &request);
    if (posted != MPI_SUCCESS)
      check_mpi(posted, recv ? "MPI_Irecv" : "MPI_Isend", __FILE__, __LINE__, context_of(info));
    int complete = 0;
    MPI_Status status{};
    const int tested = MPI_Test(&request, &complete, &status);
    if (tested == MPI_SUCCESS && !complete)
      return message_work(handle_, context_of(info), timeout_seconds(), op, type, request);
    // Complete, or failed (a longer message is MPI_ERR_TRUNCATE): a failure is raised by the
    // work's wait, as for a message still in flight, not by this call (its peer may still wait
    // for this rank's next message).
    try {
      if (tested != MPI_SUCCESS)
        check_mpi(tested, "MPI_Test", __FILE__, __LINE__, context_of(info));
      if (const int got = recv ? received_count(status, type) : count; got != count)
        throw short_receive(context_of(info), op.peer, op.tag, got, count);
    } catch (const CommError&) {
      handle_->failed = true;  // as a Work whose wait raised
      return failed_work(std::current_exception());
    }
    handle_->failed = false;  // the group works again, as when a PointToPointWork completes
    return completed_work();
  }

  WorkPtr batch_p2p_impl(const std::vector<P2POp>& ops, const OpInfo& info) override {
    for (const P2POp& p : ops)
      LOOM_CHECK(p.tag <= tag_ub_, describe(info), ": tag ", p.tag,
                 " is above this MPI's limit MPI_TAG_UB = ", tag_ub_);
    if (ops.size() == 1 && carried_as_is(ops[0])) return p2p_impl(ops[0], info);
    if (channels_) {  // every message of the group goes through them, in order
      const OpContext context = context_of(info);
      std::vector<ChannelMessage> messages(ops.size());
      for (size_t i = 0; i < ops.size(); ++i) {
        const P2POp& p = ops[i];
        ChannelMessage& m = messages[i];
        const DType dt = p.tensor.dtype();
        m.recv = p.kind == P2POp::Kind::kRecv;
        m.peer = p.peer;
        m.tag = p.tag;
        m.buffer = m.recv ? host_buffer(p.tensor, dt) : host_values(p.tensor, dt);
        if (m.recv && needs_staging(p.tensor, dt)) m.result = p.tensor;
        post_channel_message(m, *channels_, comm_, context);
      }
      return channel_work(handle_, context, timeout_seconds(), channels_, std::move(messages));
    }
    auto w = make_work(info, {});
    struct Expect {  // a receive piece, checked for its length once complete
      size_t request;
      int count;
      MPI_Datatype type;
      int peer;
      int tag;
    };
    std::vector<Expect> expect;
    std::vector<std::pair<Tensor, Tensor>> results;  // (host buffer, tensor) of staged receives
    for (const P2POp& p : ops) {
      const DType dt = p.tensor.dtype();
      const bool is_send = p.kind == P2POp::Kind::kSend;
      Tensor buf = is_send ? host_values(p.tensor, dt) : host_buffer(p.tensor, dt);
      w->buffers.insert(w->buffers.end(), {p.tensor, buf});
      if (!is_send && needs_staging(p.tensor, dt)) results.emplace_back(buf, p.tensor);
      // Pieces of one message keep their order (MPI does not overtake on one tag and peer).
      for (auto [offset, count] : pieces(p.tensor.numel())) {
        if (is_send) {
          LOOM_MPI_CHECK_IN(w->context(),
                            MPI_Isend(bytes_at(buf, offset), count, transport_type(dt), p.peer,
                                      p.tag, comm_, w->next_request()));
        } else {
          expect.push_back(Expect{w->requests.size(), count, transport_type(dt), p.peer, p.tag});
          LOOM_MPI_CHECK_IN(w->context(),
                            MPI_Irecv(bytes_at(buf, offset), count, transport_type(dt), p.peer,
                                      p.tag, comm_, w->next_request()));
        }
      }
    }
    w->statuses.resize(w->requests.size());
    MpiWork* raw = w.get();  // `then` runs inside the work, so the pointer outlives it
    w->then = [raw, expect = std::move(expect), results = std::move(results)] {
      for (const Expect& e : expect)  // See received_count
        if (const int got = received_count(raw->statuses[e.request], e.type); got != e.count)
          throw short_receive(raw->context(), e.peer, e.tag, got, e.count);
      for (const auto& [buf, t] : results) store(buf, t);
    };
    return w;
  }

  // A send or receive of a host tensor through the group's channels (Note [Point-to-point
  // through mailboxes], pair_channels.cpp). A small one whose mailbox has room, or whose message
  // is here, completes as it is posted and allocates nothing.
  WorkPtr channel_p2p(const P2POp& op, const OpInfo& info) {
    ChannelMessage m;
    m.recv = op.kind == P2POp::Kind::kRecv;
    m.peer = op.peer;
    m.tag = op.tag;
    m.buffer = op.tensor;
    post_channel_message(m, *channels_, comm_, context_of(info));
    if (!m.waiting_send && !m.waiting_recv && m.transport.empty() && m.error.empty()) {
      handle_->failed = false;  // the group works again, as when a work completes
      return completed_work();
    }
    std::vector<ChannelMessage> messages(1);
    messages[0] = std::move(m);
    return channel_work(handle_, context_of(info), timeout_seconds(), channels_,
                        std::move(messages));
  }

  size_t check_payload_limit() const override {
    return mailboxes_ ? kMailboxCarriedBytes : kCarriedBytes;
  }

  // Note [Carried across nodes]
  // In a group spanning nodes a collective's check costs a network round trip before MPI's
  // call (its own rounds across nodes after it), where a carried one crosses once for both; and
  // with the exchange's ranks interleaved by node (Note [Node-interleaved exchange order],
  // topology.h) a carried allgather sends each block across a node's link once, as few bytes as
  // any allgather can. Measured on emulated nodes (benchmarks/README.md, "Across nodes: the
  // check's exchange"; loom / MPI_Allgather, carried against not): allgather 16-256 KiB 0.52-0.65
  // -> 0.88-1.29 on 2 x 2, 0.38-0.76 -> 0.77-1.15 on 4 x 2; a 16 KiB allreduce as an allgather
  // of its inputs (64 KiB over 2 x 2, 128 KiB over 4 x 2) 0.89-1.08 -> 1.22-1.49, level at 256
  // KiB; a 64 KiB allreduce in two phases 0.70-0.74 -> 0.79-0.88 (worse from 128 KiB:
  // 0.59-0.68 against 0.73-0.85). Reduce-scatters carried up to 256 KiB moved within the noise
  // and keep the sizes measured inside one node. Whether the group spans nodes is the same answer
  // on every rank of it (MPI_Comm_split_type), so every rank still decides alike.
  size_t carried_limit(CheckPayload::Kind kind) const override {
    if (!one_node_ && kind == CheckPayload::Kind::kAllgather) return kCarriedBytes;
    if (!one_node_ && kind == CheckPayload::Kind::kAllreduceByAllgather) return 128 * 1024;
    if (!one_node_ && kind == CheckPayload::Kind::kAllreduce) return 64 * 1024;
    // Through mailboxes in shared memory a carried collective is cheaper than the sizes above
    // were set for, so every kind is carried up to what a slot holds. Measured on a 2-vCPU Xeon VM
    // (loom / MPI's call, medians of 4 runs, before -> after): allgather on 4 ranks 16-64 KiB
    // 0.84-0.87 -> 1.70-2.96, on 2 ranks 32-64 KiB 0.80-0.84 -> 1.01-1.18; a 64 KiB allreduce
    // 0.95 -> 1.45 (4 ranks), 0.99 -> 1.08 (2). Slots of 256 KiB, carrying up to that, were no
    // better: a 64 KiB allreduce on 4 ranks went as the allgather of its inputs and fell to 1.12,
    // a 256 KiB allgather to 0.81 (3 runs).
    if (checks_ && checks_->mailboxes_ && kind != CheckPayload::Kind::kNone)
      return kMailboxCarriedBytes;
    return Communicator::carried_limit(kind);
  }

  WorkPtr check_exchange_impl(int64_t* pair, const CheckPayload& payload,
                              const OpInfo& info) override {
    LOOM_ASSERT(payload.bytes(size()) <= kCarriedBytes &&
                    (payload.block == 0 || payload.kind == CheckPayload::Kind::kNone ||
                     (payload.input != nullptr && payload.output != nullptr)),
                "signature exchange carrying ", payload.bytes(size()), " bytes");
    // By value, not `this`: the work keeps the MPI communicator alive, not the group.
    return signature_exchange(handle_, context_of(info), timeout_seconds(), rank(), size(),
                              exchange_order_, pair, payload, spare_scratch_, mailboxes_);
  }

  WorkPtr barrier_impl(const BarrierOptions&, const OpInfo& info) override {
    auto w = make_work(info, {});
    LOOM_MPI_CHECK_IN(w->context(), MPI_Ibarrier(comm_, w->next_request()));
    return w;
  }

  // MPI_Comm_split blocks until every rank of the group calls it, which could hang on a rank that
  // never does. So first a polled allgather of (color, key) with the usual deadline: once it
  // completes, every rank has reached split, and the blocking call cannot hang.
  std::shared_ptr<Communicator> split_impl(int color, int key, const std::string& name) override {
    const OpInfo info{"split", sequence_number(), sizeof(int) * 2 * size_t(size())};
    auto w = make_work(info, {});
    w->ints = {color, key};
    w->ints.resize(2 + 2 * size_t(size()));
    LOOM_MPI_CHECK_IN(w->context(), MPI_Iallgather(w->ints.data(), 2, MPI_INT, w->ints.data() + 2,
                                                   2, MPI_INT, comm_, w->next_request()));
    w->wait();
    MPI_Comm sub = MPI_COMM_NULL;
    LOOM_MPI_CHECK_IN(w->context(), MPI_Comm_split(comm_, color, key, &sub));
    return std::make_shared<MpiCommunicator>(sub, name);
  }

 private:
  std::shared_ptr<MpiWork> make_work(const OpInfo& info, std::vector<Tensor> keep) {
    auto w = std::make_shared<MpiWork>(handle_, context_of(info), timeout_seconds());
    w->buffers.reserve(keep.size());
    for (Tensor& t : keep)
      if (t.defined()) w->buffers.push_back(std::move(t));
    return w;
  }

  // The count as an int for an op MPI cannot split into pieces. See mpi_max_count().
  int fits_one_call(const OpInfo& info, const char* what, int64_t count) const {
    LOOM_CHECK(count <= mpi_max_count(), describe(info), ": ", what, " of ", count,
               " elements is more than one MPI call carries (", mpi_max_count(),
               "; MPI counts are int); split it into smaller ", info.op, "s");
    return int(count);
  }

  Communicator* check_channel() override { return checks_.get(); }

  // Each group rank's node, numbered by first rank (as comm::node_map's), from `local`: this
  // rank's MPI_COMM_TYPE_SHARED part of comm_, ordered by group rank. Collective over comm_.
  std::vector<int> node_of_ranks(MPI_Comm local) const {
    MPI_Group group = MPI_GROUP_NULL, local_group = MPI_GROUP_NULL;
    LOOM_MPI_CHECK(MPI_Comm_group(comm_, &group));
    LOOM_MPI_CHECK(MPI_Comm_group(local, &local_group));
    int first = 0, first_rank = -1;  // the node's first rank, as a group rank
    LOOM_MPI_CHECK(MPI_Group_translate_ranks(local_group, 1, &first, group, &first_rank));
    LOOM_MPI_CHECK(MPI_Group_free(&local_group));
    LOOM_MPI_CHECK(MPI_Group_free(&group));
    std::vector<int> first_of(size_t(size()), -1);
    LOOM_MPI_CHECK(MPI_Allgather(&first_rank, 1, MPI_INT, first_of.data(), 1, MPI_INT, comm_));
    std::vector<int> node_of(first_of.size()), firsts;
    for (size_t r = 0; r < first_of.size(); ++r) {
      auto it = std::find(firsts.begin(), firsts.end(), first_of[r]);
      node_of[r] = int(it - firsts.begin());
      if (it == firsts.end()) firsts.push_back(first_of[r]);
    }
    return node_of;
  }

  // A segment of mailboxes in shared memory (Note [Mailboxes in shared memory],
  // shared_mailbox.cpp) for the group's `what`, made over comm_, collectively: null on every rank
  // unless every rank of the group mapped it.
  std::unique_ptr<SharedMailboxes> make_segment(const MailboxLayout& layout,
                                                const char* what) const {
    struct {
      uint64_t cookie = 0;  // 0: the creator failed
      char name[48] = {};
    } id;
    std::string why;
    std::unique_ptr<SharedMailboxes> boxes;
    if (rank() == 0) {
      static uint64_t made = 0;
      // Tells this segment from a stale one of the same name (a dead job's with this pid). Not
      // std::random_device, which may throw here, on rank 0 alone, while the others wait below.
      id.cookie =
          (uint64_t(Clock::now().time_since_epoch().count()) ^ uint64_t(getpid()) << 40 ^ made) | 1;
      std::snprintf(id.name, sizeof id.name, "/loom-%d-%llu", int(getpid()),
                    static_cast<unsigned long long>(made++));
      boxes = SharedMailboxes::create(id.name, id.cookie, rank(), layout, why);
      if (!boxes) id.cookie = 0;
    }
    LOOM_MPI_CHECK(MPI_Bcast(&id, int(sizeof id), MPI_BYTE, 0, comm_));
    if (rank() != 0 && id.cookie != 0)
      boxes = SharedMailboxes::open(id.name, id.cookie, rank(), layout, why);
    int mapped = boxes != nullptr, everywhere = 0;
    LOOM_MPI_CHECK(MPI_Allreduce(&mapped, &everywhere, 1, MPI_INT, MPI_MIN, comm_));
    if (rank() == 0 && id.cookie != 0) SharedMailboxes::unlink(id.name);
    static bool told = false;  // once per process: every later group would say the same
    if (!why.empty() && !told) {
      told = true;
      std::fprintf(stderr,
                   "[rank %d] loom: note: group '%s' sends its %s through MPI, not shared "
                   "memory (%s)\n",
                   error_rank(), name().c_str(), what, why.c_str());
    }
    return everywhere ? std::move(boxes) : nullptr;
  }

  std::shared_ptr<CommHandle> handle_;
  MPI_Comm comm_;           // handle_->comm
  MailboxesPtr mailboxes_;  // as the check channel of a group inside one node: Note [Mailboxes ...]
  std::shared_ptr<PairChannels> channels_;  // sends and receives inside one node, or null
  int tag_ub_ = 32767;
  std::unique_ptr<MpiCommunicator> checks_;  // the check channel; null at size 1
  // As the check channel: scratch buffers of completed signature exchanges, for the next one, and
  // the order their rounds run in (the group's creator sets it when the group spans nodes).
  SpareScratch spare_scratch_ = std::make_shared<std::vector<ExchangeScratch>>();
  ExchangeOrderPtr exchange_order_ =  // one node: group-rank order
      std::make_shared<ExchangeOrder>(exchange_order(std::vector<int>(size_t(size()), 0)));
  // The direct reduce-scatters' scratch buffers (Note [Direct reduce-scatter]).
  SpareScratch spare_direct_ = std::make_shared<std::vector<ExchangeScratch>>();
  bool one_node_ = false;      // every rank shares this rank's node: Note [Direct collectives ...]
  uint64_t direct_posts_ = 0;  // the direct reduce-scatters posted: every rank's count alike
  int next_direct_tag() {
    return kDirectTag + int(direct_posts_++ % uint64_t(tag_ub_ - kDirectTag + 1));
  }
};

}  // namespace

std::shared_ptr<Communicator> make_mpi_world() {
  LOOM_CHECK(!mpi_finalized(),
             "make_mpi_world: MPI was already finalised; the world must be "
             "created before MPI_Finalize");
  int initialized = 0;
  LOOM_MPI_CHECK(MPI_Initialized(&initialized));
  if (!initialized) {
    // loom's collectives are nonblocking (MPI_Iallreduce, so waits keep their deadlines). Open
    // MPI serves those from coll/libnbc, whose default allreduce on fewer than 4 ranks or in
    // place is binomial reduce + broadcast: 0.78x the blocking call's bandwidth at 1 MiB on 2
    // ranks. Its reduce-scatter + allgather (algorithm 3) matches or beats the blocking call
    // there. A value the user set (environment or mpirun --mca) wins: overwrite = 0.
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", 0);
    int provided = 0;
    LOOM_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided));
    // MPI initialised by loom is finalised by loom; one the program initialised is its own.
    // glibc's on_exit hands the handler the exit status: See Note [Leaving the job].
#if defined(__GLIBC__)
    on_exit(finalize_on_exit, nullptr);
#else
    std::atexit(finalize_atexit);
#endif
    LOOM_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    LOOM_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &g_exit_comm));
  }
  start_census();  // See Note [Late ranks]
  {                // See Note [Polling a mailbox on a shared core]
    MPI_Comm node = MPI_COMM_NULL;
    LOOM_MPI_CHECK(
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    g_ranks_outnumber_cores = comm_size(node) > sysconf(_SC_NPROCESSORS_ONLN);
    LOOM_MPI_CHECK(MPI_Comm_free(&node));
  }
  MPI_Comm comm = MPI_COMM_NULL;
  LOOM_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  auto world = std::make_shared<MpiCommunicator>(comm, "world");
  set_error_rank(world->rank());
  register_job(world->size(), mpi_abort_job);
  install_termination_report();
  return world;
}

}  // namespace loom::comm
