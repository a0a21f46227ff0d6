// See parallel/checkpoint/embedding_state.h.
#include "parallel/checkpoint/embedding_state.h"

#include <memory>

#include "core/error.h"

namespace loom::parallel::checkpoint {

namespace {

constexpr const char* kKey = "embedding_optimizer";

// `t` (contiguous) as one piece of `name` at `region`.
StatePiece piece(const std::string& name, const Shape& shape, const io::Region& region,
                 const Tensor& t, bool snapshot) {
  LOOM_ASSERT(t.is_contiguous() && t.numel() == region.numel(), "checkpoint: ", name, " has ",
              t.numel(), " elements for ", region.str());
  Tensor flat = t.detach().reshape({t.numel()});
  return {name, shape, region, snapshot ? flat.clone() : flat};
}

}  // namespace

const char* embedding_optimizer_name(EmbeddingOptimizer kind) {
  switch (kind) {
    case EmbeddingOptimizer::kNone:
      return "dense";
    case EmbeddingOptimizer::kSgd:
      return "sgd";
    case EmbeddingOptimizer::kRowwiseAdagrad:
      return "rowwise_adagrad";
    case EmbeddingOptimizer::kAdam:
      return "adam";
  }
  return "?";
}

EmbeddingState::EmbeddingState(nn::EmbeddingBagCollection& tables, optim::Optimizer* dense)
    : fused_(tables.fused_optimizer() ? tables.fused_optimizer()->hyper.kind
                                      : EmbeddingOptimizer::kNone),
      dense_(dense) {
  nn::EmbeddingBagCollection* ebc = &tables;
  parts_ = [ebc] {
    const EmbeddingBagLayout& l = ebc->layout();
    const EmbeddingFusedOptimizer* f = ebc->fused_optimizer().get();
    std::vector<Part> parts;
    for (int64_t t = 0; t < l.num_tables(); ++t) {
      Part p;
      p.name = ebc->tables()[size_t(t)].name + ".weight";
      p.shape = {l.rows(t), l.dim(t)};
      p.rows = l.rows(t);
      p.cols = l.dim(t);
      p.weight = ebc->weights()[size_t(t)];
      if (f && f->hyper.kind == EmbeddingOptimizer::kRowwiseAdagrad)
        p.momentum1 = f->momentum1.narrow(0, l.row_offset(t), p.rows);
      if (f && f->hyper.kind == EmbeddingOptimizer::kAdam) {
        const int64_t at = l.weight_offset(t), n = p.rows * p.cols;
        p.momentum1 = f->momentum1.narrow(0, at, n).reshape(p.shape);
        p.momentum2 = f->momentum2.narrow(0, at, n).reshape(p.shape);
      }
      parts.push_back(std::move(p));
    }
    return parts;
  };
  fused_updates_ = [ebc] {
    return ebc->fused_optimizer() ? ebc->fused_optimizer()->hyper.step - 1 : int64_t(0);
  };
  set_fused_updates_ = [ebc](int64_t n) {
    if (ebc->fused_optimizer()) ebc->fused_optimizer()->hyper.step = n + 1;
  };
  LOOM_CHECK(!(dense_ && fused_ != EmbeddingOptimizer::kNone),
             "checkpoint: the embedding tables have a fused ", embedding_optimizer_name(fused_),
             " optimizer and get no gradients, so no other optimizer trains them");
}

EmbeddingState::EmbeddingState(ShardedEmbeddingBagCollection& tables, optim::Optimizer* dense)
    : fused_(tables.fused_optimizer().kind), dense_(dense) {
  ShardedEmbeddingBagCollection* ebc = &tables;
  parts_ = [ebc] {
    std::vector<Part> parts;
    for (const EmbeddingTablePart& lp : ebc->local_parts()) {
      const nn::EmbeddingTableConfig& c = ebc->tables()[size_t(lp.table)];
      parts.push_back({c.name + ".weight",
                       {c.rows, c.dim},
                       lp.row_start,
                       lp.rows,
                       lp.col_start,
                       lp.cols,
                       lp.weight,
                       lp.momentum1,
                       lp.momentum2});
    }
    return parts;
  };
  fused_updates_ = [ebc] { return ebc->fused_updates(); };
  set_fused_updates_ = [ebc](int64_t n) { ebc->set_fused_updates(n); };
  LOOM_CHECK(!(dense_ && fused_ != EmbeddingOptimizer::kNone),
             "checkpoint: the embedding tables have a fused ", embedding_optimizer_name(fused_),
             " optimizer and get no gradients, so no other optimizer trains them");
}

std::vector<ParamPlace> EmbeddingState::places(const std::vector<Part>& parts) const {
  LOOM_CHECK(dense_->params().size() == parts.size(), "checkpoint: the optimizer of the embedding ",
             "tables has ", dense_->params().size(), " parameters but this rank holds ",
             parts.size(), " tables (it must be over the module's parameters, in order)");
  std::vector<ParamPlace> out;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Part& p = parts[i];
    LOOM_CHECK(dense_->params()[i].shape() == Shape({p.rows, p.cols}), "checkpoint: parameter ", i,
               " of the tables' optimizer is ", shape_str(dense_->params()[i].shape()),
               " but table part ", p.name, " is ", shape_str({p.rows, p.cols}));
    Placement placement;
    placement.global_shape = p.shape;
    placement.parts.push_back({io::Region::box({p.row_start, p.col_start}, {p.rows, p.cols}), 0});
    out.push_back({p.name, placement});
  }
  return out;
}

std::vector<StatePiece> EmbeddingState::pieces(bool snapshot) const {
  std::vector<StatePiece> out;
  for (const Part& p : parts_()) {
    const io::Region box = io::Region::box({p.row_start, p.col_start}, {p.rows, p.cols});
    out.push_back(piece("model." + p.name, p.shape, box, p.weight, snapshot));
    const std::string optim = "optim." + p.name + ".";
    if (fused_ == EmbeddingOptimizer::kRowwiseAdagrad)
      out.push_back(piece(optim + "momentum1", {p.shape[0]},
                          io::Region::box({p.row_start}, {p.rows}), p.momentum1, snapshot));
    if (fused_ == EmbeddingOptimizer::kAdam) {
      out.push_back(piece(optim + "exp_avg", p.shape, box, p.momentum1, snapshot));
      out.push_back(piece(optim + "exp_avg_sq", p.shape, box, p.momentum2, snapshot));
    }
  }
  return out;
}

std::vector<StatePiece> EmbeddingState::save_pieces(nlohmann::json& state) const {
  std::vector<StatePiece> out = pieces(/*snapshot=*/true);
  if (fused_ == EmbeddingOptimizer::kNone && !dense_) return out;  // the tables alone
  state[kKey]["kind"] = embedding_optimizer_name(fused_);
  if (fused_ != EmbeddingOptimizer::kNone) state[kKey]["updates"] = fused_updates_();
  if (dense_) add_optimizer_state(out, state, *dense_, places(parts_()));
  return out;
}

void EmbeddingState::load(const std::string& path, const io::CheckpointManifest& manifest,
                          comm::Communicator& group) {
  const nlohmann::json& s = manifest.state;
  const std::string mine = embedding_optimizer_name(fused_);
  const bool recorded = s.contains(kKey) && s[kKey].is_object() && s[kKey].contains("kind");
  const bool trained = fused_ != EmbeddingOptimizer::kNone || dense_;  // else the tables alone
  LOOM_CHECK(recorded || fused_ == EmbeddingOptimizer::kNone, "checkpoint ", path,
             " records no embedding optimizer (state.", kKey, "), so it has no ", mine,
             " state for the tables");
  LOOM_CHECK(!trained || !recorded || s[kKey]["kind"] == mine, "checkpoint ", path,
             ": its embedding tables were trained by ", s[kKey]["kind"].dump(),
             " but these are trained by \"", mine, "\"; a resumed run keeps the optimizer");
  int64_t updates = 0;
  if (fused_ != EmbeddingOptimizer::kNone) {
    const nlohmann::json& u = s[kKey].value("updates", nlohmann::json());
    LOOM_CHECK(u.is_number_integer() && u.get<int64_t>() >= 0, "checkpoint ", path, ": state.",
               kKey, ".updates is missing or not a count: ", u.dump());
    updates = u.get<int64_t>();
  }
  std::vector<StatePiece> targets = pieces(/*snapshot=*/false);
  std::unique_ptr<OptimizerStateLoad> opt;
  if (dense_) {
    opt = std::make_unique<OptimizerStateLoad>(*dense_, places(parts_()), s);
    targets.insert(targets.end(), opt->pieces().begin(), opt->pieces().end());
  }
  checkpoint::load(path, manifest, targets, group);
  if (opt) opt->finish(s);
  if (fused_ != EmbeddingOptimizer::kNone) set_fused_updates_(updates);
}

}  // namespace loom::parallel::checkpoint
