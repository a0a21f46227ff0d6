#!/bin/bash
# Pipelines in bf16 and f16 (--pp with --dtype bf16 / f16: stages, activations and gradients in
# that dtype, f32 masters stepped by the optimizer) against one process in the same dtype, the
# equivalence principle in the training dtype.
# - bf16: every schedule on --pp 2, dp 2 x pp 2 under DDP and ZeRO-1/2/3, dp 2 x tp 2 x pp 2
#   with ZeRO-1, and a mixture-of-experts model on dp 2 x ep 2 x pp 2 (DDP and ZeRO-1) print the
#   single-process losses within 2e-4 relative: each micro-batch's gradients are rounded to bf16
#   before they are summed over micro-batches, stages' replicas and dp ranks, where one process
#   rounds the whole batch's once (measured worst 1.0e-4 with ZeRO-2, 8.6e-5 elsewhere; the runs
#   are deterministic). The same model in f32 ends 3.5e-4 from bf16, so a pipeline that silently
#   trained in f32 would fail too.
# - f16 (every micro-batch's loss multiplied by the dynamic loss scale): 1F1B and Chimera on
#   --pp 2, dp 2 x pp 2 under DDP and ZeRO-1/2/3, and the MoE model on dp 2 x ep 2 x pp 2.
#   Started at 2^12 no run skips a step; started at 2^20 every run skips exactly the single
#   process's 3 steps (the scale halves to 2^17) and trains the other 3. Both within 1e-4 of one
#   process in f16 (f16 rounds to 2^-11 where bf16 rounds to 2^-8; measured worst 1.0e-5): a
#   missed or extra skip moves the losses 5-8%, and an f32 pipeline would skip none.
# usage: gpt_pipeline_mixed_precision.sh LOOM_GPT MPIEXEC [mpirun flags...]
set -euo pipefail
gpt=$1; mpiexec=$2; shift 2
mpi_flags=("$@")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
deep=(--steps 6 --batch 16 --layers 4 --dim 32 --heads 2 --eval-every 1000 --threads 1 --lr 1e-3
      --warmup-steps 0)
compare() {  # name file reference tolerance: every step's loss within it, relative
  /usr/bin/python3 "$here/checkpoint_tensors.py" losses "$1" "$3" "$2" 1 "$4"
}
skips() {  # the "skipped N step(s) ..." line of a log, or "none"
  grep -o 'skipped [0-9]* step.*' "$1" || echo none
}
# layout REFERENCE TOLERANCE "NP FLAGS...": loom-gpt with the deep model and FLAGS on NP ranks
# gives REFERENCE's losses (its log REFERENCE.log), says it trains with f32 masters, and skips
# the steps the reference skipped.
layout() {
  local reference=$1 tolerance=$2 np rest name
  local -a flags
  read -r np rest <<< "$3"
  read -r -a flags <<< "$rest"
  name="$(printf '%s' "$rest" | tr -d '-' | tr ' ' '_')"
  "$mpiexec" -np "$np" "${mpi_flags[@]}" "$gpt" "${deep[@]}" "${flags[@]}" \
    --metrics-file "$dir/$name.jsonl" > "$dir/$name.log" 2>&1 || { cat "$dir/$name.log"; exit 1; }
  grep -q "with f32 masters" "$dir/$name.log" || { cat "$dir/$name.log"; exit 1; }
  [[ "$(skips "$dir/$name.log")" == "$(skips "$reference.log")" ]] ||
    { echo "FAIL: $name: '$(skips "$dir/$name.log")', one process '$(skips "$reference.log")'"; exit 1; }
  compare "$name" "$dir/$name.jsonl" "$reference.jsonl" "$tolerance"
}
single() {  # NAME FLAGS...: the single-process reference
  local name=$1; shift
  "$gpt" "${deep[@]}" "$@" --metrics-file "$dir/$name.jsonl" > "$dir/$name.log"
}

moe=(--moe-experts 4 --moe-top-k 2 --moe-every 2 --moe-hidden 48)
single bf16 --dtype bf16
for l in "2 --pp 2 --schedule gpipe --microbatches 4" "2 --pp 2 --schedule 1f1b --microbatches 4" \
         "2 --pp 2 --schedule interleaved --virtual-stages 2 --microbatches 4" \
         "2 --pp 2 --schedule chimera --microbatches 4" "4 --dp 2 --pp 2 --microbatches 2" \
         "4 --dp 2 --pp 2 --zero 1 --microbatches 2" "4 --dp 2 --pp 2 --zero 2 --microbatches 2" \
         "4 --dp 2 --pp 2 --zero 3 --microbatches 2" "8 --dp 2 --tp 2 --pp 2 --zero 1 --microbatches 2"; do
  layout "$dir/bf16" 2e-4 "$l --dtype bf16"
done
single moe_bf16 --dtype bf16 "${moe[@]}"
for l in "4 --dp 2 --ep 2 --pp 2 --microbatches 2" "4 --dp 2 --ep 2 --pp 2 --zero 1 --microbatches 2"
do
  layout "$dir/moe_bf16" 2e-4 "$l --dtype bf16 ${moe[*]}"
done

for start in 4096 1048576; do
  f16=(--dtype f16 --loss-scale "$start")
  single "f16_$start" "${f16[@]}"
  single "moe_f16_$start" "${f16[@]}" "${moe[@]}"
  expected=none
  [ "$start" = 1048576 ] && expected="skipped 3 step(s) with an inf or nan gradient; loss scaling dynamic, scale 131072"
  for name in "f16_$start" "moe_f16_$start"; do
    [[ "$(skips "$dir/$name.log")" == "$expected" ]] ||
      { echo "FAIL: one process from $start: '$(skips "$dir/$name.log")', expected '$expected'"; exit 1; }
  done
  for l in "2 --pp 2 --schedule 1f1b --microbatches 4" "2 --pp 2 --schedule chimera --microbatches 4" \
           "4 --dp 2 --pp 2 --microbatches 2" "4 --dp 2 --pp 2 --zero 1 --microbatches 2" \
           "4 --dp 2 --pp 2 --zero 2 --microbatches 2" "4 --dp 2 --pp 2 --zero 3 --microbatches 2"; do
    layout "$dir/f16_$start" 1e-4 "$l ${f16[*]}"
  done
  layout "$dir/moe_f16_$start" 1e-4 "4 --dp 2 --ep 2 --pp 2 --microbatches 2 ${f16[*]} ${moe[*]}"
done
echo "gpt_pipeline_mixed_precision: all checks passed"
