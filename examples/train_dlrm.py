"""train_dlrm.py: loom-dlrm (examples/dlrm/main.cpp) in Python, the model defined with loom.nn.

Trains DLRM on loom's synthetic click data (loom.data.ClickDataset, core/io/click_data.h), whose
Bayes-optimal accuracy and AUC are known, and reports how close the model gets to them. With the
same flags it prints the same per-step losses as build/bin/loom-dlrm: the same data, parameter
names (so ``init_parameters(seed)`` gives the same initial values), ops and optimizer.

    PYTHONPATH=build/python python3 examples/train_dlrm.py --steps 200
    mpirun -np 2 python3 examples/train_dlrm.py --sharding auto    # tables sharded, MLPs DDP

One process: the tables are one loom.nn.EmbeddingBagCollection. Under mpirun the tables are a
loom.distributed.ShardedEmbeddingBagCollection placed by --sharding (model parallel), the dense
part (bottom MLP, dot interaction, top MLP) is wrapped in loom.distributed.DistributedDataParallel
(data parallel), and each rank trains on its 1/W of every global batch. Only rank 0 prints.
"""

import argparse
import json
import math
import sys
import time

import loom
import loom.data
import loom.distributed as dist
import loom.nn as nn
import loom.nn.functional as F
from loom.distributed.embedding import ShardedEmbeddingBagCollection, placements_for


class Mlp(nn.Module):
    """Linear layers fc0, fc1, ... with ReLU between them (and after the last when relu_last);
    He-style init, std sqrt(2 / fan_in) (examples/dlrm/dlrm_model.cpp)."""

    def __init__(self, widths, relu_last):
        super().__init__()
        self.relu_last = relu_last
        self.num_layers = len(widths) - 1
        for i in range(self.num_layers):
            setattr(self, f"fc{i}", nn.Linear(widths[i], widths[i + 1], True,
                                              init_std=math.sqrt(2.0 / widths[i])))

    def forward(self, x):
        for i in range(self.num_layers):
            x = getattr(self, f"fc{i}")(x)
            if i + 1 < self.num_layers or self.relu_last:
                x = F.relu(x)
        return x


class DlrmDense(nn.Module):
    """DLRM's dense part: dense [B, num_dense] -> bottom MLP -> x [B, D]; pooled [B, T*D];
    z = dot_interaction([x; pooled] as [B, T+1, D]); top MLP([x, z]) -> logits [B]. The
    data-parallel part; parameter names bottom.fc0.weight, ..., top.fc2.bias (loom-dlrm's)."""

    def __init__(self, num_dense, num_tables, dim, bottom=(64,), top=(64, 32)):
        super().__init__()
        self.num_tables, self.dim = num_tables, dim
        features = num_tables + 1
        self.bottom = Mlp([num_dense, *bottom, dim], relu_last=True)
        self.top = Mlp([dim + features * (features - 1) // 2, *top, 1], relu_last=False)

    def forward(self, dense, pooled):
        b, t, d = dense.shape[0], self.num_tables, self.dim
        x = self.bottom(dense)                                                 # [B, D]
        features = loom.cat([x.reshape(b, 1, d), pooled.reshape(b, t, d)], 1)  # [B, T+1, D]
        z = F.dot_interaction(features)                                        # [B, T(T+1)/2]
        return self.top(loom.cat([x, z], 1)).reshape(b)


class DLRM(nn.Module):
    """The tables (``tables``: a loom.nn.EmbeddingBagCollection, or a sharded one) and the dense
    part (``dense``). As in loom-dlrm the two are initialised as separate roots, so their
    parameter names, hence their initial values, are loom-dlrm's ("t0.weight",
    "bottom.fc0.weight")."""

    def __init__(self, dense, tables):
        super().__init__()
        self.dense = dense
        self.tables = tables

    def init_parameters(self, seed, _prefix=""):
        self.dense.init_parameters(seed)
        self.tables.init_parameters(seed)
        return self

    def forward(self, batch):
        return self.dense(batch.dense, self.tables(batch.indices, batch.offsets))


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="Trains DLRM on synthetic click data with a known accuracy/AUC ceiling "
                    "(loom-dlrm in Python).")
    p.add_argument("--steps", type=int, default=400, help="training steps")
    p.add_argument("--batch", type=int, default=256,
                   help="examples per step (global: split over the ranks)")
    p.add_argument("--dim", type=int, default=16, help="embedding dim (a multiple of 4)")
    p.add_argument("--max-bag", type=int, default=3, help="bag lengths are uniform in [1, max-bag]")
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate (MLPs and tables)")
    p.add_argument("--seed", type=int, default=1234, help="data and initialisation seed")
    p.add_argument("--eval-every", type=int, default=100,
                   help="evaluate every N steps (0: only at the end)")
    p.add_argument("--eval-batches", type=int, default=16, help="held-out batches per evaluation")
    p.add_argument("--sharding", default="auto", choices=["table", "row", "column", "data", "auto"],
                   help="under mpirun, how the tables are placed: table (whole tables), row, "
                        "column, data (replicated), auto (small tables replicated, the others "
                        "whole)")
    p.add_argument("--metrics-file", default="",
                   help="append one JSON object per step and evaluation")
    return p.parse_args(argv)


class Progress:
    """loom-dlrm's progress lines (examples/common/progress.cpp) and metrics file, rank 0 only."""

    def __init__(self, total, rank, metrics_file):
        self.total, self.rank = total, rank
        self.metrics = open(metrics_file, "a") if (metrics_file and rank == 0) else None

    def _write(self, record):
        if self.metrics:
            self.metrics.write(json.dumps(record) + "\n")
            self.metrics.flush()

    def step(self, step, loss, lr, step_ms, elapsed_s, rate):
        if self.rank != 0:
            return
        eta = elapsed_s / step * (self.total - step) if step > 0 else 0.0
        print(f"step {step}/{self.total} | loss {loss:.6f} | lr {lr:.3e} | {rate:.0f} ex/s | "
              f"{step_ms:.1f} ms | elapsed {elapsed_s:.1f}s | eta {eta:.1f}s", flush=True)
        self._write({"step": step, "loss": loss, "lr": lr, "tokens_per_s": rate,
                     "elapsed_s": elapsed_s, "step_ms": step_ms})

    def event(self, step, kind, values):
        if self.rank != 0:
            return
        print(f"{kind} at step {step}" + "".join(f" | {k} {v:.6g}" for k, v in sorted(
            values.items())), flush=True)
        self._write({"step": step, "event": kind, **values})


def evaluate(model, data, batches, world):
    """Every rank scores its share of each held-out batch; the logits are gathered so every rank
    computes the figures of the whole batches (loom-dlrm's evaluate)."""
    b_all = data.config.batch_size
    b_local = b_all // world.size
    scores, labels = [], []
    loss, correct = 0.0, 0
    with loom.no_grad():
        for i in range(batches):
            b = data.examples("eval", i * b_all + world.rank * b_local, b_local)
            local = model(b).contiguous()
            logits = loom.empty(b_all)
            world.allgather(local, logits)
            y = data.batch("eval", i).labels
            loss += F.binary_cross_entropy_with_logits(logits, y).item()
            lv, yv = logits.tolist(), y.tolist()
            correct += sum((l > 0) == (t > 0.5) for l, t in zip(lv, yv))
            scores += lv
            labels += yv
    return {"val_loss": loss / batches, "accuracy": correct / len(scores),
            "auc": loom.data.auc(scores, labels)}


def main(argv=None):
    args = parse_args(argv)
    world = dist.world()
    rank, ranks = world.rank, world.size
    if args.batch <= 0 or args.batch % ranks != 0:
        raise ValueError(f"train_dlrm: --batch {args.batch} must be a positive multiple of the "
                         f"{ranks} rank(s) running")
    b_local = args.batch // ranks
    say = print if rank == 0 else (lambda *a, **k: None)

    data = loom.data.ClickDataset(loom.data.ClickDataConfig(
        seed=args.seed, batch_size=args.batch, max_bag_size=args.max_bag))
    ceiling = data.ceiling()
    config = data.config
    rows = config.table_rows
    say(f"data: {data.num_tables} tables ({min(rows)}..{max(rows)} rows), {config.num_dense} "
        f"dense features; ceiling (Bayes): accuracy {ceiling.accuracy:.4f}, AUC "
        f"{ceiling.auc:.4f}, click rate {ceiling.positive_rate:.3f}")

    tables = [(f"t{t}", r, args.dim) for t, r in enumerate(rows)]
    dense = DlrmDense(config.num_dense, data.num_tables, args.dim)
    ddp = None
    if ranks == 1:
        ebc = nn.EmbeddingBagCollection(tables)
    else:
        ebc = ShardedEmbeddingBagCollection(tables, placements_for(args.sharding, rows), world)
    model = DLRM(dense, ebc).init_parameters(args.seed)
    if ranks > 1:
        if not hasattr(dist, "DistributedDataParallel"):
            raise RuntimeError("this loom has no loom.distributed."
                               "DistributedDataParallel, needed under mpirun")
        ddp = dist.DistributedDataParallel(dense, world)
        say(f"parallel: {ranks} ranks, tables sharded (--sharding {args.sharding}), MLPs "
            f"data-parallel")
    opt = loom.optim.AdamW(list(ebc.parameters()) + list(dense.parameters()), lr=args.lr,
                           weight_decay=0.0)

    progress = Progress(args.steps, rank, args.metrics_file)

    def report(step):
        e = evaluate(model, data, args.eval_batches, world)
        progress.event(step, "eval", {**e, "ceiling_accuracy": ceiling.accuracy,
                                      "ceiling_auc": ceiling.auc})
        return e

    start = time.perf_counter()
    for step in range(args.steps):
        t0 = time.perf_counter()
        b = data.examples("train", step * args.batch + rank * b_local, b_local)
        # This rank's mean: DDP averages the MLPs' gradients over the ranks and the sharded
        # tables scale theirs to match.
        loss = F.binary_cross_entropy_with_logits(model(b), b.labels)
        opt.zero_grad()
        if ddp is not None:
            ddp.backward(loss)
            ddp.finish()
            ebc.finish_gradients()
        else:
            loss.backward()
        opt.step()
        mean_loss = loom.full([1], loss.item() / ranks)  # f32, as loom-dlrm's
        world.allreduce(mean_loss)
        t1 = time.perf_counter()
        step_ms = (t1 - t0) * 1e3
        progress.step(step + 1, mean_loss.item(), args.lr, step_ms, t1 - start,
                      args.batch / (step_ms / 1e3))
        if args.eval_every > 0 and (step + 1) % args.eval_every == 0 and step + 1 < args.steps:
            report(step + 1)
    e = report(args.steps)
    say(f"final: accuracy {e['accuracy']:.4f} (ceiling {ceiling.accuracy:.4f}), AUC "
        f"{e['auc']:.4f} (ceiling {ceiling.auc:.4f})")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ValueError, RuntimeError) as e:
        print(f"train_dlrm: {e}", file=sys.stderr)
        sys.exit(1)
