#!/usr/bin/env python3
"""Trains a GPT-2-style model from Python: loom-gpt's training loop written with loom's Python API.

One process, or under mpirun with data, tensor and pipeline parallelism (dp x tp x pp, tp varying
fastest) and ZeRO::

    python3 examples/train_gpt.py --steps 200
    mpirun -np 8 python3 examples/train_gpt.py --dp 2 --tp 2 --pp 2 --schedule 1f1b

The flags are loom-gpt's (the subset listed by --help), and so are the per-step losses: the same
data (the built-in addition task, or an llm.c token file / a text file with --data), the same
initialisation (by parameter name), the same loss weighting over ranks and micro-batches (Note
[Loss weighting] in examples/gpt/gpt_parallel.h), the same dropout masks, clipping and
optimizer. tests/python/train_gpt_check.py checks it against build/bin/loom-gpt.

--batch is the global batch: each data-parallel rank takes batch / dp rows (in --grad-accum
micro-batches, or with --pp in --microbatches pipeline micro-batches). Only rank 0 prints.
Ctrl-C stops after the current step and exits with status 130.

Checkpoints are loom-gpt's (loom.distributed.checkpoint, the same format and run state):
--checkpoint-dir DIR saves the whole training state every --save-every steps and at the end;
--resume continues from the latest one in DIR (starting at step 0 when there is none), with the
same data position, learning rate and dropout masks, on any dp / tp / pp / ZeRO layout; a checkpoint
written by loom-gpt resumes here and the other way round::

    mpirun -np 2 python3 examples/train_gpt.py --dp 2 --zero 1 --checkpoint-dir ckpt --save-every 50
    mpirun -np 4 python3 examples/train_gpt.py --tp 2 --dp 2 --checkpoint-dir ckpt --resume
"""

import argparse
import json
import os
import sys
import time

import numpy as np

import loom
import loom.distributed as dist
import loom.nn as nn
from loom.distributed import checkpoint, pipelining

IGNORE_INDEX = -100


# ------------------------------------------------------------------------------------ options


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="Trains a GPT-2-style model (loom-gpt's loop, from Python). With no flags: "
                    "the built-in addition task until --target.")
    a = p.add_argument
    # The model's shape: None until given, so a resumed run knows which flags were given (they
    # must agree with the checkpoint's model); the defaults are filled in below.
    a("--layers", type=int, default=None, help="transformer blocks (default 2)")
    a("--heads", type=int, default=None, help="attention heads, must divide --dim (default 4)")
    a("--dim", type=int, default=None, help="model width, channels (default 128)")
    a("--seq", type=int, default=0, help="sequence length; 0: one addition example (3*digits+4)")
    a("--vocab", type=int, default=None, help="vocabulary size; 0 (default): from the data")
    a("--dropout", type=float, default=0.0, help="dropout probability")
    a("--data", default="", help="llm.c token file (.bin) or text file; empty: the addition task")
    a("--digits", type=int, default=3, help="digits per operand of the addition task")
    a("--batch", type=int, default=64, help="sequences per optimizer step (the global batch)")
    a("--steps", type=int, default=3000, help="optimizer steps")
    a("--lr", type=float, default=3e-3, help="peak learning rate")
    a("--optimizer", default="adamw", choices=["sgd", "adamw"])
    a("--weight-decay", type=float, default=0.0)
    a("--momentum", type=float, default=0.0, help="SGD momentum")
    a("--grad-clip", type=float, default=1.0, help="global gradient-norm clip (0 = off)")
    a("--warmup-steps", type=int, default=None,
      help="linear warmup steps; unless given, min(100, steps / 10)")
    a("--lr-schedule", default="cosine", choices=["cosine", "constant"])
    a("--min-lr-ratio", type=float, default=0.1)
    a("--seed", type=int, default=1337, help="initialisation, dropout and the task's examples")
    a("--dp", type=int, default=0, help="data-parallel ranks (0: every rank launched / (tp*pp))")
    a("--tp", type=int, default=1, help="tensor-parallel ranks")
    a("--sequence-parallel", action="store_true", help="Megatron sequence parallelism (with --tp)")
    a("--pp", type=int, default=1, help="pipeline ranks")
    a("--schedule", default="1f1b", help="pipeline schedule: gpipe, 1f1b, interleaved, chimera")
    a("--microbatches", type=int, default=0, help="pipeline micro-batches (0: --pp)")
    a("--virtual-stages", type=int, default=1, help="--schedule interleaved: chunks per rank")
    a("--zero", type=int, default=0, choices=[0, 1, 2, 3], help="ZeRO stage over dp (0: DDP)")
    a("--grad-accum", type=int, default=1, help="micro-batches per step (without --pp)")
    a("--bucket-mb", type=float, default=25.0, help="gradient bucket size in MiB")
    a("--no-overlap", action="store_true", help="reduce gradients after backward, not during it")
    a("--eval-every", type=int, default=100, help="addition task: held-out exact match every N")
    a("--eval-examples", type=int, default=1000)
    a("--target", type=float, default=0.95, help="addition task: exact match to stop at")
    a("--metrics-file", default="",
      help="one JSON object per step (loom-gpt's format); on resume, the rows after the "
           "checkpoint's step are dropped and the run appends")
    a("--checkpoint-dir", default="",
      help="save the whole training state (weights, optimizer, data position) here: DIR/step-N/, "
           "every --save-every steps and at the end; any layout can resume it")
    a("--save-every", type=int, default=None,
      help="with --checkpoint-dir: save every N steps (0: only at the end)")
    a("--keep-last", type=int, default=None,
      help="with --checkpoint-dir: keep the newest K checkpoints (0: keep all)")
    a("--resume", action="store_true",
      help="continue from the latest committed checkpoint in --checkpoint-dir (saved on any "
           "layout); start from step 0 when there is none yet")
    a("--resume-from", default="",
      help="continue from this checkpoint (a DIR/step-N directory, saved on any layout)")
    o = p.parse_args(argv)
    o.given = {flag for flag in ("layers", "heads", "dim", "vocab", "save_every", "keep_last")
               if getattr(o, flag) is not None}
    for flag, default in (("layers", 2), ("heads", 4), ("dim", 128), ("vocab", 0),
                          ("save_every", 0), ("keep_last", 0)):
        if getattr(o, flag) is None:
            setattr(o, flag, default)
    if o.seq == 0:
        o.seq = 3 * o.digits + 4 if not o.data else 64
    if o.warmup_steps is None:  # the default must not exceed a short run (loom-gpt's rule)
        o.warmup_steps = min(100, o.steps // 10)
    if o.microbatches == 0:
        o.microbatches = o.pp
    for flag in ("layers", "heads", "dim", "batch", "grad_accum", "tp", "pp", "eval_every"):
        if getattr(o, flag) <= 0:
            p.error(f"--{flag.replace('_', '-')} must be positive, got {getattr(o, flag)}")
    if o.dim % o.heads:
        p.error(f"--heads {o.heads} must divide --dim {o.dim}")
    if o.pp > 1 and (o.zero > 1 or o.grad_accum > 1):
        p.error("--pp combines with --dp, --tp and --zero 1 only (not --zero 2/3 or --grad-accum)")
    for flag in ("save_every", "keep_last"):
        if getattr(o, flag) < 0:
            p.error(f"--{flag.replace('_', '-')} must be >= 0, got {getattr(o, flag)}")
    for flag in ("save_every", "keep_last", "resume"):
        if (flag in o.given or (flag == "resume" and o.resume)) and not o.checkpoint_dir:
            p.error(f"--{flag.replace('_', '-')} needs --checkpoint-dir")
    if o.resume and o.resume_from:
        p.error("give --resume (the latest in --checkpoint-dir) or --resume-from PATH, not both")
    return o


# ------------------------------------------------------------------------------------ data


def load_data(o):
    """(description, tokens, vocab, task or None): what loom-gpt's load_gpt_data reads."""
    if not o.data:
        task = loom.data.AdditionTask(digits=o.digits, seed=o.seed)
        # Enough examples that training never wraps, as loom-gpt takes.
        needed = (max(o.steps, 1) * o.batch * o.seq) // task.example_len + 2
        tokens = task.train_stream(max(needed, 1000))
        return (f"built-in task: {o.digits}-digit addition, reversed sum", tokens,
                loom.data.AdditionTask.VOCAB, task)
    if o.data.endswith(".bin"):
        tokens = loom.data.read_token_file(o.data)
        return f"llm.c token file {o.data}", tokens, 50257, None
    tokens = loom.data.read_text_file(o.data)
    return f"byte-level text {o.data}", tokens, 256, None


def padded_vocab_for(vocab):
    multiple = 128 if vocab > 1024 else 16
    return (vocab + multiple - 1) // multiple * multiple


def counted_targets(targets):
    """Targets that count in the loss (Note [Loss weighting])."""
    return int(np.count_nonzero(np.asarray(targets) != IGNORE_INDEX))


def rows(t, first, count):
    return t.narrow(0, first, count).contiguous()


def make_optimizer(o, params):
    if o.optimizer == "sgd":
        return loom.optim.SGD(params, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)
    return loom.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay)


def optimizer_kwargs(o):
    if o.optimizer == "sgd":
        return loom.optim.SGD, dict(lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)
    return loom.optim.AdamW, dict(lr=o.lr, weight_decay=o.weight_decay)


# ------------------------------------------------------------------------------------ checkpoints
# loom-gpt's run state (examples/gpt/gpt_checkpoint.cpp), key for key, so either program resumes
# the other's checkpoints: the model, the layout that saved it, the data position and what decides
# the data, the schedule and the seed.


def data_source(o):
    return o.data or "addition task"


def run_state(config, o, world_size, batch_index, lr_schedule):
    return {
        "model": {"layers": config.layers, "heads": config.heads, "channels": config.channels,
                  "vocab": config.vocab, "padded_vocab": config.padded_vocab,
                  "max_seq_len": config.max_seq_len},
        "layout": {"world_size": world_size, "dp": o.dp, "tp": o.tp, "pp": o.pp, "zero": o.zero,
                   "dtype": "f32", "sequence_parallel": o.sequence_parallel,
                   "grad_accum": o.grad_accum},
        "data": {"batch_index": batch_index, "source": data_source(o), "batch": o.batch,
                 "seq": o.seq, "digits": o.digits},
        "training": {"seed": o.seed, "optimizer": o.optimizer, "lr_schedule": lr_schedule,
                     "steps": o.steps},
    }


def find_resume_point(o):
    """(step directory, manifest) of --resume-from, or of the latest checkpoint in
    --checkpoint-dir with --resume; None for a fresh start."""
    path = o.resume_from or (checkpoint.latest(o.checkpoint_dir) if o.resume else None)
    if not path:
        return None
    return path, checkpoint.read_manifest(path)


def _section(point, key):
    path, manifest = point
    s = manifest["state"].get(key)
    if not isinstance(s, dict):
        raise ValueError(f'checkpoint {path} has no "{key}" in its state: it was not saved by '
                         "loom-gpt or train_gpt.py")
    return s


def _integer(point, section, key):
    v = section.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f'checkpoint {point[0]}: state field "{key}" is missing or not an '
                         "integer")
    return v


def checkpoint_config(point, o):
    """The checkpoint's model; an explicit --layers, --heads, --dim or --vocab must agree."""
    m = _section(point, "model")
    saved = {k: _integer(point, m, k) for k in ("layers", "heads", "channels", "vocab",
                                                 "padded_vocab", "max_seq_len")}
    for flag, key in (("layers", "layers"), ("heads", "heads"), ("dim", "channels"),
                      ("vocab", "vocab")):
        if flag in o.given and getattr(o, flag) != saved[key]:
            raise ValueError(f"--{flag} {getattr(o, flag)} conflicts with the checkpoint "
                             f"{point[0]}, whose model has {saved[key]}")
    if o.seq > saved["max_seq_len"]:
        raise ValueError(f"--seq {o.seq} exceeds the checkpoint's maximum sequence length "
                         f"{saved['max_seq_len']}")
    return nn.GPTConfig(**saved)


def resume_batch_index(point, o):
    """Checks that the flags read the same data as the saved run; the batch index to go on
    from."""
    path = point[0]
    d = _section(point, "data")
    if d.get("source") != data_source(o):
        raise ValueError(f"the checkpoint {path} was trained on "
                         f"{json.dumps(d['source']) if 'source' in d else 'unknown data'} but "
                         f"--data gives '{data_source(o)}'; a resumed run reads the same data")
    agree = [("batch", o.batch), ("seq", o.seq)] + ([("digits", o.digits)] if not o.data else [])
    for flag, given in agree:
        saved = _integer(point, d, flag)
        if given != saved:
            raise ValueError(f"--{flag} {given} differs from the checkpoint {path}'s {saved}: a "
                             "resumed run needs the same global batch and sequence length to "
                             "continue at the same sample (the layout may change)")
    t = _section(point, "training")
    if t.get("seed") != o.seed:
        raise ValueError(f"--seed {o.seed} differs from the checkpoint {path}'s "
                         f"{json.dumps(t.get('seed'))} (the seed keys the data's examples and "
                         "the dropout masks)")
    if t.get("optimizer") != o.optimizer:
        raise ValueError(f"--optimizer {o.optimizer} differs from the checkpoint {path}'s "
                         f"{json.dumps(t.get('optimizer'))}")
    index = _integer(point, d, "batch_index")
    if index < 0:
        raise ValueError(f"checkpoint {path}: negative batch index {index}")
    return index


def open_metrics(path, first_step):
    """The metrics file: a resumed run keeps the rows up to its first step and appends."""
    kept = []
    if first_step > 0 and os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                step = row.get("step") if isinstance(row, dict) else None
                if isinstance(step, int) and not isinstance(step, bool) and step <= first_step:
                    kept.append(line if line.endswith("\n") else line + "\n")
    f = open(path, "w")
    f.writelines(kept)
    return f


def directory_bytes(path):
    return sum(os.path.getsize(os.path.join(path, name)) for name in os.listdir(path))


# ------------------------------------------------------------------------------------ trainers


class DataParallelStep:
    """One optimizer step of the global batch under dp (and tp): loom-gpt's DataParallelStep."""

    def __init__(self, o, config, mesh):
        self.o = o
        self.dp = mesh.dp_group
        self.dp_rank = mesh.coords.dp
        self.tp = mesh.tp_group if (o.tp > 1 or o.sequence_parallel) else None
        if self.tp is not None:
            self.model = nn.TensorParallelGPT(config, self.tp, dropout=o.dropout,
                                              sequence_parallel=o.sequence_parallel)
        else:
            self.model = nn.GPT(config, dropout=o.dropout)
        self.model.init_parameters(seed=o.seed)
        self.model.train()
        self.ddp = self.zero = None
        if o.zero > 0:
            cls, kwargs = optimizer_kwargs(o)
            self.zero = dist.ZeroRedundancyOptimizer(
                self.model, self.dp, optimizer_class=cls, stage=o.zero, bucket_mb=o.bucket_mb,
                grad_accum=o.grad_accum, overlap=not o.no_overlap, tp=self.tp, **kwargs)
            self.opt = self.zero
        else:
            if self.dp.size > 1:
                self.ddp = dist.DistributedDataParallel(
                    self.model, self.dp, bucket_mb=o.bucket_mb, grad_accum=o.grad_accum,
                    overlap=not o.no_overlap)
            self.opt = make_optimizer(o, self.model.parameters())

    def describe(self):
        s = f"dp {self.dp.size}"
        if self.tp is not None:
            s += f" x tp {self.tp.size}" + (" (sequence parallel)" if self.o.sequence_parallel
                                             else "")
        if self.zero is not None:
            s += f", ZeRO-{self.o.zero}"
        if self.o.grad_accum > 1:
            s += f", grad-accum {self.o.grad_accum}"
        return s

    def run(self, inputs, targets, step, lr):
        o, n, k_count = self.o, self.dp.size, self.o.grad_accum
        count = o.batch // n // k_count
        counted = counted_targets(targets)
        if counted == 0:
            raise ValueError(f"step {step + 1}'s batch has no targets to predict")
        nn.set_dropout_step(step)
        loss_sum = 0.0  # this rank's share of the global mean loss
        for k in range(k_count):
            first = (self.dp_rank * k_count + k) * count
            x, y = rows(inputs, first, count), rows(targets, first, count)
            mine = counted_targets(y)
            nn.set_dropout_batch_part(self.dp_rank * k_count + k, n * k_count)
            loss = self.model.loss(x, y)
            nn.set_dropout_batch_part(0, 1)
            loss_sum += loss.item() * mine / counted
            weighted = loss * (mine * n / counted)  # Note [Loss weighting]
            if self.zero is not None:
                self.zero.backward(weighted)
            elif self.ddp is not None:
                self.ddp.backward(weighted)
            else:
                weighted.backward()
            # The loss holds this micro-batch's autograd graph and its saved activations: drop
            # it now, not when the next forward rebinds the name (that would keep two steps'
            # activations alive at once; C++ frees them at the end of the loop body).
            del loss, weighted
        if self.ddp is not None:
            self.ddp.finish()
        elif self.zero is not None:
            self.zero.finish_gradients()
        norm = -1.0
        if o.grad_clip > 0:  # the single-process norm in every layout: DDP, ZeRO, tp
            norm = nn.utils.clip_grad_norm_(self.model.parameters(), o.grad_clip).item()
        self.opt.lr = lr
        self.opt.step()
        self.opt.zero_grad()
        total = loom.full([1], loss_sum)
        self.dp.allreduce(total)  # the ranks of a tp group hold the same loss: sum over dp
        return total.item(), norm

    def logits(self, idx):
        if self.zero is not None:
            self.zero.gather_parameters()  # ZeRO-3 shards the parameters between steps
        return self.model.logits(idx) if self.tp is not None else self.model(idx)

    def save_checkpoint(self, path, step, state, keep_last, group):
        """This rank's model and optimizer state (ZeRO: its shards) as step `step`."""
        return checkpoint.save(path, model=self.model, optimizer=self.opt, step=step,
                               group=group, keep_last=keep_last, state=state)

    def load_checkpoint(self, path, group):
        """A checkpoint saved by any dp / tp / ZeRO layout, resharded on load."""
        return checkpoint.load(path, model=self.model, optimizer=self.opt, group=group)


class PipelineStep:
    """One optimizer step under pipeline parallelism (with dp and tp): loom-gpt's PipelineStep."""

    def __init__(self, o, config, mesh):
        self.o, self.config = o, config
        self.pp, self.dp = mesh.pp_group, mesh.dp_group
        self.dp_rank = mesh.coords.dp
        self.tp = mesh.tp_group if (o.tp > 1 or o.sequence_parallel) else None
        self.schedule = pipelining.schedule(o.schedule, o.pp, o.microbatches, o.virtual_stages)
        if o.layers < self.schedule.stages:
            raise ValueError(f"--layers {o.layers} cannot be split into the "
                             f"{self.schedule.stages} stages of schedule '{o.schedule}'")
        per_dp = o.batch // o.dp
        if per_dp % self.schedule.microbatches:
            raise ValueError(f"--batch {o.batch} over --dp {o.dp} leaves {per_dp} rows per "
                             f"data-parallel rank, which do not divide into "
                             f"{self.schedule.microbatches} micro-batches")
        rank = self.pp.rank
        pairs = pipelining.replica_pairs(self.schedule, self.pp)
        self.places = self.schedule.chunks[rank]
        self.stages, chunks, params = [], [], []
        for place in self.places:
            stage = pipelining.GPTStage(config, place.stage, self.schedule.stages,
                                        dropout=o.dropout, tp=self.tp,
                                        sequence_parallel=o.sequence_parallel,
                                        pipeline=place.pipeline)
            stage.init_parameters(seed=o.seed)
            params += list(stage.parameters())
            chunks.append(pipelining.stage_chunk(stage, pairs[place.stage],
                                                 self.dp if o.zero == 0 else None))
            self.stages.append(stage)
        self.embedding = pipelining.embedding_group(self.schedule, self.pp)  # wte's copies
        self.executor = pipelining.PipelineExecutor(
            self.schedule, self.pp, chunks,
            self.stages[0].activation_shape(per_dp // self.schedule.microbatches, o.seq))
        self.zero = None
        # The stages under one module: what ZeRO-1 wraps and checkpoints save (each under its
        # single-process names, so any layout loads them).
        self.holder = pipelining.StageSet(self.stages)
        if o.zero == 0:
            self.opt = make_optimizer(o, params)
        else:
            # ZeRO-1 over dp: gradients from the executor's backwards (external_backward); the
            # norm counts one copy of each parameter.
            holder = self.holder
            counted = pipelining.counted_in_norm(self.stages, self.places)
            cls, kwargs = optimizer_kwargs(o)
            self.zero = dist.ZeroRedundancyOptimizer(
                holder, self.dp, optimizer_class=cls, stage=1, bucket_mb=o.bucket_mb,
                tp=self.tp, external_backward=True, pp=self.pp,
                counted_in_norm=counted, **kwargs)
            self.opt = self.zero

    def save_checkpoint(self, path, step, state, keep_last, group):
        """Every chunk's parameters and optimizer state (ZeRO-1: its shards); the tied wte's
        copies and Chimera's replicas are stored once."""
        return checkpoint.save(path, model=self.holder, optimizer=self.opt, step=step,
                               group=group, keep_last=keep_last, state=state)

    def load_checkpoint(self, path, group):
        """A checkpoint saved by any layout, pipelined or not, resharded on load."""
        return checkpoint.load(path, model=self.holder, optimizer=self.opt, group=group)

    def describe(self):
        s = f"dp {self.o.dp}" + (f" x tp {self.o.tp}" if self.tp is not None else "")
        s += " (ZeRO-1)" if self.zero is not None else ""
        return (s + f" x pp {self.schedule.ranks}, schedule {self.schedule.name}, "
                f"{self.schedule.microbatches} micro-batches")

    def run(self, inputs, targets, step, lr):
        o, m = self.o, self.schedule.microbatches
        per_dp = o.batch // o.dp
        count = per_dp // m
        counted = counted_targets(targets)
        if counted == 0:
            raise ValueError(f"step {step + 1}'s batch has no targets to predict")
        nn.set_dropout_step(step)
        tokens, tgts, weights = [], [], []
        for k in range(m):
            first = self.dp_rank * per_dp + k * count
            tokens.append(rows(inputs, first, count))
            tgts.append(rows(targets, first, count))
            weights.append(counted_targets(tgts[-1]) * o.dp / counted)  # Note [Loss weighting]
        dp_rank = self.dp_rank
        self.executor.set_before_forward(
            lambda k: nn.set_dropout_batch_part(dp_rank * m + k, o.dp * m))
        if self.zero is not None:
            self.zero.accumulate_in_buckets()  # the step's gradients held once
        local = self.executor.run(tokens, tgts, weights)
        nn.set_dropout_batch_part(0, 1)
        pipelining.sync_tied_embedding(self.stages, self.embedding)
        if self.dp.size > 1 and self.zero is None:
            for stage in self.stages:
                if stage.wte_weight is not None:
                    self.dp.allreduce(stage.wte_weight.grad, op="avg")
        norm = -1.0
        if o.grad_clip > 0:  # every stage's part, the tied wte and Chimera's replicas once
            norm = nn.utils.clip_grad_norm_(self.holder.parameters(), o.grad_clip,
                                            pp_group=self.pp).item()
        self.opt.lr = lr
        self.opt.step()
        self.opt.zero_grad()
        total = loom.full([1], self.executor.mean_loss(local) / o.dp)
        self.dp.allreduce(total)
        return total.item(), norm


# ------------------------------------------------------------------------------------ main


def main(argv=None):
    o = parse_args(argv)
    world = dist.world()
    say = print if world.rank == 0 else (lambda *a, **k: None)
    model_ranks = o.tp * o.pp
    if o.dp == 0:
        if world.size % model_ranks:
            raise ValueError(f"--tp {o.tp} x --pp {o.pp} does not divide the {world.size} "
                             f"rank(s) running")
        o.dp = world.size // model_ranks
    if o.dp * model_ranks != world.size:
        raise ValueError(f"--dp {o.dp} x --tp {o.tp} x --pp {o.pp} needs "
                         f"{o.dp * model_ranks} ranks but {world.size} are running; launch with "
                         f"mpirun -np {o.dp * model_ranks}")
    if o.batch % (o.dp * o.grad_accum):
        raise ValueError(f"--batch {o.batch} must divide evenly over --dp {o.dp} x "
                         f"--grad-accum {o.grad_accum}")
    mesh = dist.DeviceMesh(pp=o.pp, dp=o.dp, tp=o.tp)

    resume = find_resume_point(o)
    if o.resume and resume is None:
        say(f"checkpoint: none in {o.checkpoint_dir} yet; starting at step 0")
    description, tokens, data_vocab, task = load_data(o)
    if resume:  # the checkpoint's model (explicit flags must agree)
        config = checkpoint_config(resume, o)
        o.layers, o.heads, o.dim = config.layers, config.heads, config.channels
    else:
        vocab = o.vocab or data_vocab
        padded = loom.data.AdditionTask.PADDED_VOCAB if task else padded_vocab_for(vocab)
        config = nn.GPTConfig(max_seq_len=o.seq, vocab=vocab, padded_vocab=max(padded, vocab),
                              layers=o.layers, heads=o.heads, channels=o.dim)
    loom.data.check_token_range(tokens, config.vocab, o.data or "addition task")
    loader = loom.data.BatchLoader(tokens, o.batch, o.seq, o.data)
    nn.set_dropout_seed(o.seed)
    trainer = PipelineStep(o, config, mesh) if o.pp > 1 else DataParallelStep(o, config, mesh)
    schedule = (loom.optim.LrSchedule.cosine(o.lr, o.lr * o.min_lr_ratio, o.warmup_steps, o.steps)
                if o.lr_schedule == "cosine" else
                loom.optim.LrSchedule.constant(o.lr, o.warmup_steps))
    say(f"train_gpt.py: {description}")
    say(f"model: {config}, {config.num_parameters()} parameters")
    say(f"training: {o.steps} steps of {o.batch} x {o.seq} tokens, {o.optimizer}, "
        f"lr {schedule}, grad clip {o.grad_clip}; parallel: {trainer.describe()} over "
        f"{world.size} rank(s)")
    heldout = task.heldout_set(o.eval_examples) if task and o.pp == 1 else None

    first_step = 0
    if resume:
        loader.seek(resume_batch_index(resume, o))
        state = trainer.load_checkpoint(resume[0], world)
        first_step = state["step"]
        layout = json.dumps(state.get("layout", {}), sort_keys=True, separators=(",", ":"))
        say(f"checkpoint: resumed from {resume[0]} at step {first_step} (saved by {layout})")
    metrics = (open_metrics(o.metrics_file, first_step) if o.metrics_file and world.rank == 0
               else None)

    def save_checkpoint(steps_done):
        """Saves every rank's state as step `steps_done` (collective)."""
        t0 = time.perf_counter()
        state = run_state(config, o, world.size, loader.index, str(schedule))
        path = trainer.save_checkpoint(o.checkpoint_dir, steps_done, state, o.keep_last, world)
        if world.rank != 0:
            return
        seconds, size = time.perf_counter() - t0, directory_bytes(path)
        say(f"checkpoint: saved step {steps_done} to {path} ({size / 1e6:.1f} MB in "
            f"{seconds:.2f} s)", flush=True)
        if metrics:
            metrics.write(json.dumps({"step": steps_done, "event": "checkpoint",
                                      "bytes": float(size), "save_s": seconds}) + "\n")
            metrics.flush()

    # The run ends with a checkpoint of its last step, unless the directory already holds one
    # (a resumed run that trained no further).
    steps_done = first_step
    last_saved = (first_step if o.checkpoint_dir and
                  checkpoint.has_checkpoint(o.checkpoint_dir, first_step) else -1)
    start = time.perf_counter()
    step = first_step
    try:
        for step in range(first_step, o.steps):
            t0 = time.perf_counter()
            lr = schedule.lr(step)
            batch = loader.next_batch()
            targets = batch.targets
            if task:
                task.mask_non_answer_targets(targets)
            loss, norm = trainer.run(batch.inputs, targets, step, lr)
            steps_done = step + 1
            ms = (time.perf_counter() - t0) * 1e3
            say(f"step {step + 1}/{o.steps} | loss {loss:.6f} | lr {lr:.3e} | "
                f"{o.batch * o.seq / (ms / 1e3):.0f} tok/s | {ms:.1f} ms", flush=True)
            if metrics:
                record = {"step": step + 1, "loss": loss, "lr": lr, "step_ms": ms}
                if norm >= 0:
                    record["grad_norm"] = norm
                metrics.write(json.dumps(record) + "\n")
                metrics.flush()
            if o.checkpoint_dir and o.save_every > 0 and steps_done % o.save_every == 0:
                save_checkpoint(steps_done)
                last_saved = steps_done
            if heldout is not None and ((step + 1) % o.eval_every == 0 or step + 1 == o.steps):
                trainer.model.eval()
                with loom.no_grad():
                    em = loom.data.evaluate_exact_match(heldout, trainer.logits, o.batch)
                trainer.model.train()
                say(f"eval at step {step + 1} | exact_match {em.accuracy:.6g}", flush=True)
                if em.accuracy >= o.target:
                    say(f"target reached: held-out exact match {em.accuracy:.3f} >= {o.target}")
                    break
        if o.checkpoint_dir and last_saved != steps_done:
            save_checkpoint(steps_done)
    except KeyboardInterrupt:
        say(f"\ninterrupted at step {step + 1} of {o.steps} "
            f"({time.perf_counter() - start:.1f} s); exiting", flush=True)
        return 130
    finally:
        if metrics:
            metrics.close()
    say(f"trained {steps_done} steps in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ValueError as e:  # loom's argument errors arrive as ValueError with loom's message
        print(f"train_gpt.py: error: {e}", file=sys.stderr)
        sys.exit(1)
