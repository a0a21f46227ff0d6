#!/bin/bash
# loom-gpt's schedule tools end to end: --print-schedule writes a file that --schedule-file reads
# back to the same validation; --validate-schedule prints one `rank R bubble F peak_activations A`
# line per rank with the published 1F1B figures; an edited file with an unknown action, a missing
# receive or a deadlock is refused naming the line, rank and action.
# usage: schedule_cli.sh LOOM_GPT
set -euo pipefail
gpt=$1
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
fail() { echo "schedule_cli: $*" >&2; exit 1; }

out=$("$gpt" --pp 4 --layers 4 --microbatches 8 --validate-schedule)
echo "$out"
lines=$(grep -cE '^rank [0-9]+ bubble [0-9.]+ peak_activations [0-9]+$' <<< "$out" || true)
[[ $lines == 4 ]] || fail "expected 4 report lines, got $lines"
# 1F1B, p 4, m 8: bubble 3/11 on every rank; peak activations 4, 3, 2, 1.
for r in 0 1 2 3; do
  grep -qx "rank $r bubble 0.2727 peak_activations $((4 - r))" <<< "$out" || fail "rank $r line"
done

"$gpt" --pp 2 --microbatches 2 --print-schedule > "$dir/s.txt"
from_file=$("$gpt" --pp 2 --schedule-file "$dir/s.txt" --validate-schedule | grep '^rank')
generated=$("$gpt" --pp 2 --microbatches 2 --validate-schedule | grep '^rank')
[[ $from_file == "$generated" ]] || fail "the printed schedule validates differently when loaded"

expect() {  # pattern file
  if err=$("$gpt" --pp 2 --schedule-file "$2" --validate-schedule 2>&1); then
    fail "$2 was accepted"
  fi
  grep -qE "$1" <<< "$err" || fail "expected /$1/ in: $err"
  echo "refused as expected: $(tail -1 <<< "$err")"
}
sed 's/^1 RA 0 0 0$/1 XX 0 0 0/' "$dir/s.txt" > "$dir/unknown.txt"
expect "unknown.txt:[0-9]+: unknown action 'XX'" "$dir/unknown.txt"
grep -v '^1 RA 0 0 0$' "$dir/s.txt" > "$dir/no_recv.txt"
expect "rank 1 action 0 \(F mb 0 chunk 0\) has no input" "$dir/no_recv.txt"
# Rank 0 waits for micro-batch 0's gradient before sending its activation: a deadlock.
awk '/^0 SA 0 0 1$/ {held=$0; next} /^0 RG 0 0 1$/ {print; print held; next} {print}' \
  "$dir/s.txt" > "$dir/deadlock.txt"
expect "deadlocks: rank 0 stalls at action [0-9]+ \(RG mb 0 chunk 0 <- rank 1\)" "$dir/deadlock.txt"
