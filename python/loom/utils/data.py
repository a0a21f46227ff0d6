"""loom.utils.data: torch.utils.data for loom tensors (datasets, samplers, DataLoader,
DistributedSampler), plus a token-window dataset and a held-out split for token files.

A PyTorch data pipeline carries over by renaming ``torch`` to ``loom``::

    import loom
    from loom.utils.data import DataLoader, DistributedSampler, TensorDataset

    ds = TensorDataset(x, y)                                  # x: [N, D] f32, y: [N] i64
    loader = DataLoader(ds, batch_size=32, shuffle=True, seed=1234)
    for epoch in range(3):
        for xb, yb in loader:                                 # a new order every epoch
            ...

    # Under mpirun with DDP, b rows per rank (see Note [Distributed batches]):
    sampler = DistributedSampler(ds, seed=1234)               # rank and world from loom.distributed
    loader = DataLoader(ds, batch_size=b, sampler=sampler)

Token files (llm.c ``.bin``, read with loom.data.read_token_file)::

    tokens = loom.data.read_token_file("train.bin")           # 1-D i32
    train, heldout = split_tokens(tokens, 0.1)                # the last 10% held out
    loader = DataLoader(TokenDataset(train, seq=64), batch_size=8, shuffle=True, seed=0)
    for x, y in loader:                                       # i32 [8, 64] each, y = x shifted
        loss = model.loss(x, y)

Note [Shuffled orders]
A shuffled pass visits a permutation of the indices that is a pure function of (seed, epoch): the
i-th key is SplitMix64 of a counter derived from (seed, epoch, i), and the order sorts the keys
(all keys differ, so no tie is broken by the sort), the counter-based idea of loom's RNG (Note
[The Python generator], python/src/creation_ops.cpp). So the same seed gives the same order in
every process, on every machine, and a DistributedSampler's ranks agree without communicating.
- With a ``seed`` (DataLoader(seed=...), RandomSampler(seed=...), DistributedSampler(seed=...)),
  pass e of the sampler uses epoch e: each ``iter()`` takes the current epoch and moves it on by
  one, and ``set_epoch(e)`` sets the epoch of the next pass. A PyTorch script that calls
  ``set_epoch(epoch)`` before each epoch therefore gets epochs 0, 1, 2, ...; so does one that
  forgets it (PyTorch's DistributedSampler would then repeat epoch 0's order).
- Without one (``seed=None``, the default of DataLoader and RandomSampler), each pass draws its
  seed from loom's global generator (one ``loom.randint`` call per pass), so ``loom.manual_seed``
  makes the run reproducible and consecutive passes differ, as PyTorch's global generator does.
The orders are not PyTorch's (different generators), so a shuffled loom run and a shuffled
PyTorch run see the same examples in different orders; unshuffled runs see the same batches.

Note [Distributed batches]
Equivalence principle (DESIGN.md): with W ranks of b rows each, the ranks' batches at step s are
together exactly the global batch of W*b rows that one process takes at step s, rank r holding
rows [r*b, (r+1)*b) of it, so the mean of the ranks' mean losses is the single-process mean and
DDP's dropout batch parts (part r of W, python/loom/nn/_dropout.py) draw the single-process masks.
The single-process run is ``DataLoader(ds, batch_size=W*b, shuffle=True, seed=S)``; on each rank
``DataLoader(ds, batch_size=b, sampler=DistributedSampler(ds, seed=S))``. For that the sampler
must know b: the DataLoader (through its BatchSampler) gives it its batch_size, or pass
``DistributedSampler(..., batch_size=b)`` yourself. PyTorch's DistributedSampler deals indices
round-robin (rank r takes r::W), which is the right set of rows but not this layout; it is the
layout of b = 1, which is what a sampler iterated alone with no batch_size gives.
With gradient accumulation over k micro-batches of m rows, give the sampler batch_size=k*m (rows
per rank per optimizer step) and the DataLoader batch_size=m: micro-batch j of rank r is then part
r*k + j of W*k, the order DDP's dropout parts use.
The tail: with n rows and t = n mod (W*b) > 0, the last step has t rows in one process. As
PyTorch's sampler, the distributed one gives every rank ceil(n/W) rows (the epoch's first indices
repeated as padding), or floor(n/W) with drop_last=True (the last n mod W rows of the order left
out); each rank's last batch then has ceil(t/W) (floor(t/W)) rows, rank r's rows being its
contiguous slice of the (padded) tail. That is the single-process last batch exactly when W
divides t; otherwise use ``drop_last=True`` on both DataLoaders (every rank and the single process
then skip the partial step: a sampler given to a DataLoader with drop_last=True yields only the
whole global batches, even where padding would have filled each rank's last batch) or choose n so
that the tail divides.

Where loom differs from PyTorch:
- Python floats and float64 numpy arrays collate to float32 (loom has no float64). ints are
  int64 and bools bool, as in PyTorch.
- ``num_workers > 0`` is accepted with a warning and loads in this process: the batches are the
  same, only not prefetched. ``worker_init_fn`` is refused (it would never run). ``generator=``
  is refused (loom has no Generator objects): pass ``seed=``. ``pin_memory`` has no effect.
- A sampler with a seed moves to the next epoch on each pass by itself (Note [Shuffled orders]).
- DistributedSampler lays out contiguous per-rank batches (Note [Distributed batches]); given to
  a DataLoader with drop_last=True it leaves out the whole partial last global step, so its len is
  then batch_size times the number of whole global batches.
"""

import bisect
import collections.abc
import itertools
import math
import numbers
import operator
import warnings

import numpy as np

import loom

__all__ = [
    "Dataset", "IterableDataset", "TensorDataset", "ConcatDataset", "ChainDataset", "Subset",
    "random_split", "Sampler", "SequentialSampler", "RandomSampler", "SubsetRandomSampler",
    "BatchSampler", "DistributedSampler", "DataLoader", "default_collate", "default_convert",
    "get_worker_info", "TokenDataset", "split_tokens",
]

# ---------------------------------------------------------------- orders (Note [Shuffled orders])

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # 2^64 / golden ratio, odd: i -> i * _GOLDEN is a bijection mod 2^64
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _mix(z):
    """SplitMix64's finaliser (a bijection of 64-bit integers) on a Python int."""
    z &= _MASK
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK
    return z ^ (z >> 31)


def _mix_array(z):
    """_mix on a uint64 array (numpy's uint64 products wrap mod 2^64)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX2)
    return z ^ (z >> np.uint64(31))


def _keys(n, seed, epoch, stream=0):
    """n distinct 64-bit keys, key i a pure function of (seed, epoch, stream, i): SplitMix64 of
    distinct counters base + (i + 1) * _GOLDEN."""
    base = _mix(_mix(_mix(seed) + (epoch & _MASK) * _GOLDEN) + (stream & _MASK) * _GOLDEN)
    with np.errstate(over="ignore"):
        counters = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(_GOLDEN) + np.uint64(base)
        return _mix_array(counters)


def _permutation(n, seed, epoch, stream=0):
    """A permutation of 0..n-1 (int64 array) from (seed, epoch, stream)."""
    return np.argsort(_keys(n, seed, epoch, stream), kind="stable")


def _seed_from_global_generator():
    """A 48-bit seed drawn from loom's global generator (loom.manual_seed): one randint call."""
    hi, lo = loom.randint(0, 1 << 24, (2,)).tolist()
    return (int(hi) << 24) | int(lo)


def _check_int(value, owner, name, minimum=None):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{owner}: {name} must be an int, got {type(value).__name__}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{owner}: {name} must be >= {minimum}, got {value}")
    return value


def _check_bool(value, owner, name):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{owner}: {name} must be a bool, got {type(value).__name__}")
    return bool(value)


def _check_seed(seed, owner, allow_none=True):
    if seed is None and allow_none:
        return None
    return _check_int(seed, owner, "seed")


def _refuse_generator(generator, owner):
    if generator is not None:
        raise TypeError(f"{owner}: loom has no Generator objects; pass seed=INT for a fixed "
                        "sequence of orders (one per epoch), or leave seed=None to draw from "
                        "loom's global generator (loom.manual_seed)")


class _EpochSeed:
    """The (seed, epoch) of each pass: a fixed seed with an epoch that moves on by one per pass
    (set_epoch sets the next pass's), or a fresh seed from loom's global generator per pass."""

    def __init__(self, seed):
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch):
        """The epoch of the next pass (Note [Shuffled orders] in loom/utils/data.py)."""
        self.epoch = _check_int(epoch, type(self).__name__, "epoch")

    def _next_pass(self):
        if self.seed is None:
            return _seed_from_global_generator(), 0
        epoch = self.epoch
        self.epoch = epoch + 1
        return self.seed, epoch


# ---------------------------------------------------------------- datasets


class Dataset:
    """A map-style dataset: ``ds[i]`` for i in range(len(ds)) (as torch.utils.data.Dataset).
    Subclasses define ``__getitem__`` and ``__len__``."""

    def __getitem__(self, index):
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__")

    def __add__(self, other):
        return ConcatDataset([self, other])


class IterableDataset(Dataset):
    """A dataset read as a stream: subclasses define ``__iter__`` (as
    torch.utils.data.IterableDataset). The DataLoader batches it in order; no sampler, no
    shuffle. Under DDP each rank's stream is the script's to split."""

    def __iter__(self):
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")

    def __add__(self, other):
        return ChainDataset([self, other])


class TensorDataset(Dataset):
    """Rows of tensors that share their first dimension: ``ds[i] == (t[i] for t in tensors)``.

    Example::

        ds = TensorDataset(loom.randn(100, 8), loom.randint(0, 4, (100,)))
        x, y = ds[3]          # x: f32 [8], y: i64 scalar
    """

    def __init__(self, *tensors):
        if not tensors:
            raise ValueError("TensorDataset: needs at least one tensor")
        sizes = [_first_dim(t, i) for i, t in enumerate(tensors)]
        if any(s != sizes[0] for s in sizes):
            raise ValueError(f"TensorDataset: the tensors' first dimensions differ: {sizes} (each "
                             "row i is one example across all tensors)")
        self.tensors = tensors

    def __getitem__(self, index):
        return tuple(t[index] for t in self.tensors)

    def __len__(self):
        return _first_dim(self.tensors[0], 0)


def _first_dim(t, i):
    shape = getattr(t, "shape", None)
    if shape is None or len(shape) == 0:
        raise ValueError(f"TensorDataset: tensor {i} must have a first dimension (the rows), got "
                         f"{'a 0-d tensor' if shape is not None else type(t).__name__}")
    return int(shape[0])


class ConcatDataset(Dataset):
    """The datasets one after another (as torch.utils.data.ConcatDataset)."""

    def __init__(self, datasets):
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("ConcatDataset: datasets should not be an empty iterable")
        for d in self.datasets:
            if isinstance(d, IterableDataset):
                raise TypeError("ConcatDataset: does not take an IterableDataset (use "
                                "ChainDataset)")
        self.cumulative_sizes = list(itertools.accumulate(len(d) for d in self.datasets))

    def __len__(self):
        return self.cumulative_sizes[-1]

    def __getitem__(self, index):
        index = operator.index(index)
        if index < 0:
            if -index > len(self):
                raise IndexError(f"ConcatDataset: index {index} out of range for length "
                                 f"{len(self)}")
            index += len(self)
        which = bisect.bisect_right(self.cumulative_sizes, index)
        if which == len(self.datasets):
            raise IndexError(f"ConcatDataset: index {index} out of range for length {len(self)}")
        start = self.cumulative_sizes[which - 1] if which > 0 else 0
        return self.datasets[which][index - start]


class ChainDataset(IterableDataset):
    """Iterable datasets one after another (as torch.utils.data.ChainDataset)."""

    def __init__(self, datasets):
        self.datasets = datasets

    def __iter__(self):
        for d in self.datasets:
            yield from d

    def __len__(self):
        return sum(len(d) for d in self.datasets)


class Subset(Dataset):
    """The rows ``indices`` of ``dataset``, in that order (as torch.utils.data.Subset)."""

    def __init__(self, dataset, indices):
        self.dataset = dataset
        self.indices = indices

    def __getitem__(self, idx):
        if isinstance(idx, list):
            return [self.dataset[self.indices[i]] for i in idx]
        return self.dataset[self.indices[idx]]

    def __len__(self):
        return len(self.indices)


def random_split(dataset, lengths, generator=None, *, seed=None):
    """Splits ``dataset`` into non-overlapping Subsets of the given lengths (ints summing to
    len(dataset), or fractions summing to 1; rounding leftovers go one each to the first
    subsets), as torch.utils.data.random_split. The order is a permutation from ``seed``, or with
    seed None from loom's global generator (Note [Shuffled orders]); not PyTorch's permutation.

    Example::

        train, val = random_split(ds, [0.9, 0.1], seed=0)
    """
    owner = "random_split"
    _refuse_generator(generator, owner)
    seed = _check_seed(seed, owner)
    n = len(dataset)
    lengths = list(lengths)
    if not lengths:
        raise ValueError(f"{owner}: lengths is empty")
    fractions = (all(isinstance(x, numbers.Real) and not isinstance(x, numbers.Integral)
                     for x in lengths) and math.isclose(sum(lengths), 1.0) and sum(lengths) <= 1)
    if fractions:
        if any(x < 0 or x > 1 for x in lengths):
            raise ValueError(f"{owner}: fractions must be in [0, 1], got {lengths}")
        sizes = [int(math.floor(n * f)) for f in lengths]
        for i in range(n - sum(sizes)):
            sizes[i % len(sizes)] += 1
        for i, s in enumerate(sizes):
            if s == 0:
                warnings.warn(f"{owner}: length of split at index {i} is 0; this split will be "
                              "empty", stacklevel=2)
    else:
        sizes = [_check_int(x, owner, "each length", minimum=0) for x in lengths]
        if sum(sizes) != n:
            raise ValueError(f"{owner}: the lengths sum to {sum(sizes)}, but the dataset has "
                             f"{n} rows (give ints summing to {n}, or fractions summing to 1)")
    order = _permutation(n, _seed_from_global_generator() if seed is None else seed, 0)
    bounds = list(itertools.accumulate(sizes))
    return [Subset(dataset, order[end - size:end].tolist()) for size, end in zip(sizes, bounds)]


# ---------------------------------------------------------------- token files


class TokenDataset(Dataset):
    """Next-token windows of a 1-D token stream: example i is ``(x, y)`` with
    ``x = tokens[i*stride : i*stride + seq]`` and ``y = tokens[i*stride + 1 : i*stride + seq + 1]``
    (views, in the tokens' dtype: i32 from loom.data.read_token_file, or i64). There are
    ``(len(tokens) - seq - 1) // stride + 1`` windows (0 when the stream is shorter than seq + 1),
    every one whole. ``stride`` defaults to ``seq`` (windows that do not overlap), so
    ``DataLoader(TokenDataset(tokens, T), batch_size=B, drop_last=True)`` yields exactly
    loom.data.BatchLoader(tokens, B, T)'s batches of one pass (Note [Batch order],
    core/io/batch_loader.h); with ``shuffle=True`` the windows come in a shuffled order.

    ``tokens``: a 1-D int32/int64 loom tensor, or a list / numpy array of ints (copied).
    """

    def __init__(self, tokens, seq, stride=None):
        owner = "TokenDataset"
        tokens = _token_tensor(tokens, owner)
        self.seq = _check_int(seq, owner, "seq", minimum=1)
        self.stride = self.seq if stride is None else _check_int(stride, owner, "stride",
                                                                  minimum=1)
        self.tokens = tokens
        n = int(tokens.shape[0])
        self._len = 0 if n < self.seq + 1 else (n - self.seq - 1) // self.stride + 1

    def __len__(self):
        return self._len

    def __getitem__(self, index):
        i = operator.index(index)
        if i < -self._len or i >= self._len:
            raise IndexError(f"TokenDataset: window {i} out of range for {self._len} windows")
        if i < 0:
            i += self._len
        start = i * self.stride
        return self.tokens.narrow(0, start, self.seq), self.tokens.narrow(0, start + 1, self.seq)

    def __repr__(self):
        return (f"TokenDataset({int(self.tokens.shape[0])} tokens, seq={self.seq}, "
                f"stride={self.stride}, {self._len} windows)")


def _token_tensor(tokens, owner):
    if not isinstance(tokens, loom.Tensor):
        tokens = loom.tensor(np.asarray(tokens))
    if tokens.dim() != 1:
        raise ValueError(f"{owner}: tokens must be a 1-D token stream, got shape "
                         f"{tuple(tokens.shape)}")
    if tokens.dtype not in (loom.int32, loom.int64):
        raise TypeError(f"{owner}: tokens must be int32 or int64, got {tokens.dtype}")
    return tokens


def split_tokens(tokens, heldout_fraction=0.1):
    """Splits a 1-D token stream into ``(train, heldout)``: heldout is the last
    ``round(len(tokens) * heldout_fraction)`` tokens, train the rest (both views, same dtype).
    A contiguous split, so no window of TokenDataset(train, ...) shares a token with one of
    TokenDataset(heldout, ...). For a separate validation file (llm.c's ``*_val.bin``) read it
    instead.

    Example::

        train, heldout = split_tokens(loom.data.read_token_file("tokens.bin"), 0.05)
    """
    owner = "split_tokens"
    tokens = _token_tensor(tokens, owner)
    if (isinstance(heldout_fraction, bool) or not isinstance(heldout_fraction, numbers.Real)
            or not 0.0 <= float(heldout_fraction) < 1.0):
        raise ValueError(f"{owner}: heldout_fraction must be a number in [0, 1), got "
                         f"{heldout_fraction!r}")
    n = int(tokens.shape[0])
    held = int(round(n * float(heldout_fraction)))
    return tokens.narrow(0, 0, n - held), tokens.narrow(0, n - held, held)


# ---------------------------------------------------------------- samplers


class Sampler:
    """Base class of index samplers: ``__iter__`` yields dataset indices (as
    torch.utils.data.Sampler); ``__len__`` is optional."""

    def __init__(self, data_source=None):
        pass

    def __iter__(self):
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")


class SequentialSampler(Sampler):
    """0, 1, ..., len(data_source) - 1."""

    def __init__(self, data_source):
        self.data_source = data_source

    def __iter__(self):
        return iter(range(len(self.data_source)))

    def __len__(self):
        return len(self.data_source)


class RandomSampler(Sampler, _EpochSeed):
    """Indices in a shuffled order (as torch.utils.data.RandomSampler): a permutation per pass, or
    with ``replacement=True`` ``num_samples`` independent uniform draws. Without replacement and
    with num_samples > len, whole permutations follow one another.

    ``seed``: None draws each pass's order from loom's global generator (loom.manual_seed); an int
    fixes the order of every epoch, moving to the next epoch on each pass (``set_epoch`` sets it).
    See Note [Shuffled orders] in loom/utils/data.py. The orders are not PyTorch's.
    """

    def __init__(self, data_source, replacement=False, num_samples=None, generator=None, *,
                 seed=None):
        owner = "RandomSampler"
        _refuse_generator(generator, owner)
        _EpochSeed.__init__(self, _check_seed(seed, owner))
        self.data_source = data_source
        self.replacement = _check_bool(replacement, owner, "replacement")
        self._num_samples = (None if num_samples is None
                             else _check_int(num_samples, owner, "num_samples", minimum=1))
        self.generator = None

    @property
    def num_samples(self):
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self):
        n, count = len(self.data_source), self.num_samples
        seed, epoch = self._next_pass()
        if n == 0:
            return iter(())
        if self.replacement:
            keys = _keys(count, seed, epoch, stream=1 << 32)
            return iter((keys % np.uint64(n)).astype(np.int64).tolist())
        parts = [_permutation(n, seed, epoch, stream=j) for j in range(-(-count // n))]
        return iter(np.concatenate(parts)[:count].tolist())

    def __len__(self):
        return self.num_samples


class SubsetRandomSampler(Sampler, _EpochSeed):
    """The given indices in a shuffled order, each once per pass (as
    torch.utils.data.SubsetRandomSampler); ``seed`` as RandomSampler's."""

    def __init__(self, indices, generator=None, *, seed=None):
        owner = "SubsetRandomSampler"
        _refuse_generator(generator, owner)
        _EpochSeed.__init__(self, _check_seed(seed, owner))
        self.indices = indices
        self.generator = None

    def __iter__(self):
        seed, epoch = self._next_pass()
        order = _permutation(len(self.indices), seed, epoch)
        return iter([self.indices[i] for i in order.tolist()])

    def __len__(self):
        return len(self.indices)


class BatchSampler(Sampler):
    """Lists of ``batch_size`` consecutive indices from ``sampler``; the last shorter one is kept
    unless ``drop_last`` (as torch.utils.data.BatchSampler). Given a DistributedSampler, it tells
    it the batch size and drop_last (See Note [Distributed batches] in loom/utils/data.py)."""

    def __init__(self, sampler, batch_size, drop_last):
        owner = "BatchSampler"
        self.batch_size = _check_int(batch_size, owner, "batch_size", minimum=1)
        self.drop_last = _check_bool(drop_last, owner, "drop_last")
        self.sampler = sampler
        if isinstance(sampler, DistributedSampler):
            sampler._bind(self.batch_size, self.drop_last)

    def __iter__(self):
        it = iter(self.sampler)
        return self._batches(it)

    def _batches(self, it):
        while True:
            batch = list(itertools.islice(it, self.batch_size))
            if not batch or (self.drop_last and len(batch) < self.batch_size):
                return
            yield batch

    def __len__(self):
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


class DistributedSampler(Sampler, _EpochSeed):
    """This rank's indices under data parallelism, laid out so that the ranks' batches at each step
    are together the single-process global batch, rank r holding rows [r*b, (r+1)*b) of it (See
    Note [Distributed batches] in loom/utils/data.py). PyTorch's signature and padding; PyTorch's
    round-robin layout only when b is 1.

    Example (W ranks, b rows each; the single-process run is
    ``DataLoader(ds, batch_size=W*b, shuffle=True, seed=0)``)::

        sampler = DistributedSampler(ds, seed=0)          # rank, world from loom.distributed
        loader = DataLoader(ds, batch_size=b, sampler=sampler)
        ddp = loom.distributed.DistributedDataParallel(model)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)                      # optional: each pass moves on by itself
            for x, y in loader:
                ddp.backward(model.loss(x, y)); ddp.finish(); opt.step(); opt.zero_grad()

    num_replicas / rank: default loom.distributed.get_world_size() / get_rank() (the world; a
    world of one without mpirun). Under a mesh pass the dp group's size and rank.
    shuffle / seed: the epoch's permutation of Note [Shuffled orders], the same on every rank and
    the same as ``DataLoader(..., shuffle=True, seed=seed)``'s; seed must be an int.
    drop_last: False pads every rank to ceil(n / W) indices with the epoch's first indices; True
    leaves the last n mod W out, floor(n / W) each (PyTorch's rule). Given to a DataLoader with
    drop_last=True, the sampler leaves out the whole partial last global step (the rows one
    process drops), even where padding would have filled each rank's last batch.
    batch_size: rows per rank per optimizer step (b). None (the default): the batch_size of the
    DataLoader or BatchSampler it is given to; iterated alone, 1. A DataLoader batch size that
    divides it makes micro-batches (gradient accumulation); one that does not is an error.
    """

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0,
                 drop_last=False, *, batch_size=None):
        owner = "DistributedSampler"
        if num_replicas is None or rank is None:
            import loom.distributed as dist

            if num_replicas is None:
                num_replicas = dist.get_world_size()
            if rank is None:
                rank = dist.get_rank()
        self.num_replicas = _check_int(num_replicas, owner, "num_replicas", minimum=1)
        self.rank = _check_int(rank, owner, "rank")
        if not 0 <= self.rank < self.num_replicas:
            raise ValueError(f"{owner}: rank {self.rank} is out of range for num_replicas "
                             f"{self.num_replicas} (expected 0..{self.num_replicas - 1})")
        _EpochSeed.__init__(self, _check_seed(seed, owner, allow_none=False))
        self.dataset = dataset
        self.shuffle = _check_bool(shuffle, owner, "shuffle")
        self.drop_last = _check_bool(drop_last, owner, "drop_last")
        self.batch_size = (None if batch_size is None
                           else _check_int(batch_size, owner, "batch_size", minimum=1))
        self._loader_drop_last = None  # the drop_last of the BatchSampler it was given to

    @property
    def num_samples(self):
        """Indices per rank per pass: ceil(n / W), or floor(n / W) with drop_last; given to a
        DataLoader with drop_last, batch_size times the whole global batches."""
        n, w = len(self.dataset), self.num_replicas
        if self._loader_drop_last:
            return n // (w * self.batch_size) * self.batch_size
        return n // w if self.drop_last else -(-n // w)

    @property
    def total_size(self):
        return self.num_samples * self.num_replicas

    def _bind(self, loader_batch, loader_drop_last):
        """Called by the BatchSampler (DataLoader) that batches this sampler's indices."""
        if self.batch_size is not None and self.batch_size % loader_batch != 0:
            raise ValueError(
                f"DistributedSampler: its batch_size is {self.batch_size} rows per rank, but the "
                f"DataLoader batches {loader_batch}, which does not divide it; give the sampler "
                "batch_size=None to take the DataLoader's, or a multiple of it for micro-batches "
                "(See Note [Distributed batches] in loom/utils/data.py)")
        if self._loader_drop_last is not None and self._loader_drop_last != loader_drop_last:
            raise ValueError("DistributedSampler: already given to a DataLoader with drop_last="
                             f"{self._loader_drop_last}; make one sampler per DataLoader")
        if self.batch_size is None:
            self.batch_size = loader_batch
        self._loader_drop_last = loader_drop_last

    def __iter__(self):
        seed, epoch = self._next_pass()
        n, w, r = len(self.dataset), self.num_replicas, self.rank
        per = self.num_samples
        if per == 0:
            return iter(())
        order = _permutation(n, seed, epoch) if self.shuffle else np.arange(n, dtype=np.int64)
        order = np.resize(order, per * w)  # pads cyclically with the first indices, or cuts
        b = self.batch_size or 1
        steps = per // b  # whole global batches
        head = order[:steps * w * b].reshape(steps, w, b)[:, r, :].reshape(-1)
        c = per - steps * b  # each rank's share of the last, shorter step
        tail = order[steps * w * b + r * c:steps * w * b + (r + 1) * c]
        return iter(np.concatenate([head, tail]).tolist())

    def __len__(self):
        return self.num_samples


# ---------------------------------------------------------------- collate


def _collate_error(what):
    return TypeError(f"default_collate: batch must contain loom tensors, numpy arrays, numbers, "
                     f"dicts or lists; found {what}")


def default_collate(batch):
    """Joins a list of samples into a batch with a new first dimension (as
    torch.utils.data.default_collate): loom tensors are stacked (loom.stack); numpy arrays and
    numpy scalars stacked into a loom tensor (float64 becomes float32, loom having no float64);
    Python ints become int64, floats float32 (PyTorch: float64), bools bool;
    strings stay a list; dicts, namedtuples, tuples and lists are collated field by field
    (tuples and lists become lists, as in PyTorch).

    Example::

        default_collate([(loom.zeros(3), 1), (loom.ones(3), 2)])
        # [tensor of shape (2, 3), tensor([1, 2])]
    """
    if not isinstance(batch, collections.abc.Sequence) or len(batch) == 0:
        raise ValueError("default_collate: batch must be a non-empty list of samples")
    elem = batch[0]
    if isinstance(elem, loom.Tensor):
        return loom.stack(list(batch), 0)
    if isinstance(elem, (np.ndarray, np.generic)) and not isinstance(elem, (np.str_, np.bytes_)):
        if elem.dtype.kind in "SUOV":
            raise _collate_error(f"a numpy array of dtype {elem.dtype}")
        shape = np.shape(elem)
        for i, x in enumerate(batch):
            if np.shape(x) != shape:
                raise RuntimeError(f"default_collate: sample {i} has shape {np.shape(x)} and "
                                   f"sample 0 {shape}; stacking needs equal shapes (pad them, "
                                   "or pass a collate_fn)")
        return loom.tensor(np.stack([np.asarray(x) for x in batch]))
    if isinstance(elem, (numbers.Number, np.bool_)) and not isinstance(elem, complex):
        return loom.tensor(list(batch))
    if isinstance(elem, (str, bytes)):
        return batch
    if isinstance(elem, collections.abc.Mapping):
        fields = {key: default_collate([d[key] for d in batch]) for key in elem}
        try:
            return type(elem)(fields)
        except TypeError:
            return fields
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):  # namedtuple
        return type(elem)(*(default_collate(list(s)) for s in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        size = len(elem)
        if any(len(x) != size for x in batch):
            raise RuntimeError("default_collate: each element in list of batch should be of "
                               f"equal size (sample 0 has {size} fields)")
        fields = [default_collate(list(s)) for s in zip(*batch)]
        if isinstance(elem, tuple):
            return fields
        try:
            return type(elem)(fields)
        except TypeError:
            return fields
    raise _collate_error(type(elem))


def default_convert(data):
    """One sample with numpy arrays turned into loom tensors, recursively (the DataLoader's
    collate_fn when batch_size=None, as torch.utils.data.default_convert)."""
    if isinstance(data, loom.Tensor):
        return data
    if isinstance(data, (np.ndarray, np.generic)) and not isinstance(data, (np.str_, np.bytes_)):
        return data if data.dtype.kind in "SUOV" else loom.tensor(np.asarray(data))
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, collections.abc.Mapping):
        fields = {key: default_convert(data[key]) for key in data}
        try:
            return type(data)(fields)
        except TypeError:
            return fields
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, collections.abc.Sequence):
        fields = [default_convert(d) for d in data]
        try:
            return type(data)(fields)
        except TypeError:
            return fields
    return data


def get_worker_info():
    """None: loom's DataLoader loads in the calling process (as PyTorch's in its main process)."""
    return None


# ---------------------------------------------------------------- DataLoader


class DataLoader:
    """Batches of a dataset (as torch.utils.data.DataLoader, same arguments): samples
    ``dataset[i]`` for each index of the sampler, ``batch_size`` at a time, joined by
    ``collate_fn`` (default_collate: loom tensors). ``len(loader)`` is the number of batches.

    shuffle: a new order each pass; from ``seed`` (an int, loom's own argument: pass e uses epoch
    e, reproducible anywhere) or, with seed None, from loom's global generator (loom.manual_seed).
    See Note [Shuffled orders]; the orders are not PyTorch's. ``generator=`` is refused: use seed.
    sampler / batch_sampler: as PyTorch (mutually exclusive with shuffle; batch_sampler also with
    batch_size, drop_last); a DistributedSampler takes this loader's batch_size as its rows per
    rank (Note [Distributed batches]).
    num_workers: batches are made in this process; a value > 0 is accepted with a warning and
    gives the same batches without prefetching. worker_init_fn is refused (it would never run).
    pin_memory, timeout, prefetch_factor, persistent_workers, multiprocessing_context,
    pin_memory_device: accepted, no effect.

    Example::

        loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True, seed=0,
                            drop_last=True)
        for xb, yb in loader:
            ...
    """

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
                 num_workers=0, collate_fn=None, pin_memory=False, drop_last=False, timeout=0,
                 worker_init_fn=None, multiprocessing_context=None, generator=None, *,
                 prefetch_factor=None, persistent_workers=False, pin_memory_device="", seed=None):
        owner = "DataLoader"
        _refuse_generator(generator, owner)
        self.num_workers = _check_int(num_workers, owner, "num_workers", minimum=0)
        if worker_init_fn is not None:
            raise ValueError(f"{owner}: worker_init_fn needs worker processes, which loom's "
                             "DataLoader does not start (batches are made in this process); "
                             "seed or set up the dataset before the loop instead")
        if self.num_workers > 0:
            warnings.warn(f"{owner}: num_workers={self.num_workers}: loom's DataLoader makes "
                          "batches in this process (no worker processes); the batches are the "
                          "same, only not prefetched", stacklevel=2)
        if timeout < 0:
            raise ValueError(f"{owner}: timeout option should be non-negative, got {timeout}")
        self.seed = _check_seed(seed, owner)
        drop_last = _check_bool(drop_last, owner, "drop_last")
        shuffle = bool(shuffle) if shuffle is not None else False
        iterable = isinstance(dataset, IterableDataset)
        if iterable:
            if shuffle:
                raise ValueError(f"{owner}: shuffle needs a map-style dataset; an "
                                 "IterableDataset is read in its own order")
            if sampler is not None or batch_sampler is not None:
                raise ValueError(f"{owner}: an IterableDataset takes no sampler or "
                                 "batch_sampler (it is read in its own order)")
        if sampler is not None and shuffle:
            raise ValueError(f"{owner}: sampler option is mutually exclusive with shuffle (the "
                             "sampler decides the order)")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError(f"{owner}: batch_sampler option is mutually exclusive with "
                                 "batch_size, shuffle, sampler, and drop_last")
            batch_size, drop_last = None, False
        elif batch_size is None:
            if drop_last:
                raise ValueError(f"{owner}: batch_size=None option disables auto-batching and "
                                 "is mutually exclusive with drop_last")
        else:
            batch_size = _check_int(batch_size, owner, "batch_size", minimum=1)
        if self.seed is not None and (sampler is not None or batch_sampler is not None):
            raise ValueError(f"{owner}: seed= seeds the loader's own shuffle; the sampler you "
                             "passed draws its own order (give the seed to it)")

        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self._iterable = iterable
        if sampler is None and not iterable:
            sampler = (RandomSampler(dataset, seed=self.seed) if shuffle
                       else SequentialSampler(dataset))
        self.sampler = sampler
        if batch_size is not None and batch_sampler is None and not iterable:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.batch_sampler = batch_sampler
        if collate_fn is None:
            collate_fn = default_collate if self._auto_collation else default_convert
        self.collate_fn = collate_fn
        self.generator = None
        self.pin_memory = pin_memory
        self.timeout = timeout
        self.worker_init_fn = None
        self.prefetch_factor = prefetch_factor
        self.persistent_workers = persistent_workers
        self.multiprocessing_context = multiprocessing_context
        self.pin_memory_device = pin_memory_device

    @property
    def _auto_collation(self):
        return self.batch_sampler is not None or (self._iterable and self.batch_size is not None)

    def __iter__(self):
        # The sampler starts its pass (takes its epoch or draws its seed) here, at iter(), not at
        # the first next().
        if self._iterable:
            return self._iterable_batches(iter(self.dataset))
        if self.batch_sampler is not None:
            return self._map_batches(iter(self.batch_sampler))
        return (self.collate_fn(self.dataset[i]) for i in iter(self.sampler))

    def _map_batches(self, batches):
        for indices in batches:
            yield self.collate_fn([self.dataset[i] for i in indices])

    def _iterable_batches(self, it):
        if self.batch_size is None:
            for sample in it:
                yield self.collate_fn(sample)
            return
        while True:
            batch = list(itertools.islice(it, self.batch_size))
            if not batch or (self.drop_last and len(batch) < self.batch_size):
                return
            yield self.collate_fn(batch)

    def __len__(self):
        if self._iterable:
            n = len(self.dataset)  # TypeError when the stream has no length, as in PyTorch
            if self.batch_size is None:
                return n
            return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        if self.batch_sampler is not None:
            return len(self.batch_sampler)
        return len(self.sampler)
