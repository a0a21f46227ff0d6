#!/bin/bash
# `make fuzz`: builds the libFuzzer targets of tests/fuzz with clang (ASan + UBSan) against the
# main build's libloom, writes seed corpora of valid files (tests/fuzz/seeds.py), and runs each
# target for FUZZ_SECONDS (default 60) with its dictionary. A crash, sanitizer report, leak or
# timeout stops that target and leaves its input in build-fuzz/findings/; the script then exits 1
# naming it. Turn each finding into a regression test (tests/unit/io_*_test.cpp) once fixed.
# usage: run.sh BUILD_DIR [FUZZ_SECONDS]
set -euo pipefail
build=$(cd "$1" && pwd); seconds=${2:-${FUZZ_SECONDS:-60}}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out="$build/../build-fuzz"
command -v clang++ > /dev/null || { echo "make fuzz: clang++ is missing (apt-get install clang)"; exit 1; }
[ -f "$build/libloom.a" ] || { echo "make fuzz: build loom first ($build has no libloom.a)"; exit 1; }
mkdir -p "$out"
# The package as a user installs it (the build tree's loomConfig expects an install).
cmake --install "$build" --prefix "$out/loom-prefix" > /dev/null
cmake -S "$here" -B "$out" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_PREFIX_PATH="$out/loom-prefix" -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON \
  > "$out/configure.log" 2>&1 || { cat "$out/configure.log"; exit 1; }
cmake --build "$out"
PYTHONPATH="$build/python" LOOM_GPT="$build/bin/loom-gpt" /usr/bin/python3 "$here/seeds.py" "$out/corpus"
mkdir -p "$out/findings"
failed=()
for target in fuzz_safetensors fuzz_gpt_weights fuzz_token_file fuzz_manifest fuzz_schedule; do
  corpus="$out/corpus/${target#fuzz_}"
  mkdir -p "$corpus"
  dict=()
  [ -f "$here/${target#fuzz_}.dict" ] && dict=(-dict="$here/${target#fuzz_}.dict")
  echo "make fuzz: $target for ${seconds} s"
  if ! "$out/$target" "$corpus" "${dict[@]}" -max_total_time="$seconds" -timeout=10 \
      -rss_limit_mb=4096 -artifact_prefix="$out/findings/$target-" -print_final_stats=1 \
      > "$out/$target.log" 2>&1; then
    failed+=("$target")
    tail -40 "$out/$target.log"
  fi
  grep -E "^stat::number_of_executed_runs|^Done" "$out/$target.log" | tr '\n' ' '; echo
done
rm -f /dev/shm/loom-fuzz-*
if [ ${#failed[@]} -gt 0 ]; then
  echo "make fuzz: findings in ${failed[*]} (inputs in $out/findings/)"; exit 1
fi
echo "make fuzz: no findings"
