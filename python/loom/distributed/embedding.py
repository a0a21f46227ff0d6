"""loom.distributed.ShardedEmbeddingBagCollection: embedding tables spread over a group
(parallel/sharded_embedding.h; TorchRec's table-, row-, column-wise and data-parallel sharding).

Every rank gives its own B bags per table (CSR, feature-major, as loom.nn.EmbeddingBagCollection
takes them) and gets back [B, total_dim]: what one EmbeddingBagCollection with the same tables
gives for those bags. lookup() and its backward are collectives: every rank calls them in the
same order. Example (under ``mpirun -np 2``)::

    import loom, loom.distributed as dist
    from loom.distributed import ShardedEmbeddingBagCollection

    world = dist.world()
    tables = [("t0", 1000, 16), ("t1", 50, 16)]
    ebc = ShardedEmbeddingBagCollection(tables, ["row", "data"], world)
    ebc.init_parameters(seed=1)           # each shard: its slice of the single-process init
    pooled = ebc(indices, offsets)        # [B, 32], this rank's bags
    loss.backward()                       # loss: the mean over this rank's batch
    ebc.finish_gradients()                # averages the data-parallel tables' gradients
    opt.step()

Placements: one per table, each 'table' (whole, on the rank given as ('table', rank) or chosen by
a greedy balance), 'row', 'column', 'data' (replicated), or an EmbeddingPlacement.
``placements_for(sharding, rows)`` gives loom-dlrm's --sharding choices, 'auto' included.
"""

from loom import _loom
from loom.nn.modules import _CppModule

_d = _loom.distributed
EmbeddingSharding = _d.EmbeddingSharding
EmbeddingPlacement = _d.EmbeddingPlacement
EmbeddingShard = _d.EmbeddingShard

__all__ = [
    "ShardedEmbeddingBagCollection", "EmbeddingSharding", "EmbeddingPlacement", "EmbeddingShard",
    "placements_for", "AUTO_REPLICATE_BELOW",
]

# loom-dlrm's --sharding rule (parallel::embedding_placements): one placement name per table.
placements_for = _d.placements_for
AUTO_REPLICATE_BELOW = _d.AUTO_REPLICATE_BELOW


class ShardedEmbeddingBagCollection(_CppModule):
    """Embedding-bag tables sharded over ``group`` (a loom.distributed.Communicator).

    ``tables``: (name, rows, dim) per table (dim a multiple of 4); ``placements``: one per table
    (see the module docstring); ``pooling``: 'sum' or 'mean'. Parameters are this rank's shards
    and replicated tables, named as loom's C++ module names them; ``init_parameters(seed)``
    gives each shard its slice of what a single-process EmbeddingBagCollection gets.
    """

    def __init__(self, tables, placements, group=None, pooling="sum"):
        if group is None:
            group = _d.world()
        super().__init__(_d.ShardedEmbeddingBagCollection(list(tables), list(placements), group,
                                                          pooling))
        object.__setattr__(self, "_group", group)  # the C++ module holds it too

    def forward(self, indices, offsets, per_sample_weights=None):
        """Collective. indices / offsets: this rank's bags -> [B, total_dim]."""
        return self._cpp.lookup(indices, offsets, per_sample_weights)

    lookup = forward

    def finish_gradients(self):
        """After backward, before the optimizer step: averages the data-parallel tables'
        gradients over the group. Collective; nothing to do without data-parallel tables."""
        self._cpp.finish_gradients()

    @property
    def group(self):
        return self._group

    @property
    def tables(self):
        return self._cpp.tables

    @property
    def placements(self):
        """The placements, every 'table' owner resolved."""
        return self._cpp.placements

    @property
    def shards(self):
        """Every rank's non-empty shards, in table order."""
        return self._cpp.shards

    def _to(self, dtype, device):
        if dtype is not None or device is not None:
            raise ValueError("ShardedEmbeddingBagCollection: tables stay f32 on the CPU")

    def extra_repr(self):
        return ", ".join(f"{name}: {p.kind.name}" for (name, _, _), p in zip(self.tables,
                                                                        self.placements))
