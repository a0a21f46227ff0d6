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
  // Elements one rank sends per requester in the forward all_to_all: its table/column blocks.
  int64_t exchange_width(int owner) const {
    int64_t w = 0;
    for (size_t k : by_owner[size_t(owner)])
      if (!is_row(shards[k])) w += shards[k].cols;
    return w;
  }
};

}  // namespace detail

namespace {

using detail::ShardingTopology;
constexpr const char* kOp = "ShardedEmbeddingBagCollection";

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
  std::vector<float> scale;  // [T * B]: 1 / global bag length (mean), empty for sum

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
  for (int64_t t = 0; t < tp.num_tables(); ++t) {
    const nn::EmbeddingTableConfig& c = tp.configs[size_t(t)];
    // The single-process init (nn::EmbeddingBagCollection's), cut by the shard spec.
    const nn::Init init = nn::Init::normal(std::sqrt(1.0 / (3.0 * double(c.rows))));
    if (tp.placements[size_t(t)].kind == EmbeddingSharding::kData) {
      data_weights_.push_back(register_module(c.name, std::make_shared<ShardModule>(
                                                          Shape{c.rows, c.dim}, init, nullptr))
                                  ->weight);
      continue;
    }
    for (size_t k : tp.by_owner[size_t(tp.rank)]) {
      const EmbeddingShard& s = tp.shards[k];
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
      shard_weights_.push_back(register_module(c.name, std::make_shared<ShardModule>(
                                                           Shape{s.rows, s.cols}, init, spec_ptr))
                                   ->weight);
    }
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
  OutputExchange ex;
  ex.topo = topo_;
  ex.group = group_;
  ex.B = B;
  Tensor y;
  if (n_mine > 0) {
    std::vector<int64_t> rows, dims;
    std::vector<std::string> names;
    for (size_t k : mine) {
      const EmbeddingShard& s = tp.shards[k];
      ex.local_col.push_back(ex.local_dim);
      ex.local_dim += s.cols;
      rows.push_back(s.rows);
      dims.push_back(s.cols);
      names.push_back(tp.configs[size_t(s.table)].name + " (" + embedding_sharding_name(s.kind) +
                      " shard)");
    }
    // Where each source's message starts, and where its indices start within it.
    std::vector<int64_t> msg_start(static_cast<size_t>(W) + 1, 0),
        weight_start(static_cast<size_t>(W) + 1, 0);
    for (int i = 0; i < W; ++i) {
      msg_start[size_t(i) + 1] = msg_start[size_t(i)] + out_splits[size_t(i)];
      weight_start[size_t(i) + 1] = weight_start[size_t(i)] + w_out[size_t(i)];
    }
    std::vector<int64_t> local_idx, local_off{0};
    std::vector<float> local_w;
    for (int64_t k = 0; k < n_mine; ++k)
      for (int i = 0; i < W; ++i) {
        const int64_t* lengths = recv.data() + msg_start[size_t(i)];
        int64_t pos = n_mine * B;  // this source's indices of shard k, bag 0
        for (int64_t q = 0; q < k * B; ++q) pos += lengths[q];
        for (int64_t b = 0; b < B; ++b) {
          const int64_t n = lengths[k * B + b];
          for (int64_t p = 0; p < n; ++p) {
            local_idx.push_back(recv[size_t(msg_start[size_t(i)] + pos + p)]);
            if (weighted)
              local_w.push_back(recv_w[size_t(weight_start[size_t(i)] + pos - n_mine * B + p)]);
          }
          pos += n;
          local_off.push_back(int64_t(local_idx.size()));
        }
      }
    EmbeddingBagOptions o;
    o.pooling = EmbeddingPooling::kSum;  // mean: divided by the global length at the end
    y = embedding_bag(shard_weights_, EmbeddingBagLayout(rows, dims, names), i64_tensor(local_idx),
                      i64_tensor(local_off),
                      weighted ? Tensor::from_vector(local_w, {int64_t(local_w.size())}) : Tensor(),
                      o);
  }

  // ---- data-parallel tables: this rank's bags, locally ----
  Tensor ydp;
  if (!tp.data_tables.empty()) {
    std::vector<int64_t> rows, dims, d_idx, d_off{0};
    std::vector<std::string> names;
    std::vector<float> d_w;
    for (int64_t t : tp.data_tables) {
      rows.push_back(tp.configs[size_t(t)].rows);
      dims.push_back(tp.configs[size_t(t)].dim);
      names.push_back(tp.configs[size_t(t)].name);
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t p = off[size_t(t * B + b)]; p < off[size_t(t * B + b + 1)]; ++p) {
          d_idx.push_back(idx[size_t(p)]);
          if (weighted) d_w.push_back(psw[size_t(p)]);
        }
        d_off.push_back(int64_t(d_idx.size()));
      }
    }
    EmbeddingBagOptions o;
    o.pooling = EmbeddingPooling::kSum;
    ydp = embedding_bag(data_weights_, EmbeddingBagLayout(rows, dims, names), i64_tensor(d_idx),
                        i64_tensor(d_off),
                        weighted ? Tensor::from_vector(d_w, {int64_t(d_w.size())}) : Tensor(), o);
  }

  if (options_.pooling == EmbeddingPooling::kMean) {
    ex.scale.resize(size_t(T * B));
    for (int64_t q = 0; q < T * B; ++q) {
      const int64_t n = off[size_t(q) + 1] - off[size_t(q)];
      ex.scale[size_t(q)] = n > 0 ? 1.0f / float(n) : 0.0f;
    }
  }

  // ---- pooled outputs back to the requesting ranks ----
  const std::vector<float> y_host = y.defined() ? y.to_vector<float>() : std::vector<float>();
  const std::vector<float> ydp_host = ydp.defined() ? ydp.to_vector<float>() : std::vector<float>();
  Tensor out;
  {
    autograd::NoGradGuard no_grad;
    out = Tensor::from_vector(ex.forward(y_host, ydp_host), {B, tp.total_dim()});
  }
  std::vector<Tensor> inputs{anchor_};
  if (y.defined()) inputs.push_back(y);
  if (ydp.defined()) inputs.push_back(ydp);
  const bool has_y = y.defined(), has_ydp = ydp.defined();
  const int64_t local_dim = ex.local_dim;
  autograd::record(out, "sharded_embedding_output", inputs,
                   [ex = std::move(ex), has_y, has_ydp, local_dim, W, B](const Tensor& g) {
                     std::vector<float> dy, dydp;
                     ex.backward(g.to_vector<float>(), dy, dydp);
                     std::vector<Tensor> grads{Tensor()};
                     if (has_y) grads.push_back(Tensor::from_vector(dy, {W * B, local_dim}));
                     if (has_ydp)
                       grads.push_back(Tensor::from_vector(dydp, {B, ex.topo->data_dim}));
                     return grads;
                   });
  return out;
}

void ShardedEmbeddingBagCollection::finish_gradients() {
  if (data_weights_.empty() || group_->size() == 1) return;
  int64_t total = 0;
  for (const Tensor& w : data_weights_) total += w.numel();
  Tensor flat = Tensor::zeros({total});
  int64_t at = 0;
  for (const Tensor& w : data_weights_) {
    if (w.grad().defined())
      flat.narrow(0, at, w.numel()).copy_(w.grad().detach().contiguous().reshape({w.numel()}));
    at += w.numel();
  }
  group_->allreduce(flat, {comm::ReduceOp::kAvg})->wait();
  at = 0;
  for (Tensor& w : data_weights_) {
    w.set_grad(flat.narrow(0, at, w.numel()).reshape(w.shape()).clone());
    at += w.numel();
  }
}

}  // namespace loom::parallel
