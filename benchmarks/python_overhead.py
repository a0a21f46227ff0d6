#!/usr/bin/env python3
"""The cost of driving training from Python: examples/train_gpt.py and examples/nanogpt_port.py
against loom-gpt.

All three train the benchmark GPT configuration (4 layers, dim 256, 4 heads, seq 128, batch 8,
vocabulary 256, f32, AdamW, clip 1.0; as benchmarks/gpt_vs_pytorch.py) for the same steps, one
process each, alternating runs so that drift on a shared machine hits them alike. Step time is
each run's median over the steps after --warmup; an overhead is the median over rounds of
python / C++ - 1.
- train_gpt.py is loom-gpt's loop through the Python API with the built-in GPT and the same
  flags and text: its losses must equal loom-gpt's (same ops, same order).
- nanogpt_port.py is a PyTorch user's script converted to loom: the model is written in Python
  (every layer a Python module calling loom ops), AdamW over two parameter groups, a LambdaLR
  schedule, a DataLoader over random tokens. Its losses differ (other weights and data); its
  step times the whole forward, backward, clipping and optimizer step, as loom-gpt's does.

usage: python3 benchmarks/python_overhead.py [--steps 30] [--rounds 3] [--threads N]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def step_times(metrics, warmup):
    rows = [json.loads(line) for line in open(metrics) if '"loss"' in line]
    return [r["step_ms"] for r in rows[warmup:]], [r["loss"] for r in rows]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="OMP_NUM_THREADS (0: leave as is)")
    p.add_argument("--loom-gpt", default=os.path.join(ROOT, "build", "bin", "loom-gpt"))
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON to FILE "
                   "(benchmarks/report.py reads it)")
    args = p.parse_args()
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", os.path.join(ROOT, "build", "python"))
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    flags = ["--layers", "4", "--dim", "256", "--heads", "4", "--seq", "128", "--batch", "8",
             "--steps", str(args.steps), "--optimizer", "adamw", "--lr", "1e-3",
             "--lr-schedule", "constant", "--warmup-steps", "0", "--grad-clip", "1.0"]
    programs = {"loom-gpt": [args.loom_gpt],
                "train_gpt.py": [sys.executable, os.path.join(ROOT, "examples", "train_gpt.py")],
                "nanogpt_port.py": [sys.executable, os.path.join(ROOT, "examples",
                                                                 "nanogpt_port.py")]}
    port_flags = ["--lib", "loom", "--layers", "4", "--dim", "256", "--heads", "4", "--seq",
                  "128", "--batch", "8", "--vocab", "256", "--steps", str(args.steps),
                  "--passes", "1", "--warmup", "0", "--lr", "1e-3", "--min-lr", "1e-3"]
    with tempfile.TemporaryDirectory() as tmp:
        text = os.path.join(tmp, "text.txt")
        with open(text, "w") as f:  # byte-level data: any text; the repository's README
            f.write(open(os.path.join(ROOT, "README.md")).read() * 4)
        medians = {name: [] for name in programs}
        losses = {}
        for r in range(args.rounds):
            for name, cmd in programs.items():
                metrics = os.path.join(tmp, f"{r}.{name}.jsonl")
                if name == "nanogpt_port.py":  # prints its JSON lines
                    with open(metrics, "w") as out:
                        subprocess.run(cmd + port_flags, env=env, check=True, stdout=out)
                else:
                    subprocess.run(cmd + flags + ["--data", text, "--metrics-file", metrics],
                                   env=env, check=True, stdout=subprocess.DEVNULL)
                times, losses[name] = step_times(metrics, args.warmup)
                medians[name].append(statistics.median(times))
        ratios = [py / c for py, c in zip(medians["train_gpt.py"], medians["loom-gpt"])]
        port_ratios = [py / c for py, c in zip(medians["nanogpt_port.py"], medians["loom-gpt"])]
    same = losses["loom-gpt"] == losses["train_gpt.py"]
    print(f"config: layers 4 dim 256 heads 4 seq 128 batch 8 vocab 256, f32, AdamW, "
          f"{args.steps} steps (median after {args.warmup}), {args.rounds} alternating rounds, "
          f"OMP_NUM_THREADS={env.get('OMP_NUM_THREADS', 'unset')}")
    for name in programs:
        print(f"{name:>13}: step {statistics.median(medians[name]):.2f} ms "
              f"(rounds: {', '.join(f'{m:.2f}' for m in medians[name])})")
    print(f"Python overhead, train_gpt.py: {100 * (statistics.median(ratios) - 1):+.2f}% "
          f"(rounds: {', '.join(f'{100 * (x - 1):+.2f}%' for x in ratios)}); losses "
          f"{'identical' if same else 'DIFFER'}")
    print(f"Python overhead, nanogpt_port.py: {100 * (statistics.median(port_ratios) - 1):+.2f}% "
          f"(rounds: {', '.join(f'{100 * (x - 1):+.2f}%' for x in port_ratios)})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({name: statistics.median(medians[name]) for name in programs} |
                      {"overhead_train_gpt": statistics.median(ratios) - 1,
                       "overhead_nanogpt_port": statistics.median(port_ratios) - 1,
                       "losses_identical": same,
                       "threads": env.get("OMP_NUM_THREADS", "unset")}, f)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
