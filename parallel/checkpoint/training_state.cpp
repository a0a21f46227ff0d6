// See parallel/checkpoint/training_state.h.
#include "parallel/checkpoint/training_state.h"

#include <cstdlib>
#include <optional>

#include "core/error.h"
#include "optimizer/adamw.h"
#include "optimizer/mixed_precision.h"

namespace loom::parallel::checkpoint {

namespace {

// `data` (contiguous, placement.numel() elements) as one piece per part of the placement.
void add_pieces(std::vector<StatePiece>& out, const std::string& name, const Placement& placement,
                const Tensor& data) {
  LOOM_ASSERT(data.numel() == placement.numel(), "checkpoint: ", name, " has ", data.numel(),
              " elements but its placement ", placement.numel());
  LOOM_ASSERT(data.is_contiguous(), "checkpoint: ", name, " is not contiguous");
  const Tensor flat = data.reshape({data.numel()});
  for (const Placement::Part& part : placement.parts)
    out.push_back({name, placement.global_shape, part.region,
                   flat.narrow(0, part.local_offset, part.region.numel())});
}

// The loss scaler of a bf16 / f16 optimizer, or null (f32 has none worth keeping).
optim::LossScaler* scaler_of(optim::Optimizer& optimizer, ZeroOptimizer* zero) {
  if (zero) return zero->masters() ? &zero->scaler() : nullptr;
  if (auto* mixed = dynamic_cast<optim::MixedPrecisionOptimizer*>(&optimizer))
    return &mixed->scaler();
  return nullptr;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Note [Masters across dtypes]
// A bf16 / f16 run's f32 masters are its parameters' exact values, and its bf16 parameters only
// their rounding. So an f32 layout loads its parameters from the masters when the checkpoint has
// them, and a bf16 / f16 layout loading an f32 checkpoint takes its masters from the parameters.
// The name a piece of `name`, held in `dtype`, loads from.
std::string across_dtypes(const std::string& name, DType dtype,
                          const io::CheckpointManifest& manifest) {
  const std::string model = "model.", optim = "optim.", master = ".master";
  if (name.rfind(model, 0) == 0 && dtype == DType::kF32) {
    const std::string m = optim + name.substr(model.size()) + master;
    if (manifest.tensors.count(m)) return m;
  } else if (name.rfind(optim, 0) == 0 && ends_with(name, master) &&
             !manifest.tensors.count(name)) {
    return model + name.substr(optim.size(), name.size() - optim.size() - master.size());
  }
  return name;
}

// The update count of each parameter at `places` from a manifest's state (its
// "optimizer_steps"). Throws naming the first parameter it lacks.
std::vector<int64_t> update_counts(const std::vector<ParamPlace>& places,
                                   const nlohmann::json& state) {
  const nlohmann::json empty = nlohmann::json::object();
  const nlohmann::json& steps =
      state.contains("optimizer_steps") ? state["optimizer_steps"] : empty;
  std::vector<int64_t> counts;
  for (const ParamPlace& p : places) {
    LOOM_CHECK(steps.contains(p.name) && steps[p.name].is_number_integer() &&
                   steps[p.name].get<int64_t>() >= 0,
               "checkpoint: the manifest has no update count (an integer >= 0) for ", p.name,
               " (state.optimizer_steps): saved by another optimizer?");
    counts.push_back(steps[p.name].get<int64_t>());
  }
  return counts;
}

// Note [ZeRO's parameters read whole when cached]
// ZeRO stages 1 and 2 keep every parameter whole on every rank, and a load can fill them two
// ways. By pieces: each rank reads its own pieces and parameters_changed() all-gathers the rest,
// so each stored byte is read once and then moved twice more per receiving rank (Open MPI's
// shared memory copies it in and out). Whole: each rank reads every parameter itself, each
// stored byte read by every rank. From the page cache a read is one copy of memory, the
// cheapest way to move the bytes: GPT-2 124M's ZeRO-1 state on 2 ranks of the 2-vCPU VM loaded
// warm in 0.26-0.29 s whole against 0.30-0.35 s by pieces (loom-bench-checkpoint, the two taken
// in turn; benchmarks/README.md). From a disk, or a file system that many ranks share, whole
// reads multiply the reading by the group's size, and the gather wins. So the parameters are
// read whole when every byte of them is in every rank's page cache at the load's start
// (in_page_cache: mincore over the data files), agreed over the shard group, since the gather
// is collective and one rank cannot skip it alone. Both ways read the same stored bytes, so the
// parameters get the same bits. LOOM_CKPT_PARAMETERS=whole|pieces forces a way (auto, the
// default: the rule above); whole still needs a layout whose pieces view the whole parameters.
enum class ParameterRead { kAuto, kWhole, kPieces };

ParameterRead parameter_read_from_environment() {
  const char* v = std::getenv("LOOM_CKPT_PARAMETERS");
  const std::string s = v ? v : "";
  if (s.empty() || s == "auto") return ParameterRead::kAuto;
  if (s == "whole") return ParameterRead::kWhole;
  LOOM_CHECK(s == "pieces", "LOOM_CKPT_PARAMETERS must be auto, whole or pieces, got '", s, "'");
  return ParameterRead::kPieces;
}

// "model.<name>" of every parameter `zero` manages, whole, viewing the live parameters; empty
// where its pieces do not view them whole (stage 3, own parameters).
std::vector<StatePiece> whole_parameter_pieces(const nn::Module& module, const ZeroOptimizer& zero,
                                               const GlobalName& global_name,
                                               const io::CheckpointManifest& manifest) {
  if (!zero.pieces_view_whole_parameters()) return {};
  std::vector<ParamPlace> places;
  std::vector<Tensor> values;
  for (const auto& [name, p] : zero.named_parameters()) {
    places.push_back({global_name ? global_name(name) : name, parameter_placement(module, name)});
    values.push_back(p.detach());
  }
  std::vector<StatePiece> pieces = value_pieces(places, values);
  for (StatePiece& p : pieces) p.name = across_dtypes(p.name, p.data.dtype(), manifest);
  return pieces;
}

// Whether every rank of `group` reads `whole` (Note [ZeRO's parameters read whole when cached]).
// Collective over `group`.
bool read_whole(const std::string& path, const io::CheckpointManifest& manifest,
                const std::vector<StatePiece>& whole, comm::Communicator& group) {
  const ParameterRead how = parameter_read_from_environment();
  if (whole.empty() || how == ParameterRead::kPieces) return false;
  if (how == ParameterRead::kWhole) return true;
  Tensor cached = Tensor::full({1}, in_page_cache(path, manifest, whole) ? 1.0 : 0.0, DType::kI32);
  if (group.size() > 1) group.allreduce_sync(cached, comm::ReduceOp::kMin);
  return cached.to_vector<int32_t>()[0] == 1;
}

}  // namespace

Placement parameter_placement(const nn::Module& module, const std::string& name) {
  if (const nn::ShardSpec* shard = module.parameter_shard(name)) return Placement::of_shard(*shard);
  for (const auto& [n, p] : module.named_parameters())
    if (n == name) return Placement::whole(p.shape());
  LOOM_FAIL("checkpoint: the module has no parameter ", name);
}

std::vector<ParamPlace> parameter_places(const nn::Module& module) {
  std::vector<ParamPlace> places;
  for (const auto& [name, p] : module.named_parameters()) {
    const nn::ShardSpec* shard = module.parameter_shard(name);
    places.push_back({name, shard ? Placement::of_shard(*shard) : Placement::whole(p.shape())});
  }
  return places;
}

std::vector<StatePiece> value_pieces(const std::vector<ParamPlace>& places,
                                     const std::vector<Tensor>& values, const std::string& prefix) {
  LOOM_ASSERT(places.size() == values.size(), places.size(), " places for ", values.size(),
              " tensors");
  std::vector<StatePiece> out;
  for (size_t i = 0; i < places.size(); ++i)
    add_pieces(out, prefix + places[i].name, places[i].placement, values[i]);
  return out;
}

std::vector<ParamPlace> zero_places(const nn::Module& module, const NamedParams& named,
                                    const std::vector<ShardPiece>& pieces,
                                    const GlobalName& global_name) {
  std::vector<ParamPlace> places;
  for (const ShardPiece& sp : pieces) {
    const std::string& name = named[sp.param].first;
    places.push_back({global_name ? global_name(name) : name,
                      parameter_placement(module, name).slice(sp.param_offset, sp.numel)});
  }
  return places;
}

std::vector<PieceRequest> planned_requests(const std::vector<ParamPlace>& places, DType dtype,
                                           const io::CheckpointManifest& manifest) {
  return planned_requests(places, places, dtype, manifest);
}

std::vector<PieceRequest> planned_requests(const std::vector<ParamPlace>& parameters,
                                           const std::vector<ParamPlace>& state, DType dtype,
                                           const io::CheckpointManifest& manifest) {
  std::vector<PieceRequest> out;
  auto add = [&](const std::string& name, const Placement& placement, DType held) {
    const std::string from = across_dtypes(name, held, manifest);
    for (const Placement::Part& part : placement.parts)
      out.push_back({from, placement.global_shape, part.region, held});
  };
  for (const ParamPlace& p : parameters) add("model." + p.name, p.placement, dtype);
  for (const ParamPlace& p : state) {
    // The optimizer state kinds the checkpoint has for this parameter ("optim.<name>.<kind>",
    // kind without dots); the master by the layout's dtype, whatever the checkpoint's.
    const std::string prefix = "optim." + p.name + ".";
    for (auto it = manifest.tensors.lower_bound(prefix);
         it != manifest.tensors.end() && it->first.rfind(prefix, 0) == 0; ++it) {
      const std::string kind = it->first.substr(prefix.size());
      if (kind.find('.') == std::string::npos && kind != "master")
        add(it->first, p.placement, it->second.dtype);
    }
    if (dtype != DType::kF32) add(prefix + "master", p.placement, DType::kF32);
  }
  return out;
}

namespace {

// The update count of each parameter, for the optimizers that tell it without state_dict() (which
// copies the whole state only to give them); nullopt for the others.
std::optional<std::vector<int64_t>> update_counts_of(const optim::Optimizer& optimizer) {
  const optim::Optimizer* o = &optimizer;
  if (const auto* mixed = dynamic_cast<const optim::MixedPrecisionOptimizer*>(o))
    o = &mixed->inner();
  const auto* adamw = dynamic_cast<const optim::AdamW*>(o);
  if (!adamw) return std::nullopt;
  std::vector<int64_t> counts;
  for (size_t i = 0; i < adamw->params().size(); ++i) counts.push_back(adamw->step_count(i));
  return counts;
}

// add_optimizer_state, with the live state tensors when `copy` is false, leaving out the places
// `written` (when given) marks 0.
void add_optimizer_pieces(std::vector<StatePiece>& pieces, nlohmann::json& state,
                          const optim::Optimizer& optimizer, const std::vector<ParamPlace>& places,
                          bool copy, const std::vector<char>* written = nullptr) {
  LOOM_ASSERT(optimizer.params().size() == places.size(), "checkpoint: ", places.size(),
              " places for the ", optimizer.params().size(), " parameters of ", optimizer.name());
  // state_dict()'s entries (Note [Optimizer state dict]): copies, or the live tensors and the
  // counts.
  std::map<std::string, Tensor> entries;
  const std::optional<std::vector<int64_t>> counts =
      copy ? std::nullopt : update_counts_of(optimizer);
  if (counts && counts->size() == places.size()) {
    for (const auto& [key, t] : optimizer.state()) entries.emplace(key, t.detach().contiguous());
    for (size_t i = 0; i < counts->size(); ++i)
      entries.emplace(std::to_string(i) + ".step",
                      Tensor::from_vector(std::vector<int64_t>{(*counts)[i]}, {1}));
  } else {
    entries = optimizer.state_dict();
  }
  nlohmann::json& steps = state["optimizer_steps"];
  for (const auto& [key, t] : entries) {
    size_t i;
    std::string kind;
    LOOM_CHECK(optim::split_state_key(key, i, kind) && i < places.size(),
               "checkpoint: ", optimizer.name(), "'s state key '", key,
               "' is not '{parameter}.{kind}' (an optimizer loom cannot checkpoint yet)");
    if (written && !(*written)[i]) continue;
    const std::string& name = places[i].name;
    if (kind == "step") {
      const int64_t n = t.to_vector<int64_t>().at(0);
      LOOM_CHECK(!steps.contains(name) || steps[name] == n, "checkpoint: the pieces of ", name,
                 " have different update counts (", steps.contains(name) ? steps[name].dump() : "",
                 " and ", n, ")");
      steps[name] = n;
    } else {
      add_pieces(pieces, "optim." + name + "." + kind, places[i].placement, t);
    }
  }
}

}  // namespace

void add_optimizer_state(std::vector<StatePiece>& pieces, nlohmann::json& state,
                         const optim::Optimizer& optimizer, const std::vector<ParamPlace>& places) {
  add_optimizer_pieces(pieces, state, optimizer, places, /*copy=*/true);
}

// Note [Optimizer state loaded in place]
// The optimizer's state is loaded straight into its live tensors: no room the size of the state is
// allocated (on a machine where every fresh page faults, that was most of a load), and nothing is
// copied afterwards: load_state_dict finds each entry is its own target and copies nothing, but
// still installs the step counts (and a MixedPrecisionOptimizer's masters into the model). So that
// a state load_state_dict would refuse leaves the optimizer as it was, everything it could refuse
// is checked before the first byte is read: the keys, dtypes and shapes are the optimizer's own,
// and the constructor checks the manifest's step counts (update_counts). When they would be
// refused, the state is read into room of its own instead, so that the optimizer stays as it was
// while the ranks still load (and agree) together, and finish() raises the error.

OptimizerStateLoad::OptimizerStateLoad(optim::Optimizer& optimizer, std::vector<ParamPlace> places,
                                       const nlohmann::json& state)
    : optimizer_(optimizer), places_(std::move(places)) {
  LOOM_ASSERT(optimizer.params().size() == places_.size(), "checkpoint: ", places_.size(),
              " places for the ", optimizer.params().size(), " parameters of ", optimizer.name());
  bool refused = false;
  try {
    update_counts(places_, state);
  } catch (const Error&) {
    refused = true;
  }
  // A state dict's keys are state()'s plus the step counts (Note [Optimizer state dict]); the
  // state entries are the live tensors (Note [Optimizer state loaded in place]).
  for (const auto& [key, live] : optimizer.state())
    state_.emplace(key, refused ? Tensor::empty(live.shape(), live.dtype(), live.device()) : live);
  for (size_t i = 0; i < places_.size(); ++i) state_.emplace(std::to_string(i) + ".step", Tensor());
  for (const auto& [key, t] : state_) {
    size_t i;
    std::string kind;
    LOOM_CHECK(optim::split_state_key(key, i, kind) && i < places_.size(),
               "checkpoint: ", optimizer.name(), "'s state key '", key,
               "' is not '{parameter}.{kind}'");
    if (kind != "step")
      add_pieces(pieces_, "optim." + places_[i].name + "." + kind, places_[i].placement, t);
  }
}

void OptimizerStateLoad::finish(const nlohmann::json& state) {
  const std::vector<int64_t> counts = update_counts(places_, state);
  for (auto& [key, t] : state_) {
    size_t i;
    std::string kind;
    if (!optim::split_state_key(key, i, kind) || kind != "step") continue;
    t = Tensor::from_vector(std::vector<int64_t>{counts[i]}, {1});
  }
  optimizer_.load_state_dict(state_);
}

TrainingState::TrainingState(nn::Module& module, optim::Optimizer& optimizer,
                             GlobalName global_name, Saves saves)
    : module_(module),
      optimizer_(optimizer),
      zero_(dynamic_cast<ZeroOptimizer*>(&optimizer)),
      global_name_(std::move(global_name)),
      saves_(std::move(saves)) {}

std::vector<char> TrainingState::written() const {
  std::vector<std::string> owners;  // the module's own name of each place
  if (!zero_) {
    for (const auto& [name, p] : module_.named_parameters()) owners.push_back(name);
  } else {
    const NamedParams& named = zero_->named_parameters();
    for (const ShardPiece& sp : zero_->own_pieces()) owners.push_back(named[sp.param].first);
    for (const ZeroOptimizer::OwnPlace& own : zero_->own_places()) owners.push_back(own.name);
  }
  std::vector<char> out;
  for (const std::string& name : owners) out.push_back(char(!saves_ || saves_(name)));
  return out;
}

std::vector<ParamPlace> TrainingState::places() const {
  std::vector<ParamPlace> places = parameter_places(module_);
  if (global_name_)
    for (ParamPlace& p : places) p.name = global_name_(p.name);
  return places;
}

// ZeRO's piece i is elements [param_offset, +numel) of its parameter; what it steps of its own
// parameters (ZeroOptions::own_parameters: expert parallelism's experts; whole, or this rank's
// elements of them when sharded over their replicas) follows, in the order it steps them.
std::vector<ParamPlace> TrainingState::zero_places() const {
  std::vector<ParamPlace> places = checkpoint::zero_places(module_, zero_->named_parameters(),
                                                           zero_->own_pieces(), global_name_);
  for (const ZeroOptimizer::OwnPlace& own : zero_->own_places()) {
    Placement placement = parameter_placement(module_, own.name);
    if (!own.whole) placement = placement.slice(own.offset, own.numel);
    places.push_back({global_name_ ? global_name_(own.name) : own.name, placement});
  }
  return places;
}

std::vector<Tensor> TrainingState::zero_values() const {
  std::vector<Tensor> values;
  const size_t pieces = zero_->own_pieces().size();
  for (size_t i = 0; i < pieces; ++i) values.push_back(zero_->piece_values(i));
  for (const ZeroOptimizer::OwnPlace& own : zero_->own_places()) values.push_back(own.value);
  return values;
}

// Note [Saving the live state]
// save_pieces gives views of the live tensors, not copies: a synchronous checkpoint::save writes
// them before it returns, and AsyncCheckpointer::start copies them into snapshot buffers it keeps
// from one save to the next. A copy here would be a second one (and on fresh memory: page faults
// the size of the state, the larger part of a save on some machines).
std::vector<StatePiece> TrainingState::save_pieces(nlohmann::json& state) const {
  if (const optim::LossScaler* scaler = scaler_of(optimizer_, zero_)) {
    const optim::LossScalerState s = scaler->state();
    state["loss_scaler"] = {
        {"scale", s.scale}, {"good_in_a_row", s.good_in_a_row}, {"skipped", s.skipped}};
  }
  std::vector<StatePiece> pieces;
  const std::vector<char> written = this->written();
  // value_pieces of the written places alone.
  auto written_pieces = [&written](const std::vector<ParamPlace>& places,
                                   const std::vector<Tensor>& values, const std::string& prefix) {
    std::vector<ParamPlace> p;
    std::vector<Tensor> v;
    for (size_t i = 0; i < places.size(); ++i)
      if (written[i]) p.push_back(places[i]), v.push_back(values[i]);
    return value_pieces(p, v, prefix);
  };
  if (!zero_) {
    const std::vector<ParamPlace> places = this->places();
    std::vector<Tensor> values;
    for (const Tensor& p : module_.parameters()) values.push_back(p.detach().contiguous());
    pieces = written_pieces(places, values, "model.");
    add_optimizer_pieces(pieces, state, optimizer_, places, /*copy=*/false, &written);
    return pieces;
  }
  const std::vector<ParamPlace> places = zero_places();
  std::vector<Tensor> values = zero_values(), masters;
  pieces = written_pieces(places, values, "model.");
  if (const optim::MasterWeights* m = zero_->masters()) {
    for (const Tensor& t : m->masters()) masters.push_back(t.detach().contiguous());
    std::vector<StatePiece> mp = written_pieces(places, masters, "optim.");
    for (StatePiece& p : mp) p.name += ".master";
    pieces.insert(pieces.end(), mp.begin(), mp.end());
  }
  add_optimizer_pieces(pieces, state, zero_->inner(), places, /*copy=*/false, &written);
  return pieces;
}

LoadStats TrainingState::load(const std::string& path, const io::CheckpointManifest& manifest,
                              comm::Communicator& group) {
  std::vector<StatePiece> pieces;
  std::unique_ptr<OptimizerStateLoad> opt;
  bool whole_read = false;  // ZeRO's parameters read whole: nothing to gather
  const std::vector<ParamPlace> places = zero_ ? zero_places() : this->places();
  if (!zero_) {
    pieces = value_pieces(places, module_.parameters());
    opt = std::make_unique<OptimizerStateLoad>(optimizer_, places, manifest.state);
  } else {
    // Each rank reads its own pieces of the parameters (1/N of them); stages 1 and 2, which keep
    // every parameter whole, all-gather the rest afterwards (parameters_changed), or read them
    // whole from the page cache (Note [ZeRO's parameters read whole when cached]).
    std::vector<StatePiece> whole = whole_parameter_pieces(module_, *zero_, global_name_, manifest);
    whole_read = read_whole(path, manifest, whole, zero_->shard_group());
    pieces = whole_read ? std::move(whole) : value_pieces(places, zero_values());
    if (const optim::MasterWeights* m = zero_->masters()) {
      std::vector<StatePiece> mp = value_pieces(places, m->masters(), "optim.");
      for (StatePiece& p : mp) p.name += ".master";
      pieces.insert(pieces.end(), mp.begin(), mp.end());
    }
    opt = std::make_unique<OptimizerStateLoad>(zero_->inner(), places, manifest.state);
  }
  // The optimizer's state is read into its live tensors (Note [Optimizer state loaded in place]).
  pieces.insert(pieces.end(), opt->pieces().begin(), opt->pieces().end());
  for (StatePiece& p : pieces) p.name = across_dtypes(p.name, p.data.dtype(), manifest);
  const LoadStats stats = checkpoint::load(path, manifest, pieces, group);
  opt->finish(manifest.state);
  optim::LossScaler* scaler = scaler_of(optimizer_, zero_);
  if (scaler && manifest.state.contains("loss_scaler")) {
    const nlohmann::json& s = manifest.state["loss_scaler"];
    LOOM_CHECK(s.is_object() && s.value("scale", nlohmann::json()).is_number() &&
                   s.value("good_in_a_row", nlohmann::json()).is_number_integer() &&
                   s.value("skipped", nlohmann::json()).is_number_integer(),
               "checkpoint ", path,
               ": state.loss_scaler is not {scale, good_in_a_row, skipped}: ", s.dump());
    scaler->restore(
        {s["scale"].get<double>(), s["good_in_a_row"].get<int64_t>(), s["skipped"].get<int64_t>()});
  }
  if (zero_ && !whole_read) zero_->parameters_changed();
  return stats;
}

}  // namespace loom::parallel::checkpoint
