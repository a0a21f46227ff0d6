#include "collectives/topology.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "core/tensor.h"

namespace loom::comm {

namespace {

constexpr int64_t kNameBytes = 64;  // with the terminating zero

std::string host_name() {
  char name[kNameBytes] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "unknown-host";
  return name;
}

}  // namespace

NodeMap node_map(Communicator& group) {
  const int n = group.size();
  const std::string mine = host_name();
  Tensor local = Tensor::zeros({kNameBytes}, DType::kU8);
  std::memcpy(local.data_ptr(), mine.data(), std::min<size_t>(mine.size(), kNameBytes - 1));
  Tensor all = Tensor::empty({kNameBytes * n}, DType::kU8);
  if (n > 1)
    group.allgather(local, all)->wait();
  else
    all.copy_(local);
  NodeMap map;
  const auto* bytes = static_cast<const char*>(all.data_ptr());
  for (int r = 0; r < n; ++r) {
    const std::string name(bytes + int64_t(r) * kNameBytes);  // zero-terminated
    auto it = std::find(map.names.begin(), map.names.end(), name);
    if (it == map.names.end()) {
      map.node_of_rank.push_back(map.nodes());
      map.names.push_back(name);
    } else {
      map.node_of_rank.push_back(int(it - map.names.begin()));
    }
  }
  return map;
}

namespace {

// The rounds of a dissemination over `order` in which some pair of ranks is on two nodes.
int crossing_rounds(const std::vector<int>& node_of_rank, const std::vector<int>& order) {
  const size_t n = order.size();
  int crossing = 0;
  for (size_t step = 1; step < n; step *= 2) {
    for (size_t p = 0; p < n; ++p)
      if (node_of_rank[size_t(order[p])] != node_of_rank[size_t(order[(p + n - step) % n])]) {
        ++crossing;
        break;
      }
  }
  return crossing;
}

}  // namespace

std::vector<int> exchange_order(const std::vector<int>& node_of_rank) {
  const int n = int(node_of_rank.size());
  std::vector<int> index_in_node(static_cast<size_t>(n)), seen;  // seen[node]: its ranks so far
  for (int r = 0; r < n; ++r) {
    const int node = node_of_rank[size_t(r)];
    LOOM_CHECK(node >= 0 && node < n, "exchange_order: rank ", r, " is on node ", node,
               ", outside [0, ", n, ")");
    if (size_t(node) >= seen.size()) seen.resize(size_t(node) + 1, 0);
    index_in_node[size_t(r)] = seen[size_t(node)]++;
  }
  std::vector<int> ranks(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) ranks[size_t(r)] = r;
  std::vector<int> interleaved = ranks;
  std::stable_sort(interleaved.begin(), interleaved.end(), [&](int a, int b) {
    const int ia = index_in_node[size_t(a)], ib = index_in_node[size_t(b)];
    return ia != ib ? ia < ib : node_of_rank[size_t(a)] < node_of_rank[size_t(b)];
  });
  return crossing_rounds(node_of_rank, interleaved) < crossing_rounds(node_of_rank, ranks)
             ? interleaved
             : ranks;
}

}  // namespace loom::comm
