// The MPI backend's shared pieces: the communicator handle its works keep alive, abandoned
// operations, host staging of buffers, the census of late ranks, and the works that poll MPI
// requests. Internal to the mpi backend: include only from collectives/mpi_*.cpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/mpi_check.h"
#include "collectives/work.h"
#include "core/tensor.h"

namespace loom::comm::mpi_impl {

using Clock = std::chrono::steady_clock;

// Scratch buffers of completed signature exchanges and direct reductions, for the next ones: host
// memory of the communicator, as MPI's own buffers are, not tensors: the memory accounting of a
// model (tests/mpi/memory_test.cpp) counts what its tensors hold. A work that never completes
// keeps its buffer (See Note [Abandoned operations]).
using ExchangeScratch = std::shared_ptr<std::vector<int64_t>>;
using SpareScratch = std::shared_ptr<std::vector<ExchangeScratch>>;

// A spare buffer of at least `words` (grown if it is shorter), or a new one.
ExchangeScratch take_scratch(std::vector<ExchangeScratch>& spare, size_t words);

// Whether MPI_Finalize has run (after it, nothing of MPI may be called but this).
bool mpi_finalized();

// An MPI communicator, freed when the last of its Communicator and its pending works lets go:
// Open MPI's nonblocking collectives crash when their communicator is freed before they finish.
struct CommHandle {
  MPI_Comm comm = MPI_COMM_NULL;
  bool failed = false;  // a work on it timed out or failed: See Note [Abandoned operations]
  explicit CommHandle(MPI_Comm c) : comm(c) {}
  CommHandle(const CommHandle&) = delete;
  CommHandle& operator=(const CommHandle&) = delete;
  ~CommHandle() {
    // After MPI_Finalize (the world outlives it, in a static) there is nothing left to free.
    if (!mpi_finalized()) MPI_Comm_free(&comm);
  }
};

// See Note [Abandoned operations] (mpi_work.cpp).
struct Abandoned {
  std::vector<MPI_Request> requests;
  std::vector<Tensor> buffers;  // what MPI may still read or write
  std::vector<int> ints;        // counts, displacements, or split's (color, key) buffer
  std::shared_ptr<std::vector<int64_t>> scratch;  // a signature exchange's messages
  std::shared_ptr<CommHandle> comm;               // the communicator they run on
};

// The process-wide list of abandoned operations (never freed).
std::vector<Abandoned>& abandoned();

// ---------------------------------------------------------------- types and buffers
// See Note [MPI staging] (mpi_work.cpp).

// The MPI type a buffer travels as; bf16/f16 as raw words.
MPI_Datatype transport_type(DType t);
// True when a host buffer of `dtype` cannot simply be t itself.
bool needs_staging(const Tensor& t, DType dtype);
// A host tensor holding t's values as `dtype`: t itself when it already is one.
Tensor host_values(const Tensor& t, DType dtype);
// A host buffer for MPI to write t's result into, as `dtype`: t itself when it can be.
Tensor host_buffer(const Tensor& t, DType dtype);
// Brings a result from its host buffer into t, converting back to t's dtype; nothing to do when
// the buffer is t's own memory.
void store(const Tensor& host, Tensor t);
// The address of element `element` of t.
char* bytes_at(const Tensor& t, int64_t element);

// ---------------------------------------------------------------- late ranks

// Makes the census's communicator and answers its questions in every slow wait (Note [Late
// ranks]); called when the world is made, once.
void start_census();
// Asks the other ranks of `comm` what they wait for and says which had not arrived at
// `waiting_for`; empty when every rank is there or nothing can be asked.
std::string census(MPI_Comm comm, const std::string& waiting_for);

// Whether this node holds more ranks than online cores: an empty poll of a mailbox then yields
// (Note [Polling a mailbox on a shared core], mpi_work.cpp). Set when the world is made.
extern bool g_ranks_outnumber_cores;

// ---------------------------------------------------------------- the works

// MPI_Testall over `requests`: whether all have completed. An error raises CommError in
// `context`, naming the failed request's own error rather than MPI_ERR_IN_STATUS when
// `statuses` has one per request (otherwise they are ignored).
bool test_all(MPI_Request* requests, MPI_Status* statuses, int count, const OpContext& context);
bool test_all(std::vector<MPI_Request>& requests, std::vector<MPI_Status>& statuses,
              const OpContext& context);

// A work that polls MPI requests on `comm`. A CommError from its wait or test (timed out, or MPI
// failed) marks it and its communicator failed: its destructor, and those of the group's other
// pending works, then abandon their operations at once instead of waiting again (See Note
// [Abandoned operations]).
class MpiPolledWork : public PollingWork {
 public:
  MpiPolledWork(std::shared_ptr<CommHandle> comm, OpContext context, double timeout_s)
      : PollingWork(std::move(context), timeout_s), comm(std::move(comm)), timeout_s_(timeout_s) {}

  void wait() override {
    try {
      PollingWork::wait();
    } catch (const CommError&) {
      mark_failed();
      throw;
    }
  }
  bool test() override {
    try {
      return PollingWork::test();
    } catch (const CommError&) {
      mark_failed();
      throw;
    }
  }

  std::shared_ptr<CommHandle> comm;  // kept until the requests complete

 protected:
  // For finish(): the operation completed, so its group works again (a failure before it is
  // over: See Note [Abandoned operations]), and the communicator is no longer needed.
  void release_comm() {
    if (comm) comm->failed = false;
    comm.reset();
  }

  std::string late_ranks() override {
    return comm && !mpi_finalized() ? census(comm->comm, waiting_for()) : "";
  }

  // For a destructor: whether `complete` (one poll: true once the operation is complete)
  // succeeds within the group's timeout; false at once when a wait on the group already failed.
  template <typename Complete>
  bool settles(Complete&& complete) {
    if (failed_ || (comm && comm->failed) || mpi_finalized()) return false;
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s_);
    while (Clock::now() < deadline) {
      try {
        if (complete()) return true;
      } catch (...) {
        return false;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return false;
  }

 private:
  void mark_failed() {
    failed_ = true;
    if (comm) comm->failed = true;
  }

  double timeout_s_;
  bool failed_ = false;
};

// Note [MPI requests move in every wait]
// Open MPI moves a message past its eager limit, and runs a nonblocking collective's rounds, only
// inside MPI calls on the rank; a wait that polls mailboxes alone (a small collective carried
// through its check, a message in a point-to-point channel) makes none. So a rank that posted a
// large send, or an allreduce, and then waited for such a thing stalled whatever its peers needed
// from it until the wait's slow part, after 1000 polls, probed MPI. Every work with MPI requests
// in flight is therefore stepped in every loom wait and test (Note [Works that post as they go]),
// and its step tests them: one turn of MPI's progress engine. A step only tests; completion is
// remembered, so the owner's poll does not test the freed requests again (their statuses hold
// the received lengths). Measured on the 2-vCPU Xeon VM, 12 ranks on one host (the world's
// messages through MPI, above PairChannels::kMaxRanks; pairs' allreduces through mailboxes), a
// 400 KB send to another pair, then the pair's 1 KiB allreduce that waits for the receiver's
// word (collectives_test's ALargeSendMovesWhileItsSenderWaitsInAnotherGroup, timed): 13.0-13.9 ms
// -> 0.24-0.66 ms per round; 4 MB 12.2-15.5 -> 1.2-2.0 ms. Across emulated nodes (TCP) the same
// rounds moved within the noise.
class MpiWork final : public MpiPolledWork {
 public:
  MpiWork(std::shared_ptr<CommHandle> handle, OpContext context, double timeout_s)
      : MpiPolledWork(std::move(handle), std::move(context), timeout_s) {
    keep_stepping();  // See Note [MPI requests move in every wait]
  }
  ~MpiWork() override;

  std::vector<MPI_Request> requests;
  std::vector<MPI_Status> statuses;  // filled by MPI_Testall when sized like requests
  std::vector<Tensor> buffers;       // all that MPI reads or writes: alive until completion
  std::vector<int> ints;             // count/displacement arrays or int buffers, as `buffers`
  std::function<void()> then;        // post-processing once complete (divide, copy back, ...)

  // Adds a request slot and returns it for the MPI call to fill.
  MPI_Request* next_request() {
    requests.push_back(MPI_REQUEST_NULL);
    return &requests.back();
  }

 protected:
  void step() override {
    if (poll()) stop_stepping();
  }
  bool poll() override {
    if (!completed_ && !requests.empty() && !test_all(requests, statuses, context())) return false;
    completed_ = true;
    return true;
  }

  void finish() override {
    std::function<void()> f = std::move(then);
    then = nullptr;
    if (f) f();
    buffers.clear();
    release_comm();
  }

 private:
  bool completed_ = false;  // every request completed (in a poll or a step)
};

}  // namespace loom::comm::mpi_impl
