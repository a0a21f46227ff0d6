#!/bin/bash
# loom-dlrm's checkpoints, end to end: sharded embedding tables and their optimizer state as
# layout-independent pieces (parallel/checkpoint/embedding_state.h), the MLPs in DDP. For tables
# trained by AdamW on dense gradients and by each fused optimizer of the embedding bags (sgd,
# rowwise_adagrad, adam):
# 1. Same layout: for each --sharding (table, row, column, data) on 2 ranks, a run that saves at
#    step 4 and is resumed there gives exactly the uninterrupted run's losses for steps 5-8, and
#    its step-8 checkpoint (tables, moments or accumulators, MLPs, step counts, data position) is
#    bit-identical to the uninterrupted one's.
# 2. Other layouts: the table-wise step-4 checkpoint is loaded row-wise and saved again at once,
#    that one column-wise, that one data-parallel, that one on one process; every tensor of every
#    link is bit-identical to the original, and each link trained on to step 8 gives the
#    single-process losses within 1e-5 (the tolerance of tests/mpi/dlrm_parallel.sh).
# 3. The data position counts examples: a run resumed with another --batch goes on at the next
#    example. --keep-last keeps the newest. Mistakes are clear errors: another
#    --embedding-optimizer, --seed, --max-bag or --dim, a directory without a committed
#    checkpoint, --resume without --checkpoint-dir; --resume with none yet starts at step 0.
# Tensors are compared by tests/mpi/checkpoint_tensors.py, which reads the format with numpy.
# usage: dlrm_checkpoint.sh LOOM_DLRM MPIEXEC [mpirun flags...]
set -euo pipefail
dlrm=$1; mpiexec=$2; shift 2
mpi_flags=("$@")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
py=/usr/bin/python3
tensors() { "$py" "$here/checkpoint_tensors.py" "$@"; }
common=(--steps 8 --batch 64 --eval-every 0 --eval-batches 2 --ceiling-examples 1024)
launch() {  # ranks then loom-dlrm flags
  local np=$1; shift
  if [ "$np" = 1 ]; then
    "$dlrm" "${common[@]}" "$@"
  else
    "$mpiexec" -np "$np" "${mpi_flags[@]}" "$dlrm" "${common[@]}" "$@"
  fi
}
# losses NAME A B FIRST TOLERANCE: the losses of steps >= FIRST in A and B agree.
losses() { "$py" "$here/checkpoint_tensors.py" losses "$@"; }

for opt in adamw sgd rowwise_adagrad adam; do
  o=(--embedding-optimizer "$opt")
  [ "$opt" != adamw ] && o+=(--embedding-lr 0.02)
  d="$dir/$opt"; mkdir -p "$d"

  # 1. Same layout, bit for bit.
  for sharding in table row column data; do
    n="$d/$sharding"
    launch 2 "${o[@]}" --sharding "$sharding" --checkpoint-dir "$n.full" --save-every 4 \
      --metrics-file "$n.full.jsonl" > "$n.full.log"
    launch 2 "${o[@]}" --sharding "$sharding" --resume-from "$n.full/step-00000004" \
      --checkpoint-dir "$n.resumed" --metrics-file "$n.resumed.jsonl" > "$n.resumed.log"
    grep -q "resumed from .*step-00000004 at step 4" "$n.resumed.log"
    losses "$opt $sharding resumed" "$n.full.jsonl" "$n.resumed.jsonl" 5 0
    tensors same "$n.full/step-00000008" "$n.resumed/step-00000008"
  done

  # 2. Other layouts: table -> row -> column -> data -> one process.
  launch 1 "${o[@]}" --metrics-file "$d/single.jsonl" > "$d/single.log"
  losses "$opt table-wise against one process" "$d/single.jsonl" "$d/table.full.jsonl" 1 1e-5
  source="$d/table.full/step-00000004"
  previous=$source
  for target in 2:row 2:column 2:data 1:one_process; do
    np=${target%%:*}; name=${target#*:}
    s=()
    [ "$np" != 1 ] && s=(--sharding "$name")
    # Loaded and saved again at once (--steps 4: nothing to train).
    launch "$np" "${o[@]}" "${s[@]}" --resume-from "$previous" --steps 4 \
      --checkpoint-dir "$d/to_$name" > "$d/to_$name.log"
    tensors same "$source" "$d/to_$name/step-00000004" --except-layout
    launch "$np" "${o[@]}" "${s[@]}" --resume-from "$d/to_$name/step-00000004" \
      --metrics-file "$d/to_$name.jsonl" > "$d/to_$name.continued.log"
    losses "$opt $name continued" "$d/single.jsonl" "$d/to_$name.jsonl" 5 1e-5
    previous="$d/to_$name/step-00000004"
  done
done

# 3. The data position, --keep-last, and mistakes.
src="$dir/adam/table.full/step-00000004"
o=(--embedding-optimizer adam --embedding-lr 0.02)
launch 1 "${o[@]}" --resume-from "$src" --batch 32 --steps 6 --checkpoint-dir "$dir/batch32" \
  > "$dir/batch32.log"
"$py" - "$dir/batch32/step-00000006/manifest.json" <<'PY'
import json, sys
data = json.load(open(sys.argv[1]))["state"]["data"]
assert data["next_example"] == 4 * 64 + 2 * 32 and data["batch"] == 32, data
print(f"--batch 32 after 4 steps of 64: goes on at example {data['next_example']}")
PY
launch 1 --steps 6 --save-every 2 --keep-last 2 --checkpoint-dir "$dir/keep" > "$dir/keep.log"
[ "$(ls "$dir/keep" | grep -c '^step-')" = 2 ] && test -d "$dir/keep/step-00000006" \
  && test -d "$dir/keep/step-00000004" || { ls "$dir/keep"; exit 1; }
echo "--keep-last 2: steps 4 and 6 kept"
# expect_error PATTERN FLAGS...: the run fails (no crash) with a message matching PATTERN.
expect_error() { bash "$here/../cli/expect_error.sh" "$1" "$dlrm" "${common[@]}" "${@:2}"; }
expect_error "--embedding-optimizer sgd differs from the checkpoint" --resume-from "$src" \
  --embedding-optimizer sgd
expect_error "--seed 7 differs from the checkpoint" --resume-from "$src" "${o[@]}" --seed 7
expect_error "--max-bag 5 differs from the checkpoint" --resume-from "$src" "${o[@]}" --max-bag 5
expect_error "--dim 32 conflicts with the checkpoint" --resume-from "$src" "${o[@]}" --dim 32
expect_error "no committed checkpoint at" --resume-from "$dir"
mkdir -p "$dir/unfinished/step-00000003"
expect_error "no committed checkpoint at .*unfinished" --resume-from "$dir/unfinished/step-00000003"
expect_error "--resume needs --checkpoint-dir" --resume
expect_error "give --resume .* or --resume-from PATH, not both" --checkpoint-dir "$dir/x" --resume \
  --resume-from "$src"
# --resume in a directory with no checkpoint yet starts from step 0.
launch 1 --steps 3 --checkpoint-dir "$dir/fresh" --resume > "$dir/fresh.log"
grep -q "none in .*fresh yet; starting at step 0" "$dir/fresh.log"
test -f "$dir/fresh/step-00000003/manifest.json"
echo "dlrm_checkpoint: all checks passed"
