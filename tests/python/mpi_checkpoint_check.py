"""loom.distributed.checkpoint under mpirun (-np 2 or 4), with a GPT written in Python (a ModuleList
of Python blocks: Note [Python modules as C++ modules]) and with TensorParallelGPT:

  ZeRO-3 over the world saves at step 2; a fresh ZeRO-3 model (another seed) loads it, and its
    step 3 equals the original's step 3 bit for bit (parameters after it, and the loss);
  the same checkpoint loads into DDP + AdamW: the parameters are the ZeRO-3 ones bit for bit, and
    the DDP optimizer's state equals what one rank alone loads from it (resharding: every rank
    reads only its part, a process alone reads everything);
  TensorParallelGPT (tp 2, dp = size / 2, plain AdamW, DDP over dp) saves with and without its
    optimizer; a plain loom.nn.GPT loads the parameters model-only (each rank whole) and they are
    gather_full_state's bit for bit; ZeRO-1 over the world loads the full checkpoint and its
    parameters are those too.

Every rank prints what differed; the failure count is summed over ranks and every rank exits 1
when it is not zero. Exits 77 (skip) without numpy or the module, or when not launched by mpirun.
"""

import os
import sys
import tempfile

try:
    import numpy as np

    import loom
    import loom.distributed as dist
    import loom.nn.functional as F
    from loom.distributed import checkpoint
except ImportError as e:  # the module is not built, or numpy is missing
    print(f"skipped: {e}")
    sys.exit(77)

if not dist.launched_by_mpi():
    print("skipped: not launched by mpirun")
    sys.exit(77)

CONFIG = dict(max_seq_len=8, vocab=60, padded_vocab=64, layers=2, heads=2, channels=32)
B, T = 8, 8
ADAMW = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-6, weight_decay=0.1)

comm = dist.init_process_group()
rank, size = comm.rank, comm.size
alone = comm.split(color=rank, key=0, name="alone")  # this rank by itself
failures = []


def batch(step):
    rng = np.random.default_rng(100 + step)
    idx = rng.integers(0, CONFIG["vocab"], size=(B, T)).astype(np.int64)
    targets = rng.integers(0, CONFIG["vocab"], size=(B, T)).astype(np.int64)
    return idx, targets


def mine(rows, part, parts):
    n = rows.shape[0] // parts
    return loom.tensor(np.ascontiguousarray(rows[part * n:(part + 1) * n]), dtype=loom.int64)


class PyBlock(loom.nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.ln1 = loom.nn.LayerNorm(c)
        self.attn = loom.nn.CausalSelfAttention(c, heads)
        self.ln2 = loom.nn.LayerNorm(c)
        self.mlp = loom.nn.MLP(c)
        self.gain = loom.nn.Parameter(loom.full([c], 1.5))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x)) * self.gain


class PyGPT(loom.nn.Module):
    def __init__(self, seed):
        super().__init__()
        c = CONFIG["channels"]
        self.wte = loom.nn.Embedding(CONFIG["padded_vocab"], c)
        self.wpe = loom.nn.Embedding(CONFIG["max_seq_len"], c)
        self.blocks = loom.nn.ModuleList(
            [PyBlock(c, CONFIG["heads"]) for _ in range(CONFIG["layers"])])
        self.ln_f = loom.nn.LayerNorm(c)
        self.init_parameters(seed=seed)

    def forward(self, idx):
        pos = loom.arange(idx.shape[1], dtype=loom.int64)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)

    def loss(self, idx, targets):
        logits = self(idx)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def values(named):
    return {n: np.asarray(p.detach()).copy() for n, p in named}


def check_same(what, got, want):
    if got.keys() != want.keys():
        failures.append(f"{what}: names differ: {sorted(set(got) ^ set(want))[:4]}")
        return
    bad = [k for k in want if got[k].shape != want[k].shape or not np.array_equal(got[k], want[k])]
    if bad:
        failures.append(f"{what}: {len(bad)} tensor(s) differ, first {bad[0]}")


def zero_step(model, zero, step):
    idx, targets = batch(step)
    loss = model.loss(mine(idx, rank, size), mine(targets, rank, size))
    zero.backward(loss)
    zero.step()
    zero.zero_grad()
    return loss.item()


def check_python_model_zero3(tmp):
    model = PyGPT(seed=1)
    zero = dist.ZeroRedundancyOptimizer(model, stage=3, bucket_mb=0.02, **ADAMW)
    for step in range(2):
        zero_step(model, zero, step)
    path = checkpoint.save(tmp, model=model, optimizer=zero, step=2, note="zero3")
    loss3 = zero_step(model, zero, 2)
    zero.gather_parameters()
    want = values(model.named_parameters())

    fresh = PyGPT(seed=2)
    fresh_zero = dist.ZeroRedundancyOptimizer(fresh, stage=3, bucket_mb=0.02, **ADAMW)
    state = checkpoint.load(tmp, model=fresh, optimizer=fresh_zero)
    if state != {"note": "zero3", "step": 2}:
        failures.append(f"ZeRO-3 load: state {state}")
    if zero_step(fresh, fresh_zero, 2) != loss3:
        failures.append("ZeRO-3 resumed: the loss of step 3 differs")
    fresh_zero.gather_parameters()
    check_same("ZeRO-3 resumed: parameters after step 3", values(fresh.named_parameters()), want)

    # The step-2 checkpoint in DDP, and by one rank alone.
    ddp_model = PyGPT(seed=3)
    ddp = dist.DistributedDataParallel(ddp_model, bucket_mb=0.02)
    ddp_opt = loom.optim.AdamW(ddp_model.parameters(), **ADAMW)
    checkpoint.load(path, model=ddp, optimizer=ddp_opt)
    one = PyGPT(seed=4)
    one_opt = loom.optim.AdamW(one.parameters(), **ADAMW)
    checkpoint.load(path, model=one, optimizer=one_opt, group=alone)
    check_same("ZeRO-3 checkpoint in DDP: parameters", values(ddp_model.named_parameters()),
               values(one.named_parameters()))
    check_same("ZeRO-3 checkpoint in DDP: optimizer state",
               {k: np.asarray(v) for k, v in ddp_opt.state_dict()["state"].items()},
               {k: np.asarray(v) for k, v in one_opt.state_dict()["state"].items()})
    # Those parameters are the ZeRO-3 model's at step 2: step both on and compare.
    zero_then = values(one.named_parameters())
    model_at_2 = PyGPT(seed=5)
    z2 = dist.ZeroRedundancyOptimizer(model_at_2, stage=3, bucket_mb=0.02, **ADAMW)
    checkpoint.load(path, model=model_at_2, optimizer=z2)
    z2.gather_parameters()
    check_same("ZeRO-3 checkpoint: one rank's load against ZeRO-3's",
               values(model_at_2.named_parameters()), zero_then)


def check_tensor_parallel(tmp):
    mesh = dist.DeviceMesh(tp=2)
    cfg = loom.nn.GPTConfig(**CONFIG)
    model = loom.nn.TensorParallelGPT(cfg, mesh.tp_group, seed=7)
    ddp = dist.DistributedDataParallel(model, mesh.dp_group) if mesh.dp > 1 else None
    opt = loom.optim.AdamW(model.parameters(), **ADAMW)
    for step in range(2):
        idx, targets = batch(step)
        loss = model.loss(mine(idx, mesh.coords.dp, mesh.dp),
                          mine(targets, mesh.coords.dp, mesh.dp))
        if ddp:
            ddp.backward(loss)
            ddp.finish()
        else:
            loss.backward()
        opt.step()
        opt.zero_grad()
    full = values(dist.gather_full_state(model, mesh.tp_group).items())
    model_only = os.path.join(tmp, "model-only")
    checkpoint.save(model_only, model=model, step=2)
    checkpoint.save(tmp, model=model, optimizer=opt, step=2)

    plain = loom.nn.GPT(cfg, seed=8)
    checkpoint.load(model_only, model=plain)
    check_same("tp 2 model-only checkpoint in loom.nn.GPT", values(plain.named_parameters()),
               full)
    gpt = loom.nn.GPT(cfg, seed=9)
    zero = dist.ZeroRedundancyOptimizer(gpt, stage=1, **ADAMW)
    checkpoint.load(tmp, model=gpt, optimizer=zero)
    check_same("tp 2 checkpoint in ZeRO-1", values(gpt.named_parameters()), full)


def main():
    # Rank 0 makes the directory; every rank uses its name.
    name = [tempfile.mkdtemp(prefix="loom-ckpt-")] if rank == 0 else [None]
    buf = loom.tensor(np.frombuffer(name[0].encode().ljust(256, b"\0"), dtype=np.uint8)
                      if rank == 0 else np.zeros(256, dtype=np.uint8))
    comm.broadcast(buf, src=0)
    tmp = bytes(np.asarray(buf)).rstrip(b"\0").decode()
    try:
        check_python_model_zero3(os.path.join(tmp, "zero3"))
        check_tensor_parallel(os.path.join(tmp, "tp"))
    except Exception as e:  # noqa: BLE001  (counted, so every rank exits)
        failures.append(f"{type(e).__name__}: {e}")
    for f in failures:
        print(f"rank {rank}: FAILED: {f}", flush=True)
    total = loom.full([1], float(len(failures)))
    comm.allreduce(total)
    comm.barrier()
    if rank == 0:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    if total.item() > 0:
        sys.exit(1)
    if rank == 0:
        print(f"checkpoint: ZeRO-3 (Python-defined GPT) resumed bit for bit, resharded into DDP "
              f"and one process; tp 2 into loom.nn.GPT and ZeRO-1; {size} ranks: OK")


if __name__ == "__main__":
    main()
