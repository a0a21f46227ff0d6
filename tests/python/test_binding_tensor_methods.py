"""The composed Tensor methods and functions (python/loom/_tensor_methods.py) against PyTorch:
dtype shorthands, any/all and logical ops (bool, as torch), isnan/isinf/isfinite,
sign, square, reciprocal, minimum/maximum, logsumexp, sort/argsort, split/chunk/unbind, flip,
new_*, randperm; values and gradients."""

import numpy as np
import pytest

import loom

torch = pytest.importorskip("torch")
import torch_twins  # noqa: E402  (imports torch: after the skip)
from torch_twins import pair  # noqa: E402

rng = np.random.default_rng(77)


def check(lo, to, leaves, rtol=1e-5, atol=1e-6):
    torch_twins.check(lo, to, leaves, rng, rtol, atol)


def same_mask(lo, to):
    assert lo.dtype == loom.bool and to.dtype == torch.bool
    np.testing.assert_array_equal(lo.numpy(), to.numpy())


def test_dtype_shorthands():
    t = loom.tensor([[1.5, -2.0], [0.0, 3.0]])
    assert t.long().dtype == loom.int64 and t.long().tolist() == [[1, -2], [0, 3]]
    assert t.int().dtype == loom.int32
    assert t.half().dtype == loom.float16 and t.bfloat16().dtype == loom.bfloat16
    same_mask(t.bool(), torch.tensor(t.numpy()).bool())
    assert t.new_zeros(2, 3).shape == (2, 3) and t.new_ones((1,)).tolist() == [1.0]
    assert t.new_full((2,), 7.0).tolist() == [7.0, 7.0]
    assert t.long().type_as(t).dtype == loom.float32
    with pytest.raises(ValueError, match="no float64"):
        t.double()


def test_any_all_and_logical_ops_match_torch():
    a = rng.integers(0, 2, (3, 4)).astype(np.float32)
    b = rng.integers(0, 2, (3, 4)).astype(np.float32)
    la, lb, ta, tb = loom.tensor(a), loom.tensor(b), torch.tensor(a), torch.tensor(b)
    same_mask(la.any(), ta.any())
    same_mask(la.all(), ta.all())
    same_mask(la.any(1), ta.any(1))
    same_mask(loom.all(la, 0, keepdim=True), torch.all(ta, 0, keepdim=True))
    for name in ("logical_and", "logical_or", "logical_xor"):
        same_mask(getattr(loom, name)(la, lb), getattr(torch, name)(ta, tb))
    same_mask(loom.logical_not(la), torch.logical_not(ta))
    lm, tm = la > 0, ta > 0
    same_mask(~lm, ~tm)
    same_mask(lm & (lb > 0), tm & (tb > 0))
    same_mask(lm | (lb > 0), tm | (tb > 0))
    same_mask(lm ^ (lb > 0), tm ^ (tb > 0))
    with pytest.raises(TypeError, match="on bool tensors.*t.bool"):
        la & lb
    # A uint8 mask converts with .bool(); bool tensors take Python bools.
    same_mask(la.to(loom.uint8).bool() & True, ta.to(torch.uint8).bool() & True)
    same_mask(lm ^ False, tm ^ False)


def test_nan_inf_sign_square_reciprocal():
    x = np.array([1.5, -2.0, 0.0, np.nan, np.inf, -np.inf], np.float32)
    lx, tx = loom.tensor(x), torch.tensor(x)
    for name in ("isnan", "isinf", "isfinite"):
        same_mask(getattr(loom, name)(lx), getattr(torch, name)(tx))
    np.testing.assert_array_equal(lx.sign().numpy(), tx.sign().numpy())
    y = rng.uniform(0.5, 2.0, (3, 4))
    for name in ("square", "reciprocal"):
        ly, ty = pair(y)
        check(getattr(loom, name)(ly), getattr(torch, name)(ty), [(ly, ty)])


def test_minimum_maximum_logsumexp_match_torch():
    a, b = rng.standard_normal((4, 5)), rng.standard_normal((5,))
    for name in ("minimum", "maximum"):
        la, ta = pair(a)
        lb, tb = pair(b)
        check(getattr(loom, name)(la, lb), getattr(torch, name)(ta, tb), [(la, ta), (lb, tb)])
    nan = loom.maximum(loom.tensor([np.nan, 1.0]), loom.tensor([0.0, np.nan]))
    assert np.isnan(nan.numpy()).all()
    x = rng.standard_normal((3, 6)) * 30
    for dim, keepdim in ((1, False), (0, True), (-1, True)):
        lx, tx = pair(x)
        check(loom.logsumexp(lx, dim, keepdim), torch.logsumexp(tx, dim, keepdim), [(lx, tx)])
    ninf = loom.logsumexp(loom.tensor([[-np.inf, -np.inf]]), 1)
    assert ninf.tolist() == [-np.inf]


@pytest.mark.parametrize("descending", [False, True])
def test_sort_argsort_match_torch(descending):
    x = rng.standard_normal((4, 7))
    lx, tx = pair(x)
    lo, to = lx.sort(1, descending=descending), tx.sort(1, descending=descending)
    np.testing.assert_array_equal(lo.indices.numpy(), to.indices.numpy())
    check(lo.values, to.values, [(lx, tx)])
    ties = loom.tensor([2.0, 1.0, 2.0, 1.0])
    assert loom.argsort(ties, descending=descending).tolist() == (
        [0, 2, 1, 3] if descending else [1, 3, 0, 2])  # stable


def test_split_chunk_unbind_flip_match_torch():
    x = rng.standard_normal((5, 6))
    for lo_f, to_f in [(lambda t: loom.split(t, 2, 1), lambda t: torch.split(t, 2, 1)),
                       (lambda t: t.split([1, 4], 0), lambda t: t.split([1, 4], 0)),
                       (lambda t: loom.chunk(t, 3, 1), lambda t: torch.chunk(t, 3, 1)),
                       (lambda t: t.unbind(0), lambda t: t.unbind(0))]:
        lx, tx = pair(x)
        lo, to = lo_f(lx), to_f(tx)
        assert len(lo) == len(to)
        lsum = sum(((p * float(i + 1)).sum() for i, p in enumerate(lo)), loom.zeros([]))
        tsum = sum(((p * float(i + 1)).sum() for i, p in enumerate(to)), torch.zeros([]))
        for lp, tp in zip(lo, to):
            np.testing.assert_array_equal(lp.detach().numpy(), tp.detach().numpy())
        check(lsum, tsum, [(lx, tx)])
    lx, tx = pair(x)
    check(lx.flip([0, 1]), tx.flip([0, 1]), [(lx, tx)])


def test_randperm_and_random_like():
    loom.manual_seed(3)
    p = loom.randperm(10)
    assert p.dtype == loom.int64 and sorted(p.tolist()) == list(range(10))
    loom.manual_seed(3)
    assert loom.randperm(10).tolist() == p.tolist()
    t = loom.zeros(2, 3)
    assert loom.randn_like(t).shape == (2, 3) and loom.rand_like(t).dtype == loom.float32
    r = loom.randint_like(t, 5)
    assert r.dtype == loom.float32 and 0 <= r.numpy().min() and r.numpy().max() < 5
    assert loom.is_tensor(t) and not loom.is_tensor(3) and loom.numel(t) == 6
    assert loom.as_tensor(t) is t


def test_in_place_division_and_builtin_parameter_updates():
    lin = loom.nn.Linear(3, 2)
    w = lin.weight.detach().numpy().copy()
    with loom.no_grad():
        lin.weight /= 4.0  # in place: the module's own tensor changes
        lin.weight += 1.0  # assigning the same tensor back is accepted
    np.testing.assert_array_equal(lin.weight.detach().numpy(), (torch.tensor(w) / 4.0 + 1.0).numpy())
    t = loom.tensor([2.0, 3.0])
    alias = t
    t /= loom.tensor([4.0, 3.0])
    assert alias.tolist() == [0.5, 1.0] and t is alias
    p = loom.zeros(2, requires_grad=True)
    with pytest.raises(ValueError):
        p /= 2.0  # in place on a tensor requiring grad, outside no_grad
