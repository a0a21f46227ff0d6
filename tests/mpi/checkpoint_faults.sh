#!/bin/bash
# loom-gpt's checkpoints under faults (the issue's fault proofs; See Note [Durable commit] in
# parallel/checkpoint/durable.h). Every run saves a 1.6M-parameter model (19 MB a checkpoint).
# 1. The whole job SIGKILLed at random moments during saves (LOOM_FAULT_TRIALS, default 20): one
#    process, and every third trial mpirun -np 2 --dp 2 --zero 1 (mpirun and its ranks at once);
#    some trials with --keep-last 3, some with --async-save. Each trial waits for the save of a
#    random step to begin, then sleeps a random delay (seeded and printed; LOOM_FAULT_SEED=S
#    replays the draws, not the machine's timing). After the kill every committed step directory
#    verifies (loom-ckpt verify); --resume continues from the checkpoint `latest` names (never
#    from a step-N.tmp), or from step 0 when none was committed yet; afterwards the metrics file
#    holds each step once with exactly the uninterrupted run's loss (bit for bit), and no staging
#    directory, set-aside directory or temporary file (latest.tmp.<pid> included) is left.
# 2. One rank SIGKILLed inside a save: rank 1 as it starts writing its data file, under mpirun
#    --enable-recovery so that rank 0 lives on and must fail by itself on loom's collective
#    timeout (LOOM_COMM_TIMEOUT=5), naming the op, within timeout + 10 s; and rank 0 while it
#    commits (both data files written), where mpirun ends the job and rank 1 reports the
#    collective it waited in. The save's step is not committed (unless, in the second case, the
#    kill landed just after its rename), and the newest committed checkpoint verifies and
#    resumes bit for bit.
# 3. A full disk (a small tmpfs; skipped with a message when it cannot be mounted): a save whose
#    data file does not fit and one whose manifest does not fit each fail naming the step, the
#    phase and "No space left on device"; no *.tmp.<pid> file is left, the previous checkpoint
#    verifies and resumes, and with room again the next save removes the staging directory.
# 4. Damage, through loom-gpt --resume-from and loom-ckpt verify: a flipped byte, a truncated
#    and a missing data file, a truncated manifest and another model's manifest are errors naming
#    the file (and the tensor); the earlier intact checkpoint in the same directory still resumes
#    bit for bit, re-saving over the damaged step; a complete-looking step-N.tmp is never loaded
#    and, with stray temporary files, is removed by the next save.
# usage: checkpoint_faults.sh LOOM_GPT LOOM_CKPT MPIEXEC [mpirun flags...]
set -euo pipefail
gpt=$1 ckpt=$2 mpiexec=$3
shift 3
mpi_flags=("$@")
py=/usr/bin/python3
trials=${LOOM_FAULT_TRIALS:-20}   # part 1; every third one under mpirun
seed=${LOOM_FAULT_SEED:-$(( $(date +%s) % 100000 ))}
timeout_s=5

dir=$(mktemp -d /tmp/loom-ckpt-faults.XXXXXX)
shm=$(mktemp -d /dev/shm/loom-ckpt-faults.XXXXXX)  # Open MPI's shared memory, gone with the test
mnt=$dir/disk
mounted=0
cleanup() {
  local status=$?
  # Every process this test starts has $dir on its command line.
  local left
  left=$(pgrep -f -- "$dir/" || true)
  if [ -n "$left" ]; then
    kill -9 $left 2>/dev/null || true
    sleep 0.5
  fi
  if [ "$mounted" = 1 ]; then umount "$mnt" 2>/dev/null || umount -l "$mnt" || true; fi
  rm -rf "$dir" "$shm"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 143' TERM INT HUP

t0=$(date +%s%N)
log() { printf '[%5.1fs] %s\n' "$(( ($(date +%s%N) - t0) / 1000000 ))e-3" "$*"; }
fail() {
  echo "FAIL: $*"
  exit 1
}
exec {nap_fd}<> <(:)  # read -t on a pipe nobody writes: sleeps without a fork
nap() { read -rt "$1" -u "$nap_fd" || true; }
step_name() { printf 'step-%08d' "$1"; }
# A process that is gone or a zombie (not yet waited for) has ended.
ended() {
  local st=""
  read -r _ _ st _ 2> /dev/null < "/proc/$1/stat" || return 0
  [ "$st" = Z ]
}

common=(--steps 8 --batch 8 --seq 26 --dropout 0.1 --lr 1e-3 --warmup-steps 2 --threads 1
        --eval-every 1000 --eval-examples 8)
model=(--layers 2 --dim 256 --heads 4)  # emptied where the model must come from a checkpoint
layout2=(--dp 2 --zero 1)
# Open MPI's session directory and shared-memory files of a killed job are removed with ours.
mpi_own=(--mca btl_vader_backing_directory "$shm" --mca orte_tmpdir_base "$dir/ompi")
# Sets cmd to loom-gpt's command line on NP ranks (1: alone; 2: --dp 2 --zero 1).
gpt_cmd() {
  local np=$1
  shift
  if [ "$np" = 1 ]; then
    cmd=("$gpt" "${common[@]}" "${model[@]}" "$@")
  else
    cmd=("$mpiexec" -np 2 "${mpi_flags[@]}" "${mpi_own[@]}" "$gpt" "${common[@]}" "${model[@]}"
         "${layout2[@]}" "$@")
  fi
}
show() {
  echo "--- $1:"
  tail -n 40 "$1"
}
gpt_ok() {  # NP LOG loom-gpt flags...: the run succeeds
  local np=$1 out=$2
  shift 2
  gpt_cmd "$np" "$@"
  "${cmd[@]}" > "$out" 2>&1 || { show "$out"; fail "loom-gpt failed: ${cmd[*]}"; }
}
gpt_fails() {  # NP LOG loom-gpt flags...: the run fails
  local np=$1 out=$2
  shift 2
  gpt_cmd "$np" "$@"
  if "${cmd[@]}" > "$out" 2>&1; then show "$out"; fail "loom-gpt succeeded: ${cmd[*]}"; fi
}
expect() {  # LOG PATTERN...: each extended regex matches a line of LOG
  local out=$1
  shift
  local p
  for p in "$@"; do
    grep -Eq -e "$p" "$out" || { show "$out"; fail "no line of $out matches '$p'"; }
  done
}
error_line() { grep -m1 -E 'error:' "$1" | cut -c1-400; }
verify() {  # DIR (a root or a step directory): loom-ckpt verify passes
  "$ckpt" verify "$1" > "$dir/verify.log" 2>&1 ||
    { show "$dir/verify.log"; fail "loom-ckpt verify $1"; }
}
# No *.tmp.<pid> file (a DurableFile's temporary) under DIR.
no_tmp_files() {
  local left
  left=$(find "$1" -name '*.tmp.*' | sort)
  [ -z "$left" ] || fail "$2: temporary files left: $left"
}
# No staging directory, temporary file or set-aside directory anywhere under DIR.
no_leftovers() {
  local left
  left=$(find "$1" \( -name '*.tmp*' -o -name '*.old' \) | sort)
  [ -z "$left" ] || fail "$2: left behind: $left"
}
# The checkpoint --resume takes in DIR, as parallel/checkpoint's latest_checkpoint finds it:
# the step `latest` names when it is committed, else the newest committed step; "" for none.
expected_resume() {
  local d=$1 name best="" s
  name=$(cat "$d/latest" 2>/dev/null || true)
  if [[ $name =~ ^step-[0-9]+$ ]] && [ -f "$d/$name/manifest.json" ]; then
    echo "$d/$name"
    return
  fi
  for s in "$d"/step-*; do
    [[ ${s##*/} =~ ^step-[0-9]+$ ]] && [ -f "$s/manifest.json" ] && best=$s
  done
  echo "$best"
}
# Every committed step directory under DIR verifies.
verify_committed() {
  local s
  for s in "$1"/step-*; do
    [[ ${s##*/} =~ ^step-[0-9]+$ ]] && [ -f "$s/manifest.json" ] && verify "$s"
  done
  return 0
}
# check_losses NAME REFERENCE GOT FIRST: GOT's loss rows are the steps >= FIRST of REFERENCE,
# each once, with REFERENCE's loss bit for bit.
check_losses() {
  "$py" - "$@" <<'PY'
import json, sys
name, ref, got, first = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
def rows(path):
    out = []
    for n, line in enumerate(open(path), 1):
        j = json.loads(line)  # a resumed run rewrites the file: no torn line may remain
        if "loss" in j:
            out.append((j["step"], j["loss"]))
    return out
want = {s: l for s, l in rows(ref) if s >= first}
have = rows(got)
steps = [s for s, _ in have]
assert steps == sorted(want), f"{name}: steps {steps} in {got}, expected {sorted(want)}"
for s, l in have:
    assert l == want[s], f"{name}: step {s} loss {l!r}, the uninterrupted run's {want[s]!r}"
PY
}
# The resumed run's line names CHECKPOINT (a step directory) or, for "", a fresh start.
expect_resumed_from() {
  local out=$1 from=$2
  if [ -n "$from" ]; then
    local step=$((10#${from##*step-}))
    grep -qF "checkpoint: resumed from $from at step $step " "$out" ||
      { show "$out"; fail "$out: not resumed from $from"; }
  else
    grep -qF "checkpoint: none in " "$out" || { show "$out"; fail "$out: did not start at step 0"; }
  fi
}

log "checkpoint_faults: seed $seed (LOOM_FAULT_SEED=$seed replays the draws), work dir $dir"
# The uninterrupted runs.
gpt_ok 1 "$dir/ref1.log" --metrics-file "$dir/ref1.jsonl"
gpt_ok 2 "$dir/ref2.log" --metrics-file "$dir/ref2.jsonl"
log "reference runs done (8 steps, one process and --dp 2 --zero 1)"

# 1. The whole job SIGKILLed during saves. Every fourth trial saves in the background
# (--async-save), where the binary has it.
"$gpt" --help > "$dir/help.txt" 2>&1 || true
can_async=0
grep -q -- '--async-save' "$dir/help.txt" && can_async=1
RANDOM=$seed
in_save=0 none_committed=0
for ((i = 1; i <= trials; ++i)); do
  np=1 keep=0
  ((i % 3 == 0)) && np=2
  ((i % 4 == 2)) && keep=3  # old checkpoints deleted as the run goes
  mode=()
  ((can_async && i % 4 == 0)) && mode=(--async-save)
  k=$((1 + RANDOM % 6)) delay=$((RANDOM % 90))
  t=$dir/trial$i ck=$dir/trial$i/ck
  mkdir -p "$t"
  gpt_cmd "$np" --checkpoint-dir "$ck" --save-every 1 --keep-last $keep "${mode[@]}" \
    --metrics-file "$t/metrics.jsonl"
  "${cmd[@]}" > "$t/killed.log" 2>&1 &
  job=$!
  # Wait for the save of step k to begin (its staging directory), then for the delay.
  staging=$ck/$(step_name "$k").tmp
  until [ -e "$staging" ] || [ -e "${staging%.tmp}" ]; do
    ended "$job" && { show "$t/killed.log"; fail "trial $i: the run ended before saving step $k"; }
    nap 0.002
  done
  nap "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
  victims=$job
  [ "$np" = 1 ] || victims="$job $(pgrep -P "$job" | tr '\n' ' ')"
  kill -9 $victims 2> /dev/null || true
  wait "$job" 2> /dev/null || true
  staged=$(cd "$ck" && find . -name '*.tmp*' | sort | tr '\n' ' ')
  [ -z "$staged" ] || in_save=$((in_save + 1))
  from=$(expected_resume "$ck")
  msg="trial $i: np $np, keep-last $keep${mode:+, async}, SIGKILL ${delay} ms into the save of"
  msg+=" step $k: latest"
  msg+=" $(cat "$ck/latest" 2> /dev/null || echo none), left ${staged:-nothing}"
  if [ -n "$from" ]; then
    verify_committed "$ck"
    verify "$ck"
    msg+="; committed ones verify; resume from ${from##*/}"
  else
    none_committed=$((none_committed + 1))
    msg+="; nothing committed yet: resume from step 0"
  fi
  gpt_ok "$np" "$t/resumed.log" --checkpoint-dir "$ck" --save-every 1 --keep-last $keep \
    "${mode[@]}" --resume --metrics-file "$t/metrics.jsonl"
  expect_resumed_from "$t/resumed.log" "$from"
  check_losses "trial $i" "$dir/ref$np.jsonl" "$t/metrics.jsonl" 1
  no_leftovers "$ck" "trial $i after the resumed run"
  kept=$(cd "$ck" && echo step-*) want="" first=1
  ((keep == 0)) || first=$((9 - keep))
  for ((s = first; s <= 8; ++s)); do want+="${want:+ }$(step_name $s)"; done
  [ "$kept" = "$want" ] || fail "trial $i: the directory holds $kept, not $want"
  verify_committed "$ck"
  verify "$ck"
  log "$msg; steps 1-8 match bit for bit"
  rm -rf "$t"
done
log "part 1: $trials trials, $in_save killed with a save in flight," \
  "$none_committed before any commit"

# 2. One rank killed inside a save.
# 2a. Rank 1, as it creates its data file's temporary; rank 0 must time out by itself.
t=$dir/rank1 ck=$dir/rank1/ck
mkdir -p "$t"
LOOM_COMM_TIMEOUT=$timeout_s "$mpiexec" --enable-recovery -np 2 "${mpi_flags[@]}" "${mpi_own[@]}" \
  bash -c '"$@"; echo $? > "$0/status.$OMPI_COMM_WORLD_RANK"' "$t" \
  "$gpt" "${common[@]}" "${model[@]}" "${layout2[@]}" --checkpoint-dir "$ck" --save-every 1 \
  --metrics-file "$t/metrics.jsonl" > "$t/job.log" 2>&1 &
job=$!
victim=""
until [ -n "$victim" ]; do
  ended "$job" && { show "$t/job.log"; fail "2a: the run ended before rank 1 could be killed"; }
  if [ -e "$ck/step-00000001/manifest.json" ]; then  # a checkpoint to fall back on
    for f in "$ck"/step-*.tmp/rank-00001.safetensors.tmp.*; do
      [ -e "$f" ] && victim=$f && break
    done
  fi
  [ -n "$victim" ] || nap 0.001
done
kill -9 "${victim##*.tmp.}"
killed_at=$(date +%s%N)
killed_step=${victim#"$ck"/step-}
killed_step=$((10#${killed_step%%.tmp/*}))
while ! ended "$job"; do
  (( ($(date +%s%N) - killed_at) / 1000000000 <= timeout_s + 30 )) || break
  nap 0.05
done
took=$(( ($(date +%s%N) - killed_at) / 1000000 ))
ended "$job" || { show "$t/job.log"; fail "2a: the job still runs $took ms after rank 1 died"; }
wait "$job" || true
((took <= (timeout_s + 10) * 1000)) || fail "2a: rank 0 took $took ms, more than timeout + 10 s"
[ "$(cat "$t/status.1" 2> /dev/null)" = 137 ] || fail "2a: rank 1 was not the one killed"
[ "$(cat "$t/status.0" 2> /dev/null)" = 1 ] ||
  { show "$t/job.log"; fail "2a: rank 0 did not exit 1"; }
# The survivor names the save, its phase, and the collective the dead rank never joined.
expect "$t/job.log" "^loom-gpt: error: \[rank 0\] checkpoint save of step $killed_step to .* \
\((planning|preparing .*|writing data files|committing)\) failed: .*timed out after $timeout_s s \
waiting for group 'world' \(rank 0 of 2\) allgather #[0-9]+"
[ ! -e "$ck/$(step_name "$killed_step")" ] ||
  fail "2a: step $killed_step was committed without rank 1"
from=$(expected_resume "$ck")
[ "$from" = "$ck/$(step_name $((killed_step - 1)))" ] || fail "2a: the newest checkpoint is $from"
verify "$ck"
log "2a: rank 1 killed writing step $killed_step; rank 0 exited 1 after $took ms:" \
  "$(error_line "$t/job.log" | cut -c1-150)"
gpt_ok 2 "$t/resumed.log" --checkpoint-dir "$ck" --save-every 1 --resume \
  --metrics-file "$t/metrics.jsonl"
expect_resumed_from "$t/resumed.log" "$from"
check_losses "2a" "$dir/ref2.jsonl" "$t/metrics.jsonl" 1
no_leftovers "$ck" "2a after the resumed run"
verify "$ck"
log "2a: resumed from ${from##*/}: steps match bit for bit, the staging directory is gone"
rm -rf "$t"

# 2b. Rank 0 while it commits (every data file written, the step not yet renamed): mpirun ends
# the job, rank 1 reports the collective it was waiting in.
t=$dir/rank0 ck=$dir/rank0/ck
mkdir -p "$t"
LOOM_COMM_TIMEOUT=$timeout_s "$mpiexec" -np 2 "${mpi_flags[@]}" "${mpi_own[@]}" \
  bash -c 'echo $$ > "$0/pid.$OMPI_COMM_WORLD_RANK"; exec "$@"' "$t" \
  "$gpt" "${common[@]}" "${model[@]}" "${layout2[@]}" --checkpoint-dir "$ck" --save-every 1 \
  --metrics-file "$t/metrics.jsonl" > "$t/job.log" 2>&1 &
job=$!
caught=""
until [ -n "$caught" ]; do
  ended "$job" && { show "$t/job.log"; fail "2b: no commit was caught in the run's 8 saves"; }
  if [ -e "$ck/step-00000001/manifest.json" ]; then
    for s in "$ck"/step-*.tmp; do
      if [ -e "$s/rank-00000.safetensors" ] && [ -e "$s/rank-00001.safetensors" ] &&
         [ ! -e "${s%.tmp}" ]; then
        kill -9 "$(cat "$t/pid.0")"
        caught=$s
        break
      fi
    done
  fi
  [ -n "$caught" ] || nap 0.001
done
killed_at=$(date +%s%N)
killed_step=${caught#"$ck"/step-}
killed_step=$((10#${killed_step%.tmp}))
status=0
wait "$job" || status=$?
took=$(( ($(date +%s%N) - killed_at) / 1000000 ))
((status != 0)) || fail "2b: mpirun exited 0 although rank 0 was killed"
((took <= (timeout_s + 10) * 1000)) || fail "2b: the job took $took ms to end"
expect "$t/job.log" "(mpirun|mpiexec) noticed that process rank 0 .* exited on signal 9"
if [ -e "$ck/$(step_name "$killed_step")" ]; then
  # The kill landed just after the rename: the step is whole and rank 1 may have gone on.
  expect "$t/job.log" "^\[rank 1\] loom: terminated (while waiting for group|by signal)"
  committed="committed just before the kill"
else
  expect "$t/job.log" \
    "^\[rank 1\] loom: terminated while waiting for group 'world' \(rank 1 of 2\) allgather #[0-9]+"
  committed="not committed"
fi
verify_committed "$ck"
from=$(expected_resume "$ck")
verify "$ck"
log "2b: rank 0 killed committing step $killed_step ($committed; left" \
  "$(cd "$ck" && find . -name '*.tmp*' | sort | tr '\n' ' ')); mpirun exited $status after" \
  "$took ms: $(grep -m1 '^\[rank 1\] loom' "$t/job.log" | cut -c1-110)"
gpt_ok 2 "$t/resumed.log" --checkpoint-dir "$ck" --save-every 1 --resume \
  --metrics-file "$t/metrics.jsonl"
expect_resumed_from "$t/resumed.log" "$from"
check_losses "2b" "$dir/ref2.jsonl" "$t/metrics.jsonl" 1
no_leftovers "$ck" "2b after the resumed run"
verify "$ck"
log "2b: resumed from ${from##*/}: steps match bit for bit, the staging directory is gone"
rm -rf "$t"

# 4 (before 3, whose sizes it measures). Damage: checkpoints of steps 4 and 8, step 8 damaged.
base=$dir/damage/ck s8=$dir/damage/ck/step-00000008
mkdir -p "$dir/damage"
gpt_ok 1 "$dir/damage/base.log" --checkpoint-dir "$base" --save-every 4
cp -r "$s8" "$dir/damage/pristine"
model=()
gpt_ok 1 "$dir/damage/other.log" --steps 3 --layers 1 --dim 128 --checkpoint-dir "$dir/damage/other"
data=rank-00000.safetensors
data_bytes=$(stat -c %s "$s8/$data")
restore() {
  rm -rf "$s8"
  cp -r "$dir/damage/pristine" "$s8"
}
damaged() {  # NAME PATTERN...: resuming from step 8 and verifying it fail, matching the patterns
  local name=$1
  shift
  gpt_fails 1 "$dir/damage/$name.log" --resume-from "$s8"
  expect "$dir/damage/$name.log" "^loom-gpt: error: " "$@"
  if "$ckpt" verify "$s8" > "$dir/damage/$name.verify.log" 2>&1; then
    fail "4: loom-ckpt verify passed a $name"
  fi
  expect "$dir/damage/$name.verify.log" "$@"
  log "4: $name: $(error_line "$dir/damage/$name.log")"
}
# A flipped byte in the middle of the data.
off=$((data_bytes / 2))
byte=$(od -An -tu1 -j "$off" -N1 "$s8/$data" | tr -d ' ')
printf '%b' "\\0$(printf '%o' $((byte ^ 0xff)))" |
  dd of="$s8/$data" bs=1 seek="$off" conv=notrunc status=none
damaged "flipped byte" "checkpoint $s8: data file $data, tensor (model|optim)\.[a-z0-9_.]+ \
\(piece [^)]+\), bytes \[[0-9]+, [0-9]+\) fail their checksum"
restore
truncate -s $((data_bytes - 1000)) "$s8/$data"
damaged "truncated data file" "checkpoint $s8: data file $data is $((data_bytes - 1000)) bytes \
but the manifest says $data_bytes \(truncated\)"
restore
rm "$s8/$data"
damaged "missing data file" "checkpoint $s8: data file $data is missing \(the manifest lists it\)"
restore
truncate -s 5000 "$s8/manifest.json"
damaged "truncated manifest" "$s8/manifest.json"
restore
cp "$dir/damage/other/step-00000003/manifest.json" "$s8/manifest.json"
# Without model flags the model comes from the manifest, and its files do not fit it.
damaged "manifest of another model" \
  "checkpoint $s8: data file $data is $data_bytes bytes but the manifest says [0-9]+"
model=(--layers 2 --dim 256 --heads 4)
# Another model's manifest with this model's flags is refused before any data is read.
gpt_fails 1 "$dir/damage/other-flags.log" --layers 2 --resume-from "$s8"
expect "$dir/damage/other-flags.log" \
  "--layers 2 conflicts with the checkpoint $s8, whose model has 1"
rm "$s8/$data"  # step 8 stays damaged
# A complete-looking staging directory of a later step, and stray temporaries of a killed save.
cp -r "$dir/damage/pristine" "$base/step-00000009.tmp"
touch "$base/step-00000009.tmp/$data.tmp.4242" "$base/latest.tmp.4242"
# The intact step 4 resumes in the same directory and saves step 8 again over the damaged one.
gpt_ok 1 "$dir/damage/from4.log" --resume-from "$base/step-00000004" --checkpoint-dir "$base" \
  --save-every 4 --metrics-file "$dir/damage/from4.jsonl"
expect_resumed_from "$dir/damage/from4.log" "$base/step-00000004"
check_losses "4: from step 4" "$dir/ref1.jsonl" "$dir/damage/from4.jsonl" 5
no_leftovers "$base" "4: after the save of step 8"
verify_committed "$base"
# Without `latest`, --resume takes the newest committed step, not a complete-looking step-9.tmp.
rm "$base/latest"
cp -r "$dir/damage/pristine" "$base/step-00000009.tmp"
gpt_ok 1 "$dir/damage/latest.log" --checkpoint-dir "$base" --resume
expect_resumed_from "$dir/damage/latest.log" "$s8"
log "4: step 4 resumed, steps 5-8 match bit for bit, step 8 saved again and verifies;" \
  "step-9.tmp never loaded"

# 3. A full disk.
page=4096
pages() { echo $(( ($1 + page - 1) / page )); }
ck_pages=$(( $(pages "$data_bytes") + $(pages "$(stat -c %s "$s8/manifest.json")") + 1 ))
rm -rf "$dir/damage"
mkdir -p "$mnt"
# Room for one checkpoint and half of the next one's data file.
if ! mount -t tmpfs -o size=$(((ck_pages + $(pages "$data_bytes") / 2) * page)) tmpfs "$mnt" \
  2> "$dir/mount.log"; then
  log "part 3 SKIPPED: cannot mount a tmpfs to fill ($(cat "$dir/mount.log"));" \
    "run as root to test a full disk"
else
  mounted=1
  ck=$mnt/ck
  # The data file of step 2 does not fit.
  gpt_fails 1 "$dir/full1.log" --checkpoint-dir "$ck" --save-every 1 \
    --metrics-file "$dir/full.jsonl"
  expect "$dir/full1.log" "checkpoint: saved step 1 " "^loom-gpt: error: " \
    "checkpoint save of step 2 to $ck \(writing data files\) failed: rank 0: (\[rank 0\] )?\
cannot write $ck/step-00000002.tmp/$data \([0-9]+ bytes written so far\): \
No space left on device \(the disk is full\)"
  log "3: data file: $(error_line "$dir/full1.log")"
  no_tmp_files "$ck" "3: after the failed write"
  [ ! -e "$ck/step-00000002" ] || fail "3: step 2 committed on a full disk"
  verify "$ck"
  [ "$(expected_resume "$ck")" = "$ck/step-00000001" ] || fail "3: step 1 is not the latest"
  # Room for the data file but not the manifest: the commit fails.
  used=$(df -B$page --output=used "$mnt" | tail -1 | tr -d ' ')
  mount -o remount,size=$(( (used + $(pages "$data_bytes") + 2) * page )) "$mnt"
  gpt_fails 1 "$dir/full2.log" --checkpoint-dir "$ck" --save-every 1 --resume \
    --metrics-file "$dir/full.jsonl"
  expect_resumed_from "$dir/full2.log" "$ck/step-00000001"
  expect "$dir/full2.log" "^loom-gpt: error: " \
    "checkpoint save of step 2 to $ck \(committing\) failed: rank 0: (\[rank 0\] )?\
cannot write $ck/step-00000002.tmp/manifest.json.*No space left on device \(the disk is full\)"
  log "3: manifest: $(error_line "$dir/full2.log")"
  no_tmp_files "$ck" "3: after the failed commit"
  if [ ! -f "$ck/step-00000002.tmp/$data" ] || [ -e "$ck/step-00000002.tmp/manifest.json" ]; then
    fail "3: step-00000002.tmp should hold the data file and no manifest"
  fi
  [ ! -e "$ck/step-00000002" ] || fail "3: step 2 committed on a full disk"
  verify "$ck"
  # Room again: the run resumes from step 1 and the next save removes step-2.tmp.
  mount -o remount,size=$(( 4 * ck_pages * page )) "$mnt"
  gpt_ok 1 "$dir/full3.log" --checkpoint-dir "$ck" --save-every 1 --keep-last 2 --resume \
    --metrics-file "$dir/full.jsonl"
  expect_resumed_from "$dir/full3.log" "$ck/step-00000001"
  check_losses "3" "$dir/ref1.jsonl" "$dir/full.jsonl" 1
  no_leftovers "$ck" "3: after the saves with room"
  kept=$(cd "$ck" && echo step-*)
  [ "$kept" = "step-00000007 step-00000008" ] || fail "3: --keep-last 2 kept $kept"
  verify_committed "$ck"
  umount "$mnt"
  mounted=0
  log "3: with room again: resumed from step 1, steps match bit for bit, step-2.tmp removed"
fi

sleep 0.2
left=$(pgrep -f -- "$dir/" || true)
[ -z "$left" ] || fail "processes left running: $(ps -o pid=,args= -p "${left//$'\n'/,}")"
log "checkpoint_faults: all checks passed (seed $seed)"
