#!/usr/bin/env python3
"""Data-parallel training on 2 ranks, loom vs PyTorch DDP (gloo), one thread per rank.

The same GPT (4 layers, dim 256, 4 heads, seq 128, vocab 256, f32, AdamW) from the same weights
trains on the same tokens with the same global batch (16 sequences, 8 per rank): loom-gpt under
`mpirun -np 2 --dp 2` and torch.nn.parallel.DistributedDataParallel over gloo, 2 processes.
Prints the median step time of each and the ratio, and loom's overlap: how much of the gradient
reduction time backward hides (1 - wait after backward / wait when every bucket is launched
after backward, the latter from a --no-overlap run). Each wait is the least over the two ranks
(`comm_wait_least_ms`): a rank's own wait also holds the time it waited for the other to finish
its backward, which moves with the host's noise and is no communication.
Usage: python3 benchmarks/ddp_vs_pytorch.py [--steps 30] [--bucket-mb 1]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
sys.path.insert(0, HERE)
os.environ["OMP_NUM_THREADS"] = "1"  # before numpy and torch are imported
os.environ["OPENBLAS_NUM_THREADS"] = "1"  # one thread per rank for PyTorch's GEMMs too
import numpy as np  # noqa: E402  (after OPENBLAS_NUM_THREADS: numpy loads OpenBLAS too)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import gpt2_reference as ref  # noqa: E402
from gpt_vs_pytorch import add_run_args, cpu_name  # noqa: E402
import peer_blas  # noqa: E402

ROOT = os.path.dirname(HERE)
MPIRUN_FLAGS = ["--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader",
                "--mca", "btl_vader_single_copy_mechanism", "none",
                "--mca", "oob_tcp_if_include", "lo"]


def loom_run(args, tokens_path, ckpt_path, overlap):
    metrics = os.path.join(os.path.dirname(tokens_path), f"loom_{overlap}.jsonl")
    cmd = ["mpirun", "-np", "2", *MPIRUN_FLAGS, args.loom_gpt, "--dp", "2", "--threads", "1",
           "--init-from", ckpt_path, "--data", tokens_path, "--steps", str(args.steps),
           "--batch", str(args.batch), "--seq", str(args.seq), "--optimizer", "adamw",
           "--lr", "1e-3", "--lr-schedule", "constant", "--warmup-steps", "0",
           "--grad-clip", "0", "--bucket-mb", str(args.bucket_mb), "--metrics-file", metrics]
    if not overlap:
        cmd.append("--no-overlap")
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"loom-gpt failed:\n{proc.stdout}\n{proc.stderr}")
    steps = [json.loads(l) for l in open(metrics) if '"step_ms"' in l]
    kept = steps[args.warmup:]
    return ([r["step_ms"] for r in kept], [r["comm_wait_least_ms"] for r in kept],
            [r["loss"] for r in steps])


class Gpt(torch.nn.Module):
    """gpt2_reference's functional GPT as a Module, so DDP can wrap it."""

    def __init__(self, cfg, params):
        super().__init__()
        self.cfg = cfg
        self.p = torch.nn.ParameterDict({k: torch.nn.Parameter(v.clone()) for k, v in params.items()})

    def forward(self, x, y):
        return ref.forward_loss(self.cfg, self.p, x, y)


def torch_worker(rank, args, cfg, tokens, port, out):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    _, params = ref.read_checkpoint(args.ckpt)
    model = torch.nn.parallel.DistributedDataParallel(Gpt(cfg, params),
                                                      bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    rows = args.batch // 2
    n_batches = (len(tokens) - 1) // (args.batch * args.seq)
    times, losses = [], []
    for step in range(args.steps):
        x, y = ref.batch(tokens, step % n_batches, args.batch, args.seq)
        x, y = x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        opt.step()
        times.append((time.perf_counter() - t0) * 1e3)
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / 2)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"times": times[args.warmup:], "losses": losses}, f)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_run_args(p, batch=16, batch_help="global batch (sequences, both ranks)")
    p.add_argument("--bucket-mb", type=float, default=1.0)
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON to FILE "
                   "(benchmarks/report.py reads it)")
    args = p.parse_args()
    if not os.path.exists(args.loom_gpt):
        sys.exit(f"{args.loom_gpt} not found: run `make` first")
    if shutil.which("mpirun") is None:
        sys.exit("mpirun not found: run scripts/install-deps.sh")

    cfg = dict(max_seq_len=args.seq, vocab=args.vocab, padded_vocab=args.vocab,
               layers=args.layers, heads=args.heads, channels=args.dim)
    with tempfile.TemporaryDirectory() as d:
        args.ckpt = os.path.join(d, "init.bin")
        tokens_path = os.path.join(d, "tokens.bin")
        ref.write_checkpoint(args.ckpt, cfg, ref.random_checkpoint(cfg, seed=0))
        tokens = np.random.default_rng(0).integers(0, args.vocab, size=16 * args.batch * args.seq + 1)
        ref.write_tokens(tokens_path, tokens)
        loom_ms, loom_wait, loom_losses = loom_run(args, tokens_path, args.ckpt, overlap=True)
        _, serial_wait, _ = loom_run(args, tokens_path, args.ckpt, overlap=False)
        out = os.path.join(d, "torch.json")
        port = 29500 + os.getpid() % 1000
        mp.spawn(torch_worker, args=(args, cfg, tokens, port, out), nprocs=2, join=True)
        torch_result = json.load(open(out))

    lm, tm = statistics.median(loom_ms), statistics.median(torch_result["times"])
    wait, serial = statistics.median(loom_wait), statistics.median(serial_wait)
    tokens_per_step = args.batch * args.seq
    print(f"machine: {cpu_name()}; 2 ranks, 1 thread each; torch {torch.__version__} (gloo)")
    print(peer_blas.blas_line(1))
    print(f"config: layers {args.layers} dim {args.dim} heads {args.heads} seq {args.seq} "
          f"global batch {args.batch} vocab {args.vocab} f32 AdamW, buckets {args.bucket_mb} MiB, "
          f"median of {len(loom_ms)} steps after {args.warmup} warm-up")
    print(f"loom DDP    step {lm:8.2f} ms  ({tokens_per_step / lm * 1e3:8.0f} tok/s)")
    print(f"pytorch DDP step {tm:8.2f} ms  ({tokens_per_step / tm * 1e3:8.0f} tok/s)")
    refusal = peer_blas.refusal() or peer_blas.thread_mismatch(1)
    print(refusal or f"speedup loom vs pytorch: {tm / lm:.2f}x")
    print(f"loom overlap: {wait:.1f} ms waited after backward vs {serial:.1f} ms with every "
          f"reduction after backward (the least over the ranks, medians over the steps): "
          f"{max(0.0, 1 - wait / serial) * 100:.0f}% of reduction time hidden behind backward")
    print(f"first-step loss: loom {loom_losses[0]:.6f}, pytorch {torch_result['losses'][0]:.6f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"loom_ms": lm, "torch_ms": tm, "ranks": 2, "threads": 1,
                       "blas": peer_blas.describe()[0], "refusal": refusal,
                       "hidden_fraction": max(0.0, 1 - wait / serial),
                       "tokens_per_step": tokens_per_step, "torch": torch.__version__,
                       "first_loss": {"loom": loom_losses[0],
                                      "torch": torch_result["losses"][0]}}, f)


if __name__ == "__main__":
    main()
