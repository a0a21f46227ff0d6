#include "core/nn/moe.h"

#include <cmath>
#include <string>

#include "core/autograd.h"
#include "core/ops.h"

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
}

MoE::MoE(int64_t channels, const MoeOptions& options, double dropout, double proj_std)
    : options_(options) {
  options_.validate();
  LOOM_CHECK(options_.enabled(), "MoE: needs at least one expert");
  router = register_module("router",
                           std::make_shared<Linear>(channels, options_.experts, /*bias=*/false));
  experts = register_module("experts", std::make_shared<ModuleList>());
  for (int64_t e = 0; e < options_.experts; ++e) {
    experts_.push_back(std::make_shared<MLP>(channels, 0.0, proj_std));
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

Tensor MoE::forward(const Tensor& x) {
  LOOM_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == router->in_features(), "MoE: input ",
             x.defined() ? shape_str(x.shape()) : "undefined", " must end in the ",
             router->in_features(), " channels");
  LOOM_CHECK(x.dtype() == DType::kF32, "MoE: f32 inputs only so far, got ", dtype_name(x.dtype()));
  const int64_t c = x.size(-1), n = x.numel() / c, e_count = options_.experts, k = options_.top_k;
  stats_ = MoeStats();
  stats_.load.assign(size_t(e_count), 0);
  if (n == 0) {  // nothing to route: no output, no loss
    aux_loss_ = Tensor::zeros({}, DType::kF32, x.device());
    return (*drop)(Tensor::zeros(x.shape(), x.dtype(), x.device()));
  }
  Tensor flat = x.reshape({n, c});
  Tensor logits = (*router)(flat);  // [N, E], f32
  Tensor p = softmax(logits);
  ValuesIndices top = topk(p, k, 1);  // [N, k], ties to the lower index
  Tensor gates = k > 1 ? div(top.values, expand(sum(top.values, 1, true), {n, k})) : top.values;

  // Routing on the host: each expert's tokens in token order, and where their gates sit.
  const std::vector<int64_t> chosen = top.indices.to_vector<int64_t>();
  const auto experts_n = static_cast<size_t>(e_count);
  std::vector<std::vector<int64_t>> tokens(experts_n), slots(experts_n);
  std::vector<int64_t> routed(experts_n, 0);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = chosen[size_t(t * k + j)];
      ++routed[size_t(e)];
      tokens[size_t(e)].push_back(t);
      slots[size_t(e)].push_back(t * k + j);
    }
  stats_.tokens = n;
  if (options_.capacity_factor > 0) {
    const auto capacity =
        int64_t(std::ceil(double(k) * double(n) * options_.capacity_factor / double(e_count)));
    for (int64_t e = 0; e < e_count; ++e)
      if (int64_t(tokens[size_t(e)].size()) > capacity) {
        stats_.dropped += int64_t(tokens[size_t(e)].size()) - capacity;
        tokens[size_t(e)].resize(size_t(capacity));
        slots[size_t(e)].resize(size_t(capacity));
      }
  }

  // out = sum over experts, in index order, of gate * expert(x) at the expert's tokens.
  Tensor out = Tensor::zeros({n, c}, x.dtype(), x.device());
  Tensor gate_column = gates.reshape({n * k, 1});
  for (int64_t e = 0; e < e_count; ++e) {
    const std::vector<int64_t>& mine = tokens[size_t(e)];
    stats_.load[size_t(e)] = int64_t(mine.size());
    if (mine.empty()) continue;
    const auto m = int64_t(mine.size());
    Tensor rows = Tensor::from_vector(mine, {m}).to(x.device());
    Tensor where = Tensor::from_vector(slots[size_t(e)], {m}).to(x.device());
    Tensor y = (*experts_[size_t(e)])(embedding(flat, rows));  // [m, C]
    Tensor g = expand(embedding(gate_column, where), {m, c});
    out = index_add_rows(out, rows, mul(y, g));
  }

  // Auxiliary losses over this forward's tokens (See the header).
  std::vector<float> fraction(experts_n);
  for (int64_t e = 0; e < e_count; ++e)
    fraction[size_t(e)] = float(double(routed[size_t(e)]) / double(n * k));
  Tensor f = Tensor::from_vector(fraction, {e_count}).to(x.device());
  Tensor balance =
      scale(sum(mul(mean(p, 0), f)), options_.aux_loss * double(e_count));  // alpha E sum f P
  Tensor lse = logsumexp_rows(logits);
  Tensor z = scale(mean(mul(lse, lse)), options_.z_loss);
  aux_loss_ = add(balance, z);
  stats_.aux_loss = balance.item();
  stats_.z_loss = z.item();
  return (*drop)(out.reshape(x.shape()));
}

}  // namespace loom::nn
