#include "core/nn/moe.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <string>

#include "core/autograd.h"
#include "core/ops.h"
#include "kernels/cuda/runtime.h"

namespace loom::nn {

void MoeOptions::validate() const {
  LOOM_CHECK(experts >= 0, "MoE: experts must be >= 0, got ", experts);
  if (experts == 0) return;
  LOOM_CHECK(top_k >= 1 && top_k <= experts, "MoE: top_k must be in [1, experts = ", experts,
             "], got ", top_k);
  LOOM_CHECK(every >= 1, "MoE: every must be >= 1 (block i is a MoE when i % every == 0), got ",
             every);
  LOOM_CHECK(capacity_factor >= 0 && std::isfinite(capacity_factor),
             "MoE: capacity_factor must be >= 0 (0: dropless), got ", capacity_factor);
  LOOM_CHECK(aux_loss >= 0 && std::isfinite(aux_loss), "MoE: aux_loss must be >= 0, got ",
             aux_loss);
  LOOM_CHECK(z_loss >= 0 && std::isfinite(z_loss), "MoE: z_loss must be >= 0, got ", z_loss);
  LOOM_CHECK(hidden >= 0, "MoE: hidden must be >= 0 (0: 4 x channels), got ", hidden);
  LOOM_CHECK(std::isfinite(receive_budget_mb),
             "MoE: receive_budget_mb must be finite (0: from memory, < 0: none), got ",
             receive_budget_mb);
}

namespace {

// Bytes of activations a received row costs: See Note [Dropless receive budget].
constexpr int64_t kBudgetBytesPerChannel = 22 * 4;

// Bytes available for new allocations on `device`: the host's MemAvailable, or the GPU's free
// memory. 0 when unknown (then no budget is derived).
int64_t available_bytes(Device device) {
  if (device.is_cuda()) return int64_t(cuda_rt::device_free_bytes(device.index));
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  long long kb = 0;
  while (std::getline(meminfo, line))
    if (std::sscanf(line.c_str(), "MemAvailable: %lld kB", &kb) == 1) return int64_t(kb) * 1024;
  return 0;
}

}  // namespace

int64_t moe_receive_budget_rows(double budget_mb, int64_t channels, Device device) {
  if (budget_mb < 0) return -1;
  const double bytes =
      budget_mb > 0 ? budget_mb * 1024.0 * 1024.0 : double(available_bytes(device)) / 4.0;
  if (bytes <= 0) return -1;  // nothing known: no budget
  return std::max<int64_t>(1, int64_t(bytes / double(kBudgetBytesPerChannel * channels)));
}

int64_t moe_budget_capacity(int64_t budget, int64_t upper,
                            const std::function<int64_t(int64_t)>& rows) {
  int64_t lo = 0, hi = upper;  // rows(lo) fits (0 rows); find the largest that does
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (rows(mid) <= budget)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

void moe_warn_budget_fallback(int64_t rows, int64_t budget, int64_t cap, int64_t dropped) {
  static std::atomic<int64_t> fallbacks{0};
  const int64_t count = ++fallbacks;
  if (count != 1 && count % 100 != 0) return;
  std::fprintf(stderr,
               "loom: warning: MoE: dropless routing would have a rank receive %lld rows, over "
               "its receive budget of %lld rows (MoeOptions::receive_budget_mb, "
               "--moe-receive-budget-mb); this forward keeps the first %lld assignments of each "
               "expert in token order and drops %lld (fallback %lld of this process)\n",
               static_cast<long long>(rows), static_cast<long long>(budget),
               static_cast<long long>(cap), static_cast<long long>(dropped),
               static_cast<long long>(count));
}

void MoeBatchSplit::begin(int64_t parts, bool record, int64_t seen) {
  LOOM_CHECK(parts >= 1, "MoE: a batch comes in at least one part, got ", parts);
  LOOM_CHECK(seen >= 0 && seen <= parts, "MoE: a layer sees ", seen, " of ", parts, " parts");
  parts_ = parts;
  seen_ = seen > 0 ? seen : parts;
  recording_ = record;
  done_ = recorded_tokens_ = 0;
  before_.clear();
  recorded_.clear();
  recorded_parts_.clear();
  part_places_.clear();
}

void MoeBatchSplit::plan(int64_t parts, const std::vector<int64_t>& recorded,
                         std::vector<std::vector<int64_t>> before) {
  LOOM_CHECK(!before.empty() && int64_t(before.size()) <= parts && recorded.size() >= 2,
             "MoE: plan a batch of ", parts, " parts with the places of 1 to ", parts,
             " of them and the whole batch's counts, got ", before.size(), " places and ",
             recorded.size(), " counts");
  begin(parts, /*record=*/false, int64_t(before.size()));
  recorded_.assign(recorded.begin(), recorded.end() - 1);
  recorded_tokens_ = recorded.back();
  part_places_ = std::move(before);
}

std::vector<int64_t> MoeBatchSplit::recorded() const {
  std::vector<int64_t> out = recorded_;
  out.push_back(recorded_tokens_);
  return out;
}

void MoeBatchSplit::set_recorded(const std::vector<int64_t>& counts) {
  LOOM_CHECK(!recorded_.empty() && counts.size() == recorded_.size() + 1 && !recording_,
             "MoE: set_recorded after the routing pass takes ", recorded_.size() + 1,
             " counts, got ", counts.size());
  recorded_.assign(counts.begin(), counts.end() - 1);
  recorded_tokens_ = counts.back();
}

MoeBatchSplit::Part MoeLayer::next_part(const std::vector<int64_t>& routed, int64_t tokens,
                                        double aux_loss, double capacity_factor) {
  if (autograd::recomputing()) return forward_part_;
  forward_part_ = split_.next(routed, tokens, aux_loss, capacity_factor);
  return forward_part_;
}

MoeBatchSplit::Part MoeBatchSplit::next(const std::vector<int64_t>& routed, int64_t tokens,
                                        double aux_loss, double capacity_factor) {
  LOOM_CHECK(seen_ == parts_ || capacity_factor == 0 || recording_ || !part_places_.empty(),
             "MoE: a layer that sees ", seen_, " of ", parts_,
             " parts of a batch (replicated over pipelines) needs each part's place in the "
             "experts' queues for capacity: plan the batch (MoeBatchSplit::plan) from a routing "
             "pass that saw every part");
  Part p;
  p.tokens = tokens * parts_;
  p.recording = recording_;
  p.before = !part_places_.empty() ? part_places_.at(size_t(done_))
             : before_.empty()     ? std::vector<int64_t>(routed.size(), 0)
                                   : before_;
  if (!recording_ && !recorded_.empty()) {
    LOOM_CHECK(recorded_tokens_ == p.tokens, "MoE: the batch's parts hold ", p.tokens,
               " tokens in all, but its routing pass counted ", recorded_tokens_,
               "; forward the same parts in both passes (See Note [A batch in micro-batches])");
    p.routed = recorded_;
  } else {
    LOOM_CHECK(parts_ == 1 || recording_ || aux_loss == 0, "MoE: a batch split into ", parts_,
               " parts needs the whole batch's routing counts for its load-balancing loss "
               "(aux_loss ",
               aux_loss,
               "): begin the batch with a routing pass, moe_begin_batch(model, parts, "
               "record = true), and forward every part once without gradients first (See Note "
               "[A batch in micro-batches])");
    p.routed = routed;  // the whole batch's when it is one part; unused by a zero aux_loss
  }
  if (before_.empty()) before_.assign(routed.size(), 0);
  if (recording_ && recorded_.empty()) recorded_.assign(routed.size(), 0);
  for (size_t e = 0; e < routed.size(); ++e) {
    before_[e] += routed[e];
    if (recording_) recorded_[e] += routed[e];
  }
  if (recording_) {
    recorded_tokens_ += tokens;
    recorded_parts_.push_back(routed);
  }
  if (++done_ < seen_) return p;
  if (recording_) {  // the routing pass is over: the real one follows, with its counts
    recording_ = false;
    done_ = 0;
    before_.clear();
  } else {
    begin(1, false);  // back to whole batches
  }
  return p;
}

std::vector<MoeLayer*> moe_layers_of(Module& model) {
  std::vector<MoeLayer*> out;
  if (auto* layer = dynamic_cast<MoeLayer*>(&model)) out.push_back(layer);
  for (const auto& [name, child] : model.children()) {
    const std::vector<MoeLayer*> inner = moe_layers_of(*child);
    out.insert(out.end(), inner.begin(), inner.end());
  }
  return out;
}

int64_t moe_begin_batch(Module& model, int64_t parts, bool record, int64_t seen) {
  const std::vector<MoeLayer*> layers = moe_layers_of(model);
  for (MoeLayer* layer : layers) layer->begin_batch(parts, record, seen);
  return int64_t(layers.size());
}

MoE::MoE(int64_t channels, const MoeOptions& options, double dropout, double proj_std)
    : options_(options) {
  options_.validate();
  LOOM_CHECK(options_.enabled(), "MoE: needs at least one expert");
  router = register_module("router",
                           std::make_shared<Linear>(channels, options_.experts, /*bias=*/false));
  experts = register_module("experts", std::make_shared<ModuleList>());
  for (int64_t e = 0; e < options_.experts; ++e) {
    experts_.push_back(std::make_shared<MLP>(channels, 0.0, proj_std, options_.hidden));
    experts->push_back(experts_.back());
  }
  drop = register_module("drop", std::make_shared<Dropout>(dropout));
}

namespace {

// logsumexp over the last dim of logits [N, E]: m + log(sum(exp(logits - m))), m the row max
// (held constant: its gradient cancels).
Tensor logsumexp_rows(const Tensor& logits) {
  Tensor m = max_dim(logits, 1, /*keepdim=*/true).values.detach();
  Tensor shifted = sub(logits, expand(m, logits.shape()));
  return add(unary(sum(unary(shifted, Unary::kExp), 1), Unary::kLog), m.reshape({m.numel()}));
}

}  // namespace

MoeRouting moe_route(Linear& router, const Tensor& flat, const MoeOptions& o) {
  const int64_t n = flat.size(0), k = o.top_k;
  MoeRouting r;
  // [N, E], f32 whatever the activations' dtype: a bf16 / f16 model routes in f32 (the router's
  // weight and the tokens widened exactly), as the layer asks.
  r.logits = flat.dtype() == DType::kF32
                 ? router(flat)
                 : linear(flat.to(DType::kF32), router.weight.to(DType::kF32));
  r.probs = softmax(r.logits);
  ValuesIndices top = topk(r.probs, k, 1);  // [N, k], ties to the lower index
  Tensor gates = k > 1 ? div(top.values, expand(sum(top.values, 1, true), {n, k})) : top.values;
  r.gates = gates.reshape({n * k, 1});
  r.choice = top.indices.to_vector<int64_t>();
  r.routed.assign(static_cast<size_t>(o.experts), 0);
  for (int64_t e : r.choice) ++r.routed[size_t(e)];
  return r;
}

MoeAssignments moe_assign(const MoeRouting& r, const MoeOptions& o, int64_t capacity,
                          const std::vector<int64_t>& taken) {
  const auto experts = static_cast<size_t>(o.experts);
  const int64_t k = o.top_k, n = int64_t(r.choice.size()) / k;
  MoeAssignments a;
  a.tokens.resize(experts);
  a.slots.resize(experts);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const auto e = size_t(r.choice[size_t(t * k + j)]);
      const int64_t place = (taken.empty() ? 0 : taken[e]) + int64_t(a.tokens[e].size());
      if (capacity >= 0 && place >= capacity) {
        ++a.dropped;
        continue;
      }
      a.tokens[e].push_back(t);
      a.slots[e].push_back(t * k + j);
    }
  return a;
}

Tensor moe_experts_forward(const std::vector<std::shared_ptr<MLP>>& experts, const Tensor& rows,
                           const std::vector<int64_t>& counts) {
  // Only the experts that have rows take part: the others get no gradient, as an unused
  // module's parameters get none (an optimizer then leaves them alone).
  std::vector<Tensor> fc_w, fc_b, proj_w, proj_b;
  std::vector<int64_t> used;
  for (size_t e = 0; e < experts.size(); ++e) {
    if (counts[e] == 0) continue;
    used.push_back(counts[e]);
    fc_w.push_back(experts[e]->fc->weight);
    fc_b.push_back(experts[e]->fc->bias);
    proj_w.push_back(experts[e]->proj->weight);
    proj_b.push_back(experts[e]->proj->bias);
  }
  LOOM_CHECK(!used.empty(), "moe_experts_forward: no expert has rows");
  return grouped_linear(gelu(grouped_linear(rows, used, fc_w, fc_b)), used, proj_w, proj_b);
}

int64_t moe_capacity(const MoeOptions& o, int64_t tokens) {
  if (o.capacity_factor <= 0) return -1;
  return int64_t(
      std::ceil(double(o.top_k) * double(tokens) * o.capacity_factor / double(o.experts)));
}

Tensor moe_aux_loss(const MoeRouting& r, const MoeOptions& o, const std::vector<int64_t>& routed,
                    int64_t tokens, double* balance, double* z) {
  const int64_t e_count = o.experts;
  const Device device = r.probs.device();
  std::vector<float> fraction(static_cast<size_t>(e_count));
  for (int64_t e = 0; e < e_count; ++e)
    fraction[size_t(e)] = float(double(routed[size_t(e)]) / double(tokens * o.top_k));
  Tensor f = Tensor::from_vector(fraction, {e_count}).to(device);
  // alpha E sum_e f_e P_e, P_e's share: these tokens' probabilities over the whole batch's count
  Tensor b = scale(sum(mul(sum(r.probs, 0), f)), o.aux_loss * double(e_count) / double(tokens));
  Tensor lse = logsumexp_rows(r.logits);
  Tensor zl = scale(sum(mul(lse, lse)), o.z_loss / double(tokens));
  *balance = b.item();
  *z = zl.item();
  return add(b, zl);
}

Tensor MoE::forward(const Tensor& x) {
  LOOM_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == router->in_features(), "MoE: input ",
             x.defined() ? shape_str(x.shape()) : "undefined", " must end in the ",
             router->in_features(), " channels");
  LOOM_CHECK(is_floating(x.dtype()), "MoE: floating inputs only, got ", dtype_name(x.dtype()));
  const int64_t c = x.size(-1), n = x.numel() / c, e_count = options_.experts;
  // What this forward routed, kept as stats() unless it is a recomputation (next_part).
  MoeStats stats;
  stats.load.assign(size_t(e_count), 0);
  if (n == 0) {  // nothing to route: no output, no loss
    next_part(stats.load, 0, 0.0, 0.0);
    aux_loss_ = Tensor::zeros({}, DType::kF32, x.device());
    if (!autograd::recomputing()) stats_ = std::move(stats);
    return (*drop)(Tensor::zeros(x.shape(), x.dtype(), x.device()));
  }
  Tensor flat = x.reshape({n, c});
  const MoeRouting routing = moe_route(*router, flat, options_);
  const MoeBatchSplit::Part part =
      next_part(routing.routed, n, options_.aux_loss, options_.capacity_factor);
  int64_t capacity = moe_capacity(options_, part.tokens);
  std::vector<int64_t> taken;  // capacity's places count from the batch's first token
  if (capacity >= 0) {
    taken = part.before;
  } else {  // dropless: within the receive budget, See Note [Dropless receive budget]
    if (budget_rows_ == 0)
      budget_rows_ = moe_receive_budget_rows(options_.receive_budget_mb, c, x.device());
    const int64_t rows = std::accumulate(routing.routed.begin(), routing.routed.end(), int64_t(0));
    if (budget_rows_ > 0 && rows > budget_rows_) {
      const int64_t most = *std::max_element(routing.routed.begin(), routing.routed.end());
      capacity = moe_budget_capacity(budget_rows_, most, [&](int64_t cap) {
        int64_t kept = 0;
        for (int64_t r : routing.routed) kept += std::min(r, cap);
        return kept;
      });
      stats.budget_capacity = capacity;
    }
  }
  const MoeAssignments assigned = moe_assign(routing, options_, capacity, taken);
  stats.tokens = n;
  stats.dropped = assigned.dropped;
  if (!autograd::recomputing() && stats.budget_capacity >= 0)
    moe_warn_budget_fallback(
        std::accumulate(routing.routed.begin(), routing.routed.end(), int64_t(0)), budget_rows_,
        capacity, assigned.dropped);

  // out = sum over experts, in index order, of gate * expert(x) at the expert's tokens, summed
  // in f32 (the experts run in the activations' dtype; a bf16 model's combine is widened).
  // Every expert's rows, sorted by expert, through one grouped MLP (moe_experts_forward).
  Tensor out = Tensor::zeros({n, c}, DType::kF32, x.device());
  std::vector<int64_t> order, counts;
  for (int64_t e = 0; e < e_count; ++e) {
    const std::vector<int64_t>& mine = assigned.tokens[size_t(e)];
    stats.load[size_t(e)] = int64_t(mine.size());
    order.insert(order.end(), mine.begin(), mine.end());
    counts.push_back(int64_t(mine.size()));
  }
  if (!order.empty()) {
    Tensor sorted =
        embedding(flat, Tensor::from_vector(order, {int64_t(order.size())}).to(x.device()));
    Tensor y = moe_experts_forward(experts_, sorted, counts).to(DType::kF32);  // [rows, C]
    int64_t offset = 0;
    for (int64_t e = 0; e < e_count; ++e) {  // combined per expert: each token once per call
      const int64_t m = counts[size_t(e)];
      if (m == 0) continue;
      Tensor rows = Tensor::from_vector(assigned.tokens[size_t(e)], {m}).to(x.device());
      Tensor where = Tensor::from_vector(assigned.slots[size_t(e)], {m}).to(x.device());
      Tensor g = expand(embedding(routing.gates, where), {m, c});
      out = index_add_rows(out, rows, mul(narrow(y, 0, offset, m), g));
      offset += m;
    }
  }
  out = out.to(x.dtype());
  aux_loss_ = part.recording ? Tensor::zeros({}, DType::kF32, x.device())
                             : moe_aux_loss(routing, options_, part.routed, part.tokens,
                                            &stats.aux_loss, &stats.z_loss);
  if (!autograd::recomputing()) stats_ = std::move(stats);
  return (*drop)(out.reshape(x.shape()));
}

}  // namespace loom::nn
