#!/usr/bin/env bash
# A rank that dies mid-collective must end the job with a clear error, within the collective
# timeout + 10 s, with nothing left running (issue: "never hang"). Runs tests/mpi/rank_death.cpp
# on 3 ranks; rank 1 dies (MODE kill: SIGKILL; exit: exit status 3) while 0 and 2 wait in an
# allreduce. Usage: rank_death.sh MODE PROGRAM MPIEXEC [mpirun flags...]
set -u
mode=$1 prog=$2 mpiexec=$3
shift 3
timeout_s=5
tag="rank-death-$$-$RANDOM"  # marks this job's processes (tests may run side by side)
start=$(date +%s)
out=$(timeout $((timeout_s + 30)) "$mpiexec" -np 3 "$@" "$prog" "$mode" "$timeout_s" "$tag" 2>&1)
status=$?
elapsed=$(($(date +%s) - start))
echo "$out"
echo "--- mpirun exit status $status after ${elapsed}s"
fail() { echo "FAIL: $*"; exit 1; }
[ "$status" -ne 0 ] || fail "the job exited 0 although rank 1 died"
[ "$status" -ne 124 ] || fail "the job hung (killed by timeout after $((timeout_s + 30))s)"
[ "$elapsed" -le $((timeout_s + 10)) ] || fail "took ${elapsed}s, more than timeout + 10 s"
# Each survivor reports the collective it was waiting in: either the launcher's SIGTERM arrived
# first (loom's termination report) or the deadline passed (loom's timeout error).
for r in 0 2; do
  grep -Eq "\[rank $r\] loom: terminated while waiting for group 'world' \(rank $r of 3\) allreduce #2|\[rank $r\] timed out after" <<<"$out" ||
    fail "rank $r did not report the collective it was waiting in"
done
grep -Eq "rank 1|\[\[[0-9]+,1\],1\]" <<<"$out" || fail "nothing names rank 1 as the one that failed"
sleep 1
left=$(ps -eo stat=,args= | awk -v t="$tag" '$1 !~ /^Z/ && index($0, t) && !/awk -v t=/')
[ -z "$left" ] || fail "processes left running: $left"
echo "ok: rank 1 ${mode}: the job ended in ${elapsed}s with loom's messages, nothing left running"
