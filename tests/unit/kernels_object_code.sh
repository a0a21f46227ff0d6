#!/usr/bin/env bash
# Checks on the CPU kernels' object code in libloom.a, for what the compiler silently undid:
# - the embedding-bag kernels keep their software prefetches (Note [Prefetches the compiler
#   drops], kernels/cpu/embedding_bag_impl.h). GCC 12 deleted every call to a helper whose only
#   effect was __builtin_prefetch: the backward's object file held no prefetch instruction and
#   the forward one per forward_impl (its index loop's), and the backward ran 1.6-2x slower;
# - GELU's and dropout's loops are vectorised (Note [Selects that vectorise],
#   kernels/cpu/gelu.cpp): on an AVX2 target under -ftrapping-math they held no packed
#   floating-point instruction, and GELU ran 9x slower.
# Usage: kernels_object_code.sh path/to/libloom.a
set -euo pipefail
lib=${1:?usage: kernels_object_code.sh libloom.a}
if [[ $(uname -m) != x86_64 ]] || ! command -v objdump > /dev/null; then
  echo "kernels_object_code: needs x86-64 and objdump; skipped"
  exit 77
fi
dump=$(objdump -d --no-show-raw-insn -C "$lib")

# count <object file> <function-name pattern>: "<functions> <prefetch instructions>" in that
# object's disassembly.
count() {
  awk -v obj="$1:" -v pattern="$2" '
    /file format/ { inside = ($1 == obj) }
    inside && /^[0-9a-f]+ </ { functions += index($0, pattern) > 0 }
    inside && /\tprefetch/ { prefetches++ }
    END { print functions + 0, prefetches + 0 }' <<< "$dump"
}

status=0
check() {  # check <object> <pattern> <prefetches needed per function>
  read -r functions prefetches < <(count "$1" "$2")
  if (( functions == 0 )); then
    echo "FAIL: $1 has no function named like '$2' (renamed? update this test)"
    status=1
  elif (( prefetches < functions * $3 )); then
    echo "FAIL: $1 holds $prefetches prefetch instructions for $functions '$2' functions" \
         "(at least $3 each expected): the compiler dropped the look-ahead prefetches"
    status=1
  else
    echo "ok: $1: $prefetches prefetch instructions, $functions '$2' functions"
  fi
}
# check_packed <object>: the object holds packed single-precision arithmetic (SSE or AVX).
check_packed() {
  local packed
  packed=$(awk -v obj="$1:" '
    /file format/ { inside = ($1 == obj) }
    inside && /\tv?(mul|add|sub|div|fmadd[0-9]*|fnmadd[0-9]*|fmsub[0-9]*)ps/ { n++ }
    END { print n + 0 }' <<< "$dump")
  if (( packed == 0 )); then
    echo "FAIL: $1 holds no packed float arithmetic: its loops were not vectorised"
    status=1
  else
    echo "ok: $1: $packed packed float instructions"
  fi
}
check_packed gelu.cpp.o
check_packed dropout.cpp.o
# The forward: the index loop's prefetch and the look-ahead's, per weight and index type.
check embedding_bag.cpp.o "forward_impl<" 2
# The backward: the output-gradient rows (and the fused update's weight rows), per variant.
check embedding_bag_backward.cpp.o "for_each_segment<" 1
exit $status
