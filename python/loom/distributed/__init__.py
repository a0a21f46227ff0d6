"""loom.distributed: the communicator (collectives/communicator.h) on loom tensors.

Under ``mpirun`` the world is MPI's; without it, a world of one process (every collective is then
the identity, so a script runs unchanged on one process)::

    import loom, loom.distributed as dist

    comm = dist.world()                      # or dist.init_process_group()
    t = loom.full([4], float(comm.rank))
    comm.allreduce(t, op="sum")              # in place, waits; t == 0 + 1 + ... + (size - 1)
    work = comm.broadcast(t, src=0, async_op=True)
    work.wait()                              # GIL released while waiting
    tp = comm.split(color=comm.rank // 2, key=comm.rank, name="tp")

Run a script on N ranks with ``mpirun -np N python3 script.py``. The Communicator's methods keep
c10d ProcessGroup's names and loom's argument order (input, then output); the module-level
functions below are torch.distributed's (all_reduce, all_gather_into_tensor with output first,
...) over the world or a ``group=`` communicator.
"""

from loom._loom.distributed import (  # noqa: F401
    Communicator,
    ReduceOp,
    Work,
    launched_by_mpi,
    world,
)

__all__ = [
    "Communicator", "ReduceOp", "Work", "world", "launched_by_mpi", "init_process_group",
    "is_initialized", "get_rank", "get_world_size", "get_backend", "all_reduce", "broadcast",
    "all_gather_into_tensor", "reduce_scatter_tensor", "reduce", "barrier", "send", "recv",
    "new_group",
]

_initialized = False


def init_process_group(backend="auto"):
    """Creates the world (torch's name); returns it. backend: 'auto', 'self', 'mpi', 'nccl'."""
    global _initialized
    comm = world(backend)
    _initialized = True
    return comm


def is_initialized():
    return _initialized


def _group(group):
    return world() if group is None else group


def get_rank(group=None):
    return _group(group).rank


def get_world_size(group=None):
    return _group(group).size


def get_backend(group=None):
    return _group(group).backend


def all_reduce(tensor, op="sum", group=None, async_op=False):
    return _group(group).allreduce(tensor, op=op, async_op=async_op)


def broadcast(tensor, src=0, group=None, async_op=False):
    return _group(group).broadcast(tensor, src=src, async_op=async_op)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    return _group(group).allgather(input_tensor, output_tensor, async_op=async_op)


def reduce_scatter_tensor(output, input, op="sum", group=None, async_op=False):
    return _group(group).reduce_scatter(input, output, op=op, async_op=async_op)


def reduce(tensor, dst=0, op="sum", group=None, async_op=False):
    """In place on dst (torch's semantics): dst's tensor becomes op over ranks."""
    return _group(group).reduce(tensor, tensor, dst=dst, op=op, async_op=async_op)


def barrier(group=None, async_op=False):
    return _group(group).barrier(async_op=async_op)


def send(tensor, dst, group=None, tag=0):
    return _group(group).send(tensor, dst, tag=tag)


def recv(tensor, src, group=None, tag=0):
    return _group(group).recv(tensor, src, tag=tag)


def new_group(color, key=None, name="group", group=None):
    """A sub-group by color (loom's split; every rank of `group` must call it)."""
    g = _group(group)
    return g.split(color, g.rank if key is None else key, name)


# ---- parallelism over a group: mesh, DDP, ZeRO, tensor-parallel helpers (parallel/) ----

import inspect as _inspect  # noqa: E402

from loom import optim as _optim  # noqa: E402
from loom.nn.module import Module as _Module  # noqa: E402
from loom.nn import _dropout  # noqa: E402
from loom.nn import _placement  # noqa: E402
from loom import _loom  # noqa: E402
from loom._loom import parallel as _parallel  # noqa: E402

DeviceMesh = _parallel.DeviceMesh
MeshCoords = _parallel.MeshCoords
TrainingMemory = _parallel.TrainingMemory

__all__ += [
    "DeviceMesh", "MeshCoords", "TrainingMemory", "DistributedDataParallel",
    "ZeroRedundancyOptimizer", "tp_clip_grad_norm_", "gather_full_state", "load_full_state",
]


def _as_cpp(module, owner="loom.distributed"):
    """The C++ module (loom._loom.nn.Module) behind a loom.nn.Module."""
    if isinstance(module, _Module):  # built-in or written in Python (Note [Python modules as
        return module._cpp_module()  # C++ modules], python/src/nn.cpp)
    raise TypeError(f"{owner}: module must be a loom.nn.Module, got {type(module).__name__}")


def _check_group(group, owner, name="group", required=False):
    if group is None and not required:
        return None
    if not isinstance(group, Communicator):
        raise TypeError(f"{owner}: {name} must be a loom.distributed.Communicator"
                        f"{'' if required else ' or None'}, got {type(group).__name__}")
    return group


def _check_int(value, owner, name):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{owner}: {name} must be an int, got {type(value).__name__}")
    return value


def _check_number(value, owner, name):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{owner}: {name} must be a number, got {type(value).__name__}")
    return float(value)


def _expert_parameters(module, group, owner):
    """The name prefixes of the expert-parallel MoE layers' experts in module (each rank's own),
    and the communicator of the ranks of group that hold the same experts as this one (None when
    the ep group is the whole group). Collective over group when there are experts."""
    from loom.nn import MoE

    layers = [(name, m) for name, m in module.named_modules()
              if isinstance(m, MoE) and m.ep_group is not None]
    if not layers:
        return [], None
    size = get_world_size(group)
    ep_groups = {id(m.ep_group): m.ep_group for _, m in layers}
    for name, m in layers:
        if get_world_size(m.batch_group) != size:
            raise ValueError(f"{owner}: the MoE layer '{name}' has a batch group of "
                             f"{get_world_size(m.batch_group)} ranks but this group has {size}; "
                             f"data parallelism averages over the batch group: build the layer "
                             f"with batch_group= this group")
    if len(ep_groups) > 1:
        raise ValueError(f"{owner}: the MoE layers use {len(ep_groups)} different ep groups; "
                         f"give every layer the same ep_group")
    ep = next(iter(ep_groups.values()))
    prefixes = [f"{name}.experts." if name else "experts." for name, _ in layers]
    if get_world_size(ep) == size:
        return prefixes, None
    world = _group(group)
    replicas = world.split(color=ep.rank, key=world.rank, name=f"{world.name}.experts")
    return prefixes, replicas


class DistributedDataParallel:
    """Data parallelism over ``group`` (default: the world): every rank holds the whole module
    and a different part of the global batch; ``backward(loss)`` launches the gradient
    reductions bucket by bucket while backward runs, ``finish()`` waits for them, after which
    every parameter's ``.grad`` is the group average. With each rank's loss the mean over its
    equal part of the batch, the optimizer then takes the single-process step on the whole batch.

    Example::

        model = loom.nn.GPT(config).init_parameters(seed=1337)
        ddp = loom.distributed.DistributedDataParallel(model)   # rank 0's values broadcast
        opt = loom.optim.AdamW(model.parameters(), lr=1e-3)
        loss = ddp.module.loss(x_local, y_local)
        ddp.backward(loss)      # not loss.backward(): the reductions start as gradients fill
        ddp.finish()
        opt.step(); opt.zero_grad()

    With ``grad_accum=k``, call ``backward`` once per micro-batch (scale each loss by 1/k) and
    ``finish()`` after the last: only the last micro-batch communicates. Collective over group.

    Expert parallelism: each ``loom.nn.MoE(..., ep_group=...)`` in the module (its batch group
    must be this group) keeps its experts out of the broadcast and the averaging: every rank holds
    its own; ``finish()`` sums each expert's gradient over the ranks holding the same expert (one
    per ep group) and divides by the group's size, which with each rank's loss its mean plus its
    ``aux_loss`` term is one process's gradient (Note [Own parameters under data parallelism],
    parallel/ddp.cpp).
    """

    def __init__(self, module, group=None, *, bucket_mb=25, grad_accum=1, overlap=True,
                 check_replicas=False):
        owner = "DistributedDataParallel"
        cpp = _as_cpp(module, owner)
        group = _check_group(group, owner)
        self._module = module
        own_prefixes, own_replicas = _expert_parameters(module, group, owner)
        self._impl = _parallel.DistributedDataParallel(
            cpp, group, _check_number(bucket_mb, owner, "bucket_mb"),
            _check_int(grad_accum, owner, "grad_accum"), bool(overlap), bool(check_replicas),
            own_prefixes, own_replicas)
        self._dropout_parts = _dropout._BatchParts(get_rank(group), get_world_size(group),
                                                   grad_accum)

    @property
    def module(self):
        return self._module

    def __call__(self, *args, **kwargs):
        return self._module(*args, **kwargs)

    forward = __call__

    def backward(self, loss):
        """Backward of one micro-batch's loss; its reductions launch as gradients are ready.
        The next forward's dropout masks are the next micro-batch's (loom/nn/_dropout.py)."""
        self._impl.backward(loss)
        self._dropout_parts.after_backward()

    def finish(self):
        """After the last micro-batch: waits for the reductions (GIL released)."""
        self._impl.finish()
        self._dropout_parts.restart()

    def memory(self):
        """This rank's parameter and gradient bytes (a TrainingMemory)."""
        return self._impl.memory()

    @property
    def exposed_wait_seconds(self):
        """Seconds the last finish() waited: reduction time backward did not hide."""
        return self._impl.exposed_wait_seconds

    def parameters(self):
        return self._module.parameters()

    def named_parameters(self, prefix=""):
        return self._module.named_parameters(prefix)

    def state_dict(self):
        return self._module.state_dict()

    def __repr__(self):
        return f"DistributedDataParallel({self._module!r})"


def _optimizer_spec(optimizer_class, kwargs, owner):
    """The C++ optimizer ZeRO builds from a loom.optim class and its keyword arguments, and the
    hyper-parameters loom.optim.Optimizer reports (param_groups, state_dict)."""
    if optimizer_class is _optim.AdamW:
        kind = "adamw"
    elif optimizer_class is _optim.SGD:
        kind = "sgd"
    else:
        name = getattr(optimizer_class, "__name__", type(optimizer_class).__name__)
        raise TypeError(f"{owner}: optimizer_class must be loom.optim.AdamW or loom.optim.SGD, "
                        f"got {name}")
    try:
        bound = _inspect.signature(optimizer_class.__init__).bind(None, None, **kwargs)
    except TypeError as e:
        raise TypeError(f"{owner}: {optimizer_class.__name__}: {e}") from None
    bound.apply_defaults()
    args = dict(bound.arguments)
    args.pop("self")
    args.pop("params")
    spec = _parallel._OptimizerSpec()
    spec.kind = kind
    for key, value in args.items():
        if key == "betas":
            spec.beta1, spec.beta2 = (float(b) for b in value)
        elif key == "nesterov":
            spec.nesterov = bool(value)
        else:
            setattr(spec, key, _check_number(value, owner, key))
    args.pop("lr")  # the optimizer's lr property answers for it
    return spec, args


def _zero_param_groups(cpp, params, optimizer_class, optimizer_kwargs, owner):
    """torch.optim-style parameter groups over the module's parameters, as [(names, spec,
    hyper-parameters, tensors)] for the C++ ZeroOptimizer; a tensor that is not a parameter of
    the module, or one in two groups, is an error naming it."""
    if isinstance(params, (_loom.Tensor, dict)) or not all(isinstance(g, dict) for g in params):
        raise TypeError(f"{owner}: params must be a list of dicts (parameter groups, each with "
                        "'params'); without groups, leave params out")
    names = {_optim._param_key(p): name for name, p in cpp.named_parameters()}
    out, seen = [], {}
    for g, group in enumerate(params):
        if "params" not in group:
            raise ValueError(f"{owner}: parameter group {g} has no 'params'")
        tensors = group["params"]
        tensors = [tensors] if isinstance(tensors, _loom.Tensor) else list(tensors)
        group_names = []
        for j, p in enumerate(tensors):
            if not isinstance(p, _loom.Tensor):
                raise TypeError(f"{owner}: parameter group {g}: expected loom.Tensor, got a "
                                f"{type(p).__name__} at position {j}")
            name = names.get(_optim._param_key(p))
            if name is None:
                raise ValueError(f"{owner}: parameter group {g}: the tensor at position {j} "
                                 f"(shape {_optim._shape(p)}) is not a parameter of the module")
            if name in seen:
                raise ValueError(f"{owner}: parameter '{name}' is in groups {seen[name]} and {g}; "
                                 "a parameter can be in one group only")
            seen[name] = g
            group_names.append(name)
        options = {k: v for k, v in group.items() if k != "params"}
        spec, hyper = _optimizer_spec(optimizer_class, dict(optimizer_kwargs, **options),
                                      f"{owner}: parameter group {g}")
        out.append((group_names, spec, hyper, tensors))
    missing = [name for name in names.values() if name not in seen]
    if missing:
        raise ValueError(f"{owner}: parameters {missing} are in no group; ZeRO shards every "
                         "parameter of the module, so every one needs a group")
    return out


class ZeroRedundancyOptimizer(_optim.Optimizer):
    """ZeRO: data parallelism over ``group`` (default: the world) that shards the training
    state instead of replicating it, around a loom.optim.AdamW or loom.optim.SGD built in
    C++ over this rank's shard (``optimizer_kwargs`` are that class's: lr, betas, eps,
    weight_decay, momentum, ...; its defaults apply).

    stage 1: optimizer state sharded; 2: and gradients; 3: and parameters (gathered around
    each module's forward and backward: call the model, ``model(x)`` or ``model.loss``).
    ``tp``: the model's tensor-parallel group (dp x tp), so clipping counts tp shards right.

    Example::

        model = loom.nn.GPT(config).init_parameters(seed=1337)
        opt = loom.distributed.ZeroRedundancyOptimizer(model, stage=2, lr=1e-3)
        opt.backward(model.loss(x_local, y_local))   # not loss.backward()
        opt.clip_grad_norm_(1.0)                     # optional, the global norm
        opt.step()                                   # then parameters are whole again
        opt.zero_grad()

    Pipelines (stage 1): ``external_backward=True`` takes the gradients the pipeline executor's
    backwards left in the parameters (finish_gradients() reduces them); ``clip_grad_norm_`` then
    also sums over ``pp``, counting only the parameter names in ``counted_in_norm`` (one copy of
    each: not a tied or replicated second copy). See examples/train_gpt.py.

    Parameter groups as torch.optim's: ``params``, a list of dicts each with "params" (tensors
    of the module) and the options that differ from ``optimizer_kwargs``; every parameter of the
    module in exactly one group (ZeRO shards them all)::

        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        opt = loom.distributed.ZeroRedundancyOptimizer(
            model, params=[{"params": decay, "weight_decay": 0.1},
                           {"params": no_decay, "weight_decay": 0.0}], lr=3e-4)
        opt.param_groups[1]["lr"] = 1e-3   # each group's lr, as schedules set it

    Each rank's pieces step with their parameter's group's options (optim::GroupedOptimizer),
    as one process stepping the groups would. Options other than lr are fixed once built.

    ``shard_group="node"`` (or a number G) shards the state over each node's ranks of the group
    (or each G consecutive ranks) and replicates it across those groups: hybrid sharding, as
    PyTorch's HSDP; the results are the single-process ones as with plain sharding, the memory
    per rank that of a group's size. Its state_dict() is refused for now.

    Expert parallelism: the experts of each ``loom.nn.MoE(..., ep_group=...)`` in the module (its
    batch group this group) stay whole on the rank holding them, beside its shards: their
    gradients are summed over the ranks holding the same experts and divided by the group's size
    (as DistributedDataParallel does), the optimizer steps them whole, and clipping counts each
    once. With ep = the group that is all the sharding experts can have; with a smaller ep group
    they are replicated over its copies rather than sharded. f32 only, and its state_dict() is
    refused, for now.

    In stage 3 call ``gather_parameters()`` before reading the parameters outside a forward.
    ``state_dict()`` is this rank's shard (load it on the same rank of a group of the same
    size). Collective over group.
    """

    def __init__(self, module, group=None, *, optimizer_class=_optim.AdamW, stage=1, bucket_mb=25,
                 grad_accum=1, overlap=True, check_replicas=False, tp=None,
                 external_backward=False, pp=None, counted_in_norm=None, params=None,
                 shard_group=None, **optimizer_kwargs):
        owner = "ZeroRedundancyOptimizer"
        cpp = _as_cpp(module, owner)
        group = _check_group(group, owner)
        # Expert-parallel MoE layers: each rank's experts stay whole beside its shards (See
        # ZeroOptions::own_parameters), reduced over the ranks holding the same experts.
        own_prefixes, own_replicas = _expert_parameters(module, group, owner)
        tp = _check_group(tp, owner, "tp")
        pp = _check_group(pp, owner, "pp")
        spec, hyper = _optimizer_spec(optimizer_class, optimizer_kwargs, owner)
        # Before the C++ optimizer moves the parameters into its buckets (their storage changes).
        groups = None if params is None else _zero_param_groups(
            cpp, params, optimizer_class, optimizer_kwargs, owner)
        impl = _parallel.ZeroOptimizer(
            cpp, group, spec, _check_int(stage, owner, "stage"),
            _check_number(bucket_mb, owner, "bucket_mb"),
            _check_int(grad_accum, owner, "grad_accum"), bool(overlap),
            bool(check_replicas), tp, bool(external_backward), pp,
            None if counted_in_norm is None else sorted(counted_in_norm),
            None if groups is None else [(names, group_spec) for names, group_spec, _, _ in groups],
            shard_group, own_prefixes, own_replicas)
        self._module = module
        self._zero = impl
        _placement.register(self)  # clip_grad_norm_ of its module's parameters comes here
        self.optimizer_class = optimizer_class
        if groups is None:
            super().__init__(impl, hyper)
        else:  # Note [One C++ optimizer per group]: here the groups of ZeRO's inner optimizer
            self.defaults = dict(hyper, lr=spec.lr)
            self._impls = [impl.group_optimizer(g) for g in range(impl.group_count)]
            self.param_groups = [
                _optim._ParamGroup(self, g, dict(group_hyper, lr=self._impls[g].lr,
                                                 params=tensors))
                for g, (_, _, group_hyper, tensors) in enumerate(groups)]
        if not external_backward:  # a pipeline's executor sets the micro-batches' parts itself
            self._dropout_parts = _dropout._BatchParts(get_rank(group), get_world_size(group),
                                                       grad_accum)

    @property
    def module(self):
        return self._module

    @property
    def _impl(self):
        """The C++ ZeroOptimizer (what loom.distributed.checkpoint saves)."""
        return self._zero

    @property
    def stage(self):
        return self._zero.stage

    def step(self, closure=None):
        if len(self._impls) == 1:
            return super().step(closure)
        loss = None
        if closure is not None:
            from loom.autograd import enable_grad

            with enable_grad():
                loss = closure()
        self._zero.step()  # every group, each at its own lr
        _dropout._advance_step()
        return loss

    def zero_grad(self, set_to_none=True):
        if not set_to_none:
            raise ValueError("zero_grad: loom drops gradients (set_to_none=True) only")
        self._zero.zero_grad()

    def state_dict(self):
        """This rank's shard of the state ("state": the C++ ZeroOptimizer's, keyed by this
        rank's pieces) and each group's options and lr ("param_groups")."""
        if len(self._impls) == 1:
            return super().state_dict()
        return {"state": self._zero.state_dict(), "param_groups": self._saved_groups()}

    def load_state_dict(self, state_dict):
        """Loads a state_dict() of this rank with the same groups; each group's lr and extra
        keys come back too."""
        if len(self._impls) == 1:
            return super().load_state_dict(state_dict)
        if not isinstance(state_dict, dict) or "state" not in state_dict:
            raise ValueError("load_state_dict: expected a dict with 'state' and 'param_groups' "
                             "(what state_dict() returns)")
        saved_groups = state_dict.get("param_groups", [])
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"load_state_dict: {len(saved_groups)} parameter groups in the state "
                             f"dict, {len(self.param_groups)} in this ZeroRedundancyOptimizer")
        for g, saved in enumerate(saved_groups):
            for key in self.defaults:
                if key != "lr" and key in saved and not _optim._same_option(
                        saved[key], dict.__getitem__(self.param_groups[g], key)):
                    raise ValueError(f"load_state_dict: group {g}: '{key}' is {saved[key]} in the "
                                     f"state dict, {dict.__getitem__(self.param_groups[g], key)} "
                                     "in this optimizer")
        self._zero.load_state_dict(self._as_tensors(self._zero, dict(state_dict["state"])))
        self._restore_groups(saved_groups)

    def backward(self, loss):
        """Backward of one micro-batch (scale its loss by 1/grad_accum yourself). The next
        forward's dropout masks are the next micro-batch's (loom/nn/_dropout.py)."""
        self._zero.backward(loss)
        if hasattr(self, "_dropout_parts"):
            self._dropout_parts.after_backward()

    def finish_gradients(self):
        """Waits for the step's gradient reductions (step() does it otherwise)."""
        self._zero.finish_gradients()

    def accumulate_in_buckets(self):
        """Pipelines (stage 1, ``external_backward``): before a step's first backward, points
        every parameter's ``.grad`` at its zeroed slot of the gradient buckets, so the
        executor's backwards accumulate there and the step holds the gradients once (without
        it they accumulate in fresh ``.grad`` tensors that finish_gradients() copies in)."""
        self._zero.accumulate_in_buckets()

    _norm_priority = 1  # over the layers' placements (loom/nn/_placement.py)

    def _norm_placements(self):
        place = _placement.Placement(zero=self)
        return {p._identity(): place for p in self._module.parameters()}

    def clip_grad_norm_(self, max_norm):
        """Clips the global gradient norm (every shard counted once); returns the norm
        before clipping. loom.nn.utils.clip_grad_norm_(module.parameters(), max_norm) comes
        here too."""
        return self._zero.clip_grad_norm(_check_number(max_norm, "clip_grad_norm_",
                                                       "max_norm"))

    def gather_parameters(self):
        """Stage 3: gathers every parameter whole until the next forward (a no-op in
        stages 1 and 2). Collective."""
        self._zero.gather_parameters()

    def memory(self):
        """This rank's parameter, gradient and optimizer-state bytes (a TrainingMemory)."""
        return self._zero.memory()

    @property
    def exposed_wait_seconds(self):
        return self._zero.exposed_wait_seconds

    def __repr__(self):
        lrs = ", ".join(str(impl.lr) for impl in self._impls)
        return (f"ZeroRedundancyOptimizer(stage={self.stage}, "
                f"{self.optimizer_class.__name__}, lr={lrs})")



def tp_clip_grad_norm_(module, max_norm, group):
    """Clips the global gradient norm of a tensor-parallel module to max_norm, as
    loom.nn.utils.clip_grad_norm_ does for the single-process module (a sharded parameter's
    squares add over ``group``, a whole one counts once); returns the norm before clipping.
    Collective over group (the tp group)."""
    owner = "tp_clip_grad_norm_"
    return _parallel.tp_clip_grad_norm(_as_cpp(module, owner),
                                       _check_number(max_norm, owner, "max_norm"),
                                       _check_group(group, owner, required=True))


def gather_full_state(module, group):
    """Every parameter of a tensor-parallel module at its single-process shape (dict name ->
    Tensor, the same on every rank): the shards are all-gathered over ``group`` (the tp group).
    A TensorParallelGPT's wte drops the rows tp padding added. Collective over group."""
    owner = "gather_full_state"
    return _parallel.gather_full_state(_as_cpp(module, owner),
                                       _check_group(group, owner, required=True))


def load_full_state(module, state_dict):
    """Loads single-process parameters (dict name -> Tensor) into a tensor-parallel module:
    each rank takes its slice of every sharded one. Missing or unexpected keys and wrong shapes
    raise ValueError naming the parameter, before anything changes. Local (no communication)."""
    owner = "load_full_state"
    if not isinstance(state_dict, dict):
        raise TypeError(f"{owner}: state_dict must be a dict name -> Tensor, got "
                        f"{type(state_dict).__name__}")
    _parallel.load_full_state(_as_cpp(module, owner), state_dict)

from loom.distributed import pipelining  # noqa: E402,F401  (loom.distributed.pipelining)
from loom.distributed.embedding import (  # noqa: E402,F401
    EmbeddingPlacement,
    EmbeddingShard,
    EmbeddingSharding,
    ShardedEmbeddingBagCollection,
    placements_for,
)

__all__ += ["pipelining", "ShardedEmbeddingBagCollection", "EmbeddingSharding",
            "EmbeddingPlacement", "EmbeddingShard", "placements_for"]

from loom.distributed import checkpoint  # noqa: E402,F401  (loom.distributed.checkpoint)

__all__ += ["checkpoint"]
