// See dlrm/dlrm_checkpoint.h.
#include "dlrm/dlrm_checkpoint.h"

#include "core/error.h"

namespace loom::dlrm {

namespace {

const nlohmann::json& section(const cli::ResumePoint& p, const char* key) {
  const nlohmann::json& s = p.manifest.state;
  LOOM_CHECK(s.contains(key) && s[key].is_object(), "loom-dlrm: checkpoint ", p.path, " has no \"",
             key, "\" in its state: it was not saved by loom-dlrm");
  return s[key];
}

const nlohmann::json& field(const cli::ResumePoint& p, const nlohmann::json& section,
                            const char* key) {
  LOOM_CHECK(section.contains(key), "loom-dlrm: checkpoint ", p.path, ": state field \"", key,
             "\" is missing");
  return section[key];
}

int64_t integer(const cli::ResumePoint& p, const nlohmann::json& section, const char* key) {
  const nlohmann::json& v = field(p, section, key);
  LOOM_CHECK(v.is_number_integer(), "loom-dlrm: checkpoint ", p.path, ": state field \"", key,
             "\" is not an integer: ", v.dump());
  return v.get<int64_t>();
}

std::string str(const std::vector<int64_t>& v) { return nlohmann::json(v).dump(); }

}  // namespace

nlohmann::json run_state(const DlrmRun& run, int64_t next_example) {
  const DlrmConfig& c = run.config;
  nlohmann::json s;
  s["model"] = {{"num_dense", c.num_dense},
                {"num_tables", c.num_tables},
                {"dim", c.dim},
                {"bottom", c.bottom},
                {"top", c.top},
                {"table_rows", run.table_rows}};
  nlohmann::json placements = nlohmann::json::array();
  for (const parallel::EmbeddingPlacement& p : run.placements)
    placements.push_back({{"kind", parallel::embedding_sharding_name(p.kind)}, {"rank", p.rank}});
  s["layout"] = {{"world_size", run.world_size},
                 {"sharding", run.world_size > 1 ? run.sharding : "one process"},
                 {"placements", placements}};
  s["data"] = {{"source", "synthetic click data"},
               {"next_example", next_example},
               {"batch", run.batch},
               {"max_bag", run.max_bag},
               {"seed", run.seed}};
  s["training"] = {{"seed", run.seed},
                   {"optimizer", "adamw"},
                   {"embedding_optimizer", run.embedding_optimizer},
                   {"lr", run.lr},
                   {"embedding_lr", run.embedding_lr},
                   {"steps", run.steps}};
  return s;
}

int64_t checkpoint_dim(const cli::ResumePoint& p, int64_t dim, bool dim_set) {
  const int64_t saved = integer(p, section(p, "model"), "dim");
  LOOM_CHECK(!dim_set || dim == saved, "loom-dlrm: --dim ", dim, " conflicts with the checkpoint ",
             p.path, ", whose model has ", saved);
  return saved;
}

int64_t resume_position(const cli::ResumePoint& p, const DlrmRun& run) {
  const nlohmann::json& m = section(p, "model");
  const std::vector<int64_t> rows = field(p, m, "table_rows").get<std::vector<int64_t>>();
  LOOM_CHECK(rows == run.table_rows && integer(p, m, "num_dense") == run.config.num_dense,
             "loom-dlrm: the checkpoint ", p.path, "'s model has tables of ", str(rows),
             " rows and ", integer(p, m, "num_dense"), " dense features, but the data has ",
             str(run.table_rows), " and ", run.config.num_dense);
  LOOM_CHECK(field(p, m, "bottom").get<std::vector<int64_t>>() == run.config.bottom &&
                 field(p, m, "top").get<std::vector<int64_t>>() == run.config.top,
             "loom-dlrm: the checkpoint ", p.path, "'s MLPs are bottom ", m["bottom"].dump(),
             " and top ", m["top"].dump(), ", this model's ", str(run.config.bottom), " and ",
             str(run.config.top));
  const nlohmann::json& d = section(p, "data");
  LOOM_CHECK(field(p, d, "source") == "synthetic click data", "loom-dlrm: the checkpoint ", p.path,
             " was trained on ", d["source"].dump(), ", not loom-dlrm's synthetic click data");
  const nlohmann::json& t = section(p, "training");
  const nlohmann::json& seed = field(p, t, "seed");
  LOOM_CHECK(seed.is_number_unsigned() && seed.get<uint64_t>() == run.seed, "loom-dlrm: --seed ",
             run.seed, " differs from the checkpoint ", p.path, "'s ", seed.dump(),
             " (the seed decides the data's examples)");
  const int64_t max_bag = integer(p, d, "max_bag");
  LOOM_CHECK(max_bag == run.max_bag, "loom-dlrm: --max-bag ", run.max_bag,
             " differs from the checkpoint ", p.path, "'s ", max_bag,
             ": a resumed run reads the same data");
  const nlohmann::json& opt = field(p, t, "embedding_optimizer");
  LOOM_CHECK(opt == run.embedding_optimizer, "loom-dlrm: --embedding-optimizer ",
             run.embedding_optimizer, " differs from the checkpoint ", p.path, "'s ", opt.dump());
  const int64_t next = integer(p, d, "next_example");
  LOOM_CHECK(next >= 0, "loom-dlrm: checkpoint ", p.path, ": negative data position ", next);
  return next;
}

}  // namespace loom::dlrm
