#!/usr/bin/env python3
"""Trains the same GPT with loom (build/bin/loom-gpt) and with PyTorch, both on the same number of
threads (--threads, default 1), for the same steps on the same tokens, and prints both step
times and the ratio. PyTorch must run on an optimized BLAS (benchmarks/peer_blas.py): on the
reference BLAS the ratio is refused.

Default configuration is the issue's target: 4 layers, dim 256, 4 heads, seq 128, batch 8,
vocab 256, f32, AdamW. Step time is the median over the steps after `--warmup` steps.
Usage: python3 benchmarks/gpt_vs_pytorch.py [--threads 1] [--steps 30] [--layers 4 --dim 256 ...]
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))


def _flag_from_argv(name, default):
    """--name N from the command line, read before torch is imported."""
    argv = sys.argv[1:]
    for i, arg in enumerate(argv):
        if arg.startswith(name + "="):
            return int(arg.split("=", 1)[1])
        if arg == name and i + 1 < len(argv):
            return int(argv[i + 1])
    return default


# Before numpy and torch are imported: OpenBLAS sizes its thread pool when it loads.
THREADS = _flag_from_argv("--threads", 1)
os.environ["OMP_NUM_THREADS"] = str(THREADS)
os.environ["OPENBLAS_NUM_THREADS"] = str(_flag_from_argv("--blas-threads", THREADS))
# PyTorch at its best with several threads: its OpenMP threads spin while they wait by default,
# and on the 2-vCPU development VM that made its 2-thread step 2x slower than its 1-thread one
# (387 vs 191 ms); passive waiting gives its best (191 ms). loom-gpt keeps its own default.
TORCH_WAIT_POLICY = None
if THREADS > 1 and "OMP_WAIT_POLICY" not in os.environ:
    TORCH_WAIT_POLICY = os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
# numpy too loads OpenBLAS, which reads OPENBLAS_NUM_THREADS once, when it loads: imported before
# the line above, it left PyTorch's "one-thread" GEMMs on two OpenBLAS threads.
import numpy as np  # noqa: E402
import torch  # noqa: E402

import gpt2_reference as ref  # noqa: E402
import peer_blas  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown cpu"


def add_run_args(p, batch, batch_help):
    """The model, data and run flags both comparisons share."""
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=batch, help=batch_help)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--loom-gpt", default=os.path.join(ROOT, "build", "bin", "loom-gpt"))


def loom_step_ms(args, tokens_path, ckpt_path):
    metrics = os.path.join(os.path.dirname(tokens_path), "loom_metrics.jsonl")
    cmd = [args.loom_gpt, "--init-from", ckpt_path, "--data", tokens_path,
           "--steps", str(args.steps), "--batch", str(args.batch), "--seq", str(args.seq),
           "--optimizer", "adamw", "--lr", "1e-3", "--lr-schedule", "constant",
           "--warmup-steps", "0", "--grad-clip", "0", "--metrics-file", metrics]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    if TORCH_WAIT_POLICY:
        env.pop("OMP_WAIT_POLICY")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"loom-gpt failed:\n{proc.stdout}\n{proc.stderr}")
    records = [json.loads(l) for l in open(metrics) if l.strip()]
    steps = [r for r in records if "step_ms" in r]
    return [r["step_ms"] for r in steps[args.warmup:]], [r["loss"] for r in steps]


def torch_step_ms(args, cfg, tokens):
    torch.set_num_threads(args.threads)
    _, params = ref.read_checkpoint(args.ckpt)
    leaves = ref.leaf_params(params)
    opt = torch.optim.AdamW(leaves.values(), lr=1e-3, weight_decay=0.0)
    times, losses = [], []
    n_batches = (len(tokens) - 1) // (args.batch * args.seq)
    for step in range(args.steps):
        x, y = ref.batch(tokens, step % n_batches, args.batch, args.seq)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = ref.forward_loss(cfg, leaves, x, y)
        loss.backward()
        opt.step()
        times.append((time.perf_counter() - t0) * 1e3)
        losses.append(loss.item())
    return times[args.warmup:], losses


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_run_args(p, batch=8, batch_help="sequences per step")
    p.add_argument("--threads", type=int, default=1, help="threads for each side (both the same)")
    p.add_argument("--blas-threads", type=int, default=None,
                   help="OpenBLAS's own threads in PyTorch (default: --threads; its pthread pool "
                        "and torch's OpenMP threads share the cores)")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON to FILE "
                   "(benchmarks/report.py reads it)")
    args = p.parse_args()
    if not os.path.exists(args.loom_gpt):
        sys.exit(f"{args.loom_gpt} not found: run `make` first")

    cfg = dict(max_seq_len=args.seq, vocab=args.vocab, padded_vocab=args.vocab,
               layers=args.layers, heads=args.heads, channels=args.dim)
    with tempfile.TemporaryDirectory() as d:
        args.ckpt = os.path.join(d, "init.bin")
        tokens_path = os.path.join(d, "tokens.bin")
        ref.write_checkpoint(args.ckpt, cfg, ref.random_checkpoint(cfg, seed=0))
        tokens = np.random.default_rng(0).integers(0, args.vocab, size=16 * args.batch * args.seq + 1)
        ref.write_tokens(tokens_path, tokens)
        loom_ms, loom_losses = loom_step_ms(args, tokens_path, args.ckpt)
        torch_ms, torch_losses = torch_step_ms(args, cfg, tokens)

    lm, tm = statistics.median(loom_ms), statistics.median(torch_ms)
    print(f"machine: {cpu_name()}, {args.threads} thread(s) each; torch {torch.__version__}")
    print(peer_blas.blas_line(torch.get_num_threads()) +
          (f"; PyTorch with OMP_WAIT_POLICY={TORCH_WAIT_POLICY}" if TORCH_WAIT_POLICY else ""))
    print(f"config: layers {args.layers} dim {args.dim} heads {args.heads} seq {args.seq} "
          f"batch {args.batch} vocab {args.vocab} f32 AdamW, median of {len(loom_ms)} steps "
          f"after {args.warmup} warm-up")
    print(f"loom    step {lm:8.2f} ms  ({args.batch * args.seq / lm * 1e3:8.0f} tok/s)")
    print(f"pytorch step {tm:8.2f} ms  ({args.batch * args.seq / tm * 1e3:8.0f} tok/s)")
    refusal = peer_blas.refusal() or peer_blas.thread_mismatch(args.blas_threads or args.threads)
    print(refusal or f"speedup loom vs pytorch: {tm / lm:.2f}x")
    # Same weights, same data: the first losses must agree (a benchmark of different math is void).
    print(f"first-step loss: loom {loom_losses[0]:.6f}, pytorch {torch_losses[0]:.6f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"loom_ms": lm, "torch_ms": tm, "threads": args.threads,
                       "blas": peer_blas.describe()[0], "refusal": refusal,
                       "tokens_per_step": args.batch * args.seq, "torch": torch.__version__,
                       "first_loss": {"loom": loom_losses[0], "torch": torch_losses[0]}}, f)


if __name__ == "__main__":
    main()
