"""loom.distributed's DDP and ZeRO and loom.nn.TensorParallelGPT under mpirun (-np 2 or 4),
against the single-process run every rank also computes itself (same seed, the whole global
batch): the loss of every step and the parameters after 3 AdamW steps must agree within 1e-5
(relative to the tensor's largest element, + 1e-7 absolute). Each rank takes an equal slice of the global batch and its mean loss, so the group
average of the gradients is the gradient of the global mean.

  DDP over the world, grad_accum 1 and 2 (and the averaged gradients of step 0)
  a GPT with dropout 0.1 and no dropout call in the script, in DDP (grad_accum 1, 2) and ZeRO
  stage 2 (grad_accum 2): the masks advance and split by themselves
  ZeRO stages 1, 2, 3 over the world (and stage 2 with grad_accum 2), AdamW; stages 1, 3 SGD
  a GPT written in Python (ModuleList of Python blocks) in DDP (grad_accum 2) and ZeRO 1, 2, 3
  TensorParallelGPT over a DeviceMesh(dp=size/2, tp=2), with and without sequence parallelism,
  gradients clipped by tp_clip_grad_norm_ and loom.nn.utils.clip_grad_norm_ on alternate steps
  (the norm compared too), DDP over dp when dp > 1; and with dp > 1, ZeRO stage 1 over dp with tp
  given (loom.nn.utils.clip_grad_norm_ over dp x tp); with sequence parallelism and
  ``checkpoint=True``, the uncheckpointed run's losses, norms and parameters bit for bit.
  A model written in Python around ColumnParallelLinear / RowParallelLinear and a whole
  LayerNorm: loom.nn.utils.clip_grad_norm_ equals tp_clip_grad_norm_ (the C++ tree's shard flags)
  and the norm of the gathered gradients.

Every rank prints what differed; the failure count is summed over ranks and every rank exits 1
when it is not zero. Exits 77 (skip) without numpy or the module, or when not launched by mpirun.
"""

import sys

try:
    import numpy as np

    import loom
    import loom.distributed as dist
    import loom.nn.functional as F
except ImportError as e:  # the module is not built, or numpy is missing
    print(f"skipped: {e}")
    sys.exit(77)

if not dist.launched_by_mpi():
    print("skipped: not launched by mpirun")
    sys.exit(77)

CONFIG = dict(max_seq_len=8, vocab=60, padded_vocab=64, layers=2, heads=2, channels=32)
B, T, STEPS, SEED = 8, 8, 3, 1337
# Adam's update g / (|g| + eps) is ill-conditioned where |g| is small: a gradient summed in
# another order (over ranks, then within) moves such an element by up to ~lr / 100. lr 1e-4 keeps
# that well inside the tolerance while each step still moves parameters by ~1e-4, 200x it. eps
# 1e-6: the key bias's gradient is zero in exact arithmetic (softmax ignores a shift of every
# score), rounding noise of ~1e-12 that eps 1e-8 would blow up to updates of lr / 100. Adam cannot
# see a gradient's scale, so the DDP runs also compare the averaged gradients of step 0, and ZeRO
# also runs with SGD.
ADAMW = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-6, weight_decay=0.1)
SGD = dict(lr=0.1, momentum=0.9)
CLIP = 0.5
RTOL = 1e-5  # relative to the tensor's largest element
ATOL = 1e-7  # for tensors near zero (the key bias)
worst = [0.0, ""]  # the largest error / tolerance seen, printed by rank 0

comm = dist.init_process_group()
rank, size = comm.rank, comm.size
failures = []


def batch(step):
    rng = np.random.default_rng(100 + step)
    idx = rng.integers(0, CONFIG["vocab"], size=(B, T)).astype(np.int64)
    targets = rng.integers(0, CONFIG["vocab"], size=(B, T)).astype(np.int64)
    return idx, targets


def t64(a):
    return loom.tensor(np.ascontiguousarray(a), dtype=loom.int64)


def arr(t):
    return np.asarray(t.detach() if isinstance(t, loom.Tensor) else t).astype(np.float64)


def gpt():
    return loom.nn.GPT(loom.nn.GPTConfig(**CONFIG), seed=SEED)


class PyBlock(loom.nn.Module):
    """A pre-LayerNorm block written in Python over built-in children, with a Python parameter."""

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
    """A GPT defined in Python (tied output head): a ModuleList of Python blocks, so ZeRO-3
    gathers and releases each block around its Python forward."""

    def __init__(self):
        super().__init__()
        c = CONFIG["channels"]
        self.wte = loom.nn.Embedding(CONFIG["padded_vocab"], c)
        self.wpe = loom.nn.Embedding(CONFIG["max_seq_len"], c)
        self.blocks = loom.nn.ModuleList(
            [PyBlock(c, CONFIG["heads"]) for _ in range(CONFIG["layers"])])
        self.ln_f = loom.nn.LayerNorm(c)

    def forward(self, idx):
        pos = loom.arange(idx.shape[1], dtype=loom.int64)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)

    def loss(self, idx, targets):
        logits = self(idx)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def py_gpt():
    return PyGPT().init_parameters(seed=SEED)


def group_mean(value, group):
    t = loom.tensor([float(value)])
    group.allreduce(t, op="avg")
    return float(arr(t)[0])


def check_close(what, got, want):
    got, want = float(got), float(want)
    if abs(got - want) > RTOL * max(abs(want), 1e-30):
        failures.append(f"{what}: got {got!r}, want {want!r}")


def check_params(what, got, want):
    if sorted(got) != sorted(want):
        failures.append(f"{what}: names differ: {sorted(set(got) ^ set(want))}")
        return
    for name in want:
        g, w = arr(got[name]), arr(want[name])
        if g.shape != w.shape:
            failures.append(f"{what}: {name}: shape {g.shape}, want {w.shape}")
            continue
        diff, scale = float(np.max(np.abs(g - w))), float(np.max(np.abs(w)))
        tol = RTOL * scale + ATOL
        if diff / tol > worst[0]:
            worst[:] = [diff / tol, f"{what}: {name}"]
        if diff > tol:
            failures.append(f"{what}: {name}: max abs difference {diff:.3g} > {tol:.3g} "
                            f"(1e-5 x largest element {scale:.3g}, + {ATOL})")


def reference(clip, sgd=False, make=None):
    """The single-process run on the whole global batch: losses, norms, final parameters, and
    the gradients of step 0."""
    model = (make or gpt)()
    opt = (loom.optim.SGD(model.parameters(), **SGD) if sgd
           else loom.optim.AdamW(model.parameters(), **ADAMW))
    losses, norms = [], []
    for step in range(STEPS):
        idx, targets = batch(step)
        loss = model.loss(t64(idx), t64(targets))
        loss.backward()
        if step == 0:
            grads0 = {n: arr(p.grad).copy() for n, p in model.named_parameters()}
        if clip:
            norms.append(loom.nn.utils.clip_grad_norm_(model.parameters(), CLIP).item())
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, norms, dict(model.named_parameters()), grads0


def slices(rows, part, parts, accum):
    """This part's equal slice of the global batch rows, cut into accum micro-batches."""
    n = rows.shape[0] // parts
    mine = rows[part * n:(part + 1) * n]
    m = n // accum
    return [mine[j * m:(j + 1) * m] for j in range(accum)]


def run_ddp(accum, make=None):
    model = (make or gpt)()
    ddp = dist.DistributedDataParallel(model, grad_accum=accum, bucket_mb=0.02)
    opt = loom.optim.AdamW(model.parameters(), **ADAMW)
    losses = []
    for step in range(STEPS):
        idx, targets = batch(step)
        local = 0.0
        for x, y in zip(slices(idx, rank, size, accum), slices(targets, rank, size, accum)):
            loss = ddp.module.loss(t64(x), t64(y))
            ddp.backward(loss * (1.0 / accum))
            local += loss.item() / accum
        ddp.finish()
        if step == 0:
            grads0 = {n: arr(p.grad).copy() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
        losses.append(group_mean(local, comm))
    return losses, dict(model.named_parameters()), grads0


def run_zero(stage, accum, sgd=False, make=None, shard_group=None):
    model = (make or gpt)()
    if shard_group is not None:
        opt = dist.ZeroRedundancyOptimizer(model, stage=stage, grad_accum=accum, bucket_mb=0.02,
                                           shard_group=shard_group, **ADAMW)
    elif sgd:
        opt = dist.ZeroRedundancyOptimizer(model, optimizer_class=loom.optim.SGD, stage=stage,
                                           grad_accum=accum, bucket_mb=0.02, **SGD)
    else:
        opt = dist.ZeroRedundancyOptimizer(model, stage=stage, grad_accum=accum, bucket_mb=0.02,
                                           **ADAMW)
    if stage == 3 and isinstance(model, PyGPT) and not all(
            b._cpp_module().has_forward_hooks for b in model.blocks):
        failures.append("ZeRO-3 did not hook the Python blocks (its units)")
    losses = []
    for step in range(STEPS):
        idx, targets = batch(step)
        local = 0.0
        for x, y in zip(slices(idx, rank, size, accum), slices(targets, rank, size, accum)):
            loss = model.loss(t64(x), t64(y))
            opt.backward(loss * (1.0 / accum))
            local += loss.item() / accum
        opt.step()
        opt.zero_grad()
        losses.append(group_mean(local, comm))
    opt.gather_parameters()
    return losses, dict(model.named_parameters())


def run_tp(sequence_parallel, zero, checkpoint=False):
    """TensorParallelGPT over tp=2, data parallel over the rest (DDP, or ZeRO stage 1)."""
    mesh = dist.DeviceMesh(tp=2)
    tp, dp = mesh.tp_group, mesh.dp_group
    model = loom.nn.TensorParallelGPT(loom.nn.GPTConfig(**CONFIG), tp, seed=SEED,
                                      sequence_parallel=sequence_parallel, checkpoint=checkpoint)
    if zero:
        opt = dist.ZeroRedundancyOptimizer(model, dp, stage=1, tp=tp, bucket_mb=0.02, **ADAMW)
        ddp = None
    else:
        opt = loom.optim.AdamW(model.parameters(), **ADAMW)
        ddp = dist.DistributedDataParallel(model, dp) if dp.size > 1 else None
    losses, norms = [], []
    for step in range(STEPS):
        idx, targets = batch(step)
        (x,), (y,) = slices(idx, dp.rank, dp.size, 1), slices(targets, dp.rank, dp.size, 1)
        loss = model.loss(t64(x), t64(y))
        if zero:
            opt.backward(loss)
            opt.finish_gradients()
            # loom.nn.utils.clip_grad_norm_ hands ZeRO's module's parameters to the optimizer.
            norms.append(loom.nn.utils.clip_grad_norm_(model.parameters(), CLIP).item())
        else:
            if ddp:
                ddp.backward(loss)
                ddp.finish()
            else:
                loss.backward()
            # Every other step through the tp helper, the others through the one clip_grad_norm_
            # (its shards found through loom.nn._placement): both must give one process's norm.
            norms.append(dist.tp_clip_grad_norm_(model, CLIP, tp) if step % 2 else
                         loom.nn.utils.clip_grad_norm_(model.parameters(), CLIP).item())
        opt.step()
        opt.zero_grad()
        losses.append(group_mean(loss.item(), dp))
    if zero:
        opt.gather_parameters()
    full = dist.gather_full_state(model, tp)
    # The whole logits on every rank equal the single-process forward (after the steps).
    idx, _ = batch(0)
    logits = model.logits(t64(idx[:2]))
    return losses, norms, full, logits


def compare(what, losses, want_losses, got_params, want_params):
    for step, (g, w) in enumerate(zip(losses, want_losses)):
        check_close(f"{what}: loss of step {step}", g, w)
    check_params(f"{what}: parameters after {STEPS} steps", got_params, want_params)


def gpt_dropout():
    return loom.nn.GPT(loom.nn.GPTConfig(**CONFIG), seed=SEED, dropout=0.1)


# Dropout with no dropout call in the script (python/loom/nn/_dropout.py): the optimizers advance
# the dropout step, DDP and ZeRO set each rank's and micro-batch's batch part. The reference runs
# before any DDP or ZeRO exists, on the whole batch (batch part 0 of 1).
loom.nn.set_dropout_step(0)
drop_losses, _, drop_params, _ = reference(clip=False, make=gpt_dropout)
want_losses, _, want_params, want_grads0 = reference(clip=False)
clip_losses, clip_norms, clip_params, _ = reference(clip=True)
sgd_losses, _, sgd_params, _ = reference(clip=False, sgd=True)

for accum in (1, 2):
    losses, got, grads0 = run_ddp(accum)
    compare(f"DDP grad_accum {accum}", losses, want_losses, got, want_params)
    check_params(f"DDP grad_accum {accum}: gradients of step 0", grads0, want_grads0)

if abs(drop_losses[0] - want_losses[0]) < 1e-6:
    failures.append(f"dropout 0.1 left the first loss as it was ({drop_losses[0]})")
for accum in (1, 2):
    loom.nn.set_dropout_step(0)
    losses, got, _ = run_ddp(accum, make=gpt_dropout)
    compare(f"GPT with dropout 0.1 in DDP grad_accum {accum}", losses, drop_losses, got,
            drop_params)
loom.nn.set_dropout_step(0)
losses, got = run_zero(2, 2, make=gpt_dropout)
compare("GPT with dropout 0.1 in ZeRO stage 2 grad_accum 2", losses, drop_losses, got, drop_params)

for stage, accum in ((1, 1), (2, 1), (3, 1), (2, 2)):
    losses, got = run_zero(stage, accum)
    compare(f"ZeRO stage {stage} grad_accum {accum}", losses, want_losses, got, want_params)
for stage in (1, 3):
    losses, got = run_zero(stage, 1, sgd=True)
    compare(f"ZeRO stage {stage} SGD", losses, sgd_losses, got, sgd_params)
# Hybrid sharding (shard_group=2: sharded over pairs of ranks, replicated across the pairs).
if size >= 4 and size % 2 == 0:
    for stage in (1, 2, 3):
        losses, got = run_zero(stage, 1, shard_group=2)
        compare(f"ZeRO stage {stage} shard_group=2", losses, want_losses, got, want_params)

# Parameter groups (weight decay off for vectors, their own lr set per step): ZeRO 1-3 against
# loom.optim.AdamW with the same groups on one process.
def two_groups(model, options=True):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    if not options:
        return decay, no_decay
    return [{"params": decay}, {"params": no_decay, "weight_decay": 0.0, "lr": 3e-4,
                                 "betas": (0.9, 0.99)}]


def group_lr(step):
    return 3e-4 * (step + 1) / STEPS


def run_groups(stage=None):
    """stage None: the single process with loom.optim.AdamW; else ZeRO at that stage."""
    model = gpt()
    if stage is None:
        opt = loom.optim.AdamW(two_groups(model), **ADAMW)
    else:
        opt = dist.ZeroRedundancyOptimizer(model, stage=stage, bucket_mb=0.02,
                                           params=two_groups(model), **ADAMW)
    losses = []
    for step in range(STEPS):
        idx, targets = batch(step)
        parts = [(idx, targets)] if stage is None else zip(slices(idx, rank, size, 1),
                                                           slices(targets, rank, size, 1))
        for x, y in parts:
            loss = model.loss(t64(x), t64(y))
            if stage is None:
                loss.backward()
            else:
                opt.backward(loss)
        opt.param_groups[1]["lr"] = group_lr(step)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item() if stage is None else group_mean(loss.item(), comm))
    if stage is not None:
        opt.gather_parameters()
        if [g["lr"] for g in opt.param_groups] != [ADAMW["lr"], group_lr(STEPS - 1)]:
            failures.append(f"ZeRO stage {stage} param_groups lr: "
                            f"{[g['lr'] for g in opt.param_groups]}")
    return losses, dict(model.named_parameters())


group_losses, group_params = run_groups()
if max(abs(a - b) for a, b in zip(group_losses, want_losses)) < 1e-7:
    failures.append("the two parameter groups trained as one (the test must tell them apart)")
for stage in (1, 2, 3):
    losses, got = run_groups(stage)
    compare(f"ZeRO stage {stage} with two parameter groups", losses, group_losses, got,
            group_params)

# A model written in Python (Python forward, Python parameters, a ModuleList of Python blocks)
# inside DDP and ZeRO 1-3.
py_losses, _, py_params, py_grads0 = reference(clip=False, make=py_gpt)
losses, got, grads0 = run_ddp(2, make=py_gpt)
compare("Python-defined GPT in DDP grad_accum 2", losses, py_losses, got, py_params)
check_params("Python-defined GPT in DDP: gradients of step 0", grads0, py_grads0)
for stage in (1, 2, 3):
    losses, got = run_zero(stage, 1, make=py_gpt)
    compare(f"Python-defined GPT in ZeRO stage {stage}", losses, py_losses, got, py_params)

ref_model = gpt()
ref_model.load_state_dict({k: v.detach() for k, v in clip_params.items()})
variants = [(False, False), (True, False)] + ([(False, True)] if size >= 4 else [])
for sequence_parallel, zero in variants:
    what = (f"TensorParallelGPT dp {size // 2} x tp 2"
            f"{' sequence-parallel' if sequence_parallel else ''}{' ZeRO-1' if zero else ''}")
    losses, norms, full, logits = run_tp(sequence_parallel, zero)
    compare(what, losses, clip_losses, full, clip_params)
    for step, (g, w) in enumerate(zip(norms, clip_norms)):
        check_close(f"{what}: gradient norm of step {step}", g, w)
    idx, _ = batch(0)
    check_params(f"{what}: logits", {"logits": logits}, {"logits": ref_model(t64(idx[:2]))})
    if sequence_parallel and not zero:
        # Activation checkpointing recomputes each block (its tp collectives too): the same run.
        ck_losses, ck_norms, ck_full, _ = run_tp(sequence_parallel, zero, checkpoint=True)
        if (ck_losses, ck_norms) != (losses, norms) or any(
                not np.array_equal(arr(ck_full[k]), arr(full[k])) for k in full):
            failures.append(f"{what} checkpointed: not the uncheckpointed run bit for bit")



def run_python_tp_model():
    """A Python model over tp shards: the one clip_grad_norm_ against the C++ tp helper and
    against numpy on the gradients gathered over tp (shards once each, whole parameters once)."""
    tp = dist.DeviceMesh(tp=2).tp_group

    class Net(loom.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = loom.nn.LayerNorm(16)
            self.fc = loom.nn.ColumnParallelLinear(16, 64, tp)
            self.proj = loom.nn.RowParallelLinear(64, 16, tp)

        def forward(self, x):
            return self.proj(F.gelu(self.fc(self.ln(x))))

    net = Net().init_parameters(seed=SEED)
    x = loom.tensor(np.random.default_rng(4).standard_normal((8, 16)).astype(np.float32))
    (net(x) ** 2).sum().backward()
    squares = 0.0
    for name, p in net.named_parameters():
        g = arr(p.grad)
        if name in ("fc.weight", "fc.bias", "proj.weight"):  # shards: add every rank's part
            part = loom.tensor([float((g ** 2).sum())])
            tp.allreduce(part)
            squares += float(arr(part)[0])
        else:  # ln.weight, ln.bias, proj.bias: whole, the same on every tp rank
            squares += float((g ** 2).sum())
    want = float(np.sqrt(squares))
    got = loom.nn.utils.clip_grad_norm_(net.parameters(), 1e9).item()
    check_close("Python model over tp: clip_grad_norm_ vs the gathered gradients", got, want)
    check_close("Python model over tp: clip_grad_norm_ vs tp_clip_grad_norm_", got,
                dist.tp_clip_grad_norm_(net, 1e9, tp))


run_python_tp_model()


def run_moe_expert_parallel():
    """loom.nn.MoE with ep_group=comm against the single-process MoE on the whole batch: this
    rank's output rows and input gradient, the router's gradient summed over the ranks, the
    mean of the ranks' auxiliary loss terms, the loads, and each expert this rank holds."""
    experts = 2 * size
    c, per = 6, 5
    options = dict(capacity_factor=0.75, aux_loss_coef=0.1, z_loss_coef=0.01)
    one = loom.nn.MoE(c, experts, 2, **options).init_parameters(seed=SEED)
    ep = loom.nn.MoE(c, experts, 2, ep_group=comm, **options).init_parameters(seed=SEED)
    rng = np.random.default_rng(7)
    router = rng.uniform(-1, 1, size=(experts, c)).astype(np.float32)
    with loom.no_grad():
        one.router.weight.copy_(loom.tensor(router))
        ep.router.weight.copy_(loom.tensor(router))
    x_all = rng.uniform(-1, 1, size=(per * size, c)).astype(np.float32)
    proj = rng.uniform(-1, 1, size=(per * size, c)).astype(np.float32)
    mine = slice(rank * per, (rank + 1) * per)
    x_one = loom.tensor(x_all).requires_grad_()
    x_mine = loom.tensor(np.ascontiguousarray(x_all[mine])).requires_grad_()
    out_one, out_mine = one(x_one), ep(x_mine)
    check_params("MoE over ep: output rows", {"out": out_mine}, {"out": arr(out_one)[mine]})
    if list(ep.load) != list(one.load):
        failures.append(f"MoE over ep: load {list(ep.load)} vs one process {list(one.load)}")
    terms = loom.tensor([ep.aux_loss.item()])
    comm.allreduce(terms, op="avg")
    check_close("MoE over ep: auxiliary loss terms averaged", arr(terms)[0], one.aux_loss.item())
    # These losses add up over the ranks (sums over rows): each adds its share, term / size.
    ((out_one * loom.tensor(proj)).sum() + one.aux_loss).backward()
    ((out_mine * loom.tensor(np.ascontiguousarray(proj[mine]))).sum()
     + ep.aux_loss / size).backward()
    check_params("MoE over ep: input gradient rows", {"x": x_mine.grad}, {"x": arr(x_one.grad)[mine]})
    router_grad = ep.router.weight.grad.clone()
    comm.allreduce(router_grad, op="sum")
    check_params("MoE over ep: router gradient summed", {"router": router_grad},
                 {"router": one.router.weight.grad})
    held = {n: p.grad for n, p in ep.named_parameters() if n.startswith("experts.") and p.grad is not None}
    want = {n: p.grad for n, p in one.named_parameters() if n in held}
    check_params("MoE over ep: this rank's experts' gradients", held, want)
    if ep.local_experts != 2 or ep.first_expert != 2 * rank:
        failures.append(f"MoE over ep: holds {ep.local_experts} from {ep.first_expert}")


run_moe_expert_parallel()


class MoeNet(loom.nn.Module):
    """A Python model around a MoE layer: Linear, residual MoE, Linear."""

    def __init__(self, c, experts, ep_group=None):
        super().__init__()
        self.inp = loom.nn.Linear(c, c)
        self.moe = loom.nn.MoE(c, experts, 2, capacity_factor=1.0, aux_loss_coef=0.1,
                               z_loss_coef=0.01, ep_group=ep_group,
                               batch_group=None if ep_group is None else comm)
        self.out = loom.nn.Linear(c, 3)

    def forward(self, x):
        h = self.inp(x)
        return self.out(h + self.moe(h))


def run_moe(ep, stage=0):
    """A Python MoE model with the experts split over ep groups of `ep` ranks (replicated across
    them when ep < size) under DistributedDataParallel (stage 0) or ZeroRedundancyOptimizer
    (stages 1-3: the experts beside the shards, their state sharded over their replicas, at stage
    3 the experts themselves) against one process: each step's loss (the
    ranks' mean, auxiliary losses included), clip_grad_norm_'s norm, and after 3 SGD steps every
    parameter, the experts this rank holds included. Each rank's loss is its rows' mean plus the
    layer's aux_loss term, as one process writes it."""
    c, experts, per = 8, 2 * ep, 4
    ep_group = comm if ep == size else comm.split(color=rank // ep, key=rank, name=f"ep{ep}")
    rng = np.random.default_rng(11 + stage)
    router = rng.uniform(-1, 1, size=(experts, c)).astype(np.float32)
    one = MoeNet(c, experts).init_parameters(seed=SEED)
    net = MoeNet(c, experts, ep_group).init_parameters(seed=SEED)
    with loom.no_grad():
        one.moe.router.weight.copy_(loom.tensor(router))
        net.moe.router.weight.copy_(loom.tensor(router))
    opt_one = loom.optim.SGD(one.parameters(), **SGD)
    if stage == 0:
        name = f"MoE DDP ep {ep}"
        ddp = dist.DistributedDataParallel(net, comm)
        opt = loom.optim.SGD(net.parameters(), **SGD)
    else:
        name = f"MoE ZeRO-{stage} ep {ep}"
        opt = dist.ZeroRedundancyOptimizer(net, comm, optimizer_class=loom.optim.SGD, stage=stage,
                                           bucket_mb=0.02, **SGD)
    mine = slice(rank * per, (rank + 1) * per)
    for step in range(STEPS):
        x = rng.uniform(-1, 1, size=(per * size, c)).astype(np.float32)
        y = rng.uniform(-1, 1, size=(per * size, 3)).astype(np.float32)
        loss_one = ((one(loom.tensor(x)) - loom.tensor(y)) ** 2).mean() + one.moe.aux_loss
        loss_one.backward()
        norm_one = loom.nn.utils.clip_grad_norm_(one.parameters(), CLIP)
        opt_one.step()
        opt_one.zero_grad()
        out = net(loom.tensor(np.ascontiguousarray(x[mine])))
        loss = ((out - loom.tensor(np.ascontiguousarray(y[mine]))) ** 2).mean() + net.moe.aux_loss
        if stage == 0:
            ddp.backward(loss)
            ddp.finish()
        else:
            opt.backward(loss)
            opt.finish_gradients()
        norm = loom.nn.utils.clip_grad_norm_(net.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
        mean = loom.tensor([loss.item()])
        comm.allreduce(mean, op="avg")
        check_close(f"{name}: step {step + 1} loss", arr(mean)[0], loss_one.item())
        check_close(f"{name}: step {step + 1} clip norm", norm.item(), norm_one.item())
    if stage == 3 and ep < size:
        # The experts themselves are sharded over their size / ep replicas: outside a forward
        # this rank holds its shards, under 1/2 of its experts' bytes (plus its dense shards).
        experts_bytes = sum(p.numel() * 4 for n, p in net.named_parameters()
                            if n.startswith("moe.experts."))
        dense_bytes = sum(p.numel() * 4 for n, p in net.named_parameters()
                          if not n.startswith("moe.experts."))
        held_bytes = opt.memory().parameters
        if held_bytes > dense_bytes + experts_bytes // 2 + 64:
            failures.append(f"{name}: holds {held_bytes} parameter bytes, experts {experts_bytes}, "
                            f"dense {dense_bytes}: the experts are not sharded")
    if stage:
        opt.gather_parameters()
    got = dict(net.named_parameters())
    want = {n: p for n, p in one.named_parameters() if n in got}
    check_params(f"{name}: parameters after {STEPS} steps", got, want)
    held = [n for n in got if n.startswith("moe.experts.")]
    if len(held) != 4 * (experts // ep):
        failures.append(f"{name}: holds {len(held)} expert tensors")


for stage in (0, 1, 2, 3):
    run_moe(size, stage)
    if size >= 4:
        run_moe(2, stage)

for f in failures:
    print(f"rank {rank}: {f}", file=sys.stderr)
count = loom.tensor([float(len(failures))])
comm.allreduce(count, op="sum")
total = int(arr(count)[0])
if rank == 0:
    print(f"mpi_parallel_check: {size} ranks, {total} mismatches; closest to its tolerance: "
          f"{worst[1]} at {worst[0]:.3f} of it")
sys.exit(1 if total else 0)
