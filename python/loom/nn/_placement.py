"""Where a parameter's gradient lives across ranks, for loom.nn.utils.clip_grad_norm_ (See Note
[One clip_grad_norm_] in loom/nn/utils.py).

A parallel wrapper or layer that owns parameters registers itself as a *provider*: an object with
``_norm_placements()`` returning {tensor identity: Placement} for its parameters (Tensor._identity:
which tensor, whether or not its memory is there, as a ZeRO-3 parameter's between uses), computed
when asked, so parameters replaced later are seen as they are.
Providers are held weakly: a model that is gone stops answering. Parameters no provider names
are plain: a single process's, or DDP's after ``finish()`` (every rank holds the average).
"""

import weakref
from dataclasses import dataclass
from typing import Any, Optional

_providers = weakref.WeakSet()


@dataclass(frozen=True)
class Placement:
    # A tensor-parallel shard: its squares add over this group; None: whole on every tp rank.
    shard_group: Optional[Any] = None
    # A pipeline stage's parameter: the stages' squares add over the pipeline group the caller
    # names (a stage does not know its group); stages is the pipeline's stage count.
    pipeline_stages: int = 0
    # False for a copy another one already counts (the last stage's tied wte, Chimera's second
    # pipeline): it is clipped but adds nothing to the norm.
    counted: bool = True
    # The ZeroRedundancyOptimizer whose shards hold this parameter's gradient.
    zero: Optional[Any] = None


def register(provider):
    _providers.add(provider)


def placements(parameters):
    """[Placement or None] for each parameter."""
    known = {}
    # A ZeroRedundancyOptimizer's answer overrides the layers' (its module may be a pipeline's
    # stages or a tp model): its shards, not the parameters' .grad, hold the gradients.
    for provider in sorted(_providers, key=lambda p: getattr(p, "_norm_priority", 0)):
        known.update(provider._norm_placements())
    return [known.get(p._identity()) for p in parameters]
