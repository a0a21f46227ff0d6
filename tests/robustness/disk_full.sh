#!/usr/bin/env bash
# A metrics file on a full disk (issue 18: "write errors are errors"): loom-gpt writes
# --metrics-file on a 16 KiB tmpfs until it is full. The run must stop with exit status 1 and a
# one-line error naming the file, the step and the system's reason, and the file must hold only
# whole rows, each a JSON object, as many as the message says. Needs root (mount); exits 77
# (skipped) when the tmpfs cannot be mounted.
# Usage: disk_full.sh LOOM_GPT
set -u
gpt=$1
dir=$(mktemp -d)
cleanup() { umount "$dir" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
if ! mount -t tmpfs -o size=16k loom-disk-full "$dir" 2>/dev/null; then
  echo "skipped: cannot mount a tmpfs here (needs root)"
  exit 77
fi
metrics=$dir/metrics.jsonl
"$gpt" --steps 2000 --layers 1 --dim 16 --heads 2 --metrics-file "$metrics" >"$dir.out" 2>"$dir.err"
status=$?
fail() { echo "FAIL: $*"; echo "--- stderr:"; cat "$dir.err"; rm -f "$dir.out" "$dir.err"; exit 1; }
[ "$status" -eq 1 ] || fail "exit status $status, expected 1"
grep -q "loom-gpt: error: .*--metrics-file '$metrics': cannot write the row of step [0-9]* ([0-9]* rows written before it): No space left on device" "$dir.err" ||
  fail "no error naming the file, the step and 'No space left on device'"
rows=$(sed -n "s/.*(\([0-9]*\) rows written before it).*/\1/p" "$dir.err" | head -1)
/usr/bin/python3 - "$metrics" "$rows" <<'PY' || fail "the metrics file is not $rows whole JSON rows"
import json, sys
data = open(sys.argv[1], "rb").read()
assert data.endswith(b"\n"), "the last row is cut short"
lines = data.decode().splitlines()
assert len(lines) == int(sys.argv[2]), f"{len(lines)} rows, the message says {sys.argv[2]}"
for line in lines:
    assert isinstance(json.loads(line), dict)
print(f"{len(lines)} whole rows ({len(data)} bytes) before the disk was full")
PY
rm -f "$dir.out" "$dir.err"
echo "PASS: exit 1 with the file, step and reason named; the file holds $rows whole rows"
