#!/usr/bin/env python3
"""ZeRO in pipelines (issue 22): what each ZeRO stage costs and saves on dp 2 x pp 2, side by
side in one run. For --zero 0 (DDP), 1, 2 and 3 under 1F1B and Chimera, loom-gpt trains a
dim-256 GPT of 8 blocks (4 per stage; Chimera holds two stages per rank) on byte-level text
(this repository's README.md, so no evaluation runs inside the steps) and reports what a rank
keeps between steps (its "memory per rank" line: parameters, gradients, optimizer state), rank
0's peak in the steps as the CPU allocator counted it, and tokens/s (the median of the steps
after the first two). Every run prints its last loss: they agree to the rounding of the
reductions' order.

usage: python3 benchmarks/pipeline_zero_bench.py [--build build] [--steps 8] [--layers 8]
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPI = ["mpirun", "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader",
       "--mca", "btl_vader_single_copy_mechanism", "none", "--mca", "oob_tcp_if_include", "lo"]


def run(build, schedule, zero, steps, layers):
    gpt = os.path.join(build, "bin", "loom-gpt")
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.jsonl")
        args = MPI + ["-np", "4", gpt, "--data", os.path.join(ROOT, "README.md"),
                      "--layers", str(layers), "--dim", "256", "--heads", "4", "--seq", "16",
                      "--batch", "8", "--steps", str(steps), "--threads", "1",
                      "--warmup-steps", "0", "--bucket-mb", "0.5", "--dp", "2", "--pp", "2",
                      "--microbatches", "4", "--schedule", schedule, "--zero", str(zero),
                      "--metrics-file", metrics]
        env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
                   OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        r = subprocess.run(args, capture_output=True, text=True, env=env)
        if r.returncode != 0:
            sys.exit(f"pipeline_zero_bench: {' '.join(args)} failed:\n{r.stdout[-2000:]}\n"
                     f"{r.stderr[-2000:]}")
        kept = re.search(r"memory per rank: parameters ([\d.]+) MB, gradients ([\d.]+) MB, "
                         r"optimizer state ([\d.]+) MB", r.stdout)
        peak = re.search(r"peak memory on rank 0 in the steps: ([\d.]+) MB", r.stdout)
        if not kept or not peak:
            sys.exit(f"pipeline_zero_bench: no memory lines in the output of {' '.join(args)}")
        rows = [json.loads(line) for line in open(metrics) if '"loss"' in line]
        return {"params": float(kept.group(1)), "grads": float(kept.group(2)),
                "state": float(kept.group(3)), "peak": float(peak.group(1)),
                "tok_s": statistics.median(x["tokens_per_s"] for x in rows[2:]),
                "loss": rows[-1]["loss"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--layers", type=int, default=8)
    a = ap.parse_args()
    print(f"dp 2 x pp 2, 4 micro-batches, dim 256, {a.layers} blocks, 4 ranks on "
          f"{os.cpu_count()} CPUs, 1 thread each")
    print("| schedule | ZeRO | kept: parameters / gradients / optimizer state (MB) | "
          "peak in the steps, rank 0 (MB) | tokens/s | last loss |")
    print("|---|---|---|---|---|---|")
    for schedule in ("1f1b", "chimera"):
        for zero in (0, 1, 2, 3):
            r = run(a.build, schedule, zero, a.steps, a.layers)
            print(f"| {schedule} | {zero} | {r['params']:.2f} / {r['grads']:.2f} / "
                  f"{r['state']:.2f} | {r['peak']:.2f} | {r['tok_s']:.0f} | {r['loss']:.6f} |",
                  flush=True)


if __name__ == "__main__":
    main()
