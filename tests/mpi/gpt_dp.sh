#!/bin/bash
# loom-gpt under mpirun against loom-gpt on one process (the equivalence principle, end to end):
# the same flags with --dp 2 and every ZeRO stage, with and without gradient accumulation, must
# print the same per-step losses (from --metrics-file) within 1e-5 relative, and ZeRO-3, whose
# ranks hold 1/2 of the parameters each, must --save the single-process final weights; bf16 and
# f16 runs agree with one process in their dtype.
# usage: gpt_dp.sh LOOM_GPT MPIEXEC [mpirun flags...]
set -euo pipefail
gpt=$1; mpiexec=$2; shift 2
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
for zero in 0 1 2 3; do
  for accum in 1 2; do
    name="dp2_zero${zero}_accum${accum}"
    "$mpiexec" -np 2 "$@" "$gpt" "${common[@]}" --dp 2 --zero "$zero" --grad-accum "$accum" \
      --bucket-mb 0.01 --metrics-file "$dir/$name.jsonl" > "$dir/$name.log"
    compare "$name" "$dir/$name.jsonl"
  done
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

# The weights. With SGD: Adam divides the rounding noise of a gradient that is zero in exact
# arithmetic (the key third of attn.qkv.bias, See tests/mpi/dp_reference.h) by sqrt(v) + 1e-8 and
# turns it into visible differences; SGD compares every parameter at 1e-5.
# safetensors is an 8-byte header length, a JSON header, then the raw data.
sgd=(--optimizer sgd --momentum 0.9 --lr 0.1)
"$gpt" "${common[@]}" "${sgd[@]}" --save "$dir/single.safetensors" > "$dir/single_save.log"
"$mpiexec" -np 2 "$@" "$gpt" "${common[@]}" "${sgd[@]}" --dp 2 --zero 3 \
  --save "$dir/zero3.safetensors" > "$dir/zero3_save.log"
python3 - "$dir/single.safetensors" "$dir/zero3.safetensors" <<'PY'
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
assert want.keys() == got.keys(), f"tensor names differ: {sorted(want.keys() ^ got.keys())}"
for k in want:
    assert len(got[k]) == len(want[k]), f"{k}: {len(got[k])} values vs {len(want[k])}"
    scale = max(max(abs(w) for w in want[k]), 1e-30)
    err = max(abs(g - w) for g, w in zip(got[k], want[k]))
    assert err <= 1e-5 * scale, f"{k}: max difference {err} vs max |value| {scale}"
print(f"dp2_zero3 --save: {len(want)} tensors match the single-process weights")
PY
