// The router calls the *_impl of the two communicators it holds, never their public API: See
// Note [Routing].
#include "collectives/device_router.h"

#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom::comm {

// Note [Routing]
// A router is one group to its user, so everything the base class does per call happens once,
// on the router: the argument checks, the sequence number and op count, the signature check
// (Note [Collective signatures]: its small allreduce of CPU tensors goes to the host), and the
// timeout. The inner communicators are reached through their *_impl calls with the router's OpInfo,
// so they count nothing, and an error they raise reads as the user's group: "group 'dp.0' (rank 1
// of 4) allreduce #17" with the router's #17, since both carry the router's name, rank and size.
// Their timeouts follow the router's (set_timeout_seconds is applied to them before every call).
//
// Every rank of a group must route a call the same way: a collective that gets a CUDA tensor on
// one rank and a CPU tensor on another runs on two transports that never meet, and each side
// times out waiting for the other (Note [Deadlines]), naming the op.

namespace {

// The protected *_impl calls of any Communicator. C++ lets a derived class call a protected
// member only on objects of its own type, not on another Communicator; but a using-declaration
// re-declares the members as public here, and a pointer to a member named through Inner is a
// pointer to Communicator's member (a using-declaration adds no member of its own), so
// `(c.*&Inner::allreduce_impl)(...)` is a virtual call on any Communicator c. Inner is never
// instantiated.
struct Inner : Communicator {
  using Communicator::all_to_all_impl;
  using Communicator::allgather_impl;
  using Communicator::allreduce_impl;
  using Communicator::barrier_impl;
  using Communicator::batch_p2p_impl;
  using Communicator::broadcast_impl;
  using Communicator::check_channel;
  using Communicator::OpInfo;
  using Communicator::p2p_impl;
  using Communicator::reduce_impl;
  using Communicator::reduce_scatter_impl;
  using Communicator::split_impl;
};
static_assert(
    std::is_same_v<decltype(&Inner::allreduce_impl),
                   WorkPtr (Communicator::*)(const Tensor&, Tensor&, const AllreduceOptions&,
                                             const Inner::OpInfo&)>,
    "Inner's members must be Communicator's own, so that they dispatch virtually");

// The works of a batch split between the two communicators, complete when both are. wait() waits
// on each in turn, each with its own deadline.
class BothWork final : public Work {
 public:
  BothWork(WorkPtr first, WorkPtr second) : first_(std::move(first)), second_(std::move(second)) {}
  void wait() override {
    first_->wait();
    second_->wait();
  }
  bool test() override {
    const bool first = first_->test();
    const bool second = second_->test();
    return first && second;
  }

 private:
  WorkPtr first_, second_;
};

class DeviceRouter final : public Communicator {
 public:
  DeviceRouter(std::shared_ptr<Communicator> host, std::shared_ptr<Communicator> device)
      : Communicator(host->rank(), host->size(), host->name()),
        host_(std::move(host)),
        device_(std::move(device)),
        backend_(detail::str_cat(host_->backend(), "+", device_->backend())) {
    LOOM_ASSERT(device_->rank() == rank() && device_->size() == size(), "router over group '",
                name(), "': host rank ", rank(), " of ", size(), ", device rank ", device_->rank(),
                " of ", device_->size());
  }
  ~DeviceRouter() override { post_queued(); }
  DeviceRouter(const DeviceRouter&) = delete;
  DeviceRouter& operator=(const DeviceRouter&) = delete;
  const char* backend() const override { return backend_.c_str(); }

 protected:
  WorkPtr allreduce_impl(const Tensor& input, Tensor& output, const AllreduceOptions& o,
                         const OpInfo& info) override {
    return (route(input).*&Inner::allreduce_impl)(input, output, o, info);
  }
  WorkPtr reduce_scatter_impl(const Tensor& input, Tensor& output, const ReduceScatterOptions& o,
                              const OpInfo& info) override {
    return (route(input).*&Inner::reduce_scatter_impl)(input, output, o, info);
  }
  WorkPtr allgather_impl(const Tensor& input, Tensor& output, const AllgatherOptions& o,
                         const OpInfo& info) override {
    return (route(input).*&Inner::allgather_impl)(input, output, o, info);
  }
  WorkPtr broadcast_impl(Tensor& tensor, const BroadcastOptions& o, const OpInfo& info) override {
    return (route(tensor).*&Inner::broadcast_impl)(tensor, o, info);
  }
  WorkPtr reduce_impl(const Tensor& input, Tensor& output, const ReduceOptions& o,
                      const OpInfo& info) override {
    // By the input: the output may be undefined off the root.
    return (route(input).*&Inner::reduce_impl)(input, output, o, info);
  }
  WorkPtr all_to_all_impl(const Tensor& input, Tensor& output, const AllToAllOptions& o,
                          const OpInfo& info) override {
    return (route(input).*&Inner::all_to_all_impl)(input, output, o, info);
  }
  WorkPtr batch_p2p_impl(const std::vector<P2POp>& ops, const OpInfo& info) override {
    std::vector<P2POp> on_host, on_device;
    for (const P2POp& p : ops) (p.tensor.device().is_cuda() ? on_device : on_host).push_back(p);
    if (on_device.empty()) return (inner(*host_).*&Inner::batch_p2p_impl)(ops, info);
    if (on_host.empty()) return (inner(*device_).*&Inner::batch_p2p_impl)(ops, info);
    // The device part first: NCCL only queues it on the GPU, then MPI posts the host part.
    WorkPtr device_work = (inner(*device_).*&Inner::batch_p2p_impl)(on_device, info);
    WorkPtr host_work = (inner(*host_).*&Inner::batch_p2p_impl)(on_host, info);
    return std::make_shared<BothWork>(std::move(device_work), std::move(host_work));
  }
  WorkPtr p2p_impl(const P2POp& op, const OpInfo& info) override {
    return (route(op.tensor).*&Inner::p2p_impl)(op, info);
  }
  WorkPtr barrier_impl(const BarrierOptions& o, const OpInfo& info) override {
    return (inner(*host_).*&Inner::barrier_impl)(o, info);
  }
  // The host's: the checks are small CPU tensors.
  Communicator* check_channel() override { return (inner(*host_).*&Inner::check_channel)(); }
  // Both split with the same color and key, so they order the sub-group's ranks alike (by key,
  // then by rank here). The host first: the mpi backend's split waits (with the deadline) until
  // every rank has reached it, so the device split then starts on all ranks together.
  std::shared_ptr<Communicator> split_impl(int color, int key, const std::string& name) override {
    auto host = (inner(*host_).*&Inner::split_impl)(color, key, name);
    auto device = (inner(*device_).*&Inner::split_impl)(color, key, name);
    return std::make_shared<DeviceRouter>(std::move(host), std::move(device));
  }

 private:
  // `c`, with the router's timeout (See Note [Routing]).
  Communicator& inner(Communicator& c) const {
    if (c.timeout_seconds() != timeout_seconds()) c.set_timeout_seconds(timeout_seconds());
    return c;
  }
  Communicator& route(const Tensor& t) const {
    return inner(t.device().is_cuda() ? *device_ : *host_);
  }

  std::shared_ptr<Communicator> host_;
  std::shared_ptr<Communicator> device_;
  std::string backend_;
};

}  // namespace

std::shared_ptr<Communicator> make_device_router(std::shared_ptr<Communicator> host,
                                                 std::shared_ptr<Communicator> device) {
  LOOM_CHECK(host && device, "make_device_router: both communicators are needed");
  LOOM_CHECK(host->rank() == device->rank() && host->size() == device->size() &&
                 host->name() == device->name(),
             "make_device_router: the host group '", host->name(), "' (rank ", host->rank(), " of ",
             host->size(), ") and the device group '", device->name(), "' (rank ", device->rank(),
             " of ", device->size(), ") must be the same ranks under the same name");
  return std::make_shared<DeviceRouter>(std::move(host), std::move(device));
}

}  // namespace loom::comm
