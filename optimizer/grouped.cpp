#include "optimizer/grouped.h"

#include <string>

namespace loom::optim {
namespace {

// "{j}.{kind}" -> (j, kind); false for a key that is not one.
bool split_key(const std::string& key, size_t& index, std::string& kind) {
  const size_t dot = key.find('.');
  if (dot == 0 || dot == std::string::npos) return false;
  index = 0;
  for (size_t k = 0; k < dot; ++k) {
    if (key[k] < '0' || key[k] > '9') return false;
    index = index * 10 + size_t(key[k] - '0');
  }
  kind = key.substr(dot + 1);
  return true;
}

}  // namespace

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

std::vector<std::pair<std::string, Tensor>> GroupedOptimizer::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (auto& [key, t] : groups_[g]->state()) {
      size_t j;
      std::string kind;
      LOOM_CHECK(split_key(key, j, kind) && j < members_[g].size(), name_, ": group ", g,
                 "'s state key '", key, "' is not '{parameter}.{kind}'");
      out.emplace_back(std::to_string(members_[g][j]) + "." + kind, t);
    }
  }
  return out;
}

std::map<std::string, Tensor> GroupedOptimizer::state_dict() const {
  std::map<std::string, Tensor> out;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (auto& [key, t] : groups_[g]->state_dict()) {
      size_t j;
      std::string kind;
      LOOM_CHECK(split_key(key, j, kind) && j < members_[g].size(), name_, ": group ", g,
                 "'s state key '", key, "' is not '{parameter}.{kind}'");
      out.emplace(std::to_string(members_[g][j]) + "." + kind, t);
    }
  }
  return out;
}

void GroupedOptimizer::load_state_dict(const std::map<std::string, Tensor>& state) {
  std::vector<std::map<std::string, Tensor>> parts(groups_.size());
  for (const auto& [key, t] : state) {
    size_t i;
    std::string kind;
    LOOM_CHECK(split_key(key, i, kind), name_, ": load_state_dict: unexpected key '", key,
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
