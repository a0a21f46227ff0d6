// A checkpoint's GPT as one process sees it, whatever layout saved it: the config loom-gpt records
// in the manifest's state["model"], and every parameter loaded whole (one Region::whole piece per
// parameter; the load copies the intersection of each stored piece, Note [Checkpoint regions]),
// written as a Hugging Face GPT-2 directory that transformers' from_pretrained opens.
//
// Which tensors: the f32 masters ("optim.<param>.master") when the checkpoint holds one for every
// parameter (bf16 / f16 training), as DeepSpeed's zero_to_fp32 does; else "model.<param>".
#pragma once

#include <string>

#include "core/io/checkpoint_manifest.h"
#include "core/io/gpt_params.h"
#include "core/nn/gpt_config.h"

namespace loom::ckpt {

// The GPT config of state["model"] (core/nn/gpt_config.h's fields). Throws naming `path` when
// it is missing, incomplete or inconsistent.
GptConfig checkpoint_gpt_config(const io::CheckpointManifest& manifest, const std::string& path);

struct ConsolidatedGpt {
  io::GptWeights weights;            // CPU f32, whole
  std::string source;                // which tensors: "model.*" or "optim.*.master"
  DType stored_dtype = DType::kF32;  // theirs in the checkpoint
};

// Loads every parameter of the checkpoint's GPT, whole, in one process. Throws naming the
// checkpoint and the tensor when one is missing, misshapen, or not a GPT parameter.
ConsolidatedGpt consolidate_gpt(const std::string& path, const io::CheckpointManifest& manifest);

// Writes `out_dir`/config.json (GPT-2's keys) and `out_dir`/model.safetensors (Hugging Face names,
// core/io/gpt2_weights.h), creating the directory when missing.
void write_hf_gpt2(const std::string& out_dir, const io::GptWeights& weights);

}  // namespace loom::ckpt
