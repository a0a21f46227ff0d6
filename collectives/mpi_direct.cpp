#include "collectives/mpi_direct.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <utility>
#include <vector>

#include "collectives/carried.h"

namespace loom::comm::mpi_impl {

// Note [Direct reduce-scatter]
// Open MPI serves the nonblocking reduce-scatter loom would post from coll/libnbc, and its blocking
// one reduces to a root and scatters; on the shared-memory transport both moved about half of what
// the transport allows (benchmarks/README.md, "Direct reduce-scatter": libnbc at 0.34-0.65x of the
// blocking call at 256 KiB-1 MiB on 4 ranks). So the backend makes every host reduce-scatter
// itself, inside one node and across nodes (Note [Direct collectives inside one node]): each rank
// sends block j of its input straight to rank j (no copy) and receives every other rank's block for
// it into a scratch buffer, then reduces the n blocks in rank order (collectives/carried.h): the
// bits of the carried reduce-scatter, for every message pattern. The scratch is bounded
// (kDirectScratchBytes; a whole-bucket buffer would add a gradient copy to ZeRO's peak): when the
// other ranks' blocks do not fit it, the blocks travel in pieces, two pieces' receives posted at a
// time, and a piece's receives are posted again for the piece two on once it is reduced (into the
// output, whose piece no later message reads). Sends are all posted at once, from the input. A
// piece posted only as an earlier one is reduced needs stepping while the rank waits for anything
// else (Note [Works that post as they go], work.h): a first version without that hung when two
// ranks waited for two reduce-scatters in different orders. Two scratch buffers are kept per group
// for the next calls (host memory, as MPI's own buffers are). The messages go over the check
// channel's communicator, where no user message can match them, each reduce-scatter under a tag of
// its own (kDirectTag and up, counted per group: every rank posts its collectives in the same
// order, the check queue's or, with checks off, the calls'), so that neither a check nor another
// reduce-scatter in flight can match them; within one, a sender's pieces and a receiver's receives
// go in piece order, which MPI's matching keeps. With checks off, a rank calling with another size
// is caught only where a piece arrives short (an error naming both lengths); a longer one is MPI's
// truncation, which Open MPI 4.1's TCP transport turned into a heap overwrite (an unchecked test of
// it crashed a later one across emulated nodes): undefined, as any collective called with different
// sizes without the check.
constexpr size_t kDirectScratchBytes = 4 * 1024 * 1024;
constexpr int64_t kPiecesInFlight = 2;  // per peer: one being reduced while the next arrives

// Note [Direct allreduce]
// An allreduce of host tensors that its check does not carry (Note [Small collectives in their
// check], communicator.cpp) is a direct reduce-scatter (Note [Direct reduce-scatter]) of blocks of
// ceil(count / n) elements, then an allgather of the reduced blocks straight into the output: each
// rank sends its block to every rank and receives rank j's into block j. Measured side by side with
// MPI's blocking allreduce (benchmarks/README.md, "Direct allreduce", medians): on 3, 4 and 8 ranks
// from 64 KiB to 64 MiB this ran at 0.98-1.51x of it where loom's MPI_Iallreduce had run at
// 0.73-1.05x. On 2 ranks, where MPI's allreduce is one exchange of the whole input, it first
// stayed with MPI_Iallreduce from 256 KiB to 16 MiB (Zen 4, 2026-11-30: this 0.90-0.97x,
// MPI_Iallreduce 0.94-1.00x). Measured again on the Zen 5 VM (2026-12-04, after the waits began
// stepping every work in flight; which of the two made the difference was not isolated), direct
// ran at 0.95-1.07x there against MPI_Iallreduce's 0.84-0.97x ("Direct allreduce on 2 ranks"),
// so every group size goes direct. Every block is reduced once, in rank order, by its rank: every
// rank gets the same bits. In place, a block's allgather overwrites what the reduce-scatter sent
// from it, so the allgather is posted once every send has left; it is posted by a step (Note [Works
// that post as they go], work.h), as a later piece is.
bool direct_allreduce_fits(int64_t bytes, int n) {
  // A block's byte count travels as an int (MPI's counts).
  return n >= 2 && bytes / n < int64_t(INT_MAX) / 2;
}

// Note [Direct collectives inside one node]
// The direct reduce-scatter, allreduce and allgather send every rank's block straight to its owner:
// each rank exchanges with every other. Inside one node that is what the shared-memory transport
// does best; across nodes, each node's link then carries L (n - L) / n of the data per phase (L
// ranks of the node, n in all), where a ring whose ranks are in node order crosses it once, (n - 1)
// / n: 1.3x more on 2 nodes of 2 ranks, 1.7x on 4 of 2, on the slowest link. So the allreduce and
// the allgather are used only in groups whose ranks all share a node (MPI_Comm_split_type, at the
// group's construction); a group across nodes keeps MPI's calls for them (and its two levels:
// README.md, "Multi-node on one machine"), whose node-local level is such a group. The
// reduce-scatter is direct in every group: Open MPI's reduce-scatters are no ring either (the
// blocking one reduces to a root and scatters; libnbc's, which loom would post, ran at half the
// transport's speed inside one node: Note [Direct reduce-scatter]), and on emulated nodes the
// direct one beat the libnbc call at every size from 256 KiB (benchmarks/README.md, "Across
// nodes"; loom / MPI's blocking call, libnbc -> direct: 4 x 2 nodes on 1 Gbit/s links 0.72-0.75
// -> 0.98-1.03 at 256 KiB, 0.99-1.00 -> 1.42-1.44 at 16 MiB; unshaped 2 x 2 0.51-0.63 -> 0.96-1.12
// at 1 MiB), but for 2 x 2 on 1 Gbit/s links at 1-4 MiB, where it ran at 0.9-1.0x the libnbc
// call's speed (both above MPI's blocking one).

namespace {

// Bytes of one piece of a block of `block_bytes` sent to each of n - 1 peers: the whole block
// when the peers' blocks fit the scratch, else what fits kPiecesInFlight of them (a multiple of
// 64 bytes, so of every element size).
int64_t direct_piece_bytes(int64_t block_bytes, int n) {
  if (block_bytes * (n - 1) <= int64_t(kDirectScratchBytes)) return block_bytes;
  return std::max<int64_t>(64,
                           int64_t(kDirectScratchBytes) / (kPiecesInFlight * (n - 1)) / 64 * 64);
}

// A reduce-scatter made as Note [Direct reduce-scatter] says, or an allreduce made of one and an
// allgather of the reduced blocks (Note [Direct allreduce]).
class DirectReduction final : public MpiPolledWork {
 public:
  using Kind = DirectReductionKind;

  // `channel`: the communicator the messages travel on (the check channel's). A reduce-scatter's
  // output is this rank's block; an allreduce's is the whole result, cut into blocks of
  // ceil(count / n) elements (the last ones shorter, or empty).
  DirectReduction(Kind kind, std::shared_ptr<CommHandle> channel, OpContext context,
                  double timeout_s, int rank, int n, const Tensor& input, const Tensor& output,
                  ReduceOp op, int tag, SpareScratch spare)
      : MpiPolledWork(std::move(channel), std::move(context), timeout_s),
        kind_(kind),
        rank_(rank),
        n_(n),
        tag_(tag),
        input_(input.detach()),
        output_(output.detach()),
        op_(op),
        total_(int64_t(input.nbytes())),
        block_(kind == Kind::kReduceScatter
                   ? int64_t(output.nbytes())
                   : (input.numel() + n - 1) / n * int64_t(dtype_size(input.dtype()))),
        piece_(direct_piece_bytes(block_, n)),
        pieces_(pieces_of(rank_)),
        window_(std::max<int64_t>(1, std::min(pieces_, pieces_ == 1 ? 1 : kPiecesInFlight))),
        spare_(std::move(spare)) {
    const size_t words = (size_t(window_ * (n_ - 1) * piece_) + 7) / 8;
    scratch_ = take_scratch(*spare_, words);
    receives_.assign(size_t(window_ * (n_ - 1)), MPI_REQUEST_NULL);
    statuses_.resize(size_t(n_ - 1));
    for (int64_t k = 0; k < std::min(window_, pieces_); ++k) post_receives(k);
    for (int i = 1; i < n_; ++i) {  // block j of the input to rank j, piece by piece
      const int to = (rank_ - i + n_) % n_;
      for (int64_t k = 0; k < pieces_of(to); ++k) {
        sends_.push_back(MPI_REQUEST_NULL);
        LOOM_MPI_CHECK_IN(
            this->context(),
            MPI_Isend(bytes_at(input_, 0) + int64_t(to) * block_ + k * piece_,
                      int(piece_bytes(to, k)), MPI_BYTE, to, tag_, comm->comm, &sends_.back()));
      }
    }
    keep_stepping();
  }
  ~DirectReduction() override;

 protected:
  // Reduces the pieces that arrived, in order, posting the receives of the ones after them; an
  // allreduce then posts its allgather once every piece is reduced and sent.
  void step() override {
    while (reduced_ < pieces_) {
      const int64_t k = reduced_;
      MPI_Request* receives = &receives_[size_t((k % window_) * (n_ - 1))];
      if (!test_all(receives, statuses_.data(), n_ - 1, context())) return;
      const int64_t bytes = piece_bytes(rank_, k);
      for (int i = 1; i < n_; ++i)
        check_length(statuses_[size_t(i - 1)], bytes, (rank_ + i) % n_, "block's piece at byte ",
                     k * piece_);
      const void* on_stack[64];
      std::vector<const void*> on_heap(n_ > 64 ? size_t(n_) : 0);
      const void** by_rank = n_ > 64 ? on_heap.data() : on_stack;
      for (int i = 0; i < n_; ++i)
        by_rank[(rank_ + i) % n_] = i == 0 ? own_input() + k * piece_ : slot(k, i);
      const int64_t element = int64_t(dtype_size(output_.dtype()));
      reduce_ranks(by_rank, n_, output_.dtype(), op_, bytes / element, own_output() + k * piece_);
      ++reduced_;
      if (k + window_ < pieces_) post_receives(k + window_);
    }
    if (kind_ == Kind::kAllreduce && gathers_.empty()) {
      // The allgather's receives overwrite the input in place: not before every send has left.
      if (!test_all(sends_.data(), nullptr, int(sends_.size()), context())) return;
      post_gather();
    }
    stop_stepping();  // everything is posted; what is left completes in MPI
  }

  bool poll() override {
    step();
    if (reduced_ < pieces_ || !test_all(sends_.data(), nullptr, int(sends_.size()), context()))
      return false;
    if (kind_ == Kind::kReduceScatter) return true;
    if (gathers_.empty() || !test_all(gathers_, gather_statuses_, context())) return false;
    for (int i = 1; i < n_; ++i) {
      const int from = (rank_ + i) % n_;
      check_length(gather_statuses_[size_t(i - 1)], block_bytes(from), from, "reduced block", 0);
    }
    return true;
  }

  void finish() override {
    // No request uses the scratch any more; two spares serve two reductions in flight.
    if (spare_->size() < 2) spare_->push_back(std::move(scratch_));
    scratch_.reset();
    input_ = output_ = Tensor();
    release_comm();
  }

 private:
  // Bytes of rank j's block, its pieces, and piece k of it.
  int64_t block_bytes(int j) const {
    return std::clamp<int64_t>(total_ - int64_t(j) * block_, 0, block_);
  }
  int64_t pieces_of(int j) const { return (block_bytes(j) + piece_ - 1) / piece_; }
  int64_t piece_bytes(int j, int64_t k) const {
    return std::min(piece_, block_bytes(j) - k * piece_);
  }
  const char* own_input() const { return bytes_at(input_, 0) + int64_t(rank_) * block_; }
  char* own_output() const {
    return bytes_at(output_, 0) + (kind_ == Kind::kAllreduce ? int64_t(rank_) * block_ : 0);
  }
  // Where rank r + i's piece k of this rank's block arrives.
  char* slot(int64_t k, int i) const {
    return reinterpret_cast<char*>(scratch_->data()) +
           ((k % window_) * (n_ - 1) + (i - 1)) * piece_;
  }
  void post_receives(int64_t k) {
    for (int i = 1; i < n_; ++i)
      LOOM_MPI_CHECK_IN(context(), MPI_Irecv(slot(k, i), int(piece_bytes(rank_, k)), MPI_BYTE,
                                             (rank_ + i) % n_, tag_, comm->comm,
                                             &receives_[size_t((k % window_) * (n_ - 1) + i - 1)]));
  }
  // The allgather: this rank's reduced block to every rank, rank j's into block j. Under the same
  // tag: a rank's pieces for this one were all posted before its block, and MPI matches one
  // sender's messages of one tag in the order they were sent.
  void post_gather() {
    gathers_.assign(size_t(2 * (n_ - 1)), MPI_REQUEST_NULL);
    gather_statuses_.resize(gathers_.size());
    for (int i = 1; i < n_; ++i) {
      const int from = (rank_ + i) % n_, to = (rank_ - i + n_) % n_;
      LOOM_MPI_CHECK_IN(context(), MPI_Irecv(bytes_at(output_, 0) + int64_t(from) * block_,
                                             int(block_bytes(from)), MPI_BYTE, from, tag_,
                                             comm->comm, &gathers_[size_t(i - 1)]));
      LOOM_MPI_CHECK_IN(context(), MPI_Isend(own_output(), int(block_bytes(rank_)), MPI_BYTE, to,
                                             tag_, comm->comm, &gathers_[size_t(n_ - 1 + i - 1)]));
    }
  }
  void check_length(const MPI_Status& status, int64_t expected, int from, const char* what,
                    int64_t at) const {
    int got = 0;
    MPI_Get_count(&status, MPI_BYTE, &got);
    if (got == expected) return;
    const char* op = kind_ == Kind::kAllreduce ? "allreduce" : "reduce_scatter";
    throw CommError(loom::detail::str_cat("[rank ", error_rank(), "] ", context().str(), ": rank ",
                                          from, " sent ", got, " bytes of its ", op, " ", what, at,
                                          ", this rank expected ", expected, " (the ranks called ",
                                          op, " with different sizes)"));
  }

  Kind kind_;
  int rank_, n_, tag_;
  Tensor input_, output_;  // what MPI reads and writes and the reduction writes: alive until done
  ReduceOp op_;
  int64_t total_;   // bytes of the input
  int64_t block_;   // bytes from one rank's block to the next (the last blocks may be shorter)
  int64_t piece_;   // bytes of a piece (a block's last may be shorter)
  int64_t pieces_;  // of this rank's block
  int64_t window_;  // pieces whose receives are posted at a time
  int64_t reduced_ = 0;
  SpareScratch spare_;
  ExchangeScratch scratch_;            // window_ x (n - 1) pieces
  std::vector<MPI_Request> receives_;  // window_ x (n - 1), by piece modulo window_
  std::vector<MPI_Status> statuses_;
  std::vector<MPI_Request> sends_;    // every piece to every rank
  std::vector<MPI_Request> gathers_;  // an allreduce's allgather: n - 1 receives, n - 1 sends
  std::vector<MPI_Status> gather_statuses_;
};

DirectReduction::~DirectReduction() {
  stop_stepping();
  if (done()) return;
  // See Note [Abandoned operations].
  if (!settles([this] { return poll(); })) {
    std::vector<MPI_Request> requests = std::move(receives_);
    requests.insert(requests.end(), sends_.begin(), sends_.end());
    requests.insert(requests.end(), gathers_.begin(), gathers_.end());
    abandoned().push_back(Abandoned{
        std::move(requests), {input_, output_}, {}, std::move(scratch_), std::move(comm)});
  }
}

// Note [Direct allgather]
// An allgather of host tensors in a group inside one node (Note [Direct collectives inside one
// node]) that its check does not carry: each rank sends its input to every other rank and receives
// rank j's straight into block j of the output, every message posted at once (nothing to step).
// After the check's round trip, Open MPI's MPI_Iallgather (libnbc) ran at 0.53-0.94x of MPI's
// blocking allgather from 16 to 256 KiB on 2 and 4 ranks, this at 0.67-1.02x; from 1 MiB up both
// ran at MPI's speed (benchmarks/README.md, "Direct allreduce and allgather"). The messages go over
// the check channel's communicator under a tag of their own, as the direct reduce-scatter's do;
// with checks off, a rank that called with another size is caught by the lengths received.
class DirectAllgather final : public MpiPolledWork {
 public:
  DirectAllgather(std::shared_ptr<CommHandle> channel, OpContext context, double timeout_s,
                  int rank, int n, const Tensor& input, const Tensor& output, int tag)
      : MpiPolledWork(std::move(channel), std::move(context), timeout_s),
        rank_(rank),
        n_(n),
        block_(int64_t(input.nbytes())),
        input_(input.detach()),
        output_(output.detach()) {
    const int64_t block = block_;
    char* mine = bytes_at(output_, 0) + int64_t(rank) * block;
    if (mine != bytes_at(input_, 0)) std::memcpy(mine, bytes_at(input_, 0), size_t(block));
    requests_.assign(size_t(2 * (n - 1)), MPI_REQUEST_NULL);
    statuses_.resize(requests_.size());
    for (int i = 1; i < n; ++i) {
      const int from = (rank + i) % n, to = (rank - i + n) % n;
      LOOM_MPI_CHECK_IN(this->context(),
                        MPI_Irecv(bytes_at(output_, 0) + int64_t(from) * block, int(block),
                                  MPI_BYTE, from, tag, comm->comm, &requests_[size_t(i - 1)]));
      LOOM_MPI_CHECK_IN(this->context(), MPI_Isend(mine, int(block), MPI_BYTE, to, tag, comm->comm,
                                                   &requests_[size_t(n - 1 + i - 1)]));
    }
    keep_stepping();  // See Note [MPI requests move in every wait]
  }
  ~DirectAllgather() override;

 protected:
  void step() override {
    if (transported()) stop_stepping();
  }
  bool poll() override {
    if (!transported()) return false;
    for (int i = 1; i < n_; ++i) {  // with checks off, a rank may have called with another size
      int got = 0;
      MPI_Get_count(&statuses_[size_t(i - 1)], MPI_BYTE, &got);
      if (got != block_)
        throw CommError(loom::detail::str_cat(
            "[rank ", error_rank(), "] ", context().str(), ": rank ", (rank_ + i) % n_, " sent ",
            got, " bytes of its allgather input, this rank expected ", block_,
            " (the ranks called allgather with different sizes)"));
    }
    return true;
  }
  void finish() override {
    input_ = output_ = Tensor();
    release_comm();
  }

 private:
  int rank_, n_;
  int64_t block_;          // bytes of every rank's input
  Tensor input_, output_;  // what MPI reads and writes: alive until completion
  // Whether every request completed, in a poll or a step (statuses_ then hold the lengths).
  bool transported() {
    if (!completed_) completed_ = test_all(requests_, statuses_, context());
    return completed_;
  }

  std::vector<MPI_Request> requests_;  // n - 1 receives, then n - 1 sends
  std::vector<MPI_Status> statuses_;
  bool completed_ = false;
};

DirectAllgather::~DirectAllgather() {
  stop_stepping();
  if (done()) return;
  // See Note [Abandoned operations].
  if (!settles([this] { return poll(); }))
    abandoned().push_back(
        Abandoned{std::move(requests_), {input_, output_}, {}, nullptr, std::move(comm)});
}

}  // namespace

WorkPtr direct_reduction(DirectReductionKind kind, std::shared_ptr<CommHandle> channel,
                         OpContext context, double timeout_s, int rank, int n, const Tensor& input,
                         const Tensor& output, ReduceOp op, int tag, SpareScratch spare) {
  return std::make_shared<DirectReduction>(kind, std::move(channel), std::move(context), timeout_s,
                                           rank, n, input, output, op, tag, std::move(spare));
}

WorkPtr direct_allgather(std::shared_ptr<CommHandle> channel, OpContext context, double timeout_s,
                         int rank, int n, const Tensor& input, const Tensor& output, int tag) {
  return std::make_shared<DirectAllgather>(std::move(channel), std::move(context), timeout_s, rank,
                                           n, input, output, tag);
}

}  // namespace loom::comm::mpi_impl
