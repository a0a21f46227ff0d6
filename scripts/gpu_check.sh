#!/usr/bin/env bash
# Builds loom with CUDA on the GPU machine and runs everything that needs the GPU, in one or two
# device calls, leaving one log per phase under $OUT and a summary table at the end.
#
#   bash scripts/gpu_check.sh build   configure + build build-gpu only
#   bash scripts/gpu_check.sh test    the test phases only, on an existing build-gpu
#   bash scripts/gpu_check.sh         both (the default; what one device call should run)
#
# Run THERE through the device tool, after `bash scripts/gpu_deps.sh` HERE (it fills .gpu-deps/,
# which the call must carry):   run(command="bash scripts/gpu_check.sh", carry=[".gpu-deps"])
# The GPU machine has nvcc, CMake, ninja and PyTorch's python3 but no Debian -dev packages, no
# network, so Eigen, GoogleTest and nlohmann-json come from .gpu-deps/root
# (CMAKE_PREFIX_PATH for the CMake configs, CPATH for <nlohmann/json.hpp>, which loom includes
# without find_package). scripts/install-deps.sh is never run (LOOM_SKIP_DEPS=1 semantics).
#
# Carrying build-gpu does NOT fit: a CUDA build of every test binary is far above the device
# tool's 64 MiB working-tree limit (see the report printed by `build`), and $OUT returns at most
# 8 files of 16 MiB. So build and test share a call (the default mode), or `test` runs in the
# very next call while the machine is still warm (it stays 30 s after a call and keeps ignored
# build outputs); `test` on a machine without build-gpu builds it first. `test` never rebuilds
# an existing build-gpu: the device tool re-sends the tree and fresh timestamps would make ninja
# recompile everything.
#
# Phases (test mode), each under `timeout` (which kills the whole process group), in this order:
#   cuda_tests  ctest -L unit -R "$CUDA_TESTS" --output-on-failure -V (cuda_* and the CPU tests
#               with CUDA twins)
#   memcheck    compute-sanitizer --tool memcheck on a few small cases of cuda_norm_test,
#               cuda_loss_test and cuda_attention_test's GEMM attention (when compute-sanitizer
#               exists). The kernel tests allocate with cudaMalloc directly; tensors come from
#               loom's caching allocator, whose blocks are rounded up and reused, so memcheck
#               sees a tensor's overrun only past its block.
#   bench_cuda  build-gpu/bin/loom-bench-cuda --json > $OUT/bench_cuda.json, rendered as a table
#   gpt         loom-gpt --device cuda on GPT-2 124M's shape (12 layers, dim 768, 12 heads, seq
#               1024, vocab 50257 padded to 50304, batch 8) on random tokens, f32 then bf16:
#               tokens/s and MFU (median after warm-up steps)
#   nccl        ctest -R '^nccl_test' (the NCCL backend under mpirun: 1 rank runs every collective on
#               the GPU, 2 and 4 skip inside on a one-GPU machine), appended to cuda_tests.log; the
#               lent machine's image (Ubuntu 24.04) has Open MPI and NCCL 2.28, so CMake finds both
#   unit_rest   ctest -L unit -E "$CUDA_TESTS": nothing else broke with CUDA on
# set -u, not -e: every phase runs and reports, whatever the one before did. The whole script
# keeps to LOOM_GPU_BUDGET_S seconds (default 540, inside the device tool's 600 s per call): each
# phase gets min(its own cap, what is left), and a phase that would get under 20 s is skipped.
#
# $OUT receives at most 8 files (the device tool returns no more): build.log, cuda_tests.log,
# memcheck.log, bench_cuda.json, bench_cuda.log, gpt.log, unit_rest.log, summary.txt.
#
# Environment knobs: OUT (default /tmp/out), LOOM_GPU_BUILD (default build-gpu), LOOM_GPU_JOBS
# (ninja -j, default 16; use 2 on the 2-core development machines), LOOM_GPU_CTEST_JOBS (default
# 8), LOOM_GPU_BUDGET_S (default 540), LOOM_GPU_CMAKE_ARGS (extra cmake flags), LOOM_GPU_STEPS
# (loom-gpt steps per dtype, default 12), LOOM_GPU_DEPS (default .gpu-deps/root), LOOM_GPU_BUILD_S
# (the build's own cap, default 480), LOOM_GPU_TARGETS (build only these targets, e.g. loom-gpt
# for benchmarks/gpt2_cuda_vs_pytorch.py on a fresh machine; default all), LOOM_GPU_PHASES (the test
# phases to run, in order; default all six: cuda_tests memcheck bench_cuda gpt nccl unit_rest).
set -u

cd "$(dirname "$0")/.." || exit 1
REPO="$(pwd)"
MODE="${1:-all}"
case "$MODE" in
  build | test | all) ;;
  *) echo "usage: bash scripts/gpu_check.sh [build|test]   (no argument: both)" >&2; exit 2 ;;
esac

START=$SECONDS
BUDGET="${LOOM_GPU_BUDGET_S:-540}"
BUILD="${LOOM_GPU_BUILD:-build-gpu}"
JOBS="${LOOM_GPU_JOBS:-16}"
CTEST_JOBS="${LOOM_GPU_CTEST_JOBS:-8}"
STEPS="${LOOM_GPU_STEPS:-12}"
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
DEPS="${LOOM_GPU_DEPS:-$REPO/.gpu-deps/root}"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"

# The carried packages: CMake configs (usr/share/eigen3/cmake, usr/lib/x86_64-linux-gnu/cmake/GTest,
# usr/share/cmake/nlohmann_json) through CMAKE_PREFIX_PATH, headers through CPATH (gcc and the
# host pass of nvcc both read it), libbenchmark.so through LD_LIBRARY_PATH. Exported, so the
# consumer test's nested cmake finds them too. CMake 4 refuses configs written for CMake < 3.5
# unless told the minimum policy; older CMake ignores the variable.
export LOOM_SKIP_DEPS=1
if [[ -d "$DEPS" ]]; then
  export CMAKE_PREFIX_PATH="$DEPS/usr:$DEPS/usr/lib/x86_64-linux-gnu/cmake:$DEPS/usr/share${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export CPATH="$DEPS/usr/include${CPATH:+:$CPATH}"
  export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  echo "gpu_check: $DEPS not found (run scripts/gpu_deps.sh here and carry .gpu-deps);" \
       "relying on system packages"
fi
export CMAKE_POLICY_VERSION_MINIMUM="${CMAKE_POLICY_VERSION_MINIMUM:-3.5}"
export PATH="$PATH:/usr/local/cuda/bin"

have_gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then have_gpu=1; fi

# The CUDA tests: the cuda_* binaries, and the CPU test binaries that hold CUDA-vs-CPU twins of
# newer ops (they skip those cases without a GPU); unit_rest runs everything else.
CUDA_TESTS='^(cuda_|embedding_bag_cuda|compare_test$|generate_test$|integer_test$|linalg_test$|math_test$|moe_test$|optimizer_test$|tensor_test$)'

remaining() { echo $((BUDGET - (SECONDS - START))); }

# record NAME STATUS SECONDS LOG
declare -a ROWS=()
record() {
  ROWS+=("$(printf '%-12s %-32s %6s  %s' "$1" "$2" "$3" "$4")")
  echo "gpu_check: [$1] $2 in ${3}s; log: $4"
}

# run_phase NAME CAP LOG CMD...: runs CMD under timeout with min(CAP, time left), output to LOG.
# Sets PHASE_RC (124 = timed out, 125 = skipped for lack of time) and PHASE_S.
run_phase() {
  local name="$1" cap="$2" log="$3"
  shift 3
  local left=$(($(remaining) - 10))
  local limit=$((cap < left ? cap : left))
  PHASE_S=0
  if ((limit < 20)); then
    echo "gpu_check: [$name] skipped: ${left}s left of the ${BUDGET}s budget" | tee -a "$log"
    PHASE_RC=125
    return
  fi
  echo "gpu_check: [$name] up to ${limit}s: $*" | tee -a "$log"
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@" >>"$log" 2>&1
  PHASE_RC=$?
  PHASE_S=$((SECONDS - t0))
  ((PHASE_RC == 124 || PHASE_RC == 137)) && echo "gpu_check: [$name] TIMED OUT after ${limit}s" | tee -a "$log"
}

status_of() {  # status_of RC -> pass / FAIL (rc N) / TIMEOUT / skipped (no time)
  case "$1" in
    0) echo pass ;;
    124 | 137) echo TIMEOUT ;;
    125) echo "skipped (no time)" ;;
    *) echo "FAIL (rc $1)" ;;
  esac
}

# ------------------------------------------------------------------------------- build
do_build() {
  local log="$OUT/build.log"
  : >"$log"
  {
    echo "== machine"
    uname -a
    grep PRETTY_NAME /etc/os-release 2>/dev/null
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | head -3
    echo "nvcc: $(command -v nvcc) $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*')"
    echo "cmake: $(cmake --version | head -1); ninja: $(ninja --version 2>&1)"
    echo "c++: $(c++ --version 2>/dev/null | head -1)"
    echo "python3: $(command -v python3) $(python3 -c 'import torch; print("torch", torch.__version__)' 2>&1 | tail -1)"
    echo "mpirun: $(command -v mpirun || echo none)"
    echo "CMAKE_PREFIX_PATH=${CMAKE_PREFIX_PATH:-}"
    echo "CPATH=${CPATH:-}"
  } >>"$log" 2>&1
  # shellcheck disable=SC2086  # LOOM_GPU_CMAKE_ARGS is a list of flags
  run_phase configure 120 "$log" cmake -S "$REPO" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DLOOM_WITH_CUDA=ON -DLOOM_WITH_MPI=AUTO -DLOOM_CUDA_ARCHS=90 \
    -DCMAKE_PREFIX_PATH="${CMAKE_PREFIX_PATH:-}" ${LOOM_GPU_CMAKE_ARGS:-}
  local rc=$PHASE_RC secs=$PHASE_S
  if ((rc == 0)); then
    grep -E '^(Eigen3|GTest|benchmark|nlohmann_json)_DIR:' "$BUILD/CMakeCache.txt" >>"$log"
    # shellcheck disable=SC2086  # LOOM_GPU_TARGETS is a list of target names
    run_phase build "${LOOM_GPU_BUILD_S:-480}" "$log" cmake --build "$BUILD" -j "$JOBS" \
      ${LOOM_GPU_TARGETS:+--target $LOOM_GPU_TARGETS} -- -k 0  # keep going: every error in one call
    rc=$PHASE_RC
    secs=$((secs + PHASE_S))
  fi
  {
    echo "== $BUILD: $(du -sh "$BUILD" 2>/dev/null | cut -f1) in all;" \
         "bin/ $(du -sh "$BUILD/bin" 2>/dev/null | cut -f1) (the device tool carries at most 64 MiB)"
  } >>"$log"
  tail -n 25 "$log"
  record build "$(status_of $rc)" "$secs" "$log"
  return $rc
}

# ------------------------------------------------------------------------------- tests
phase_cuda_tests() {
  local log="$OUT/cuda_tests.log"
  : >"$log"
  run_phase cuda_tests 180 "$log" ctest --test-dir "$BUILD" -L unit -R "$CUDA_TESTS" \
    --output-on-failure -V -j 4 --timeout 150
  local rc=$PHASE_RC status
  status="$(status_of $rc)"
  local skipped
  skipped="$(grep -c '\[  SKIPPED \]' "$log")"
  if ((rc == 0 && have_gpu == 0)); then status="pass (no GPU: skips)"; fi
  grep -E 'tests passed|tests failed|\(Failed\)|\(Timeout\)|\(SEGFAULT\)' "$log" | tail -n 15
  echo "gpu_check: [cuda_tests] gtest SKIPPED lines: $skipped" | tee -a "$log"
  record cuda_tests "$status" "$PHASE_S" "$log"
}

phase_memcheck() {
  local log="$OUT/memcheck.log"
  : >"$log"
  local sanitizer
  sanitizer="$(command -v compute-sanitizer || true)"
  if [[ -z "$sanitizer" || $have_gpu == 0 ]]; then
    echo "gpu_check: [memcheck] skipped: ${sanitizer:-no compute-sanitizer}${sanitizer:+ but no GPU}" | tee -a "$log"
    record memcheck "skipped (${sanitizer:+no GPU}${sanitizer:-no compute-sanitizer})" 0 "$log"
    return
  fi
  local norm_filter="${LOOM_GPU_MEMCHECK_NORM:-CudaLayerNorm.ForwardBackwardF32:CudaLayerNorm.MisalignedPointers:CudaSoftmax.ForwardBackwardBf16:CudaDropout.*}"
  local loss_filter="${LOOM_GPU_MEMCHECK_LOSS:-CudaCrossEntropy.MatchesCpuF32:CudaCrossEntropy.IgnoredRows:CudaVocabParallelCrossEntropy.StagesMatchCpuF32:CudaEmbedding.ManyLookupsOfOneRow}"
  local rc_all=0 secs=0
  run_phase memcheck 60 "$log" "$sanitizer" --tool memcheck --error-exitcode 99 --print-limit 20 \
    "$BUILD/bin/cuda_norm_test" --gtest_filter="$norm_filter"
  rc_all=$PHASE_RC
  secs=$PHASE_S
  run_phase memcheck 60 "$log" "$sanitizer" --tool memcheck --error-exitcode 99 --print-limit 20 \
    "$BUILD/bin/cuda_loss_test" --gtest_filter="$loss_filter"
  ((rc_all == 0)) && rc_all=$PHASE_RC
  secs=$((secs + PHASE_S))
  # GEMM attention's row blocks, passes and workspace regions (kernels/cuda/attention_gemm.cu).
  local attention_filter="${LOOM_GPU_MEMCHECK_ATTENTION:-AttentionCuda.GemmHeadDimZero*:AttentionCuda.GemmPassesBlocksAndLargeHeadDims}"
  run_phase memcheck 90 "$log" "$sanitizer" --tool memcheck --error-exitcode 99 --print-limit 20 \
    "$BUILD/bin/cuda_attention_test" --gtest_filter="$attention_filter"
  ((rc_all == 0)) && rc_all=$PHASE_RC
  secs=$((secs + PHASE_S))
  grep -E 'ERROR SUMMARY|PASSED|FAILED' "$log" | tail -n 12
  local status
  status="$(status_of $rc_all)"
  ((rc_all == 99)) && status="FAIL (memcheck errors)"
  record memcheck "$status" "$secs" "$log"
}

phase_bench() {
  local log="$OUT/bench_cuda.log" json="$OUT/bench_cuda.json"
  : >"$log"
  local bench="$BUILD/bin/loom-bench-cuda"
  if [[ ! -x "$bench" ]]; then
    echo "gpu_check: [bench_cuda] $bench was not built" | tee -a "$log"
    record bench_cuda "FAIL (not built)" 0 "$log"
    return
  fi
  local left=$(($(remaining) - 10)) limit=150
  ((left < limit)) && limit=$left
  if ((limit < 20)); then
    echo "gpu_check: [bench_cuda] skipped: no time" | tee -a "$log"
    record bench_cuda "skipped (no time)" 0 "$log"
    return
  fi
  echo "gpu_check: [bench_cuda] up to ${limit}s: $bench --json > $json" >>"$log"
  local t0=$SECONDS
  timeout -k 10 "$limit" "$bench" --json >"$json" 2>>"$log"
  local rc=$?
  local secs=$((SECONDS - t0))
  # The same figures as the table loom-bench-cuda prints without --json, from the JSON (one run).
  python3 - "$json" >>"$log" 2>&1 <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:  # a crash leaves partial JSON: say so, the log has stderr
    sys.exit(f"bench_cuda.json is not valid JSON ({e})")
if d.get("skipped"):
    print("loom-bench-cuda: skipped:", d.get("reason")); sys.exit(0)
dev = d["device"]
print(f"{dev['name']} (cc {dev['compute_capability']}, {dev['sms']} SMs), driver {dev['driver']}, "
      f"runtime {dev['runtime']}, SM {dev['sm_clock_mhz']} MHz, datasheet DRAM {dev['dram_gbps_datasheet']} GB/s")
print("config:", d["config"])
section = None
for r in d["results"]:
    if r["section"] != section:
        section = r["section"]
        print(f"\n{section:<24} {'dtype':<5} {'shape':<30} {'ms':>10} {r['unit']:>9} {'reference':<20} {r['unit']:>9} {'ratio':>7}  note")
    print(f"{r['kernel']:<24} {r['dtype']:<5} {r['shape']:<30} {r['ms']:>10.4f} {r['rate']:>9.2f} "
          f"{r['ref']:<20} {r['ref_rate']:>9.2f} {r['ratio']:>7.3f}  {r['note']}")
EOF
  head -n 60 "$log"
  local status
  status="$(status_of $rc)"
  if ((rc == 0)) && grep -q '"skipped": true' "$json"; then status="skipped (no GPU)"; fi
  record bench_cuda "$status" "$secs" "$log + $json"
}

phase_gpt() {
  local log="$OUT/gpt.log"
  : >"$log"
  local gpt="$BUILD/bin/loom-gpt" work
  work="$(mktemp -d)"
  if [[ ! -x "$gpt" ]]; then
    echo "gpu_check: [gpt] $gpt was not built" | tee -a "$log"
    record gpt "FAIL (not built)" 0 "$log"
    return
  fi
  # Random GPT-2 tokens: 16 batches of 8 x 1024, so the loader never wraps.
  python3 "$REPO/scripts/random_gpt2_tokens.py" "$work/tokens.bin"
  local variant dtype extra rc_all=0 secs=0
  # bf16_moe: every block's MLP a mixture of 8 experts, top-2, dropless (the grouped GEMM path).
  for variant in f32 bf16 bf16_moe; do
    dtype="${variant%%_*}"
    extra=()
    [[ "$variant" == *_moe ]] && extra=(--moe-experts 8 --moe-top-k 2)
    echo "== loom-gpt --dtype $dtype ${extra[*]}" >>"$log"
    run_phase "gpt_$variant" 90 "$log" "$gpt" --device cuda --dtype "$dtype" --layers 12 \
      --dim 768 --heads 12 --seq 1024 --batch 8 --data "$work/tokens.bin" --steps "$STEPS" \
      --lr 3e-4 --lr-schedule constant --warmup-steps 0 "${extra[@]}" \
      --metrics-file "$work/metrics_$variant.jsonl"
    local rc=$PHASE_RC
    secs=$((secs + PHASE_S))
    ((rc_all == 0)) && rc_all=$rc
    {
      echo "-- metrics ($variant): median over steps after the first 3"
      python3 - "$work/metrics_$variant.jsonl" "$variant" 2>&1 <<'EOF'
import json, statistics, sys
try:
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
except OSError:
    sys.exit(f"{sys.argv[2]}: no metrics file (loom-gpt failed before its first step)")
steps = [r for r in rows if "step_ms" in r]
timed = steps[3:] or steps
if not timed:
    sys.exit(f"{sys.argv[2]}: no steps recorded")
ms = statistics.median(r["step_ms"] for r in timed)
tps = statistics.median(r["tokens_per_s"] for r in timed)
mfu = [r["mfu"] for r in timed if "mfu" in r]
mfu_text = f"MFU {statistics.median(mfu) * 100:.1f}%" if mfu else "MFU n/a (GPU not in loom's table)"
print(f"RESULT loom-gpt GPT-2 124M {sys.argv[2]}: step {ms:.1f} ms, {tps:.0f} tokens/s, {mfu_text} "
      f"(median of {len(timed)} steps; first loss {steps[0]['loss']:.4f}, last {steps[-1]['loss']:.4f})")
EOF
      cat "$work/metrics_$variant.jsonl" 2>/dev/null
    } >>"$log"
  done
  grep -E '^(RESULT|device:|model:|loom-gpt:.*error|.*rror)' "$log" | head -n 12
  local status
  status="$(status_of $rc_all)"
  if ((rc_all != 0 && have_gpu == 0)); then status="skipped (no GPU)"; fi
  record gpt "$status" "$secs" "$log"
  rm -rf "$work"
}

phase_nccl() {
  local log="$OUT/cuda_tests.log"  # appended: $OUT returns at most 8 files
  echo "== nccl" >>"$log"
  if ! ctest --test-dir "$BUILD" -N -R '^nccl_test' 2>/dev/null | grep -q 'nccl_test'; then
    echo "gpu_check: [nccl] skipped: no nccl_test (the build found no MPI or no NCCL)" | tee -a "$log"
    record nccl "skipped (no MPI/NCCL build)" 0 "$log"
    return
  fi
  # One GPU: np1 runs every NCCL collective for real; np2 and np4 skip inside (a rank per GPU).
  run_phase nccl 90 "$log" ctest --test-dir "$BUILD" -R '^nccl_test' --output-on-failure --timeout 80
  grep -E 'tests passed|tests failed|\(Failed\)|\(Timeout\)|Passed' "$log" | tail -n 5
  record nccl "$(status_of $PHASE_RC)" "$PHASE_S" "$log"
}

phase_unit_rest() {
  local log="$OUT/unit_rest.log"
  : >"$log"
  run_phase unit_rest 240 "$log" ctest --test-dir "$BUILD" -L unit -E "$CUDA_TESTS" \
    --output-on-failure -j "$CTEST_JOBS" --timeout 200
  grep -E 'tests passed|tests failed|\(Failed\)|\(Timeout\)|\(SEGFAULT\)|Not Run' "$log" | tail -n 15
  record unit_rest "$(status_of $PHASE_RC)" "$PHASE_S" "$log"
}

do_tests() {
  if [[ ! -f "$BUILD/build.ninja" && "$MODE" == test ]]; then
    echo "gpu_check: $BUILD is not configured here (a fresh machine?): building it first"
    do_build || true
  fi
  if [[ ! -x "$BUILD/bin/loom-gpt" ]]; then
    echo "gpu_check: $BUILD/bin/loom-gpt missing: the build did not finish; the tests run anyway"
  fi
  echo "gpu_check: GPU present: $([[ $have_gpu == 1 ]] && nvidia-smi -L | head -1 || echo no)"
  local phase
  for phase in ${LOOM_GPU_PHASES:-cuda_tests memcheck bench_cuda gpt nccl unit_rest}; do
    case "$phase" in
      cuda_tests) phase_cuda_tests ;;
      memcheck) phase_memcheck ;;
      bench_cuda) phase_bench ;;
      gpt) phase_gpt ;;
      nccl) phase_nccl ;;
      unit_rest) phase_unit_rest ;;
      *) echo "gpu_check: unknown phase '$phase' in LOOM_GPU_PHASES" \
              "(cuda_tests memcheck bench_cuda gpt nccl unit_rest)" >&2 ;;
    esac
  done
}

case "$MODE" in
  build) do_build ;;
  test) do_tests ;;
  all) do_build; do_tests ;;
esac

{
  echo
  echo "gpu_check summary ($MODE, $((SECONDS - START))s of the ${BUDGET}s budget; logs in $OUT)"
  printf '%-12s %-32s %6s  %s\n' phase status seconds log
  for row in "${ROWS[@]}"; do echo "$row"; done
  grep -h '^RESULT' "$OUT/gpt.log" 2>/dev/null
} | tee -a "$SUMMARY"
# Non-zero when any phase failed or timed out (skips are not failures).
if printf '%s\n' "${ROWS[@]}" | grep -qE ' (FAIL|TIMEOUT)'; then exit 1; fi
exit 0
