"""loom.distributed.pipelining under mpirun (`mpirun -np 2` or `-np 4`; the pipeline group is the
world). Every rank also computes the single-process step itself (same seed, same batch) and
compares its own stages against it:

  * a GPT cut into GPTStage chunks (stage_chunk, replica_pairs, sync_tied_embedding over
    embedding_group) under gpipe, 1f1b, interleaved (2 chunks per rank) and chimera: the mean
    loss and every stage parameter's gradient equal loom.nn.GPT's within 1e-5; with
    ``checkpoint=True`` (1f1b, interleaved) the uncheckpointed run's bit for bit;
  * a model whose stages are Python-defined loom.nn.Module subclasses under 1f1b (and gpipe):
    the same against the stages chained in one process;
  * GradientSum against its closed form; gathered timelines, measured bubbles and the Chrome
    trace are well formed.

Each rank counts its failures, the counts are summed over ranks, and every rank exits 1 when the
total is not zero. Exits 77 (skip) without numpy or the module, or when not launched by mpirun.
"""

import json
import sys

try:
    import numpy as np

    import loom
    import loom.distributed as dist
    import loom.nn as nn
    import loom.nn.functional as F
    from loom.distributed import pipelining
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

if not dist.launched_by_mpi():
    print("skipped: not launched by mpirun")
    sys.exit(77)

TOL = 1e-5
world = dist.init_process_group()
R, P = world.rank, world.size
failures = 0


def fail(msg):
    global failures
    failures += 1
    print(f"rank {R}: {msg}", file=sys.stderr, flush=True)


def check_close(what, got, want, tol=TOL):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        fail(f"{what}: shape {got.shape}, want {want.shape}")
        return
    err = float(np.max(np.abs(got - want))) if got.size else 0.0
    if not err <= tol:
        fail(f"{what}: max abs difference {err:.3g} > {tol}")


def i64(a):
    return loom.tensor(np.ascontiguousarray(a), dtype=loom.int64)


# ---------------------------------------------------------------- GPT stages

config = nn.GPTConfig(max_seq_len=8, vocab=30, padded_vocab=32, layers=2 * P, heads=2,
                      channels=16)
SEED, T, ROWS = 1234, 8, 1
M = 2 * P  # a multiple of P (interleaved) and even (chimera)
rng = np.random.default_rng(42)
idx = rng.integers(0, config.vocab, (M * ROWS, T))
tgt = rng.integers(0, config.vocab, (M * ROWS, T))

full = nn.GPT(config).init_parameters(seed=SEED)
ref_loss = full.loss(i64(idx), i64(tgt))
ref_loss.backward()
ref_grads = {n: p.grad.numpy() for n, p in full.named_parameters()}
ref_loss = ref_loss.item()

plain = {}  # per schedule, the uncheckpointed run's loss and gradients
for name, v, checkpoint in (("gpipe", 1, False), ("1f1b", 1, False), ("1f1b", 1, True),
                             ("interleaved", 2, False), ("interleaved", 2, True),
                             ("chimera", 1, False)):
    s = pipelining.schedule(name, P, M, virtual_stages=v)
    pipelining.validate(s)
    pairs = pipelining.replica_pairs(s, world)
    stages, chunks = [], []
    for place in s.chunks[R]:
        stage = pipelining.GPTStage(config, place.stage, s.stages,
                                    checkpoint=checkpoint).init_parameters(seed=SEED)
        stages.append(stage)
        chunks.append(pipelining.stage_chunk(stage, pairs[place.stage]))
    ex = pipelining.PipelineExecutor(s, world, chunks, stages[0].activation_shape(ROWS, T))
    tokens = [i64(idx[k * ROWS:(k + 1) * ROWS]) for k in range(M)]
    targets = [i64(tgt[k * ROWS:(k + 1) * ROWS]) for k in range(M)]
    local = ex.run(tokens, targets)
    pipelining.sync_tied_embedding(stages, pipelining.embedding_group(s, world))
    loss = ex.mean_loss(local)
    check_close(f"{name}: loss", loss, ref_loss)
    grads = {}
    for k, stage in enumerate(stages):
        for pname, p in stage.named_parameters():
            if p.grad is None:
                fail(f"{name}: chunk {k} {pname} has no gradient")
                continue
            grads[(k, pname)] = p.grad.numpy()
            check_close(f"{name}: chunk {k} {pname} gradient", p.grad.numpy(), ref_grads[pname])
    if checkpoint:  # recomputed blocks: the uncheckpointed run's loss and gradients bit for bit
        want_loss, want_grads = plain[name]
        if loss != want_loss or grads.keys() != want_grads.keys() or any(
                not np.array_equal(g, want_grads[key]) for key, g in grads.items()):
            fail(f"{name} checkpointed: not the uncheckpointed loss and gradients bit for bit")
        continue
    plain[name] = (loss, grads)
    timelines = pipelining.gather_timelines(ex.timeline, world)
    bubbles = pipelining.measured_bubbles(timelines)
    if len(timelines) != P or not all(0.0 <= b < 1.0 for b in bubbles):
        fail(f"{name}: {len(timelines)} timelines, bubbles {bubbles}")
    trace = pipelining.ChromeTrace()
    trace.add_step(1, timelines)
    if not json.loads(trace.json()):
        fail(f"{name}: empty Chrome trace")


# ---------------------------------------------------------------- Python-defined stages

D = 6


class PyStage(nn.Module):
    """Stage k of a P-stage MLP, written in Python: gelu(x W_k^T + b_k)."""

    def __init__(self, k):
        super().__init__()
        r = np.random.default_rng(100 + k)
        self.weight = nn.Parameter(loom.tensor(r.standard_normal((D, D), dtype=np.float32) * 0.4))
        self.bias = nn.Parameter(loom.tensor(r.standard_normal(D, dtype=np.float32) * 0.1))

    def forward(self, x):
        return F.gelu(F.linear(x, self.weight, self.bias))


def mse(out, target):
    d = out - target
    return (d * d).mean()


xs = rng.standard_normal((M * 2, D), dtype=np.float32)
ys = rng.standard_normal((M * 2, D), dtype=np.float32)
ref_stages = [PyStage(k) for k in range(P)]
h = loom.tensor(xs)
for st in ref_stages:
    h = st(h)
ref = mse(h, loom.tensor(ys))
ref.backward()

for name in ("1f1b", "gpipe"):
    s = pipelining.schedule(name, P, M)
    mine = PyStage(R)
    chunk = pipelining.StageChunk(mine, loss=mse if R == P - 1 else None)
    ex = pipelining.PipelineExecutor(s, world, [chunk], (2, D))
    # only the first stage reads the inputs and the last the targets
    tokens = [loom.tensor(xs[2 * k:2 * k + 2]) if R == 0 else None for k in range(M)]
    targets = [loom.tensor(ys[2 * k:2 * k + 2]) if R == P - 1 else None for k in range(M)]
    loss = ex.mean_loss(ex.run(tokens, targets))
    check_close(f"python stages {name}: loss", loss, ref.item())
    for (pname, p), (_, q) in zip(mine.named_parameters(), ref_stages[R].named_parameters()):
        check_close(f"python stages {name}: {pname} gradient", p.grad.numpy(), q.grad.numpy())


# ---------------------------------------------------------------- GradientSum

for average in (False, True):
    p = nn.Parameter(loom.ones(5))
    (p * float(R + 1)).sum().backward()  # gradient R + 1 on rank R
    gs = pipelining.GradientSum([p], world, average)
    gs.start()
    gs.wait()
    want = P * (P + 1) / 2 if not average else (P + 1) / 2
    check_close(f"GradientSum average={average}", p.grad.numpy(), np.full(5, want))

total = loom.tensor([float(failures)])
world.allreduce(total, op="sum")
if total.item() != 0:
    if R == 0:
        print(f"FAILED: {int(total.item())} mismatches over {P} ranks", file=sys.stderr)
    sys.exit(1)
if R == 0:
    print(f"pipelining under mpirun -np {P}: GPT stages (gpipe, 1f1b, interleaved, chimera) and "
          f"Python stages equal the single process")
