#!/usr/bin/env bash
# A benchmark binary's flags: `--help` prints its usage and exits 0 (before MPI starts, so no
# mpirun is needed); an unknown flag exits non-zero naming it. Usage: bench_flags.sh BINARY...
set -u
status=0
for bin in "$@"; do
  name=$(basename "$bin")
  out=$("$bin" --help 2>&1)
  rc=$?
  if [ "$rc" -ne 0 ] || ! grep -q "^usage: .*$name" <<<"$out"; then
    echo "FAIL: $name --help exited $rc without its usage line:"
    echo "$out"
    status=1
  else
    echo "ok: $name --help"
  fi
  out=$("$bin" --no-such-flag 1 2>&1)
  rc=$?
  if [ "$rc" -eq 0 ] || [ "$rc" -ge 128 ] || ! grep -q -- "--no-such-flag" <<<"$out"; then
    echo "FAIL: $name --no-such-flag 1 exited $rc without naming the flag:"
    echo "$out"
    status=1
  else
    echo "ok: $name rejects --no-such-flag"
  fi
done
exit $status
