"""loom.utils.data (python/loom/utils/data.py) against torch.utils.data where the two promise the
same thing: unshuffled batches, len, drop_last, BatchSampler, Subset, ConcatDataset, the
collation of nested samples and its dtypes (loom's float32 for Python floats and float64 arrays
is the documented difference), IterableDataset batching, and
DistributedSampler's lengths and, with batch size 1 and no shuffle, its indices. Shuffles are
loom's own (Note [Shuffled orders]): reproducible from a seed or loom.manual_seed, a new order per
epoch, pinned for one seed. A DistributedSampler's ranks, simulated in one process, together give
the single-process global batch of every step, rank r holding its contiguous rows (Note
[Distributed batches]; mpi_data_loader_check.py does it under mpirun with DDP training).
TokenDataset's batches equal loom.data.BatchLoader's; bad arguments raise naming the problem.
"""

import collections
import warnings

import numpy as np
import pytest

import loom
import loom.data
import loom.utils.data as lud

try:  # the reference where the semantics are PyTorch's; loom's own promises run without it
    import torch
    import torch.utils.data as tud
except ImportError:
    torch = tud = None
needs_torch = pytest.mark.skipif(torch is None, reason="needs PyTorch (python3-torch) as the "
                                 "reference")


def arr(t):
    return t.numpy() if isinstance(t, torch.Tensor) else np.asarray(t)


def data(n=10, d=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, d)).astype(np.float32), rng.integers(0, 5, n).astype(np.int64)


def datasets(n=10):
    x, y = data(n)
    return (lud.TensorDataset(loom.tensor(x), loom.tensor(y)),
            tud.TensorDataset(torch.from_numpy(x), torch.from_numpy(y)))


def indices_of(batches):
    return [arr(b).tolist() for b in batches]


class Range(lud.Dataset):
    """Row i is the int i: batches are the sampled indices."""

    def __init__(self, n):
        self.n = n

    def __getitem__(self, i):
        return i

    def __len__(self):
        return self.n


def epoch_indices(loader):
    return [b.tolist() for b in loader]


# ---------------------------------------------------------------- against torch.utils.data


@needs_torch
@pytest.mark.parametrize("batch_size", [1, 3, 4, 10, 11])
@pytest.mark.parametrize("drop_last", [False, True])
def test_unshuffled_batches_as_torch(batch_size, drop_last):
    ours, theirs = datasets()
    a = lud.DataLoader(ours, batch_size=batch_size, drop_last=drop_last)
    b = tud.DataLoader(theirs, batch_size=batch_size, drop_last=drop_last)
    assert len(a) == len(b)
    got, want = list(a), list(b)
    assert len(got) == len(want)
    for (gx, gy), (wx, wy) in zip(got, want):
        assert gx.dtype == loom.float32 and gy.dtype == loom.int64
        np.testing.assert_array_equal(arr(gx), arr(wx))
        np.testing.assert_array_equal(arr(gy), arr(wy))


@needs_torch
def test_tensor_dataset_rows_and_len():
    ours, theirs = datasets(7)
    assert len(ours) == len(theirs) == 7
    for i in (0, 3, 6, -1):
        for g, w in zip(ours[i], theirs[i]):
            np.testing.assert_array_equal(arr(g), arr(w))
    with pytest.raises(ValueError, match="first dimensions differ"):
        lud.TensorDataset(loom.zeros(3, 2), loom.zeros(4))
    with pytest.raises(ValueError, match="at least one tensor"):
        lud.TensorDataset()


@needs_torch
def test_batch_sampler_and_sequential_sampler_as_torch():
    for n, bs, dl in ((10, 3, False), (10, 3, True), (9, 3, True), (2, 5, False)):
        ours = lud.BatchSampler(lud.SequentialSampler(range(n)), bs, dl)
        theirs = tud.BatchSampler(tud.SequentialSampler(range(n)), bs, dl)
        assert list(ours) == list(theirs) and len(ours) == len(theirs)
    loader = lud.DataLoader(Range(10), batch_sampler=lud.BatchSampler(range(10), 4, True))
    assert epoch_indices(loader) == [[0, 1, 2, 3], [4, 5, 6, 7]] and len(loader) == 2


@needs_torch
def test_subset_and_concat_as_torch():
    ours, theirs = datasets(6)
    for make in (lambda m, d: m.Subset(d, [4, 0, 2]), lambda m, d: m.ConcatDataset([d, d]),
                 lambda m, d: d + d):
        a, b = make(lud, ours), make(tud, theirs)
        assert len(a) == len(b)
        for i in list(range(len(b))) + [-1, -len(b)]:
            for g, w in zip(a[i], b[i]):
                np.testing.assert_array_equal(arr(g), arr(w))
    with pytest.raises(IndexError):
        lud.ConcatDataset([ours])[6]


Point = collections.namedtuple("Point", ["x", "label"])


def samples(lib):
    """Nested samples: a dict of a tuple, a namedtuple, numpy arrays, numbers, strings, lists."""
    t = (lambda a: loom.tensor(a)) if lib is lud else (lambda a: torch.from_numpy(a))
    out = []
    for i in range(3):
        out.append({
            "pair": (t(np.full(2, i, np.float32)), i),
            "point": Point(np.arange(3, dtype=np.int32) + i, float(i) / 2),
            "name": f"s{i}",
            "list": [np.float32(i), np.int64(-i), True if i % 2 else False],
            "f32": np.ones((2, 2), np.float32) * i,
        })
    return out


def compare(got, want, where="batch"):
    if isinstance(want, torch.Tensor):
        assert isinstance(got, loom.Tensor), where
        w = want.numpy()
        g = got.numpy()
        assert g.shape == w.shape, where
        expect = {"float64": np.dtype(np.float32)}.get(
            w.dtype.name, w.dtype)
        assert g.dtype == expect, f"{where}: {g.dtype} for torch's {w.dtype}"
        np.testing.assert_array_equal(g, w.astype(expect), err_msg=where)
    elif isinstance(want, dict):
        assert type(got) is type(want) and list(got) == list(want), where
        for k in want:
            compare(got[k], want[k], f"{where}[{k!r}]")
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), f"{where}: {type(got)}"
        for i, (g, w) in enumerate(zip(got, want)):
            compare(g, w, f"{where}[{i}]")
    else:
        assert got == want, where


@needs_torch
def test_collate_nested_as_torch():
    compare(lud.default_collate(samples(lud)), tud.default_collate(samples(tud)))
    # Python numbers: ints int64 as PyTorch; floats float32 (PyTorch float64); bools bool.
    assert lud.default_collate([1, 2]).dtype == loom.int64
    assert lud.default_collate([1.5, 2]).dtype == loom.float32
    assert lud.default_collate([True, False]).dtype == loom.bool
    assert lud.default_collate([np.zeros(2)]).dtype == loom.float32
    assert lud.default_collate([np.zeros(2, np.int32)]).dtype == loom.int32
    # loom tensors stack; dtypes kept.
    out = lud.default_collate([loom.zeros(2, dtype=loom.bfloat16)] * 3)
    assert out.shape == (3, 2) and out.dtype == loom.bfloat16


@needs_torch
def test_collate_through_loader_of_dicts_as_torch():
    class Dicts(lud.Dataset):
        def __getitem__(self, i):
            return {"x": np.full(3, i, np.float32), "y": i, "tag": f"t{i}"}

        def __len__(self):
            return 5

    class TorchDicts(tud.Dataset):
        __getitem__ = Dicts.__getitem__
        __len__ = Dicts.__len__

    for g, w in zip(lud.DataLoader(Dicts(), batch_size=2), tud.DataLoader(TorchDicts(),
                                                                           batch_size=2)):
        compare(g, w)


@needs_torch
def test_no_auto_batching_converts_as_torch():
    ours = lud.DataLoader(Range(3), batch_size=None)
    assert len(ours) == 3 and list(ours) == [0, 1, 2]
    x, _ = data(4)

    class Rows(lud.Dataset):
        def __getitem__(self, i):
            return x[i], i

        def __len__(self):
            return 4

    for g, w in zip(lud.DataLoader(Rows(), batch_size=None),
                    tud.DataLoader(Rows(), batch_size=None)):
        compare(g, w)


class Stream(lud.IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        return self.n


if tud is not None:
    class TorchStream(tud.IterableDataset):
        __init__, __iter__, __len__ = Stream.__init__, Stream.__iter__, Stream.__len__


@needs_torch
@pytest.mark.parametrize("drop_last", [False, True])
def test_iterable_dataset_as_torch(drop_last):
    a = lud.DataLoader(Stream(10), batch_size=4, drop_last=drop_last)
    b = tud.DataLoader(TorchStream(10), batch_size=4, drop_last=drop_last)
    assert len(a) == len(b)
    assert epoch_indices(a) == [t.tolist() for t in b]
    assert [x.tolist() for x in lud.DataLoader(Stream(3) + Stream(2), batch_size=2)] == \
        [[0, 1], [2, 0], [1]]


@needs_torch
def test_distributed_sampler_lengths_and_round_robin_as_torch():
    for n in (0, 1, 5, 10, 11, 12):
        for w in (1, 2, 3, 4):
            for drop_last in (False, True):
                for r in range(w):
                    ours = lud.DistributedSampler(Range(n), w, r, shuffle=False,
                                                  drop_last=drop_last)
                    theirs = tud.DistributedSampler(range(n), w, r, shuffle=False,
                                                    drop_last=drop_last)
                    assert len(ours) == len(theirs) == len(list(ours)), (n, w, r, drop_last)
                    if n:  # batch size 1 (alone, no DataLoader): PyTorch's r::W layout
                        assert list(ours) == list(theirs), (n, w, r, drop_last)


# ---------------------------------------------------------------- shuffles


def test_seeded_shuffle_reproducible_and_new_each_epoch():
    n = 50
    a = lud.DataLoader(Range(n), batch_size=8, shuffle=True, seed=7)
    b = lud.DataLoader(Range(n), batch_size=8, shuffle=True, seed=7)
    epochs_a = [sum(epoch_indices(a), []) for _ in range(3)]
    epochs_b = [sum(epoch_indices(b), []) for _ in range(3)]
    assert epochs_a == epochs_b
    for e in epochs_a:
        assert sorted(e) == list(range(n))
    assert len({tuple(e) for e in epochs_a}) == 3, "each epoch must have a new order"
    assert epochs_a[0] != list(range(n))
    other = lud.DataLoader(Range(n), batch_size=8, shuffle=True, seed=8)
    assert sum(epoch_indices(other), []) != epochs_a[0]
    # set_epoch chooses the next pass's epoch; a pass moves on by one.
    a.sampler.set_epoch(1)
    assert sum(epoch_indices(a), []) == epochs_a[1]
    assert sum(epoch_indices(a), []) == epochs_a[2]
    assert a.sampler.epoch == 3
    # The epoch is taken at iter(), not at the first next().
    it = iter(b)
    assert b.sampler.epoch == 4
    assert sum((x.tolist() for x in it), []) == sum(epoch_indices(
        lud.DataLoader(Range(n), batch_size=8, sampler=_at_epoch(3, n))), [])


def _at_epoch(epoch, n, seed=7):
    s = lud.RandomSampler(Range(n), seed=seed)
    s.set_epoch(epoch)
    return s


def test_seeded_order_is_pinned():
    """The order from a seed is promised identical on every machine and version: pinned."""
    s = lud.RandomSampler(Range(10), seed=0)
    first, second = list(s), list(s)
    assert first == PINNED_SEED0_EPOCH0, first
    assert second == PINNED_SEED0_EPOCH1, second


PINNED_SEED0_EPOCH0 = [2, 4, 6, 8, 5, 1, 7, 0, 9, 3]
PINNED_SEED0_EPOCH1 = [6, 7, 1, 2, 9, 0, 5, 8, 3, 4]


def test_global_generator_shuffle():
    loom.manual_seed(11)
    loader = lud.DataLoader(Range(30), batch_size=30, shuffle=True)
    first = [epoch_indices(loader)[0] for _ in range(3)]
    loom.manual_seed(11)
    again = [epoch_indices(loader)[0] for _ in range(3)]
    assert first == again
    assert len({tuple(e) for e in first}) == 3
    loom.manual_seed(12)
    assert epoch_indices(loader)[0] != first[0]


def test_random_sampler_replacement_and_num_samples():
    s = lud.RandomSampler(Range(5), replacement=True, num_samples=40, seed=3)
    draws = list(s)
    assert len(s) == 40 and len(draws) == 40 and set(draws) <= set(range(5))
    assert len(set(draws)) == 5 and draws == list(lud.RandomSampler(Range(5), True, 40, seed=3))
    s = lud.RandomSampler(Range(4), num_samples=10, seed=3)
    drawn = list(s)
    assert len(drawn) == 10 and sorted(drawn[:4]) == sorted(drawn[4:8]) == [0, 1, 2, 3]
    assert sorted(list(lud.SubsetRandomSampler([7, 9, 11], seed=1))) == [7, 9, 11]


@needs_torch
def test_random_split():
    ds = Range(10)
    parts = lud.random_split(ds, [3, 7], seed=0)
    assert [len(p) for p in parts] == [3, 7]
    rows = [p[i] for p in parts for i in range(len(p))]
    assert sorted(rows) == list(range(10)) and rows != list(range(10))
    assert [p.indices for p in lud.random_split(ds, [3, 7], seed=0)] == [p.indices for p in parts]
    for fractions in ([0.5, 0.5], [0.3, 0.3, 0.4], [0.33, 0.33, 0.34], [0.1, 0.9]):
        ours = [len(p) for p in lud.random_split(Range(11), fractions, seed=1)]
        theirs = [len(p) for p in tud.random_split(range(11), fractions)]
        assert ours == theirs, fractions
    with pytest.raises(ValueError, match="sum to 9"):
        lud.random_split(ds, [3, 6])
    with pytest.raises(TypeError, match="Generator"):
        lud.random_split(ds, [5, 5], generator=object())


# ---------------------------------------------------------------- DistributedSampler layout


def global_batches(n, gb, seed, epochs, drop_last=False, shuffle=True):
    single = lud.DataLoader(Range(n), batch_size=gb, shuffle=shuffle,
                            seed=seed if shuffle else None, drop_last=drop_last)
    return [epoch_indices(single) for _ in range(epochs)]


def rank_batches(n, w, b, seed, epochs, sampler_drop_last=False, drop_last=False, shuffle=True,
                 set_epoch=False):
    out = []
    for r in range(w):
        sampler = lud.DistributedSampler(Range(n), w, r, shuffle=shuffle, seed=seed,
                                         drop_last=sampler_drop_last)
        loader = lud.DataLoader(Range(n), batch_size=b, sampler=sampler, drop_last=drop_last)
        assert sampler.batch_size == b
        per_epoch = []
        for e in range(epochs):
            if set_epoch:
                sampler.set_epoch(e)
            per_epoch.append(epoch_indices(loader))
            assert len(per_epoch[-1]) == len(loader)
        out.append(per_epoch)
    return out  # [rank][epoch][step] -> indices


@pytest.mark.parametrize("n", [24, 25, 27, 5])
@pytest.mark.parametrize("shuffle", [True, False])
def test_distributed_ranks_make_the_global_batch(n, shuffle):
    w, b, seed, epochs = 3, 2, 5, 3
    want = global_batches(n, w * b, seed, epochs, shuffle=shuffle)
    for set_epoch in (False, True):
        got = rank_batches(n, w, b, seed, epochs, shuffle=shuffle, set_epoch=set_epoch)
        for e in range(epochs):
            order = sum(want[e], [])
            steps = len(got[0][e])
            assert all(len(got[r][e]) == steps for r in range(w))
            assert steps == len(want[e])
            for s in range(steps):
                rows = [got[r][e][s] for r in range(w)]
                size = len(rows[0])
                assert all(len(x) == size for x in rows), "every rank the same batch size"
                glob = want[e][s]
                if len(glob) == w * size:  # a full step, or a tail W divides: exact
                    for r in range(w):
                        assert rows[r] == glob[r * size:(r + 1) * size], (n, e, s, r)
                else:  # the tail padded with the epoch's first indices, as PyTorch pads
                    padded = glob + (order * w)[:w * size - len(glob)]
                    assert sum(rows, []) == padded, (n, e, s)


@pytest.mark.parametrize("n", [24, 25, 27, 5, 11])
@pytest.mark.parametrize("sampler_drop_last", [False, True])
def test_distributed_drop_last_matches_single_process_drop_last(n, sampler_drop_last):
    # n 5 and 11: the padded tail (ceil(5/3) = 2 = b rows per rank) would fill each rank's last
    # batch, which the single process drops; the sampler, told drop_last, leaves it out.
    w, b, seed, epochs = 3, 2, 9, 2
    want = global_batches(n, w * b, seed, epochs, drop_last=True)
    got = rank_batches(n, w, b, seed, epochs, sampler_drop_last=sampler_drop_last,
                       drop_last=True)
    for e in range(epochs):
        assert [sum((got[r][e][s] for r in range(w)), []) for s in range(len(got[0][e]))] == \
            want[e]


def test_distributed_sampler_drop_last_leaves_the_tail_out():
    n, w, b = 26, 3, 4  # per rank floor(26/3) = 8 = 2 steps of 4; the last 2 rows left out
    want = global_batches(n, w * b, 1, 1)[0]
    got = rank_batches(n, w, b, 1, 1, sampler_drop_last=True)
    assert [sum((got[r][0][s] for r in range(w)), []) for s in range(2)] == want[:2]
    assert all(len(got[r][0]) == 2 for r in range(w))


def test_distributed_micro_batches_and_explicit_batch_size():
    n, w, k, m = 24, 2, 2, 3  # rank batch 6 per step in micro-batches of 3
    want = global_batches(n, w * k * m, 4, 1)[0]
    for r in range(w):
        sampler = lud.DistributedSampler(Range(n), w, r, seed=4, batch_size=k * m)
        micro = epoch_indices(lud.DataLoader(Range(n), batch_size=m, sampler=sampler))
        for s, glob in enumerate(want):
            for j in range(k):  # micro-batch j of rank r: part r*k + j of w*k
                part = r * k + j
                assert micro[s * k + j] == glob[part * m:(part + 1) * m]
    sampler = lud.DistributedSampler(Range(n), 2, 0, batch_size=4)
    with pytest.raises(ValueError, match="does not divide"):
        lud.DataLoader(Range(n), batch_size=3, sampler=sampler)
    lud.DataLoader(Range(n), batch_size=2, sampler=sampler)
    with pytest.raises(ValueError, match="make one sampler per DataLoader"):
        lud.DataLoader(Range(n), batch_size=2, sampler=sampler, drop_last=True)
    # A world of one is the single-process order.
    one = lud.DataLoader(Range(n), batch_size=5, sampler=lud.DistributedSampler(Range(n), seed=3))
    assert epoch_indices(one) == global_batches(n, 5, 3, 1)[0]


def test_distributed_sampler_errors():
    with pytest.raises(ValueError, match="rank 2 is out of range"):
        lud.DistributedSampler(Range(4), num_replicas=2, rank=2)
    with pytest.raises(TypeError, match="seed must be an int"):
        lud.DistributedSampler(Range(4), 1, 0, seed=None)
    with pytest.raises(ValueError, match="num_replicas must be >= 1"):
        lud.DistributedSampler(Range(4), 0, 0)


# ---------------------------------------------------------------- token files


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_token_dataset_is_batch_loader_order(dtype):
    tokens = np.random.default_rng(0).integers(0, 50, 203).astype(dtype)
    B, T = 4, 8
    ds = lud.TokenDataset(loom.tensor(tokens), T)
    assert len(ds) == (203 - 1) // T
    bl = loom.data.BatchLoader(loom.tensor(tokens.astype(np.int32)), B, T)
    loader = lud.DataLoader(ds, batch_size=B, drop_last=True)
    assert len(loader) == bl.batches_per_pass
    for k, (x, y) in enumerate(loader):
        want = bl.batch_at(k)
        assert x.shape == (B, T) and x.dtype == (loom.int32 if dtype == np.int32 else loom.int64)
        np.testing.assert_array_equal(arr(x), arr(want.inputs))
        np.testing.assert_array_equal(arr(y), arr(want.targets))
    x, y = ds[-1]
    np.testing.assert_array_equal(arr(x), tokens[(len(ds) - 1) * T:len(ds) * T])
    np.testing.assert_array_equal(arr(y), tokens[(len(ds) - 1) * T + 1:len(ds) * T + 1])
    with pytest.raises(IndexError, match="out of range"):
        ds[len(ds)]


def test_token_dataset_stride_and_short_streams():
    ds = lud.TokenDataset(list(range(20)), seq=5, stride=2)
    assert len(ds) == (20 - 5 - 1) // 2 + 1
    x, y = ds[3]
    assert x.tolist() == [6, 7, 8, 9, 10] and y.tolist() == [7, 8, 9, 10, 11]
    assert x.dtype == loom.int64
    assert len(lud.TokenDataset(list(range(5)), seq=5)) == 0
    assert len(lud.TokenDataset(list(range(6)), seq=5)) == 1
    with pytest.raises(ValueError, match="1-D"):
        lud.TokenDataset(loom.zeros(2, 3, dtype=loom.int32), 2)
    with pytest.raises(TypeError, match="int32 or int64"):
        lud.TokenDataset(loom.zeros(10), 2)
    with pytest.raises(ValueError, match="seq must be >= 1"):
        lud.TokenDataset(list(range(10)), 0)


def test_split_tokens(tmp_path):
    path = str(tmp_path / "tokens.bin")
    loom.data.write_token_file(path, list(range(1000)))
    tokens = loom.data.read_token_file(path)
    train, heldout = lud.split_tokens(tokens, 0.1)
    assert train.dtype == heldout.dtype == loom.int32
    assert train.tolist() == list(range(900)) and heldout.tolist() == list(range(900, 1000))
    train, heldout = lud.split_tokens(tokens, 0.0)
    assert len(train.tolist()) == 1000 and heldout.shape == (0,)
    for bad in (1.0, -0.1, "0.1", True):
        with pytest.raises(ValueError, match="heldout_fraction"):
            lud.split_tokens(tokens, bad)


# ---------------------------------------------------------------- errors


@needs_torch
def test_loader_argument_errors():
    ds = Range(4)
    with pytest.raises(ValueError, match="mutually exclusive with shuffle"):
        lud.DataLoader(ds, sampler=lud.SequentialSampler(ds), shuffle=True)
    with pytest.raises(ValueError, match="batch_sampler option is mutually exclusive"):
        lud.DataLoader(ds, batch_size=2, batch_sampler=lud.BatchSampler(range(4), 2, False))
    with pytest.raises(ValueError, match="mutually exclusive with drop_last"):
        lud.DataLoader(ds, batch_size=None, drop_last=True)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        lud.DataLoader(ds, batch_size=0)
    with pytest.raises(TypeError, match="batch_size must be an int"):
        lud.DataLoader(ds, batch_size=True)
    with pytest.raises(ValueError, match="shuffle needs a map-style dataset"):
        lud.DataLoader(Stream(3), shuffle=True)
    with pytest.raises(ValueError, match="takes no sampler"):
        lud.DataLoader(Stream(3), sampler=range(3))
    with pytest.raises(ValueError, match="give the seed to it"):
        lud.DataLoader(ds, sampler=lud.RandomSampler(ds), seed=3)
    with pytest.raises(TypeError, match="pass seed=INT"):
        lud.DataLoader(ds, shuffle=True, generator=torch.Generator())
    with pytest.raises(ValueError, match="worker_init_fn needs worker processes"):
        lud.DataLoader(ds, num_workers=2, worker_init_fn=print)
    with pytest.raises(ValueError, match="num_workers must be >= 0"):
        lud.DataLoader(ds, num_workers=-1)


def test_num_workers_loads_in_process_with_a_warning():
    with pytest.warns(UserWarning, match="num_workers=2: loom's DataLoader makes batches in this "
                                         "process"):
        loader = lud.DataLoader(Range(5), batch_size=2, num_workers=2)
    assert epoch_indices(loader) == [[0, 1], [2, 3], [4]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lud.DataLoader(Range(5), batch_size=2, pin_memory=True, num_workers=0)
    assert lud.get_worker_info() is None


def test_collate_errors():
    with pytest.raises(TypeError, match="found <class 'object'>"):
        lud.default_collate([object(), object()])
    with pytest.raises(RuntimeError, match="equal size"):
        lud.default_collate([(1, 2), (3,)])
    with pytest.raises(RuntimeError, match=r"sample 1 has shape \(3,\) and sample 0 \(2,\)"):
        lud.default_collate([np.zeros(2), np.zeros(3)])
    with pytest.raises(TypeError, match="dtype <U1"):
        lud.default_collate([np.array(["a"]), np.array(["b"])])
    with pytest.raises(ValueError, match="non-empty"):
        lud.default_collate([])
    with pytest.raises(Exception, match="stack"):
        lud.default_collate([loom.zeros(2), loom.zeros(3)])


def test_dataset_base_class():
    with pytest.raises(NotImplementedError, match="must define __getitem__"):
        lud.Dataset()[0]
    with pytest.raises(NotImplementedError, match="must define __iter__"):
        iter(lud.IterableDataset())


def test_loom_utils_package():
    import loom.utils

    assert loom.utils.data is lud
