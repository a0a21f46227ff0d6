#include "parallel/replicas.h"

#include <cstring>

namespace loom::parallel {
namespace {

// FNV-1a over bytes: a fingerprint, compared across ranks (equal bytes, equal fingerprint).
uint64_t fingerprint(const void* data, size_t n, uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

uint64_t describe_fingerprint(const std::string& name, const Tensor& t) {
  std::string d = detail::str_cat(name, " ", shape_str(t.shape()), " ", dtype_name(t.dtype()));
  return fingerprint(d.data(), d.size());
}

uint64_t value_fingerprint(const Tensor& t) {
  Tensor host = t.detach().contiguous().to(Device::cpu());
  return fingerprint(host.data_ptr(), host.nbytes());
}

// Each rank's list of fingerprints, gathered: row r of the result is rank r's.
std::vector<int64_t> gather_rows(const std::vector<uint64_t>& mine, comm::Communicator& group) {
  const int64_t n = int64_t(mine.size());
  Tensor in = Tensor::empty({n}, DType::kI64);
  std::memcpy(in.data_ptr(), mine.data(), mine.size() * sizeof(uint64_t));
  Tensor out = Tensor::empty({n * group.size()}, DType::kI64);
  group.allgather(in, out)->wait();
  return out.to_vector<int64_t>();
}

}  // namespace

NamedParams parameters_by_owner(nn::Module& module,
                                const std::function<bool(const std::string&)>& own, bool own_side) {
  NamedParams params = module.named_parameters();
  if (!own) return own_side ? NamedParams{} : params;
  NamedParams out;
  for (auto& p : params)
    if (own(p.first) == own_side) out.push_back(p);
  return out;
}

NamedParams agreed_parameters(nn::Module& module, comm::Communicator* group, bool check_replicas,
                              const char* owner) {
  return agreed_parameters(module.named_parameters(), group, check_replicas, owner);
}

NamedParams agreed_parameters(NamedParams params, comm::Communicator* group, bool check_replicas,
                              const char* owner) {
  LOOM_CHECK(group != nullptr, owner, ": the group communicator is null");
  check_same_parameters(params, *group, owner);
  if (check_replicas)
    check_replicas_identical(params, *group, owner);
  else
    broadcast_parameters(params, *group, 0);
  return params;
}

void check_same_parameters(const NamedParams& params, comm::Communicator& group,
                           const char* owner) {
  // First the count, so the fingerprint rows below have one length on every rank.
  Tensor count = Tensor::full({1}, double(params.size()), DType::kI64);
  Tensor counts = Tensor::empty({group.size()}, DType::kI64);
  group.allgather(count, counts)->wait();
  const std::vector<int64_t> c = counts.to_vector<int64_t>();
  for (int r = 1; r < group.size(); ++r)
    LOOM_CHECK(c[r] == c[0], owner, ": rank ", r, " of group '", group.name(), "' has ", c[r],
               " parameters but rank 0 has ", c[0], " (every rank must build the same model)");
  std::vector<uint64_t> mine;
  for (const auto& [name, t] : params) mine.push_back(describe_fingerprint(name, t));
  const std::vector<int64_t> all = gather_rows(mine, group);
  const size_t n = params.size();
  for (size_t i = 0; i < n; ++i)
    for (int r = 1; r < group.size(); ++r)
      LOOM_CHECK(all[r * n + i] == all[i], owner, ": parameter ", i,
                 " differs between rank 0 and rank ", r, " of group '", group.name(),
                 "' in name, shape or dtype (this rank has '", params[i].first, "' ",
                 params[i].second.str(), "; every rank must build the same model)");
}

void broadcast_parameters(const NamedParams& params, comm::Communicator& group, int root) {
  size_t total = 0;
  for (const auto& [name, t] : params) total += t.nbytes();
  Tensor packed = Tensor::empty({int64_t(total)}, DType::kU8);
  auto* bytes = static_cast<unsigned char*>(packed.data_ptr());
  size_t at = 0;
  for (const auto& [name, t] : params) {
    Tensor host = t.detach().contiguous().to(Device::cpu());
    std::memcpy(bytes + at, host.data_ptr(), host.nbytes());
    at += host.nbytes();
  }
  group.broadcast(packed, comm::BroadcastOptions{root})->wait();
  at = 0;
  for (const auto& [name, t] : params) {
    Tensor host = Tensor::empty(t.shape(), t.dtype());
    std::memcpy(host.data_ptr(), bytes + at, host.nbytes());
    at += host.nbytes();
    Tensor(t).detach().copy_(host.to(t.device()));
  }
}

void check_replicas_identical(const NamedParams& params, comm::Communicator& group,
                              const char* owner) {
  check_same_parameters(params, group, owner);
  std::vector<uint64_t> mine;
  for (const auto& [name, t] : params) mine.push_back(value_fingerprint(t));
  const std::vector<int64_t> all = gather_rows(mine, group);
  const size_t n = params.size();
  for (size_t i = 0; i < n; ++i) {
    std::string differing;
    for (int r = 1; r < group.size(); ++r)
      if (all[r * n + i] != all[i]) differing += detail::str_cat(differing.empty() ? "" : ", ", r);
    LOOM_CHECK(differing.empty(), owner, ": parameter '", params[i].first,
               "' differs across the replicas of group '", group.name(), "': rank(s) ", differing,
               " hold values other than rank 0's (initialise with the same seed, or let the "
               "wrapper broadcast rank 0's parameters)");
  }
}

}  // namespace loom::parallel
