// ShardedEmbeddingBagCollection. See the header for the placements and their communication.
//
// The one non-obvious decision: the whole output exchange (all_to_all of table/column blocks,
// reduce_scatter of row-wise partial sums, the data-parallel columns, the mean division) is one
// autograd op whose inputs include a leaf that always requires grad (anchor_), so every rank
// records it and runs its backward collectives, even a rank that owns no shard.
#include "parallel/sharded_embedding.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/autograd.h"
#include "core/ops.h"

namespace loom::parallel {

const char* embedding_sharding_name(EmbeddingSharding kind) {
  switch (kind) {
    case EmbeddingSharding::kTable:
      return "table";
    case EmbeddingSharding::kRow:
      return "row";
    case EmbeddingSharding::kColumn:
      return "column";
    case EmbeddingSharding::kData:
      return "data";
  }
  return "?";
}

EmbeddingSharding parse_embedding_sharding(const std::string& name) {
  for (EmbeddingSharding kind : {EmbeddingSharding::kTable, EmbeddingSharding::kRow,
                                 EmbeddingSharding::kColumn, EmbeddingSharding::kData})
    if (name == embedding_sharding_name(kind)) return kind;
  LOOM_FAIL("embedding sharding must be 'table', 'row', 'column' or 'data', got '", name, "'");
}

std::vector<EmbeddingPlacement> embedding_placements(const std::string& sharding,
                                                     const std::vector<int64_t>& rows) {
  const bool automatic = sharding == "auto";
  const EmbeddingSharding every =
      automatic ? EmbeddingSharding::kTable : parse_embedding_sharding(sharding);
  std::vector<EmbeddingPlacement> out(rows.size());
  for (size_t t = 0; t < rows.size(); ++t)
    out[t].kind = automatic && rows[t] < kAutoReplicateBelow ? EmbeddingSharding::kData : every;
  return out;
}

namespace detail {

// What every rank derives alike from the configs, the placements and the group size.
struct ShardingTopology {
  int world = 1, rank = 0;
  std::vector<nn::EmbeddingTableConfig> configs;
  std::vector<EmbeddingPlacement> placements;
  std::vector<int64_t> dim_offset;  // [T + 1]: columns of table t in the output
  std::vector<EmbeddingShard> shards;
  std::vector<std::vector<size_t>> by_owner;  // [W]: indices into shards, table order
  std::vector<int64_t> row_offset;            // [T]: columns in the row-wise buffer, or -1
  int64_t row_dim = 0;                        // sum of the row-wise tables' dims
  std::vector<int64_t> data_offset;           // [T]: columns in the data-parallel output, or -1
  int64_t data_dim = 0;
  std::vector<int64_t> data_tables;
  bool any_exchange = false;  // some table- or column-wise shard

  int64_t num_tables() const { return int64_t(configs.size()); }
  int64_t total_dim() const { return dim_offset.back(); }
  bool is_row(const EmbeddingShard& s) const { return s.kind == EmbeddingSharding::kRow; }
  bool any_column() const {
    for (const EmbeddingPlacement& p : placements)
      if (p.kind == EmbeddingSharding::kColumn) return true;
    return false;
  }
  // Elements one rank sends per requester in the forward all_to_all: its table/column blocks.
  int64_t exchange_width(int owner) const {
    int64_t w = 0;
    for (size_t k : by_owner[size_t(owner)])
      if (!is_row(shards[k])) w += shards[k].cols;
    return w;
  }
};

// Tables that one embedding_bag call looks up on this rank, in one buffer laid out as `layout`
// says (a fused update needs that; See embedding_bag).
struct LocalTables {
  std::vector<size_t> members;  // shard groups: indices into by_owner[rank]; data: table indices
  std::vector<int64_t> tables;  // the table of each member
  std::vector<Tensor> weights;  // the parameters, [rows, cols] each
  EmbeddingBagLayout layout;
  // The fused optimizer's state (null without one). The kernel updates with it, except for the
  // split-row group, which the output exchange updates (See Note [Sharded fused optimizers]).
  std::shared_ptr<EmbeddingFusedOptimizer> fused;

  // Makes the weights views of one buffer (again, after something gave them memory of their
  // own); keeps each parameter's identity.
  void pack() {
    if (embedding_tables_packed(weights, layout)) return;
    Tensor buffer = Tensor::empty({layout.total_elements()}, weights[0].dtype());
    for (size_t t = 0; t < weights.size(); ++t) {
      Tensor view = make_view(buffer, weights[t].shape(), {layout.dim(int64_t(t)), 1},
                              layout.weight_offset(int64_t(t)));
      view.copy_(weights[t].detach());
      weights[t].set_data(view);
    }
  }
};

}  // namespace detail

namespace {

using detail::LocalTables;
using detail::ShardingTopology;
constexpr const char* kOp = "ShardedEmbeddingBagCollection";

// Every rank's `mine` (any length), in rank order. Collective.
template <typename T>
std::vector<std::vector<T>> allgather_varying(comm::Communicator& group,
                                              const std::vector<T>& mine) {
  const int W = group.size();
  Tensor size = Tensor::from_vector(std::vector<int64_t>{int64_t(mine.size())}, {1});
  Tensor sizes = Tensor::empty({W}, DType::kI64);
  group.allgather(size, sizes)->wait();
  const std::vector<int64_t> n = sizes.to_vector<int64_t>();
  const int64_t most = std::max<int64_t>(1, *std::max_element(n.begin(), n.end()));
  std::vector<T> padded(mine);
  padded.resize(size_t(most), T(0));
  Tensor in = Tensor::from_vector(padded, {most});
  Tensor all = Tensor::empty({W * most}, in.dtype());
  group.allgather(in, all)->wait();
  const std::vector<T> flat = all.to_vector<T>();
  std::vector<std::vector<T>> out(static_cast<size_t>(W));
  for (int i = 0; i < W; ++i)
    out[size_t(i)].assign(flat.begin() + i * most, flat.begin() + i * most + n[size_t(i)]);
  return out;
}

// One shard (or replicated table) as a module, so its parameter is called "<table>.weight".
class ShardModule : public nn::Module {
 public:
  ShardModule(const Shape& shape, const nn::Init& init, const nn::ShardSpec* spec) {
    weight = spec ? register_parameter("weight", shape, init, *spec)
                  : register_parameter("weight", shape, init);
  }
  Tensor weight;
};

std::shared_ptr<ShardingTopology> make_topology(std::vector<nn::EmbeddingTableConfig> configs,
                                                std::vector<EmbeddingPlacement> placements,
                                                int world, int rank) {
  auto topo = std::make_shared<ShardingTopology>();
  topo->world = world;
  topo->rank = rank;
  const int64_t t_count = int64_t(configs.size());
  LOOM_CHECK(t_count > 0, kOp, ": no tables");
  LOOM_CHECK(placements.size() == configs.size(), kOp, ": ", placements.size(), " placements for ",
             t_count, " tables; give one placement per table, in table order");
  topo->dim_offset.assign(size_t(t_count) + 1, 0);
  for (int64_t t = 0; t < t_count; ++t) {
    const auto& c = configs[size_t(t)];
    LOOM_CHECK(c.rows > 0, kOp, ": table '", c.name, "' has ", c.rows, " rows");
    LOOM_CHECK(c.dim > 0 && c.dim % 4 == 0, kOp, ": table '", c.name, "' has dim ", c.dim,
               "; dims must be positive multiples of 4");
    topo->dim_offset[size_t(t) + 1] = topo->dim_offset[size_t(t)] + c.dim;
    const EmbeddingPlacement& p = placements[size_t(t)];
    if (p.kind == EmbeddingSharding::kTable)
      LOOM_CHECK(p.rank >= -1 && p.rank < world, kOp, ": table '", c.name, "' is placed on rank ",
                 p.rank, " but the group has ", world, " ranks (-1: chosen by balance)");
    if (p.kind == EmbeddingSharding::kColumn)
      LOOM_CHECK(c.dim % world == 0 && (c.dim / world) % 4 == 0, kOp, ": table '", c.name,
                 "' (dim ", c.dim, ") cannot be split column-wise over ", world,
                 " ranks into parts that are multiples of 4 (", c.dim, " / ", world,
                 "); use a dim that is a multiple of ", 4 * world, ", or another placement");
  }
  // Greedy balance of rows * dim for the table-wise tables without an owner: largest first,
  // each to the least loaded rank (ties: the lowest rank).
  std::vector<int64_t> load(size_t(world), 0);
  std::vector<int64_t> open;
  for (int64_t t = 0; t < t_count; ++t) {
    const EmbeddingPlacement& p = placements[size_t(t)];
    if (p.kind != EmbeddingSharding::kTable) continue;
    if (p.rank >= 0)
      load[size_t(p.rank)] += configs[size_t(t)].rows * configs[size_t(t)].dim;
    else
      open.push_back(t);
  }
  auto size_of = [&](int64_t t) { return configs[size_t(t)].rows * configs[size_t(t)].dim; };
  std::stable_sort(open.begin(), open.end(),
                   [&](int64_t a, int64_t b) { return size_of(a) > size_of(b); });
  for (int64_t t : open) {
    const int owner = int(std::min_element(load.begin(), load.end()) - load.begin());
    placements[size_t(t)].rank = owner;
    load[size_t(owner)] += size_of(t);
  }

  topo->by_owner.assign(size_t(world), {});
  topo->row_offset.assign(size_t(t_count), -1);
  topo->data_offset.assign(size_t(t_count), -1);
  for (int64_t t = 0; t < t_count; ++t) {
    const auto& c = configs[size_t(t)];
    const EmbeddingPlacement& p = placements[size_t(t)];
    auto add = [&](int owner, int64_t r0, int64_t rows, int64_t c0, int64_t cols) {
      if (rows == 0) return;  // a row-wise table smaller than the group
      topo->by_owner[size_t(owner)].push_back(topo->shards.size());
      topo->shards.push_back({t, p.kind, owner, r0, rows, c0, cols});
    };
    switch (p.kind) {
      case EmbeddingSharding::kTable:
        add(p.rank, 0, c.rows, 0, c.dim);
        topo->any_exchange = true;
        break;
      case EmbeddingSharding::kRow: {
        const int64_t block = (c.rows + world - 1) / world;
        for (int j = 0; j < world; ++j) {
          const int64_t r0 = std::min(c.rows, j * block);
          add(j, r0, std::min(block, c.rows - r0), 0, c.dim);
        }
        topo->row_offset[size_t(t)] = topo->row_dim;
        topo->row_dim += c.dim;
        break;
      }
      case EmbeddingSharding::kColumn: {
        const int64_t part = c.dim / world;
        for (int j = 0; j < world; ++j) add(j, 0, c.rows, j * part, part);
        topo->any_exchange = true;
        break;
      }
      case EmbeddingSharding::kData:
        topo->data_offset[size_t(t)] = topo->data_dim;
        topo->data_dim += c.dim;
        topo->data_tables.push_back(t);
        break;
    }
  }
  topo->configs = std::move(configs);
  topo->placements = std::move(placements);
  return topo;
}

std::vector<int64_t> to_i64(const Tensor& t) {
  if (t.dtype() == DType::kI64) return t.to_vector<int64_t>();
  std::vector<int32_t> v = t.to_vector<int32_t>();
  return std::vector<int64_t>(v.begin(), v.end());
}

Tensor i64_tensor(const std::vector<int64_t>& v) {
  return Tensor::from_vector(v, {int64_t(v.size())});
}

// The output exchange as one autograd op. Forward: Y [W*B, local dims] (this rank's shards'
// sums for every rank's bags, row i*B+b = rank i's bag b) and Ydp [B, data dims] become this
// rank's [B, total_dim]; backward: the reverse.
struct OutputExchange {
  std::shared_ptr<const ShardingTopology> topo;
  std::shared_ptr<comm::Communicator> group;
  int64_t B = 0;
  std::vector<int64_t> local_col;  // [my shards]: columns of each in Y
  int64_t local_dim = 0;
  int64_t kernel_dim =
      0;  // Y's columns [0, kernel_dim) are the shards group's, the rest split rows'
  std::vector<float> scale;  // [T * B]: 1 / global bag length (mean), empty for sum
  // See Note [Sharded fused optimizers].
  bool split_rows = false;             // column shards under row-wise Adagrad exist (on every rank)
  std::shared_ptr<LocalTables> split;  // this rank's (null: none)
  Tensor split_indices, split_offsets;     // its lookup's CSR
  bool data_gathered = false;              // Ydp is [W*B, data dims]: every rank's bags
  std::shared_ptr<int64_t> fused_updates;  // counted per backward (null: no fused optimizer)

  // The split-row update: each owner's partial sums of g*g per looked-up row, all-gathered and
  // added in rank order, then the row-wise Adagrad update of its columns (the kernel's formula).
  void update_split_rows(const std::vector<float>& dy) const {
    const int W = topo->world;
    const int64_t n = W * B, width = local_dim - kernel_dim;
    std::vector<int64_t> ids, value_offsets;
    std::vector<float> values;
    if (split) {
      std::vector<float> d(size_t(n * width));
      for (int64_t i = 0; i < n; ++i)
        std::copy_n(dy.begin() + i * local_dim + kernel_dim, width, d.begin() + i * width);
      EmbeddingBagOptions o;
      o.pooling = EmbeddingPooling::kSum;
      const EmbeddingSparseGradient g =
          embedding_bag_sparse_grad(split->weights, split->layout, split_indices, split_offsets,
                                    Tensor::from_vector(d, {n, width}), Tensor(), o);
      ids = g.ids.contiguous().to_vector<int64_t>();
      value_offsets = g.value_offsets.to_vector<int64_t>();
      values = g.values.to_vector<float>();
    }
    // Every rank holds a column part of every such table and looks up the same bags, so every
    // rank has the same rows in the same order.
    const int64_t U = int64_t(ids.size()) / 2;
    const kernels::EmbeddingOptimizerHyper h =
        split ? split->fused->hyper : kernels::EmbeddingOptimizerHyper{};
    std::vector<float> partial(static_cast<size_t>(U));
    for (int64_t k = 0; k < U; ++k) {
      const int64_t t = ids[size_t(2 * k)], row = ids[size_t(2 * k + 1)];
      const int64_t cols = split->layout.dim(t);
      const float* w = split->weights[size_t(t)].data<float>() + row * cols;
      float* g = values.data() + value_offsets[size_t(k)];
      if (h.weight_decay != 0.0f)
        for (int64_t c = 0; c < cols; ++c) g[c] += h.weight_decay * w[c];
      float sum = 0.0f;
      for (int64_t c = 0; c < cols; ++c) sum += g[c] * g[c];
      partial[size_t(k)] = sum;
    }
    const std::vector<std::vector<float>> all = allgather_varying(*group, partial);
    for (int i = 0; i < W; ++i)
      LOOM_ASSERT(int64_t(all[size_t(i)].size()) == U, kOp, ": rank ", i, " updates ",
                  all[size_t(i)].size(), " split rows, this rank ", U);
    if (!split) return;
    for (const Tensor& w : split->weights) w.storage()->bump_version();  // Note [Version counter]
    float* state = split->fused->momentum1.data<float>();
    for (int64_t k = 0; k < U; ++k) {
      const int64_t t = ids[size_t(2 * k)], row = ids[size_t(2 * k + 1)];
      const int64_t cols = split->layout.dim(t);
      const int64_t dim = topo->configs[size_t(split->tables[size_t(t)])].dim;
      float sum = 0.0f;
      for (int i = 0; i < W; ++i) sum += all[size_t(i)][size_t(k)];
      float& s = state[split->layout.row_offset(t) + row];
      s = s + sum / float(dim);
      const float multiplier = h.lr / (std::sqrt(s) + h.eps);
      float* w = split->weights[size_t(t)].data<float>() + row * cols;
      const float* g = values.data() + value_offsets[size_t(k)];
      for (int64_t c = 0; c < cols; ++c) w[c] -= multiplier * g[c];
    }
  }

  // The data tables' output gradient when every rank looked up every rank's bags: each rank's
  // [B, data dims] (its loss is the mean over its own batch: 1/W, See Note [Sharded embedding
  // gradient scale]), all-gathered into [W*B, data dims].
  Tensor gathered_data_grad(std::vector<float> dydp) const {
    const int W = topo->world;
    for (float& x : dydp) x *= 1.0f / float(W);
    Tensor all = Tensor::empty({W * B * topo->data_dim});
    group->allgather(Tensor::from_vector(dydp, {B * topo->data_dim}), all)->wait();
    return all.reshape({W * B, topo->data_dim});
  }

  void apply_scale(std::vector<float>& x) const {
    if (scale.empty()) return;
    const int64_t D = topo->total_dim();
    for (int64_t t = 0; t < topo->num_tables(); ++t)
      for (int64_t b = 0; b < B; ++b) {
        const float s = scale[size_t(t * B + b)];
        for (int64_t c = topo->dim_offset[size_t(t)]; c < topo->dim_offset[size_t(t) + 1]; ++c)
          x[size_t(b * D + c)] *= s;
      }
  }

  std::vector<float> forward(const std::vector<float>& y, const std::vector<float>& ydp) const {
    const ShardingTopology& tp = *topo;
    const int W = tp.world, r = tp.rank;
    const int64_t D = tp.total_dim();
    const std::vector<size_t>& mine = tp.by_owner[size_t(r)];
    std::vector<float> out(size_t(B * D), 0.0f);
    if (tp.any_exchange) {
      // To requester i: for each of my table/column shards, its [B, cols] block of i's bags.
      const int64_t send_w = tp.exchange_width(r);
      std::vector<float> send(size_t(W * B * send_w));
      size_t p = 0;
      for (int i = 0; i < W; ++i)
        for (size_t k = 0; k < mine.size(); ++k) {
          const EmbeddingShard& s = tp.shards[mine[k]];
          if (tp.is_row(s)) continue;
          for (int64_t b = 0; b < B; ++b)
            for (int64_t c = 0; c < s.cols; ++c)
              send[p++] = y[size_t((i * B + b) * local_dim + local_col[k] + c)];
        }
      std::vector<int64_t> in_splits(static_cast<size_t>(W)), out_splits(static_cast<size_t>(W));
      int64_t recv_total = 0;
      for (int j = 0; j < W; ++j) {
        in_splits[size_t(j)] = B * send_w;
        out_splits[size_t(j)] = B * tp.exchange_width(j);
        recv_total += out_splits[size_t(j)];
      }
      Tensor send_t = Tensor::from_vector(send, {int64_t(send.size())});
      Tensor recv_t = Tensor::empty({recv_total});
      group->all_to_all(send_t, recv_t, {in_splits, out_splits})->wait();
      const float* rv = recv_t.data<float>();
      size_t q = 0;
      for (int j = 0; j < W; ++j)
        for (size_t k : tp.by_owner[size_t(j)]) {
          const EmbeddingShard& s = tp.shards[k];
          if (tp.is_row(s)) continue;
          const int64_t c0 = tp.dim_offset[size_t(s.table)] + s.col_start;
          for (int64_t b = 0; b < B; ++b)
            for (int64_t c = 0; c < s.cols; ++c) out[size_t(b * D + c0 + c)] = rv[q++];
        }
    }
    if (tp.row_dim > 0) {
      // Chunk i: rank i's bags, [B, row_dim], zero where this rank holds no rows of a table.
      const int64_t R = tp.row_dim;
      std::vector<float> partial(size_t(W * B * R), 0.0f);
      for (size_t k = 0; k < mine.size(); ++k) {
        const EmbeddingShard& s = tp.shards[mine[k]];
        if (!tp.is_row(s)) continue;
        const int64_t c0 = tp.row_offset[size_t(s.table)];
        for (int64_t i = 0; i < W; ++i)
          for (int64_t b = 0; b < B; ++b)
            for (int64_t c = 0; c < s.cols; ++c)
              partial[size_t((i * B + b) * R + c0 + c)] =
                  y[size_t((i * B + b) * local_dim + local_col[k] + c)];
      }
      Tensor in = Tensor::from_vector(partial, {int64_t(partial.size())});
      Tensor sum = Tensor::empty({B * R});
      group->reduce_scatter(in, sum)->wait();
      const float* sv = sum.data<float>();
      for (int64_t t = 0; t < tp.num_tables(); ++t) {
        if (tp.row_offset[size_t(t)] < 0) continue;
        for (int64_t b = 0; b < B; ++b)
          for (int64_t c = 0; c < tp.configs[size_t(t)].dim; ++c)
            out[size_t(b * D + tp.dim_offset[size_t(t)] + c)] =
                sv[b * R + tp.row_offset[size_t(t)] + c];
      }
    }
    for (int64_t t : tp.data_tables)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t c = 0; c < tp.configs[size_t(t)].dim; ++c)
          out[size_t(b * D + tp.dim_offset[size_t(t)] + c)] =
              ydp[size_t(b * tp.data_dim + tp.data_offset[size_t(t)] + c)];
    apply_scale(out);
    return out;
  }

  // g: [B, total_dim]. Returns dY [W*B, local_dim] and dYdp [B, data_dim].
  void backward(std::vector<float> g, std::vector<float>& dy, std::vector<float>& dydp) const {
    const ShardingTopology& tp = *topo;
    const int W = tp.world, r = tp.rank;
    const int64_t D = tp.total_dim();
    const std::vector<size_t>& mine = tp.by_owner[size_t(r)];
    apply_scale(g);
    // See Note [Sharded embedding gradient scale].
    const float inv_world = 1.0f / float(W);
    dy.assign(size_t(W * B * local_dim), 0.0f);
    dydp.assign(size_t(B * tp.data_dim), 0.0f);
    for (int64_t t : tp.data_tables)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t c = 0; c < tp.configs[size_t(t)].dim; ++c)
          dydp[size_t(b * tp.data_dim + tp.data_offset[size_t(t)] + c)] =
              g[size_t(b * D + tp.dim_offset[size_t(t)] + c)];
    if (tp.any_exchange) {
      // To owner j: for each of j's table/column shards, the [B, cols] gradient of my bags.
      std::vector<int64_t> in_splits(static_cast<size_t>(W)), out_splits(static_cast<size_t>(W));
      std::vector<float> send;
      for (int j = 0; j < W; ++j) {
        in_splits[size_t(j)] = B * tp.exchange_width(j);
        out_splits[size_t(j)] = B * tp.exchange_width(r);
        for (size_t k : tp.by_owner[size_t(j)]) {
          const EmbeddingShard& s = tp.shards[k];
          if (tp.is_row(s)) continue;
          const int64_t c0 = tp.dim_offset[size_t(s.table)] + s.col_start;
          for (int64_t b = 0; b < B; ++b)
            for (int64_t c = 0; c < s.cols; ++c)
              send.push_back(g[size_t(b * D + c0 + c)] * inv_world);
        }
      }
      Tensor send_t = Tensor::from_vector(send, {int64_t(send.size())});
      Tensor recv_t = Tensor::empty({W * B * tp.exchange_width(r)});
      group->all_to_all(send_t, recv_t, {in_splits, out_splits})->wait();
      const float* rv = recv_t.data<float>();
      size_t q = 0;
      for (int64_t i = 0; i < W; ++i)
        for (size_t k = 0; k < mine.size(); ++k) {
          const EmbeddingShard& s = tp.shards[mine[k]];
          if (tp.is_row(s)) continue;
          for (int64_t b = 0; b < B; ++b)
            for (int64_t c = 0; c < s.cols; ++c)
              dy[size_t((i * B + b) * local_dim + local_col[k] + c)] = rv[q++];
        }
    }
    if (tp.row_dim > 0) {
      const int64_t R = tp.row_dim;
      std::vector<float> mine_g(size_t(B * R));
      for (int64_t t = 0; t < tp.num_tables(); ++t) {
        if (tp.row_offset[size_t(t)] < 0) continue;
        for (int64_t b = 0; b < B; ++b)
          for (int64_t c = 0; c < tp.configs[size_t(t)].dim; ++c)
            mine_g[size_t(b * R + tp.row_offset[size_t(t)] + c)] =
                g[size_t(b * D + tp.dim_offset[size_t(t)] + c)] * inv_world;
      }
      Tensor in = Tensor::from_vector(mine_g, {B * R});
      Tensor all = Tensor::empty({W * B * R});
      group->allgather(in, all)->wait();
      const float* av = all.data<float>();
      for (size_t k = 0; k < mine.size(); ++k) {
        const EmbeddingShard& s = tp.shards[mine[k]];
        if (!tp.is_row(s)) continue;
        const int64_t c0 = tp.row_offset[size_t(s.table)];
        for (int64_t i = 0; i < W; ++i)
          for (int64_t b = 0; b < B; ++b)
            for (int64_t c = 0; c < s.cols; ++c)
              dy[size_t((i * B + b) * local_dim + local_col[k] + c)] = av[(i * B + b) * R + c0 + c];
      }
    }
  }
};

}  // namespace

ShardedEmbeddingBagCollection::ShardedEmbeddingBagCollection(
    std::vector<nn::EmbeddingTableConfig> tables, std::vector<EmbeddingPlacement> placements,
    std::shared_ptr<comm::Communicator> group, ShardedEmbeddingOptions options)
    : group_(std::move(group)), options_(options) {
  LOOM_CHECK(group_ != nullptr, kOp, ": the group is null");
  LOOM_CHECK(
      options_.pooling == EmbeddingPooling::kSum || options_.pooling == EmbeddingPooling::kMean,
      kOp, ": pooling must be sum or mean (unpooled lookups are not sharded)");
  topo_ = make_topology(std::move(tables), std::move(placements), group_->size(), group_->rank());
  const ShardingTopology& tp = *topo_;
  const bool fused = options_.fused.kind != EmbeddingOptimizer::kNone;
  // See Note [Sharded fused optimizers].
  const bool split_rows = options_.fused.kind == EmbeddingOptimizer::kRowwiseAdagrad;
  fused_updates_ = std::make_shared<int64_t>(0);
  auto shards = std::make_shared<LocalTables>(), split = std::make_shared<LocalTables>(),
       data = std::make_shared<LocalTables>();
  std::vector<int64_t> rows[3], dims[3];
  std::vector<std::string> names[3];
  auto add = [&](int g, LocalTables& group, size_t member, int64_t table, const std::string& name,
                 int64_t r, int64_t c, const Tensor& weight) {
    group.members.push_back(member);
    group.tables.push_back(table);
    group.weights.push_back(weight);
    rows[g].push_back(r);
    dims[g].push_back(c);
    names[g].push_back(name);
  };
  const std::vector<size_t>& mine = tp.by_owner[size_t(tp.rank)];
  for (int64_t t = 0; t < tp.num_tables(); ++t) {
    const nn::EmbeddingTableConfig& c = tp.configs[size_t(t)];
    // The single-process init (nn::EmbeddingBagCollection's), cut by the shard spec.
    const nn::Init init = nn::Init::normal(std::sqrt(1.0 / (3.0 * double(c.rows))));
    if (tp.placements[size_t(t)].kind == EmbeddingSharding::kData) {
      Tensor w = register_module(c.name,
                                 std::make_shared<ShardModule>(Shape{c.rows, c.dim}, init, nullptr))
                     ->weight;
      add(2, *data, size_t(t), t, c.name, c.rows, c.dim, w);
      continue;
    }
    for (size_t k = 0; k < mine.size(); ++k) {
      const EmbeddingShard& s = tp.shards[mine[k]];
      if (s.table != t) continue;
      nn::ShardSpec spec;
      const nn::ShardSpec* spec_ptr = nullptr;
      if (s.kind == EmbeddingSharding::kRow) {
        spec = nn::ShardSpec::along({c.rows, c.dim}, 0, s.row_start, s.rows);
        spec_ptr = &spec;
      } else if (s.kind == EmbeddingSharding::kColumn) {
        spec = nn::ShardSpec::along({c.rows, c.dim}, 1, s.col_start, s.cols);
        spec_ptr = &spec;
      }
      Tensor w = register_module(
                     c.name, std::make_shared<ShardModule>(Shape{s.rows, s.cols}, init, spec_ptr))
                     ->weight;
      const bool split_row = split_rows && s.kind == EmbeddingSharding::kColumn;
      add(split_row ? 1 : 0, split_row ? *split : *shards, k, t,
          c.name + " (" + embedding_sharding_name(s.kind) + " shard)", s.rows, s.cols, w);
    }
  }
  std::shared_ptr<LocalTables>* slots[3] = {&shards_, &split_rows_, &data_};
  std::shared_ptr<LocalTables> groups[3] = {shards, split, data};
  for (int g = 0; g < 3; ++g) {
    if (groups[g]->members.empty()) continue;
    groups[g]->layout = EmbeddingBagLayout(rows[g], dims[g], names[g]);
    groups[g]->pack();
    if (fused)
      groups[g]->fused =
          std::make_shared<EmbeddingFusedOptimizer>(options_.fused, groups[g]->layout);
    *slots[g] = groups[g];
  }
  anchor_ = Tensor::zeros({1});
  anchor_.set_requires_grad(true);
}

ShardedEmbeddingBagCollection::~ShardedEmbeddingBagCollection() = default;

const std::vector<nn::EmbeddingTableConfig>& ShardedEmbeddingBagCollection::tables() const {
  return topo_->configs;
}
const std::vector<EmbeddingPlacement>& ShardedEmbeddingBagCollection::placements() const {
  return topo_->placements;
}
const std::vector<EmbeddingShard>& ShardedEmbeddingBagCollection::shards() const {
  return topo_->shards;
}

Tensor ShardedEmbeddingBagCollection::lookup(const Tensor& indices, const Tensor& offsets,
                                             const Tensor& per_sample_weights) {
  const ShardingTopology& tp = *topo_;
  const int W = tp.world, r = tp.rank;
  const int64_t T = tp.num_tables();
  const std::string op = std::string(kOp) + "::lookup";
  LOOM_CHECK(indices.defined() && offsets.defined(), op, ": indices and offsets are required");
  LOOM_CHECK(indices.dim() == 1 && offsets.dim() == 1, op, ": indices ", indices.str(),
             " and offsets ", offsets.str(), " must be 1-D");
  LOOM_CHECK((indices.dtype() == DType::kI32 || indices.dtype() == DType::kI64) &&
                 indices.dtype() == offsets.dtype(),
             op, ": indices and offsets must be both i32 or both i64, got ",
             dtype_name(indices.dtype()), " and ", dtype_name(offsets.dtype()));
  LOOM_CHECK(indices.device().is_cpu() && offsets.device().is_cpu(), op,
             ": only CPU tensors are supported");
  LOOM_CHECK(offsets.numel() >= 1 && (offsets.numel() - 1) % T == 0, op, ": offsets has ",
             offsets.numel(), " elements; expected T * B + 1 with T = ", T, " tables");
  const int64_t B = (offsets.numel() - 1) / T;
  const std::vector<int64_t> idx = to_i64(indices), off = to_i64(offsets);
  LOOM_CHECK(off[0] == 0 && off.back() == int64_t(idx.size()), op, ": offsets must start at 0 ",
             "and end at the number of indices (", idx.size(), "), got ", off[0], " and ",
             off.back());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b) {
      const int64_t a = off[size_t(t * B + b)], e = off[size_t(t * B + b + 1)];
      LOOM_CHECK(a <= e, op, ": offsets decrease at table '", tp.configs[size_t(t)].name, "' bag ",
                 b, " (", a, " > ", e, ")");
      for (int64_t p = a; p < e; ++p)
        LOOM_CHECK(idx[size_t(p)] >= 0 && idx[size_t(p)] < tp.configs[size_t(t)].rows, op,
                   ": index ", idx[size_t(p)], " at position ", p, " (table '",
                   tp.configs[size_t(t)].name, "', bag ", b, ") is out of range [0, ",
                   tp.configs[size_t(t)].rows, ")");
    }
  const bool weighted = per_sample_weights.defined();
  std::vector<float> psw;
  if (weighted) {
    LOOM_CHECK(options_.pooling == EmbeddingPooling::kSum, op,
               ": per-sample weights need sum pooling");
    LOOM_CHECK(per_sample_weights.dtype() == DType::kF32 &&
                   per_sample_weights.numel() == int64_t(idx.size()),
               op, ": per_sample_weights ", per_sample_weights.str(), " must be f32 with ",
               idx.size(), " elements (one per index)");
    LOOM_CHECK(!per_sample_weights.requires_grad(), op,
               ": per-sample weight gradients are not supported when sharded");
    psw = per_sample_weights.to_vector<float>();
  }

  // ---- input distribution: for each owner, its shards' lengths and (rebased) indices ----
  std::vector<std::vector<int64_t>> send(static_cast<size_t>(W));
  std::vector<std::vector<float>> send_w(static_cast<size_t>(W));
  for (int j = 0; j < W; ++j) {
    std::vector<int64_t>& msg = send[size_t(j)];
    std::vector<int64_t> ids;
    for (size_t k : tp.by_owner[size_t(j)]) {
      const EmbeddingShard& s = tp.shards[k];
      for (int64_t b = 0; b < B; ++b) {
        int64_t n = 0;
        for (int64_t p = off[size_t(s.table * B + b)]; p < off[size_t(s.table * B + b + 1)]; ++p) {
          const int64_t v = idx[size_t(p)];
          if (v < s.row_start || v >= s.row_start + s.rows) continue;
          ids.push_back(v - s.row_start);
          if (weighted) send_w[size_t(j)].push_back(psw[size_t(p)]);
          ++n;
        }
        msg.push_back(n);
      }
    }
    msg.insert(msg.end(), ids.begin(), ids.end());
  }
  // Split sizes first: (B, number of indices) to every owner.
  std::vector<int64_t> counts_out;
  for (int j = 0; j < W; ++j) {
    counts_out.push_back(B);
    counts_out.push_back(int64_t(send[size_t(j)].size()) -
                         int64_t(tp.by_owner[size_t(j)].size()) * B);
  }
  Tensor counts_in = Tensor::empty({2 * int64_t(W)}, DType::kI64);
  group_->all_to_all(i64_tensor(counts_out), counts_in)->wait();
  const std::vector<int64_t> counts = counts_in.to_vector<int64_t>();
  for (int i = 0; i < W; ++i)
    if (counts[size_t(2 * i)] != B) {
      std::string all;
      for (int k = 0; k < W; ++k)
        all += (k ? ", rank " : "rank ") + std::to_string(k) + ": " +
               std::to_string(counts[size_t(2 * k)]);
      LOOM_CHECK(false, op, ": ranks give different batch sizes (bags per table: ", all,
                 "); every rank of group '", group_->name(), "' must give the same B");
    }
  const std::vector<size_t>& mine = tp.by_owner[size_t(r)];
  const int64_t n_mine = int64_t(mine.size());
  // Then the lengths and indices in one all_to_all(v), the weights in another.
  std::vector<int64_t> in_splits(static_cast<size_t>(W)), out_splits(static_cast<size_t>(W)),
      w_in(static_cast<size_t>(W)), w_out(static_cast<size_t>(W));
  std::vector<int64_t> flat;
  int64_t recv_total = 0, recv_w_total = 0;
  for (int j = 0; j < W; ++j) {
    in_splits[size_t(j)] = int64_t(send[size_t(j)].size());
    w_in[size_t(j)] = int64_t(send_w[size_t(j)].size());
    flat.insert(flat.end(), send[size_t(j)].begin(), send[size_t(j)].end());
    out_splits[size_t(j)] = n_mine * B + counts[size_t(2 * j + 1)];
    w_out[size_t(j)] = weighted ? counts[size_t(2 * j + 1)] : 0;
    recv_total += out_splits[size_t(j)];
    recv_w_total += w_out[size_t(j)];
  }
  Tensor recv_t = Tensor::empty({recv_total}, DType::kI64);
  group_->all_to_all(i64_tensor(flat), recv_t, {in_splits, out_splits})->wait();
  const std::vector<int64_t> recv = recv_t.to_vector<int64_t>();
  std::vector<float> recv_w;
  if (weighted) {
    std::vector<float> flat_w;
    for (int j = 0; j < W; ++j)
      flat_w.insert(flat_w.end(), send_w[size_t(j)].begin(), send_w[size_t(j)].end());
    Tensor recv_wt = Tensor::empty({recv_w_total});
    group_
        ->all_to_all(Tensor::from_vector(flat_w, {int64_t(flat_w.size())}), recv_wt, {w_in, w_out})
        ->wait();
    recv_w = recv_wt.to_vector<float>();
  }

  // ---- this rank's shards over every rank's bags: bag (k, i*B + b), feature-major ----
  const bool fused = options_.fused.kind != EmbeddingOptimizer::kNone;
  OutputExchange ex;
  ex.topo = topo_;
  ex.group = group_;
  ex.B = B;
  ex.split_rows = options_.fused.kind == EmbeddingOptimizer::kRowwiseAdagrad && tp.any_column();
  if (fused) ex.fused_updates = fused_updates_;
  // Y's columns: the shards group's, then the split rows' (See Note [Sharded fused optimizers]).
  ex.local_col.assign(size_t(n_mine), 0);
  for (const std::shared_ptr<LocalTables>& g : {shards_, split_rows_}) {
    if (!g) continue;
    if (g == split_rows_) ex.kernel_dim = ex.local_dim;
    for (size_t k : g->members) {
      ex.local_col[k] = ex.local_dim;
      ex.local_dim += tp.shards[mine[k]].cols;
    }
  }
  if (!split_rows_) ex.kernel_dim = ex.local_dim;
  // Where each source's message starts, and where its indices start within it.
  std::vector<int64_t> msg_start(static_cast<size_t>(W) + 1, 0),
      weight_start(static_cast<size_t>(W) + 1, 0);
  for (int i = 0; i < W; ++i) {
    msg_start[size_t(i) + 1] = msg_start[size_t(i)] + out_splits[size_t(i)];
    weight_start[size_t(i) + 1] = weight_start[size_t(i)] + w_out[size_t(i)];
  }
  // The bags of every rank for one group's shards, as CSR over the group's tables.
  auto bags_of = [&](const LocalTables& group, Tensor& indices, Tensor& offsets, Tensor& weights) {
    std::vector<int64_t> local_idx, local_off{0};
    std::vector<float> local_w;
    for (size_t k : group.members)
      for (int i = 0; i < W; ++i) {
        const int64_t* lengths = recv.data() + msg_start[size_t(i)];
        int64_t pos = n_mine * B;  // this source's indices of shard k, bag 0
        for (int64_t q = 0; q < int64_t(k) * B; ++q) pos += lengths[q];
        for (int64_t b = 0; b < B; ++b) {
          const int64_t n = lengths[int64_t(k) * B + b];
          for (int64_t p = 0; p < n; ++p) {
            local_idx.push_back(recv[size_t(msg_start[size_t(i)] + pos + p)]);
            if (weighted)
              local_w.push_back(recv_w[size_t(weight_start[size_t(i)] + pos - n_mine * B + p)]);
          }
          pos += n;
          local_off.push_back(int64_t(local_idx.size()));
        }
      }
    indices = i64_tensor(local_idx);
    offsets = i64_tensor(local_off);
    weights = weighted ? Tensor::from_vector(local_w, {int64_t(local_w.size())}) : Tensor();
  };
  EmbeddingBagOptions o;
  o.pooling = EmbeddingPooling::kSum;  // mean: divided by the global length at the end
  Tensor y, y_split;
  if (shards_) {
    shards_->pack();
    Tensor indices, offsets, weights;
    bags_of(*shards_, indices, offsets, weights);
    EmbeddingBagOptions fo = o;
    fo.fused = shards_->fused;
    y = embedding_bag(shards_->weights, shards_->layout, indices, offsets, weights, fo);
  }
  if (split_rows_) {
    split_rows_->pack();
    Tensor weights;
    bags_of(*split_rows_, ex.split_indices, ex.split_offsets, weights);
    autograd::NoGradGuard no_grad;  // the output exchange's backward updates these
    y_split = embedding_bag(split_rows_->weights, split_rows_->layout, ex.split_indices,
                            ex.split_offsets, weights, o);
    ex.split = split_rows_;
  }

  // ---- data-parallel tables: this rank's bags, locally (or every rank's: fused, training) ----
  Tensor ydp;
  if (data_) {
    data_->pack();
    std::vector<int64_t> d_idx, d_off{0}, d_len;
    std::vector<float> d_w;
    for (int64_t t : tp.data_tables) {
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t p = off[size_t(t * B + b)]; p < off[size_t(t * B + b + 1)]; ++p) {
          d_idx.push_back(idx[size_t(p)]);
          if (weighted) d_w.push_back(psw[size_t(p)]);
        }
        d_off.push_back(int64_t(d_idx.size()));
        d_len.push_back(off[size_t(t * B + b + 1)] - off[size_t(t * B + b)]);
      }
    }
    EmbeddingBagOptions fo = o;
    if (fused && autograd::grad_enabled() && W > 1) {
      // Rank i's bag b is bag i*B + b of the global batch, as in the single-process run.
      const auto lengths = allgather_varying(*group_, d_len);
      const auto indices = allgather_varying(*group_, d_idx);
      const auto weights = weighted ? allgather_varying(*group_, d_w)
                                    : std::vector<std::vector<float>>(static_cast<size_t>(W));
      d_idx.clear();
      d_w.clear();
      d_off.assign(1, 0);
      std::vector<size_t> at(static_cast<size_t>(W), 0);  // each rank's next index
      for (size_t j = 0; j < tp.data_tables.size(); ++j)
        for (int i = 0; i < W; ++i)
          for (int64_t b = 0; b < B; ++b) {
            const int64_t n = lengths[size_t(i)][j * size_t(B) + size_t(b)];
            for (int64_t p = 0; p < n; ++p, ++at[size_t(i)]) {
              d_idx.push_back(indices[size_t(i)][at[size_t(i)]]);
              if (weighted) d_w.push_back(weights[size_t(i)][at[size_t(i)]]);
            }
            d_off.push_back(int64_t(d_idx.size()));
          }
      ex.data_gathered = true;
    }
    fo.fused = data_->fused;
    ydp = embedding_bag(data_->weights, data_->layout, i64_tensor(d_idx), i64_tensor(d_off),
                        weighted ? Tensor::from_vector(d_w, {int64_t(d_w.size())}) : Tensor(), fo);
  }

  if (options_.pooling == EmbeddingPooling::kMean) {
    ex.scale.resize(size_t(T * B));
    for (int64_t q = 0; q < T * B; ++q) {
      const int64_t n = off[size_t(q) + 1] - off[size_t(q)];
      ex.scale[size_t(q)] = n > 0 ? 1.0f / float(n) : 0.0f;
    }
  }

  // ---- pooled outputs back to the requesting ranks ----
  std::vector<float> y_host;
  if (y_split.defined()) {  // Y = [shards' columns | split rows' columns]
    y_host.assign(size_t(W * B * ex.local_dim), 0.0f);
    const int64_t width = ex.local_dim - ex.kernel_dim;
    const std::vector<float> a = y.defined() ? y.to_vector<float>() : std::vector<float>();
    const std::vector<float> c = y_split.to_vector<float>();
    for (int64_t i = 0; i < W * B; ++i) {
      if (!a.empty())
        std::copy_n(a.begin() + i * ex.kernel_dim, ex.kernel_dim,
                    y_host.begin() + i * ex.local_dim);
      std::copy_n(c.begin() + i * width, width, y_host.begin() + i * ex.local_dim + ex.kernel_dim);
    }
  } else if (y.defined()) {
    y_host = y.to_vector<float>();
  }
  std::vector<float> ydp_host;
  if (ydp.defined())
    ydp_host = (ex.data_gathered ? ydp.narrow(0, r * B, B) : ydp).contiguous().to_vector<float>();
  Tensor out;
  {
    autograd::NoGradGuard no_grad;
    out = Tensor::from_vector(ex.forward(y_host, ydp_host), {B, tp.total_dim()});
  }
  std::vector<Tensor> inputs{anchor_};
  if (y.defined()) inputs.push_back(y);
  if (ydp.defined()) inputs.push_back(ydp);
  const bool has_y = y.defined(), has_ydp = ydp.defined();
  // The backward reads host copies `ex` made in the forward: nothing to save.
  autograd::record(out, "sharded_embedding_output", inputs, {},
                   [ex = std::move(ex), has_y, has_ydp, W, B](const Tensor& g) {
                     std::vector<float> dy, dydp;
                     ex.backward(g.to_vector<float>(), dy, dydp);
                     if (ex.split_rows) ex.update_split_rows(dy);
                     std::vector<Tensor> grads{Tensor()};
                     if (has_y) {
                       Tensor d = Tensor::from_vector(dy, {W * B, ex.local_dim});
                       if (ex.kernel_dim < ex.local_dim)
                         d = d.narrow(1, 0, ex.kernel_dim).contiguous();
                       grads.push_back(d);
                     }
                     if (has_ydp)
                       grads.push_back(ex.data_gathered
                                           ? ex.gathered_data_grad(std::move(dydp))
                                           : Tensor::from_vector(dydp, {B, ex.topo->data_dim}));
                     if (ex.fused_updates) ++*ex.fused_updates;
                     return grads;
                   });
  return out;
}

void ShardedEmbeddingBagCollection::finish_gradients() {
  // A fused optimizer updated the data tables in backward, from every rank's bags.
  if (!data_ || data_->fused || group_->size() == 1) return;
  std::vector<Tensor>& weights = data_->weights;
  int64_t total = 0;
  for (const Tensor& w : weights) total += w.numel();
  Tensor flat = Tensor::zeros({total});
  int64_t at = 0;
  for (const Tensor& w : weights) {
    if (w.grad().defined())
      flat.narrow(0, at, w.numel()).copy_(w.grad().detach().contiguous().reshape({w.numel()}));
    at += w.numel();
  }
  group_->allreduce(flat, {comm::ReduceOp::kAvg})->wait();
  at = 0;
  for (Tensor& w : weights) {
    w.set_grad(flat.narrow(0, at, w.numel()).reshape(w.shape()).clone());
    at += w.numel();
  }
}

std::vector<EmbeddingTablePart> ShardedEmbeddingBagCollection::local_parts() const {
  const ShardingTopology& tp = *topo_;
  const std::vector<size_t>& mine = tp.by_owner[size_t(tp.rank)];
  std::vector<EmbeddingTablePart> parts;
  for (const std::shared_ptr<LocalTables>& g : {shards_, split_rows_, data_}) {
    if (!g) continue;
    g->pack();
    for (size_t m = 0; m < g->members.size(); ++m) {
      EmbeddingTablePart p;
      p.table = g->tables[m];
      const nn::EmbeddingTableConfig& c = tp.configs[size_t(p.table)];
      if (g == data_) {
        p.kind = EmbeddingSharding::kData;
        p.rows = c.rows;
        p.cols = c.dim;
      } else {
        const EmbeddingShard& s = tp.shards[mine[g->members[m]]];
        p.kind = s.kind;
        p.row_start = s.row_start;
        p.rows = s.rows;
        p.col_start = s.col_start;
        p.cols = s.cols;
      }
      p.weight = g->weights[m];
      if (const EmbeddingFusedOptimizer* f = g->fused.get()) {
        const int64_t t = int64_t(m);
        if (f->hyper.kind == EmbeddingOptimizer::kRowwiseAdagrad)
          p.momentum1 = f->momentum1.narrow(0, g->layout.row_offset(t), p.rows);
        if (f->hyper.kind == EmbeddingOptimizer::kAdam) {
          const int64_t at = g->layout.weight_offset(t), n = p.rows * p.cols;
          p.momentum1 = f->momentum1.narrow(0, at, n).reshape({p.rows, p.cols});
          p.momentum2 = f->momentum2.narrow(0, at, n).reshape({p.rows, p.cols});
        }
      }
      parts.push_back(p);
    }
  }
  std::stable_sort(
      parts.begin(), parts.end(),
      [](const EmbeddingTablePart& a, const EmbeddingTablePart& b) { return a.table < b.table; });
  return parts;
}

void ShardedEmbeddingBagCollection::set_fused_updates(int64_t n) {
  LOOM_CHECK(n >= 0, kOp, ": the fused update count must be >= 0, got ", n);
  *fused_updates_ = n;
  for (const std::shared_ptr<LocalTables>& g : {shards_, split_rows_, data_})
    if (g && g->fused) g->fused->hyper.step = n + 1;
}

}  // namespace loom::parallel
