#!/usr/bin/env bash
# One rank leaves a 2-rank job early; the whole job must end promptly (See Note [Leaving the job]
# in collectives/termination.cpp): every process of the job gone within 10 s of the leaving,
# mpirun's exit status non-zero, and a message naming the cause. `clean` checks that a normal
# exit still finalises and exits 0.
# Usage: leave.sh CASE PYTHON LEAVE_CPP LOOM_GPT LOOM_DLRM MPIEXEC [mpirun flags...]
# CASE: gpt_metrics dlrm_metrics cpp_return1 cpp_sigint py_raise py_exit3 py_sigint py_sigterm
#       py_exit0 clean
set -u
case_=$1 python=$2 leave_cpp=$3 gpt=$4 dlrm=$5 mpiexec=$6
shift 6
here=$(cd "$(dirname "$0")" && pwd)
tag="loom-leave-$$-$RANDOM"  # marks this job's processes (tests may run side by side)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pidfile=$work/rank1.pid
limit=10      # seconds from the leaving to the last process gone
signal=""     # signal cases: what the test sends rank 1
marker=""     # other cases: the output line that shows rank 1 leaving (the clock starts there)
expect_status=nonzero
export LOOM_COMM_TIMEOUT=${LOOM_COMM_TIMEOUT:-120}  # a hang would show as a timeout, not pass
case $case_ in
  gpt_metrics)
    cmd=("$gpt" --steps 3 --layers 1 --dim 16 --heads 2 --metrics-file "/nonexistent/$tag/x")
    expect=("loom-gpt: --metrics-file '/nonexistent/$tag/x': directory '/nonexistent/$tag' does not exist")
    expect_count=2 marker="does not exist" ;;  # both ranks say it
  dlrm_metrics)
    cmd=("$dlrm" --steps 3 --metrics-file "/nonexistent/$tag/x")
    expect=("loom-dlrm: --metrics-file '/nonexistent/$tag/x': directory '/nonexistent/$tag' does not exist")
    expect_count=2 marker="does not exist" ;;
  cpp_return1)
    cmd=("$leave_cpp" return1 "$tag") marker="leave_cpp: error:"
    expect=("leave_cpp: rank 1 fails a check on purpose"
            "[rank 1] loom: aborting the job (exit status 1)") ;;
  cpp_sigint)
    cmd=("$leave_cpp" signal "$tag" "$pidfile") signal=INT
    expect=("[rank 1] loom: interrupted (SIGINT)") ;;
  py_raise)
    cmd=("$python" "$here/leave.py" raise "$tag") marker="rank 1 leaves"
    expect=("RuntimeError: rank 1 fails on purpose"
            "[rank 1] loom: aborting the job (exit status 1): uncaught RuntimeError") ;;
  py_exit3)
    cmd=("$python" "$here/leave.py" exit3 "$tag") marker="rank 1 leaves"
    expect=("[rank 1] loom: aborting the job (exit status 3): this rank is exiting with status 3") ;;
  py_sigint)
    cmd=("$python" "$here/leave.py" signal "$tag" "$pidfile") signal=INT
    expect=("KeyboardInterrupt" "[rank 1] loom: aborting the job (exit status 130): uncaught KeyboardInterrupt") ;;
  py_sigterm)
    cmd=("$python" "$here/leave.py" signal "$tag" "$pidfile") signal=TERM
    expect=("[rank 1] loom: terminated") ;;
  py_exit0)
    # A clean exit on one rank while the other still expects it: both wait out the collective
    # deadline (3 s here), then the job ends with messages naming it.
    export LOOM_COMM_TIMEOUT=3
    limit=$((3 + 10))
    cmd=("$python" "$here/leave.py" exit0 "$tag") marker="rank 1 leaves"
    expect=("LOOM_COMM_TIMEOUT") ;;
  clean)
    cmd=("$python" "$here/leave.py" clean "$tag")
    expect=("rank 0: done" "rank 1: done") expect_status=0
    limit=45 ;;  # from the start: it must simply finish, and exit 0
  *) echo "unknown case $case_"; exit 2 ;;
esac

fail() { echo "$out"; echo "FAIL ($case_): $*"; exit 1; }
now() { date +%s.%N; }
: >"$work/out"
start=$(now)
timeout -k 5 60 "$mpiexec" -np 2 "$@" "${cmd[@]}" >"$work/out" 2>&1 &
job=$!
if [ -n "$signal" ]; then
  for _ in $(seq 100); do [ -s "$pidfile" ] && break; sleep 0.1; done
  out=$(cat "$work/out")
  [ -s "$pidfile" ] || fail "rank 1 never wrote its pid"
  sleep 0.3  # let both ranks reach the loop
  start=$(now)
  kill -s "$signal" "$(cat "$pidfile")"
elif [ -n "$marker" ]; then
  # Startup (mpirun, Python's imports) is slow on a loaded machine and is not what is measured.
  while ! grep -qF -- "$marker" "$work/out" && kill -0 $job 2>/dev/null; do sleep 0.05; done
  start=$(now)
fi
wait $job
status=$?
# Every process of the job (mpirun and the ranks: their arguments hold the tag) must be gone.
while pgrep -f -- "$tag" >/dev/null && [ "$(echo "$(now) - $start < $limit" | bc)" = 1 ]; do
  sleep 0.1
done
elapsed=$(echo "$(now) - $start" | bc)
out=$(cat "$work/out")
left=$(pgrep -af -- "$tag")
[ -z "$left" ] || { pkill -KILL -f -- "$tag"; fail "processes left after ${limit}s: $left"; }
[ "$status" -ne 124 ] && [ "$status" -ne 137 ] || fail "the job hung (killed by timeout)"
[ "$(echo "$elapsed <= $limit" | bc)" = 1 ] || fail "took ${elapsed}s, more than ${limit}s"
if [ "$expect_status" = 0 ]; then
  [ "$status" -eq 0 ] || fail "exit status $status, expected 0"
  ! grep -q "aborting the job" <<<"$out" || fail "a clean exit aborted the job"
else
  [ "$status" -ne 0 ] || fail "the job exited 0"
fi
for e in "${expect[@]}"; do
  grep -qF -- "$e" <<<"$out" || fail "no message: $e"
done
if [ -n "${expect_count:-}" ]; then
  n=$(grep -cF -- "${expect[0]}" <<<"$out")
  [ "$n" -eq "$expect_count" ] || fail "$n rank(s) said '${expect[0]}', expected $expect_count"
fi
echo "$out"
echo "ok ($case_): exit status $status, every process gone $(printf %.1f "$elapsed") s after the $([ "$case_" = clean ] && echo start || echo leaving)"
