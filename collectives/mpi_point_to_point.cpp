#include "collectives/mpi_point_to_point.h"

#include <algorithm>
#include <utility>

#include "collectives/recycled.h"

namespace loom::comm::mpi_impl {

// Note [A single message's cost]
// (In a group inside one node of at most PairChannels::kMaxRanks ranks, messages go through the
// group's channels instead: Note [Point-to-point through mailboxes], pair_channels.cpp.)
// send() and recv() of a host buffer MPI carries as it is (a pipeline's activations, a
// ping-pong) skip batch_p2p's general machinery (request and status vectors, closures that check
// lengths and copy staged receives back), which allocated nine to eleven times per call. And
// the message is tested once right after it is posted: a small send is complete as soon as the
// transport has copied it out (eager, on shared memory up to 4 KiB), a receive whose message has
// already arrived is complete too; such a call returns the shared completed work and allocates
// nothing. Only a message still in flight gets a PointToPointWork, which owns its request. The
// one test costs one turn of MPI's progress engine when the message is not complete, which the
// wait would have spent anyway.

// Elements a completed receive got. A shorter message than the buffer arrives without an MPI
// error, so each receive compares this with its length (a longer one is MPI_ERR_TRUNCATE,
// except that Open MPI 4.1 truncates a message a rank sends to itself without a word).
int received_count(const MPI_Status& status, MPI_Datatype type) {
  int got = 0;
  MPI_Get_count(&status, type, &got);
  return got;
}

CommError short_receive(const OpContext& context, int peer, int tag, int got, int expected) {
  return CommError(loom::detail::str_cat(
      "[rank ", error_rank(), "] ", context.str(), ": recv from rank ", peer, " with tag ", tag,
      " got ", got, " elements, expected ", expected, " (the matching send is shorter)"));
}

namespace {

// An operation that failed as it was posted: its wait and test raise the error.
class FailedWork final : public Work {
 public:
  explicit FailedWork(std::exception_ptr error) : error_(std::move(error)) {}
  void wait() override { std::rethrow_exception(error_); }
  bool test() override { std::rethrow_exception(error_); }

 private:
  std::exception_ptr error_;
};

// A send or receive posted and not yet complete (Note [A single message's cost]).
class PointToPointWork final : public MpiPolledWork {
 public:
  PointToPointWork(std::shared_ptr<CommHandle> handle, OpContext context, double timeout_s,
                   const P2POp& op, MPI_Datatype type, MPI_Request posted)
      : MpiPolledWork(std::move(handle), std::move(context), timeout_s),
        tensor_(op.tensor),
        recv_(op.kind == P2POp::Kind::kRecv),
        count_(int(op.tensor.numel())),
        type_(type),
        peer_(op.peer),
        tag_(op.tag),
        request_(posted) {
    keep_stepping();  // See Note [MPI requests move in every wait]
  }
  ~PointToPointWork() override;

 protected:
  void step() override {
    if (poll()) stop_stepping();
  }
  bool poll() override {
    if (completed_) return true;
    int flag = 0;
    check_mpi(MPI_Test(&request_, &flag, &status_), "MPI_Test", __FILE__, __LINE__, context());
    completed_ = flag != 0;
    return completed_;
  }

  void finish() override {
    tensor_ = Tensor();
    release_comm();
    if (!recv_) return;
    if (const int got = received_count(status_, type_); got != count_)
      throw short_receive(context(), peer_, tag_, got, count_);
  }

 private:
  Tensor tensor_;  // what MPI reads or writes: alive until completion
  bool recv_;
  int count_;
  MPI_Datatype type_;
  int peer_, tag_;
  MPI_Request request_;
  MPI_Status status_{};
  bool completed_ = false;  // in a poll or a step; status_ holds what arrived
};

PointToPointWork::~PointToPointWork() {
  stop_stepping();
  if (done()) return;
  // See Note [Abandoned operations].
  if (!settles([this] { return poll(); }))
    abandoned().push_back(Abandoned{{request_}, {tensor_}, {}, nullptr, std::move(comm)});
}

// Announced bytes travel in pieces MPI counts in an int.
constexpr size_t kTransportPiece = size_t(1) << 30;

void post_pieces(ChannelMessage& m, char* data, size_t bytes, MPI_Comm comm,
                 const OpContext& context) {
  for (size_t offset = 0; offset < bytes; offset += kTransportPiece) {
    const int count = int(std::min(kTransportPiece, bytes - offset));
    m.transport.push_back(MPI_REQUEST_NULL);
    const int rc =
        m.recv
            ? MPI_Irecv(data + offset, count, MPI_BYTE, m.peer, m.tag, comm, &m.transport.back())
            : MPI_Isend(data + offset, count, MPI_BYTE, m.peer, m.tag, comm, &m.transport.back());
    if (rc != MPI_SUCCESS)
      check_mpi(rc, m.recv ? "MPI_Irecv" : "MPI_Isend", __FILE__, __LINE__, context);
  }
}

// A receive whose message arrived (`arrival`, of `got` bytes): its length checked, an announced
// message's bytes posted (into scratch when the length is wrong, so its sender completes).
void arrived(ChannelMessage& m, PairChannels::Arrival arrival, size_t got, MPI_Comm comm,
             const OpContext& context) {
  const size_t expected = m.buffer.nbytes();
  if (got != expected) {
    const size_t element = dtype_size(m.buffer.dtype());
    m.error = loom::detail::str_cat(
        "[rank ", error_rank(), "] ", context.str(), ": recv from rank ", m.peer, " with tag ",
        m.tag, " got ", got / element, " elements, expected ", expected / element,
        got < expected ? " (the matching send is shorter)" : " (the matching send is longer)");
  }
  if (arrival != PairChannels::Arrival::kAnnounced) return;
  if (got != expected) {
    m.discard = Tensor::empty({int64_t(got)}, DType::kU8);
    post_pieces(m, bytes_at(m.discard, 0), got, comm, context);
  } else {
    post_pieces(m, bytes_at(m.buffer, 0), got, comm, context);
  }
}

// Sends and receives of one call through the group's PairChannels, in flight.
class ChannelWork final : public MpiPolledWork {
 public:
  ChannelWork(std::shared_ptr<CommHandle> handle, OpContext context, double timeout_s,
              std::shared_ptr<PairChannels> channels, std::vector<ChannelMessage> messages)
      : MpiPolledWork(std::move(handle), std::move(context), timeout_s),
        channels_(std::move(channels)),
        messages_(std::move(messages)) {
    // A message waiting in a mailbox, or whose bytes MPI carries, moves on in any wait (Note
    // [Works that post as they go]): its peer may be waiting, before it receives, for something
    // this rank does next. MPI moves announced bytes only inside MPI calls (a sender's fragments
    // on shared memory), and a wait for mailboxes alone makes none: with a large send in flight,
    // a wait for its peer's small answer made no progress for 1000 polls, until the wait's slow
    // part probed MPI. Measured on the 2-vCPU Xeon VM, a 400 KB send then a wait for its 4-byte
    // answer, per round: 82-86 -> 50-51 us on 2 ranks, 2260-2480 -> 72-99 us on 4 (1.3-2.2x
    // faster at 16 MB).
    keep_stepping();
  }
  ~ChannelWork() override;

 protected:
  void step() override {
    if (in_mailboxes() && transported()) stop_stepping();
  }
  bool poll() override {
    if (!in_mailboxes()) {
      if (g_ranks_outnumber_cores) std::this_thread::yield();  // Note [Polling a mailbox on a ...]
      return false;
    }
    return transported();
  }
  void finish() override {
    release_comm();
    std::vector<ChannelMessage> messages = std::move(messages_);
    for (ChannelMessage& m : messages)
      if (!m.error.empty()) throw CommError(m.error);
    for (ChannelMessage& m : messages)
      if (m.result.defined()) store(m.buffer, m.result);
  }

 private:
  // Takes the mailboxes' arrivals and sends what has room: whether every message is past its
  // mailbox (sent into it, or its own arrived), with every announced receive's bytes posted.
  bool in_mailboxes() {
    channels_->progress();
    bool all = true;
    for (ChannelMessage& m : messages_) {
      if (m.waiting_send && m.waiting_send->in_mailbox) m.waiting_send.reset();
      if (m.waiting_recv && m.waiting_recv->arrival != PairChannels::Arrival::kWaiting) {
        const std::shared_ptr<PairChannels::Receive> r = std::move(m.waiting_recv);
        arrived(m, r->arrival, r->got, comm->comm, context());
      }
      all = all && !m.waiting_send && !m.waiting_recv;
    }
    return all;
  }

  // Whether the bytes MPI carries (announced messages') have all gone: one turn of MPI's
  // progress engine when they have not.
  bool transported() {
    for (ChannelMessage& m : messages_)
      if (!m.transport.empty() &&
          !test_all(m.transport.data(), nullptr, int(m.transport.size()), context()))
        return false;
    return true;
  }

  std::shared_ptr<PairChannels> channels_;
  std::vector<ChannelMessage> messages_;
};

ChannelWork::~ChannelWork() {
  stop_stepping();
  if (done()) return;
  // See Note [Abandoned operations]. What still waits in the channels is forgotten there (a
  // message that arrives for a forgotten receive goes to the next one posted).
  if (settles([this] { return poll(); })) return;
  Abandoned a{{}, {}, {}, nullptr, std::move(comm)};
  for (ChannelMessage& m : messages_) {
    if (m.waiting_send) channels_->cancel(m.waiting_send);
    if (m.waiting_recv) channels_->cancel(m.waiting_recv);
    a.requests.insert(a.requests.end(), m.transport.begin(), m.transport.end());
    a.buffers.push_back(m.buffer);
    if (m.discard.defined()) a.buffers.push_back(m.discard);  // MPI may still write it
  }
  abandoned().push_back(std::move(a));
}

}  // namespace

void post_channel_message(ChannelMessage& m, PairChannels& channels, MPI_Comm comm,
                          const OpContext& context) {
  const size_t bytes = m.buffer.nbytes();
  char* data = bytes > 0 ? bytes_at(m.buffer, 0) : nullptr;
  if (!m.recv) {
    m.waiting_send = channels.send(m.peer, m.tag, data, bytes);
    if (bytes > PairChannels::kInlineBytes) post_pieces(m, data, bytes, comm, context);
    return;
  }
  size_t got = 0;
  const PairChannels::Arrival arrival =
      channels.receive(m.peer, m.tag, data, bytes, got, m.waiting_recv);
  if (arrival != PairChannels::Arrival::kWaiting) arrived(m, arrival, got, comm, context);
}

WorkPtr failed_work(std::exception_ptr error) {
  return std::make_shared<FailedWork>(std::move(error));
}

WorkPtr message_work(std::shared_ptr<CommHandle> handle, OpContext context, double timeout_s,
                     const P2POp& op, MPI_Datatype type, MPI_Request posted) {
  return make_recycled<PointToPointWork>(std::move(handle), std::move(context), timeout_s, op, type,
                                         posted);
}

WorkPtr channel_work(std::shared_ptr<CommHandle> handle, OpContext context, double timeout_s,
                     std::shared_ptr<PairChannels> channels, std::vector<ChannelMessage> messages) {
  return std::make_shared<ChannelWork>(std::move(handle), std::move(context), timeout_s,
                                       std::move(channels), std::move(messages));
}

}  // namespace loom::comm::mpi_impl
