#!/bin/bash
# Activation checkpointing (--checkpoint-activations) under tensor and pipeline parallelism: each
# block keeps only its input and runs again in backward, its tp collectives, expert all-to-alls
# and dropout masks included (core/nn/block_checkpointing.h), so a checkpointed run is the same
# run:
# - every step's loss and gradient norm (and MoE per-expert loads), and the final weights
#   (--save), equal the same layout's without checkpointing bit for bit, and the losses are the
#   single-process run's within 1e-5 relative: tp 2 with dropout, tp 2 with sequence
#   parallelism, dp 2 x tp 2 at ZeRO-3, pp 2 with GPipe, 1F1B, interleaved (2 chunks per rank)
#   and Chimera, dp 2 x pp 2 at ZeRO-2 and 3, dp 2 x tp 2 x pp 2 with sequence parallelism; MoE:
#   tp 2 with sequence parallelism and dropless top-2 experts, and interleaved dp 2 x ep 2 x pp 2
#   with capacity and dropout, where a micro-batch's recomputation comes after later
#   micro-batches went through the layer and must replay its own place in the batch
#   (MoeLayer::replay_part).
# - Memory, on a model whose activations outweigh its weights (text data: no evaluation in the
#   steps): the peak in the steps is lower with checkpointing, under tp 2 and under 1F1B.
# usage: gpt_recompute.sh LOOM_GPT MPIEXEC [mpirun flags...]
set -euo pipefail
gpt=$1; mpiexec=$2; shift 2
mpi_flags=("$@")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
printf 'the quick brown fox jumps over the lazy dog. %.0s' {1..200} > "$dir/text.txt"
# Text data so the sequence (16) divides over tp under sequence parallelism.
deep=(--data "$dir/text.txt" --seq 16 --steps 6 --batch 16 --layers 4 --dim 32 --heads 2
      --eval-every 1000 --threads 1 --lr 1e-3 --warmup-steps 0 --dropout 0.1)
moe=(--moe-experts 4 --moe-top-k 2 --moe-every 2 --moe-hidden 48)
capacity=(--moe-experts 4 --moe-capacity-factor 1.0 --moe-every 2)

run() {  # name np flags...: loom-gpt with the deep model, its metrics and final weights
  local name=$1 np=$2
  shift 2
  "$mpiexec" -np "$np" "${mpi_flags[@]}" "$gpt" "${deep[@]}" "$@" \
    --metrics-file "$dir/$name.jsonl" --save "$dir/$name.safetensors" > "$dir/$name.log" 2>&1 ||
    { cat "$dir/$name.log"; exit 1; }
}
same_run() {  # name a b: the same losses, gradient norms and loads at every step, the same weights
  /usr/bin/python3 - "$1" "$dir/$2.jsonl" "$dir/$3.jsonl" <<'PY'
import json, sys
name, a, b = sys.argv[1:]
keys = ("step", "loss", "grad_norm", "moe_load")
read = lambda p: [{k: j[k] for k in keys if k in j} for j in map(json.loads, open(p)) if "loss" in j]
want, got = read(a), read(b)
assert len(want) == 6 and got == want, f"{name}: {got} vs {want}"
PY
  cmp -s "$dir/$2.safetensors" "$dir/$3.safetensors" ||
    { echo "$1: the final weights differ"; exit 1; }
  echo "$1: the same run bit for bit (losses, gradient norms, weights)"
}
compare() {  # name file reference: every step's loss within 1e-5 relative
  /usr/bin/python3 "$here/checkpoint_tensors.py" losses "$1" "$dir/$3.jsonl" "$dir/$2.jsonl" 1 1e-5
}
# layout REFERENCE "NP FLAGS...": FLAGS on NP ranks, with and without checkpointing.
layout() {
  local reference=$1 np rest name
  local -a flags
  read -r np rest <<< "$2"
  read -r -a flags <<< "$rest"
  name="$(printf '%s' "$rest" | tr -d '-' | tr ' ' '_')"
  run "$name" "$np" "${flags[@]}"
  run "${name}_recompute" "$np" "${flags[@]}" --checkpoint-activations
  same_run "$name --checkpoint-activations" "$name" "${name}_recompute"
  compare "$name --checkpoint-activations" "${name}_recompute" "$reference"
}

run single 1
run moe 1 "${moe[@]}"
run capacity 1 "${capacity[@]}"
for l in "2 --tp 2" \
         "2 --tp 2 --sequence-parallel" \
         "4 --dp 2 --tp 2 --zero 3" \
         "2 --pp 2 --schedule gpipe --microbatches 4" \
         "2 --pp 2 --schedule 1f1b --microbatches 4" \
         "2 --pp 2 --schedule interleaved --virtual-stages 2 --microbatches 4" \
         "2 --pp 2 --schedule chimera --microbatches 4" \
         "4 --dp 2 --pp 2 --zero 2 --microbatches 2 --bucket-mb 0.01" \
         "4 --dp 2 --pp 2 --zero 3 --microbatches 2" \
         "8 --dp 2 --tp 2 --pp 2 --sequence-parallel --microbatches 2"; do
  layout single "$l"
done
layout moe "2 --tp 2 --sequence-parallel ${moe[*]}"
layout capacity \
  "4 --dp 2 --ep 2 --pp 2 --schedule interleaved --virtual-stages 2 --microbatches 4 ${capacity[*]}"

# Memory: 8 blocks of dim 64 over sequences of 128 (activations ~ 40 x B T C per block).
wide=(--data "$dir/text.txt" --seq 128 --steps 2 --batch 8 --layers 8 --dim 64 --heads 4
      --threads 1 --warmup-steps 0)
for l in "tp 2 --tp 2" "pp 2 --pp 2 --schedule 1f1b --microbatches 4"; do
  read -r name np rest <<< "$l"
  read -r -a flags <<< "$rest"
  for r in "" --checkpoint-activations; do
    "$mpiexec" -np "$np" "${mpi_flags[@]}" "$gpt" "${wide[@]}" "${flags[@]}" $r \
      > "$dir/wide_$name$r.log" 2>&1 || { cat "$dir/wide_$name$r.log"; exit 1; }
  done
  /usr/bin/python3 - "$name" "$dir/wide_$name.log" "$dir/wide_$name--checkpoint-activations.log" <<'PY'
import re, sys
peak = lambda p: float(re.search(r"peak memory on rank 0 in the steps: ([\d.]+) MB",
                                 open(p).read()).group(1))
name, plain, recomputed = sys.argv[1], peak(sys.argv[2]), peak(sys.argv[3])
assert recomputed < plain, \
    f"{name}: the peak in the steps with checkpointing {recomputed} MB is not below {plain} MB"
print(f"{name}: peak in the steps {plain} MB -> {recomputed} MB with checkpointing")
PY
done
echo "gpt_recompute: all checks passed"
