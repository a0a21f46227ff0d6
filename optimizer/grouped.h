// Parameter groups as one optimizer (torch.optim's param_groups): group g is an optimizer of its
// own kind and options over the parameters assigned to it, and step() steps every group with its
// own learning rate. Elementwise optimizers update a parameter the same whatever else they
// hold, so a grouped optimizer steps each parameter exactly as its group's optimizer alone would.
//
// State names count the parameters across groups in the order they were given ("{i}.exp_avg" is
// parameter i of the whole list), so the state dict reads like one optimizer's: ZeRO's
// checkpoints, which name state by its piece of a parameter, take it unchanged.
#pragma once

#include <memory>
#include <vector>

#include "optimizer/optimizer.h"

namespace loom::optim {

class GroupedOptimizer : public Optimizer {
 public:
  // `group_of[i]`: the group of params[i], in [0, make_group.size()); make_group[g] builds group
  // g's optimizer over its parameters, in their order in `params`. A group may hold none.
  GroupedOptimizer(std::vector<Tensor> params, const std::vector<size_t>& group_of,
                   const std::vector<OptimizerFactory>& make_group);

  // Every group, each at its own learning rate (group(g).set_lr).
  void step() override;
  size_t group_count() const { return groups_.size(); }
  Optimizer& group(size_t g) const { return *groups_.at(g); }

  std::vector<std::pair<std::string, Tensor>> state() const override;
  std::map<std::string, Tensor> state_dict() const override;
  // Each group checks its part before anything changes; a group that refuses puts back what
  // the groups before it loaded, so a failed load changes nothing.
  void load_state_dict(const std::map<std::string, Tensor>& state) override;

 private:
  template <typename Entries, typename Add>
  void for_each_entry(Entries entries_of, Add add) const;

  std::vector<std::unique_ptr<Optimizer>> groups_;
  std::vector<std::vector<size_t>> members_;      // per group: its parameters' indices in params_
  std::vector<std::pair<size_t, size_t>> place_;  // per parameter: (group, index in the group)
};

}  // namespace loom::optim
