#include "gpt/gpt_checkpoint.h"

#include "core/error.h"
#include "core/io/gpt_params.h"
#include "gpt/gpt_model.h"
#include "gpt/gpt_parallel.h"
#include "gpt/gpt_pipeline.h"
#include "parallel/checkpoint/training_state.h"
#include "parallel/replicas.h"

namespace loom::gpt {

namespace {

const nlohmann::json& section(const ResumePoint& p, const char* key) {
  const nlohmann::json& s = p.manifest.state;
  LOOM_CHECK(s.contains(key) && s[key].is_object(), "loom-gpt: checkpoint ", p.path, " has no \"",
             key, "\" in its state: it was not saved by loom-gpt");
  return s[key];
}

int64_t integer(const ResumePoint& p, const nlohmann::json& section, const char* key) {
  LOOM_CHECK(section.contains(key) && section[key].is_number_integer(), "loom-gpt: checkpoint ",
             p.path, ": state field \"", key, "\" is missing or not an integer");
  return section[key].get<int64_t>();
}

}  // namespace

namespace {

// The model's mixture-of-experts shape, as the checkpoint records it (absent: dense).
nlohmann::json moe_json(const GptOptions& o) {
  nlohmann::json j = {{"experts", o.moe_experts},   {"top_k", o.moe_top_k},
                      {"every", o.moe_every},       {"capacity_factor", o.moe_capacity_factor},
                      {"aux_loss", o.moe_aux_loss}, {"z_loss", o.moe_z_loss}};
  if (o.moe_hidden > 0) j["hidden"] = o.moe_hidden;  // absent: 4 x dim (older checkpoints)
  return j;
}

}  // namespace

GptConfig checkpoint_config(const ResumePoint& p) {
  return io::gpt_config_from_json(section(p, "model"), "loom-gpt: checkpoint " + p.path);
}

nlohmann::json run_state(const GptConfig& c, const GptOptions& o, int world_size,
                         int64_t batch_index, const std::string& lr_schedule) {
  nlohmann::json s;
  s["model"] = {{"layers", c.layers},
                {"heads", c.heads},
                {"channels", c.channels},
                {"vocab", c.vocab},
                {"padded_vocab", c.padded_vocab},
                {"max_seq_len", c.max_seq_len}};
  s["layout"] = {{"world_size", world_size},
                 {"dp", o.dp},
                 {"tp", o.tp},
                 {"pp", o.pp},
                 {"zero", o.zero},
                 {"dtype", o.dtype},
                 {"sequence_parallel", o.sequence_parallel},
                 {"grad_accum", o.grad_accum}};
  // Hybrid sharding only (plain layouts keep the keys train_gpt.py writes too).
  if (o.zero > 0 && o.zero_shard_group != "all")
    s["layout"]["zero_shard_group"] = o.zero_shard_group;
  if (o.ep > 1) s["layout"]["ep"] = o.ep;
  if (o.moe_experts > 0) s["model"]["moe"] = moe_json(o);
  s["data"] = {{"batch_index", batch_index},
               {"source", o.data.empty() ? "addition task" : o.data},
               {"batch", o.batch},
               {"seq", o.seq},
               {"digits", o.digits}};
  s["training"] = {{"seed", o.seed},
                   {"optimizer", o.optimizer},
                   {"lr_schedule", lr_schedule},
                   {"steps", o.steps}};
  return s;
}

std::vector<parallel::checkpoint::PieceRequest> planned_load(const GptConfig& config,
                                                             const GptOptions& o, int world_rank,
                                                             const io::CheckpointManifest& manifest,
                                                             bool whole_parameters) {
  namespace ckpt = parallel::checkpoint;
  const parallel::DeviceMesh mesh =
      parallel::DeviceMesh::plan(world_rank, int(o.pp), int(o.dp), int(o.tp));
  // The ZeRO group this rank shards over: all dp ranks, or (hybrid sharding) N consecutive ones.
  int shard_rank = mesh.coords().dp, shard_size = int(o.dp);
  if (o.zero > 0 && o.zero_shard_group != "all") {
    LOOM_CHECK(o.zero_shard_group != "node",
               "--zero-shard-group node depends on the machines' ranks per node; give that "
               "number (e.g. --zero-shard-group 8) to plan the layout");
    shard_size = std::stoi(o.zero_shard_group);
    LOOM_CHECK(shard_size >= 2 && o.dp % shard_size == 0 && o.dp / shard_size >= 2,
               "--zero-shard-group ", shard_size, " over --dp ", o.dp,
               ": hybrid sharding needs two or more shard groups of two or more ranks");
    shard_rank %= shard_size;
  }
  const DType dtype = parse_dtype(o.dtype);
  std::vector<ckpt::ParamPlace> places;
  // The parameters' places when ZeRO's pieces view them whole and they are read so; else empty.
  std::vector<ckpt::ParamPlace> whole;
  whole_parameters = whole_parameters && (o.zero == 1 || o.zero == 2);
  if (o.pp > 1) {  // as PipelineStep builds them
    check_pipeline_options(o);
    auto tp = o.tp > 1 || o.sequence_parallel ? mesh.tp_ptr() : nullptr;
    parallel::pipeline::StageSet set;
    for (auto& stage : make_stages(config, o, schedule_from(o), mesh.coords().pp, tp)) {
      if (dtype != DType::kF32) stage->to(dtype);
      set.add(std::move(stage));
    }
    const auto global = parallel::pipeline::StageSet::single_process_name;
    if (o.zero == 0) {
      places = ckpt::parameter_places(set);
      for (ckpt::ParamPlace& p : places) p.name = global(p.name);
    } else {
      places = ckpt::zero_places(set, set.named_parameters(),
                                 parallel::ZeroOptimizer::planned_pieces(
                                     set, pipeline_zero_options(o), shard_rank, shard_size),
                                 global);
      if (whole_parameters &&
          parallel::parameters_by_owner(set, pipeline_zero_options(o).own_parameters, true)
              .empty()) {
        whole = ckpt::parameter_places(set);
        for (ckpt::ParamPlace& p : whole) p.name = global(p.name);
      }
    }
  } else {  // as main and DataParallelStep build them
    GptModel model(config, o, mesh);
    nn::Module& module = model.module();
    if (dtype != DType::kF32) module.to(dtype);
    if (o.zero == 0) {
      places = ckpt::parameter_places(module);
    } else {
      const parallel::ZeroOptions z = zero_options(o, model);
      places = ckpt::zero_places(
          module, parallel::parameters_by_owner(module, z.own_parameters, false),
          parallel::ZeroOptimizer::planned_pieces(module, z, shard_rank, shard_size));
      if (whole_parameters && parallel::parameters_by_owner(module, z.own_parameters, true).empty())
        whole = ckpt::parameter_places(module);
      if (z.own_replicas)  // the experts: what this rank steps of them, as the optimizer does
        for (const auto& own : parallel::ZeroOptimizer::planned_own_places(
                 module, z, z.own_replicas->rank(), z.own_replicas->size())) {
          ckpt::Placement placement = ckpt::parameter_placement(module, own.name);
          places.push_back(
              {own.name, own.whole ? placement : placement.slice(own.offset, own.numel)});
        }
    }
  }
  return whole.empty() ? ckpt::planned_requests(places, dtype, manifest)
                       : ckpt::planned_requests(whole, places, dtype, manifest);
}

int64_t resume_batch_index(const ResumePoint& p, const GptOptions& o) {
  const nlohmann::json& d = section(p, "data");
  const std::string source = o.data.empty() ? "addition task" : o.data;
  LOOM_CHECK(d.contains("source") && d["source"] == source, "loom-gpt: the checkpoint ", p.path,
             " was trained on ", d.contains("source") ? d["source"].dump() : "unknown data",
             " but --data gives '", source, "'; a resumed run reads the same data");
  auto agree = [&](const char* flag, int64_t given, int64_t saved) {
    LOOM_CHECK(given == saved, "loom-gpt: --", flag, " ", given, " differs from the checkpoint ",
               p.path, "'s ", saved,
               ": a resumed run needs the same global batch and sequence length to continue at "
               "the same sample (the layout may change)");
  };
  agree("batch", o.batch, integer(p, d, "batch"));
  agree("seq", o.seq, integer(p, d, "seq"));
  if (o.data.empty()) agree("digits", o.digits, integer(p, d, "digits"));
  const nlohmann::json& t = section(p, "training");
  LOOM_CHECK(t.contains("seed") && t["seed"].get<uint64_t>() == o.seed, "loom-gpt: --seed ", o.seed,
             " differs from the checkpoint ", p.path, "'s ", t["seed"].dump(),
             " (the seed keys the data's examples and the dropout masks)");
  LOOM_CHECK(t.contains("optimizer") && t["optimizer"] == o.optimizer, "loom-gpt: --optimizer ",
             o.optimizer, " differs from the checkpoint ", p.path, "'s ", t["optimizer"].dump());
  // The same mixture of experts (or none): the flags must say what the checkpoint holds.
  const nlohmann::json& m = section(p, "model");
  const nlohmann::json saved_moe = m.contains("moe") ? m["moe"] : nlohmann::json();
  const nlohmann::json given_moe = o.moe_experts > 0 ? moe_json(o) : nlohmann::json();
  LOOM_CHECK(saved_moe == given_moe, "loom-gpt: the checkpoint ", p.path, "'s mixture of experts ",
             saved_moe.is_null() ? std::string("(none: dense blocks)") : saved_moe.dump(),
             " differs from the --moe-* flags' ",
             given_moe.is_null() ? std::string("(none: dense blocks)") : given_moe.dump(),
             "; resume with the flags it was trained with (--ep may change)");
  const int64_t index = integer(p, d, "batch_index");
  LOOM_CHECK(index >= 0, "loom-gpt: checkpoint ", p.path, ": negative batch index ", index);
  return index;
}

}  // namespace loom::gpt
