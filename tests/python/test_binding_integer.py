"""Integer tensors as PyTorch's (Note [Integer operands] in core/ops/integer.cpp): arithmetic
with Python's // and % signs, sums of masks as int64 (the accuracy line of every eval loop),
promotion with floats and Python numbers, against Debian's torch."""
import numpy as np
import pytest

import loom

torch = pytest.importorskip("torch")

A = np.array([-7, -3, 0, 2, 5, 9], dtype=np.int64)
DTYPES = {"int64": loom.int64, "float32": loom.float32, "uint8": loom.uint8}

CASES = {
    "t + 1": lambda t: t + 1, "t * 2": lambda t: t * 2, "-t": lambda t: -t,
    "t + t": lambda t: t + t, "t * t": lambda t: t * t, "3 - t": lambda t: 3 - t,
    "t // 2": lambda t: t // 2, "t % 3": lambda t: t % 3, "t // -2": lambda t: t // -2,
    "t % -3": lambda t: t % -3, "7 // t[3:]": lambda t: 7 // t[3:],
    "t.sum()": lambda t: t.sum(), "sum(0, keepdim)": lambda t: t.reshape(2, 3).sum(0, keepdim=True),
    "sum(1)": lambda t: t.reshape(2, 3).sum(1), "float * 0.5 + t": lambda t: t.float() * 0.5 + t,
    "t / 2": lambda t: t / 2, "t * 2.0": lambda t: t * 2.0, "t + 1.5": lambda t: t + 1.5,
    "t / t": lambda t: t / t[3:4],
    "broadcast": lambda t: t.reshape(2, 3)[:, :1] * t.reshape(2, 3),
    "t.floor_divide(4)": lambda t: t.floor_divide(4), "t.remainder(4)": lambda t: t.remainder(4),
}


@pytest.mark.parametrize("name", list(CASES))
def test_integer_ops_match_torch(name):
    f = CASES[name]
    want = f(torch.tensor(A))
    got = f(loom.tensor(A))
    assert got.dtype == DTYPES[str(want.dtype).split(".")[-1]], (got.dtype, want.dtype)
    np.testing.assert_array_equal(np.asarray(got.tolist()), want.numpy())


def test_accuracy_of_a_batch_counts_in_int64():
    rng = np.random.default_rng(3)
    logits, labels = rng.standard_normal((64, 10)).astype(np.float32), rng.integers(0, 10, 64)
    pred = loom.tensor(logits).argmax(-1)
    correct = (pred == loom.tensor(labels)).sum()
    assert correct.dtype == loom.int64
    assert correct.item() == int((logits.argmax(-1) == labels).sum())
    assert (pred == loom.tensor(labels)).float().mean().item() == pytest.approx(
        float((logits.argmax(-1) == labels).mean()))


def test_uint8_wraps_and_zero_divisors_are_errors():
    b = loom.tensor(np.array([250, 3], dtype=np.uint8))
    assert (b + b).tolist() == (torch.tensor([250, 3], dtype=torch.uint8) * 2).tolist()
    assert (-b).tolist() == [6, 253]
    with pytest.raises(ValueError, match="floor_divide: integer division by zero"):
        loom.tensor(A) // loom.tensor(np.array([0], dtype=np.int64))
    with pytest.raises(ValueError, match="remainder: integer division by zero"):
        loom.tensor(A) % 0
    with pytest.raises(ValueError, match="floor_divide: integer tensors only"):
        loom.ones(2) // 2


def test_in_place_ops_on_integer_tensors_and_by_tensors():
    a, ta = loom.arange(5), torch.arange(5)
    a += 1
    a *= 3
    a -= 2
    ta += 1
    ta *= 3
    ta -= 2
    assert a.dtype == loom.int64 and a.tolist() == ta.tolist()
    x, tx = loom.ones(2, 3), torch.ones(2, 3)
    x *= loom.arange(3) > 0  # t *= mask, the mask broadcast over the rows
    tx *= torch.arange(3) > 0
    x *= loom.tensor(np.array([[2.0], [3.0]], dtype=np.float32))
    tx *= torch.tensor([[2.0], [3.0]])
    np.testing.assert_array_equal(x.numpy(), tx.numpy())
    with pytest.raises(ValueError, match="a f32 result cannot be written into the i64 tensor"):
        a += 0.5
    with pytest.raises(ValueError, match=r"the result \[2, 3\] does not fit in place into \[3\]"):
        y = loom.ones(3)
        y *= loom.ones(2, 3)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gather_matches_torch(dim):
    # torch.gather, composed from integer arithmetic and an index lookup: values and gradients
    # (an index used twice adds its gradients), on an index smaller than the input off dim.
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    size = x.shape[dim]
    shape = [2, 3, 4]
    shape[dim] = 6
    idx = rng.integers(0, size, shape)
    tx = torch.tensor(x, requires_grad=True)
    lx = loom.tensor(x, requires_grad=True)
    want = torch.gather(tx, dim, torch.tensor(idx))
    got = loom.gather(lx, dim, loom.tensor(idx))
    np.testing.assert_array_equal(got.detach().numpy(), want.detach().numpy())
    g = rng.standard_normal(want.shape).astype(np.float32)
    want.backward(torch.tensor(g))
    got.backward(loom.tensor(g))
    np.testing.assert_allclose(lx.grad.numpy(), tx.grad.numpy(), rtol=1e-6, atol=1e-6)
    # The method form, and log-probabilities of targets (the common use).
    logp = loom.tensor(x[0])  # [4, 5]
    targets = rng.integers(0, 5, (4, 1))
    np.testing.assert_array_equal(logp.gather(1, loom.tensor(targets)).numpy(),
                                  np.take_along_axis(x[0], targets, 1))


def test_gather_refuses_bad_indices():
    x = loom.ones(2, 3)
    with pytest.raises(ValueError, match=r"1 index value\(s\) outside \[0, 3\) along dim 1"):
        loom.gather(x, 1, loom.tensor(np.array([[0, 3], [1, 2]])))
    with pytest.raises(ValueError, match="index has 1 dims, input 2"):
        loom.gather(x, 1, loom.tensor(np.array([0])))
    with pytest.raises(IndexError, match="dim 2 is out of range"):
        x.gather(2, loom.tensor(np.array([[0]])))
