#!/bin/bash
# loom-gpt under mpirun against loom-gpt on one process (the equivalence principle, end to end):
# the same flags with --dp 2 and every ZeRO stage, with and without gradient accumulation, must
# print the same per-step losses (from --metrics-file) within 1e-5 relative, and ZeRO-3, whose
# ranks hold 1/2 of the parameters each, must --save the single-process final weights; bf16 and
# f16 runs agree with one process in their dtype.
# Tensor parallelism: --tp 2 (with and without --sequence-parallel, whose runs use --data text so
# the sequence divides) and --dp 2 x --tp 2 with ZeRO-1 on 4 ranks give the single-process losses;
# --tp 2 --save writes the single-process weights, and a single-process checkpoint evaluates the
# same under --tp 2 --init-from.
# Pipelines: every schedule on --pp 2 (4 blocks, 4 micro-batches), --dp 2 x --pp 2, and every
# schedule in 3D (--dp 2 --tp 2 --pp 2, 8 ranks) give the single-process losses of the same
# 4-block model; with dropout, 3D with sequence parallelism, --pp 2 and --dp 2 with gradient
# accumulation give the single-process losses too. Mixture-of-experts models: dp x ep x tp with
# and without gradient accumulation, and in pipelines (See the MoE sections below).
# usage: gpt_parallel.sh LOOM_GPT MPIEXEC [mpirun flags...]
set -euo pipefail
gpt=$1; mpiexec=$2; shift 2
mpi_flags=("$@")
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
common=(--steps 6 --batch 16 --layers 2 --dim 32 --heads 2 --eval-every 1000 --threads 1
        --lr 1e-3 --warmup-steps 0)

"$gpt" "${common[@]}" --metrics-file "$dir/single.jsonl" > "$dir/single.log"
compare() {  # name file [reference], within $TOLERANCE relative (default 1e-5)
  python3 - "${3:-$dir/single.jsonl}" "$2" "$1" "${TOLERANCE:-1e-5}" <<'PY'
import json, sys
want = [json.loads(l)["loss"] for l in open(sys.argv[1]) if '"loss"' in l]
got = [json.loads(l)["loss"] for l in open(sys.argv[2]) if '"loss"' in l]
name, tolerance = sys.argv[3], float(sys.argv[4])
assert len(got) == len(want) == 6, f"{name}: {len(got)} steps, expected {len(want)}"
for s, (g, w) in enumerate(zip(got, want)):
    assert abs(g - w) <= tolerance * abs(w), f"{name}: step {s + 1} loss {g} vs single-process {w}"
print(f"{name}: {len(got)} losses match the single-process run")
PY
}
# compare_weights NAME FILE: FILE's tensors equal the single-process weights within 1e-5 of each
# tensor's scale (safetensors: an 8-byte header length, a JSON header, then the raw data).
compare_weights() {  # name, file[, reference (default: the single-process SGD weights)]
  python3 - "${3:-$dir/single.safetensors}" "$2" "$1" <<'PY'
import array, json, struct, sys
def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    data = raw[8 + n:]
    assert all(v["dtype"] == "F32" for v in header.values()), f"{path}: not all F32"
    return {k: array.array("f", data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items()}
want, got = load(sys.argv[1]), load(sys.argv[2])
name = sys.argv[3]
assert want.keys() == got.keys(), f"{name}: tensor names differ: {sorted(want.keys() ^ got.keys())}"
for k in want:
    assert len(got[k]) == len(want[k]), f"{name} {k}: {len(got[k])} values vs {len(want[k])}"
    scale = max(max(abs(w) for w in want[k]), 1e-30)
    err = max(abs(g - w) for g, w in zip(got[k], want[k]))
    assert err <= 1e-5 * scale, f"{name} {k}: max difference {err} vs max |value| {scale}"
print(f"{name}: {len(want)} tensors match the single-process weights")
PY
}
compare_loads() {  # name file reference: the same per-expert loads (MoE) at every step
  python3 - "$3" "$2" "$1" <<'PY'
import json, sys
load = lambda p: [json.loads(l)["moe_load"] for l in open(p) if '"moe_load"' in l]
want, got = load(sys.argv[1]), load(sys.argv[2])
assert want and got == want, f"{sys.argv[3]}: per-expert loads {got} vs {want}"
print(f"{sys.argv[3]}: per-expert loads equal the single-process run's")
PY
}
# moe_layout REFERENCE SUFFIX "NP FLAGS..." MODEL_FLAGS...: loom-gpt with MODEL_FLAGS and FLAGS on
# NP ranks gives REFERENCE's losses and per-expert loads.
moe_layout() {
  local reference=$1 suffix=$2 np rest name
  local -a lflags
  read -r np rest <<< "$3"
  shift 3
  read -r -a lflags <<< "$rest"
  name="moe_$(printf '%s' "$rest" | tr -d '-' | tr ' ' '_')$suffix"
  "$mpiexec" -np "$np" "${mpi_flags[@]}" "$gpt" "$@" "${lflags[@]}" \
    --metrics-file "$dir/$name.jsonl" > "$dir/$name.log"
  compare "$name" "$dir/$name.jsonl" "$reference"
  compare_loads "$name" "$dir/$name.jsonl" "$reference"
}
# check_waits NAME FILE: each step's row carries rank 0's wait for the gradient reductions and the
# least wait over the data-parallel ranks, which cannot exceed rank 0's (reduced in f32: to its
# rounding).
check_waits() {
  python3 - "$2" "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"step_ms"' in l]
for r in rows:
    w, least = r["comm_wait_ms"], r["comm_wait_least_ms"]
    assert 0 <= least <= w * (1 + 1e-6), f"{sys.argv[2]}: step {r['step']}: least wait {least} ms, rank 0's {w} ms"
print(f"{sys.argv[2]}: {len(rows)} steps carry comm_wait_ms >= comm_wait_least_ms >= 0")
PY
}
for zero in 0 1 2 3; do
  for accum in 1 2; do
    name="dp2_zero${zero}_accum${accum}"
    "$mpiexec" -np 2 "$@" "$gpt" "${common[@]}" --dp 2 --zero "$zero" --grad-accum "$accum" \
      --bucket-mb 0.01 --metrics-file "$dir/$name.jsonl" > "$dir/$name.log"
    compare "$name" "$dir/$name.jsonl"
    check_waits "$name" "$dir/$name.jsonl"
  done
done

# Hybrid sharding (--zero-shard-group): 4 dp ranks in shard groups of 2, replicated across the
# two groups (on the emulated cluster, tests/cluster/run.sh, also by node): the single-process
# losses at every stage; shard groups that do not fit are refused. Across nodes, also every dp
# collective in two levels (LOOM_COLL_ALGO=hier and auto).
for zero in 1 2 3; do
  name="dp4_zero${zero}_shard2"
  "$mpiexec" -np 4 "$@" "$gpt" "${common[@]}" --dp 4 --zero "$zero" --zero-shard-group 2 \
    --bucket-mb 0.01 --metrics-file "$dir/$name.jsonl" > "$dir/$name.log"
  grep -q "sharded over groups of 2 dp ranks" "$dir/$name.log"
  compare "$name" "$dir/$name.jsonl"
done
nodes=${LOOM_TEST_NODES:-1}
if [ "$nodes" -gt 1 ]; then  # the ranks span nodes: 2 per node, sharded by node
  np=$((2 * nodes))
  "$mpiexec" -np "$np" "$@" "$gpt" "${common[@]}" --dp "$np" --zero 2 --zero-shard-group node \
    --metrics-file "$dir/zero2_node.jsonl" > "$dir/zero2_node.log"
  grep -q "sharded over groups of 2 dp ranks" "$dir/zero2_node.log"
  compare "dp${np}_zero2_by_node" "$dir/zero2_node.jsonl"
  # Every dp collective in two levels (LOOM_COLL_ALGO=hier), and auto's per-call choice: DDP
  # and ZeRO-3 give the single-process losses (the sums associate node first: within 1e-5).
  for algo in hier auto; do
    for zero in 0 3; do
      name="dp${np}_zero${zero}_$algo"
      LOOM_COLL_ALGO=$algo "$mpiexec" -np "$np" "$@" "$gpt" "${common[@]}" --dp "$np" \
        --zero "$zero" --bucket-mb 0.01 --metrics-file "$dir/$name.jsonl" > "$dir/$name.log"
      grep -q "collectives of group 'dp\[pp 0, tp 0\]': $algo over $nodes node(s) x 2 rank(s)" \
        "$dir/$name.log" || { cat "$dir/$name.log"; exit 1; }
      compare "$name" "$dir/$name.jsonl"
    done
  done
fi
for bad in "3:shard groups of 3 do not divide the 4 ranks" "4:two or more shard groups"; do
  if "$mpiexec" -np 4 "$@" "$gpt" "${common[@]}" --dp 4 --zero 1 --zero-shard-group "${bad%%:*}" \
      > "$dir/bad.log" 2>&1; then
    echo "--zero-shard-group ${bad%%:*} on --dp 4 was accepted"; exit 1
  fi
  grep -q "${bad#*:}" "$dir/bad.log" || { cat "$dir/bad.log"; exit 1; }
done
echo "hybrid sharding: every stage gives the single-process losses; bad shard groups refused"

# Mixture of experts with expert parallelism: the experts split over groups of --ep dp ranks
# (replicated across the groups when --ep < --dp), tokens exchanged by all-to-all; dropless
# top-2 with experts 48 wide (--moe-hidden), and top-1 with capacity and dropout, on dp 2 / 4
# with ep 2 / 4 / 1, with tp 2 (the experts whole on each tp rank) alone, with dp 2 x ep 2 and
# dp 2 x ep 1, with gradient accumulation (one process, dp 2 x ep 2, dp 2 x ep 2 x tp 2), and
# with each expert split over tp (--expert-tp 2: tp 2, and dp 2 x ep 2 x tp 2 with
# accumulation), and with ZeRO 1 / 2 / 3 (dp 2 x ep 2; dp 4 x ep 2 with accumulation; dp 4 x
# ep 4; dp 2 x tp 2 x ep 2 with experts split over tp; and with the experts' state sharded over
# their replicas: dp 4 x ep 2 at ZeRO-2 with accumulation and ZeRO-3, dp 4 x ep 1 at ZeRO-1)
# give the single-process losses (and the same per-expert loads).
for moe in "--moe-experts 4 --moe-top-k 2 --moe-hidden 48" \
           "--moe-experts 4 --moe-capacity-factor 1.0 --moe-every 2 --dropout 0.1"; do
  read -r -a flags <<< "$moe"
  tag=$(printf '%s' "$moe" | tr -d '-' | tr ' .' '__')
  "$gpt" "${common[@]}" "${flags[@]}" --metrics-file "$dir/moe_$tag.jsonl" > "$dir/moe_$tag.log"
  # ranks:ep:tp[:grad-accum[:expert-tp]] (ep < dp: expert replicas; tp: the dense parts
  # tensor-parallel, experts whole, or split over tp with expert-tp; grad-accum: micro-batches
  # after a routing pass, whose capacity and load-balancing loss are the whole batch's)
  # ranks:ep:tp:grad-accum:expert-tp:zero adds ZeRO (the experts whole, their state sharded over
  # their replicas; the rest sharded over dp).
  for layout in 2:2:1 4:4:1 4:2:1 2:1:1 2:1:2 4:2:2 4:1:2 1:1:1:4 2:2:1:2 4:2:2:2 2:1:2:1:2 \
                4:2:2:2:2 2:2:1:1:1:1 4:2:1:2:1:2 4:4:1:1:1:3 4:2:2:1:2:3 4:2:1:1:1:3 \
                4:1:1:1:1:1; do
    IFS=: read -r np ep tp accum etp zero <<< "$layout"
    dp=$((np / tp)); accum=${accum:-1}; etp=${etp:-1}; zero=${zero:-0}
    name="dp${dp}_ep${ep}_tp${tp}_accum${accum}_etp${etp}_zero${zero}_$tag"
    "$mpiexec" -np "$np" "$@" "$gpt" "${common[@]}" "${flags[@]}" --dp "$dp" --ep "$ep" \
      --tp "$tp" --grad-accum "$accum" --expert-tp "$etp" --zero "$zero" --bucket-mb 0.01 \
      --metrics-file "$dir/$name.jsonl" > "$dir/$name.log"
    compare "$name" "$dir/$name.jsonl" "$dir/moe_$tag.jsonl"
    compare_loads "$name" "$dir/$name.jsonl" "$dir/moe_$tag.jsonl"
  done
  # Activation checkpointing of the MoE blocks (Note [Checkpointed MoE blocks] in core/nn/block_checkpointing.h):
  # one process gives the same losses bit for bit, and dp 2 x ep 2 with gradient accumulation
  # (each micro-batch's recomputation replays its routing and all-to-alls) and at ZeRO-3 the
  # single-process losses and loads.
  "$gpt" "${common[@]}" "${flags[@]}" --checkpoint-activations \
    --metrics-file "$dir/moe_recompute_$tag.jsonl" > "$dir/moe_recompute_$tag.log"
  TOLERANCE=0 compare "moe_recompute_$tag" "$dir/moe_recompute_$tag.jsonl" "$dir/moe_$tag.jsonl"
  for layout in "2 --dp 2 --ep 2 --grad-accum 2 --checkpoint-activations" \
                "2 --dp 2 --ep 2 --zero 3 --checkpoint-activations"; do
    moe_layout "$dir/moe_$tag.jsonl" "_$tag" "$layout" "${common[@]}" "${flags[@]}"
  done
done

# Hybrid sharding with experts: the dense state sharded inside groups of --zero-shard-group dp
# ranks and replicated across them, each expert's state sharded over its replicas (which span the
# groups), its gradients divided by all of dp and the clip's squares summed over both.
moe_hybrid=(--moe-experts 4 --moe-top-k 2 --moe-hidden 48)
tag=$(printf '%s' "${moe_hybrid[*]}" | tr -d '-' | tr ' .' '__')
for layout in "4 --dp 4 --ep 2 --zero 2 --zero-shard-group 2" \
              "4 --dp 4 --ep 1 --zero 3 --zero-shard-group 2" \
              "8 --dp 8 --ep 2 --zero 1 --zero-shard-group 4"; do
  moe_layout "$dir/moe_$tag.jsonl" "" "$layout" "${common[@]}" "${moe_hybrid[@]}"
done

# bf16 and f16 (f32 masters; f16 with loss scaling): dp 2 against one process in the same dtype.
# Each rank's gradient is rounded before the average (See tests/mpi/dp_mixed_precision_test.cpp),
# so the losses agree to 2e-3 relative rather than 1e-5.
for dtype in bf16 f16; do
  "$gpt" "${common[@]}" --dtype "$dtype" --metrics-file "$dir/single_$dtype.jsonl" \
    > "$dir/single_$dtype.log"
  for zero in 0 3; do
    name="dp2_zero${zero}_${dtype}"
    "$mpiexec" -np 2 "$@" "$gpt" "${common[@]}" --dtype "$dtype" --dp 2 --zero "$zero" \
      --metrics-file "$dir/$name.jsonl" > "$dir/$name.log"
    TOLERANCE=2e-3 compare "$name" "$dir/$name.jsonl" "$dir/single_$dtype.jsonl"
  done
done

# A MoE model in bf16 (the router in f32, the experts in bf16, the combine in f32): dp 2 with the
# experts split over ep 2 against one process in bf16, within the same 2e-3.
moe_bf16=(--moe-experts 4 --moe-top-k 2 --dtype bf16)
"$gpt" "${common[@]}" "${moe_bf16[@]}" --metrics-file "$dir/moe_bf16.jsonl" > "$dir/moe_bf16.log"
"$mpiexec" -np 2 "$@" "$gpt" "${common[@]}" "${moe_bf16[@]}" --dp 2 --ep 2 \
  --metrics-file "$dir/dp2_ep2_moe_bf16.jsonl" > "$dir/dp2_ep2_moe_bf16.log"
TOLERANCE=2e-3 compare dp2_ep2_moe_bf16 "$dir/dp2_ep2_moe_bf16.jsonl" "$dir/moe_bf16.jsonl"
# f16 (loss scaling): one process, and dp 2 x ep 2 with ZeRO-2 and under DDP, whose skip
# decisions cover the experts too (each rank's experts' gradients are its own: the ranks agree on
# a skip, or they would step differently), and DDP dp 4 x ep 2 (the experts replicated twice).
# A start of 2^20 (--loss-scale) overflows the first 3 steps' gradients (the scale halves to
# 2^17) and trains the other 3: the dp 2 layouts must skip the same steps. (Each rank's gradient
# is the mean over its own rows, whose largest elements can exceed one process's: fewer rows
# average out less. At dp 4 a rank overflowed at 2^17 where one process did not, as it could
# under PyTorch's DDP, so that layout starts at 2^12, far from any overflow: at the default 2^16
# an emulated-cluster run once overflowed a step one process did not, its reductions summing in
# another order. Neither run may skip a step; the check below says so if one does.)
moe_f16_start=(--moe-experts 4 --moe-top-k 2 --dtype f16 --loss-scale 4096)
"$gpt" "${common[@]}" "${moe_f16_start[@]}" --metrics-file "$dir/moe_f16.jsonl" \
  > "$dir/moe_f16.log"
moe_f16=(--moe-experts 4 --moe-top-k 2 --dtype f16 --loss-scale 1048576)
"$gpt" "${common[@]}" "${moe_f16[@]}" --metrics-file "$dir/moe_f16_skips.jsonl" \
  > "$dir/moe_f16_skips.log"
skips="$(grep -o 'skipped [0-9]* step' "$dir/moe_f16_skips.log")"
[[ "$skips" == "skipped 3 step" ]] ||
  { echo "FAIL: the f16 MoE run should skip 3 of its 6 steps, got '${skips:-none}'"; exit 1; }
for zero in 2 0; do
  name="dp2_ep2_zero${zero}_moe_f16_skips"
  "$mpiexec" -np 2 "$@" "$gpt" "${common[@]}" "${moe_f16[@]}" --dp 2 --ep 2 --zero "$zero" \
    --metrics-file "$dir/$name.jsonl" > "$dir/$name.log"
  TOLERANCE=2e-3 compare "$name" "$dir/$name.jsonl" "$dir/moe_f16_skips.jsonl"
  got="$(grep -o 'skipped [0-9]* step' "$dir/$name.log" | head -n 1)"
  [[ "$got" == "$skips" ]] || { echo "FAIL: $name: '$got', one process '$skips'"; exit 1; }
done
"$mpiexec" -np 4 "$@" "$gpt" "${common[@]}" "${moe_f16_start[@]}" --dp 4 --ep 2 \
  --metrics-file "$dir/dp4_ep2_moe_f16.jsonl" > "$dir/dp4_ep2_moe_f16.log"
for log in moe_f16 dp4_ep2_moe_f16; do
  ! grep -q 'skipped [0-9]* step' "$dir/$log.log" ||
    { echo "FAIL: $log skipped a step at loss scale 2^12: $(grep 'skipped' "$dir/$log.log")"; exit 1; }
done
TOLERANCE=2e-3 compare dp4_ep2_moe_f16 "$dir/dp4_ep2_moe_f16.jsonl" "$dir/moe_f16.jsonl"
for zero in 1 3; do  # ZeRO in bf16: the experts through f32 masters beside the pieces'
  "$mpiexec" -np 2 "$@" "$gpt" "${common[@]}" "${moe_bf16[@]}" --dp 2 --ep 2 --zero "$zero" \
    --metrics-file "$dir/dp2_ep2_zero${zero}_moe_bf16.jsonl" > "$dir/dp2_ep2_zero${zero}_moe_bf16.log"
  TOLERANCE=2e-3 compare "dp2_ep2_zero${zero}_moe_bf16" "$dir/dp2_ep2_zero${zero}_moe_bf16.jsonl" \
    "$dir/moe_bf16.jsonl"
done

# The weights. With SGD: Adam divides the rounding noise of a gradient that is zero in exact
# arithmetic (the key third of attn.qkv.bias, See tests/mpi/dp_reference.h) by sqrt(v) + 1e-8 and
# turns it into visible differences; SGD compares every parameter at 1e-5.
sgd=(--optimizer sgd --momentum 0.9 --lr 0.1)
"$gpt" "${common[@]}" "${sgd[@]}" --save "$dir/single.safetensors" > "$dir/single_save.log"
"$mpiexec" -np 2 "$@" "$gpt" "${common[@]}" "${sgd[@]}" --dp 2 --zero 3 \
  --save "$dir/zero3.safetensors" > "$dir/zero3_save.log"
compare_weights "dp2_zero3 --save" "$dir/zero3.safetensors"

# Tensor parallelism (the losses: AdamW; the weights: SGD, as above).
for flags in "--tp 2" "--dp 2 --tp 2 --zero 1"; do
  np=2
  [[ $flags == *"--dp 2"* ]] && np=4
  name="tp_$(echo "$flags" | tr -d - | tr " " _)"
  "$mpiexec" -np "$np" "$@" "$gpt" "${common[@]}" $flags --metrics-file "$dir/$name.jsonl" \
    > "$dir/$name.log"
  compare "$name" "$dir/$name.jsonl"
done
printf 'the quick brown fox jumps over the lazy dog. %.0s' {1..40} > "$dir/text.txt"
text=(--data "$dir/text.txt" --seq 16 --steps 6 --batch 4 --layers 2 --dim 32 --heads 2
      --threads 1 --lr 1e-3 --warmup-steps 0 --dropout 0.1)
"$gpt" "${text[@]}" --metrics-file "$dir/text_single.jsonl" > "$dir/text_single.log"
"$mpiexec" -np 2 "$@" "$gpt" "${text[@]}" --tp 2 --sequence-parallel \
  --metrics-file "$dir/text_sp.jsonl" > "$dir/text_sp.log"
compare "tp2_sequence_parallel_dropout" "$dir/text_sp.jsonl" "$dir/text_single.jsonl"
# MoE under sequence parallelism: each MoE block takes the whole sequence (gathered over tp,
# computed alike on every tp rank), so capacity and the auxiliary losses are one process's:
# tp 2, dp 2 x tp 2 x ep 2 (experts whole and split over tp) and dp 2 x tp 2 x ep 2 x pp 2, all
# sequence-parallel, with dropout.
moe_sp=(--moe-experts 4 --moe-top-k 2 --moe-capacity-factor 1.0)
"$gpt" "${text[@]}" "${moe_sp[@]}" --metrics-file "$dir/text_moe.jsonl" > "$dir/text_moe.log"
for layout in "2 --tp 2" "4 --dp 2 --tp 2 --ep 2" "4 --dp 2 --tp 2 --ep 2 --expert-tp 2" \
              "8 --dp 2 --tp 2 --ep 2 --pp 2 --microbatches 2"; do
  read -r np rest <<< "$layout"
  read -r -a lflags <<< "$rest"
  name="moe_sp_$(printf '%s' "$rest" | tr -d '-' | tr ' ' '_')"
  "$mpiexec" -np "$np" "$@" "$gpt" "${text[@]}" "${moe_sp[@]}" "${lflags[@]}" --sequence-parallel \
    --metrics-file "$dir/$name.jsonl" > "$dir/$name.log"
  compare "$name" "$dir/$name.jsonl" "$dir/text_moe.jsonl"
  compare_loads "$name" "$dir/$name.jsonl" "$dir/text_moe.jsonl"
done

"$mpiexec" -np 2 "$@" "$gpt" "${common[@]}" "${sgd[@]}" --tp 2 \
  --save "$dir/tp2.safetensors" > "$dir/tp2_save.log"
compare_weights "tp2 --save" "$dir/tp2.safetensors"
single_eval=$("$gpt" "${common[@]}" --init-from "$dir/single.safetensors" --eval-only | grep val_loss)
tp_eval=$("$mpiexec" -np 2 "$@" "$gpt" "${common[@]}" --init-from "$dir/single.safetensors" \
  --tp 2 --eval-only | grep val_loss)
python3 - "$single_eval" "$tp_eval" <<'PY'
import sys
a, b = float(sys.argv[1].split()[1]), float(sys.argv[2].split()[1])
assert abs(a - b) <= 1e-5 * abs(a), f"--tp 2 --init-from: val_loss {b} vs single-process {a}"
print(f"tp2 --init-from: val_loss {b} matches the single-process {a}")
PY

# MoE weights: --save writes the experts as h.{i}.mlp.router.weight and
# h.{i}.mlp.experts.{e}.c_fc / c_proj (Conv1D layout) with moe_* metadata; dp 2 x tp 2 x ep 2
# gathers each expert from its holder and saves the single-process weights, and --init-from
# loads the file on one process and on dp 4 x ep 2 with the same held-out loss.
moe_w=(--moe-experts 4 --moe-top-k 2 --moe-every 2 --moe-hidden 48)
"$gpt" "${common[@]}" "${sgd[@]}" "${moe_w[@]}" --save "$dir/moe_single.safetensors" \
  > "$dir/moe_single_save.log"
"$mpiexec" -np 4 "$@" "$gpt" "${common[@]}" "${sgd[@]}" "${moe_w[@]}" --dp 2 --tp 2 --ep 2 \
  --save "$dir/moe_ep.safetensors" > "$dir/moe_ep_save.log"
compare_weights "dp2_tp2_ep2 MoE --save" "$dir/moe_ep.safetensors" "$dir/moe_single.safetensors"
"$mpiexec" -np 4 "$@" "$gpt" "${common[@]}" "${sgd[@]}" "${moe_w[@]}" --dp 2 --tp 2 --ep 2 \
  --expert-tp 2 --save "$dir/moe_etp.safetensors" > "$dir/moe_etp_save.log"
compare_weights "dp2_tp2_ep2 --expert-tp 2 MoE --save" "$dir/moe_etp.safetensors" \
  "$dir/moe_single.safetensors"
"$mpiexec" -np 4 "$@" "$gpt" "${common[@]}" "${sgd[@]}" "${moe_w[@]}" --dp 4 --ep 2 --zero 3 \
  --save "$dir/moe_zero3.safetensors" > "$dir/moe_zero3_save.log"
compare_weights "dp4_ep2_zero3 MoE --save" "$dir/moe_zero3.safetensors" \
  "$dir/moe_single.safetensors"
moe_one=$("$gpt" "${common[@]}" "${moe_w[@]}" --init-from "$dir/moe_single.safetensors" \
  --eval-only | grep val_loss)
moe_ep=$("$mpiexec" -np 4 "$@" "$gpt" "${common[@]}" "${moe_w[@]}" --dp 4 --ep 2 \
  --init-from "$dir/moe_single.safetensors" --eval-only | grep val_loss)
[ "$moe_one" = "$moe_ep" ] || { echo "MoE --init-from on dp 4 x ep 2: $moe_ep vs $moe_one"; exit 1; }
echo "MoE --init-from on dp 4 x ep 2: $moe_ep, as on one process"

# Pipelines.
deep=(--steps 6 --batch 16 --layers 4 --dim 32 --heads 2 --eval-every 1000 --threads 1 --lr 1e-3
      --warmup-steps 0)
"$gpt" "${deep[@]}" --metrics-file "$dir/deep.jsonl" > "$dir/deep.log"
for schedule in gpipe 1f1b interleaved chimera; do
  v=1
  [[ $schedule == interleaved ]] && v=2
  "$mpiexec" -np 2 "$@" "$gpt" "${deep[@]}" --pp 2 --schedule "$schedule" --virtual-stages "$v" \
    --microbatches 4 --metrics-file "$dir/pp_$schedule.jsonl" > "$dir/pp_$schedule.log"
  compare "pp2_$schedule" "$dir/pp_$schedule.jsonl" "$dir/deep.jsonl"
done
"$mpiexec" -np 4 "$@" "$gpt" "${deep[@]}" --dp 2 --pp 2 --microbatches 2 \
  --metrics-file "$dir/dp_pp.jsonl" > "$dir/dp_pp.log"
compare "dp2_pp2_1f1b" "$dir/dp_pp.jsonl" "$dir/deep.jsonl"
# Hybrid-sharded ZeRO-1 in a pipeline: 4 dp ranks in shard groups of 2 on each of 2 stages.
"$mpiexec" -np 8 "$@" "$gpt" "${deep[@]}" --dp 4 --pp 2 --microbatches 2 --zero 1 \
  --zero-shard-group 2 --metrics-file "$dir/dp_pp_hybrid.jsonl" > "$dir/dp_pp_hybrid.log"
grep -q "sharded over groups of 2 dp ranks" "$dir/dp_pp_hybrid.log"
compare "dp4_pp2_zero1_shard2" "$dir/dp_pp_hybrid.jsonl" "$dir/deep.jsonl"
# 3D: dp 2 x tp 2 x pp 2 on 8 ranks, every schedule, with and without ZeRO-1.
for zero in 0 1; do
  for schedule in gpipe 1f1b interleaved chimera; do
    v=1
    [[ $schedule == interleaved ]] && v=2
    name="dp2_tp2_pp2_${schedule}_zero$zero"
    "$mpiexec" -np 8 "$@" "$gpt" "${deep[@]}" --dp 2 --tp 2 --pp 2 --zero "$zero" \
      --schedule "$schedule" --virtual-stages "$v" --microbatches 2 \
      --metrics-file "$dir/$name.jsonl" > "$dir/$name.log"
    compare "$name" "$dir/$name.jsonl" "$dir/deep.jsonl"
  done
done
# MoE in pipelines: each MoE layer takes the step's micro-batches in order after a routing pass
# through the pipeline without gradients, so capacity and the load-balancing loss are the whole
# batch's. Top-1 with capacity and dropout (blocks 0 and 2 MoE) on --pp 2 with gpipe, 1f1b and
# interleaved, on --pp 4, with --dp 2 --ep 2, and with --dp 2 --tp 2 --ep 2 (8 ranks; with ZeRO-1
# too); dropless top-2 on --dp 2 --ep 2 --pp 2, and with Chimera (each MoE layer's two replicas
# add up their routing pass's counts) on pp 2 and dp 2 x ep 2 x pp 2; ZeRO-1 (the experts beside
# the dense shards, their state sharded over their replicas) on dp 2 x ep 2 x pp 2 with 1f1b and
# Chimera and dp 4 x ep 2 x pp 2: the single-process losses and per-expert loads.
# --save on dp 2 x tp 2 x pp 2 x ep 2 gathers every expert: the single-process SGD weights.
# Chimera with capacity: the routing pass runs every micro-batch through pipeline 0, whose MoE
# layers see the whole batch in order and drop what one process drops, and each replica takes its
# micro-batches' places in the experts' queues from those counts: pp 2, dp 2 x ep 2 x pp 2 and
# pp 4, with dropout, and without the load-balancing loss (the pass then runs for the places).
for moe in "--moe-experts 4 --moe-capacity-factor 1.0 --moe-every 2 --dropout 0.1" \
           "--moe-experts 4 --moe-top-k 2 --moe-hidden 48"; do
  read -r -a flags <<< "$moe"
  tag=$(printf '%s' "$moe" | tr -d '-' | tr ' .' '__')
  "$gpt" "${deep[@]}" "${flags[@]}" --metrics-file "$dir/deep_$tag.jsonl" > "$dir/deep_$tag.log"
  layouts=("4 --pp 2 --dp 2 --ep 2 --microbatches 2"
    "4 --pp 2 --dp 2 --ep 2 --zero 1 --microbatches 2")
  [[ $moe == *top-k* ]] && layouts+=("2 --pp 2 --schedule chimera --microbatches 4"
    "4 --pp 2 --dp 2 --ep 2 --schedule chimera --microbatches 2"
    "4 --pp 2 --dp 2 --ep 2 --schedule chimera --zero 1 --microbatches 2"
    "8 --pp 2 --dp 4 --ep 2 --zero 1 --microbatches 2")
  [[ $moe == *capacity* ]] && layouts+=("2 --pp 2 --schedule gpipe --microbatches 4"
    "2 --pp 2 --schedule 1f1b --microbatches 4"
    "2 --pp 2 --schedule interleaved --virtual-stages 2 --microbatches 4"
    "4 --pp 4 --schedule 1f1b --microbatches 4"
    "8 --pp 2 --dp 2 --tp 2 --ep 2 --microbatches 2"
    "8 --pp 2 --dp 2 --tp 2 --ep 2 --expert-tp 2 --microbatches 2"
    "8 --pp 2 --dp 2 --tp 2 --ep 2 --zero 1 --microbatches 2"
    "2 --pp 2 --schedule chimera --microbatches 4"
    "4 --pp 2 --dp 2 --ep 2 --schedule chimera --microbatches 2"
    "4 --pp 4 --schedule chimera --microbatches 8")
  for layout in "${layouts[@]}"; do
    moe_layout "$dir/deep_$tag.jsonl" "_$tag" "$layout" "${deep[@]}" "${flags[@]}"
  done
done
moe_pp=(--moe-experts 4 --moe-top-k 2 --moe-every 2 --moe-hidden 48)
"$gpt" "${deep[@]}" "${sgd[@]}" "${moe_pp[@]}" --save "$dir/moe_deep.safetensors" \
  > "$dir/moe_deep_save.log"
"$mpiexec" -np 8 "$@" "$gpt" "${deep[@]}" "${sgd[@]}" "${moe_pp[@]}" --dp 2 --tp 2 --pp 2 --ep 2 \
  --microbatches 2 --save "$dir/moe_pp.safetensors" > "$dir/moe_pp_save.log"
compare_weights "dp2_tp2_pp2_ep2 MoE --save" "$dir/moe_pp.safetensors" "$dir/moe_deep.safetensors"

capacity=(--moe-experts 4 --moe-capacity-factor 1.0 --moe-every 2 --moe-aux-loss 0)
"$gpt" "${deep[@]}" "${capacity[@]}" --metrics-file "$dir/deep_capacity_noaux.jsonl" \
  > "$dir/deep_capacity_noaux.log"
"$mpiexec" -np 2 "$@" "$gpt" "${deep[@]}" "${capacity[@]}" --pp 2 --schedule chimera \
  --microbatches 4 --metrics-file "$dir/chimera_capacity_noaux.jsonl" > "$dir/chimera_capacity_noaux.log"
compare chimera_capacity_noaux "$dir/chimera_capacity_noaux.jsonl" "$dir/deep_capacity_noaux.jsonl"
compare_loads chimera_capacity_noaux "$dir/chimera_capacity_noaux.jsonl" \
  "$dir/deep_capacity_noaux.jsonl"

# ... and with dropout: dp ranks and micro-batches draw the masks of their rows' places in the
# step's batch (See Note [Dropout keys]), so every split gives the single-process losses. 3D with
# sequence parallelism (text data: the sequence divides by tp), --pp 2 alone, and --dp 2 with
# gradient accumulation.
"$mpiexec" -np 8 "$@" "$gpt" "${text[@]}" --dp 2 --tp 2 --pp 2 --sequence-parallel \
  --metrics-file "$dir/text_3d.jsonl" > "$dir/text_3d.log"
compare "dp2_tp2_pp2_sequence_parallel_dropout" "$dir/text_3d.jsonl" "$dir/text_single.jsonl"
"$mpiexec" -np 2 "$@" "$gpt" "${text[@]}" --pp 2 --microbatches 4 \
  --metrics-file "$dir/text_pp.jsonl" > "$dir/text_pp.log"
compare "pp2_1f1b_dropout" "$dir/text_pp.jsonl" "$dir/text_single.jsonl"
"$mpiexec" -np 2 "$@" "$gpt" "${text[@]}" --dp 2 --grad-accum 2 \
  --metrics-file "$dir/text_dp.jsonl" > "$dir/text_dp.log"
compare "dp2_accum2_dropout" "$dir/text_dp.jsonl" "$dir/text_single.jsonl"

# The timeline: a Chrome trace with one track per pipeline rank, each with every micro-batch's
# forward and backward per step, and the measured bubble printed.
"$mpiexec" -np 2 "$@" "$gpt" "${deep[@]}" --pp 2 --microbatches 4 --trace "$dir/trace.json" \
  > "$dir/trace.log"
grep -q "pipeline bubble of the last step, measured" "$dir/trace.log"
python3 - "$dir/trace.json" <<'PY'
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
tracks = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
assert tracks == {0: "pipeline rank 0", 1: "pipeline rank 1"}, tracks
spans = [e for e in events if e["ph"] == "X"]
for rank in (0, 1):
    for cat in ("forward", "backward"):
        n = sum(1 for e in spans if e["tid"] == rank and e["cat"] == cat)
        assert n == 6 * 4, f"rank {rank}: {n} {cat} spans, expected 6 steps x 4 micro-batches"
assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
print(f"trace: {len(spans)} spans on 2 tracks")
PY
