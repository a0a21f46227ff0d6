#!/bin/bash
# ZeRO-2 in pipelines (--pp with --zero 2: each chunk's gradients reduce-scattered over dp as its
# backwards produce them, See Note [ZeRO-2 in a pipeline] in parallel/zero.cpp) against one
# process, the equivalence principle:
# - dp 2 x pp 2 with every schedule (GPipe, 1F1B, interleaved with 2 chunks per rank, Chimera,
#   whose replicated stages are reduced at the step's end), with buckets of 10 KB so each chunk
#   has several; dp 2 x tp 2 x pp 2; dp 4 x pp 2 sharded over groups of 2 dp ranks; and a
#   mixture-of-experts model on dp 2 x ep 2 x pp 2: the single-process losses within 1e-5
#   relative (each micro-batch's gradient is averaged over dp before the micro-batches are
#   summed, where one process sums the batch once: rounding only).
# - Memory: ZeRO-2 keeps 1/dp of the gradients where ZeRO-1 keeps them whole, so on a model whose
#   stage gradients are 6.6 MB (dim 256, 4 blocks, text data: no evaluation in the steps) rank 0's
#   peak in the steps is at least (1 - 1/dp) of ZeRO-1's reported gradient bytes below ZeRO-1's,
#   measured by the CPU allocator.
# - --zero 3 with --pp is refused by name.
# usage: gpt_pipeline_zero2.sh LOOM_GPT MPIEXEC [mpirun flags...]
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
# layout REFERENCE "NP FLAGS...": loom-gpt with the deep model and FLAGS on NP ranks gives
# REFERENCE's losses, and says it runs ZeRO-2.
layout() {
  local reference=$1 np rest name
  local -a flags
  read -r np rest <<< "$2"
  read -r -a flags <<< "$rest"
  name="$(printf '%s' "$rest" | tr -d '-' | tr ' ' '_')"
  "$mpiexec" -np "$np" "${mpi_flags[@]}" "$gpt" "${deep[@]}" "${flags[@]}" --zero 2 \
    --metrics-file "$dir/$name.jsonl" > "$dir/$name.log" 2>&1 || { cat "$dir/$name.log"; exit 1; }
  grep -q "(ZeRO-2)" "$dir/$name.log" || { cat "$dir/$name.log"; exit 1; }
  compare "$name" "$dir/$name.jsonl" "$reference"
}

"$gpt" "${deep[@]}" --metrics-file "$dir/single.jsonl" > "$dir/single.log"
small="--bucket-mb 0.01"
for l in "4 --dp 2 --pp 2 --schedule gpipe --microbatches 2 $small" \
         "4 --dp 2 --pp 2 --schedule 1f1b --microbatches 4 $small" \
         "4 --dp 2 --pp 2 --schedule interleaved --virtual-stages 2 --microbatches 2 $small" \
         "4 --dp 2 --pp 2 --schedule chimera --microbatches 2" \
         "8 --dp 2 --tp 2 --pp 2 --microbatches 2 $small" \
         "8 --dp 4 --pp 2 --zero-shard-group 2 --microbatches 2"; do
  layout "$dir/single.jsonl" "$l"
done
moe=(--moe-experts 4 --moe-top-k 2 --moe-every 2 --moe-hidden 48)
"$gpt" "${deep[@]}" "${moe[@]}" --metrics-file "$dir/moe.jsonl" > "$dir/moe.log"
layout "$dir/moe.jsonl" "4 --dp 2 --ep 2 --pp 2 --microbatches 2 $small ${moe[*]}"

printf 'the quick brown fox jumps over the lazy dog. %.0s' {1..200} > "$dir/text.txt"
wide=(--data "$dir/text.txt" --seq 16 --steps 2 --batch 8 --layers 4 --dim 256 --heads 4
      --threads 1 --warmup-steps 0 --bucket-mb 0.5 --dp 2 --pp 2 --microbatches 4)
for z in 1 2; do
  "$mpiexec" -np 4 "${mpi_flags[@]}" "$gpt" "${wide[@]}" --zero "$z" > "$dir/wide$z.log" 2>&1 ||
    { cat "$dir/wide$z.log"; exit 1; }
done
python3 - "$dir/wide1.log" "$dir/wide2.log" <<'PY'
import re, sys
def read(path):
    text = open(path).read()
    grads = float(re.search(r"memory per rank: .*gradients ([\d.]+) MB", text).group(1))
    peak = float(re.search(r"peak memory on rank 0 in the steps: ([\d.]+) MB", text).group(1))
    return grads, peak
(g1, p1), (g2, p2) = read(sys.argv[1]), read(sys.argv[2])
assert abs(g2 - g1 / 2) <= 0.02, f"ZeRO-2 reports {g2} MB of gradients, not half of ZeRO-1's {g1}"
assert p2 <= p1 - g1 / 2, f"ZeRO-2's peak in the steps {p2} MB is not {g1 / 2} MB below ZeRO-1's {p1}"
print(f"memory: peak in the steps {p2} MB with ZeRO-2 vs {p1} MB with ZeRO-1 (gradients {g2} vs {g1} MB)")
PY

bash "$here/../cli/expect_error.sh" "--pp does not combine with --zero 3" \
  "$mpiexec" -np 4 "${mpi_flags[@]}" "$gpt" "${deep[@]}" --dp 2 --pp 2 --zero 3
echo "gpt_pipeline_zero2: all checks passed"
