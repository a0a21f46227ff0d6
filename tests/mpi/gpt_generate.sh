#!/bin/bash
# loom-gpt --generate under mpirun against one process (the equivalence principle for text
# generation): after the same 6 training steps, every layout (--dp 2 with ZeRO-3, whose ranks hold
# half the weights each; --tp 2; --pp 2; --dp 2 x --tp 2 on 4 ranks) gathers the trained weights
# and samples the single process's text, token for token (temperature 0.8, top-k 5: the draws
# are counter-based, so only the weights could make them differ). The weights the single process
# --save'd, read back with --steps 0 --init-from, give the same text again; greedy decoding of a
# byte-level text model too.
# usage: gpt_generate.sh LOOM_GPT MPIEXEC [mpirun flags...]
set -euo pipefail
gpt=$1; mpiexec=$2; shift 2
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
common=(--steps 6 --batch 16 --layers 2 --dim 32 --heads 2 --eval-every 1000 --threads 1
        --lr 1e-3 --warmup-steps 0)
sample=(--generate "123+045=" --max-new-tokens 40 --temperature 0.8 --top-k 5)

# The text block loom-gpt prints after its `generate:` line (up to the held-out summary).
text_of() { awk '/^generate:/ {on = 1; next} /^target (not )?reached/ {on = 0} on' "$1"; }
check() {  # name log: its text equals the single process's
  if ! cmp -s <(text_of "$dir/single.log") <(text_of "$2"); then
    echo "FAIL $1: generated text differs from the single process"
    diff <(text_of "$dir/single.log") <(text_of "$2") || true
    exit 1
  fi
  echo "$1: the single process's $(text_of "$2" | wc -c)-byte sample"
}

"$gpt" "${common[@]}" "${sample[@]}" --save "$dir/single.safetensors" > "$dir/single.log"
[[ $(text_of "$dir/single.log" | head -c 8) == "123+045=" ]] ||
  { echo "FAIL: the sample does not start with the prompt"; cat "$dir/single.log"; exit 1; }

"$gpt" "${common[@]:2}" --steps 0 --init-from "$dir/single.safetensors" \
  "${sample[@]}" > "$dir/init_from.log"
check "--steps 0 --init-from" "$dir/init_from.log"

run() {  # name mpirun-arguments...: rank 0's output in $dir/name.log
  local name=$1
  shift
  "$mpiexec" "$@" > "$dir/$name.log" 2>&1 || { cat "$dir/$name.log"; exit 1; }
}
mpirun_flags=("$@")
run dp2_zero3 "${mpirun_flags[@]}" -np 2 "$gpt" "${common[@]}" "${sample[@]}" --dp 2 --zero 3
check "--dp 2 --zero 3" "$dir/dp2_zero3.log"
run tp2 "${mpirun_flags[@]}" -np 2 "$gpt" "${common[@]}" "${sample[@]}" --tp 2
check "--tp 2" "$dir/tp2.log"
run pp2 "${mpirun_flags[@]}" -np 2 "$gpt" "${common[@]}" "${sample[@]}" --pp 2
check "--pp 2" "$dir/pp2.log"
run dp2_tp2 "${mpirun_flags[@]}" -np 4 "$gpt" "${common[@]}" "${sample[@]}" --dp 2 --tp 2
check "--dp 2 --tp 2" "$dir/dp2_tp2.log"

# Byte-level text, greedy: the same continuation on one process and under --dp 2 --zero 1.
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 40) > "$dir/text.txt"
text=(--data "$dir/text.txt" --seq 16 --generate "the quick" --max-new-tokens 20 --temperature 0)
"$gpt" "${common[@]}" "${text[@]}" > "$dir/single.log"
[[ $(text_of "$dir/single.log" | head -c 9) == "the quick" ]] ||
  { echo "FAIL: the text sample does not start with the prompt"; cat "$dir/single.log"; exit 1; }
run text_dp2 "${mpirun_flags[@]}" -np 2 "$gpt" "${common[@]}" "${text[@]}" --dp 2 --zero 1
check "text, greedy, --dp 2 --zero 1" "$dir/text_dp2.log"
echo "gpt_generate: every layout generates the single process's text"
