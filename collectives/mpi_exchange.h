// The signature check's exchange (Note [Signature exchange] in mpi_exchange.cpp): a dissemination
// over MPI point-to-point messages, or over mailboxes in shared memory inside one node, carrying a
// small collective with the check. Internal to the mpi backend: include only from
// collectives/mpi_*.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/mpi_work.h"
#include "collectives/shared_mailbox.h"

namespace loom::comm::mpi_impl {

// A message's header: the max hash, the max ~hash, and the payload bytes that follow.
constexpr int64_t kCheckHeader = 3 * int64_t(sizeof(int64_t));
// The most a check carries (CheckPayload::bytes); the communicator picks which collectives go
// this way (communicator.cpp).
constexpr size_t kCarriedBytes = 256 * 1024;
// The most a check carries when its group runs the exchange through mailboxes in shared memory
// (Note [Mailboxes in shared memory], shared_mailbox.cpp), and what such a group carries of every
// kind (carried_limit): every message fits a mailbox's slot.
constexpr size_t kMailboxCarriedBytes = 64 * 1024;
using MailboxesPtr = std::shared_ptr<SharedMailboxes>;

// The rounds of an exchange over n ranks: ceil(log2 n).
int exchange_rounds(int n);

// Whether groups inside one node exchange through shared memory: unless LOOM_SHM_EXCHANGE=0.
bool mailboxes_enabled();

// The positions a group's signature exchanges run their rounds in (Note [Node-interleaved exchange
// order], topology.h): rank_at[p] is the group rank at position p; position_of is its inverse.
struct ExchangeOrder {
  std::vector<int> rank_at, position_of;
  explicit ExchangeOrder(std::vector<int> order) : rank_at(std::move(order)) {
    position_of.assign(rank_at.size(), -1);
    for (size_t p = 0; p < rank_at.size(); ++p) position_of[size_t(rank_at[p])] = int(p);
  }
};
using ExchangeOrderPtr = std::shared_ptr<const ExchangeOrder>;

// The check exchange of one call, as check_exchange_impl's: `pair` is written when the first phase
// completes; `boxes` are the group's mailboxes in shared memory, or null to send through MPI;
// `spare` lends the scratch buffer and takes it back.
WorkPtr signature_exchange(std::shared_ptr<CommHandle> handle, OpContext context, double timeout_s,
                           int rank, int n, ExchangeOrderPtr order, int64_t* pair,
                           const CheckPayload& payload, SpareScratch spare, MailboxesPtr boxes);

}  // namespace loom::comm::mpi_impl
