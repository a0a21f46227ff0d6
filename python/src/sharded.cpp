// parallel::ShardedEmbeddingBagCollection (parallel/sharded_embedding.h) as
// loom._loom.distributed.ShardedEmbeddingBagCollection, with its placement enum and shard
// descriptions; python/loom/distributed/embedding.py wraps it as a loom.nn.Module. lookup() and
// finish_gradients() are collectives: they release the GIL, so the other ranks' Python threads
// (and this process's) are not blocked while they wait.
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bindings.h"
#include "collectives/communicator.h"
#include "parallel/sharded_embedding.h"

namespace loom::python {
namespace {

using parallel::EmbeddingSharding;

// A placement from Python: an EmbeddingPlacement, an EmbeddingSharding, a kind name, or a
// (kind, rank) pair for a table placed on a given rank.
parallel::EmbeddingPlacement placement_arg(py::handle obj) {
  if (py::isinstance<parallel::EmbeddingPlacement>(obj))
    return obj.cast<parallel::EmbeddingPlacement>();
  parallel::EmbeddingPlacement p;
  if (py::isinstance<EmbeddingSharding>(obj)) {
    p.kind = obj.cast<EmbeddingSharding>();
  } else if (py::isinstance<py::str>(obj)) {
    p.kind = parallel::parse_embedding_sharding(obj.cast<std::string>());
  } else if (py::isinstance<py::tuple>(obj) && py::len(obj) == 2) {
    auto t = obj.cast<py::tuple>();
    p = placement_arg(t[0]);
    p.rank = t[1].cast<int>();
  } else {
    throw py::type_error(
        "ShardedEmbeddingBagCollection: a placement must be an EmbeddingPlacement, an "
        "EmbeddingSharding, a name ('table', 'row', 'column', 'data') or (name, rank), got " +
        std::string(py::str(py::type::of(obj).attr("__name__"))));
  }
  return p;
}

}  // namespace

void init_sharded(py::module_& m) {
  py::module_ d = m.def_submodule("distributed");
  d.attr("AUTO_REPLICATE_BELOW") = parallel::kAutoReplicateBelow;
  d.def(
      "placements_for",
      [](const std::string& sharding, const std::vector<int64_t>& rows) {
        std::vector<std::string> names;
        for (const auto& p : parallel::embedding_placements(sharding, rows))
          names.push_back(parallel::embedding_sharding_name(p.kind));
        return names;
      },
      py::arg("sharding"), py::arg("rows"),
      "One placement name per table for loom-dlrm's --sharding ('table', 'row', 'column', "
      "'data', or 'auto': tables under AUTO_REPLICATE_BELOW rows replicated, the others whole).");

  py::enum_<EmbeddingSharding>(d, "EmbeddingSharding",
                               "How one table is placed over a group (TorchRec's shardings).")
      .value("table", EmbeddingSharding::kTable)
      .value("row", EmbeddingSharding::kRow)
      .value("column", EmbeddingSharding::kColumn)
      .value("data", EmbeddingSharding::kData);

  py::class_<parallel::EmbeddingPlacement>(d, "EmbeddingPlacement",
                                           "kind, and for 'table' the owning rank (-1: chosen "
                                           "by a greedy balance of rows * dim)")
      .def(py::init([](py::handle kind, int rank) {
             parallel::EmbeddingPlacement p = placement_arg(kind);
             p.rank = rank;
             return p;
           }),
           py::arg("kind") = "table", py::arg("rank") = -1)
      .def_readwrite("kind", &parallel::EmbeddingPlacement::kind)
      .def_readwrite("rank", &parallel::EmbeddingPlacement::rank)
      .def("__repr__", [](const parallel::EmbeddingPlacement& p) {
        return std::string("EmbeddingPlacement('") + parallel::embedding_sharding_name(p.kind) +
               "', rank=" + std::to_string(p.rank) + ")";
      });

  py::class_<parallel::EmbeddingShard>(d, "EmbeddingShard",
                                       "A piece of a table on one rank: rows [row_start, "
                                       "row_start + rows), columns [col_start, col_start + cols).")
      .def_readonly("table", &parallel::EmbeddingShard::table)
      .def_readonly("kind", &parallel::EmbeddingShard::kind)
      .def_readonly("owner", &parallel::EmbeddingShard::owner)
      .def_readonly("row_start", &parallel::EmbeddingShard::row_start)
      .def_readonly("rows", &parallel::EmbeddingShard::rows)
      .def_readonly("col_start", &parallel::EmbeddingShard::col_start)
      .def_readonly("cols", &parallel::EmbeddingShard::cols)
      .def("__repr__", [](const parallel::EmbeddingShard& s) {
        return "EmbeddingShard(table=" + std::to_string(s.table) + ", kind='" +
               parallel::embedding_sharding_name(s.kind) + "', owner=" + std::to_string(s.owner) +
               ", rows=[" + std::to_string(s.row_start) + ", " +
               std::to_string(s.row_start + s.rows) + "), cols=[" + std::to_string(s.col_start) +
               ", " + std::to_string(s.col_start + s.cols) + "))";
      });

  py::class_<parallel::ShardedEmbeddingBagCollection, nn::Module,
             std::shared_ptr<parallel::ShardedEmbeddingBagCollection>>(
      d, "ShardedEmbeddingBagCollection")
      .def(py::init([](const std::vector<std::tuple<std::string, int64_t, int64_t>>& tables,
                       py::sequence placements, std::shared_ptr<comm::Communicator> group,
                       const std::string& pooling) {
             if (!group)
               throw py::value_error("ShardedEmbeddingBagCollection: group must be a Communicator");
             std::vector<nn::EmbeddingTableConfig> configs;
             for (const auto& [name, rows, dim] : tables) configs.push_back({name, rows, dim});
             if (py::len(placements) != configs.size())
               throw py::value_error(
                   "ShardedEmbeddingBagCollection: " + std::to_string(py::len(placements)) +
                   " placements for " + std::to_string(configs.size()) + " tables (one per table)");
             std::vector<parallel::EmbeddingPlacement> ps;
             for (py::handle p : placements) ps.push_back(placement_arg(p));
             parallel::ShardedEmbeddingOptions o;
             o.pooling = embedding_pooling_arg(pooling, "ShardedEmbeddingBagCollection");
             return std::make_shared<parallel::ShardedEmbeddingBagCollection>(
                 std::move(configs), std::move(ps), std::move(group), o);
           }),
           py::arg("tables"), py::arg("placements"), py::arg("group"), py::arg("pooling") = "sum")
      .def(
          "lookup",
          [](parallel::ShardedEmbeddingBagCollection& self, const Tensor& indices,
             const Tensor& offsets, std::optional<Tensor> per_sample_weights) {
            py::gil_scoped_release release;
            return self.lookup(indices, offsets, per_sample_weights.value_or(Tensor()));
          },
          py::arg("indices"), py::arg("offsets"), py::arg("per_sample_weights") = py::none())
      .def("finish_gradients", &parallel::ShardedEmbeddingBagCollection::finish_gradients,
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("tables",
                             [](const parallel::ShardedEmbeddingBagCollection& self) {
                               py::list out;
                               for (const auto& t : self.tables())
                                 out.append(py::make_tuple(t.name, t.rows, t.dim));
                               return out;
                             })
      .def_property_readonly("placements", &parallel::ShardedEmbeddingBagCollection::placements)
      .def_property_readonly("shards", &parallel::ShardedEmbeddingBagCollection::shards);
}

}  // namespace loom::python
