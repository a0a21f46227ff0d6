#!/usr/bin/python3
"""`make bench`: every CPU benchmark in one run, and one report of loom beside its peer and its
limit for each measure.

Every row is one measure, taken in this run next to what it is held against:
- its peer: the same work done by PyTorch (on OpenBLAS; a ratio against the reference BLAS is
  refused, benchmarks/peer_blas.py). `speedup` = peer time / loom time, so > 1 means loom is
  faster;
- its limit: what the machine or the layer below allows for the same work, measured in the same
  run: memcpy bandwidth for memory-bound kernels and the embedding step (the bytes each must
  move), the GEMM peak (OpenBLAS's rate on a large square GEMM at the same thread count), raw MPI
  on the same buffers for collectives, the raw disk (write + fsync, read) for checkpoints, loom-gpt
  (C++) for the same training driven from Python, the ideal speedup for tensor parallelism, the
  schedule validator's bubble for a pipeline (fraction = (1 - measured bubble) / (1 - predicted),
  the worst rank).
  `fraction` = loom's rate / the limit's rate (1 = at the limit).

Suites (--only picks some): kernels, gpt, ddp, embedding, collectives, checkpoint, python, tp, pp.
Writes OUT/report.json (every figure, plus the machine, library versions and thread counts) and
OUT/report.md; with --readme, replaces the generated blocks of benchmarks/README.md and README.md
(between "<!-- bench-report:begin -->" and "<!-- bench-report:end -->"), only when every suite
ran. --quick runs every suite on tiny shapes: a check that the report is produced end to end
(tests/CMakeLists.txt runs it), not figures to quote; it never touches the READMEs.

Run: /usr/bin/python3 benchmarks/report.py [--build build] [--out build/bench] [--readme]
"""
import argparse
import datetime
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PYTHON = sys.executable
# mpirun as the Makefile and the tests run it (more ranks than cores allowed, as root, shared
# memory), except that Open MPI decides itself whether a waiting rank yields its core: it does
# when the node is oversubscribed (4 ranks on 2 cores), and spins otherwise. The tests force
# mpi_yield_when_idle on, since ctest runs several jobs on two cores; here that would measure
# raw MPI below its best: a 1 KiB MPI_Allreduce on 2 ranks of the 2-core Zen 3 VM took 2.5 us
# with it and 1.1 us without (benchmarks/README.md, "A small collective's fixed cost").
MPIRUN = ["mpirun", "--oversubscribe", "--bind-to", "none",
          "--mca", "btl", "self,vader", "--mca", "btl_vader_single_copy_mechanism", "none",
          "--mca", "oob_tcp_if_include", "lo"]
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
BEGIN, END = "<!-- bench-report:begin -->", "<!-- bench-report:end -->"
SUITES = ["kernels", "gpt", "ddp", "embedding", "collectives", "checkpoint", "python", "tp", "pp"]


def row(suite, measure, unit, loom, threads, peer=None, peer_value=None, speedup=None,
        limit=None, limit_value=None, fraction=None, note=None, headline=None):
    """One measure. speedup and fraction are given by the caller, who knows which way is better
    (times: reference / loom; rates: loom / reference)."""
    return {k: v for k, v in dict(suite=suite, measure=measure, unit=unit, loom=loom,
                                  threads=threads, peer=peer, peer_value=peer_value,
                                  speedup=speedup, limit=limit, limit_value=limit_value,
                                  fraction=fraction, note=note, headline=headline).items()
            if v is not None}


class Runner:
    """Runs the benchmark programs, echoing what it runs; every program's output is kept in OUT."""

    def __init__(self, args):
        self.args, self.build, self.out = args, os.path.abspath(args.build), args.out
        self.logs = []

    def bin(self, name):
        path = os.path.join(self.build, "bin", name)
        if not os.path.exists(path):
            raise RuntimeError(f"{path} was not built (run make)")
        return path

    def run(self, cmd, log, env=None, mpi_ranks=None, timeout=1800):
        full_env = dict(os.environ, PYTHONPATH=os.path.join(self.build, "python"), **(env or {}))
        if mpi_ranks:
            full_env.update(MPI_ENV)
            cmd = MPIRUN + ["-np", str(mpi_ranks)] + cmd
        print("report: " + " ".join(cmd), flush=True)
        path = os.path.join(self.out, log)
        self.logs.append(log)
        with open(path, "w") as f:
            proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=full_env,
                                  cwd=ROOT, timeout=timeout)
        text = open(path).read()
        if proc.returncode != 0:
            tail = "\n".join(text.splitlines()[-15:])
            raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode} ({path}):\n{tail}")
        return text


# ---------------------------------------------------------------------------------------------
# Suites. Each returns a list of rows (and may add to `extra`, kept in the JSON).

GEMM_PROBE = r"""
import json, statistics, sys, time
import torch
sys.path.insert(0, sys.argv[3])
import peer_blas
torch.set_num_threads(int(sys.argv[1]))
rates = {}
for m, n, k in json.loads(sys.argv[2]):
    a, b = torch.randn(m, k), torch.randn(n, k)
    for _ in range(3):
        torch.mm(a, b.t())
    times = []
    for _ in range(5):
        reps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 0.2:
            torch.mm(a, b.t())
            reps += 1
        times.append((time.perf_counter() - t0) / reps)
    rates[f"{m}/{n}/{k}"] = 2.0 * m * n * k / statistics.median(times) / 1e9
print(json.dumps({"rates": rates, "blas": peer_blas.describe()[0],
                  "refusal": peer_blas.refusal()}))
"""
PEAK_SHAPE = (2048, 2048, 2048)


def suite_kernels(r, extra):
    """loom-bench's kernels at one thread: GEMMs beside torch.mm (C = A B^T, same shapes) and the
    GEMM peak; memory-bound kernels as a fraction of memcpy of a comparable working set."""
    quick = r.args.quick
    out = os.path.join(r.out, "loom-bench.json")
    flags = ["--benchmark_out=" + out, "--benchmark_out_format=json",
             "--benchmark_repetitions=" + ("1" if quick else "3"),
             "--benchmark_min_time=" + ("0.01" if quick else "0.3")]
    if quick:
        flags.append("--benchmark_filter=gemm/1024/256/256|layer_norm_forward/1024|memcpy")
    r.run([r.bin("loom-bench")] + flags, "loom-bench.log", env={"OMP_NUM_THREADS": "1"})
    results = {}
    for b in json.load(open(out))["benchmarks"]:
        name = b.get("run_name", b["name"].split("_median")[0])
        if quick or b.get("aggregate_name") == "median":
            results[name] = b
    gemms = [n for n in results if n.startswith("BM_gemm/")]
    shapes = [[int(x) for x in n.split("/")[1:]] for n in gemms] + [list(PEAK_SHAPE)]
    probe = r.run([PYTHON, "-c", GEMM_PROBE, "1", json.dumps(shapes), HERE], "torch-gemm.log",
                  env={"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"})
    torch_gemm = json.loads(probe.strip().splitlines()[-1])
    extra["torch_gemm"] = torch_gemm
    peak = max(torch_gemm["rates"].values())
    peak_name = "OpenBLAS peak (best torch.mm rate, %dx%dx%d)" % PEAK_SHAPE
    rows = []
    for name in gemms:
        shape = name.split("/", 1)[1]
        loom, torch_rate = results[name]["GFLOP/s"] / 1e9, torch_gemm["rates"][shape]
        refused = torch_gemm["refusal"]
        rows.append(row("kernels", f"GEMM {shape.replace('/', 'x')} (C = A B^T)", "GFLOP/s",
                        loom, 1, peer=f"torch.mm ({torch_gemm['blas']})", peer_value=torch_rate,
                        speedup=None if refused else loom / torch_rate, limit=peak_name,
                        limit_value=peak, fraction=loom / peak, note=refused))
    # Bytes each benchmark moves per iteration (its GB/s counter x its time per iteration).
    unit_s = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}

    def bytes_per_iteration(b):
        return b["GB/s"] * b["real_time"] * unit_s[b["time_unit"]]

    memcpy = {bytes_per_iteration(b): b["GB/s"] / 1e9 for n, b in results.items()
              if n.startswith("BM_memcpy_reference/")}
    for name, b in results.items():
        if "GB/s" not in b or name.startswith("BM_memcpy"):
            continue
        moved = bytes_per_iteration(b)
        # The copy whose traffic is nearest on a log scale: in cache or in DRAM, as the kernel's.
        ref = min(memcpy, key=lambda m: abs(math.log(m / moved)))
        rows.append(row("kernels", name[3:].replace("/", " "), "GB/s", b["GB/s"] / 1e9, 1,
                        limit=f"memcpy moving {ref / 2**20:.0f} MiB", limit_value=memcpy[ref],
                        fraction=b["GB/s"] / 1e9 / memcpy[ref],
                        note=f"moves {moved / 2**20:.1f} MiB per call"))
    return rows


def suite_gpt(r, extra):
    """loom-gpt against PyTorch on the same GPT, same weights and tokens, at 1 and 2 threads."""
    rows = []
    for threads in (1, 2):
        out = os.path.join(r.out, f"gpt_vs_pytorch.{threads}.json")
        cmd = [PYTHON, os.path.join(HERE, "gpt_vs_pytorch.py"), "--threads", str(threads),
               "--loom-gpt", r.bin("loom-gpt"), "--json", out]
        if r.args.quick:
            cmd += ["--layers", "1", "--dim", "64", "--seq", "32", "--steps", "4", "--warmup", "1"]
        r.run(cmd, f"gpt_vs_pytorch.{threads}.log")
        g = json.load(open(out))
        extra[f"gpt_{threads}"] = g
        rows.append(row("gpt", "GPT training step (" + ("--quick shape" if r.args.quick else
                        "4 layers, dim 256, seq 128, batch 8, AdamW") + ")",
                        "ms", g["loom_ms"], threads, peer=f"PyTorch eager ({g['blas']})",
                        peer_value=g["torch_ms"],
                        speedup=None if g["refusal"] else g["torch_ms"] / g["loom_ms"],
                        note=g["refusal"], headline=f"GPT step, {threads} thread(s)"))
    return rows


def suite_ddp(r, extra):
    out = os.path.join(r.out, "ddp_vs_pytorch.json")
    cmd = [PYTHON, os.path.join(HERE, "ddp_vs_pytorch.py"), "--loom-gpt", r.bin("loom-gpt"),
           "--json", out]
    if r.args.quick:
        cmd += ["--layers", "1", "--dim", "64", "--seq", "32", "--steps", "4", "--warmup", "1"]
    r.run(cmd, "ddp_vs_pytorch.log")
    d = json.load(open(out))
    extra["ddp"] = d
    return [row("ddp", "DDP step, 2 ranks (same GPT, global batch 16)", "ms", d["loom_ms"], 1,
                peer=f"PyTorch DDP, gloo ({d['blas']})", peer_value=d["torch_ms"],
                speedup=None if d["refusal"] else d["torch_ms"] / d["loom_ms"],
                note="; ".join(filter(None, [d["refusal"], f"reduction hidden behind backward: "
                                              f"{100 * d['hidden_fraction']:.0f}%"])), headline="DDP step, 2 ranks")]


def suite_embedding(r, extra):
    """Table-batched embedding bags at FBGEMM's default shape, one thread: beside
    torch.nn.EmbeddingBag, and as a fraction of the step's memory-traffic bound (its true bytes
    at this run's memcpy bandwidth)."""
    shape = ["--batch", "64", "--tables", "4", "--rows", "1000", "--dim", "32", "--bag-size", "4",
             "--iters", "2", "--warmup", "1"] if r.args.quick else []
    out = r.run([PYTHON, os.path.join(HERE, "embedding_vs_pytorch.py"), "--threads", "1",
                 "--binary", r.bin("loom-bench-embedding"), "--json"] + shape,
                "embedding_vs_pytorch.log", env={"OMP_NUM_THREADS": "1"})
    e = json.loads(out.strip().splitlines()[-1])
    extra["embedding"] = e
    s = e["shape"]
    desc = f"B {s['batch']} T {s['tables']} rows {s['rows']} D {s['dim']} L {s['bag_size']}"
    pt, sparse, sgd = e["pytorch"], e["loom_sparse"], e["loom_sgd"]
    rows = [
        row("embedding", f"forward ({desc})", "ms", sparse["fwd_ms"], 1,
            peer="nn.EmbeddingBag (sum)", peer_value=pt["fwd_ms"],
            speedup=pt["fwd_ms"] / sparse["fwd_ms"], limit="memcpy (bytes moved)",
            limit_value=sparse["copy_gbps"], fraction=sparse["fwd_true_gbps"] / sparse["copy_gbps"]),
        row("embedding", "forward + backward, sparse gradient", "ms", sparse["fwdbwd_ms"], 1,
            peer="nn.EmbeddingBag, sparse=True", peer_value=pt["fwdbwd_ms"],
            speedup=pt["fwdbwd_ms"] / sparse["fwdbwd_ms"], limit="memcpy (bytes moved)",
            limit_value=sparse["copy_gbps"],
            fraction=sparse["fwdbwd_true_gbps"] / sparse["copy_gbps"]),
        row("embedding", "forward + backward + SGD (fused)", "ms", sgd["fwdbwd_ms"], 1,
            peer="nn.EmbeddingBag sparse + optim.SGD", peer_value=pt["fwdbwd_sgd_ms"],
            speedup=pt["fwdbwd_sgd_ms"] / sgd["fwdbwd_ms"], limit="memcpy (bytes moved)",
            limit_value=sgd["copy_gbps"], fraction=sgd["fwdbwd_true_gbps"] / sgd["copy_gbps"],
            headline="embedding bags fwd+bwd+SGD, 1 thread"),
    ]
    for optimizer in ("rowwise_adagrad", "adam"):
        text = r.run([r.bin("loom-bench-embedding"), "--optimizer", optimizer, "--json"] + shape,
                     f"embedding.{optimizer}.log", env={"OMP_NUM_THREADS": "1"})
        o = json.loads(text.strip().splitlines()[-1])
        extra[f"embedding_{optimizer}"] = o
        rows.append(row("embedding", f"forward + backward + {optimizer} (fused)", "ms",
                        o["fwdbwd_ms"], 1, limit="memcpy (bytes moved)",
                        limit_value=o["copy_gbps"], fraction=o["fwdbwd_true_gbps"] / o["copy_gbps"]))
    return rows


COLLECTIVE_ROW = re.compile(r"^\s+(\d+)\s+(\d+)\s+\S+\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)"
                            r"\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.-]+)\s+([\d.-]+)\s*$")


def human_bytes(n):
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def suite_collectives(r, extra):
    """loom-bench-collectives at 2 and 4 ranks, 1 KiB to 64 MiB, beside raw MPI on the same
    buffers in the same run; one row per (op, ranks) with the worst size, every size in JSON."""
    sizes = ["-b", "1K", "-e", "64K", "-f", "8", "-n", "5", "-w", "1"] if r.args.quick else \
        ["-b", "1K", "-e", "64M", "-f", "4", "-n", "20", "-w", "5"]
    rows, table = [], {}
    for ranks in (2, 4):
        for op in ("allreduce", "allgather", "reduce_scatter", "pingpong"):
            text = r.run([r.bin("loom-bench-collectives"), "-o", op, "-c", "1"] + sizes,
                         f"collectives.{op}.{ranks}.log", mpi_ranks=ranks)
            points = []
            for line in text.splitlines():
                m = COLLECTIVE_ROW.match(line)
                if m:
                    points.append({"bytes": int(m[1]), "us": float(m[3]),
                                   "busbw": float(m[5]), "wrong": m[6], "mpi_us": float(m[7]),
                                   "mpi_busbw": float(m[8]), "ratio": float(m[9]),
                                   "check_us": float(m[11])})
            if not points:
                raise RuntimeError(f"no rows in collectives.{op}.{ranks}.log")
            if any(p["wrong"] != "0" for p in points):
                raise RuntimeError(f"{op} on {ranks} ranks gave wrong values (see its log)")
            table[f"{op}/{ranks}"] = points
            worst = min(points, key=lambda p: p["ratio"])
            big = points[-1]
            rows.append(row("collectives", f"{op}, {ranks} ranks, {human_bytes(points[0]['bytes'])}"
                            f" to {human_bytes(big['bytes'])}: worst size "
                            f"{human_bytes(worst['bytes'])}", "us", worst["us"], 1,
                            limit="raw MPI, same buffers", limit_value=worst["mpi_us"],
                            fraction=worst["ratio"],
                            note=f"at {human_bytes(big['bytes'])}: {big['ratio']:.2f}",
                            headline=f"{op}, {ranks} ranks (worst size)"
                            if op == "allreduce" else None))
    extra["collectives"] = table
    return rows


def suite_checkpoint(r, extra):
    """GPT-2 124M's training state (f32 + AdamW moments): loom's save and load beside
    torch.save/torch.load (one process) and the raw disk; loom at 4 ranks beside the raw disk."""
    layers = ["--layers", "1"] if r.args.quick else []
    out = os.path.join(r.out, "checkpoint_vs_pytorch.json")
    r.run([PYTHON, os.path.join(HERE, "checkpoint_vs_pytorch.py"), "--repeat",
           "1" if r.args.quick else "3", "--binary", r.bin("loom-bench-checkpoint"), "--json",
           out] + layers, "checkpoint_vs_pytorch.log")
    c = json.load(open(out))
    extra["checkpoint_vs_pytorch"] = c
    rows = []
    for phase, f in c["phases"].items():
        peer = ("torch.save (+ fsync)" if phase.startswith("save")
                else "torch.load + load_state_dict")
        rows.append(row("checkpoint", f"{phase}, 1 process", "s", f["loom_s"], 1,
                        peer=peer, peer_value=f["torch_s"],
                        speedup=f["torch_over_loom"], limit="raw disk (write+fsync / read)",
                        limit_value=f["raw_gbps"], fraction=f["loom_vs_raw"],
                        headline=f"checkpoint {phase}" if phase.startswith("save") else None))
    text = r.run([r.bin("loom-bench-checkpoint"), "--repeat", "1" if r.args.quick else "3",
                  "--json"] + layers, "checkpoint.4.log", mpi_ranks=4)
    j = json.loads([line for line in text.splitlines() if line.startswith("{")][-1])
    extra["checkpoint_4"] = j
    for what, f in j["rows"].items():
        if what.startswith("save") or "same layout" in what:
            rows.append(row("checkpoint", f"{what}, 4 ranks", "s", f["median_s"], 1,
                            limit=f"raw disk ({f['raw']})",
                            limit_value=f["raw_bytes"] / f["raw_median_s"] / 1e9,
                            fraction=f["ratio"]))
    return rows


def suite_python(r, extra):
    """The same training driven from Python: train_gpt.py (loom-gpt's loop through the API) and
    nanogpt_port.py (a PyTorch user's script converted), against loom-gpt in C++."""
    out = os.path.join(r.out, "python_overhead.json")
    cmd = [PYTHON, os.path.join(HERE, "python_overhead.py"), "--threads", "1",
           "--loom-gpt", r.bin("loom-gpt"), "--json", out]
    if r.args.quick:
        cmd += ["--steps", "4", "--warmup", "1", "--rounds", "1"]
    r.run(cmd, "python_overhead.log")
    p = json.load(open(out))
    extra["python"] = p
    return [row("python", f"{name} training step (same GPT)", "ms", p[name], 1,
                limit="loom-gpt (C++), same steps", limit_value=p["loom-gpt"],
                fraction=p["loom-gpt"] / p[name],
                headline=f"Python ({name}) vs C++" if name == "nanogpt_port.py" else None)
            for name in ("train_gpt.py", "nanogpt_port.py")]


TP_LINE = re.compile(r"step time: tp 1 ([\d.]+) ms, tp (\d+) ([\d.]+) ms\s+-> speedup ([\d.]+)x")


def suite_tp(r, extra):
    flags = ["--layers", "2", "--dim", "64", "--steps", "2", "--warmup", "1"] if r.args.quick \
        else []
    text = r.run([r.bin("loom-bench-tp")] + flags, "tp.2.log", mpi_ranks=2)
    m = TP_LINE.search(text)
    if not m:
        raise RuntimeError("loom-bench-tp printed no step-time line (tp.2.log)")
    single, n, tp = float(m[1]), int(m[2]), float(m[3])
    extra["tp"] = {"tp1_ms": single, "tp": n, "tp_ms": tp}
    return [row("tp", f"GPT step, tp {n} (one core per rank)", "ms", tp, 1,
                limit=f"ideal: tp 1 time / {n}", limit_value=single / n, fraction=single / n / tp)]


PP_STEP = re.compile(r"^(\S+)(?: v2)?\s+step\s+([\d.]+) ms")
PP_RANK = re.compile(r"rank (\d+): bubble measured ([\d.]+), predicted ([\d.]+)")


def suite_pp(r, extra):
    """Every pipeline schedule on 2 ranks: step time, and how close the executor comes to the
    bubble the schedule validator predicts for it."""
    flags = ["--layers", "4", "--dim", "64", "--steps", "2", "--microbatches", "4"] \
        if r.args.quick else []
    text = r.run([r.bin("loom-bench-pp")] + flags, "pp.2.log", mpi_ranks=2)
    schedules, current = {}, None
    for line in text.splitlines():
        m = PP_STEP.match(line)
        if m:
            current = schedules[m[1]] = {"step_ms": float(m[2]), "ranks": []}
        m = PP_RANK.search(line)
        if m and current is not None:
            current["ranks"].append({"measured": float(m[2]), "predicted": float(m[3])})
    if not schedules or any(not s["ranks"] for s in schedules.values()):
        raise RuntimeError("loom-bench-pp printed no schedule rows (pp.2.log)")
    extra["pp"] = schedules
    rows = []
    for name, s in schedules.items():
        worst = min(s["ranks"], key=lambda k: (1 - k["measured"]) / (1 - k["predicted"]))
        rows.append(row("pp", f"GPT step, pp 2, {name}", "ms", s["step_ms"], 1,
                        limit="the validator's bubble", limit_value=worst["predicted"],
                        fraction=(1 - worst["measured"]) / (1 - worst["predicted"]),
                        note=f"bubble measured {worst['measured']:.3f}, predicted "
                        f"{worst['predicted']:.3f} (worst rank)"))
    return rows


# ---------------------------------------------------------------------------------------------
# The machine and the libraries.

def command_output(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def cpu_name():
    """The first CPU's model name with its family, model and widest vector extension: VMs often
    name only "AMD EPYC", and the figures move with the generation (Zen 3 against Zen 4)."""
    fields = {}
    for line in open("/proc/cpuinfo"):
        if not line.strip():
            break  # the first processor's block only
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    flags = fields.get("flags", "").split()
    vector = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    name = fields.get("model name", "unknown")
    if "cpu family" in fields and "model" in fields:
        return f"{name} (family {fields['cpu family']} model {fields['model']}, {vector})"
    return f"{name} ({vector})"


def machine():
    cpu = cpu_name()
    mem = 0
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal"):
            mem = int(line.split()[1]) * 1024
    packages = {}
    for pkg in ("g++", "libeigen3-dev", "libopenmpi-dev", "libopenblas0-pthread", "python3-torch",
                "python3-numpy", "libbenchmark-dev", "pybind11-dev"):
        version = command_output(["dpkg-query", "-W", "-f", "${Version}", pkg])
        packages[pkg] = version or "not installed"
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem / 2**30, 1),
        "kernel": platform.release(), "python": platform.python_version(),
        "loom_commit": command_output(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"]),
        "libblas.so.3": os.path.realpath("/usr/lib/x86_64-linux-gnu/libblas.so.3"),
        "packages": packages,
    }


# ---------------------------------------------------------------------------------------------
# Markdown.

def fmt(x):
    if x is None:
        return ""
    if isinstance(x, str):
        return x
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"


def markdown(report):
    m = report["machine"]
    lines = [f"Generated by `make bench` (benchmarks/report.py) on {m['date']}, loom "
             f"{m['loom_commit']}{' (--quick: tiny shapes, not figures)' if report['quick'] else ''}.",
             f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, Linux "
             f"{m['kernel']}; Python {m['python']}; libblas.so.3 -> {m['libblas.so.3']}.",
             "Packages: " + ", ".join(f"{k} {v}" for k, v in m["packages"].items()) + ".",
             m.get("openblas_core", "OpenBLAS core: not recorded") + ".",
             "",
             "speedup = the peer's time / loom's (> 1: loom is faster); fraction = loom's rate / "
             "the limit's (1: at the limit). Every reference is measured in the same run.",
             "", "| suite | measure | threads | loom | unit | peer | peer's | speedup | limit | "
             "limit's | fraction | note |", "|---|---|---:|---:|---|---|---:|---:|---|---:|---:|---|"]
    for r in report["rows"]:
        lines.append("| " + " | ".join([
            r["suite"], r["measure"], str(r["threads"]), fmt(r["loom"]), r["unit"],
            r.get("peer", ""), fmt(r.get("peer_value")),
            f"**{r['speedup']:.2f}x**" if "speedup" in r else "",
            r.get("limit", ""), fmt(r.get("limit_value")),
            f"**{r['fraction']:.2f}**" if "fraction" in r else "", r.get("note", "")]) + " |")
    collectives = report["extra"].get("collectives")
    if collectives:
        sizes = sorted({p["bytes"] for points in collectives.values() for p in points})
        lines += ["", "Collectives: loom busbw / raw MPI busbw per size (same buffers, same run; "
                  "pingpong: round-trip time ratio).", "",
                  "| op, ranks | " + " | ".join(human_bytes(s) for s in sizes) + " |",
                  "|---|" + "---:|" * len(sizes)]
        for key, points in collectives.items():
            by = {p["bytes"]: p["ratio"] for p in points}
            op, ranks = key.split("/")
            lines.append(f"| {op}, {ranks} | " +
                         " | ".join(f"{by[s]:.2f}" if s in by else "" for s in sizes) + " |")
    if report["failed"]:
        lines += ["", "Failed suites: " + "; ".join(f"{k}: {v.splitlines()[0]}"
                                                    for k, v in report["failed"].items())]
    return "\n".join(lines) + "\n"


def headline_markdown(report):
    m = report["machine"]
    lines = [f"Measured by `make bench` on {m['date']} ({m['cpu']}, {m['cores']} cores; "
             "benchmarks/README.md has every figure and how each is taken):", ""]
    for r in report["rows"]:
        if "headline" not in r:
            continue
        if "speedup" in r:
            what = f"**{r['speedup']:.2f}x** {r['peer']}"
        else:
            what = f"**{r['fraction']:.2f}** of {r['limit']}"
        lines.append(f"- {r['headline']}: {what}")
    return "\n".join(lines) + "\n"


def replace_block(path, text):
    content = open(path).read()
    if BEGIN not in content or END not in content:
        raise RuntimeError(f"{path} has no {BEGIN} ... {END} block to replace")
    head, rest = content.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(path, "w") as f:
        f.write(head + BEGIN + "\n" + text + END + tail)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--out", default=None, help="where report.json, report.md and the logs go "
                   "(default BUILD/bench)")
    p.add_argument("--only", default=",".join(SUITES), help="comma-separated suites")
    p.add_argument("--quick", action="store_true", help="tiny shapes: checks the report, not speed")
    p.add_argument("--readme", action="store_true",
                   help="regenerate benchmarks/README.md's and README.md's report blocks")
    args = p.parse_args()
    args.out = os.path.abspath(args.out or os.path.join(args.build, "bench"))
    os.makedirs(args.out, exist_ok=True)
    only = [s for s in args.only.split(",") if s]
    unknown = [s for s in only if s not in SUITES]
    if unknown:
        p.error(f"unknown suite(s) {', '.join(unknown)}; the suites: {', '.join(SUITES)}")
    if args.readme and (args.quick or only != SUITES):
        p.error("--readme needs every suite at full size (no --quick, no --only)")

    # PyTorch's OpenBLAS at its best: the fastest of the kernels an inherited OPENBLAS_CORETYPE
    # names, OpenBLAS's own choice and its AVX-512 ones (benchmarks/peer_blas.py). Every program
    # started below inherits the choice.
    try:
        import peer_blas  # imports torch
        coretype, core_line = peer_blas.best_openblas_coretype(PYTHON)
    except ImportError as e:
        coretype = os.environ.get("OPENBLAS_CORETYPE")
        core_line = f"OpenBLAS core: not chosen ({e})"
    print("report: " + core_line, flush=True)
    if coretype:
        os.environ["OPENBLAS_CORETYPE"] = coretype
    else:
        os.environ.pop("OPENBLAS_CORETYPE", None)
    r = Runner(args)
    report = {"machine": machine(), "quick": args.quick, "rows": [], "extra": {}, "failed": {}}
    report["machine"]["openblas_core"] = core_line
    for name in only:
        print(f"report: suite {name}", flush=True)
        try:
            report["rows"] += globals()["suite_" + name](r, report["extra"])
        except (RuntimeError, OSError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
            report["failed"][name] = f"{type(e).__name__}: {e}"
            print(f"report: suite {name} FAILED: {e}", file=sys.stderr, flush=True)
    report["logs"] = r.logs
    with open(os.path.join(args.out, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    text = markdown(report)
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write(text)
    print(text)
    print(f"report: {args.out}/report.md and report.json")
    if report["failed"]:
        print(f"report: {len(report['failed'])} suite(s) failed: "
              f"{', '.join(report['failed'])}; the READMEs are left as they are", file=sys.stderr)
        return 1
    if args.readme:
        replace_block(os.path.join(HERE, "README.md"), text)
        replace_block(os.path.join(ROOT, "README.md"), headline_markdown(report))
        print("report: regenerated the report blocks of benchmarks/README.md and README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
