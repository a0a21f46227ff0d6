#!/usr/bin/env python3
"""loom-plan's memory model against loom-gpt's measured peak (issue 23's "memory within 5%").

For every layout of the planner benchmark's GPT (benchmarks/plan_vs_measured.py: 4 layers, dim
256, 4 heads, seq 128, batch 8, vocab 256, f32) on 1, 2, 4 and 8 ranks, dense and (up to 4 ranks)
mixture-of-experts (4 experts, top-2, every 2nd layer, 512 wide), loom-gpt trains three steps and
prints rank 0's allocator peak (the CPU allocator counts tensor bytes exactly, so the peak is
deterministic), and `loom-plan --evaluate` predicts rank 0's peak for the same layout (Note [Where
the memory peaks]
in planner/memory_model.cpp). Each dense prediction must be within 5% of the measurement, each
MoE one within 6%, except the layouts in WIDER, whose bounds say how far the model is known to be
off and why. MoE's extra 1%: its peak depends on the routing (an expert that gets no tokens in a
step gets no gradient), which the model does not see and which moves with the GEMMs' last bits
(another CPU's kernel), and on the timing of the experts' exchanges: the same layout's peak moved
by up to 0.9% between runs here.

A router does not balance, and the model counts balanced rows unless told: a third set,
"capped", is every third layer MoE (the last one too) trained and planned with
`--moe-capacity-factor 1.25`, which the planner takes as the worst case the capacity allows (an
expert's 1.25 times its share of the whole batch, all of which the rank's ep group may send:
1.25 dp / ep times the balanced rows). Its router sends rank 0's experts up to 1.9 times their
share by the third step (dropless and balanced, the model was 7-10% under; benchmarks/README.md,
"MoE routing").

usage: plan_memory.py LOOM_GPT LOOM_PLAN MPIEXEC [mpirun flags...]
"""
import json
import os
import random
import re
import struct
import subprocess
import sys
import tempfile

# The planner benchmark's layouts and its translation of a layout into loom-gpt's flags.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "benchmarks"))
from plan_vs_measured import LAYOUTS, MOE_LAYOUTS, gpt_flags  # noqa: E402

BOUND = {"dense": 0.05, "moe": 0.06, "capped": 0.06}
# The benchmark's layouts on 1, 2, 4 and 8 ranks, and a few more where the peak falls elsewhere:
# one sequence per micro-batch (the end of a backward), ZeRO-2 with and without accumulation (its
# staged buckets), ZeRO-3 with small micro-batches (the second layer's backward), pipelines with
# ZeRO-1, 2 and 3, Chimera with ZeRO-0 to 3 (ZeRO-1's replica pairs summed in its buckets).
DENSE = {
    1: LAYOUTS[1] + ["dp=1,mb=1", "dp=1,mb=1,recompute=full"],
    2: LAYOUTS[2] + ["dp=2,mb=4,zero=2", "dp=2,mb=2,zero=2", "dp=2,mb=1,zero=3"],
    4: LAYOUTS[4] + ["dp=4,mb=2,zero=2", "dp=4,mb=1,zero=2", "dp=4,mb=1,zero=3",
                     "dp=2,pp=2,mb=2,schedule=1f1b,zero=1", "dp=2,pp=2,mb=2,schedule=1f1b,zero=2",
                     "dp=2,pp=2,mb=2,schedule=1f1b,zero=3", "dp=2,pp=2,mb=1,schedule=gpipe,zero=2",
                     "dp=2,pp=2,mb=1,schedule=chimera", "dp=2,pp=2,mb=2,schedule=chimera,zero=1",
                     "dp=2,pp=2,mb=1,schedule=chimera,zero=1",
                     "dp=2,pp=2,mb=2,schedule=chimera,zero=2",
                     "dp=2,pp=2,mb=2,schedule=chimera,zero=3"],
    8: LAYOUTS[8],
}
MOE = {ranks: MOE_LAYOUTS[ranks] for ranks in (1, 2, 4)}
MOE[4] = MOE[4] + ["dp=4,mb=2,zero=2,ep=2", "dp=4,mb=1,zero=2,ep=2"]
CAPPED = {2: ["dp=2,mb=4,ep=2"], 4: ["dp=4,mb=2,ep=2", "dp=4,mb=2,ep=4", "dp=4,mb=2,zero=1,ep=4"]}
# Known to be further off: none of these layouts now (MoE ZeRO-3 with experts sharded over
# replicas was +8.8% to +9.7% while the model counted two dense blocks gathered where the one
# before the last is a MoE block).
WIDER = {}
MODEL = ["--layers", "4", "--heads", "4", "--seq", "128", "--vocab", "256"]
MOE_FLAGS = ["--moe-experts", "4", "--moe-top-k", "2", "--moe-every", "2", "--moe-hidden", "512"]
CAPPED_FLAGS = ["--moe-experts", "4", "--moe-top-k", "2", "--moe-every", "3", "--moe-hidden", "512"]
# Per set: the model's flags (both programs), loom-gpt's own and loom-plan's own.
FLAGS = {"dense": ([], [], []), "moe": (MOE_FLAGS, [], []),
         "capped": (CAPPED_FLAGS + ["--moe-capacity-factor", "1.25"], [], [])}


def run(cmd):
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def main():
    gpt, plan, mpiexec = sys.argv[1:4]
    mpi_flags = sys.argv[4:]
    with tempfile.TemporaryDirectory() as d:
        # Random tokens in loom-gpt's token-file format (a 256-int header, then uint16 tokens).
        rng = random.Random(0)
        tokens = [rng.randrange(256) for _ in range(64 * 8 * 128)]
        data = os.path.join(d, "tokens.bin")
        with open(data, "wb") as f:
            f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
            f.write(struct.pack(f"<{len(tokens)}H", *tokens))
        # The CPU as `loom-plan --calibrate` writes it: nothing reserved, no fragmentation (the
        # rates do not enter the memory model).
        profile = os.path.join(d, "profile.json")
        with open(profile, "w") as f:
            json.dump({"device": {"reserved_bytes": 0, "fragmentation": 0,
                                  "memory_bytes": 8e9}}, f)
        failures, errors = [], []
        for model, sets in (("dense", DENSE), ("moe", MOE), ("capped", CAPPED)):
            extra, gpt_only, plan_only = FLAGS[model]
            for ranks, layouts in sets.items():
                for layout in layouts:
                    launch = [mpiexec, "-np", str(ranks)] + mpi_flags if ranks > 1 else []
                    out = run(launch + [gpt, "--data", data, "--dim", "256", "--batch", "8",
                                        "--steps", "3", "--threads", "1", "--eval-every",
                                        "100000", "--lr-schedule", "constant", "--warmup-steps",
                                        "0"] + MODEL + extra + gpt_only + gpt_flags(layout, 8))
                    measured = float(re.search(r"peak memory on rank 0: ([\d.]+) MB",
                                               out).group(1))
                    pred = json.loads(run(
                        [plan, "--hidden", "256", "--global-batch", "8", "--gpus", str(ranks),
                         "--gpus-per-node", str(ranks), "--profile", profile, "--execution",
                         "loom-cpu", "--evaluate", layout, "--json"] + MODEL + extra + plan_only))
                    predicted = pred["memory_per_pipeline_rank"][0]["total"] / 1e6
                    error = predicted / measured - 1
                    bound = WIDER.get((model, ranks, layout), BOUND[model])
                    errors.append(abs(error))
                    verdict = "ok" if abs(error) <= bound else f"OVER {100 * bound:.0f}%"
                    print(f"{model:6s} {ranks} rank(s) {layout:44s} measured {measured:7.2f} MB "
                          f"predicted {predicted:7.2f} MB ({100 * error:+5.1f}%) {verdict}",
                          flush=True)
                    if abs(error) > bound:
                        failures.append(layout)
        errors.sort()
        print(f"{len(errors)} layouts: median error {100 * errors[len(errors) // 2]:.1f}%, "
              f"worst {100 * errors[-1]:.1f}%")
        if failures:
            sys.exit(f"plan_memory: {len(failures)} layouts off by more than their bound")
    print("plan_memory: all checks passed")


if __name__ == "__main__":
    main()
