// Point-to-point messages of the MPI backend: a send or receive through MPI (Note [A single
// message's cost], mpi_point_to_point.cpp) or through a group's PairChannels (Note [Point-to-point
// through mailboxes], pair_channels.cpp), and the works that wait for them. Internal to the mpi
// backend: include only from collectives/mpi_*.cpp.
#pragma once

#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "collectives/mpi_work.h"
#include "collectives/pair_channels.h"

namespace loom::comm::mpi_impl {

// Elements a completed receive got (compared with its length by every receive: see the .cpp).
int received_count(const MPI_Status& status, MPI_Datatype type);
// The error of a receive that got fewer elements than its length.
CommError short_receive(const OpContext& context, int peer, int tag, int got, int expected);

// A work for an op that failed as it was posted: its wait and test raise `error`.
WorkPtr failed_work(std::exception_ptr error);
// A send or receive of `op` (its elements of `type`) posted through MPI as `posted`, not yet
// complete.
WorkPtr message_work(std::shared_ptr<CommHandle> handle, OpContext context, double timeout_s,
                     const P2POp& op, MPI_Datatype type, MPI_Request posted);

// One send or receive through a group's PairChannels (Note [Point-to-point through mailboxes],
// pair_channels.cpp): in its mailbox, or announced there with its bytes through MPI.
struct ChannelMessage {
  bool recv = false;
  int peer = 0, tag = 0;
  Tensor buffer;  // the host bytes sent or received into: alive until completion
  Tensor result;  // a staged receive's destination, stored once it completes; else undefined
  std::shared_ptr<PairChannels::Send> waiting_send;     // until it is in the mailbox
  std::shared_ptr<PairChannels::Receive> waiting_recv;  // until its message arrived
  Tensor discard;                      // an announced message of another length lands here
  std::vector<MPI_Request> transport;  // an announced message's bytes, in pieces
  std::string error;                   // a receive's length error, raised once complete
};

// Posts `m` (buffer, peer, tag and direction set): what is left is in its waiting_* records and
// transport requests.
void post_channel_message(ChannelMessage& m, PairChannels& channels, MPI_Comm comm,
                          const OpContext& context);
// The sends and receives of one call, posted by post_channel_message, until they complete.
WorkPtr channel_work(std::shared_ptr<CommHandle> handle, OpContext context, double timeout_s,
                     std::shared_ptr<PairChannels> channels, std::vector<ChannelMessage> messages);

}  // namespace loom::comm::mpi_impl
