#include "collectives/self_backend.h"

#include <deque>
#include <map>

#include "collectives/work.h"

namespace loom::comm {
namespace {

class SelfCommunicator final : public Communicator {
 public:
  explicit SelfCommunicator(const std::string& name) : Communicator(0, 1, name) {}
  const char* backend() const override { return "self"; }

 protected:
  WorkPtr allreduce_impl(const Tensor& in, Tensor& out, const AllreduceOptions&,
                         const OpInfo&) override {
    return copy(in, out);  // sum, avg, max and min over one rank are the value itself
  }
  WorkPtr reduce_scatter_impl(const Tensor& in, Tensor& out, const ReduceScatterOptions&,
                              const OpInfo&) override {
    return copy(in, out);
  }
  WorkPtr allgather_impl(const Tensor& in, Tensor& out, const AllgatherOptions&,
                         const OpInfo&) override {
    return copy(in, out);
  }
  WorkPtr broadcast_impl(Tensor&, const BroadcastOptions&, const OpInfo&) override {
    return completed_work();
  }
  WorkPtr reduce_impl(const Tensor& in, Tensor& out, const ReduceOptions&, const OpInfo&) override {
    return copy(in, out);
  }
  WorkPtr all_to_all_impl(const Tensor& in, Tensor& out, const AllToAllOptions&,
                          const OpInfo&) override {
    return copy(in, out);
  }
  WorkPtr batch_p2p_impl(const std::vector<P2POp>& ops, const OpInfo& info) override {
    // Sends first, so a batch holding both halves of a self-exchange completes.
    for (const P2POp& p : ops)
      if (p.kind == P2POp::Kind::kSend) pending_[p.tag].push_back(p.tensor.detach().clone());
    for (const P2POp& p : ops) {
      if (p.kind != P2POp::Kind::kRecv) continue;
      auto it = pending_.find(p.tag);
      LOOM_CHECK(it != pending_.end() && !it->second.empty(), describe(info),
                 ": recv from self with tag ", p.tag,
                 " has no matching send (it would wait forever)");
      Tensor msg = it->second.front();
      it->second.pop_front();
      LOOM_CHECK(msg.nbytes() == p.tensor.nbytes() && msg.dtype() == p.tensor.dtype(),
                 describe(info), ": recv of ", p.tensor.str(), " matched a send of ", msg.str());
      Tensor dst = p.tensor;
      dst.copy_(msg.reshape(dst.shape()));
    }
    return completed_work();
  }
  WorkPtr barrier_impl(const BarrierOptions&, const OpInfo&) override { return completed_work(); }
  std::shared_ptr<Communicator> split_impl(int, int, const std::string& name) override {
    return std::make_shared<SelfCommunicator>(name);
  }

 private:
  static WorkPtr copy(const Tensor& in, Tensor& out) {
    if (!in.same_as(out)) out.copy_(in.detach().reshape(out.shape()));
    return completed_work();
  }
  std::map<int, std::deque<Tensor>> pending_;  // tag -> sends not yet received
};

}  // namespace

std::shared_ptr<Communicator> make_self_communicator(const std::string& name) {
  return std::make_shared<SelfCommunicator>(name);
}

}  // namespace loom::comm
