"""Random tensors from loom's global generator, stack, linspace, eye, tril and triu: against
PyTorch where the values are defined (stack, linspace, eye, tril/triu, with gradients), and by
their distribution and reproducibility where they are random (loom's numbers are not PyTorch's:
See Note [The Python generator] in python/src/creation_ops.cpp)."""

import numpy as np
import pytest

import loom

torch = pytest.importorskip("torch")
rng = np.random.default_rng(7)


def test_manual_seed_reproduces_draws_in_order():
    loom.manual_seed(1234)
    a, b = loom.randn(3, 4), loom.rand(5)
    loom.manual_seed(1234)
    np.testing.assert_array_equal(loom.randn(3, 4).numpy(), a.numpy())
    np.testing.assert_array_equal(loom.rand(5).numpy(), b.numpy())
    # Successive draws differ; another seed differs.
    assert not np.array_equal(loom.randn(3, 4).numpy(), a.numpy())
    loom.manual_seed(99)
    assert not np.array_equal(loom.randn(3, 4).numpy(), a.numpy())
    assert loom.initial_seed() == 99


def test_random_distributions():
    loom.manual_seed(0)
    n = loom.randn(200000).numpy().astype(np.float64)
    assert abs(n.mean()) < 0.01 and abs(n.std() - 1.0) < 0.01  # 4+ standard errors of slack
    u = loom.rand(200000).numpy()
    assert u.min() >= 0.0 and u.max() < 1.0 and abs(u.mean() - 0.5) < 0.005
    i = loom.randint(3, 10, (100000,))
    assert i.dtype is loom.int64
    v = i.numpy()
    assert v.min() == 3 and v.max() == 9
    counts = np.bincount(v - 3, minlength=7) / len(v)
    np.testing.assert_allclose(counts, 1 / 7, atol=0.01)
    assert loom.randint(5, size=(2, 3)).shape == (2, 3)
    h = loom.randn(2, 3, dtype=loom.bfloat16, requires_grad=True)
    assert h.dtype is loom.bfloat16 and h.requires_grad
    with pytest.raises(ValueError, match="low < high"):
        loom.randint(5, 5, (2,))


def test_in_place_fills():
    loom.manual_seed(3)
    t = loom.zeros(100000)
    t.normal_(2.0, 0.5)
    x = t.numpy()
    assert abs(x.mean() - 2.0) < 0.01 and abs(x.std() - 0.5) < 0.01
    t.uniform_(-1.0, 1.0)
    assert t.numpy().min() >= -1.0 and t.numpy().max() < 1.0
    w = loom.zeros(3, requires_grad=True)
    with pytest.raises(ValueError, match="no_grad"):
        w.normal_()
    with loom.no_grad():
        w.normal_()


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_stack_matches_torch_with_gradients(dim):
    xs = [rng.standard_normal((3, 4)).astype(np.float32) for _ in range(3)]
    lx = [loom.tensor(x, requires_grad=True) for x in xs]
    tx = [torch.tensor(x, requires_grad=True) for x in xs]
    lo, to = loom.stack(lx, dim), torch.stack(tx, dim)
    np.testing.assert_array_equal(lo.detach().numpy(), to.detach().numpy())
    g = rng.standard_normal(tuple(to.shape)).astype(np.float32)
    lo.backward(loom.tensor(g))
    to.backward(torch.tensor(g))
    for a, b in zip(lx, tx):
        np.testing.assert_array_equal(a.grad.numpy(), b.grad.numpy())
    with pytest.raises(ValueError, match="equal shapes"):
        loom.stack([loom.zeros(2), loom.zeros(3)])


@pytest.mark.parametrize("args", [(0, 1, 5), (-2.5, 7.0, 11), (3, 3, 1), (0, 1, 0), (1, -1, 4)])
def test_linspace_and_eye_match_torch(args):
    np.testing.assert_allclose(loom.linspace(*args).numpy(), torch.linspace(*args).numpy(),
                               rtol=1e-6, atol=1e-7)
    for n, m in ((3, None), (2, 4), (0, 2)):
        np.testing.assert_array_equal(loom.eye(n, m).numpy(), torch.eye(n, m or n).numpy())


@pytest.mark.parametrize("diagonal", [0, 1, -1, 5])
def test_tril_triu_match_torch_with_gradients(diagonal):
    x = rng.standard_normal((2, 4, 5)).astype(np.float32)
    for name in ("tril", "triu"):
        lx, tx = loom.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
        lo, to = getattr(loom, name)(lx, diagonal), getattr(torch, name)(tx, diagonal)
        np.testing.assert_array_equal(lo.detach().numpy(), to.detach().numpy())
        np.testing.assert_array_equal(getattr(lx, name)(diagonal).detach().numpy(), lo.detach().numpy())
        lo.sum().backward()
        to.sum().backward()
        np.testing.assert_array_equal(lx.grad.numpy(), tx.grad.numpy())
    with pytest.raises(ValueError, match="at least 2 dims"):
        loom.tril(loom.zeros(3))


def test_a_causal_mask_built_as_pytorch_scripts_build_it():
    t = 5
    mask = loom.tril(loom.ones(t, t)) == 0
    scores = loom.tensor(rng.standard_normal((t, t)).astype(np.float32))
    masked = scores.masked_fill(mask, float("-inf"))
    ref = torch.tensor(scores.numpy()).masked_fill(torch.tril(torch.ones(t, t)) == 0, float("-inf"))
    np.testing.assert_array_equal(masked.numpy(), ref.numpy())
