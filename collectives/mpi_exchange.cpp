#include "collectives/mpi_exchange.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <thread>

#include "collectives/carried.h"
#include "collectives/recycled.h"

namespace loom::comm::mpi_impl {

// Note [Signature exchange]
// The check channel's exchange (Note [Collective signatures]) is a max over the group plus, for
// a carried collective (Note [Small collectives in their check]), the collective itself. It runs
// over the ranks laid out in the group's exchange order (Note [Node-interleaved exchange order]
// in topology.h: group-rank order inside one node); "position" below is a place in that order.
// The first phase is ceil(log2 n) rounds of one send and one receive per rank, whatever the call:
// in round k the rank at position p sends to position p - 2^k and receives from p + 2^k, with
// tag k. Each message is [max hash, max ~hash, payload bytes that follow, payload]; a rank folds
// the pair it receives into its own, so after the rounds every rank has the max over every rank
// (a dissemination). The payload depends on the call:
// - none (a plain check, or a barrier);
// - an allgather's blocks, as Bruck's allgather: position p holds the blocks of positions p,
//   p+1, ... (mod n) and in round k sends the first min(2^k, n - held) it holds, receiving
//   p + 2^k's, which continue its own (the smallest allreduces too: each rank then reduces all
//   inputs);
// - a reduction's blocks (reduce_scatter, allreduce: its input cut into n blocks, block j for
//   rank j), as Bruck's all-to-all: position p keeps at index i the block bound for position
//   p - i and in round k sends those at the indices with bit k set, receiving p + 2^k's at the
//   same indices; after the rounds index i holds position p + i's block for p. Each rank then
//   reduces its blocks in rank order (collectives/carried.h), so the result has the same bits on
//   every rank, for every message pattern and every order. An allreduce then gathers the reduced
//   blocks, as an allgather's, in a second phase (tags 32 + k) that only a group whose check
//   agreed runs.
// Outputs are written only when the check agrees: nothing of a mismatched call is touched.
// In a group whose ranks share a node the messages go through mailboxes in shared memory instead
// of MPI_Isend / MPI_Irecv (Note [Mailboxes in shared memory], shared_mailbox.cpp): the same
// rounds, the same messages, one mailbox per round standing for the round's tag.
// Every receive has room for the largest message any call may send, so a peer making another
// call (another payload size) is read, not truncated, and makes the receiver mark the check
// failed (both of its pair set to the largest value, which no agreeing pair has); the hashes
// differ anyway, so every rank fails it. The channel carries nothing else (but the direct
// reduce-scatters' blocks, under tags of their own: Note [Direct reduce-scatter]), and one
// exchange at a time (the check queue posts the next check when this one completes).
//
// It is a work of its own rather than an MpiWork with a next_round closure: one round's two
// requests in fields, a scratch buffer reused from the last exchange, nothing allocated per
// call but the work itself (a small collective's time was largely allocations: 25 per call).

// One message: the header and at most every payload.
constexpr int64_t kCheckMessage = kCheckHeader + int64_t(kCarriedBytes);
constexpr int kSecondPhaseTag = 32;  // above any first-phase round (ceil(log2 n) < 32)
// An exchange's scratch: the message out, the message in and a reduction's blocks.
constexpr size_t kScratchWords = (2 * size_t(kCheckMessage) + kCarriedBytes) / sizeof(int64_t);

int exchange_rounds(int n) {
  int r = 0;
  while ((1 << r) < n) ++r;
  return r;
}

bool mailboxes_enabled() {
  const char* v = std::getenv("LOOM_SHM_EXCHANGE");
  return v == nullptr || std::string(v) != "0";
}

namespace {

class SignatureExchange final : public MpiPolledWork {
 public:
  using Kind = CheckPayload::Kind;

  // `pair`: as check_exchange_impl's, written when the first phase completes.
  // `boxes`: the group's mailboxes in shared memory, or null to send through MPI.
  SignatureExchange(std::shared_ptr<CommHandle> handle, OpContext context, double timeout_s,
                    int rank, int n, ExchangeOrderPtr order, int64_t* pair,
                    const CheckPayload& payload, SpareScratch spare, MailboxesPtr boxes)
      : MpiPolledWork(std::move(handle), std::move(context), timeout_s),
        rank_(rank),
        n_(n),
        order_(std::move(order)),
        position_(order_->position_of[size_t(rank)]),
        pair_(pair),
        p_(payload),
        block_(int64_t(payload.block)),
        spare_(std::move(spare)),
        boxes_(std::move(boxes)) {
    scratch_ = take_scratch(*spare_, kScratchWords);
    out_ = scratch_->data();
    received_in_ = out_ + kCheckMessage / int64_t(sizeof(int64_t));
    in_ = received_in_;
    blocks_ = reinterpret_cast<char*>(out_) + 2 * kCheckMessage;
    out_[0] = pair[0];
    out_[1] = pair[1];
    const auto* input = static_cast<const char*>(p_.input);
    switch (p_.kind) {
      case Kind::kNone:
        block_ = 0;
        break;
      case Kind::kAllgather:
      case Kind::kAllreduceByAllgather:
        if (block_ > 0) std::memcpy(held(), input, size_t(block_));
        break;
      case Kind::kReduceScatter:
      case Kind::kAllreduce:
        // Index i: the block bound for position p - i (an allreduce's last blocks may be short).
        for (int i = 0; i < n_; ++i) {
          const int64_t to = rank_at(position_ - i);
          const int64_t bytes = std::min(block_, int64_t(p_.input_bytes) - to * block_);
          if (bytes > 0) std::memcpy(blocks_ + i * block_, input + to * block_, size_t(bytes));
        }
        break;
    }
    post_round();
  }
  ~SignatureExchange() override;

 protected:
  bool poll() override {
    if (!round_arrived()) return false;
    const int64_t expected = round_blocks() * block_;
    if (in_[2] != expected) {  // another call: fail the check on every rank
      LOOM_ASSERT(first_phase_, "second phase of ", context().str(), " got ", in_[2],
                  " bytes, expected ", expected);
      out_[0] = out_[1] = std::numeric_limits<int64_t>::max();
      failed_check_ = true;
    } else if (first_phase_) {
      out_[0] = std::max(out_[0], in_[0]);
      out_[1] = std::max(out_[1], in_[1]);
    }
    if (!failed_check_) take_round();
    if (boxes_) boxes_->release(round_);
    ++round_;
    if (round_ < rounds()) {
      post_round();
      return false;
    }
    if (first_phase_) {
      pair_[0] = out_[0];
      pair_[1] = out_[1];
      if (!hashes_agree(out_)) return true;  // nothing is written
      if (p_.kind == Kind::kAllreduce) {     // reduce this rank's block, then gather the blocks
        reduce_mine(held());
        first_phase_ = false;
        round_ = 0;
        have_ = 1;
        post_round();
        return false;
      }
    }
    write_outputs();
    return true;
  }

  void finish() override {
    spare_->push_back(std::move(scratch_));  // no request uses it any more
    release_comm();
  }

 private:
  // Whether this round moves held blocks (Bruck's allgather) rather than indexed ones.
  bool gathers() const {
    return !first_phase_ || (p_.kind != Kind::kReduceScatter && p_.kind != Kind::kAllreduce);
  }
  int rounds() const { return exchange_rounds(n_); }
  char* held() { return reinterpret_cast<char*>(out_ + 3); }
  const char* received() const { return reinterpret_cast<const char*>(in_ + 3); }

  // Blocks in this round's message: Bruck's allgather sends what it holds, up to 2^k; its
  // all-to-all the indices with bit k set.
  int64_t round_blocks() const {
    if (gathers()) return std::min<int64_t>(have_, n_ - have_);
    int64_t count = 0;
    for (int i = 0; i < n_; ++i) count += (i >> round_) & 1;
    return count;
  }

  void post_round() {
    const int step = 1 << round_;  // < n
    const int64_t blocks = round_blocks();
    out_[2] = blocks * block_;
    if (!gathers()) {  // pack the indices with bit k set after the header
      char* at = held();
      for (int i = 0; i < n_; ++i)
        if ((i >> round_) & 1) {
          std::memcpy(at, blocks_ + i * block_, size_t(block_));
          at += block_;
        }
    }
    const size_t message = size_t(kCheckHeader + blocks * block_);
    if (boxes_) {  // See Note [Mailboxes in shared memory] (shared_mailbox.cpp)
      unsent_ = !send_to_mailbox();
      return;
    }
    const int tag = (first_phase_ ? 0 : kSecondPhaseTag) + round_;
    const MPI_Comm c = comm->comm;
    LOOM_MPI_CHECK_IN(context(), MPI_Irecv(received_in_, int(kCheckMessage), MPI_BYTE,
                                           rank_at(position_ + step), tag, c, &requests_[0]));
    LOOM_MPI_CHECK_IN(context(), MPI_Isend(out_, int(message), MPI_BYTE, rank_at(position_ - step),
                                           tag, c, &requests_[1]));
  }

  // Puts this round's message (out_, as post_round packed it) into the mailbox of the rank it
  // goes to; false while that mailbox is full.
  bool send_to_mailbox() {
    return boxes_->try_send(rank_at(position_ - (1 << round_)), round_, out_,
                            size_t(kCheckHeader + out_[2]));
  }

  // Whether this round's message went out and the peer's came in (in_ then points at it), as
  // MPI_Testall's two requests or the mailboxes say.
  bool round_arrived() {
    if (!boxes_) {
      int flag = 0;
      check_mpi(MPI_Testall(2, requests_, &flag, MPI_STATUSES_IGNORE), "MPI_Testall", __FILE__,
                __LINE__, context());
      return flag != 0;
    }
    // Until the message is out, out_ is still to be sent: the round's results wait for both.
    unsent_ = unsent_ && !send_to_mailbox();
    in_ = unsent_ ? nullptr : static_cast<const int64_t*>(boxes_->peek(round_));
    // See Note [Polling a mailbox on a shared core].
    if (!in_ && g_ranks_outnumber_cores) std::this_thread::yield();
    return in_ != nullptr;
  }

  // Keeps what a round brought.
  void take_round() {
    if (block_ == 0) return;
    if (gathers()) {
      const int64_t count = round_blocks();
      std::memcpy(held() + have_ * block_, received(), size_t(count * block_));
      have_ += count;
      return;
    }
    const char* at = received();
    for (int i = 0; i < n_; ++i)
      if ((i >> round_) & 1) {
        std::memcpy(blocks_ + i * block_, at, size_t(block_));
        at += block_;
      }
  }

  // The group rank at position p (mod n) of the exchange order.
  int rank_at(int64_t p) const { return order_->rank_at[size_t(((p % n_) + n_) % n_)]; }

  // This rank's share of a reduction: op over every rank's block for it, in rank order (index i
  // holds position p + i's).
  void reduce_mine(void* out) {
    const int64_t element = int64_t(dtype_size(p_.dtype));
    const int64_t count =
        std::clamp<int64_t>(int64_t(p_.input_bytes) - rank_ * block_, 0, block_) / element;
    reduce_in_rank_order(blocks_, size_t(block_), n_, order_->position_of.data(), position_,
                         p_.dtype, p_.op, 0,
                         p_.kind == Kind::kReduceScatter ? block_ / element : count, out);
  }

  // The outputs, once the check agreed.
  void write_outputs() {
    auto* out = static_cast<char*>(p_.output);
    switch (p_.kind) {
      case Kind::kNone:
        return;
      case Kind::kReduceScatter:
        if (block_ > 0) reduce_mine(out);
        return;
      case Kind::kAllreduceByAllgather:  // held[i] is position p + i's whole input
        reduce_in_rank_order(held(), size_t(block_), n_, order_->position_of.data(), position_,
                             p_.dtype, p_.op, 0, block_ / int64_t(dtype_size(p_.dtype)), out);
        return;
      case Kind::kAllgather:
      case Kind::kAllreduce: {
        // held[i] is position p + i's block: into rank order (an allreduce's last short).
        const int64_t total = p_.kind == Kind::kAllgather ? block_ * n_ : int64_t(p_.input_bytes);
        for (int64_t i = 0; i < n_; ++i) {
          const int64_t j = rank_at(position_ + i);
          const int64_t bytes = std::min(block_, total - j * block_);
          if (bytes > 0) std::memcpy(out + j * block_, held() + i * block_, size_t(bytes));
        }
        return;
      }
    }
  }

  int rank_, n_;
  ExchangeOrderPtr order_;
  int position_;  // this rank's, in order_
  int64_t* pair_;
  CheckPayload p_;
  int64_t block_;
  SpareScratch spare_;
  ExchangeScratch scratch_;
  MailboxesPtr boxes_;
  bool unsent_ = false;   // through boxes_: this round's message waits for room in its mailbox
  int64_t* out_;          // the message out: header, then held blocks (allgather) or a packed round
  int64_t* received_in_;  // where MPI receives the message in
  const int64_t* in_;     // the message in: received_in_, or the mailbox's slot
  char* blocks_;          // a reduction's n blocks, by index
  MPI_Request requests_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  bool first_phase_ = true;
  bool failed_check_ = false;
  int round_ = 0;
  int64_t have_ = 1;  // blocks held by an allgather: this rank's own
};

SignatureExchange::~SignatureExchange() {
  if (done()) return;
  // See Note [Abandoned operations]: the rounds go on while it settles.
  if (!settles([this] { return poll(); }))
    abandoned().push_back(
        Abandoned{{requests_[0], requests_[1]}, {}, {}, std::move(scratch_), std::move(comm)});
}

}  // namespace

WorkPtr signature_exchange(std::shared_ptr<CommHandle> handle, OpContext context, double timeout_s,
                           int rank, int n, ExchangeOrderPtr order, int64_t* pair,
                           const CheckPayload& payload, SpareScratch spare, MailboxesPtr boxes) {
  return make_recycled<SignatureExchange>(std::move(handle), std::move(context), timeout_s, rank, n,
                                          std::move(order), pair, payload, std::move(spare),
                                          std::move(boxes));
}

}  // namespace loom::comm::mpi_impl
