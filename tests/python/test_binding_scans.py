"""cumsum, cumprod, prod, norm / linalg.vector_norm and where with integer operands against
PyTorch: values and gradients on random inputs, every dim (negative ones too), keepdim, empty and
length-1 dims, integer dtypes (exact), and the errors."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import loom  # noqa: E402
from torch_twins import check, pair  # noqa: E402

rng = np.random.default_rng(2718)
# Sums of a few dozen order-1 values in another order than torch's: a few f32 ulps.
RTOL, ATOL = 1e-5, 1e-5


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 9), (4, 1, 3), (2, 0, 3)])
def test_cumsum_cumprod_every_dim(shape):
    for dim in range(-len(shape), len(shape)):
        a = rng.uniform(0.5, 1.5, shape) * rng.choice([-1, 1], shape)
        for op in ("cumsum", "cumprod"):
            x, y = pair(a)
            check(getattr(x, op)(dim), getattr(y, op)(dim), [(x, y)], rng, RTOL, ATOL)
            x, y = pair(a)
            check(getattr(loom, op)(x, dim=dim), getattr(torch, op)(y, dim=dim), [(x, y)], rng,
                  RTOL, ATOL)


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 9), (4, 1, 3), (2, 0, 3)])
def test_prod_every_dim_and_whole(shape):
    a = rng.uniform(0.5, 1.5, shape) * rng.choice([-1, 1], shape)
    a.flat[:1] = 0.0  # a zero: the product rule, not division, gives its gradient
    for dim in range(-len(shape), len(shape)):
        for keepdim in (False, True):
            x, y = pair(a)
            check(x.prod(dim, keepdim=keepdim), y.prod(dim, keepdim=keepdim), [(x, y)], rng,
                  RTOL, ATOL)
    x, y = pair(a)
    check(loom.prod(x), torch.prod(y), [(x, y)], rng, RTOL, ATOL)


def test_integer_scans_and_prod_are_exact_and_int64():
    a = rng.integers(-9, 10, (4, 6))
    for dtype, tdtype in ((loom.int32, torch.int32), (loom.int64, torch.int64)):
        x, y = loom.tensor(a).to(dtype), torch.tensor(a).to(tdtype)
        for dim in (0, 1, -1):
            got, want = x.cumsum(dim), y.cumsum(dim)
            assert got.dtype == loom.int64 and want.dtype == torch.int64
            np.testing.assert_array_equal(got.numpy(), want.numpy())
            np.testing.assert_array_equal(x.prod(dim).numpy(), y.prod(dim).numpy())
            np.testing.assert_array_equal(x.cumprod(dim).numpy(), y.cumprod(dim).numpy())
        assert x.prod().item() == y.prod().item()
    big = loom.tensor([2**40, 2**30], dtype=loom.int64)  # wraps as torch's
    assert big.prod().item() == torch.tensor([2**40, 2**30]).prod().item()


@pytest.mark.parametrize("ord", [2, 1, math.inf, -math.inf, 3, 0.5])
def test_vector_norm(ord):
    a = rng.standard_normal((3, 4, 5))
    for dim in (None, 0, -1, (0, 2), (-1, 1)):
        for keepdim in (False, True):
            x, y = pair(a)
            check(loom.linalg.vector_norm(x, ord, dim, keepdim),
                  torch.linalg.vector_norm(y, ord, dim, keepdim), [(x, y)], rng, RTOL, ATOL)
    x, y = pair(a)
    check(x.norm(), y.norm(), [(x, y)], rng, RTOL, ATOL)
    x, y = pair(a)
    check(x.norm(ord if ord != 0.5 else 2, dim=1), y.norm(ord if ord != 0.5 else 2, dim=1),
          [(x, y)], rng, RTOL, ATOL)


def test_norm_at_zero_has_a_zero_gradient_and_counts_nonzeros():
    x = loom.zeros(4, requires_grad=True)
    n = x.norm()
    n.backward()
    assert n.item() == 0.0 and x.grad.numpy().tolist() == [0.0] * 4
    a = np.array([[0.0, 1.5, 0.0], [2.0, -1.0, 0.0]], dtype=np.float32)
    np.testing.assert_array_equal(loom.linalg.vector_norm(loom.tensor(a), 0, dim=1).numpy(),
                                  torch.linalg.vector_norm(torch.tensor(a), 0, dim=1).numpy())


def test_where_and_masked_fill_with_integers_follow_torch():
    a = rng.integers(-5, 6, (3, 4))
    for dtype, tdtype in ((loom.int64, torch.int64), (loom.int32, torch.int32)):
        x, y = loom.tensor(a).to(dtype), torch.tensor(a).to(tdtype)
        for other in (0, -7, 2.5):
            got, want = loom.where(x > 0, x, other), torch.where(y > 0, y, other)
            assert str(got.dtype).split(".")[-1] == str(want.dtype).split(".")[-1]
            np.testing.assert_array_equal(got.numpy(), want.numpy())
        got = loom.where(x > 0, x.to(loom.int64), x.to(loom.int32) * 2)  # i64 with i32: i64
        want = torch.where(y > 0, y.to(torch.int64), y.to(torch.int32) * 2)
        assert got.dtype == loom.int64 and want.dtype == torch.int64
        np.testing.assert_array_equal(got.numpy(), want.numpy())
        np.testing.assert_array_equal(x.masked_fill(x < 0, 100).numpy(),
                                      y.masked_fill(y < 0, 100).numpy())
    # An integer beside a float: the float's dtype, and its gradient.
    f, tf = pair(rng.standard_normal((3, 4)))
    xi, yi = loom.tensor(a), torch.tensor(a)
    check(loom.where(xi > 0, xi, f), torch.where(yi > 0, yi, tf), [(f, tf)], rng, RTOL, ATOL)
    # Broadcasting the condition and the operands.
    row = loom.tensor(a[:1])
    np.testing.assert_array_equal(loom.where(loom.tensor(a) > 0, row, 9).numpy(),
                                  torch.where(torch.tensor(a) > 0, torch.tensor(a[:1]), 9).numpy())


def test_errors_name_what_is_wrong():
    x = loom.ones(2, 3)
    with pytest.raises(IndexError, match="cumsum: dim 2 is out of range for a 2-dim tensor"):
        x.cumsum(2)
    with pytest.raises(IndexError, match="prod: dim -3 is out of range"):
        x.prod(-3)
    with pytest.raises(TypeError, match="vector_norm: expected a floating tensor"):
        loom.linalg.vector_norm(loom.ones(3, dtype=loom.int64))
    with pytest.raises(ValueError, match="ord must be"):
        loom.linalg.vector_norm(x, -2)
    with pytest.raises(ValueError, match="norm: p 'nuc' is not supported"):
        x.norm("nuc")


@pytest.mark.parametrize("equation,shapes", [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 5, 4), (2, 3, 6, 4)]),
    ("ij,jk", [(3, 4), (4, 5)]),
    ("i,j->ij", [(3,), (4,)]),
    ("i,i->", [(5,), (5,)]),
    ("ij->ji", [(3, 4)]),
    ("ijk->j", [(2, 3, 4)]),
    ("ij->", [(3, 4)]),
    ("...ij,...jk->...ik", [(2, 2, 3, 4), (2, 2, 4, 5)]),
    ("bij,jk->bki", [(2, 3, 4), (4, 5)]),
    ("ijk,ikl->jl", [(3, 2, 4), (3, 4, 5)]),
    ("ij,kl->ijkl", [(2, 3), (4, 5)]),
    ("abc,cd->", [(2, 3, 4), (4, 5)]),
    # Three and four operands (contracted left to right).
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("i,i,i->", [(4,), (4,), (4,)]),
    ("bi,bj,bk->bijk", [(2, 3), (2, 4), (2, 2)]),
    ("ab,bc,cd,da->", [(2, 3), (3, 4), (4, 2), (2, 2)]),
    ("...i,ij,j->...", [(2, 3, 4), (4, 5), (5,)]),
    # Diagonals and traces.
    ("ii->i", [(4, 4)]),
    ("ii", [(4, 4)]),
    ("iij->ji", [(3, 3, 2)]),
    ("ijij->ij", [(2, 3, 2, 3)]),
    ("ii,ij->j", [(3, 3), (3, 4)]),
])
def test_einsum_against_torch(equation, shapes):
    leaves = [pair(rng.standard_normal(s)) for s in shapes]
    got = loom.einsum(equation, *[x for x, _ in leaves])
    want = torch.einsum(equation, *[y for _, y in leaves])
    check(got, want, leaves, rng, RTOL, ATOL)


def test_einsum_errors():
    a, b = loom.ones(2, 3), loom.ones(4, 5)
    with pytest.raises(ValueError, match="'j' has size 3 and 4"):
        loom.einsum("ij,jk->ik", a, b)
    with pytest.raises(ValueError, match="'i' has size 3 and 4"):
        loom.einsum("ii->i", loom.ones(3, 4))
    with pytest.raises(ValueError, match="name 3 dims, the operand has 2"):
        loom.einsum("ijk->i", a)
    with pytest.raises(ValueError, match="has 3 operands, 2 given"):
        loom.einsum("i,i,i->", loom.ones(2), loom.ones(2))
    with pytest.raises(ValueError, match="no operands"):
        loom.einsum("i->i")
