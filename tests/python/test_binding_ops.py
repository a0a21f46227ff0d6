"""Operators and loom.nn.functional: values against numpy / closed forms, and gradients against
finite differences of a float64 numpy reference (tolerances in binding_testing.py)."""

import numpy as np
import pytest

import loom
import loom.nn.functional as F
from binding_testing import check_grad, f32

rng = np.random.default_rng(1234)


def randn(*shape):
    return rng.standard_normal(shape)


def np_softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def np_gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def np_layer_norm(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def np_attention(q, k, v, causal):
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        t = q.shape[-2]
        s = np.where(np.tril(np.ones((t, t), dtype=bool)), s, -np.inf)
    return np_softmax(s) @ v


def test_arithmetic_operators_with_tensors_and_scalars():
    a, b = f32(randn(3, 4)), f32(randn(4))
    ta, tb = loom.tensor(a), loom.tensor(b)
    np.testing.assert_allclose((ta + tb).numpy(), a + b, rtol=1e-6)
    np.testing.assert_allclose((ta - tb).numpy(), a - b, rtol=1e-6)
    np.testing.assert_allclose((tb - ta).numpy(), b - a, rtol=1e-6)
    np.testing.assert_allclose((ta * tb).numpy(), a * b, rtol=1e-6)
    np.testing.assert_allclose((ta + 2).numpy(), a + 2, rtol=1e-6)
    np.testing.assert_allclose((2 - ta).numpy(), 2 - a, rtol=1e-6)
    np.testing.assert_allclose((ta * 3.5).numpy(), a * 3.5, rtol=1e-6)
    np.testing.assert_allclose((0.5 * ta).numpy(), a * 0.5, rtol=1e-6)
    np.testing.assert_allclose((ta / 4).numpy(), a / 4, rtol=1e-6)
    np.testing.assert_allclose((-ta).numpy(), -a)
    with pytest.raises(TypeError):
        ta + "x"


def test_matmul_including_pytorch_vector_rules():
    a, b, v = f32(randn(2, 3, 4)), f32(randn(4, 5)), f32(randn(4))
    ta, tb, tv = loom.tensor(a), loom.tensor(b), loom.tensor(v)
    np.testing.assert_allclose((ta @ tb).numpy(), a @ b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose((ta @ tv).numpy(), a @ v, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose((tv @ tb).numpy(), v @ b, rtol=1e-5, atol=1e-6)
    assert (tv @ tv).shape == () and abs((tv @ tv).item() - v @ v) < 1e-5
    np.testing.assert_allclose(loom.matmul(ta, tb).numpy(), a @ b, rtol=1e-5, atol=1e-6)


def test_reductions_and_shapes():
    a = f32(randn(2, 3, 4))
    t = loom.tensor(a)
    np.testing.assert_allclose(t.sum().item(), a.sum(), rtol=1e-5)
    np.testing.assert_allclose(t.mean().item(), a.mean(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(t.sum(1).numpy(), a.sum(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(t.mean(-1, keepdim=True).numpy(), a.mean(-1, keepdims=True),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(t.sum((0, 2)).numpy(), a.sum((0, 2)), rtol=1e-5, atol=1e-6)
    assert t.sum(keepdim=True).shape == (1, 1, 1)
    assert t.reshape(6, 4).shape == (6, 4) and t.reshape((4, -1)).shape == (4, 6)
    np.testing.assert_array_equal(t.transpose(0, 2).numpy(), a.transpose(2, 1, 0))
    np.testing.assert_array_equal(t.narrow(1, 1, 2).numpy(), a[:, 1:3])
    np.testing.assert_array_equal(loom.cat([t, t], 1).numpy(), np.concatenate([a, a], 1))


def test_functional_values_against_closed_forms():
    x = f32(randn(3, 5))
    t = loom.tensor(x)
    np.testing.assert_allclose(F.relu(t).numpy(), np.maximum(x, 0))
    np.testing.assert_allclose(F.sigmoid(t).numpy(), 1 / (1 + np.exp(-x)), rtol=1e-6)
    np.testing.assert_allclose(F.gelu(t).numpy(), np_gelu(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(F.softmax(t, dim=0).numpy(), np_softmax(x, 0), rtol=1e-5)
    np.testing.assert_allclose(F.softmax(t).sum(-1).numpy(), np.ones(3), rtol=1e-6)
    # cross-entropy of uniform logits is log(V), whatever the targets.
    uniform = loom.zeros(4, 7)
    loss = F.cross_entropy(uniform, loom.tensor([0, 3, 6, 2]))
    assert abs(loss.item() - np.log(7)) < 1e-6


@pytest.mark.parametrize("name", ["add", "sub", "mul", "scalar", "matmul", "matvec", "sum_dim",
                                  "mean", "views"])
def test_gradients_of_tensor_ops(name):
    cases = {
        "add": (lambda a, b: a + b, lambda a, b: a + b, [randn(2, 3), randn(3)]),
        "sub": (lambda a, b: b - a, lambda a, b: b - a, [randn(2, 3), randn(3)]),
        "mul": (lambda a, b: a * b, lambda a, b: a * b, [randn(2, 3), randn(3)]),
        "scalar": (lambda a: 3 - 2.5 * a / 2 + 1, lambda a: 3 - 2.5 * a / 2 + 1, [randn(4)]),
        "matmul": (lambda a, b: a @ b, lambda a, b: a @ b, [randn(2, 3, 4), randn(4, 5)]),
        "matvec": (lambda a, b: a @ b, lambda a, b: a @ b, [randn(3, 4), randn(4)]),
        "sum_dim": (lambda a: a.sum((0, 2), keepdim=True), lambda a: a.sum((0, 2), keepdims=True),
                    [randn(2, 3, 4)]),
        "mean": (lambda a: a.mean(1), lambda a: a.mean(1), [randn(3, 4)]),
        "views": (lambda a: a.transpose(0, 1).reshape(4, 3).narrow(0, 1, 2).contiguous() * 1.0,
                  lambda a: a.T.reshape(4, 3)[1:3], [randn(3, 4)]),
    }
    loom_fn, np_fn, inputs = cases[name]
    check_grad(loom_fn, np_fn, inputs)


@pytest.mark.parametrize("name", ["gelu", "relu", "sigmoid", "softmax_last", "softmax_dim0",
                                  "layer_norm", "linear"])
def test_gradients_of_functional_ops(name):
    x = randn(3, 6)
    if name == "relu":
        x = x + np.sign(x) * 0.1  # keep away from the kink at 0
    cases = {
        "gelu": (F.gelu, np_gelu, [x]),
        "relu": (F.relu, lambda a: np.maximum(a, 0), [x]),
        "sigmoid": (F.sigmoid, lambda a: 1 / (1 + np.exp(-a)), [x]),
        "softmax_last": (lambda a: F.softmax(a, -1), lambda a: np_softmax(a, -1), [x]),
        "softmax_dim0": (lambda a: F.softmax(a, dim=0), lambda a: np_softmax(a, 0), [x]),
        "layer_norm": (lambda a, w, b: F.layer_norm(a, (6,), w, b), np_layer_norm,
                       [x, 1 + 0.1 * randn(6), randn(6)]),
        "linear": (F.linear, lambda a, w, b: a @ w.T + b, [x, randn(4, 6), randn(4)]),
    }
    loom_fn, np_fn, inputs = cases[name]
    check_grad(loom_fn, np_fn, inputs)


@pytest.mark.parametrize("causal", [True, False])
def test_attention_gradients(causal):
    q, k, v = randn(1, 2, 4, 3), randn(1, 2, 4, 3), randn(1, 2, 4, 3)
    check_grad(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
               lambda q, k, v: np_attention(q, k, v, causal), [q, k, v])


def test_cross_entropy_value_and_gradient_with_ignore_index():
    logits = randn(5, 4)
    targets = np.array([1, 3, -100, 0, 2])

    def np_ce(z):
        keep = targets != -100
        lse = np.log(np.exp(z).sum(-1))
        return np.mean((lse - z[np.arange(5), np.where(keep, targets, 0)])[keep])

    t = loom.tensor(targets)
    check_grad(lambda z: F.cross_entropy(z, t, ignore_index=-100), np_ce, [logits])


def test_binary_cross_entropy_with_logits_gradients_in_both_arguments():
    def np_bce(x, y):
        return np.mean(np.maximum(x, 0) - x * y + np.log1p(np.exp(-np.abs(x))))

    check_grad(F.binary_cross_entropy_with_logits, np_bce, [randn(3, 4), rng.random((3, 4))])


def test_embedding_gradient_scatter_adds():
    idx = loom.tensor(np.array([[0, 2], [2, 3]]))
    weight = randn(4, 3)
    check_grad(lambda w: F.embedding(idx, w), lambda w: w[np.array([[0, 2], [2, 3]])], [weight])


def test_dropout_is_keyed_and_scales_kept_elements():
    x = loom.ones(64, 32, requires_grad=True)
    y = F.dropout(x, 0.25, stream="layer0")
    mask = y.detach().numpy() != 0
    np.testing.assert_allclose(y.detach().numpy()[mask], 1 / 0.75, rtol=1e-6)
    assert 0.65 < mask.mean() < 0.85
    # The mask is a pure function of the key.
    again = F.dropout(x, 0.25, stream="layer0").detach().numpy()
    np.testing.assert_array_equal(again, y.detach().numpy())
    other = F.dropout(x, 0.25, stream="layer1").detach().numpy()
    assert (other != y.detach().numpy()).any()
    assert (F.dropout(x, 0.25, stream="layer0", offset=1 << 32).detach().numpy() != again).any()
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), mask / 0.75, rtol=1e-6)
    np.testing.assert_array_equal(F.dropout(x, 0.5, training=False).detach().numpy(), 1.0)


def test_unsupported_pytorch_options_are_clear_errors():
    # gelu's approximate='none' and cross_entropy's reductions are supported now
    # (test_binding_nn_modules.py, test_binding_losses.py); layer_norm over several dims is not.
    x = loom.zeros(2, 3)
    with pytest.raises(ValueError, match="last dim"):
        F.layer_norm(x, (2, 3))
    with pytest.raises(ValueError, match="approximate"):
        F.gelu(x, approximate="cubic")


def test_comparisons_are_elementwise_as_numpy():
    # core/ops.h compare(): bool, as torch's, add's broadcasting either way
    # round, numbers on either side, NaN unequal to everything.
    rng = np.random.default_rng(3)
    a = rng.integers(-3, 4, size=(4, 5)).astype(np.float32)
    a[1, 2] = np.nan
    b = rng.integers(-3, 4, size=(5,)).astype(np.float32)
    ta, tb = loom.tensor(a), loom.tensor(b)
    with np.errstate(invalid="ignore"):
        cases = [
            (ta == tb, a == b), (ta != tb, a != b), (ta < tb, a < b), (ta <= tb, a <= b),
            (ta > tb, a > b), (ta >= tb, a >= b), (tb < ta, b < a), (tb >= ta, b >= a),
            (ta > 0, a > 0), (0 > ta, 0 > a), (2.5 <= ta, 2.5 <= a), (ta == 1, a == 1),
            (loom.eq(ta, tb), a == b), (ta.lt(tb), a < b), (loom.ge(ta, 1.0), a >= 1),
        ]
    for got, want in cases:
        assert got.dtype == loom.bool
        np.testing.assert_array_equal(got.numpy(), want)
    i = loom.tensor(np.array([[1, 5], [7, 5]], dtype=np.int64))
    np.testing.assert_array_equal((i == 5).numpy(), [[0, 1], [0, 1]])
    np.testing.assert_array_equal((i != loom.tensor(np.array([1, 5], dtype=np.int64))).numpy(),
                                  [[0, 0], [1, 0]])
    # Mixed dtypes are promoted as PyTorch's: an integer tensor and a float compare as f32.
    np.testing.assert_array_equal((i > 5.5).numpy(), [[False, False], [True, False]])
    ints = np.array([1, 2, 3, 4, 5], dtype=np.int64)
    np.testing.assert_array_equal((ta == loom.tensor(ints)).numpy(), a == ints)
    np.testing.assert_array_equal(((i > 4) == 1).numpy(), [[False, True], [True, True]])
    with pytest.raises(TypeError, match="eq: other must be a Tensor or a number"):
        loom.eq(ta, "x")
    # Tensors stay hashable by identity: dicts and sets find the same object (a list's `in`
    # compares element-wise first, ambiguous for several elements, as in PyTorch).
    assert ta in {tb, ta} and {ta: 1}[ta] == 1 and hash(ta) != hash(tb)
    assert (ta == None) is False and (ta != "x") is True  # noqa: E711


def test_division_by_tensors_and_numbers():
    # t / u is IEEE division with add's broadcasting either way round; number / t too; gradients
    # against numpy's closed forms (d(a/b)/da = 1/b, d(a/b)/db = -a/b^2, summed over broadcasts).
    rng = np.random.default_rng(11)
    a = rng.uniform(-1, 1, size=(4, 5)).astype(np.float32)
    b = rng.uniform(1, 2, size=(5,)).astype(np.float32)
    ta, tb = loom.tensor(a), loom.tensor(b)
    ta.requires_grad = True
    tb.requires_grad = True
    q = ta / tb
    np.testing.assert_array_equal(q.detach().numpy(), a / b)
    q.sum().backward()
    np.testing.assert_allclose(ta.grad.numpy(), np.broadcast_to(1 / b, a.shape), rtol=1e-6)
    np.testing.assert_allclose(tb.grad.numpy(), (-a / b**2).sum(0), rtol=1e-5)
    np.testing.assert_array_equal((tb / loom.tensor(np.abs(a) + 1)).detach().numpy(),
                                  b / (np.abs(a) + 1))
    np.testing.assert_array_equal((3.0 / tb).detach().numpy(), np.float32(3.0) / b)
    np.testing.assert_array_equal(ta.div(tb).detach().numpy(), a / b)
    with pytest.raises(ValueError, match="do not broadcast"):
        ta / loom.tensor(np.ones(4, np.float32))


def test_view_ops_as_numpy_with_gradients():
    # view, flatten, unsqueeze, squeeze, permute, .T, .mT: the shapes and values numpy gives, as
    # views (reshape / transpose underneath), and gradients flowing back through them.
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = loom.tensor(a)
    cases = [
        (t.view(6, 4), a.reshape(6, 4)), (t.view(-1), a.reshape(-1)),
        (t.flatten(), a.reshape(-1)), (t.flatten(1), a.reshape(2, 12)),
        (t.flatten(0, 1), a.reshape(6, 4)), (t.unsqueeze(0), a[None]),
        (t.unsqueeze(-1), a[..., None]), (t.unsqueeze(1), a[:, None]),
        (t.unsqueeze(1).squeeze(), a), (t.unsqueeze(1).squeeze(1), a),
        (t.squeeze(0), a), (t.permute(2, 0, 1), a.transpose(2, 0, 1)),
        (t.permute(-1, 1, 0), a.transpose(2, 1, 0)), (t.T, a.T), (t.mT, np.swapaxes(a, 1, 2)),
        (t.permute(1, 2, 0).flatten(), a.transpose(1, 2, 0).reshape(-1)),
    ]
    for got, want in cases:
        assert tuple(got.shape) == want.shape
        np.testing.assert_array_equal(got.numpy(), want)
    w = loom.tensor(a, requires_grad=True)
    weights = np.arange(24, dtype=np.float32).reshape(4, 2, 3) * 0.5
    (w.permute(2, 0, 1) * loom.tensor(weights)).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), weights.transpose(1, 2, 0))
    with pytest.raises(ValueError, match=r"no view of the tensor \[4, 2, 3\] \(strides "
                                         r"\[1, 12, 4\]\) has the shape \[24\]"):
        t.permute(2, 0, 1).view(24)
    with pytest.raises(IndexError, match=r"unsqueeze: dim 4 is out of range"):
        t.unsqueeze(4)
    with pytest.raises(ValueError, match="appears twice"):
        t.permute(0, 0, 1)
    with pytest.raises(ValueError, match="2 dims given for a 3-dim tensor"):
        t.permute(0, 1)


def test_arange_forms_and_like_constructors():
    # arange as PyTorch: int64 when every bound is an int, float32 otherwise; numpy's values.
    for args in [(5,), (2, 9, 3), (5, 0, -2), (-3, 3), (4, 4)]:
        got = loom.arange(*args)
        assert got.dtype == loom.int64
        np.testing.assert_array_equal(got.numpy(), np.arange(*args))
    for args in [(3.0,), (0, 1, 0.1), (1.5, -1, -0.5), (0, 2.5)]:
        got = loom.arange(*args)
        assert got.dtype == loom.float32
        np.testing.assert_allclose(got.numpy(), np.arange(*args, dtype=np.float64), rtol=1e-6)
    assert loom.arange(0, 3, dtype=loom.float32).dtype == loom.float32
    with pytest.raises(ValueError, match="step must be non-zero"):
        loom.arange(0, 3, 0)
    with pytest.raises(TypeError, match="must be numbers"):
        loom.arange(0, "3")
    t = loom.full((2, 3), 2.5)
    assert loom.zeros_like(t).numpy().tolist() == [[0.0] * 3] * 2
    assert loom.ones_like(t).numpy().tolist() == [[1.0] * 3] * 2
    assert loom.full_like(t, 7).numpy().tolist() == [[7.0] * 3] * 2
    assert loom.ones_like(t, dtype=loom.int64).dtype == loom.int64
    assert tuple(loom.empty_like(t).shape) == (2, 3)
    assert loom.zeros_like(t, requires_grad=True).requires_grad


def test_view_of_non_contiguous_tensors_matches_torch():
    # PyTorch's view also splits or merges dims of a non-contiguous tensor where the strides
    # allow it (nanoGPT's q.view(B, T, nh, hs) on a part of qkv.split), and refuses elsewhere.
    torch = pytest.importorskip("torch")
    a = np.random.default_rng(0).standard_normal((2, 3, 12)).astype(np.float32)
    cases = [
        lambda t: t.split(4, dim=2)[1].view(2, 3, 2, 2),
        lambda t: t.split(4, dim=2)[2].view(2, 3, 4, 1),
        lambda t: t.transpose(0, 1).view(3, 2, 3, 4),
        lambda t: t[:, 1:, :].view(2, 2, 3, 4),
        lambda t: t[:, :, ::2].view(2, 3, 3, 2),
        lambda t: t[:, 1].view(2, 3, 4),
        lambda t: t[:, :, :1].view(2, 3),
        lambda t: t.unsqueeze(1).view(2, 3, 12, 1),
        lambda t: t.transpose(1, 2)[:, :, 1:].view(2, 12, 2),
    ]
    for i, f in enumerate(cases):
        want = f(torch.tensor(a))
        leaf = loom.tensor(a, requires_grad=True)
        got = f(leaf)
        assert tuple(got.shape) == tuple(want.shape), i
        np.testing.assert_array_equal(got.detach().contiguous().numpy(),
                                      want.detach().contiguous().numpy(), err_msg=f"case {i}")
        # A view shares memory (no copy) and passes gradients back to the right elements.
        torch_leaf = torch.tensor(a, requires_grad=True)
        g = np.arange(want.numel(), dtype=np.float32).reshape(tuple(want.shape))
        f(torch_leaf).backward(torch.tensor(g))
        got.backward(loom.tensor(g))
        np.testing.assert_array_equal(leaf.grad.numpy(), torch_leaf.grad.numpy(),
                                      err_msg=f"case {i} gradient")
    part = loom.tensor(a).split(4, dim=2)[1]
    assert part.view(2, 3, 2, 2).data_ptr() == part.data_ptr()
    for f in (lambda t: t.split(4, dim=2)[0].view(2, 12),
              lambda t: t.transpose(1, 2).view(2, 36)):
        with pytest.raises(RuntimeError):
            f(torch.tensor(a))
        with pytest.raises(ValueError, match="no view of the tensor .* use reshape"):
            f(loom.tensor(a))


def test_reshape_flatten_squeeze_unsqueeze_are_views_where_torch_makes_views():
    # PyTorch's rule: a view where the strides allow one, else a copy. Writes through the result
    # (in place, also into a non-contiguous view) reach the base exactly where torch's do.
    torch = pytest.importorskip("torch")
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    cases = [
        lambda t: t.transpose(1, 2).reshape(2, 2, 2, 3),  # splits a dim: a view
        lambda t: t.transpose(1, 2).reshape(2, 12),       # merges strided dims: a copy
        lambda t: t.transpose(0, 2).unsqueeze(1),
        lambda t: t.transpose(0, 2)[:, :1].squeeze(1),
        lambda t: t[:, 1:].flatten(1),
        lambda t: t.transpose(1, 2).flatten(),
        lambda t: t[:, :, 1:3].reshape(2, 3, 1, 2),
    ]
    for i, f in enumerate(cases):
        base, torch_base = loom.tensor(a), torch.tensor(a)
        got, want = f(base), f(torch_base)
        inside = got.data_ptr() - base.data_ptr() in range(a.nbytes)
        torch_inside = want.data_ptr() - torch_base.data_ptr() in range(a.nbytes)
        assert inside == torch_inside, f"case {i}: a view in one library only"
        got += 1.0
        want += 1.0
        got *= 3.0
        want *= 3.0
        np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=f"case {i}")
        np.testing.assert_array_equal(base.numpy(), torch_base.numpy(), err_msg=f"case {i}")
    base, torch_base = loom.tensor(a), torch.tensor(a)
    base.transpose(0, 2).fill_(5.0)
    torch_base.transpose(0, 2).fill_(5.0)
    base[:, 1].T.zero_()
    torch_base[:, 1].T.zero_()
    np.testing.assert_array_equal(base.numpy(), torch_base.numpy())


def test_slices_with_steps_are_views_with_gradients_and_assignment():
    torch = pytest.importorskip("torch")
    a = np.random.default_rng(5).standard_normal((7, 6)).astype(np.float32)
    for index in [(slice(None, None, 2),), (slice(1, 7, 3), slice(None, None, 2)),
                  (slice(None), slice(5, None, 4)), (slice(2, 3, 5), 1), (slice(0, 0, 2),)]:
        base, torch_base = loom.tensor(a), torch.tensor(a)
        got, want = base[index], torch_base[index]
        np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=str(index))
        if got.numel():
            assert got.data_ptr() - base.data_ptr() in range(a.nbytes), index  # a view
        leaf, torch_leaf = loom.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
        g = np.arange(want.numel(), dtype=np.float32).reshape(tuple(want.shape))
        leaf[index].backward(loom.tensor(g))
        torch_leaf[index].backward(torch.tensor(g))
        np.testing.assert_array_equal(leaf.grad.numpy(), torch_leaf.grad.numpy(), str(index))
        base[index] = 9.0
        torch_base[index] = 9.0
        got += 1.0
        want += 1.0
        np.testing.assert_array_equal(base.numpy(), torch_base.numpy(), err_msg=str(index))
    with pytest.raises(ValueError, match="slice step must be positive"):
        loom.tensor(a)[::-1]
