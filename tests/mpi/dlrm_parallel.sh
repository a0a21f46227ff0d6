#!/bin/bash
# loom-dlrm under mpirun against loom-dlrm on one process (the equivalence principle, end to
# end): with the tables sharded by every --sharding choice on 2 ranks, and mixed (auto) on 4, the
# MLPs in DDP and each rank on its share of the batch, the per-step losses and the final held-out
# AUC equal the single-process run's within 1e-5 relative.
# usage: dlrm_parallel.sh LOOM_DLRM MPIEXEC [mpirun flags...]
set -euo pipefail
dlrm=$1; mpiexec=$2; shift 2
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
common=(--steps 6 --batch 64 --eval-every 0 --eval-batches 2)
"$dlrm" "${common[@]}" --metrics-file "$dir/single.jsonl" > "$dir/single.log"
compare() {  # name file
  python3 - "$dir/single.jsonl" "$2" "$1" <<'PY'
import json, sys
def read(path):
    rows = [json.loads(l) for l in open(path)]
    return [r["loss"] for r in rows if "loss" in r], [r["auc"] for r in rows if "auc" in r]
(want, want_auc), (got, got_auc) = read(sys.argv[1]), read(sys.argv[2])
name = sys.argv[3]
assert len(got) == len(want) == 6, f"{name}: {len(got)} steps, expected {len(want)}"
for s, (g, w) in enumerate(zip(got, want)):
    assert abs(g - w) <= 1e-5 * abs(w), f"{name}: step {s + 1} loss {g} vs single-process {w}"
assert len(got_auc) == len(want_auc) == 1, f"{name}: {len(got_auc)} evaluations"
assert abs(got_auc[0] - want_auc[0]) <= 1e-5, f"{name}: AUC {got_auc[0]} vs {want_auc[0]}"
print(f"{name}: {len(got)} losses and the AUC match the single-process run")
PY
}
for sharding in table row column data auto; do
  "$mpiexec" -np 2 "$@" "$dlrm" "${common[@]}" --sharding "$sharding" \
    --metrics-file "$dir/$sharding.jsonl" > "$dir/$sharding.log"
  compare "np2_$sharding" "$dir/$sharding.jsonl"
done
"$mpiexec" -np 4 "$@" "$dlrm" "${common[@]}" --sharding auto --metrics-file "$dir/np4.jsonl" \
  > "$dir/np4.log"
compare "np4_auto" "$dir/np4.jsonl"
# Across nodes (tests/cluster/run.sh), with 2 ranks on each: the tables' all-to-alls (variable
# splits) and the MLPs' allreduces in two levels give the single-process run too.
nodes=${LOOM_TEST_NODES:-1}
if [ "$nodes" -gt 1 ]; then
  np=$((2 * nodes))
  LOOM_COLL_ALGO=hier "$mpiexec" -np "$np" "$@" "$dlrm" "${common[@]}" --sharding auto \
    --metrics-file "$dir/hier.jsonl" > "$dir/hier.log"
  grep -q "collectives: hier over $nodes node(s) x 2 rank(s)" "$dir/hier.log" || {
    cat "$dir/hier.log"; exit 1; }
  compare "np${np}_auto_hier" "$dir/hier.jsonl"
fi
# Bad input: a batch the ranks cannot split.
if "$mpiexec" -np 2 "$@" "$dlrm" --steps 1 --batch 63 > "$dir/bad.log" 2>&1; then
  echo "--batch 63 on 2 ranks was accepted"; exit 1
fi
grep -q "must be a positive multiple of the 2 rank(s)" "$dir/bad.log"
echo "np2 --batch 63: refused"
