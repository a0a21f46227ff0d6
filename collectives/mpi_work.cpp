#include "collectives/mpi_work.h"

#include <algorithm>
#include <cstdio>

namespace loom::comm::mpi_impl {

ExchangeScratch take_scratch(std::vector<ExchangeScratch>& spare, size_t words) {
  if (spare.empty()) return std::make_shared<std::vector<int64_t>>(words);
  ExchangeScratch s = std::move(spare.back());
  spare.pop_back();
  if (s->size() < words) s->resize(words);
  return s;
}

// Note [MPI staging]
// MPI is handed host buffers of a type it can reduce. A buffer is staged (copied into a host
// tensor before the call, and the result copied back in finish()) when it lives on a GPU (Open
// MPI from Debian is not CUDA-aware) or when a reduction runs on bf16/f16: MPI has no 16-bit
// float types, so the values are widened to f32, reduced in f32, and rounded once at the end
// (after the division for avg). Ops that only move data (allgather, broadcast, all_to_all,
// send/recv) carry bf16/f16 as raw 16-bit words (MPI_UINT16_T), bit for bit.
//
// Note [Abandoned operations]
// MPI may write into a receive buffer until its request completes, so the buffers of a Work
// destroyed before completion must not be freed. Its destructor polls up to the group's timeout
// (not forever: a peer that never joins must not turn an error into a hang; and not at all once
// a wait on the same group has failed, so unwinding past many works does not wait for each),
// then, if the op is still pending, abandons it: the requests and buffers move to a process-wide
// list that is never freed. At exit MPI_Finalize is skipped while any abandoned op is pending,
// since it would wait for the peer that never came (mpirun then reports the rank as exiting without
// finalising).

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

std::vector<Abandoned>& abandoned() {
  static auto* list = new std::vector<Abandoned>();  // never freed: See Note [Abandoned operations]
  return *list;
}

// ---------------------------------------------------------------- types and buffers

// The MPI type a buffer travels as; bf16/f16 as raw words (See Note [MPI staging]).
MPI_Datatype transport_type(DType t) {
  switch (t) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kBF16:
    case DType::kF16:
      return MPI_UINT16_T;
    case DType::kI32:
      return MPI_INT32_T;
    case DType::kI64:
      return MPI_INT64_T;
    case DType::kU8:
    case DType::kBool:
      return MPI_UINT8_T;
  }
  LOOM_ASSERT(false, "unknown dtype ", int(t));
}

// True when a host buffer of `dtype` cannot simply be t itself.
bool needs_staging(const Tensor& t, DType dtype) {
  return !t.device().is_cpu() || t.dtype() != dtype;
}

// A host tensor holding t's values as `dtype`: t itself when it already is one.
Tensor host_values(const Tensor& t, DType dtype) {
  Tensor h = t.detach();
  if (!h.device().is_cpu()) h = h.to(Device::cpu());
  if (h.dtype() != dtype) h = h.to(dtype);
  return h;
}

// A host buffer for MPI to write t's result into, as `dtype`: t itself when it can be.
Tensor host_buffer(const Tensor& t, DType dtype) {
  if (!needs_staging(t, dtype)) return t.detach();
  return Tensor::empty(t.shape(), dtype, Device::cpu());
}

// Brings a result from its host buffer into t, converting back to t's dtype; nothing to do when
// the buffer is t's own memory.
void store(const Tensor& host, Tensor t) {
  if (t.numel() == 0 || (t.device().is_cpu() && host.data_ptr() == t.data_ptr())) return;
  t.copy_(host.dtype() == t.dtype() ? host : host.to(t.dtype()));
}

char* bytes_at(const Tensor& t, int64_t element) {
  return static_cast<char*>(t.data_ptr()) + element * int64_t(dtype_size(t.dtype()));
}

// ---------------------------------------------------------------- late ranks

// Note [Late ranks]
// A timeout says which ranks of the group had not arrived. MPI cannot tell (a collective does not
// report who joined), so the timed-out rank asks: it sends every other rank of the group a
// question on a communicator of its own (a duplicate of the world, so nothing else matches it)
// and collects answers for up to kCensusSeconds. Every rank answers questions in the slow part of
// any wait it is in (after its first thousand polls, so a fast collective never looks), with
// what it is waiting for. A rank waiting for the same collective has arrived; one waiting for
// another has not, and the answer says where it is; one that does not answer is not in a loom
// wait at all: computing, stopped or dead. Questions and answers carry the asker's census number,
// so an answer to an earlier census (a test that timed out before) is not taken for this one.
// Send buffers stay alive until their sends complete; a question nobody answers costs a few bytes.

namespace {

MPI_Comm g_census_comm = MPI_COMM_NULL;
constexpr int kCensusAsk = 1, kCensusAnswer = 2;
constexpr double kCensusSeconds = 2.0;
constexpr size_t kAnswerText = 248;
struct CensusAnswerMessage {
  int64_t census;          // the asker's number for this census
  char text[kAnswerText];  // what the answering rank waits for
};

// Sends in flight, with their buffers; completed ones are dropped as new ones are added.
struct CensusSend {
  MPI_Request request = MPI_REQUEST_NULL;
  std::unique_ptr<CensusAnswerMessage> message;
};
std::vector<CensusSend>& census_sends() {
  static std::vector<CensusSend>* sends = new std::vector<CensusSend>();  // never freed: see above
  return *sends;
}
void census_send(int to, int tag, std::unique_ptr<CensusAnswerMessage> message) {
  std::vector<CensusSend>& sends = census_sends();
  sends.erase(std::remove_if(sends.begin(), sends.end(),
                             [](CensusSend& s) {
                               int done = 0;
                               MPI_Test(&s.request, &done, MPI_STATUS_IGNORE);
                               return done != 0;
                             }),
              sends.end());
  CensusSend s;
  s.message = std::move(message);
  if (MPI_Isend(s.message.get(), int(sizeof(CensusAnswerMessage)), MPI_BYTE, to, tag, g_census_comm,
                &s.request) == MPI_SUCCESS)
    sends.push_back(std::move(s));
}

// Answers every question that has arrived (See CensusAnswer in work.h).
void census_answer(const std::string& waiting_for) {
  if (g_census_comm == MPI_COMM_NULL || mpi_finalized()) return;
  for (;;) {
    int flag = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kCensusAsk, g_census_comm, &flag, &status) != MPI_SUCCESS ||
        !flag)
      return;
    int64_t census = 0;
    if (MPI_Recv(&census, 1, MPI_INT64_T, status.MPI_SOURCE, kCensusAsk, g_census_comm,
                 MPI_STATUS_IGNORE) != MPI_SUCCESS)
      return;
    auto answer = std::make_unique<CensusAnswerMessage>();
    answer->census = census;
    std::snprintf(answer->text, kAnswerText, "%s", waiting_for.c_str());
    census_send(status.MPI_SOURCE, kCensusAnswer, std::move(answer));
  }
}

// `context` without its "(rank r of n) " part, which differs from rank to rank.
std::string without_rank(std::string context) {
  const size_t at = context.find(" (rank ");
  const size_t end = at == std::string::npos ? at : context.find(") ", at);
  if (end != std::string::npos) context.erase(at, end + 1 - at);
  return context;
}

}  // namespace

// Asks the other ranks of `comm` what they wait for and says which had not arrived at
// `waiting_for` (See Note [Late ranks]).
std::string census(MPI_Comm comm, const std::string& waiting_for) {
  if (g_census_comm == MPI_COMM_NULL || mpi_finalized()) return "";
  int n = 0, me = 0;
  if (MPI_Comm_size(comm, &n) != MPI_SUCCESS || MPI_Comm_rank(comm, &me) != MPI_SUCCESS) return "";
  // The group's ranks in the world (the census communicator is the world's duplicate).
  MPI_Group group, world;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> local(static_cast<size_t>(n)), global(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) local[size_t(i)] = i;
  const int rc = MPI_Group_translate_ranks(group, n, local.data(), world, global.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  if (rc != MPI_SUCCESS) return "";
  static int64_t next_census = 0;
  const int64_t number = ++next_census;
  for (int i = 0; i < n; ++i) {
    if (i == me) continue;
    auto question = std::make_unique<CensusAnswerMessage>();
    question->census = number;
    // Questions are a bare number: send the first 8 bytes of the message.
    CensusSend s;
    s.message = std::move(question);
    if (MPI_Isend(&s.message->census, 1, MPI_INT64_T, global[size_t(i)], kCensusAsk, g_census_comm,
                  &s.request) == MPI_SUCCESS)
      census_sends().push_back(std::move(s));
  }
  std::vector<std::string> answers(static_cast<size_t>(n));
  std::vector<bool> answered(static_cast<size_t>(n), false);
  answered[size_t(me)] = true;
  answers[size_t(me)] = waiting_for;
  int missing = n - 1;
  const auto until = Clock::now() + std::chrono::duration<double>(kCensusSeconds);
  while (missing > 0 && Clock::now() < until) {
    census_answer(waiting_for);  // the others may be asking too
    int flag = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kCensusAnswer, g_census_comm, &flag, &status) != MPI_SUCCESS)
      break;
    if (!flag) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      continue;
    }
    CensusAnswerMessage answer;
    if (MPI_Recv(&answer, int(sizeof answer), MPI_BYTE, status.MPI_SOURCE, kCensusAnswer,
                 g_census_comm, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      break;
    if (answer.census != number) continue;  // an answer to an earlier census
    answer.text[kAnswerText - 1] = '\0';
    const auto it = std::find(global.begin(), global.end(), status.MPI_SOURCE);
    const size_t i = size_t(it - global.begin());
    if (it == global.end() || answered[i]) continue;
    answered[i] = true;
    answers[i] = answer.text;
    --missing;
  }
  // Ranks by what they were doing.
  const std::string here = without_rank(waiting_for);
  std::string arrived, elsewhere, silent;
  auto name = [&](int i) {
    return global[size_t(i)] == i ? std::to_string(i)
                                  : detail::str_cat(i, " (world rank ", global[size_t(i)], ")");
  };
  for (int i = 0; i < n; ++i) {
    const std::string who = name(i);
    if (!answered[size_t(i)])
      silent += detail::str_cat(silent.empty() ? "" : ", ", who);
    else if (without_rank(answers[size_t(i)]) == here)
      arrived += detail::str_cat(arrived.empty() ? "" : ", ", who);
    else
      elsewhere += detail::str_cat(elsewhere.empty() ? "" : "; ", who, " is waiting for ",
                                   answers[size_t(i)]);
  }
  if (silent.empty() && elsewhere.empty()) return "";  // every rank is here: no late rank to name
  std::string out = ". Ranks that had not arrived: ";
  if (!silent.empty())
    out += detail::str_cat(silent, " (not waiting in loom: computing, stopped or dead)");
  if (!elsewhere.empty()) out += detail::str_cat(silent.empty() ? "" : "; ", elsewhere);
  out += detail::str_cat(". Ranks waiting for it: ", arrived);
  return out;
}

void start_census() {
  if (g_census_comm != MPI_COMM_NULL) return;
  LOOM_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &g_census_comm));
  LOOM_MPI_CHECK(MPI_Comm_set_errhandler(g_census_comm, MPI_ERRORS_RETURN));
  set_census_answer(census_answer);
}

// Note [Polling a mailbox on a shared core]
// Open MPI's progress loop gives up the core after a poll that found nothing when its node holds
// more ranks than cores (mpi_yield_when_idle), so the rank it waits for can run. A poll of a
// mailbox is a load, and PollingWork::wait yields only after 1000 of them: with 4 ranks on the
// 2-vCPU VM a 1 KiB allreduce took 31-40 us against MPI's 11-14. So where this node's ranks
// outnumber its online cores (decided once, when the world is made), an empty poll yields too:
// the exchange's, and a send's or receive's through the point-to-point channels.
bool g_ranks_outnumber_cores = false;

// ---------------------------------------------------------------- the works

bool test_all(MPI_Request* requests, MPI_Status* statuses, int count, const OpContext& context) {
  int flag = 0;
  MPI_Status* st = statuses ? statuses : MPI_STATUSES_IGNORE;
  int rc = MPI_Testall(count, requests, &flag, st);
  if (rc == MPI_ERR_IN_STATUS && statuses) {
    for (int i = 0; i < count; ++i)
      if (statuses[i].MPI_ERROR != MPI_SUCCESS && statuses[i].MPI_ERROR != MPI_ERR_PENDING) {
        rc = statuses[i].MPI_ERROR;
        break;
      }
  }
  check_mpi(rc, "MPI_Testall", __FILE__, __LINE__, context);
  return flag != 0;
}
bool test_all(std::vector<MPI_Request>& requests, std::vector<MPI_Status>& statuses,
              const OpContext& context) {
  return test_all(requests.data(), statuses.size() == requests.size() ? statuses.data() : nullptr,
                  int(requests.size()), context);
}

MpiWork::~MpiWork() {
  stop_stepping();
  if (done() || requests.empty()) return;
  // See Note [Abandoned operations].
  const bool settled = settles([this] {
    if (!poll()) return false;
    finish();  // the results are as complete as if wait() had been called
    return true;
  });
  if (!settled)
    abandoned().push_back(Abandoned{std::move(requests), std::move(buffers), std::move(ints),
                                    nullptr, std::move(comm)});
}

}  // namespace loom::comm::mpi_impl
