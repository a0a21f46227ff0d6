#!/usr/bin/env bash
# Runs a command that must fail: exit status non-zero, and stderr containing PATTERN (an
# extended regular expression). Usage: expect_error.sh PATTERN command args...
set -u
pattern=$1
shift
err=$(mktemp)
"$@" >/dev/null 2>"$err"
status=$?
msg=$(cat "$err")
rm -f "$err"
if [ "$status" -eq 0 ]; then
  echo "FAIL: '$*' exited 0; expected an error matching /$pattern/"
  exit 1
fi
if [ "$status" -ge 128 ]; then
  echo "FAIL: '$*' died with signal $((status - 128)) (a crash, not an error message):"
  echo "$msg"
  exit 1
fi
if ! grep -Eq -- "$pattern" <<<"$msg"; then
  echo "FAIL: '$*' exited $status but its message does not match /$pattern/:"
  echo "$msg"
  exit 1
fi
echo "ok: exit $status: $msg"
