#!/usr/bin/env python3
"""The multi-node figures of benchmarks/README.md ("Emulated cluster"), in one run.

On emulated clusters (scripts/cluster.sh: network namespaces on one host, TCP between nodes,
shared memory inside one), each node's link shaped to --inter-bw by tc tbf or left unshaped:
  * allreduce, 256 KiB-16 MiB: loom flat, hierarchical (two levels) and auto (per call, by the
    cost table measured at start-up) beside raw MPI_Allreduce and the link bound (a node must
    send 2(M-1)/M x S bytes across its link, M nodes, S bytes; shaped runs only);
  * all-to-all of the sharded embeddings' sizes (64 KiB-4 MiB per rank), flat and two-level;
  * loom-gpt across 2 x 2 nodes: DDP and ZeRO-3 with LOOM_COLL_ALGO flat, hier and auto, and
    hybrid-sharded ZeRO-3 (--zero-shard-group node), median step time and the final loss.
Every collective output is checked (loom-bench-collectives -c 1); a run with a wrong element
fails the report. Needs root (namespaces); takes the cluster down at the end and on failure.

usage: sudo python3 benchmarks/cluster_report.py [--build build] [--quick] [--out report.md]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = os.path.join(ROOT, "scripts", "cluster.sh")


def sh(*args, env=None, check=True):
    full = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    r = subprocess.run(args, capture_output=True, text=True, env=full)
    if check and r.returncode != 0:
        sys.exit(f"cluster_report: {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


def up(nodes, ranks, bw):
    sh("bash", CLUSTER, "down")
    args = ["bash", CLUSTER, "up", str(nodes), "--ranks-per-node", str(ranks)]
    if bw:
        args += ["--inter-bw", bw]
    sh(*args)


def rate_bytes_per_s(bw):  # "1gbit" -> bytes/s
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for u, f in units.items():
        if bw.endswith(u):
            return float(bw[: -len(u)]) * f / 8
    sys.exit(f"cluster_report: cannot read the rate {bw!r} (e.g. 1gbit, 500mbit)")


def bench(build, np, op, algo, first, last, iters):
    """{size: (loom us, mpi us)} and the header's algorithm description."""
    out = sh("bash", CLUSTER, "run", "--np", str(np), "--",
             os.path.join(build, "bin", "loom-bench-collectives"), "-o", op, "-a", algo,
             "-b", str(first), "-e", str(last), "-f", "4", "-n", str(iters), "-w", "2", "-c", "1")
    rows, algorithm = {}, ""
    for line in out.splitlines():
        if line.startswith("# loom-bench-collectives"):
            algorithm = line.split("algorithm: ", 1)[-1]
        if line.startswith("#") or not line.strip():
            continue
        f = line.split()
        if int(f[6]) != 0:
            sys.exit(f"cluster_report: {op} -a {algo} at {f[0]} bytes: {f[6]} wrong elements")
        rows[int(f[0])] = (float(f[3]), float(f[7]))
    return rows, algorithm


def best_of(rounds, build, np, op, algos, first, last, iters):
    """{algo: ({size: (loom us, mpi us)}, description)}: the algorithms run in turn, `rounds`
    times over, each size's best (least) time of the rounds: 2 vCPUs carrying every rank of
    every node make single runs vary by up to 1.5x."""
    got = {}
    for _ in range(rounds):
        for a in algos:
            rows, desc = bench(build, np, op, a, first, last, iters)
            if a not in got:
                got[a] = (rows, desc)
                continue
            best = got[a][0]
            for size, (loom, mpi) in rows.items():
                best[size] = (min(best[size][0], loom), min(best[size][1], mpi))
    return got


def size_str(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


def ms(us):
    return f"{us / 1000:.3g} ms" if us >= 1000 else f"{us:.0f} us"


def allreduce_table(build, layouts, bw, first, last, iters, rounds):
    lines = []
    head = ("| nodes x ranks | size | loom flat | loom hier | loom auto | raw MPI_Allreduce |"
            + (" flat / bound | hier / bound | auto / bound |" if bw else " auto / MPI |"))
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    decisions = []
    for nodes, ranks in layouts:
        up(nodes, ranks, bw)
        got = best_of(rounds, build, nodes * ranks, "allreduce", ("flat", "hier", "auto"),
                      first, last, iters)
        decisions.append(f"{nodes} x {ranks}: {got['auto'][1]}")
        for size in sorted(got["flat"][0]):
            flat, mpi = got["flat"][0][size]
            hier, auto = got["hier"][0][size][0], got["auto"][0][size][0]
            row = f"| {nodes} x {ranks} | {size_str(size)} | {ms(flat)} | {ms(hier)} | {ms(auto)} | {ms(mpi)} |"
            if bw:
                bound_us = 2 * (nodes - 1) / nodes * size / rate_bytes_per_s(bw) * 1e6
                row += "".join(f" {bound_us / t:.2f} |" for t in (flat, hier, auto))
            else:
                row += f" {mpi / auto:.2f} |"
            lines.append(row)
    return lines, decisions


def all_to_all_table(build, nodes, ranks, bw, iters, rounds):
    up(nodes, ranks, bw)
    got = {a: rows for a, (rows, _) in best_of(rounds, build, nodes * ranks, "all_to_all",
                                                ("flat", "hier"), 64 << 10, 4 << 20, iters).items()}
    lines = ["| size per rank | loom flat | loom two-level | raw MPI_Alltoall |", "|---|---|---|---|"]
    for size in sorted(got["flat"]):
        lines.append(f"| {size_str(size)} | {ms(got['flat'][size][0])} | "
                     f"{ms(got['hier'][size][0])} | {ms(got['flat'][size][1])} |")
    return lines


def training_table(build, bw, steps):
    up(2, 2, bw)
    gpt = os.path.join(build, "bin", "loom-gpt")
    common = ["--layers", "4", "--dim", "256", "--heads", "4", "--seq", "130", "--batch", "16",
              "--steps", str(steps), "--eval-every", "1000", "--threads", "1", "--dp", "4"]
    runs = [("DDP", "flat", []), ("DDP", "hier", []), ("DDP", "auto", []),
            ("ZeRO-3 over all 4 ranks", "flat", ["--zero", "3"]),
            ("ZeRO-3 over all 4 ranks", "hier", ["--zero", "3"]),
            ("ZeRO-3 over all 4 ranks", "auto", ["--zero", "3"]),
            ("ZeRO-3 sharded by node", "flat", ["--zero", "3", "--zero-shard-group", "node"]),
            ("ZeRO-3 sharded by node", "hier", ["--zero", "3", "--zero-shard-group", "node"])]
    lines = ["| layout | LOOM_COLL_ALGO | step (median of steps 3-%d) | loss at step %d |" % (steps, steps),
             "|---|---|---:|---:|"]
    with tempfile.TemporaryDirectory(dir=os.path.join(build)) as tmp:
        for name, algo, flags in runs:
            metrics = os.path.join(tmp, "m.jsonl")
            sh("bash", CLUSTER, "run", "--np", "4", "--", gpt, *common, *flags,
               "--metrics-file", metrics, env={"LOOM_COLL_ALGO": algo})
            rows = [json.loads(l) for l in open(metrics) if '"step_ms"' in l]
            step = statistics.median(r["step_ms"] for r in rows[2:])
            lines.append(f"| {name} | {algo} | {step:.0f} ms | {rows[-1]['loss']:.6f} |")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--inter-bw", default="1gbit", help="the shaped runs' link rate (tc tbf)")
    ap.add_argument("--quick", action="store_true", help="2 x 2 only, 256 KiB-1 MiB, few calls")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each algorithm; the best kept")
    ap.add_argument("--out", help="write the markdown here too")
    o = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("cluster_report: needs root to make network namespaces (scripts/cluster.sh)")
    iters = 2 if o.quick else 5
    last = 1 << 20 if o.quick else 16 << 20
    layouts = [(2, 2)] if o.quick else [(2, 2), (2, 4), (4, 2)]
    cpu = sh("sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip()
    md = [f"Machine: {cpu}, {os.cpu_count()} vCPU; every rank of every node on it, one thread "
          f"each. Each entry: the median of {iters} blocks of calls, loom's and MPI's alternating "
          f"(a block is one call, or as many as fill a millisecond), max over ranks, f32, "
          f"outputs checked, the "
          f"best of {o.rounds} runs taken in turn.", ""]
    try:
        shaped, decided = allreduce_table(o.build, layouts, o.inter_bw, 256 << 10, last, iters, o.rounds)
        md += [f"**allreduce, links shaped to {o.inter_bw}** (bound: 2(M-1)/M x S bytes over a "
               "node's link; fraction = bound / time):", ""] + shaped + [""]
        md += ["auto's table and choices:", ""] + [f"- {d}" for d in decided] + [""]
        unshaped, decided = allreduce_table(o.build, layouts, None, 256 << 10, last, iters, o.rounds)
        md += ["**allreduce, unshaped** (veth between namespaces at memory speed):", ""] + unshaped + [""]
        md += ["auto's table and choices:", ""] + [f"- {d}" for d in decided] + [""]
        if not o.quick:
            md += [f"**all-to-all on 4 x 2 nodes, links shaped to {o.inter_bw}** (the sharded "
                   "embeddings' exchange; equal splits):", ""]
            md += all_to_all_table(o.build, 4, 2, o.inter_bw, iters, o.rounds) + [""]
        md += [f"**loom-gpt on 2 x 2 nodes, links shaped to {o.inter_bw}** (4 layers, dim 256, "
               "4 heads, seq 130, global batch 16, AdamW, --dp 4):", ""]
        md += training_table(o.build, o.inter_bw, 6 if o.quick else 10) + [""]
    finally:
        sh("bash", CLUSTER, "down", check=False)
    text = "\n".join(md)
    print(text)
    if o.out:
        open(o.out, "w").write(text + "\n")


if __name__ == "__main__":
    main()
