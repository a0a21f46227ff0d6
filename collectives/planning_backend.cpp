#include "collectives/planning_backend.h"

namespace loom::comm {
namespace {

class PlanningCommunicator final : public Communicator {
 public:
  PlanningCommunicator(int rank, int size, const std::string& name)
      : Communicator(rank, size, name) {}
  const char* backend() const override { return "planning"; }

 protected:
  WorkPtr allreduce_impl(const Tensor&, Tensor&, const AllreduceOptions&,
                         const OpInfo& info) override {
    refuse(info);
  }
  WorkPtr reduce_scatter_impl(const Tensor&, Tensor&, const ReduceScatterOptions&,
                              const OpInfo& info) override {
    refuse(info);
  }
  WorkPtr allgather_impl(const Tensor&, Tensor&, const AllgatherOptions&,
                         const OpInfo& info) override {
    refuse(info);
  }
  WorkPtr broadcast_impl(Tensor&, const BroadcastOptions&, const OpInfo& info) override {
    refuse(info);
  }
  WorkPtr reduce_impl(const Tensor&, Tensor&, const ReduceOptions&, const OpInfo& info) override {
    refuse(info);
  }
  WorkPtr all_to_all_impl(const Tensor&, Tensor&, const AllToAllOptions&,
                          const OpInfo& info) override {
    refuse(info);
  }
  WorkPtr batch_p2p_impl(const std::vector<P2POp>&, const OpInfo& info) override { refuse(info); }
  WorkPtr barrier_impl(const BarrierOptions&, const OpInfo& info) override { refuse(info); }
  std::shared_ptr<Communicator> split_impl(int, int, const std::string& name) override {
    LOOM_FAIL("group '", this->name(),
              "' is a planning group (no other rank exists): it cannot "
              "split into '",
              name, "'");
  }

 private:
  [[noreturn]] void refuse(const OpInfo& info) const {
    LOOM_FAIL(describe(info),
              ": a planning group carries no data (it stands for one rank of a "
              "layout that is not running)");
  }
};

}  // namespace

std::shared_ptr<Communicator> make_planning_communicator(int rank, int size,
                                                         const std::string& name) {
  LOOM_CHECK(size > 0 && rank >= 0 && rank < size, "planning group '", name, "': rank ", rank,
             " outside a group of ", size);
  return std::make_shared<PlanningCommunicator>(rank, size, name);
}

}  // namespace loom::comm
