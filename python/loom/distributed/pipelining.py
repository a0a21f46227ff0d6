"""loom.distributed.pipelining: pipeline parallelism (parallel/pipeline) from Python.

Schedules are data: each rank's ordered actions (F, B, sends, receives, SYNC) for one step. Build
a published one, print it, edit the text, load it back; ``validate`` simulates it before anything
runs; ``PipelineExecutor`` runs this rank's list::

    import loom, loom.distributed as dist
    from loom.distributed import pipelining

    s = pipelining.schedule("1f1b", ranks=2, microbatches=4)
    sim = pipelining.validate(s)             # ValueError naming the rank and action if it stalls
    print(sim.report())                      # bubble and peak activations per rank

    pp = dist.world()                        # under mpirun -np 2
    config = loom.nn.GPTConfig(max_seq_len=16, vocab=64, layers=2, heads=2, channels=32)
    stage = pipelining.GPTStage(config, pp.rank, s.stages).init_parameters(seed=1337)
    chunk = pipelining.stage_chunk(stage)    # C++ forward, loss and gradient sync
    ex = pipelining.PipelineExecutor(s, pp, [chunk], stage.activation_shape(rows=2, seq=16))
    local = ex.run(tokens, targets)          # m tensors each; None where this rank reads none
    pipelining.sync_tied_embedding([stage], pipelining.embedding_group(s, pp))
    loss = ex.mean_loss(local)

A chunk's forward may also be any Python callable (a loom.nn.Module defined in Python)::

    chunk = pipelining.StageChunk(my_module, loss=lambda out, t: F.cross_entropy(out, t))

run() releases the GIL; Python callables re-acquire it. A Python exception raised in a callable
comes out of run() unchanged (the step is abandoned; zero the gradients before retrying). With
several ranks the peers of the failing rank block on the messages it will not send and fail with
a RuntimeError once the group's ``timeout_seconds`` passes (See Note [Python callables in the
executor] in python/src/pipeline.cpp).
"""

from loom import _loom
from loom.nn import _placement
from loom.nn import modules as _modules
from loom.nn import tensor_parallel as _tensor_parallel

_pl = _loom.pipeline

Action = _pl.Action
ChunkPlace = _pl.ChunkPlace
Schedule = _pl.Schedule
RankStats = _pl.RankStats
Simulation = _pl.Simulation
StageChunk = _pl.StageChunk
GradientSum = _pl.GradientSum
TimedAction = _pl.TimedAction
PipelineExecutor = _pl.PipelineExecutor
ChromeTrace = _pl.ChromeTrace

schedule = _pl.schedule
parse_schedule = _pl.parse_schedule
read_schedule = _pl.read_schedule
format_schedule = _pl.format_schedule
check_well_formed = _pl.check_well_formed
validate = _pl.validate
receive_posts = _pl.receive_posts
stage_costs = _pl.stage_costs
replica_pairs = _pl.replica_pairs
gather_timelines = _pl.gather_timelines
measured_bubbles = _pl.measured_bubbles

SCHEDULES = ("gpipe", "1f1b", "interleaved", "chimera")

__all__ = [
    "Action", "ChunkPlace", "Schedule", "RankStats", "Simulation", "StageChunk", "GradientSum",
    "TimedAction", "PipelineExecutor", "ChromeTrace", "GPTStage", "StageSet", "SCHEDULES",
    "schedule", "parse_schedule", "read_schedule", "format_schedule", "check_well_formed",
    "validate", "receive_posts", "stage_layers", "stage_costs", "replica_pairs", "stage_chunk",
    "sync_tied_embedding", "embedding_group", "gather_timelines", "measured_bubbles",
    "counted_in_norm", "clip_grad_norm_",
]


def write_schedule(s, path):
    """Writes the text form of ``s`` to ``path`` (read_schedule reads it back)."""
    with open(path, "w") as f:
        f.write(format_schedule(s))


def stage_layers(config_or_layers, stage, stages):
    """(first, count): the blocks of ``stage`` of ``stages``. With a GPTConfig, the cost-balanced
    partition GPTStage uses (Note [Stage partition]); with a number of layers, the even split."""
    return _pl.stage_layers(config_or_layers, stage, stages)


def _cpp_stage(stage):
    cpp = getattr(stage, "_cpp", stage)
    if not isinstance(cpp, _pl.GptStage):
        raise TypeError(f"expected a pipelining.GPTStage, got {type(stage).__name__}")
    return cpp


class GPTStage(_modules._CppModule):
    """One pipeline stage of a GPT: blocks ``stage_layers(config, stage, stages)``, plus wte, wpe
    and dropout on the first stage and ln_f and the tied head (its own copy of wte) on the last.

    Parameter names are the single-process GPT's (``blocks.5.attn.qkv.weight``), so
    ``init_parameters(seed)`` gives each stage loom.nn.GPT(config).init_parameters(seed)'s values.
    ``forward``: token ids [B, T] (first stage) or hidden [B, T, C] -> hidden, or the logits on
    the last stage; ``loss(logits, targets)`` on the last stage. ``tp``: a tensor-parallel group
    (Megatron blocks, vocab-parallel wte and loss); ``sequence_parallel`` needs one.
    ``checkpoint``: activation checkpointing of every block, each recomputed in its
    micro-batch's backward (the same results, bit for bit).

    Example::

        >>> config = loom.nn.GPTConfig(max_seq_len=8, vocab=32, layers=4, heads=2, channels=16)
        >>> last = pipelining.GPTStage(config, 1, 2).init_parameters(seed=1)
        >>> [n for n, _ in last.named_parameters()][:2]
        ['wte.weight', 'blocks.2.ln1.weight']
    """

    def __init__(self, config, stage, stages, *, dropout=0.0, tp=None, sequence_parallel=False,
                 checkpoint=False, seed=0, pipeline=0):
        super().__init__(
            _pl.GptStage(config, stage, stages, dropout, tp, sequence_parallel, checkpoint),
            init_seed=seed)
        # For loom.nn.utils.clip_grad_norm_ (Note [One clip_grad_norm_]): this stage's place
        # (``pipeline``: the ChunkPlace's, 1 for Chimera's second pipeline) and tp group.
        object.__setattr__(self, "_place", (stage, stages, pipeline, tp))
        _placement.register(self)

    def _norm_placements(self):
        stage, stages, pipeline, tp = self.__dict__["_place"]
        return _tensor_parallel.tp_placements(
            self, tp, counted=lambda name: _counted(pipeline, stage, name),
            pipeline_stages=stages)

    @property
    def config(self):
        return self._cpp.config

    @property
    def is_first(self):
        return self._cpp.is_first

    @property
    def is_last(self):
        return self._cpp.is_last

    @property
    def wte_weight(self):
        """wte's weight (this rank's vocabulary rows with tp); None on a middle stage."""
        return self._cpp.wte_weight

    def activation_shape(self, rows, seq):
        """The activation one micro-batch of ``rows`` sequences passes to the next stage."""
        return self._cpp.activation_shape(rows, seq)

    def loss(self, logits, targets):
        """The last stage: mean cross-entropy of its logits over the first ``vocab`` columns."""
        return self._cpp.loss(logits, targets)


class StageSet(_modules._CppModule):
    """A rank's stages under one module (child k is ``chunk{k}``), for wrappers that take one
    module (ZeRO): names stay unique when two chunks hold the same single-process parameter."""

    def __init__(self, stages=()):
        super().__init__(_pl.StageSet(), init_seed=None)
        for s in stages:
            self.add(s)

    def add(self, stage):
        self._cpp.add(_cpp_stage(stage))

    def init_parameters(self, seed, _prefix=""):
        """Initialises each stage under its single-process names (as GPTStage.init_parameters),
        not under "chunk{k}."."""
        for _, stage in self._cpp.children():
            stage.full_name = ""
            stage.init_parameters(seed)
        return self


_modules._WRAPPERS[_pl.GptStage] = GPTStage


def stage_chunk(stage, replica_pair=None, dp_average=None):
    """The executor's StageChunk of a GPTStage, all in C++: its forward and loss, and at SYNC the
    gradient sum over ``replica_pair`` (Chimera; See replica_pairs) then the average over
    ``dp_average`` (data parallelism); None skips either. wte is left out of both (See
    sync_tied_embedding)."""
    return _pl.stage_chunk(_cpp_stage(stage), replica_pair, dp_average)


def sync_tied_embedding(stages, group=None):
    """Sums the gradients of every copy of wte.weight among ``stages`` (this rank's GPTStages)
    and over ``group`` (See embedding_group); every copy gets the sum. Collective over group."""
    return _pl.sync_tied_embedding([_cpp_stage(s) for s in stages], group)


def embedding_group(schedule, pp_group):
    """The group of the ranks holding pipeline 0's first and last stages (the tied wte's
    copies), or None on the other ranks and when one rank holds both. Collective over pp_group
    (every rank must call it), as loom-gpt's PipelineStep builds it."""
    return _pl.embedding_group(schedule, pp_group)


def _counted(pipeline, stage, name):
    """Whether this copy of a parameter counts in the global gradient norm: pipeline 0's
    (Chimera's second pipeline holds replicas) and, of the tied wte, the first stage's."""
    return pipeline == 0 and (name != "wte.weight" or stage == 0)


def _counts_in_norm(place, name):
    return _counted(place.pipeline, place.stage, name)


def counted_in_norm(stages, places):
    """The names ("chunk{k}.{name}", k in this rank's chunk order) of the parameters of
    ``stages`` (this rank's GPTStages at ``places``, the schedule's chunks of this rank) that the
    global gradient norm counts: each parameter of the model once. ZeroRedundancyOptimizer's
    ``counted_in_norm`` takes this set."""
    return {f"chunk{k}.{name}" for k, (place, stage) in enumerate(zip(places, stages))
            for name, _ in stage.named_parameters() if _counts_in_norm(place, name)}


def clip_grad_norm_(stages, places, max_norm, pp_group, tp_group=None):
    """Scales the gradients of this rank's pipeline stages so the model's global L2 norm is at
    most ``max_norm``, as one process's loom.nn.utils.clip_grad_norm_ over the whole model;
    returns that norm (a float, the same on every rank). Each parameter counts once: the tied
    wte's copies and Chimera's replicas by their first copy, a tensor-parallel shard by the sum
    over ``tp_group``. Call it after the step's gradients are final (sync_tied_embedding and the
    data-parallel average done). Collective over pp_group (and tp_group). Not for ZeRO, whose
    ZeroRedundancyOptimizer.clip_grad_norm_ clips its shards."""
    from loom.nn import utils as _utils

    params, placed = [], []
    for place, stage in zip(places, stages):
        cpp = stage._cpp_module()
        for name, p in stage.named_parameters():
            shard = tp_group is not None and cpp._parameter_is_shard(name)
            params.append(p)
            placed.append(_placement.Placement(shard_group=tp_group if shard else None,
                                               counted=_counts_in_norm(place, name)))
    return _utils.clip_placed(params, placed, max_norm, pp_group)
