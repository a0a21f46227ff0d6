#!/usr/bin/python3
"""loom's table-batched embedding bags beside torch.nn.EmbeddingBag on the same shape.

PyTorch side: one nn.EmbeddingBag(rows, dim, mode="sum", sparse=True) per table (FBGEMM's
benchmark shape by default: B=512, T=32, rows=100000, D=128, L=20, uniform indices, f32),
outputs concatenated to [B, T*D] as loom's, timed for forward, forward + backward (sparse
gradients), and forward + backward + torch.optim.SGD step on the sparse gradients. loom side:
build/bin/loom-bench-embedding --json, with --optimizer none (sparse gradient) and sgd (fused
update). Both get the same thread count (torch.set_num_threads / OMP_NUM_THREADS) and run one
after the other, not at once. Prints both and the ratios (PyTorch time / loom time: > 1 means
loom is faster).

Run: /usr/bin/python3 benchmarks/embedding_vs_pytorch.py [--threads 2] [--iters 10]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_blas  # noqa: E402


def median_ms(fn, warmup, iters):
    """Median milliseconds of fn over iters calls after warmup calls (as loom's benchmark)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def torch_times(a):
    torch.manual_seed(0)
    bags = [torch.nn.EmbeddingBag(a.rows, a.dim, mode="sum", sparse=True) for _ in range(a.tables)]
    with torch.no_grad():
        for bag in bags:  # FBGEMM's initialisation range; keeps SGD steps small
            bag.weight.uniform_(-0.01, 0.01)
    offsets = torch.arange(0, a.batch * a.bag_size, a.bag_size, dtype=torch.int64)
    indices = [torch.randint(0, a.rows, (a.batch * a.bag_size,), dtype=torch.int64)
               for _ in range(a.tables)]
    dout = torch.randn(a.batch, a.tables * a.dim) * 1e-3
    sgd = torch.optim.SGD([b.weight for b in bags], lr=0.01)

    def forward():
        return torch.cat([bag(i, offsets) for bag, i in zip(bags, indices)], dim=1)

    def forward_no_grad():
        with torch.no_grad():
            forward()

    def forward_backward():
        sgd.zero_grad(set_to_none=True)
        forward().backward(dout)

    def forward_backward_step():
        forward_backward()
        sgd.step()

    return {
        "fwd_ms": median_ms(forward_no_grad, a.warmup, a.iters),
        "fwdbwd_ms": median_ms(forward_backward, a.warmup, a.iters),
        "fwdbwd_sgd_ms": median_ms(forward_backward_step, a.warmup, a.iters),
    }


def loom_times(a, optimizer):
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    cmd = [a.binary, "--batch", str(a.batch), "--tables", str(a.tables), "--rows", str(a.rows),
           "--dim", str(a.dim), "--bag-size", str(a.bag_size), "--iters", str(a.iters),
           "--warmup", str(a.warmup), "--optimizer", optimizer, "--json"]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--tables", type=int, default=32)
    p.add_argument("--rows", type=int, default=100000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--bag-size", type=int, default=20)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", os.cpu_count())))
    p.add_argument("--binary", default="build/bin/loom-bench-embedding")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    a = p.parse_args()
    if not os.path.exists(a.binary):
        sys.exit(f"embedding_vs_pytorch: {a.binary} not found (build loom-bench-embedding, or --binary)")
    torch.set_num_threads(a.threads)

    pt = torch_times(a)
    loom_sparse = loom_times(a, "none")
    loom_sgd = loom_times(a, "sgd")
    rows = [
        ("forward", pt["fwd_ms"], loom_sparse["fwd_ms"]),
        ("forward+backward (sparse grad)", pt["fwdbwd_ms"], loom_sparse["fwdbwd_ms"]),
        ("forward+backward+SGD", pt["fwdbwd_sgd_ms"], loom_sgd["fwdbwd_ms"]),
    ]
    result = {
        "shape": {"batch": a.batch, "tables": a.tables, "rows": a.rows, "dim": a.dim,
                  "bag_size": a.bag_size, "threads": a.threads, "torch": torch.__version__},
        "pytorch": pt, "loom_sparse": loom_sparse, "loom_sgd": loom_sgd,
        "speedup": {name: round(t / l, 3) for name, t, l in rows},
    }
    if a.json:
        print(json.dumps(result))
        return
    print(f"B={a.batch} T={a.tables} rows={a.rows} D={a.dim} L={a.bag_size} f32, "
          f"{a.threads} threads, median of {a.iters} after {a.warmup} warm-up; torch {torch.__version__}")
    # No GEMM in these steps: the BLAS does not change them, so the ratio stands on any BLAS.
    print(peer_blas.blas_line(torch.get_num_threads()))
    print(f"{'':32} {'PyTorch ms':>12} {'loom ms':>10} {'loom speedup':>13}")
    for name, t, l in rows:
        print(f"{name:32} {t:12.2f} {l:10.2f} {t / l:12.2f}x")
    print(f"loom forward {loom_sparse['fwd_gbps']:.2f} GB/s (FBGEMM count) = "
          f"{100 * loom_sparse['fwd_gbps'] / loom_sparse['copy_gbps']:.0f}% of this run's memcpy "
          f"{loom_sparse['copy_gbps']:.2f} GB/s")


if __name__ == "__main__":
    main()
