#!/bin/bash
# loom-gpt --plan auto under mpirun: on 2 and 4 ranks, for a dense and a mixture-of-experts GPT,
# every rank calibrates, the planner chooses dp, ep, tp, pp, the schedule, micro-batches, ZeRO
# stage and recomputation among what loom-gpt runs, every rank prints the same plan, and the run
# trains with it: its losses are those of the same layout given by hand, bit for bit (the
# planner only chooses flags), and the single-process run's within 1e-5 relative (every layout
# is).
# usage: gpt_plan_auto.sh LOOM_GPT MPIEXEC [mpirun flags...]
set -euo pipefail
gpt=$1; mpiexec=$2; shift 2
mpi_flags=("$@")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
common=(--layers 4 --dim 32 --heads 2 --batch 16 --steps 4 --threads 1 --eval-every 1000
        --lr 1e-3 --warmup-steps 0)
moe=(--moe-experts 4 --moe-top-k 2 --moe-every 2 --moe-hidden 48)

# flags_of LAYOUT: the loom-gpt flags of a planner layout (dp=..,tp=..,...,ep=..).
flags_of() {
  /usr/bin/python3 - "$1" <<'PY'
import sys
f = dict(kv.split("=") for kv in sys.argv[1].split(","))
dp, tp, pp, mb = (int(f.get(k, 1)) for k in ("dp", "tp", "pp", "mb"))
accum = 16 // (dp * mb)
out = ["--dp", str(dp), "--tp", str(tp), "--pp", str(pp), "--zero", f["zero"],
       "--ep", f.get("ep", "1")]
if pp > 1:
    out += ["--schedule", f["schedule"], "--virtual-stages", f["v"], "--microbatches", str(accum)]
else:
    out += ["--grad-accum", str(accum)]
if f["recompute"] == "full":
    out.append("--checkpoint-activations")
if f["sp"] == "1":
    out.append("--sequence-parallel")
print(" ".join(out))
PY
}

for model in dense moe; do
  extra=()
  [ "$model" = moe ] && extra=("${moe[@]}")
  "$gpt" "${common[@]}" "${extra[@]}" --metrics-file "$dir/single_$model.jsonl" \
    > "$dir/single_$model.log"
  for np in 2 4; do
    name="${model}_np$np"
    "$mpiexec" -np "$np" "${mpi_flags[@]}" "$gpt" "${common[@]}" "${extra[@]}" --plan auto \
      --metrics-file "$dir/$name.jsonl" > "$dir/$name.log" 2>&1 || { cat "$dir/$name.log"; exit 1; }
    plans=$(grep '^plan: dp=' "$dir/$name.log" | grep -v runner-up | sed -E 's/^plan: ([^:]+):.*/\1/')
    layout=$(head -1 <<< "$plans")
    [ -n "$layout" ] || { cat "$dir/$name.log"; echo "$name: no plan printed"; exit 1; }
    [ "$(sort -u <<< "$plans" | wc -l)" = 1 ] || { echo "$name: ranks chose differently: $plans"; exit 1; }
    read -r -a flags <<< "$(flags_of "$layout")"
    echo "$name: chose $layout"
    "$mpiexec" -np "$np" "${mpi_flags[@]}" "$gpt" "${common[@]}" "${extra[@]}" "${flags[@]}" \
      --metrics-file "$dir/${name}_manual.jsonl" > "$dir/${name}_manual.log" 2>&1 ||
      { cat "$dir/${name}_manual.log"; exit 1; }
    /usr/bin/python3 "$here/checkpoint_tensors.py" losses "$name: the same layout by hand" \
      "$dir/${name}_manual.jsonl" "$dir/$name.jsonl" 1 0
    /usr/bin/python3 "$here/checkpoint_tensors.py" losses "$name: one process" \
      "$dir/single_$model.jsonl" "$dir/$name.jsonl" 1 1e-5
  done
done
echo "gpt_plan_auto: all checks passed"
