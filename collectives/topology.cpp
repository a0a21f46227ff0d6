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

}  // namespace loom::comm
