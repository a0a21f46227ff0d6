// loom-gpt's flags and the run they describe. Flag meanings are in --help (gpt_options.cpp);
// cross-flag consistency (heads dividing dim, batch and steps positive, ...) is checked here so
// a bad combination fails before any work, with the flag named.
#pragma once

#include <cstdint>
#include <string>

#include "common/checkpointing.h"
#include "common/flags.h"
#include "core/nn/moe.h"

namespace loom::gpt {

struct GptOptions {
  nn::MoeOptions moe() const {
    return {moe_experts,           moe_top_k,    moe_every,
            moe_capacity_factor,   moe_aux_loss, moe_z_loss,
            moe_receive_budget_mb, moe_hidden};
  }
  // model (ignored where --init-from supplies it; a conflicting explicit flag is an error)
  int64_t layers, heads, dim, seq, vocab;
  double dropout;
  bool checkpoint_activations;
  // mixture of experts (core/nn/moe.h): moe_experts 0 is a dense model
  int64_t moe_experts, moe_top_k, moe_every, ep;  // ep: expert-parallel ranks (divides dp)
  double moe_capacity_factor, moe_aux_loss, moe_z_loss;
  double moe_receive_budget_mb;  // dropless: See Note [Dropless receive budget]
  int64_t moe_hidden;            // each expert's hidden width (0: 4 x dim)
  int64_t expert_tp;             // 1: experts whole on every tp rank; --tp: split over tp
  // data
  std::string data;  // empty: the built-in addition task
  int64_t digits;
  // optimisation
  int64_t batch, steps;
  double lr, min_lr_ratio, weight_decay, momentum, grad_clip;
  std::string optimizer, lr_schedule;
  std::string dtype;   // f32, bf16 or f16
  double loss_scale;   // f16: the dynamic loss scale's start
  std::string device;  // cpu, cuda or cuda:N (Device::parse)
  int64_t warmup_steps;
  uint64_t seed;
  // parallelism (under mpirun): dp x tp ranks
  int64_t dp, tp, zero, grad_accum;
  std::string zero_shard_group;  // all, node, or a count of consecutive dp ranks
  bool sequence_parallel;
  // pipeline parallelism
  int64_t pp, microbatches, virtual_stages;
  std::string schedule, schedule_file;
  std::string plan, plan_profile;  // --plan auto: See gpt_plan.h
  bool validate_schedule, print_schedule;
  std::string trace;  // Chrome trace of the pipeline's steps
  double bucket_mb;
  bool no_overlap;
  // evaluation
  bool eval_only;
  int64_t eval_batches, eval_every, eval_examples;
  double target;
  // text generation after training (See gpt_generate.h)
  std::string generate;
  int64_t max_new_tokens, top_k;
  double temperature;
  // files and output
  std::string init_from, save, metrics_file;
  // checkpoints (See gpt_checkpoint.h)
  cli::CheckpointOptions checkpoints;
  int64_t threads;

  bool was_set(const std::string& flag) const { return flags->was_set(flag); }
  const cli::Flags* flags = nullptr;
};

// Declares every flag on `flags`.
void declare_gpt_flags(cli::Flags& flags);
// Reads and checks them. Throws loom::Error naming the flag for an inconsistent combination.
GptOptions read_gpt_options(const cli::Flags& flags);

}  // namespace loom::gpt
