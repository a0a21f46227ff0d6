"""loom.nn.utils: gradient clipping (over loom::optim::clip_grad_norm and its two halves).

Note [One clip_grad_norm_]
``clip_grad_norm_(model.parameters(), max_norm)`` returns the single process's norm in every
layout, as torch's does over DTensors: the layers and wrappers that place parameters on several
ranks say where each gradient lives (loom/nn/_placement.py), and the norm adds each part once.
- plain parameters: one process, or DDP after ``finish()`` (every rank holds the average);
- tensor-parallel shards (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding,
  TensorParallelGPT, a GPTStage with ``tp``, also inside a model written in Python): their
  squares add over their tp group, whole parameters count once;
- pipeline stages (GPTStage): the stages' squares add over ``pp_group``, which the caller passes
  (torchtitan passes its pp mesh the same way); the last stage's copy of the tied wte and Chimera's
  second pipeline are clipped but not counted twice;
- a ZeroRedundancyOptimizer's module: the optimizer's own clip (its shards hold the gradients).
Every rank of those groups must call it (it communicates) with its corresponding parameters.
"""

import math

from loom import _loom
from loom.nn import _placement


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, *, pp_group=None):
    """Scales the gradients in place so their global L2 norm is at most ``max_norm``, as
    torch.nn.utils.clip_grad_norm_; returns the norm before clipping (a 0-d float32 tensor).
    Parameters without a gradient count for nothing. Only ``norm_type=2`` is supported.

    The norm is the single process's in every layout (Note [One clip_grad_norm_]): DDP, ZeRO,
    tensor-parallel shards, and pipeline stages, for which ``pp_group`` (the pipeline group) must
    be given. Collective over the groups the parameters live on.

        >>> loss.backward()
        >>> loom.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        >>> loom.nn.utils.clip_grad_norm_(stage_params, 1.0, pp_group=mesh.pp_group)
    """
    if float(norm_type) != 2.0:
        raise ValueError(f"clip_grad_norm_: only norm_type=2 is supported, got {norm_type}")
    if isinstance(parameters, _loom.Tensor):
        parameters = [parameters]
    params = list(parameters)
    places = _placement.placements(params)
    zeros = {id(p.zero): p.zero for p in places if p is not None and p.zero is not None}
    if zeros:
        if len(zeros) > 1 or any(p is None or p.zero is None for p in places):
            raise ValueError("clip_grad_norm_: the parameters mix a ZeroRedundancyOptimizer's "
                             "with others; pass the parameters of the module it wraps (its "
                             "gradients live in its shards)")
        return _loom.tensor(next(iter(zeros.values())).clip_grad_norm_(max_norm))
    if pp_group is None and all(p is None for p in places):
        return _loom.tensor(_loom.optim.clip_grad_norm(params, float(max_norm)))
    staged = max((p.pipeline_stages for p in places if p is not None), default=0)
    if staged > 1 and pp_group is None:
        raise ValueError(f"clip_grad_norm_: these are a pipeline stage's parameters (a GPTStage "
                         f"of {staged} stages): pass pp_group=, the pipeline group, so that every "
                         f"stage's part of the norm is added")
    return _loom.tensor(clip_placed(params, places, max_norm, pp_group))


def clip_placed(params, places, max_norm, pp_group=None):
    """clip_grad_norm_'s arithmetic for parameters whose Placements (or None: plain) are given:
    a shard's squares add over its tp group, copies not counted add nothing, the total adds over
    pp_group (when given); every gradient is clipped. Returns the norm (a float). Collective."""
    groups = {id(p.shard_group): p.shard_group for p in places
              if p is not None and p.shard_group is not None}
    if len(groups) > 1:
        raise ValueError("clip_grad_norm_: the parameters are shards over two different tensor-"
                         "parallel groups; clip each model separately")
    sharded = [t for t, p in zip(params, places)
               if p is not None and p.counted and p.shard_group is not None]
    whole = [t for t, p in zip(params, places)
             if p is None or (p.counted and p.shard_group is None)]
    total = grad_sum_of_squares(sharded)
    if groups:
        part = _loom.full([1], total)
        next(iter(groups.values())).allreduce(part)
        total = part.item()
    total += grad_sum_of_squares(whole)
    if pp_group is not None:
        part = _loom.full([1], total)
        pp_group.allreduce(part)
        total = part.item()
    norm = math.sqrt(total)
    clip_grads_to_norm_(params, norm, max_norm)
    return norm


def grad_sum_of_squares(parameters):
    """The sum of the squares of the parameters' gradients (a float): one rank's part of a
    global gradient norm when parameters are spread over ranks (pipeline stages, tensor-parallel
    shards). Add the parts over the ranks, take the root, then ``clip_grads_to_norm_``."""
    if isinstance(parameters, _loom.Tensor):
        parameters = [parameters]
    return _loom.optim.grad_sum_of_squares(list(parameters))


def clip_grads_to_norm_(parameters, norm, max_norm):
    """Scales the gradients in place by max_norm / norm when ``norm`` (the global norm, computed
    over every rank) exceeds ``max_norm``: clip_grad_norm_'s second half."""
    if isinstance(parameters, _loom.Tensor):
        parameters = [parameters]
    _loom.optim.scale_grads_to_norm(list(parameters), float(norm), float(max_norm))


def moe_begin_batch(model, parts, record=True):
    """Readies every loom.nn.MoE in ``model`` for a batch in ``parts`` micro-batches (MoE's
    ``begin_batch``); returns how many it found. Gradient accumulation with MoE layers whose
    load-balancing loss is the whole batch's, as one process computes it. Each micro-batch's
    ``aux_loss`` is then its share of the whole batch's losses: add it as it is, not divided by
    the micro-batch count as a mean cross-entropy is:

        >>> moes = [m for m in model.modules() if isinstance(m, loom.nn.MoE)]
        >>> loom.nn.utils.moe_begin_batch(model, k)
        >>> with loom.no_grad():                    # the routing pass
        ...     for x, y in micro_batches: model(x)
        >>> for x, y in micro_batches:              # for real
        ...     loss = F.cross_entropy(model(x), y) / k + sum(m.aux_loss for m in moes)
        ...     loss.backward()
    """
    from loom.nn.modules import MoE
    found = 0
    for m in model.modules():
        if isinstance(m, MoE):
            m.begin_batch(parts, record)
            found += 1
    return found
