#!/usr/bin/env python3
"""loom-plan's predictions against loom-gpt's measured runs on this machine.

Calibrates the machine with `loom-plan --calibrate` on the same number of ranks (so the GEMM and
element-wise rates are those of ranks sharing the cores), then for every layout of a small GPT on
--ranks ranks (1: one process, gradient accumulation, recomputation; 2: dp with ZeRO 0/1/3, tp
with and without sequence parallelism, pp with GPipe, 1F1B and Chimera, tp and pp with full
recomputation; 4: dp with ZeRO 0/1/3, dp x tp with and without sp, tp 4, dp x pp, tp x pp and
pp 4, dp x tp and tp x pp with full recomputation; 8: dp, dp x tp, dp x pp, tp x pp
and dp x tp x pp) trains loom-gpt, takes the
median step after --warmup steps and the "memory per rank" line, and asks `loom-plan --evaluate`
for the same layout with that profile. Prints one row per layout (measured, predicted, error;
rank 0's training-state bytes and its allocator's peak, measured / predicted), the median and
worst errors, the rank correlation of predicted and measured steps, and whether the layout the
planner ranks first is within 5% of the measured best.

With --device cuda (one GPU, --ranks 1) the calibration measures the GPU in bf16, loom-gpt trains
in bf16 on it, the predictions use `--execution loom` (bf16 with f32 masters), and each row also
shows the prediction from the --gpu datasheet preset alone, uncalibrated.

With --nodes N the ranks run on an emulated cluster of N nodes (scripts/cluster.sh, as root: each
node its own network namespace and shared memory, TCP between nodes, every node's link shaped to
--inter-bw), brought up for the run and taken down after; the calibration then measures both link
levels (inside a node and across nodes) and the predictions place --ranks / N ranks per node.

With --moe the model's every other layer is a mixture of experts (4 experts, top-2, 2 x dim
wide) and the layouts add expert parallelism (MOE_LAYOUTS).

  python3 benchmarks/plan_vs_measured.py --ranks 2
  python3 benchmarks/plan_vs_measured.py --ranks 2 --moe
  python3 benchmarks/plan_vs_measured.py --ranks 4 --nodes 2 --inter-bw 1gbit   (as root)
  python3 benchmarks/plan_vs_measured.py --ranks 1 --device cuda --gpu h200 --layers 12 \
      --dim 768 --heads 12 --seq 1024 --vocab 50257   (GPT-2 124M on one GPU)
"""
import argparse
import array
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
BIN = os.path.join(ROOT, "build", "bin")
MPI = ["mpirun", "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader",
       "--mca", "btl_vader_single_copy_mechanism", "none", "--mca", "oob_tcp_if_include", "lo"]
ENV = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
           OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")

LAYOUTS = {
    1: ["dp=1,mb=8", "dp=1,mb=4", "dp=1,mb=2", "dp=1,mb=8,recompute=full"],
    2: ["dp=2,mb=4", "dp=2,mb=4,zero=1", "dp=2,mb=4,zero=3", "dp=2,mb=2", "tp=2,mb=8",
        "tp=2,mb=8,sp=1", "pp=2,mb=2,schedule=1f1b", "pp=2,mb=2,schedule=gpipe",
        "pp=2,mb=1,schedule=1f1b", "pp=2,mb=2,schedule=chimera", "tp=2,mb=8,recompute=full",
        "tp=2,mb=8,sp=1,recompute=full", "pp=2,mb=2,schedule=1f1b,recompute=full"],
    # 4 ranks: on a 2-core machine they share the cores (the calibration runs on 4 ranks too).
    4: ["dp=4,mb=2", "dp=4,mb=2,zero=1", "dp=4,mb=2,zero=3", "dp=4,mb=1", "dp=2,tp=2,mb=4",
        "dp=2,tp=2,mb=4,sp=1", "tp=4,mb=8", "dp=2,pp=2,mb=2,schedule=1f1b",
        "tp=2,pp=2,mb=2,schedule=1f1b", "pp=4,mb=1,schedule=1f1b", "pp=4,mb=2,schedule=gpipe",
        "dp=2,tp=2,mb=4,sp=1,recompute=full", "tp=2,pp=2,mb=2,schedule=1f1b,recompute=full"],
    8: ["dp=8,mb=1", "dp=8,mb=1,zero=1", "dp=8,mb=1,zero=3", "dp=4,tp=2,mb=2", "dp=2,tp=4,mb=4",
        "dp=4,pp=2,mb=1,schedule=1f1b", "dp=2,pp=4,mb=1,schedule=1f1b",
        "dp=2,tp=2,pp=2,mb=2,schedule=1f1b", "tp=4,pp=2,mb=2,schedule=1f1b",
        "tp=2,pp=4,mb=1,schedule=1f1b"],
}

# --moe: a mixture-of-experts model (4 experts, top-2, every other layer, each 2 x dim wide) with
# and without expert parallelism.
MOE_LAYOUTS = {
    1: ["dp=1,mb=8", "dp=1,mb=4", "dp=1,mb=8,recompute=full"],
    2: ["dp=2,mb=4", "dp=2,mb=4,ep=2", "dp=2,mb=4,zero=1,ep=2", "dp=2,mb=4,zero=3,ep=2",
        "dp=2,mb=2,ep=2", "tp=2,mb=8", "pp=2,mb=2,schedule=1f1b",
        "pp=2,mb=2,schedule=1f1b,recompute=full"],
    4: ["dp=4,mb=2", "dp=4,mb=2,ep=2", "dp=4,mb=2,ep=4", "dp=4,mb=2,zero=1,ep=4",
        "dp=4,mb=2,zero=3,ep=2", "dp=2,tp=2,mb=4,ep=2", "dp=2,pp=2,mb=2,schedule=1f1b,ep=2",
        "tp=2,pp=2,mb=2,schedule=1f1b"],
}


CLUSTER = os.path.join(ROOT, "scripts", "cluster.sh")


def run(cmd, ranks, on_cluster=False):
    if on_cluster:
        full = ["bash", CLUSTER, "run", "--np", str(ranks), "--"] + cmd
    else:
        full = (MPI + ["-np", str(ranks)] + cmd) if ranks > 1 else cmd
    proc = subprocess.run(full, capture_output=True, text=True, env=ENV)
    if proc.returncode != 0:
        raise RuntimeError(f"failed: {' '.join(full)}\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def gpt_flags(layout, batch):
    f = dict(kv.split("=") for kv in layout.split(","))
    dp, tp, pp, mb = (int(f.get(k, 1)) for k in ("dp", "tp", "pp", "mb"))
    flags = ["--dp", str(dp), "--tp", str(tp), "--pp", str(pp), "--zero", f.get("zero", "0"),
             "--ep", f.get("ep", "1")]
    accum = batch // (dp * mb)
    if pp > 1:
        flags += ["--microbatches", str(accum), "--schedule", f.get("schedule", "1f1b")]
    elif accum > 1:
        flags += ["--grad-accum", str(accum)]
    if f.get("recompute") == "full":
        flags.append("--checkpoint-activations")
    if f.get("sp") == "1":
        flags.append("--sequence-parallel")
    return flags


def spearman(xs, ys):
    """Rank correlation (ties get their mean rank)."""
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    return cov / (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=2, choices=sorted(LAYOUTS))
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--moe", action="store_true",
                   help="a mixture-of-experts model (4 experts top-2 every 2nd layer, 2 x dim wide)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="cuda: calibrate and train on one GPU in bf16 (--ranks 1)")
    p.add_argument("--gpu", default="h100-sxm", help="--device cuda: loom-plan's GPU preset")
    p.add_argument("--nodes", type=int, default=1,
                   help="run on an emulated cluster of this many nodes (scripts/cluster.sh; root)")
    p.add_argument("--inter-bw", default="1gbit",
                   help="--nodes: every node's link rate (tc syntax), both directions")
    p.add_argument("--bin", default=BIN, help="where loom-gpt and loom-plan are (build-gpu/bin on "
                   "the GPU machine, after scripts/gpu_check.sh)")
    args = p.parse_args()
    on_gpu = args.device == "cuda"
    if on_gpu and args.ranks != 1:
        sys.exit("--device cuda measures one GPU: use --ranks 1")
    if args.nodes > 1 and (args.ranks % args.nodes or args.ranks == args.nodes or on_gpu):
        sys.exit(f"--nodes {args.nodes}: --ranks must be a multiple of it, with 2 or more ranks "
                 "per node, on the CPU")
    layouts = (MOE_LAYOUTS if args.moe else LAYOUTS)[args.ranks]
    if on_gpu and not args.moe:  # one GPU: micro-batch sizes down to 1, recomputation at two
        layouts = ["dp=1,mb=8", "dp=1,mb=4", "dp=1,mb=2", "dp=1,mb=1", "dp=1,mb=8,recompute=full",
                   "dp=1,mb=4,recompute=full"]
    on_cluster = args.nodes > 1
    if on_cluster:
        subprocess.run(["bash", CLUSTER, "down"], check=True, capture_output=True)
        subprocess.run(["bash", CLUSTER, "up", str(args.nodes), "--ranks-per-node",
                        str(args.ranks // args.nodes), "--inter-bw", args.inter_bw], check=True)
    try:
        rows = measure(args, layouts, on_gpu, on_cluster)
    finally:
        if on_cluster:
            subprocess.run(["bash", CLUSTER, "down"], check=True, capture_output=True)
    report(args, rows)


def measure(args, layouts, on_gpu, on_cluster):
    """Calibrates, then trains and predicts every layout: one row per layout that ran."""
    bin_dir = args.bin
    with tempfile.TemporaryDirectory() as d:
        # llm.c's token file: a 256 x int32 header (magic, version, count), then uint16 tokens.
        # Written without numpy, which the GPU machine's python3 lacks.
        rng = random.Random(0)
        tokens = array.array("H", (rng.randrange(args.vocab) for _ in range(64 * args.batch * args.seq)))
        header = array.array("i", [20240520, 1, len(tokens)] + [0] * 253)
        data = os.path.join(d, "tokens.bin")
        with open(data, "wb") as f:
            f.write(header.tobytes() + tokens.tobytes())
        profile = os.path.join(d, "profile.json")
        model = ["--layers", str(args.layers), "--heads", str(args.heads), "--seq", str(args.seq),
                 "--vocab", str(args.vocab)]
        calibrate = [os.path.join(bin_dir, "loom-plan"), "--calibrate", profile]
        if on_gpu:  # the element-wise term is fitted on this model's layer shape
            calibrate += ["--device", "cuda", "--gpu", args.gpu, "--hidden", str(args.dim),
                          "--heads", str(args.heads), "--seq", str(args.seq), "--vocab", str(args.vocab)]
        print(run(calibrate, args.ranks, on_cluster).strip())
        if on_gpu:
            print(open(profile).read().strip())
        device = ["--device", "cuda", "--dtype", "bf16"] if on_gpu else []
        execution = "loom" if on_gpu else "loom-cpu"
        if args.moe:
            model += ["--moe-experts", "4", "--moe-top-k", "2", "--moe-every", "2",
                      "--moe-hidden", str(2 * args.dim)]
        rows = []
        for layout in layouts:
            metrics = os.path.join(d, "metrics.jsonl")
            if os.path.exists(metrics):
                os.remove(metrics)
            try:
                out = run([os.path.join(bin_dir, "loom-gpt"), "--data", data, "--dim", str(args.dim),
                           "--batch", str(args.batch), "--steps", str(args.steps), "--threads", "1",
                           "--eval-every", "100000", "--lr-schedule", "constant", "--warmup-steps",
                           "0", "--metrics-file", metrics] + model + device
                          + gpt_flags(layout, args.batch), args.ranks, on_cluster)
            except RuntimeError as e:  # one layout's failure is reported; the others still run
                print(f"{layout:34s} FAILED: {str(e)[-600:]}", flush=True)
                continue
            steps = [json.loads(l)["step_ms"] for l in open(metrics) if '"step_ms"' in l]
            measured = statistics.median(steps[args.warmup:]) / 1e3
            state = re.search(r"memory per rank: parameters ([\d.]+) MB, gradients ([\d.]+) MB, "
                              r"optimizer state ([\d.]+) MB", out)
            measured_state = sum(float(x) for x in state.groups()) if state else float("nan")
            peak = re.search(r"peak memory on rank 0: ([\d.]+) MB", out)
            measured_peak = float(peak.group(1)) if peak else float("nan")
            evaluate = [os.path.join(bin_dir, "loom-plan"), "--hidden", str(args.dim),
                        "--global-batch", str(args.batch), "--gpus", str(args.ranks),
                        "--gpus-per-node", str(args.ranks // args.nodes), "--execution", execution,
                        "--evaluate", layout, "--json"] + model
            if on_gpu:
                evaluate += ["--gpu", args.gpu]
            pred = json.loads(run(evaluate + ["--profile", profile], 1))
            preset = json.loads(run(evaluate, 1))["step_s"] if on_gpu else None
            rank0 = pred["memory_per_pipeline_rank"][0]
            predicted_state = (rank0["parameters"] + rank0["gradients"] +
                               rank0["optimizer_state"]) / 1e6
            # loom's allocator counts tensor bytes; the model's `reserved` (a GPU's CUDA context,
            # workspaces, fragmentation; 0 on a CPU) is not in the peak loom-gpt prints.
            predicted_peak = (rank0["total"] - rank0["reserved"]) / 1e6
            rows.append((layout, measured, pred["step_s"], measured_state, predicted_state,
                         measured_peak, predicted_peak))
            print(f"{layout:34s} measured {measured * 1e3:8.1f} ms predicted "
                  f"{pred['step_s'] * 1e3:8.1f} ms ({100 * (pred['step_s'] / measured - 1):+6.1f}%)"
                  f"  rank 0 state {measured_state:6.2f} / {predicted_state:6.2f} MB, peak "
                  f"{measured_peak:6.1f} / {predicted_peak:6.1f} MB "
                  f"({100 * (predicted_peak / measured_peak - 1):+.1f}%)"
                  + (f"  datasheet preset alone {preset * 1e3:.1f} ms "
                     f"({100 * (preset / measured - 1):+.1f}%)" if on_gpu else ""), flush=True)
    return rows


def report(args, rows):
    if not rows:
        sys.exit("no layout ran")
    errors = sorted(abs(r[2] / r[1] - 1) for r in rows)
    memory_errors = sorted(abs(r[6] / r[5] - 1) for r in rows)
    best_measured = min(r[1] for r in rows)
    pick = min(rows, key=lambda r: r[2])
    where = f" on {args.nodes} nodes ({args.inter_bw} links)" if args.nodes > 1 else ""
    print(f"{len(rows)} layouts on {args.ranks} rank(s){where}: median error {100 * statistics.median(errors):.1f}%, "
          f"worst {100 * errors[-1]:.1f}%; the planner's pick {pick[0]} measured "
          f"{pick[1] * 1e3:.1f} ms, the measured best {best_measured * 1e3:.1f} ms "
          f"({100 * (pick[1] / best_measured - 1):+.1f}%), rank correlation "
          f"{spearman([r[1] for r in rows], [r[2] for r in rows]):.2f}; peak memory of rank 0: median error "
          f"{100 * statistics.median(memory_errors):.1f}%, worst {100 * memory_errors[-1]:.1f}%")


if __name__ == "__main__":
    main()
