#!/bin/bash
# ZeRO-2 and ZeRO-3 in pipelines (--pp with --zero 2 / 3: each chunk's gradients reduce-scattered
# over dp as its backwards produce them; stage 3 also gathers each chunk's blocks and the rest of
# it around every micro-batch's forward and backward, See Note [ZeRO-2 in a pipeline] in
# parallel/zero.cpp) against one process, the equivalence principle:
# - for each stage: dp 2 x pp 2 with every schedule (GPipe, 1F1B, interleaved with 2 chunks per
#   rank, Chimera, whose two copies of each stage sum their shards), ZeRO-2 with buckets of
#   10 KB so each chunk has several; dp 2 x tp 2 x pp 2; dp 4 x pp 2 sharded over groups of 2 dp
#   ranks; mixture-of-experts models on dp 2 x ep 2 x pp 2 and dp 4 x ep 4 x pp 2 (dropless top-2)
#   and interleaved dp 2 x ep 2 x pp 2 (top-1 with capacity and dropout): the single-process losses within
#   1e-5 relative (each micro-batch's gradient is averaged over dp before the micro-batches are
#   summed, where one process sums the batch once: rounding only). Each run evaluates the
#   gathered model at its end (ZeRO-3 gathers its shards for it).
# - Memory, on a model whose stages hold 6.6 MB of gradients (dim 256, 4 blocks, text data: no
#   evaluation in the steps), from loom-gpt's own report and the CPU allocator: ZeRO-2 keeps half
#   ZeRO-1's gradients and ZeRO-3 also half its parameters (dp 2). Under 1F1B ZeRO-2's peak in the
#   steps is below ZeRO-1's by (1 - 1/dp) of ZeRO-1's gradient bytes less what ZeRO-2 stages
#   (Note [ZeRO-2 keeps one bucket in flight]: a bucket filling, one reducing and its output
#   shard; a bucket here is one 1 MB MLP weight), and ZeRO-1 holds its gradients once (in its
#   buckets): its peak is less than its gradient bytes above ZeRO-2's. The same under Chimera,
#   whose replica pairs sum ZeRO-1's buckets in place (Note [Summing gradients where they are]
#   in parallel/pipeline/executor.cpp; a flat copy of them, as before, put ZeRO-1's peak 14.4 MB
#   above ZeRO-2's, more than its 13.2 MB of gradients).
# usage: gpt_pipeline_zero.sh LOOM_GPT MPIEXEC [mpirun flags...]
set -euo pipefail
gpt=$1; mpiexec=$2; shift 2
mpi_flags=("$@")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
deep=(--steps 6 --batch 16 --layers 4 --dim 32 --heads 2 --eval-every 1000 --threads 1 --lr 1e-3
      --warmup-steps 0)
compare() {  # name file reference: every step's loss within 1e-5 relative
  /usr/bin/python3 "$here/checkpoint_tensors.py" losses "$1" "$3" "$2" 1 1e-5
}
# layout STAGE REFERENCE "NP FLAGS...": loom-gpt with the deep model, --zero STAGE and FLAGS on NP
# ranks gives REFERENCE's losses, and says it runs that stage.
layout() {
  local stage=$1 reference=$2 np rest name
  local -a flags
  read -r np rest <<< "$3"
  read -r -a flags <<< "$rest"
  name="zero${stage}_$(printf '%s' "$rest" | tr -d '-' | tr ' ' '_')"
  "$mpiexec" -np "$np" "${mpi_flags[@]}" "$gpt" "${deep[@]}" "${flags[@]}" --zero "$stage" \
    --metrics-file "$dir/$name.jsonl" > "$dir/$name.log" 2>&1 || { cat "$dir/$name.log"; exit 1; }
  grep -q "(ZeRO-$stage)" "$dir/$name.log" || { cat "$dir/$name.log"; exit 1; }
  compare "$name" "$dir/$name.jsonl" "$reference"
}

"$gpt" "${deep[@]}" --metrics-file "$dir/single.jsonl" > "$dir/single.log"
moe=(--moe-experts 4 --moe-top-k 2 --moe-every 2 --moe-hidden 48)
"$gpt" "${deep[@]}" "${moe[@]}" --metrics-file "$dir/moe.jsonl" > "$dir/moe.log"
capacity=(--moe-experts 4 --moe-capacity-factor 1.0 --moe-every 2 --dropout 0.1)
"$gpt" "${deep[@]}" "${capacity[@]}" --metrics-file "$dir/capacity.jsonl" > "$dir/capacity.log"
for stage in 2 3; do
  small=""
  [ "$stage" = 2 ] && small="--bucket-mb 0.01"  # stage 3's buckets are its units
  for l in "4 --dp 2 --pp 2 --schedule gpipe --microbatches 2 $small" \
           "4 --dp 2 --pp 2 --schedule 1f1b --microbatches 4 $small" \
           "4 --dp 2 --pp 2 --schedule interleaved --virtual-stages 2 --microbatches 2 $small" \
           "4 --dp 2 --pp 2 --schedule chimera --microbatches 2" \
           "8 --dp 2 --tp 2 --pp 2 --microbatches 2 $small" \
           "8 --dp 4 --pp 2 --zero-shard-group 2 --microbatches 2"; do
    layout "$stage" "$dir/single.jsonl" "$l"
  done
  layout "$stage" "$dir/moe.jsonl" "4 --dp 2 --ep 2 --pp 2 --microbatches 2 $small ${moe[*]}"
  layout "$stage" "$dir/moe.jsonl" "8 --dp 4 --ep 4 --pp 2 --microbatches 2 $small ${moe[*]}"
  layout "$stage" "$dir/capacity.jsonl" \
    "4 --dp 2 --ep 2 --pp 2 --schedule interleaved --virtual-stages 2 --microbatches 2 ${capacity[*]}"
done

printf 'the quick brown fox jumps over the lazy dog. %.0s' {1..200} > "$dir/text.txt"
wide=(--data "$dir/text.txt" --seq 16 --steps 2 --batch 8 --layers 4 --dim 256 --heads 4
      --threads 1 --warmup-steps 0 --bucket-mb 0.5 --dp 2 --pp 2 --microbatches 4)
for z in 1 2 3; do
  "$mpiexec" -np 4 "${mpi_flags[@]}" "$gpt" "${wide[@]}" --zero "$z" > "$dir/wide$z.log" 2>&1 ||
    { cat "$dir/wide$z.log"; exit 1; }
done
for z in 1 2; do  # Chimera: each stage's two copies sum their shards
  "$mpiexec" -np 4 "${mpi_flags[@]}" "$gpt" "${wide[@]}" --schedule chimera --zero "$z" \
    > "$dir/chimera$z.log" 2>&1 || { cat "$dir/chimera$z.log"; exit 1; }
done
python3 - "$dir/wide1.log" "$dir/wide2.log" "$dir/wide3.log" "$dir/chimera1.log" \
  "$dir/chimera2.log" <<'PY'
import re, sys
def read(path):
    text = open(path).read()
    m = re.search(r"memory per rank: parameters ([\d.]+) MB, gradients ([\d.]+) MB", text)
    peak = float(re.search(r"peak memory on rank 0 in the steps: ([\d.]+) MB", text).group(1))
    return float(m.group(1)), float(m.group(2)), peak
(p1, g1, k1), (p2, g2, k2), (p3, g3, k3), (_, cg1, ck1), (_, cg2, ck2) = map(read, sys.argv[1:])
assert abs(g2 - g1 / 2) <= 0.02 and abs(g3 - g1 / 2) <= 0.02, \
    f"gradients kept: ZeRO-1 {g1} MB, ZeRO-2 {g2} MB, ZeRO-3 {g3} MB (expected half of ZeRO-1's)"
assert p2 == p1 and abs(p3 - p1 / 2) <= 0.02, \
    f"parameters kept: ZeRO-1 {p1} MB, ZeRO-2 {p2} MB, ZeRO-3 {p3} MB (expected half at stage 3)"
# ZeRO-2 stages at most a bucket filling, one reducing and that one's output shard (dp 2): 2.5
# buckets of one MLP weight (dim 256 x 1024 f32) each, in MB as loom-gpt prints them.
staged = 2.5 * 256 * 1024 * 4 / 1e6
assert k2 <= k1 - (g1 / 2 - staged), \
    f"ZeRO-2's peak in the steps {k2} MB is not {g1 / 2} - {staged} MB below ZeRO-1's {k1}"
# ZeRO-1 accumulates in its buckets (Note [Accumulating in the buckets]): it holds the gradients
# once, g1 against ZeRO-2's g1 / 2 shards, the rest alike; held twice (fresh .grad beside the
# buckets) its peak would be about 1.5 g1 above ZeRO-2's. The midpoint, g1, tells them apart.
assert k1 <= k2 + g1, \
    f"ZeRO-1's peak in the steps {k1} MB is more than its gradients {g1} MB above ZeRO-2's {k2}"
assert ck2 <= ck1 - (cg1 / 2 - staged), \
    f"Chimera: ZeRO-2's peak in the steps {ck2} MB is not {cg1 / 2} - {staged} MB below ZeRO-1's {ck1}"
assert ck1 <= ck2 + cg1, \
    f"Chimera: ZeRO-1's peak in the steps {ck1} MB is more than its gradients {cg1} MB above ZeRO-2's {ck2}"
print(f"memory: kept parameters/gradients {p1}/{g1}, {p2}/{g2}, {p3}/{g3} MB at ZeRO-1/2/3; "
      f"peak in the steps {k1}, {k2}, {k3} MB; Chimera at ZeRO-1/2 {ck1}, {ck2} MB")
PY
echo "gpt_pipeline_zero: all checks passed"
