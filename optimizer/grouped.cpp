#include "optimizer/grouped.h"

#include <string>

namespace loom::optim {
GroupedOptimizer::GroupedOptimizer(std::vector<Tensor> params, const std::vector<size_t>& group_of,
                                   const std::vector<OptimizerFactory>& make_group)
    : Optimizer("grouped optimizer", std::move(params), 0.0, /*f32_only=*/false) {
  LOOM_CHECK(!make_group.empty(), name_, ": no parameter group");
  LOOM_CHECK(group_of.size() == params_.size(), name_, ": ", group_of.size(), " group numbers for ",
             params_.size(), " parameters");
  members_.resize(make_group.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    LOOM_CHECK(group_of[i] < make_group.size(), name_, ": parameter ", i, " is in group ",
               group_of[i], " of ", make_group.size());
    place_.emplace_back(group_of[i], members_[group_of[i]].size());
    members_[group_of[i]].push_back(i);
  }
  for (size_t g = 0; g < make_group.size(); ++g) {
    LOOM_CHECK(make_group[g] != nullptr, name_, ": group ", g, " has no optimizer factory");
    std::vector<Tensor> mine;
    for (size_t i : members_[g]) mine.push_back(params_[i]);
    groups_.push_back(make_group[g](std::move(mine)));
    LOOM_CHECK(groups_.back() != nullptr, name_, ": group ", g,
               "'s optimizer factory returned null");
  }
  name_ = groups_[0]->name();
  lr_ = groups_[0]->lr();
}

void GroupedOptimizer::step() {
  for (auto& g : groups_) g->step();
}

// Each group's entries under their keys across groups: "{j}.{kind}" of group g is
// "{members_[g][j]}.{kind}".
template <typename Entries, typename Add>
void GroupedOptimizer::for_each_entry(Entries entries_of, Add add) const {
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (auto& [key, t] : entries_of(*groups_[g])) {
      size_t j;
      std::string kind;
      LOOM_CHECK(split_state_key(key, j, kind) && j < members_[g].size(), name_, ": group ", g,
                 "'s state key '", key, "' is not '{parameter}.{kind}'");
      add(std::to_string(members_[g][j]) + "." + kind, t);
    }
  }
}

std::vector<std::pair<std::string, Tensor>> GroupedOptimizer::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for_each_entry([](const Optimizer& o) { return o.state(); },
                 [&](std::string key, const Tensor& t) { out.emplace_back(std::move(key), t); });
  return out;
}

std::map<std::string, Tensor> GroupedOptimizer::state_dict() const {
  std::map<std::string, Tensor> out;
  for_each_entry([](const Optimizer& o) { return o.state_dict(); },
                 [&](std::string key, const Tensor& t) { out.emplace(std::move(key), t); });
  return out;
}

void GroupedOptimizer::load_state_dict(const std::map<std::string, Tensor>& state) {
  std::vector<std::map<std::string, Tensor>> parts(groups_.size());
  for (const auto& [key, t] : state) {
    size_t i;
    std::string kind;
    LOOM_CHECK(split_state_key(key, i, kind), name_, ": load_state_dict: unexpected key '", key,
               "' (keys are '{parameter}.{kind}')");
    LOOM_CHECK(i < params_.size(), name_, ": load_state_dict: '", key, "' is for parameter ", i,
               ", but this optimizer has ", params_.size());
    const auto [g, j] = place_[i];
    parts[g].emplace(std::to_string(j) + "." + kind, t);
  }
  std::vector<std::map<std::string, Tensor>> before;
  try {
    for (size_t g = 0; g < groups_.size(); ++g) {
      before.push_back(groups_[g]->state_dict());
      groups_[g]->load_state_dict(parts[g]);
    }
  } catch (...) {
    for (size_t g = 0; g + 1 < before.size(); ++g) groups_[g]->load_state_dict(before[g]);
    throw;
  }
}

}  // namespace loom::optim
