#!/usr/bin/python3
"""torch.save / torch.load of GPT-2 124M's training state beside loom's checkpoints, in one run.

PyTorch side, one process, one thread: GPT-2 124M's parameters in loom's shapes and names
(Note [GPT parameter names]: wte 50304 x 768 rows as loom pads it, wpe 1024 x 768, 12 blocks,
ln_f; 124,475,904 f32 elements), and torch.optim.AdamW over them after one step on random
gradients (so exp_avg and exp_avg_sq are filled). The state is
{"model": {name: tensor}, "optimizer": optimizer.state_dict()}.
  save: torch.save(state, f) into an open file, f.flush(), os.fsync(f.fileno())
  load: torch.load(path), then the model's tensors copy_()'d in and optimizer.load_state_dict(),
        as loom's TrainingState::load installs into the model and the optimizer (torch.load
        alone is printed too)
Loads run warm (just written: in the page cache) and cold (the file's cached pages dropped first
with posix_fadvise(POSIX_FADV_DONTNEED), which needs no privileges; on a VM the host may still
cache them).

loom side: build/bin/loom-bench-checkpoint --repeat 1 --json as one process (world size 1, no
mpirun: plain AdamW over the same state), into the same directory. The script runs --repeat
rounds of one run of each side, so both sides meet the disk in the same minute, and alternates
which side goes first (PyTorch in the first round), so neither always follows the other's writes
and deletions. It takes the disk's raw figures (write + fsync as the save writes, O_DIRECT in
8 MiB pwrite()s; read: read() in 1 MiB calls into memory allocated and written just before, as a
resume's tensors are; the same number of bytes) from loom's run of each round. loom's loads go
into a model and optimizer built just before each, as a resume does.

Prints the medians over rounds, each side's fraction of the raw disk in its round and
PyTorch time / loom time (> 1: loom is faster).

No BLAS is involved: nothing timed here multiplies matrices (serialisation, file I/O, copies,
crc32 / crc32c); libblas.so.3's choice (reference or OpenBLAS) does not change these figures.

Run: /usr/bin/python3 benchmarks/checkpoint_vs_pytorch.py [--repeat 3] [--dir /tmp]
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

import torch


def gpt2_shapes(layers, channels=768, padded_vocab=50304, seq=1024):
    """loom's GPT parameters, in its order (core/nn/gpt_config.h, Note [GPT parameter names])."""
    c = channels
    shapes = [("wte.weight", (padded_vocab, c)), ("wpe.weight", (seq, c))]
    for i in range(layers):
        b = "blocks.%d." % i
        shapes += [(b + "ln1.weight", (c,)), (b + "ln1.bias", (c,)),
                   (b + "attn.qkv.weight", (3 * c, c)), (b + "attn.qkv.bias", (3 * c,)),
                   (b + "attn.proj.weight", (c, c)), (b + "attn.proj.bias", (c,)),
                   (b + "ln2.weight", (c,)), (b + "ln2.bias", (c,)),
                   (b + "mlp.fc.weight", (4 * c, c)), (b + "mlp.fc.bias", (4 * c,)),
                   (b + "mlp.proj.weight", (c, 4 * c)), (b + "mlp.proj.bias", (c,))]
    shapes += [("ln_f.weight", (c,)), ("ln_f.bias", (c,))]
    return shapes


def build_state(layers):
    torch.manual_seed(0)
    params = {}
    for name, shape in gpt2_shapes(layers):
        p = torch.empty(shape)
        if len(shape) == 1:
            p.fill_(1.0 if name.endswith("weight") else 0.0)
        else:
            p.normal_(0.0, 0.02)
        params[name] = p.requires_grad_()
    opt = torch.optim.AdamW(list(params.values()))
    for p in params.values():
        p.grad = torch.randn_like(p)
    opt.step()
    for p in params.values():
        p.grad = None
    return params, opt


def drop_cached(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class TorchSide:
    def __init__(self, layers, tmp):
        self.params, self.opt = build_state(layers)
        self.numel = sum(p.numel() for p in self.params.values())
        self.state = {"model": self.params, "optimizer": self.opt.state_dict()}
        self.path = os.path.join(tmp, "torch_state.pt")
        self.bytes = 0

    def save(self):
        with open(self.path, "wb") as f:
            torch.save(self.state, f)
            f.flush()
            os.fsync(f.fileno())

    def load_only(self):
        torch.load(self.path)

    def load_install(self):
        loaded = torch.load(self.path)
        with torch.no_grad():
            for name, p in self.params.items():
                p.copy_(loaded["model"][name])
        self.opt.load_state_dict(loaded["optimizer"])

    def round(self):
        """One repeat: save, then each load warm and cold. Seconds by phase."""
        if os.path.exists(self.path):
            os.unlink(self.path)
        r = {"save": timed(self.save)}
        self.bytes = os.path.getsize(self.path)
        for temp in ("warm", "cold"):
            for key, fn in (("load_only_", self.load_only), ("load_", self.load_install)):
                if temp == "cold":
                    drop_cached(self.path)
                r[key + temp] = timed(fn)
        os.unlink(self.path)
        return r


def loom_round(a, tmp):
    """One loom-bench-checkpoint run (one repeat) as a single process: its JSON report."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [a.binary, "--repeat", "1", "--layers", str(a.layers), "--dir", tmp, "--json"]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


SAVE = "save (save_pieces + write + crc32c + fsync + commit)"
LOAD_WARM = "load, same layout, warm"
LOAD_COLD = "load, same layout, cold"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="rounds of one run of each side")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--dir", default="/tmp", help="a fresh directory is made (and removed) here")
    ap.add_argument("--binary", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                     "..", "build", "bin",
                                                     "loom-bench-checkpoint"))
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON to FILE "
                    "(benchmarks/report.py reads it)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    blas = os.path.realpath("/usr/lib/x86_64-linux-gnu/libblas.so.3")
    tmp = tempfile.mkdtemp(prefix="ckpt-vs-torch-", dir=a.dir)
    t, loom = [], []
    try:
        side = TorchSide(a.layers, tmp)
        for i in range(a.repeat):  # both meet the disk in the same minute, each first in turn
            if i % 2 == 0:
                t.append(side.round())
                loom.append(loom_round(a, tmp))
            else:
                loom.append(loom_round(a, tmp))
                t.append(side.round())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    med = statistics.median
    print("checkpoint_vs_pytorch: GPT-2 %d layers, %d parameters, f32 + AdamW moments; "
          "torch %s, one thread; %d rounds (median); libblas.so.3 -> %s (unused: no GEMM)"
          % (a.layers, side.numel, torch.__version__, a.repeat, blas))
    if loom[0]["parameters"] != side.numel:
        sys.exit("parameter counts differ: loom %d, torch %d" % (loom[0]["parameters"], side.numel))
    print("bytes: torch.save file %d, loom checkpoint %d (GB = 1e9 bytes); raw = "
          "loom-bench-checkpoint's write+fsync / read of its checkpoint's bytes in the same round\n"
          % (side.bytes, loom[0]["checkpoint_bytes"]))
    print("| phase | PyTorch s (GB/s) | PyTorch / raw | loom s (GB/s) | loom / raw | raw GB/s |"
          " PyTorch time / loom time |")
    print("|---|---:|---:|---:|---:|---:|---:|")

    figures = {}

    def row(what, tkey, lkey):
        ts = [r[tkey] for r in t]
        ls = [run["rows"][lkey]["seconds"][0] for run in loom]
        raw = [run["rows"][lkey]["raw_bytes"] / run["rows"][lkey]["raw_seconds"][0]
               for run in loom]
        lb = loom[0]["rows"][lkey]["bytes"]
        tfrac = med(side.bytes / x / y for x, y in zip(ts, raw))
        lfrac = med(lb / x / y for x, y in zip(ls, raw))
        print("| %s | %.3f (%.3f) | %.2f | %.3f (%.3f) | %.2f | %.3f | **%.2fx** |"
              % (what, med(ts), side.bytes / med(ts) / 1e9, tfrac, med(ls), lb / med(ls) / 1e9,
                 lfrac, med(raw) / 1e9, med(x / y for x, y in zip(ts, ls))))
        figures[what] = {"torch_s": med(ts), "loom_s": med(ls), "torch_vs_raw": tfrac,
                         "loom_vs_raw": lfrac, "raw_gbps": med(raw) / 1e9,
                         "torch_over_loom": med(x / y for x, y in zip(ts, ls))}
        return ts, ls

    s = row("save (+ fsync)", "save", SAVE)
    w = row("load + install, warm", "load_warm", LOAD_WARM)
    c = row("load + install, cold", "load_cold", LOAD_COLD)
    print("\ntorch.load alone (no install): warm %.3f s, cold %.3f s"
          % (med(r["load_only_warm"] for r in t), med(r["load_only_cold"] for r in t)))
    for name, (ts, ls) in (("save", s), ("load warm", w), ("load cold", c)):
        print("per round, %s s: PyTorch %s, loom %s"
              % (name, " ".join("%.2f" % x for x in ts), " ".join("%.2f" % x for x in ls)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"layers": a.layers, "rounds": a.repeat, "bytes": side.bytes,
                       "torch": torch.__version__, "phases": figures}, f)


if __name__ == "__main__":
    main()
