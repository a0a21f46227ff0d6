"""In-place ops on tensors in a graph, as PyTorch records them (See Note [In-place ops and views]
in core/autograd.h): `h += y`, `h.mul_(y)`, `h[:, 0] = v`, `h[mask] = v`, writes through views
and views read after a write give PyTorch's values and gradients (Debian's python3-torch is the
reference, from the same inputs); a leaf that requires grad is refused while grad is on, as
PyTorch refuses it."""

import numpy as np
import pytest

import loom

torch = pytest.importorskip("torch")


def _inputs(shapes, seed):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    ours = [loom.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    return ours, theirs


def _same_as_torch(fn, shapes=((3, 4), (3, 4)), seed=0):
    ours, theirs = _inputs(shapes, seed)
    out, ref = fn(loom, *ours), fn(torch, *theirs)
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), rtol=1e-5, atol=1e-6)
    weights = np.random.default_rng(seed + 1).standard_normal(tuple(ref.shape)).astype(np.float32)
    (out * loom.tensor(weights)).sum().backward()
    (ref * torch.tensor(weights)).sum().backward()
    for a, b in zip(ours, theirs):
        expected = np.zeros(tuple(b.shape), np.float32) if b.grad is None else b.grad.numpy()
        got = np.zeros(tuple(b.shape), np.float32) if a.grad is None else a.grad.numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def _arithmetic(m, x, y):
    h = x * 2
    h.add_(y)
    h.sub_(y, alpha=0.5)
    h.mul_(y)
    h += 1.0
    h -= x
    h *= x
    h /= y * y + 1
    h.div_(2.0)
    return h


def _methods(m, x, y):
    h = x * 1
    h.clamp_(-0.5, 0.5)
    h.masked_fill_(y > 0, 1.5)
    h.copy_(h + y)
    h.pow_(2)
    h.neg_()
    h.tanh_()  # last: PyTorch's tanh_ keeps its output, so a later write would fail there
    return h


def _setitem_basic(m, x, y):
    h = x * 1
    h[:, 0] = y[:, 0]
    h[1] *= 3.0
    h[0, 1:3] += y[0, 1:3]
    h[-1, ...] = 0.25
    h[:, None, 2] = y[:, None, 3] * x[:, None, 1]
    return h * x


def _setitem_advanced(m, x, y):
    h = x * 1
    h[y > 0.3] = (y * 3)[y > 0.3]
    h[m.tensor([2, 0])] = y[:2] * 2
    h[:, m.tensor([1, 3])] = x[:, :2]
    h[x < -1] = 0.0
    return h * y


def _views_of_the_written_tensor(m, x, y):
    h = x * 1
    row0 = h[0]
    column1 = h[:, 1]
    transposed = h.T
    row0.mul_(y[0])  # h, column1 and transposed see it, with its history
    h.add_(y)  # row0 sees this one
    return m.stack([(transposed * 2).sum(0), column1 * row0[1], (row0 * row0)[:3]])


def _buffer_filled_from_a_graph(m, x, y):
    out = m.zeros(3, 4)
    for i in range(3):
        out[i] = x[i] * y[i]
    out[:, 1:3] = out[:, 1:3] * 2
    return out


def _strided_view(m, x, y):
    h = (x * 1).reshape(12)
    h[::2] = y.reshape(12)[1::2]
    h[1::3] *= 4.0
    return h * h


def _zero_and_fill(m, x, y):
    a = x * 1
    a.zero_()
    b = x + 1
    b.fill_(2.0)
    c = x * 3
    c[1].zero_()
    return a + b * y + c


@pytest.mark.parametrize(
    "fn",
    [_arithmetic, _methods, _setitem_basic, _setitem_advanced, _views_of_the_written_tensor,
     _buffer_filled_from_a_graph, _strided_view, _zero_and_fill],
    ids=lambda f: f.__name__.strip("_"))
def test_in_place_ops_give_pytorchs_values_and_gradients(fn):
    _same_as_torch(fn)


def test_a_written_tensor_gives_the_out_of_place_gradients_in_a_layer():
    # What a script writes: a residual added in place inside a module's forward.
    def forward(m, x, w):
        h = x @ w
        h += x
        h[:, :2] = h[:, :2].relu()
        return h.softmax(-1)
    _same_as_torch(forward, ((5, 4), (4, 4)))


@pytest.mark.parametrize("write", ["add_", "iadd", "setitem", "view_mul_", "copy_", "fill_"])
def test_a_leaf_that_requires_grad_is_refused_while_grad_is_on(write):
    w = loom.tensor([1.0, 2.0, 3.0], requires_grad=True)
    with pytest.raises(ValueError, match="leaf that requires grad") as info:
        if write == "add_":
            w.add_(1.0)
        elif write == "iadd":
            w += 1.0
        elif write == "setitem":
            w[0] = 5.0
        elif write == "view_mul_":
            w[1:].mul_(2.0)
        elif write == "copy_":
            w.copy_(loom.zeros(3))
        else:
            w.fill_(0.0)
    assert "no_grad" in str(info.value)
    np.testing.assert_allclose(w.detach().numpy(), [1.0, 2.0, 3.0])
    with loom.no_grad():  # an optimizer-style update is fine there
        w.add_(1.0)
    np.testing.assert_allclose(w.detach().numpy(), [2.0, 3.0, 4.0])
    assert w.is_leaf


def test_an_output_saved_for_backward_and_then_written_raises_as_in_pytorch():
    x = loom.tensor([1.0, 2.0], requires_grad=True)
    h = x.sigmoid()  # keeps its output for backward
    h.add_(1.0)
    with pytest.raises(ValueError, match="modified by an in-place operation"):
        h.sum().backward()


def test_a_stale_view_of_a_freed_tensor_says_what_to_do():
    x = loom.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    h = x * 1
    first, last = h[:2], h[2:]
    first.zero_()
    del h
    with pytest.raises(ValueError, match="has since been freed"):
        (last * 2).sum()


@pytest.mark.skipif(not loom.cuda_is_available(), reason="no CUDA device")
@pytest.mark.parametrize(
    "fn", [_arithmetic, _setitem_basic, _views_of_the_written_tensor, _strided_view],
    ids=lambda f: f.__name__.strip("_"))
def test_cuda_matches_cpu(fn):
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal((3, 4)).astype(np.float32) for _ in range(2)]
    results = []
    for device in ("cpu", "cuda"):
        xs = [loom.tensor(a).to(device).requires_grad_(True) for a in arrays]
        out = fn(loom, *xs)
        out.sum().backward()
        results.append([out.detach().to("cpu").numpy()] +
                       [x.grad.to("cpu").numpy() for x in xs])
    for cpu, gpu in zip(*results):
        np.testing.assert_allclose(gpu, cpu, rtol=1e-5, atol=1e-6)
