#!/bin/bash
# `make sanitize`, and the last step of `make test` (LOOM_SKIP_SANITIZE=1 skips it there): the unit
# tests and one short MPI run under AddressSanitizer + UndefinedBehaviorSanitizer (LeakSanitizer
# comes with ASan), in a build directory of their own (default build-sanitize).
#
# One build with both sanitizers, CPU only (no CUDA, NCCL, Python module or benchmarks), at -O1 -g1
# (the speed ASan recommends, and line numbers in reports) without NDEBUG, and only the targets
# run here: libloom, the unit-test binaries and collectives_test. UB is made fatal at compile time
# (-fno-sanitize-recover=undefined), and besides the exit statuses the script searches every test's
# whole output (ctest's LastTest.log) for sanitizer reports, so a report fails the job even when
# it comes from a process whose exit status nobody checks (a forked child, one rank of several).
# (ASan's log_path would be neater, but with gcc's two runtimes in one process it only takes
# LSan's reports.)
#
# What runs:
# - every ctest entry labelled unit, except those with cuda in the name: built without CUDA they
#   are one GTEST_SKIP each and would only add build time;
# - collectives_test_np2 (every collective over the mpi backend, 2 ranks under mpirun).
# Leaks inside Open MPI / hwloc / libevent are suppressed by tests/sanitize/lsan.supp (library
# frames only; nothing of loom's is suppressed there).
#
# usage: run.sh [BUILD_DIR]   (JOBS: parallel compile and test jobs, default nproc)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
build=${1:-build-sanitize}
jobs=${JOBS:-$(nproc)}
say() { echo "sanitize: $*"; }
start=$SECONDS

# Configure every time: it takes seconds when nothing changed, and keeps the directory's flags
# the ones written here.
mkdir -p "$build"
say "configuring $build (LOOM_SANITIZE=address,undefined, CPU only)"
cmake -S . -B "$build" -G Ninja --no-warn-unused-cli -DPython3_EXECUTABLE=/usr/bin/python3 \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" \
  -DCMAKE_CXX_FLAGS=-fno-sanitize-recover=undefined -DLOOM_SANITIZE=address,undefined \
  -DLOOM_WITH_CUDA=OFF -DLOOM_WITH_NCCL=OFF -DLOOM_WITH_PYTHON=OFF -DLOOM_BUILD_BENCHMARKS=OFF \
  > "$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }

# The unit tests are tests/unit/*_test.cpp, one binary each (tests/CMakeLists.txt).
skip_regex=cuda
unit=()
skipped=()
for src in tests/unit/*_test.cpp; do
  name=$(basename "$src" .cpp)
  if [[ $name =~ $skip_regex ]]; then skipped+=("$name"); else unit+=("$name"); fi
done
say "leaving out ${#skipped[@]} CUDA unit tests (built without CUDA they only skip): ${skipped[*]}"
mpi_test=collectives_test
mpi_entry=${mpi_test}_np2
say "building libloom, ${#unit[@]} unit tests and $mpi_test in $build (-j $jobs)"
cmake --build "$build" -j "$jobs" --target "${unit[@]}" "$mpi_test" > "$build/build.log" 2>&1 ||
  { tail -60 "$build/build.log"; say "build failed (log: $build/build.log)"; exit 1; }
built=$SECONDS
say "built in $((built - start)) s"
# A guard against a build that silently lost its flags: the binaries load both runtimes. (ldd's
# output is read whole first: `ldd | grep -q` under pipefail fails when grep exits before ldd
# has written everything, which it does once the first line matches.)
deps=$(ldd "$build/bin/$mpi_test")
for lib in libasan libubsan; do
  grep -q "$lib" <<< "$deps" ||
    { say "FAILED: $build/bin/$mpi_test is not linked with $lib (LOOM_SANITIZE ignored?)"; exit 1; }
done

# halt_on_error: the first report ends the process with a non-zero status (LSan's at exit).
# detect_stack_use_after_return and the init-order checks are off by default in gcc's ASan.
export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1
export LSAN_OPTIONS="suppressions=$here/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
reports='ERROR: (Address|Leak)Sanitizer|SUMMARY: (Address|Leak|UndefinedBehavior)Sanitizer|: runtime error: '

# run_ctest NAME LOG ARGS...: runs ctest, keeps the full output of every test in LOG, and fails
# on a failed test or on any sanitizer report in any test's output.
run_ctest() {
  local what=$1 log=$2 status=0
  shift 2
  ctest --test-dir "$build" --output-on-failure "$@" > "$log.summary" 2>&1 || status=$?
  cp "$build/Testing/Temporary/LastTest.log" "$log"
  grep -E '^ *[0-9]+/[0-9]+ Test|tests passed' "$log.summary" | sed 's/^/  /' || true
  if grep -Eq "$reports" "$log"; then
    grep -E -B2 -A40 "$reports" "$log" | head -300 || true
    say "FAILED: $(grep -Ec "$reports" "$log") sanitizer report line(s) in $what (above; all in $log)"
    exit 1
  fi
  if [ $status -ne 0 ]; then
    cat "$log.summary"
    say "FAILED: $what (ctest status $status; output in $log)"
    exit 1
  fi
}

unit_regex="^($(IFS='|'; echo "${unit[*]}"))\$"
say "running ${#unit[@]} unit tests (ctest -L unit -j $jobs)"
run_ctest "the unit tests" "$build/unit-tests.log" -L unit -R "$unit_regex" -j "$jobs" --timeout 600
ran=$(grep -Ec '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .* Passed' "$build/unit-tests.log.summary" || true)
if [ "$ran" -ne ${#unit[@]} ]; then
  say "FAILED: expected ${#unit[@]} unit tests to pass, ctest reported $ran"
  exit 1
fi
say "$ran unit tests passed clean"

say "running $mpi_entry (mpirun -np 2)"
# Full allocation stacks, so that the suppressions of Open MPI's own leaks can see its frames.
ASAN_OPTIONS=$ASAN_OPTIONS:fast_unwind_on_malloc=0:malloc_context_size=64 \
  run_ctest "$mpi_entry" "$build/mpi-test.log" -R "^${mpi_entry}\$"
grep -q '100% tests passed, 0 tests failed out of 1$' "$build/mpi-test.log.summary" ||
  { say "FAILED: ctest did not run $mpi_entry"; exit 1; }
say "$mpi_entry passed clean"
say "done: build $((built - start)) s, tests $((SECONDS - built)) s, no sanitizer reports"
