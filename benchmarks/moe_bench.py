#!/usr/bin/env python3
"""Mixture-of-experts throughput (issue 22): loom-gpt's tokens/s for a dense model, an 8-expert
top-1 model (the same active parameters per token as the dense one), an 8-expert top-2 model
with experts of half width (--moe-hidden 2 x dim: again the dense model's active parameters,
the issue's comparison) and one with full-width experts (twice the MLP work per token), on one process and with the experts split over 2 and 4 ranks
(--dp N --ep N), on byte-level text (this repository's README.md). Each figure is the median of
the steps after the first two; with experts split over ranks, also rank 0's time in the
experts' all-to-alls (forward and backward, waiting included) as a share of the step; every run
also prints its loss at the last step.

usage: python3 benchmarks/moe_bench.py [--build build] [--steps 12] [--threads 1]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPI = ["mpirun", "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader",
       "--mca", "btl_vader_single_copy_mechanism", "none", "--mca", "oob_tcp_if_include", "lo"]


def run(build, ranks, flags, steps, threads):
    gpt = os.path.join(build, "bin", "loom-gpt")
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.jsonl")
        args = [gpt, "--data", os.path.join(ROOT, "README.md"), "--layers", "4", "--dim", "256",
                "--heads", "4", "--seq", "64", "--batch", "16", "--steps", str(steps),
                "--threads", str(threads), "--metrics-file", metrics, *flags]
        if ranks > 1:
            args = MPI + ["-np", str(ranks)] + args + ["--dp", str(ranks)]
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMPI_ALLOW_RUN_AS_ROOT="1",
                   OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        r = subprocess.run(args, capture_output=True, text=True, env=env)
        if r.returncode != 0:
            sys.exit(f"moe_bench: {' '.join(args)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
        rows = [json.loads(l) for l in open(metrics) if '"tokens_per_s"' in l]
    timed = rows[2:]
    share = None
    if "moe_exchange_ms" in timed[0]:  # rank 0's time in the experts' all-to-alls
        share = (statistics.median(r["moe_exchange_ms"] for r in timed)
                 / statistics.median(r["step_ms"] for r in timed))
    return statistics.median(r["tokens_per_s"] for r in timed), rows[-1]["loss"], share


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--threads", type=int, default=1)
    o = ap.parse_args()
    models = [("dense", []),
              ("8 experts, top-1", ["--moe-experts", "8"]),
              ("8 experts, top-2, hidden 2C", ["--moe-experts", "8", "--moe-top-k", "2",
                                               "--moe-hidden", "512"]),
              ("8 experts, top-2", ["--moe-experts", "8", "--moe-top-k", "2"])]
    print("| model | ranks | tokens/s | vs dense on as many ranks | all-to-all share of the step "
          "| loss at the last step |")
    print("|---|---:|---:|---:|---:|---:|")
    for ranks in (1, 2, 4):
        dense = None
        for name, flags in models:
            if ranks > 1 and flags:
                flags = flags + ["--ep", str(ranks)]
            tps, loss, share = run(o.build, ranks, flags, o.steps, o.threads)
            dense = dense or tps
            a2a = "-" if share is None else f"{share:.2f}"
            print(f"| {name} | {ranks} | {tps:.0f} | {tps / dense:.2f} | {a2a} | {loss:.6f} |",
                  flush=True)


if __name__ == "__main__":
    main()
