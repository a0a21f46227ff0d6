"""Tensor parallelism (Megatron-LM's layout) as loom.nn modules over a tp group (a
loom.distributed.Communicator, e.g. ``DeviceMesh(tp=2).tp_group``). Every weight is the
single-process parameter's slice, under the same name, so ``init_parameters(seed)`` gives each
rank exactly its part of the single-process initialisation, and
``loom.distributed.gather_full_state`` / ``load_full_state`` convert to and from the
single-process layout.

- ``ColumnParallelLinear``: W's output rows split over tp; [..., in] -> [..., out / tp] (or
  [..., out] with gather_output).
- ``RowParallelLinear``: W's input columns split; [..., in / tp] -> [..., out] summed over tp.
- ``VocabParallelEmbedding``: the table's rows split; the lookup is the same on every rank.
- ``TensorParallelGPT``: GPT-2 split over tp, with ``loss`` (no logits gather) and ``logits``.
- ``vocab_parallel_cross_entropy``: the loss of vocabulary-split logits.

Every rank of the group must build and call them with the same arguments (they communicate).
"""

from loom import _loom
from loom.nn import _placement
from loom.nn.modules import _WRAPPERS, _CppModule

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding",
           "TensorParallelGPT", "vocab_parallel_cross_entropy"]

_tp = _loom.parallel


def _group(group, owner):
    from loom.distributed import Communicator

    if not isinstance(group, Communicator):
        raise TypeError(f"{owner}: group must be a loom.distributed.Communicator (the tp group), "
                        f"got {type(group).__name__}")
    return group


def tp_placements(module, group, counted=None, pipeline_stages=0):
    """{identity: Placement} of a built-in module's parameters for clip_grad_norm_: a shard (the
    C++ module says which) adds its squares over ``group`` (None: no tp); ``counted(name)``
    (default: every one) and ``pipeline_stages`` as in loom/nn/_placement.py."""
    cpp = module._cpp
    out = {}
    for name, p in module.named_parameters():
        shard = group is not None and cpp._parameter_is_shard(name)
        out[p._identity()] = _placement.Placement(
            shard_group=group if shard else None, pipeline_stages=pipeline_stages,
            counted=True if counted is None else counted(name))
    return out


class _TensorParallel(_CppModule):
    """A built-in module whose parameters may be shards over a tp group: it tells
    loom.nn.utils.clip_grad_norm_ which (Note [One clip_grad_norm_])."""

    def _place_over(self, group):
        object.__setattr__(self, "_tp_group", group)
        _placement.register(self)

    def _norm_placements(self):
        return tp_placements(self, self.__dict__["_tp_group"])


class ColumnParallelLinear(_TensorParallel):
    """y = x W^T + b with W [out_features, in_features]'s output rows split over ``group``: rank
    r computes features [r out/tp, (r+1) out/tp) (weight [out/tp, in], bias [out/tp]). The input
    is replicated (its gradient is summed over tp) or, with sequence_parallel, split along dim 1
    and all-gathered. ``blocks``: the full weight's rows are that many equal blocks, each split
    (a fused qkv: 3).

    Example::

        tp = loom.distributed.DeviceMesh(tp=2).tp_group
        fc = loom.nn.ColumnParallelLinear(32, 128, tp)         # weight [64, 32] per rank
        proj = loom.nn.RowParallelLinear(128, 32, tp)          # weight [32, 64] per rank
        y = proj(loom.nn.functional.gelu(fc(x)))              # == the single-process MLP
    """

    def __init__(self, in_features, out_features, group, bias=True, *, gather_output=False,
                 sequence_parallel=False, blocks=1, init_std=0.02):
        super().__init__(_tp.ColumnParallelLinear(
            in_features, out_features, _group(group, "ColumnParallelLinear"), bias, init_std,
            gather_output, sequence_parallel, blocks))
        self._place_over(group)


class RowParallelLinear(_TensorParallel):
    """y = x W^T + b with W's input columns split over ``group``: takes this rank's input
    features [..., in/tp] (weight [out, in/tp]); the partial products are summed over tp
    (allreduce, or with sequence_parallel a reduce-scatter along dim 1); the whole bias is added
    once after the sum."""

    def __init__(self, in_features, out_features, group, bias=True, *, sequence_parallel=False,
                 init_std=0.02):
        super().__init__(_tp.RowParallelLinear(
            in_features, out_features, _group(group, "RowParallelLinear"), bias, init_std,
            sequence_parallel))
        self._place_over(group)


class VocabParallelEmbedding(_TensorParallel):
    """An embedding table whose rows are split over ``group`` (num_embeddings a multiple of its
    size): rank r owns rows [r n/tp, (r+1) n/tp); forward(indices) of full row ids is the
    single-process lookup, the same on every rank."""

    def __init__(self, num_embeddings, embedding_dim, group, *, init_std=0.02):
        super().__init__(_tp.VocabParallelEmbedding(
            num_embeddings, embedding_dim, _group(group, "VocabParallelEmbedding"), init_std))
        self._place_over(group)

    @property
    def rows_per_rank(self):
        return self._cpp.rows_per_rank

    @property
    def first_row(self):
        return self._cpp.first_row


class TensorParallelGPT(_TensorParallel):
    """GPT-2 split over a tensor-parallel ``group`` (Megatron-LM's layout) with loom.nn.GPT's
    parameter names; each sharded parameter is a slice of the single-process one, so the same
    ``seed`` gives the single-process model, split. heads, channels and 4 * channels must
    divide by the group size; with ``sequence_parallel`` the sequence length must too.

    ``forward(idx)`` returns this rank's vocabulary columns of the logits [B, T, wte_rows / tp];
    ``logits(idx)`` the whole logits [B, T, padded_vocab] (gathered, as loom.nn.GPT's forward);
    ``loss(idx, targets)`` the single-process mean cross-entropy without gathering the logits.
    ``checkpoint``: activation checkpointing of every block (recomputed in backward, its tp
    collectives too), as loom.nn.GPT's: the same results, bit for bit.

    Example::

        mesh = loom.distributed.DeviceMesh(tp=2)               # mpirun -np 2
        model = loom.nn.TensorParallelGPT(config, mesh.tp_group, seed=1337)
        loss = model.loss(idx, targets)                        # same on every rank
        loss.backward()
        loom.nn.utils.clip_grad_norm_(model.parameters(), 1.0)   # the single-process norm
        full = loom.distributed.gather_full_state(model, mesh.tp_group)   # loom.nn.GPT's layout
    """

    def __init__(self, config, group, *, dropout=0.0, sequence_parallel=False, checkpoint=False,
                 seed=0):
        self_group = _group(group, "TensorParallelGPT")
        super().__init__(_tp.TpGPT(config, self_group, dropout, sequence_parallel, checkpoint),
                         init_seed=seed)
        object.__setattr__(self, "_group", self_group)
        self._place_over(self_group)

    @property
    def config(self):
        return self._cpp.config

    @property
    def group(self):
        return self.__dict__["_group"]

    @property
    def wte_rows(self):
        """Rows of the full wte: padded_vocab rounded up to a multiple of the tp size."""
        return self._cpp.wte_rows

    def loss(self, idx, targets):
        """Mean next-token cross-entropy against targets [B, T] (-100 ignored), as
        loom.nn.GPT.loss; the same scalar on every rank of the group."""
        return self._cpp.loss(idx, targets)

    def logits(self, idx):
        """The whole logits [B, T, padded_vocab], as loom.nn.GPT's forward (gathered over tp)."""
        return self._cpp.logits(idx)


def vocab_parallel_cross_entropy(logits, targets, group, vocab, ignore_index=-100):
    """Cross-entropy of logits split by vocabulary over ``group`` without gathering them.

    logits [N, V_local]: this rank's columns [rank * V_local, (rank + 1) * V_local) of the full
    logits; targets [N] full-vocabulary ids in [0, vocab) or ignore_index; columns >= vocab are
    not classes. Returns the mean over counted rows of -log softmax(full row)[target] (f32
    scalar), the same on every rank: F.cross_entropy of the full logits. Collective over group.
    """
    return _tp.vocab_parallel_cross_entropy(
        logits, targets, _group(group, "vocab_parallel_cross_entropy"), int(vocab),
        int(ignore_index))


_WRAPPERS.update({
    _tp.ColumnParallelLinear: ColumnParallelLinear, _tp.RowParallelLinear: RowParallelLinear,
    _tp.VocabParallelEmbedding: VocabParallelEmbedding, _tp.TpGPT: TensorParallelGPT,
})
