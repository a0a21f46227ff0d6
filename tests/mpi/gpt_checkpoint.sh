#!/bin/bash
# loom-gpt's checkpoints, end to end (issue 17's proof). PART "layouts" runs 1-3 on a 2-block
# model; PART "pipelines" runs 1 and 2 for pipelines on a 4-block model (4):
# 1. Same layout: a run that saves at step 6 and is resumed from there prints, for steps 7-12,
#    exactly the losses of the uninterrupted run, and its step-12 checkpoint (parameters,
#    optimizer moments, step counts, data position) is bit-identical to the uninterrupted one's:
#    one process, DDP, ZeRO-1, ZeRO-3 with grad-accum, tp 2 with sequence parallelism, and
#    dp 2 x tp 2 with ZeRO-2, bf16 and f16 (masters, loss scaler), asynchronous saves, and
#    hybrid-sharded ZeRO-3 (shard groups of 2 replicated twice: each element written once); all
#    with dropout. ZeRO-1 and -2 resume so both with their parameters read whole and by pieces
#    and a gather (LOOM_CKPT_PARAMETERS=whole|pieces).
# 2. Other layouts: a checkpoint saved by dp 2 x tp 2 with ZeRO-1 loads on dp 4 with ZeRO-3, on
#    one process, on tp 4, on dp 2 with ZeRO-2, on dp 2 x tp 2 with ZeRO-3 and on dp 4 with
#    hybrid-sharded ZeRO-2 (shard groups of 2): saved again right
#    after loading, every tensor is bit-identical to the saved one, and training on gives the
#    single-process losses within 1e-5 (the tolerance of tests/mpi/gpt_parallel.sh).
# 3. Mistakes are clear errors: resuming with another --batch, --layers or --seed, from a
#    directory without a committed checkpoint, or with --resume but no --checkpoint-dir.
# 4. Pipelines: every schedule (GPipe, 1F1B, interleaved, Chimera), dp 2 x pp 2 with ZeRO-1,
#    dp 2 x pp 2 interleaved with ZeRO-2 and ZeRO-3 and dp 2 x tp 2 x pp 2 resume bit for bit, and so do pp 2
#    and dp 2 x pp 2 ZeRO-1 in bf16 (whose checkpoint reloads bit-identically on one process and on
#    the other) and pp 2 in f16 (its loss scale too); the issue's dp 2 x tp 2 x pp 2 ZeRO-1 1F1B checkpoint reloads bit-identically on
#    dp 4 with ZeRO-3, one process, tp 4 x pp 2 interleaved, pp 4 Chimera, dp 2 x pp 2 with
#    ZeRO-2 and dp 2 x pp 2 Chimera with ZeRO-3, and continues with the single-process losses.
# 5. `loom-ckpt check` plans each target layout's load from the manifest alone: the bytes it
#    predicts, in all and on the busiest rank, are exactly what the resumed ranks read (2, 4 and
#    the bf16 targets), and it refuses --tp 3 for 4 heads as the resume does.
# Tensors are compared by tests/mpi/checkpoint_tensors.py, which reads the format with numpy.
# usage: gpt_checkpoint.sh layouts|pipelines LOOM_GPT LOOM_CKPT MPIEXEC [mpirun flags...]
set -euo pipefail
part=$1; gpt=$2; ckpt=$3; mpiexec=$4; shift 4
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
py=/usr/bin/python3
tensors() { "$py" "$here/checkpoint_tensors.py" "$@"; }
layers=2
[ "$part" = pipelines ] && layers=4
common=(--steps 12 --batch 16 --layers "$layers" --dim 32 --heads 4 --eval-every 1000 --threads 1
        --lr 1e-3 --warmup-steps 2 --dropout 0.1 --seq 26)
launch() {  # ranks then loom-gpt flags
  local np=$1; shift
  if [ "$np" = 1 ]; then
    "$gpt" "${common[@]}" "$@"
  else
    "$mpiexec" -np "$np" "${mpi_flags[@]}" "$gpt" "${common[@]}" "$@"
  fi
}
mpi_flags=("$@")
# planned_reads CHECKPOINT LOG FLAGS...: `loom-ckpt check CHECKPOINT FLAGS` predicts the bytes
# the resume that wrote LOG read (in all; most on one rank).
# A ZeRO-1/2 resume reads the parameters whole when the checkpoint is in the page cache (Note
# [ZeRO's parameters read whole when cached]), as it is after `tensors` read it: check plans that
# too, and the resume must have read one of the two.
planned_reads() {
  local src=$1 log=$2; shift 2
  local out planned whole actual
  out=$("$ckpt" check "$src" "${common[@]}" "$@")
  planned=$(sed -n 's/^bytes in all: \([0-9]*\), most on one rank: \([0-9]*\)$/\1 \2/p' <<< "$out")
  whole=$(sed -n 's/^from the page cache .*: bytes in all: \([0-9]*\), most on one rank: \([0-9]*\)$/\1 \2/p' <<< "$out")
  actual=$(sed -n 's/^checkpoint: read \([0-9]*\) bytes in all, at most \([0-9]*\) on one rank$/\1 \2/p' "$log")
  if [ -z "$planned" ] || [ -z "$actual" ] ||
     { [ "$planned" != "$actual" ] && [ "$whole" != "$actual" ]; }; then
    echo "loom-ckpt check $* planned reads '$planned' (whole parameters: '$whole') but the resume read '$actual'"
    exit 1
  fi
  if [ "$planned" = "$actual" ]; then
    echo "loom-ckpt check $*: planned reads $planned = the resume's"
  else
    echo "loom-ckpt check $*: planned reads with the parameters whole $whole = the resume's"
  fi
}

# losses NAME A B FIRST TOLERANCE: the losses of steps >= FIRST in A and B agree.
losses() { "$py" "$here/checkpoint_tensors.py" losses "$@"; }

# same_layout LAYOUT...: each "ranks:flags" saves at step 6; resumed there, steps 7-12 and the
# step-12 checkpoint are the uninterrupted run's, bit for bit.
same_layout() {
  for layout in "$@"; do
    np=${layout%%:*}; read -r -a flags <<< "${layout#*:}"
    name="${LOOM_CKPT_PARAMETERS:-}np${np}$(printf '_%s' "${flags[@]}" | tr -d '-' | tr ' ' '_')"
    launch "$np" "${flags[@]}" --checkpoint-dir "$dir/$name.full" --save-every 6 \
      --metrics-file "$dir/$name.full.jsonl" > "$dir/$name.full.log"
    launch "$np" "${flags[@]}" --resume-from "$dir/$name.full/step-00000006" \
      --checkpoint-dir "$dir/$name.resumed" --metrics-file "$dir/$name.resumed.jsonl" \
      > "$dir/$name.resumed.log"
    grep -q "resumed from .*step-00000006 at step 6" "$dir/$name.resumed.log"
    losses "$name resumed" "$dir/$name.full.jsonl" "$dir/$name.resumed.jsonl" 7 0
    tensors same "$dir/$name.full/step-00000012" "$dir/$name.resumed/step-00000012"
  done
}

# other_layouts SOURCE TARGET...: SOURCE ("ranks:flags") saves at step 6 and matches one process;
# each TARGET loads it and saves again at once (every tensor bit-identical), then trains on with
# the single-process losses (1e-5).
other_layouts() {
  local source=$1; shift
  launch 1 --metrics-file "$dir/single.jsonl" > "$dir/single.log"
  np=${source%%:*}; read -r -a flags <<< "${source#*:}"
  launch "$np" "${flags[@]}" --checkpoint-dir "$dir/source" --save-every 6 \
    --metrics-file "$dir/source.jsonl" > "$dir/source.log"
  losses "source ${source} against one process" "$dir/single.jsonl" "$dir/source.jsonl" 1 1e-5
  for target in "$@"; do
    np=${target%%:*}; read -r -a flags <<< "${target#*:}"
    name="to_np${np}$(printf '_%s' "${flags[@]}" | tr -d '-' | tr ' ' '_')"
    # Loaded and saved again at once (--steps 6: nothing to train).
    launch "$np" "${flags[@]}" --resume-from "$dir/source/step-00000006" --steps 6 \
      --checkpoint-dir "$dir/$name.resaved" > "$dir/$name.resaved.log"
    tensors same "$dir/source/step-00000006" "$dir/$name.resaved/step-00000006" --except-layout
    planned_reads "$dir/source/step-00000006" "$dir/$name.resaved.log" "${flags[@]}"
    launch "$np" "${flags[@]}" --resume-from "$dir/source/step-00000006" \
      --metrics-file "$dir/$name.jsonl" > "$dir/$name.log"
    losses "$name continued" "$dir/single.jsonl" "$dir/$name.jsonl" 7 1e-5
  done
}

# resaved_on SOURCE PREFIX TARGET...: each TARGET ("ranks:flags") loads SOURCE and saves it again
# at once: every tensor bit-identical, read in the bytes `loom-ckpt check` plans.
resaved_on() {
  local src=$1 prefix=$2 target name np
  local -a flags
  shift 2
  for target in "$@"; do
    np=${target%%:*}; read -r -a flags <<< "${target#*:}"
    name="${prefix}_to_np${np}$(printf '_%s' "${flags[@]}" | tr -d '-' | tr ' ' '_')"
    launch "$np" "${flags[@]}" --resume-from "$src" --steps 6 --checkpoint-dir "$dir/$name" \
      > "$dir/$name.log"
    tensors same "$src" "$dir/$name/step-00000006" --except-layout
    planned_reads "$src" "$dir/$name.log" "${flags[@]}"
  done
}
if [ "$part" = pipelines ]; then
  same_layout "2:--pp 2 --schedule gpipe" "2:--pp 2 --schedule 1f1b" \
    "2:--pp 2 --schedule interleaved --virtual-stages 2" "4:--pp 4 --schedule chimera" \
    "4:--dp 2 --pp 2 --zero 1" "8:--dp 2 --tp 2 --pp 2 --schedule chimera" \
    "2:--pp 2 --dtype bf16" "4:--dp 2 --pp 2 --zero 1 --dtype bf16" \
    "4:--dp 2 --pp 2 --zero 2 --schedule interleaved --virtual-stages 2" "2:--pp 2 --dtype f16" \
    "4:--dp 2 --pp 2 --zero 3 --schedule interleaved --virtual-stages 2"
  # ZeRO-1 and -2 stages resumed with their parameters read whole (as from the page cache), and
  # by pieces and a gather (as from a disk): both bit for bit.
  LOOM_CKPT_PARAMETERS=whole same_layout "4:--dp 2 --pp 2 --zero 1" \
    "4:--dp 2 --pp 2 --zero 2 --schedule interleaved --virtual-stages 2"
  LOOM_CKPT_PARAMETERS=pieces same_layout "4:--dp 2 --pp 2 --zero 1"
  # A bf16 pipeline's checkpoint (f32 masters under MixedPrecisionOptimizer) reloads onto one
  # process in bf16 and onto dp 2 x pp 2 with ZeRO-1 (the masters sharded), bit for bit.
  resaved_on "$dir/np2_pp_2_dtype_bf16.full/step-00000006" bf16_pp "1:--dtype bf16" \
    "4:--dp 2 --pp 2 --zero 1 --dtype bf16"
  other_layouts "8:--dp 2 --tp 2 --pp 2 --zero 1 --schedule 1f1b" "4:--dp 4 --zero 3" "1:" \
    "8:--tp 4 --pp 2 --schedule interleaved --virtual-stages 2" "4:--pp 4 --schedule chimera" \
    "4:--dp 2 --pp 2 --zero 2" "4:--dp 2 --pp 2 --zero 3 --schedule chimera"
  echo "gpt_checkpoint pipelines: all checks passed"
  exit 0
fi

# 1. Same layout, bit for bit.
same_layout "1:" "2:--dp 2" "2:--dp 2 --zero 1" "2:--dp 2 --zero 3 --grad-accum 2" \
  "2:--tp 2 --sequence-parallel" "4:--dp 2 --tp 2 --zero 2" "1:--dtype bf16" \
  "2:--dp 2 --zero 1 --dtype bf16" "2:--dp 2 --dtype f16" "2:--dp 2 --zero 3 --dtype f16" \
  "2:--dp 2 --zero 3 --async-save" "1:--async-save" "4:--dp 4 --zero 3 --zero-shard-group 2" \
  "2:--dp 2 --ep 2 --moe-experts 4 --moe-top-k 2" "4:--dp 2 --tp 2 --ep 2 --moe-experts 4" \
  "4:--dp 2 --ep 2 --pp 2 --microbatches 2 --moe-experts 4 --moe-top-k 2" \
  "4:--dp 4 --ep 2 --zero 2 --moe-experts 4 --moe-top-k 2" \
  "8:--dp 4 --ep 2 --pp 2 --zero 1 --microbatches 2 --moe-experts 4 --moe-top-k 2" \
  "4:--dp 4 --ep 2 --zero 2 --zero-shard-group 2 --moe-experts 4 --moe-top-k 2"
# ZeRO-1 and -2 resumed with their parameters read whole (as from the page cache) and by pieces
# and a gather (as from a disk), f32 and bf16 (the masters by pieces either way): bit for bit.
LOOM_CKPT_PARAMETERS=whole same_layout "2:--dp 2 --zero 1" "2:--dp 2 --zero 1 --dtype bf16" \
  "4:--dp 2 --tp 2 --zero 2" "4:--dp 4 --zero 2 --zero-shard-group 2"
LOOM_CKPT_PARAMETERS=pieces same_layout "2:--dp 2 --zero 1" "2:--dp 2 --zero 1 --dtype bf16"

# 2. Other layouts, from dp 2 x tp 2 with ZeRO-1.
other_layouts "4:--dp 2 --tp 2 --zero 1" "4:--dp 4 --zero 3" "1:" "4:--tp 4" \
  "2:--dp 2 --zero 2 --grad-accum 2" "4:--dp 2 --tp 2 --zero 3" \
  "4:--dp 4 --zero 2 --zero-shard-group 2"

# Mixture of experts with expert parallelism: an ep 2 checkpoint (each rank's experts saved by
# it, under their single-process names) resumes bit for bit (in same_layout below), and loads on
# one process, on ep 4, on dp 4 with ep 2 (expert replicas), on tp 2, on dp 2 x tp 2 x ep 2
# (experts whole over tp), on dp 2 x ep 2 x pp 2 and on dp 2 x ep 2 with gradient accumulation
# (micro-batches after a routing pass), on dp 2 x tp 2 x ep 2 with each expert split over tp
# (--expert-tp 2), on dp 4 x ep 4 with ZeRO-3 (experts whole beside the shards), on dp 4 x ep 2
# with ZeRO-1 (the experts' state sharded over their 2 replicas) and ZeRO-3 (the experts
# themselves sharded over them): saved again at once
# bit-identical, training on with the single-process losses. dp 4 x ep 2 with ZeRO-2 (also
# hybrid-sharded over groups of 2), and with pp 2 and ZeRO-1, resume bit for bit (in same_layout). A checkpoint whose --moe-* flags differ is refused by name.
moe=(--moe-experts 4 --moe-top-k 2)
launch 1 "${moe[@]}" --metrics-file "$dir/moe_single.jsonl" > "$dir/moe_single.log"
launch 2 --dp 2 --ep 2 "${moe[@]}" --checkpoint-dir "$dir/moe_src" --save-every 6 \
  --metrics-file "$dir/moe_src.jsonl" > "$dir/moe_src.log"
losses "moe ep 2 against one process" "$dir/moe_single.jsonl" "$dir/moe_src.jsonl" 1 1e-5
for target in "1:" "4:--dp 4 --ep 4" "4:--dp 4 --ep 2" "2:--tp 2" "4:--dp 2 --tp 2 --ep 2" \
              "4:--dp 2 --ep 2 --pp 2 --microbatches 2" "2:--dp 2 --ep 2 --grad-accum 2" \
              "4:--dp 2 --tp 2 --ep 2 --expert-tp 2" "4:--dp 4 --ep 4 --zero 3" \
              "4:--dp 4 --ep 2 --zero 1" "4:--dp 4 --ep 2 --zero 3"; do
  np=${target%%:*}; read -r -a flags <<< "${target#*:}"
  name="moe_to_np${np}$(printf '_%s' "${flags[@]}" | tr -d '-')"
  launch "$np" "${flags[@]}" "${moe[@]}" --resume-from "$dir/moe_src/step-00000006" --steps 6 \
    --checkpoint-dir "$dir/$name.resaved" > "$dir/$name.resaved.log"
  tensors same "$dir/moe_src/step-00000006" "$dir/$name.resaved/step-00000006" --except-layout
  # loom-ckpt check plans the experts each rank reads (with ZeRO: what it steps of them) as the
  # resume read them; pipelines are left out (it plans their stages without expert parallelism).
  [[ " ${flags[*]} " == *" --pp "* ]] ||
    planned_reads "$dir/moe_src/step-00000006" "$dir/$name.resaved.log" "${flags[@]}" "${moe[@]}"
  launch "$np" "${flags[@]}" "${moe[@]}" --resume-from "$dir/moe_src/step-00000006" \
    --metrics-file "$dir/$name.jsonl" > "$dir/$name.log"
  losses "$name continued" "$dir/moe_single.jsonl" "$dir/$name.jsonl" 7 1e-5
done
if launch 1 --moe-experts 4 --resume-from "$dir/moe_src/step-00000006" > "$dir/moe_bad.log" 2>&1; then
  echo "a top-2 MoE checkpoint resumed with top-1 flags"; exit 1
fi
grep -q "mixture of experts .* differs from the --moe-\* flags" "$dir/moe_bad.log" || {
  cat "$dir/moe_bad.log"; exit 1; }
echo "moe: other --moe-* flags refused"

# bf16 with f32 masters: a ZeRO-1 checkpoint reloads onto one process (MixedPrecisionOptimizer)
# and onto ZeRO-3 with its masters kept, bit for bit; an f32 layout takes its parameters from the
# masters (See Note [Masters across dtypes]).
src="$dir/np2_dp_2_zero_1_dtype_bf16.full/step-00000006"
resaved_on "$src" bf16 "1:--dtype bf16" "2:--dp 2 --zero 3 --dtype bf16"
launch 1 --resume-from "$src" --steps 6 --checkpoint-dir "$dir/bf16_to_f32" > "$dir/bf16_to_f32.log"
tensors masters-are-parameters "$src" "$dir/bf16_to_f32/step-00000006"
planned_reads "$src" "$dir/bf16_to_f32.log" --dtype f32

# 3. Mistakes.
# expect_error PATTERN FLAGS...: the run fails (no crash) with a message matching PATTERN.
expect_error() { bash "$here/../cli/expect_error.sh" "$1" "$gpt" "${common[@]}" "${@:2}"; }
src="$dir/source/step-00000006"
expect_error "--batch 32 differs from the checkpoint" --resume-from "$src" --batch 32
expect_error "--layers 3 conflicts with the checkpoint" --resume-from "$src" --layers 3
expect_error "--seed 7 differs from the checkpoint" --resume-from "$src" --seed 7
expect_error "no committed checkpoint at" --resume-from "$dir"
mkdir -p "$dir/unfinished/step-00000003"
expect_error "no committed checkpoint at .*unfinished" --resume-from "$dir/unfinished/step-00000003"
# A staging directory is never loaded, even when its manifest is complete.
cp -r "$src" "$dir/unfinished/step-00000006.tmp"
expect_error "step-00000006.tmp is a save that was never committed" \
  --resume-from "$dir/unfinished/step-00000006.tmp"
expect_error "--resume needs --checkpoint-dir" --resume
# A layout that cannot hold the model is refused before anything is read, naming why.
if "$mpiexec" -np 3 "${mpi_flags[@]}" "$gpt" "${common[@]}" --tp 3 --resume-from "$src" \
    > "$dir/tp3.log" 2>&1; then
  echo "--tp 3 with a 4-head checkpoint was accepted"; exit 1
fi
grep -q "heads (4) must divide evenly over tp 3" "$dir/tp3.log"
bash "$here/../cli/expect_error.sh" "rank 0 \(pp 0, dp 0, tp 0\) of the layout cannot load .*heads \(4\) must divide evenly over tp 3" \
  "$ckpt" check "$src" --tp 3
echo "refused as expected: --tp 3 for 4 heads"
# --resume in a directory with no checkpoint yet starts from step 0.
"$gpt" "${common[@]}" --steps 3 --checkpoint-dir "$dir/fresh" --resume > "$dir/fresh.log"
grep -q "none in .*fresh yet; starting at step 0" "$dir/fresh.log"
test -f "$dir/fresh/step-00000003/manifest.json"
echo "gpt_checkpoint layouts: all checks passed"
