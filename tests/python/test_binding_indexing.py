"""t[...] and t[...] = value against PyTorch: ints (negative too), slices with steps, None,
Ellipsis, integer index tensors and lists, uint8 masks (PyTorch's bool masks), with gradients
(repeated indices sum)."""

import numpy as np
import pytest

import loom

torch = pytest.importorskip("torch")
rng = np.random.default_rng(11)
X = rng.standard_normal((4, 5, 6)).astype(np.float32)


def lt(index):
    """loom index for a torch one: bool tensors become uint8 masks."""
    if isinstance(index, tuple):
        return tuple(lt(i) for i in index)
    if isinstance(index, torch.Tensor):
        return loom.tensor(index.numpy().astype(np.uint8 if index.dtype == torch.bool else np.int64))
    return index


CASES = [
    0, -1, (1, 2), (slice(None), -1), (Ellipsis, 0), (None, 1), (slice(1, 3),),
    (slice(None, None, 2), slice(1, None, 3)), (Ellipsis, None, slice(2, 4)),
    (slice(None), torch.tensor([4, 0, 0, -1])), torch.tensor([[0, 1], [3, 3]]),
    (slice(None), slice(None), torch.tensor([5])), [2, 0],
    torch.tensor(X[:, 0, 0] > 0), (slice(None), torch.tensor(X[0] > 0.5)),
    (1, slice(None), torch.tensor([1, 1, 2])), (slice(-10, 10),), (Ellipsis,),
]


@pytest.mark.parametrize("index", CASES, ids=[str(i)[:40] for i in range(len(CASES))])
def test_getitem_matches_torch_with_gradients(index):
    lx, tx = loom.tensor(X, requires_grad=True), torch.tensor(X, requires_grad=True)
    lo, to = lx[lt(index)], tx[index]
    assert tuple(lo.shape) == tuple(to.shape)
    np.testing.assert_array_equal(lo.detach().numpy(), to.detach().numpy())
    g = rng.standard_normal(tuple(to.shape)).astype(np.float32)
    lo.backward(loom.tensor(g))
    to.backward(torch.tensor(g))
    np.testing.assert_allclose(lx.grad.numpy(), tx.grad.numpy(), rtol=1e-6, atol=1e-6)


def test_integer_tensors_index_too():
    v = np.arange(20, dtype=np.int64).reshape(4, 5)
    np.testing.assert_array_equal(loom.tensor(v)[:, [4, 0]].numpy(), v[:, [4, 0]])
    np.testing.assert_array_equal(loom.tensor(v)[loom.tensor(v) > 7].numpy().ravel(), v[v > 7])
    assert int(loom.tensor(v)[2, 3]) == 13


def test_index_errors_are_clear():
    t = loom.zeros(2, 3)
    with pytest.raises(IndexError, match="out of bounds"):
        t[2]
    with pytest.raises((IndexError, ValueError), match="out of bounds"):
        t[:, loom.tensor(np.array([3]))]
    with pytest.raises(IndexError, match="too many indices"):
        t[0, 0, 0]
    with pytest.raises(IndexError, match="at most one index tensor"):
        t[[0], [1]]
    with pytest.raises(IndexError, match="does not match"):
        t[loom.zeros(3, dtype=loom.uint8)]


def test_setitem_basic_forms_match_torch():
    lx, tx = loom.tensor(X.copy()), torch.tensor(X.copy())
    for index, value in [((0, 1), 7.0), ((slice(None), -1), 2.5), ((Ellipsis, 0), -1.0),
                         ((1,), np.ones((5, 6), np.float32)), ((slice(1, 3), 2), np.arange(6, dtype=np.float32))]:
        lx[index] = loom.tensor(value) if isinstance(value, np.ndarray) else value
        tx[index] = torch.tensor(value) if isinstance(value, np.ndarray) else value
    np.testing.assert_array_equal(lx.numpy(), tx.numpy())
    w = loom.zeros(3, requires_grad=True)
    with pytest.raises(ValueError, match="no_grad"):
        w[0] = 1.0
    with loom.no_grad():
        w[0] = 1.0
    assert w.detach().numpy()[0] == 1.0


def test_setitem_through_masks_and_index_tensors_matches_torch():
    lx, tx = loom.tensor(X.copy()), torch.tensor(X.copy())
    lx[lx > 0] = 0.0  # a mask over every dim
    tx[tx > 0] = 0.0
    lx[:, lx[0, :, 0] < -0.5] = -7.0  # a mask over one dim, broadcast value
    tx[:, tx[0, :, 0] < -0.5] = -7.0
    lx[:, [4, 0], 1:3] = loom.tensor(np.arange(4, dtype=np.float32).reshape(2, 2))
    tx[:, [4, 0], 1:3] = torch.arange(4, dtype=torch.float32).reshape(2, 2)
    lx[loom.tensor(np.array([1, 0]))] = loom.ones(5, 6) * 3  # an index tensor
    tx[torch.tensor([1, 0])] = torch.ones(5, 6) * 3
    np.testing.assert_array_equal(lx.numpy(), tx.numpy())
    # Integer tensors (labels), a view, and CUDA-free int64 values beyond float32's range.
    labels = np.array([[5, 2, 0], [7, 0, 3]], np.int64)
    ll, tl = loom.tensor(labels), torch.tensor(labels)
    ll[ll == 0] = -100
    tl[tl == 0] = -100
    ll[1][ll[1] > 4] = 2**40 + 1
    tl[1][tl[1] > 4] = 2**40 + 1
    np.testing.assert_array_equal(ll.numpy(), tl.numpy())
    # A place named twice has no defined result (PyTorch: undefined): refused, nothing written.
    before = lx.numpy().copy()
    with pytest.raises(ValueError, match="written twice"):
        lx[loom.tensor(np.array([0, 0]))] = 1.0
    np.testing.assert_array_equal(lx.numpy(), before)
    with pytest.raises(ValueError, match="index 4 is out of bounds for dim 0 with size 4"):
        lx[loom.tensor(np.array([4]))] = 1.0  # as reading lx[[4]] says


def test_last_token_logits_as_generation_code_writes_them():
    logits = loom.tensor(X, requires_grad=True)
    last = logits[:, -1, :]
    np.testing.assert_array_equal(last.detach().numpy(), X[:, -1, :])
    top = last.argmax(-1)
    np.testing.assert_array_equal(top.numpy(), X[:, -1, :].argmax(-1))
