#!/bin/bash
# loom-gpt under mpirun against loom-gpt on one process (the equivalence principle, end to end):
# the same flags with --dp 2 and every ZeRO stage, with and without gradient accumulation, must
# print the same per-step losses (from --metrics-file) within 1e-5 relative.
# usage: gpt_dp.sh LOOM_GPT MPIEXEC [mpirun flags...]
set -euo pipefail
gpt=$1; mpiexec=$2; shift 2
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
common=(--steps 6 --batch 16 --layers 2 --dim 32 --heads 2 --eval-every 1000 --threads 1
        --lr 1e-3 --warmup-steps 0)

"$gpt" "${common[@]}" --metrics-file "$dir/single.jsonl" > "$dir/single.log"
compare() {  # name file
  python3 - "$dir/single.jsonl" "$2" "$1" <<'PY'
import json, sys
want = [json.loads(l)["loss"] for l in open(sys.argv[1]) if '"loss"' in l]
got = [json.loads(l)["loss"] for l in open(sys.argv[2]) if '"loss"' in l]
name = sys.argv[3]
assert len(got) == len(want) == 6, f"{name}: {len(got)} steps, expected {len(want)}"
for s, (g, w) in enumerate(zip(got, want)):
    assert abs(g - w) <= 1e-5 * abs(w), f"{name}: step {s + 1} loss {g} vs single-process {w}"
print(f"{name}: {len(got)} losses match the single-process run")
PY
}
for zero in 0 1 2; do
  for accum in 1 2; do
    name="dp2_zero${zero}_accum${accum}"
    "$mpiexec" -np 2 "$@" "$gpt" "${common[@]}" --dp 2 --zero "$zero" --grad-accum "$accum" \
      --bucket-mb 0.01 --metrics-file "$dir/$name.jsonl" > "$dir/$name.log"
    compare "$name" "$dir/$name.jsonl"
  done
done
