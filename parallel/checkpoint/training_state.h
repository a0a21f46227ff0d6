// A rank's training state as checkpoint pieces (parallel/checkpoint/checkpoint.h): the model's
// parameters, the optimizer's state and ZeRO's shards, each named by the single-process tensor it
// belongs to and placed in it, so a checkpoint saved by one layout loads into any other.
//
//   model.<parameter>                 the parameter (its dtype)
//   optim.<parameter>.<kind>          optimizer state: exp_avg, exp_avg_sq, momentum_buffer,
//                                     and master (the f32 master of a bf16 / f16 parameter)
//   state["optimizer_steps"][<parameter>]   the parameter's update count (Note [Optimizer
//                                     state dict]), in the manifest
//
// Saving gives views of the live state (Note [Saving the live state]); loading is two steps,
// because an optimizer's state is replaced as a whole: pieces() gives tensors to fill, then
// finish() installs them.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/nn/module.h"
#include "optimizer/optimizer.h"
#include "parallel/checkpoint/checkpoint.h"
#include "parallel/checkpoint/region.h"
#include "parallel/zero.h"

namespace loom::parallel::checkpoint {

// Where each of an optimizer's parameters sits: the global name of the parameter it is (or is a
// piece of) and its placement there.
struct ParamPlace {
  std::string name;  // "wte.weight"
  Placement placement;
};

// A module's parameter `name` (relative to it) in its single-process parameter: whole, or the
// tensor-parallel shard its ShardSpec says.
Placement parameter_placement(const nn::Module& module, const std::string& name);
// The places of module.parameters(), in order (an optimizer over them, DDP's).
std::vector<ParamPlace> parameter_places(const nn::Module& module);
// "model.<name>" for each parameter of `places`, `values[i]` (contiguous) holding parameter i.
// The pieces view the tensors: loading writes into them.
std::vector<StatePiece> value_pieces(const std::vector<ParamPlace>& places,
                                     const std::vector<Tensor>& values,
                                     const std::string& prefix = "model.");

// The single-process name of a parameter of a module, by its name relative to the module.
using GlobalName = std::function<std::string(const std::string&)>;

// Where ZeRO's pieces (ZeroOptimizer::own_pieces or planned_pieces) of `module`'s parameters
// `named` sit: piece i is elements [param_offset, +numel) of its parameter's placement.
std::vector<ParamPlace> zero_places(const nn::Module& module, const NamedParams& named,
                                    const std::vector<ShardPiece>& pieces,
                                    const GlobalName& global_name = {});

// What TrainingState::load asks `manifest` for when its parameters sit at `places` and are held
// in `dtype`, worked out without the model or the optimizer (loom-ckpt check): each parameter,
// the optimizer state the checkpoint has for it (the resumed run's optimizer must be the saving
// one's), and the f32 masters of a bf16 / f16 layout, with Note [Masters across dtypes].
std::vector<PieceRequest> planned_requests(const std::vector<ParamPlace>& places, DType dtype,
                                           const io::CheckpointManifest& manifest);
// The same with the parameters at `parameters` and the optimizer state at `state` (ZeRO's
// parameters read whole: Note [ZeRO's parameters read whole when cached]).
std::vector<PieceRequest> planned_requests(const std::vector<ParamPlace>& parameters,
                                           const std::vector<ParamPlace>& state, DType dtype,
                                           const io::CheckpointManifest& manifest);

// Saving an optimizer over parameters at `places`: its state tensors (copies) and step counts.
void add_optimizer_state(std::vector<StatePiece>& pieces, nlohmann::json& state,
                         const optim::Optimizer& optimizer, const std::vector<ParamPlace>& places);

// Loading an optimizer's state from a checkpoint whose manifest state is `state`: pieces() are the
// optimizer's live state tensors (Note [Optimizer state loaded in place]).
class OptimizerStateLoad {
 public:
  OptimizerStateLoad(optim::Optimizer& optimizer, std::vector<ParamPlace> places,
                     const nlohmann::json& state);
  const std::vector<StatePiece>& pieces() const { return pieces_; }
  // After checkpoint::load filled pieces(): the step counts from the manifest's state, then the
  // whole state into the optimizer (which checks it).
  void finish(const nlohmann::json& state);

 private:
  optim::Optimizer& optimizer_;
  std::vector<ParamPlace> places_;
  std::map<std::string, Tensor> state_;  // a state_dict() being filled
  std::vector<StatePiece> pieces_;
};

// A whole training state: the model's parameters and the optimizer's, for the plain optimizer
// (one process, DDP, tensor parallelism; MixedPrecisionOptimizer included) and for ZeRO
// (stages 1-3: this rank's shards of the parameters and optimizer state).
class TrainingState {
 public:
  using GlobalName = checkpoint::GlobalName;
  // `optimizer` steps `module`'s parameters: directly, through MixedPrecisionOptimizer, or as a
  // ZeroOptimizer over `module`. `global_name` (default: the same name) maps the module's names
  // to the single-process ones (a pipeline's StageSet prefixes each stage with "chunk{k}.").
  // `saves` (default: every one) names the module's parameters whose values and optimizer state
  // a save writes; the others are copies of one that is written, holding the same values (a
  // pipeline's tied wte on its last stage, Chimera's second pipeline), which under ZeRO are
  // sharded in other bucket layouts and would overlap the written pieces. Loads read them all.
  using Saves = std::function<bool(const std::string& name)>;
  TrainingState(nn::Module& module, optim::Optimizer& optimizer, GlobalName global_name = {},
                Saves saves = {});

  // The pieces and per-rank state to save: views of the live tensors, valid until training
  // changes them (checkpoint::save and AsyncCheckpointer::start copy or write them first).
  std::vector<StatePiece> save_pieces(nlohmann::json& state) const;
  // Loads a checkpoint into the model and the optimizer. Collective over `group`.
  LoadStats load(const std::string& path, const io::CheckpointManifest& manifest,
                 comm::Communicator& group);

 private:
  std::vector<ParamPlace> places() const;       // of module_.parameters()
  std::vector<ParamPlace> zero_places() const;  // of the ZeRO pieces and own parameters
  std::vector<Tensor> zero_values() const;      // the values zero_places() name
  // Per place (places() or zero_places()), whether a save writes it (See `saves`).
  std::vector<char> written() const;

  nn::Module& module_;
  optim::Optimizer& optimizer_;
  ZeroOptimizer* zero_;
  GlobalName global_name_;
  Saves saves_;
};

}  // namespace loom::parallel::checkpoint
