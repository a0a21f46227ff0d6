#!/bin/bash
# loom-plan end to end: --evaluate of Korthikanti et al.'s 175B layout predicts their measured
# 13.75 s step (the point the A100 preset is calibrated on) and prints JSON that parses; a Llama
# block predicts torchtitan's published 8B run; a profile
# file overrides the preset (twice the peak, a shorter step); the search ranks fitting plans,
# best first, each with its reason for losing; bad input is refused naming the problem.
# usage: plan_cli.sh LOOM_PLAN
set -euo pipefail
plan=$1
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
fail() { echo "plan_cli: $*" >&2; exit 1; }

gpt3=(--layers 96 --hidden 12288 --heads 96 --seq 2048 --vocab 51200 --global-batch 64 --gpus 64
      --gpu a100-80gb --execution megatron)
layout="tp=8,pp=8,v=3,mb=1,schedule=interleaved,recompute=selective,sp=1"
"$plan" "${gpt3[@]}" --evaluate "$layout" --json > "$dir/eval.json"
"$plan" "${gpt3[@]}" --evaluate "$layout" | tee "$dir/eval.txt"
grep -q "^layout dp=1,tp=8,pp=8,v=3,mb=1,schedule=interleaved,zero=0,recompute=selective,sp=1$" \
  "$dir/eval.txt" || fail "evaluate did not print the layout"
cat > "$dir/profile.json" <<'JSON'
{"device": {"peak_flops": 624e12}}
JSON
"$plan" "${gpt3[@]}" --evaluate "$layout" --json --profile "$dir/profile.json" > "$dir/fast.json"
python3 - "$dir/eval.json" "$dir/fast.json" <<'PY'
import json, sys
p, fast = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert abs(p["step_s"] / 13.75 - 1) < 0.05, f"step {p['step_s']} s, Korthikanti measured 13.75 s"
assert not p["oom"] and p["memory_bytes"]["total"] < 80 * 2**30, p["memory_bytes"]
assert 0 < p["bubble"] < 0.1 and 0.45 < p["mfu"] < 0.56, (p["bubble"], p["mfu"])
assert fast["step_s"] < 0.75 * p["step_s"], (fast["step_s"], p["step_s"])
print(f"175B: {p['step_s']:.2f} s (measured 13.75 s), MFU {100 * p['mfu']:.1f}%; "
      f"with twice the peak {fast['step_s']:.2f} s")
PY

# A Llama block under torchtitan's execution: its published Llama 3 8B run on 64 A100s (FSDP2,
# op-level selective recomputation, 2973 tokens/s per GPU), predicted from the A100 preset.
llama3_8b=(--block llama --layers 32 --hidden 4096 --heads 32 --kv-heads 8 --ffn-hidden 14336
           --seq 8192 --vocab 128256 --global-batch 64 --gpus 64 --gpu a100-80gb)
"$plan" "${llama3_8b[@]}" --execution torchtitan --evaluate "zero=3,recompute=selective" --json \
  > "$dir/llama.json"
python3 - "$dir/llama.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
per_gpu = p["tokens_per_s"] / 64
assert abs(per_gpu / 2973 - 1) < 0.10, f"{per_gpu:.0f} tokens/s per GPU, torchtitan measured 2973"
print(f"Llama 3 8B, FSDP on 64 A100s: {per_gpu:.0f} tokens/s per GPU (measured 2973)")
PY

# A search small enough to be quick: ranked, fitting, best first.
"$plan" --layers 24 --hidden 2048 --heads 16 --global-batch 128 --gpus 16 --top 4 --json \
  > "$dir/search.json"
"$plan" --layers 24 --hidden 2048 --heads 16 --global-batch 128 --gpus 16 --top 3 | tee "$dir/search.txt"
grep -q "^best: dp=" "$dir/search.txt" || fail "no best plan"
[[ $(grep -c "slower by +" "$dir/search.txt") == 2 ]] || fail "expected 2 runners-up with reasons"
python3 - "$dir/search.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
steps = [p["step_s"] for p in r["plans"]]
assert len(steps) == 4 and steps == sorted(steps), steps
assert all(not p["oom"] for p in r["plans"])
assert r["candidates"] > r["invalid"] + r["oom"] and r["simulated"] >= 4, r
PY

expect() {  # pattern, then the command
  local pattern=$1; shift
  if out=$("$@" 2>&1); then fail "accepted: $* ($out)"; fi
  grep -qE -- "$pattern" <<< "$out" || fail "expected /$pattern/ from: $*; got: $out"
}
expect "--layers is required" "$plan" --hidden 64 --heads 4 --global-batch 8 --gpus 8
expect "unknown GPU 'tpu'" "$plan" "${gpt3[@]}" --gpu tpu
expect "unknown layout key 'pq'" "$plan" "${gpt3[@]}" --evaluate "pq=2"
expect "invalid: tp 7 does not divide|not the 64 GPUs" "$plan" "${gpt3[@]}" --evaluate "tp=7,pp=1"
expect "cannot open the profile" "$plan" "${gpt3[@]}" --profile "$dir/none.json"
expect "heads \(5\) must divide hidden \(64\)" "$plan" --layers 2 --hidden 64 --heads 5 \
  --global-batch 8 --gpus 8
expect "kv_heads \(5\) must divide heads \(32\)" "$plan" "${llama3_8b[@]}" --kv-heads 5
expect "block.*mamba|mamba.*block" "$plan" "${llama3_8b[@]}" --block mamba
echo "plan_cli: ok"
