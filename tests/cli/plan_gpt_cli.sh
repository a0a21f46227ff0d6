#!/bin/bash
# loom-gpt --plan auto end to end on one process: it calibrates, prints the chosen layout with its
# prediction, trains with it, and gives the losses of the same run with that layout's flags given
# by hand (--grad-accum from the chosen micro-batch size, --checkpoint-activations for full
# recomputation); a profile file is used instead of calibrating when given.
# usage: plan_gpt_cli.sh LOOM_GPT LOOM_PLAN
set -euo pipefail
gpt=$1; plan=$2
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
fail() { echo "plan_gpt_cli: $*" >&2; exit 1; }
common=(--layers 2 --dim 32 --heads 2 --batch 8 --steps 3 --threads 1 --eval-every 1000
        --lr-schedule constant --warmup-steps 0)

"$gpt" "${common[@]}" --plan auto --metrics-file "$dir/auto.jsonl" | tee "$dir/auto.log"
line=$(grep -m1 '^plan: dp=' "$dir/auto.log") || fail "no plan line"
layout=$(sed -E 's/^plan: ([^:]+):.*/\1/' <<< "$line")
echo "chosen: $layout"
field() { sed -E "s/.*(^|,)$1=([^,]+).*/\2/" <<< "$layout"; }
[[ $(field dp) == 1 && $(field tp) == 1 && $(field pp) == 1 ]] || fail "one process: $layout"
accum=$(( 8 / $(field mb) ))
flags=(--grad-accum "$accum")
[[ $(field recompute) == full ]] && flags+=(--checkpoint-activations)
"$gpt" "${common[@]}" "${flags[@]}" --metrics-file "$dir/manual.jsonl" > "$dir/manual.log"
python3 - "$dir/auto.jsonl" "$dir/manual.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p) if '"loss"' in l] for p in sys.argv[1:])
assert len(a) == 3 and a == b, (a, b)
print("losses equal:", a)
PY

"$plan" --calibrate "$dir/cpu.json" > /dev/null
"$gpt" "${common[@]}" --plan auto --plan-profile "$dir/cpu.json" > "$dir/profile.log"
grep -q '^plan: dp=1' "$dir/profile.log" || fail "no plan with --plan-profile"
echo "plan_gpt_cli: ok"
