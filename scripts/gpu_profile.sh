#!/usr/bin/env bash
# Where a GPT-2 124M training step spends its GPU time: runs loom-gpt --device cuda (bf16 by
# default) for a few steps under Nsight Systems and prints the kernels by total time, with each
# one's share of all kernel time. Run on the GPU machine after scripts/gpu_check.sh has built
# build-gpu (in the same device call: build-gpu does not survive between fresh machines):
#
#   bash scripts/gpu_profile.sh [bf16|f32] [STEPS]      (default bf16, 6 steps)
#
# Needs `nsys` (Nsight Systems, part of the CUDA toolkit on most images); says so and exits 0
# when it is missing, so a device call can run it unconditionally.
set -euo pipefail
cd "$(dirname "$0")/.."
dtype="${1:-bf16}"
steps="${2:-6}"
build="${LOOM_GPU_BUILD:-build-gpu}"
nsys="$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -n 1 || true)"
if [[ -z "$nsys" ]]; then
  echo "gpu_profile: no nsys on this machine; nothing profiled"
  exit 0
fi
[[ -x "$build/bin/loom-gpt" ]] || { echo "gpu_profile: $build/bin/loom-gpt is not built" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 scripts/random_gpt2_tokens.py "$work/tokens.bin"
"$nsys" profile --trace=cuda --sample=none --cpuctxsw=none -o "$work/profile" \
  "$build/bin/loom-gpt" --device cuda --dtype "$dtype" --layers 12 --dim 768 --heads 12 \
  --seq 1024 --batch 8 --data "$work/tokens.bin" --steps "$steps" --lr 3e-4 \
  --lr-schedule constant --warmup-steps 0 >"$work/gpt.log" 2>&1 || { cat "$work/gpt.log"; exit 1; }
grep RESULT "$work/gpt.log" || true
"$nsys" stats --quiet --report cuda_gpu_kern_sum --format csv --output "$work/kern" \
  "$work/profile.nsys-rep" >/dev/null
csv="$(ls "$work"/kern*.csv | head -n 1)"
python3 - "$csv" "$steps" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
steps = int(sys.argv[2])
key = next(k for k in rows[0] if k.startswith("Total Time"))
total = sum(float(r[key]) for r in rows)
print(f"{len(rows)} kernels, {total / 1e6 / steps:.1f} ms of kernel time per step ({steps} steps, "
      "first included)")
print(f"{'ms/step':>8} {'share':>6} {'calls/step':>10}  kernel")
for r in sorted(rows, key=lambda r: -float(r[key]))[:30]:
    t = float(r[key]) / 1e6 / steps
    print(f"{t:8.2f} {100 * float(r[key]) / total:5.1f}% {int(r['Instances']) / steps:10.1f}  "
          f"{r['Name'][:110]}")
PY
