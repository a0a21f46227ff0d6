"""loom.utils.data.DistributedSampler under mpirun (ctest python_data_loader_mpi, `mpirun -np N`):
the ranks' batches against the single-process DataLoader every rank also builds itself (See Note
[Distributed batches] in python/loom/utils/data.py).

  Layout: for datasets that divide the global batch W*b, leave a tail W divides, leave an uneven
  tail, or are smaller than one global batch; b 2 and 3; shuffled and not; sampler and loader
  drop_last each on and off; 3 epochs with and without set_epoch. The ranks (rank and world
  taken from loom.distributed) gather their batches; at every step they must have the same batch
  size and rank r's batch must be rows [r*size, (r+1)*size) of the single-process global batch
  `DataLoader(ds, batch_size=W*b, shuffle=..., seed=...)` of that step (with loader drop_last on
  both sides, exactly its batches); a tail W does not divide is the single-process tail padded
  with the epoch's first indices (or cut, with the sampler's drop_last), as PyTorch pads.
  Training: a GPT with dropout 0.1 on TokenDataset windows, DDP with a DistributedSampler and no
  dropout call, 2 epochs, against the single process on the global batches: every step's loss
  and the final parameters within 1e-5 (relative to the largest element, + 1e-7 absolute), the
  tolerance of mpi_parallel_check.py. Once with a tail of W rows (one per rank, loader drop_last
  off, set_epoch called), once with an uneven dataset and drop_last on both sides (no set_epoch).

Every rank prints what differed; the failure count is summed over ranks and every rank exits 1
when it is not zero. Exits 77 (skip) without numpy or the module, or when not launched by mpirun.
"""

import sys

try:
    import numpy as np

    import loom
    import loom.distributed as dist
    import loom.utils.data as lud
except ImportError as e:  # the module is not built, or numpy is missing
    print(f"skipped: {e}")
    sys.exit(77)

if not dist.launched_by_mpi():
    print("skipped: not launched by mpirun")
    sys.exit(77)

comm = dist.init_process_group()
rank, size = comm.rank, comm.size
failures = []
worst = [0.0, ""]  # the largest error / tolerance seen in training, printed by rank 0


class Range(lud.Dataset):
    """Row i is the int i, so a batch is the list of its indices."""

    def __init__(self, n):
        self.n = n

    def __getitem__(self, i):
        return i

    def __len__(self):
        return self.n


def batches_of(loader):
    return [b.tolist() for b in loader]


def gather_all(batches):
    """Every rank's list of batches (lists of ints), from this rank's: encoded as
    [steps, size_0.., indices..], padded to the longest, allgathered as f32 (exact below 2^24)."""
    code = [len(batches)] + [len(b) for b in batches] + sum(batches, [])
    longest = loom.tensor([float(len(code))])
    comm.allreduce(longest, op="max")
    width = int(longest.tolist()[0])
    mine = loom.tensor(np.array(code + [-1] * (width - len(code)), dtype=np.float32))
    out = loom.zeros(size * width)
    comm.allgather(mine, out)
    flat = np.asarray(out.tolist()).reshape(size, width).astype(np.int64)
    everyone = []
    for row in flat.tolist():
        steps = row[0]
        sizes, rest = row[1:1 + steps], row[1 + steps:]
        got, at = [], 0
        for s in sizes:
            got.append(rest[at:at + s])
            at += s
        everyone.append(got)
    return everyone


def check_layout(n, b, shuffle, sampler_drop_last, loader_drop_last, set_epoch, seed=17,
                 epochs=3):
    what = (f"n={n} b={b} shuffle={shuffle} sampler drop_last={sampler_drop_last} loader "
            f"drop_last={loader_drop_last} set_epoch={set_epoch}")
    ds = Range(n)
    single = lud.DataLoader(ds, batch_size=size * b, shuffle=shuffle,
                            seed=seed if shuffle else None, drop_last=loader_drop_last)
    whole = lud.DataLoader(ds, batch_size=size * b, shuffle=shuffle,
                           seed=seed if shuffle else None)  # the epoch's full order
    sampler = lud.DistributedSampler(ds, shuffle=shuffle, seed=seed, drop_last=sampler_drop_last)
    if (sampler.num_replicas, sampler.rank) != (size, rank):
        failures.append(f"{what}: sampler has rank {sampler.rank} of {sampler.num_replicas}, "
                        f"want {rank} of {size} (from loom.distributed)")
        return
    loader = lud.DataLoader(ds, batch_size=b, sampler=sampler, drop_last=loader_drop_last)
    for epoch in range(epochs):
        if set_epoch:
            sampler.set_epoch(epoch)
        want = batches_of(single)
        order = sum(batches_of(whole), [])
        mine = batches_of(loader)
        if len(mine) != len(loader):
            failures.append(f"{what}: epoch {epoch}: {len(mine)} batches, len(loader) "
                            f"{len(loader)}")
        ranks = gather_all(mine)
        steps = len(ranks[0])
        if any(len(x) != steps for x in ranks):
            failures.append(f"{what}: epoch {epoch}: ranks have {[len(x) for x in ranks]} steps")
            continue
        tail = n % (size * b)
        fewer = sampler_drop_last and not loader_drop_last and 0 < tail < size
        if steps != len(want) - (1 if fewer else 0):
            failures.append(f"{what}: epoch {epoch}: {steps} steps, single process {len(want)}")
            continue
        for s in range(steps):
            rows = [ranks[r][s] for r in range(size)]
            got_size = len(rows[0])
            if any(len(x) != got_size for x in rows):
                failures.append(f"{what}: epoch {epoch} step {s}: batch sizes "
                                f"{[len(x) for x in rows]} differ across ranks")
                continue
            glob = want[s]
            if len(glob) == size * got_size:  # exactly the single-process global batch
                expect = glob
            elif sampler_drop_last:  # the tail cut to a multiple of W
                expect = glob[:size * got_size]
            else:  # the tail padded with the epoch's first indices
                expect = glob + (order * size)[:size * got_size - len(glob)]
            for r in range(size):
                if rows[r] != expect[r * got_size:(r + 1) * got_size]:
                    failures.append(f"{what}: epoch {epoch} step {s}: rank {r} has {rows[r]}, "
                                    f"want rows [{r * got_size}, {(r + 1) * got_size}) of "
                                    f"{expect}")


for b in (2, 3):
    for n in (4 * size * b, 4 * size * b + size, 4 * size * b + 1, 3):
        for shuffle in (True, False):
            for sampler_drop_last in (False, True):
                for loader_drop_last in (False, True):
                    check_layout(n, b, shuffle, sampler_drop_last, loader_drop_last,
                                 set_epoch=(n + b) % 2 == 0)

# ---------------------------------------------------------------- DDP training

CONFIG = dict(max_seq_len=8, vocab=60, padded_vocab=64, layers=2, heads=2, channels=32)
T, B_RANK, SEED, DATA_SEED, EPOCHS = 8, 2, 1337, 5, 2
ADAMW = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-6, weight_decay=0.1)  # see mpi_parallel_check.py
RTOL, ATOL = 1e-5, 1e-7


def arr(t):
    return np.asarray(t.detach().tolist(), dtype=np.float64)


def token_dataset(windows):
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, CONFIG["vocab"], windows * T + 1).astype(np.int32)
    return lud.TokenDataset(loom.tensor(tokens), T)


def gpt():
    return loom.nn.GPT(loom.nn.GPTConfig(**CONFIG), seed=SEED, dropout=0.1)


def train(ds, loader, sampler=None, ddp=False):
    loom.nn.set_dropout_step(0)
    model = gpt()
    wrapper = dist.DistributedDataParallel(model, bucket_mb=0.02) if ddp else None
    opt = loom.optim.AdamW(model.parameters(), **ADAMW)
    losses = []
    for epoch in range(EPOCHS):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for x, y in loader:
            loss = model.loss(x, y)
            if wrapper:
                wrapper.backward(loss)
                wrapper.finish()
            else:
                loss.backward()
            opt.step()
            opt.zero_grad()
            value = loom.tensor([loss.item()])
            if wrapper:
                comm.allreduce(value, op="avg")
            losses.append(value.tolist()[0])
    return losses, {n: arr(p) for n, p in model.named_parameters()}


# (windows, drop_last, set_epoch): a tail of one row per rank, loader drop_last off, set_epoch
# called; an uneven dataset with drop_last on both sides, no set_epoch.
RUNS = {"DDP, a tail of one row per rank": (5 * size * B_RANK + size, False, True),
        "DDP, an uneven dataset with drop_last": (5 * size * B_RANK + 1, True, False)}


def reference(windows, drop_last, set_epoch):
    ds = token_dataset(windows)
    single = lud.DataLoader(ds, batch_size=size * B_RANK, shuffle=True, seed=DATA_SEED,
                            drop_last=drop_last)
    return train(ds, single)


def check_training(what, want, windows, drop_last, set_epoch):
    want_losses, want_params = want
    ds = token_dataset(windows)
    sampler = lud.DistributedSampler(ds, seed=DATA_SEED)
    loader = lud.DataLoader(ds, batch_size=B_RANK, sampler=sampler, drop_last=drop_last)
    losses, params = train(ds, loader, sampler if set_epoch else None, ddp=True)
    if len(losses) != len(want_losses):
        failures.append(f"{what}: {len(losses)} steps, single process {len(want_losses)}")
        return
    for step, (g, w) in enumerate(zip(losses, want_losses)):
        if abs(g - w) > RTOL * abs(w):
            failures.append(f"{what}: loss of step {step}: got {g!r}, want {w!r}")
    for name, w in want_params.items():
        g = params[name]
        diff, tol = float(np.max(np.abs(g - w))), RTOL * float(np.max(np.abs(w))) + ATOL
        if diff / tol > worst[0]:
            worst[:] = [diff / tol, f"{what}: {name}"]
        if diff > tol:
            failures.append(f"{what}: {name} after {len(losses)} steps: max abs difference "
                            f"{diff:.3g} > {tol:.3g}")


# The single-process runs first: a DistributedDataParallel sets the process's dropout batch part
# (part rank of size) for the forwards after it, which a later one-process run would inherit.
wanted = {what: reference(*run) for what, run in RUNS.items()}
for what, run in RUNS.items():
    check_training(what, wanted[what], *run)

for f in failures[:20]:
    print(f"rank {rank}: {f}", file=sys.stderr)
count = loom.tensor([float(len(failures))])
comm.allreduce(count, op="sum")
total = int(count.tolist()[0])
if rank == 0:
    print(f"mpi_data_loader_check: {size} ranks, {total} mismatches; training closest to its "
          f"tolerance: {worst[1]} at {worst[0]:.3f} of it")
sys.exit(1 if total else 0)
