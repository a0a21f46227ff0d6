#include "parallel/expert_parallel.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <map>
#include <string>
#include <utility>

#include "core/autograd.h"
#include "core/ops.h"
#include "parallel/tensor_parallel/layers.h"

namespace loom::parallel {

namespace {

Tensor index_tensor(const std::vector<int64_t>& v, Device device) {
  return Tensor::from_vector(v, {int64_t(v.size())}).to(device);
}

// The experts of one rank, named by their global index (so their parameters carry the
// single-process names).
class ExpertSet final : public nn::Module {
 public:
  void add(int64_t index, std::shared_ptr<nn::Module> expert) {
    register_module(std::to_string(index), std::move(expert));
  }
  using nn::Module::register_module;
};

int64_t total(const std::vector<int64_t>& v) {
  int64_t t = 0;
  for (int64_t x : v) t += x;
  return t;
}

// Seconds spent in the exchanges since the last take_expert_exchange_seconds().
double exchange_seconds = 0;

// Runs one exchange and counts its time.
void timed_all_to_all(comm::Communicator& group, const Tensor& in, Tensor& out,
                      const comm::AllToAllOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  group.all_to_all(in, out, options)->wait();
  exchange_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

bool is_expert_parameter(const std::string& name) {
  return name.find(".mlp.experts.") != std::string::npos;
}

std::string expert_layer_of(const std::string& name) {
  const size_t at = name.find(".mlp.experts.");
  LOOM_CHECK(at != std::string::npos, "expert_layer_of: '", name, "' is not an expert parameter");
  return name.substr(0, at + 4);  // up to and with ".mlp"
}

namespace {

// Each group's bias repeated over its rows: [sum of counts, c] (differentiable in the biases).
Tensor grouped_bias_rows(const std::vector<Tensor>& biases, const std::vector<int64_t>& counts,
                         int64_t c, Device device) {
  std::vector<Tensor> parts;
  for (size_t g = 0; g < biases.size(); ++g)
    if (counts[g] > 0) parts.push_back(expand(biases[g].reshape({1, c}), {counts[g], c}));
  return parts.size() == 1 ? parts[0] : cat(parts, 0);
}

}  // namespace

double take_expert_exchange_seconds() {
  const double s = exchange_seconds;
  exchange_seconds = 0;
  return s;
}

Tensor all_to_all_rows(const Tensor& x, const std::vector<int64_t>& send_rows,
                       const std::vector<int64_t>& recv_rows,
                       const std::shared_ptr<comm::Communicator>& group) {
  LOOM_CHECK(x.dim() == 2 && total(send_rows) == x.size(0), "all_to_all_rows: ", x.str(),
             " must be [rows, C] with the ", total(send_rows), " rows send_rows adds up to");
  const int64_t c = x.size(1);
  auto elements = [c](const std::vector<int64_t>& rows) {
    std::vector<int64_t> e;
    for (int64_t r : rows) e.push_back(r * c);
    return e;
  };
  Tensor in = x.detach().contiguous();
  Tensor out = Tensor::empty({total(recv_rows), c}, x.dtype(), x.device());
  timed_all_to_all(*group, in, out, {elements(send_rows), elements(recv_rows)});
  autograd::record(
      out, "all_to_all_rows", {x}, {},
      [group, send_rows, recv_rows, c, dtype = x.dtype(), device = x.device(),
       elements](const Tensor& g) {
        Tensor back = Tensor::empty({total(send_rows), c}, dtype, device);
        Tensor grad = g.detach().contiguous();
        group->all_to_all(grad, back, {elements(recv_rows), elements(send_rows)})->wait();
        return std::vector<Tensor>{back};
      });
  return out;
}

ExpertParallelMoE::ExpertParallelMoE(int64_t channels, const nn::MoeOptions& options,
                                     std::shared_ptr<comm::Communicator> ep,
                                     std::shared_ptr<comm::Communicator> batch, double dropout,
                                     double proj_std, std::shared_ptr<comm::Communicator> tp)
    : options_(options), ep_(std::move(ep)), batch_(std::move(batch)), tp_(std::move(tp)) {
  options_.validate();
  LOOM_CHECK(options_.enabled(), "ExpertParallelMoE: needs at least one expert");
  LOOM_CHECK(ep_ != nullptr && batch_ != nullptr, "ExpertParallelMoE: the ep and batch groups ",
             "must be given");
  LOOM_CHECK(options_.experts % ep_->size() == 0, "ExpertParallelMoE: ", options_.experts,
             " experts do not split evenly over the ", ep_->size(), " ranks of ep group '",
             ep_->name(), "'");
  LOOM_CHECK(batch_->size() >= ep_->size(), "ExpertParallelMoE: the batch group '", batch_->name(),
             "' (", batch_->size(), " ranks) must contain the ep group's ", ep_->size());
  local_ = options_.experts / ep_->size();
  first_ = int64_t(ep_->rank()) * local_;
  router = register_module("router", std::make_shared<nn::Linear>(channels, options_.experts,
                                                                  /*bias=*/false));
  auto set = std::make_shared<ExpertSet>();
  const int64_t hidden = options_.expert_width(channels);
  for (int64_t l = 0; l < local_; ++l) {
    if (!tp_) {
      experts_.push_back(std::make_shared<nn::MLP>(channels, 0.0, proj_std, options_.hidden));
      set->add(first_ + l, experts_.back());
      continue;
    }
    // nn::MLP's parameters in tp slices, under its names (See Note [Experts split over tp]).
    auto expert = std::make_shared<ExpertSet>();
    auto fc = std::make_shared<ColumnParallelLinear>(channels, hidden, tp_);
    RowParallelOptions row;
    row.init_std = proj_std;
    auto proj = std::make_shared<RowParallelLinear>(hidden, channels, tp_, row);
    expert->register_module("fc", fc);
    expert->register_module("proj", proj);
    split_experts_.push_back({fc->weight, fc->bias, proj->weight, proj->bias});
    set->add(first_ + l, expert);
  }
  experts = register_module<nn::Module>("experts", set);
  drop = register_module("drop", std::make_shared<nn::Dropout>(dropout));
}

Tensor ExpertParallelMoE::forward(const Tensor& x) {
  LOOM_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == router->in_features(),
             "ExpertParallelMoE: input ", x.defined() ? shape_str(x.shape()) : "undefined",
             " must end in the ", router->in_features(), " channels");
  LOOM_CHECK(is_floating(x.dtype()), "ExpertParallelMoE: floating inputs only, got ",
             dtype_name(x.dtype()));
  const int64_t c = x.size(-1), n = x.numel() / c, e_count = options_.experts;
  LOOM_CHECK(n > 0, "ExpertParallelMoE: this rank has no tokens");
  const Device device = x.device();
  Tensor flat = x.reshape({n, c});
  const nn::MoeRouting routing = nn::moe_route(*router, flat, options_);

  // 1. The whole batch's counts: each rank's routed counts and token count, gathered.
  const int64_t width = e_count + 1, b_size = batch_->size(), b_rank = batch_->rank();
  std::vector<int64_t> mine = routing.routed;
  mine.push_back(n);
  Tensor all = Tensor::empty({width * b_size}, DType::kI64);
  batch_->allgather(Tensor::from_vector(mine, {width}), all)->wait();
  const std::vector<int64_t> counts = all.to_vector<int64_t>();
  std::vector<int64_t> routed(static_cast<size_t>(e_count), 0), taken = routed;
  int64_t tokens = 0;  // this part's, over the batch group
  for (int64_t b = 0; b < b_size; ++b) {
    for (int64_t e = 0; e < e_count; ++e) {
      routed[size_t(e)] += counts[size_t(b * width + e)];
      if (b < b_rank) taken[size_t(e)] += counts[size_t(b * width + e)];
    }
    tokens += counts[size_t(b * width + e_count)];
  }
  // The batch this forward is part of (See Note [A batch in micro-batches] in core/nn/moe.h).
  const nn::MoeBatchSplit::Part part =
      next_part(routed, tokens, options_.aux_loss, options_.capacity_factor);
  int64_t capacity = nn::moe_capacity(options_, part.tokens);
  // What this forward routed, kept as stats() unless it is a recomputation (next_part).
  nn::MoeStats stats;
  int64_t most = 0;  // dropless: the most rows a rank would receive
  if (capacity >= 0) {
    // Places count from the batch's first token: the earlier parts' assignments come first.
    for (int64_t e = 0; e < e_count; ++e) taken[size_t(e)] += part.before[size_t(e)];
  } else {  // See Note [Dropless receive budget] in core/nn/moe.h
    if (budget_rows_ == 0) learn_budget(c, device);
    if (budget_rows_ > 0 && (most = most_received(total(routed), counts)) > budget_rows_) {
      capacity =
          nn::moe_budget_capacity(budget_rows_, *std::max_element(routed.begin(), routed.end()),
                                  [&](int64_t cap) { return most_received(cap, counts); });
      stats.budget_capacity = capacity;
    }
  }
  const nn::MoeAssignments assigned = nn::moe_assign(routing, options_, capacity, taken);
  stats.tokens = tokens;
  for (int64_t e = 0; e < e_count; ++e) {
    // Kept: this part's assignments within the places the earlier parts left (capacity mode).
    const int64_t r = routed[size_t(e)];
    const int64_t earlier = stats.budget_capacity < 0 ? part.before[size_t(e)] : 0;
    stats.load.push_back(capacity < 0 ? r : std::clamp(capacity - earlier, int64_t(0), r));
    stats.dropped += r - stats.load.back();
  }
  if (!autograd::recomputing() && stats.budget_capacity >= 0 && b_rank == 0)
    nn::moe_warn_budget_fallback(most, budget_rows_, capacity, stats.dropped);

  // 2. Dispatch: expert e's rows to ep rank e / local_, in expert then token order.
  const int64_t p = ep_->size();
  std::vector<int64_t> send_counts, send_index, send_rows(static_cast<size_t>(p), 0);
  for (int64_t e = 0; e < e_count; ++e) {
    const std::vector<int64_t>& rows = assigned.tokens[size_t(e)];
    send_counts.push_back(int64_t(rows.size()));
    send_rows[size_t(e / local_)] += int64_t(rows.size());
    send_index.insert(send_index.end(), rows.begin(), rows.end());
  }
  // recv_counts[s * local_ + l]: rows rank s sends to local expert l.
  Tensor recv_counts_t = Tensor::empty({e_count}, DType::kI64);
  ep_->all_to_all(Tensor::from_vector(send_counts, {e_count}), recv_counts_t)->wait();
  const std::vector<int64_t> recv_counts = recv_counts_t.to_vector<int64_t>();
  std::vector<int64_t> recv_rows(static_cast<size_t>(p), 0);
  for (int64_t s = 0; s < p; ++s)
    for (int64_t l = 0; l < local_; ++l)
      recv_rows[size_t(s)] += recv_counts[size_t(s * local_ + l)];
  // Note [Every rank takes part in both backward exchanges]: the chain flat -> send ->
  // received -> results -> back -> out is kept whole on every rank, also where a piece has no
  // rows (then a zero-row view of the piece before it), so that autograd runs the two exchanges'
  // backwards on every rank: a rank that skipped one would leave the others waiting.
  Tensor send = send_index.empty() ? narrow(flat, 0, 0, 0)
                                   : embedding(flat, index_tensor(send_index, device));
  Tensor received = all_to_all_rows(send, send_rows, recv_rows, ep_);

  // 3. Each local expert over every rank's rows, in rank order.
  const int64_t r_total = total(recv_rows);
  // Computed in the activations' dtype, placed in f32, and sent back in the activations' dtype
  // (a bf16 model exchanges bf16 rows); the combine below sums in f32, as nn::MoE's.
  Tensor results =
      r_total == 0 ? narrow(received, 0, 0, 0) : Tensor::zeros({r_total, c}, DType::kF32, device);
  // With tp, the received rows feed every tp rank's slices: their gradient sums the slices'.
  const Tensor expert_input = tp_ && r_total > 0 ? copy_to_tp(received, tp_) : received;
  // The received rows sorted by local expert (each expert's in rank order), through the local
  // experts as one grouped MLP, and placed back where they were received.
  std::vector<int64_t> order, rows_of(static_cast<size_t>(local_), 0);
  for (int64_t l = 0; l < local_; ++l) {
    int64_t offset = 0;  // of the (s, j) block in the received rows
    for (int64_t s = 0; s < p; ++s)
      for (int64_t j = 0; j < local_; ++j) {
        const int64_t m = recv_counts[size_t(s * local_ + j)];
        if (j == l)
          for (int64_t i = 0; i < m; ++i) order.push_back(offset + i);
        if (j == l) rows_of[size_t(l)] += m;
        offset += m;
      }
  }
  if (r_total > 0) {
    Tensor where = index_tensor(order, device);
    Tensor y = expert_rows(embedding(expert_input, where), rows_of).to(DType::kF32);
    results = index_add_rows(results, where, y);
    if (tp_) {  // the slices' partial outputs summed, then proj's whole bias
      results = reduce_from_tp(results, tp_);
      std::vector<Tensor> biases;
      std::vector<int64_t> used;
      for (size_t l = 0; l < split_experts_.size(); ++l)
        if (rows_of[l] > 0) {
          biases.push_back(split_experts_[l].proj_bias.to(DType::kF32));
          used.push_back(rows_of[l]);
        }
      Tensor bias_rows = grouped_bias_rows(biases, used, c, device);
      results = index_add_rows(results, where, bias_rows);
    }
  }

  // 4. Back to the ranks the rows came from, and combined in expert order.
  Tensor back = all_to_all_rows(results.to(x.dtype()), recv_rows, send_rows, ep_);
  Tensor out = Tensor::zeros({n, c}, DType::kF32, device);
  int64_t offset = 0;
  for (int64_t e = 0; e < e_count; ++e) {
    const std::vector<int64_t>& rows = assigned.tokens[size_t(e)];
    const auto m = int64_t(rows.size());
    if (m == 0) continue;
    Tensor y = narrow(back, 0, offset, m).to(DType::kF32);
    Tensor g =
        expand(embedding(routing.gates, index_tensor(assigned.slots[size_t(e)], device)), {m, c});
    out = index_add_rows(out, index_tensor(rows, device), mul(y, g));
    offset += m;
  }
  // Nothing came back (every assignment dropped): zeros that still depend on the exchange.
  if (offset == 0) out = expand(sum(back.to(DType::kF32)).reshape({1, 1}), {n, c});
  out = out.to(x.dtype());
  // This rank's share of the batch's losses, times the batch group's size: the term whose mean
  // over the group (what data parallelism averages) is one process's. See the header.
  aux_loss_ = part.recording ? Tensor::zeros({}, DType::kF32, device)
                             : scale(nn::moe_aux_loss(routing, options_, part.routed, part.tokens,
                                                      &stats.aux_loss, &stats.z_loss),
                                     double(b_size));
  stats.aux_loss *= double(b_size);
  stats.z_loss *= double(b_size);
  if (!autograd::recomputing()) stats_ = std::move(stats);
  return (*drop)(out.reshape(x.shape()));
}

Tensor ExpertParallelMoE::expert_rows(const Tensor& rows, const std::vector<int64_t>& counts) {
  if (!tp_) return nn::moe_experts_forward(experts_, rows, counts);
  std::vector<Tensor> fc_w, fc_b, proj_w;
  std::vector<int64_t> used;  // as nn::moe_experts_forward: experts without rows take no part
  for (size_t l = 0; l < split_experts_.size(); ++l) {
    if (counts[l] == 0) continue;
    used.push_back(counts[l]);
    fc_w.push_back(split_experts_[l].fc_weight);
    fc_b.push_back(split_experts_[l].fc_bias);
    proj_w.push_back(split_experts_[l].proj_weight);
  }
  return grouped_linear(gelu(grouped_linear(rows, used, fc_w, fc_b)), used, proj_w);
}

void ExpertParallelMoE::learn_budget(int64_t channels, Device device) {
  // The smallest budget of the batch group's ranks (-1, none, counts as the largest), so that
  // every rank takes the same decisions from the same counts.
  const int64_t mine = nn::moe_receive_budget_rows(options_.receive_budget_mb, channels, device);
  Tensor budget = Tensor::full({1}, double(mine < 0 ? INT64_MAX : mine), DType::kI64);
  batch_->allreduce_sync(budget, comm::ReduceOp::kMin);
  const auto agreed = int64_t(budget.item());
  // Which ep group each batch rank is in (named by the batch rank of its ep rank 0), and its
  // ep rank there.
  Tensor members = Tensor::empty({ep_->size()}, DType::kI64);
  ep_->allgather(Tensor::full({1}, double(batch_->rank()), DType::kI64), members)->wait();
  const std::vector<int64_t> me{members.to_vector<int64_t>()[0], ep_->rank()};
  Tensor all = Tensor::empty({2 * batch_->size()}, DType::kI64);
  batch_->allgather(Tensor::from_vector(me, {2}), all)->wait();
  const std::vector<int64_t> pairs = all.to_vector<int64_t>();
  ep_group_of_.clear();
  ep_rank_of_.clear();
  for (int64_t b = 0; b < batch_->size(); ++b) {
    ep_group_of_.push_back(pairs[size_t(2 * b)]);
    ep_rank_of_.push_back(pairs[size_t(2 * b + 1)]);
  }
  budget_rows_ = agreed == INT64_MAX ? -1 : agreed;
}

int64_t ExpertParallelMoE::most_received(int64_t cap, const std::vector<int64_t>& counts) const {
  // Each batch rank's kept assignments per expert under `cap` (the first `cap` of each expert
  // in batch rank order), added to the rank of its ep group that holds the expert.
  const int64_t e_count = options_.experts, width = e_count + 1;
  const auto b_size = int64_t(ep_group_of_.size());
  std::vector<int64_t> before(static_cast<size_t>(e_count), 0);
  std::map<std::pair<int64_t, int64_t>, int64_t> received;  // (ep group, ep rank) -> rows
  for (int64_t b = 0; b < b_size; ++b)
    for (int64_t e = 0; e < e_count; ++e) {
      const int64_t routed = counts[size_t(b * width + e)];
      const int64_t kept = std::clamp(cap - before[size_t(e)], int64_t(0), routed);
      before[size_t(e)] += routed;
      received[{ep_group_of_[size_t(b)], e / local_}] += kept;
    }
  int64_t most = 0;
  for (const auto& [holder, rows] : received) most = std::max(most, rows);
  return most;
}

}  // namespace loom::parallel
