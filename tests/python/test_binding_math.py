"""Elementwise math, where/masked_fill/clamp and numpy broadcasting against PyTorch (Debian's
python3-torch): the same random inputs through loom and torch, forward and gradients, including
broadcast shapes and empty dims. Tolerances: loom and torch compute in f32 with different math
libraries, so transcendental results may differ in the last bits (rtol 1e-5 on values, 1e-4 on
gradients, which go through one more such function)."""

import numpy as np
import pytest

import loom

torch = pytest.importorskip("torch")
rng = np.random.default_rng(2026)


def pair(a, requires_grad=True):
    """The same f32 values as a loom leaf and a torch leaf."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    return (loom.tensor(a, requires_grad=requires_grad),
            torch.tensor(a, requires_grad=requires_grad))


def check(loom_out, torch_out, leaves, rtol=1e-5, grad_rtol=1e-4):
    """Values equal, then the gradients of sum(out * g) for one random g equal too."""
    assert tuple(loom_out.shape) == tuple(torch_out.shape)
    np.testing.assert_allclose(loom_out.detach().numpy(), torch_out.detach().numpy(), rtol=rtol,
                               atol=1e-6)
    g = rng.standard_normal(tuple(torch_out.shape)).astype(np.float32)
    loom_out.backward(loom.tensor(g))
    torch_out.backward(torch.tensor(g))
    for lt, tt in leaves:
        np.testing.assert_allclose(lt.grad.numpy(), tt.grad.numpy(), rtol=grad_rtol, atol=1e-5)


UNARY = ["exp", "log", "sqrt", "rsqrt", "abs", "neg", "tanh", "sin", "cos", "erf", "log1p", "expm1",
         "floor", "ceil", "round", "trunc"]
POSITIVE = {"log", "sqrt", "rsqrt", "log1p"}


@pytest.mark.parametrize("name", UNARY)
@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 0, 4), ()])
def test_unary_functions_and_methods_match_torch(name, shape):
    lo, hi = (0.1, 4.0) if name in POSITIVE else (-3.0, 3.0)
    x = rng.uniform(lo, hi, shape)
    for via in ("function", "method"):
        lx, tx = pair(x)
        lo_ = getattr(loom, name)(lx) if via == "function" else getattr(lx, name)()
        to_ = getattr(torch, name)(tx)
        check(lo_, to_, [(lx, tx)])


def test_pow_and_power_operators_match_torch():
    x = rng.uniform(0.2, 3.0, (4, 6))
    for e in (2, 3.0, 0.5, -1.5, 0):
        lx, tx = pair(x)
        check(lx ** e, tx ** e, [(lx, tx)])
    lx, tx = pair(x)
    check(loom.pow(lx, 2.5), torch.pow(tx, 2.5), [(lx, tx)])
    lx, tx = pair(x)
    check(2.0 ** lx, 2.0 ** tx, [(lx, tx)])
    lx, tx = pair(x)
    check(abs(lx - 1.0), abs(tx - 1.0), [(lx, tx)])
    with pytest.raises(ValueError, match="exponent must be a number"):
        loom.pow(lx, lx)
    with pytest.raises(TypeError):
        lx ** lx
    with pytest.raises(ValueError, match="base must be positive"):
        (-2.0) ** lx


def test_clamp_forms_match_torch():
    x = rng.uniform(-3, 3, (5, 7))
    x[0, 0], x[0, 1] = -1.0, 1.0  # on the bounds: the gradient passes there too
    for kwargs in ({"min": -1.0, "max": 1.0}, {"min": 0.0}, {"max": 0.5}, {"min": 2.0, "max": 1.0}):
        lx, tx = pair(x)
        check(loom.clamp(lx, **kwargs), torch.clamp(tx, **kwargs), [(lx, tx)])
        lx, tx = pair(x)
        check(lx.clamp(**kwargs), tx.clamp(**kwargs), [(lx, tx)])
    lx, tx = pair(x)
    check(lx.clamp_min(0.0), tx.clamp_min(0.0), [(lx, tx)])
    lx, tx = pair(x)
    check(loom.clip(lx, -0.5, 0.5), torch.clip(tx, -0.5, 0.5), [(lx, tx)])
    with pytest.raises(ValueError, match="at least one of min and max"):
        loom.clamp(lx)
    nan = loom.tensor(np.array([np.nan, 2.0], dtype=np.float32)).clamp(0.0, 1.0).numpy()
    assert np.isnan(nan[0]) and nan[1] == 1.0


@pytest.mark.parametrize("sa,sb", [
    ((2, 3), (2, 1)),          # x - x.mean(1, keepdim=True)
    ((3, 1), (1, 4)),          # an outer sum
    ((2, 1, 3), (4, 1)),       # both operands grow
    ((4,), (3, 1)),            # the shorter one first
    ((1,), (2, 0)),            # an empty result
    ((5, 4, 3), (3,)),         # a suffix: read in place
    ((), (2, 3)),              # a 0-d operand
])
def test_binary_ops_broadcast_as_numpy(sa, sb):
    a, b = rng.standard_normal(sa), rng.uniform(1.0, 2.0, sb)
    for op in ("add", "sub", "mul", "div"):
        la, ta = pair(a)
        lb, tb = pair(b)
        check(getattr(loom.Tensor, f"__{'truediv' if op == 'div' else op}__")(la, lb),
              getattr(torch, op)(ta, tb), [(la, ta), (lb, tb)])
    la, ta = pair(a, requires_grad=False)
    lb, tb = pair(b, requires_grad=False)
    np.testing.assert_array_equal((la < lb).numpy(), (ta < tb).numpy().astype(np.uint8))


def test_mean_centering_and_normalizing_by_hand():
    x = rng.standard_normal((4, 6))
    lx, tx = pair(x)
    lc = lx - lx.mean(1, keepdim=True)
    tc = tx - tx.mean(1, keepdim=True)
    ly = lc / (lc * lc).mean(1, keepdim=True).sqrt()
    ty = tc / (tc * tc).mean(1, keepdim=True).sqrt()
    check(ly, ty, [(lx, tx)])


def test_broadcast_errors_name_both_shapes():
    a, b = loom.zeros(2, 3), loom.zeros(3, 2)
    with pytest.raises(ValueError, match=r"shapes \[2, 3\] and \[3, 2\] do not broadcast"):
        a + b


def test_where_and_masked_fill_match_torch():
    x, y = rng.standard_normal((3, 4)), rng.standard_normal((4,))
    lx, tx = pair(x)
    ly, ty = pair(y)
    check(loom.where(lx > 0, lx, ly), torch.where(tx > 0, tx, ty), [(lx, tx), (ly, ty)])
    lx, tx = pair(x)
    check(loom.where(lx > 0, lx, 0.0), torch.where(tx > 0, tx, torch.tensor(0.0)), [(lx, tx)])
    lx, tx = pair(x)
    check(lx.where(lx < 0.5, -1.0), tx.where(tx < 0.5, torch.tensor(-1.0)), [(lx, tx)])
    # A causal mask, as attention code writes it.
    s = rng.standard_normal((2, 4, 4))
    ls, ts = pair(s)
    keep = np.tril(np.ones((4, 4), dtype=np.uint8))
    lmask = loom.tensor(keep) == 0
    tmask = torch.tensor(keep) == 0
    check(ls.masked_fill(lmask, -1e9), ts.masked_fill(tmask, -1e9), [(ls, ts)])
    with pytest.raises(ValueError, match="expected bool"):
        loom.where(lx, lx, lx)


def test_expand_as_torch_with_gradient():
    x = rng.standard_normal((3, 1))
    lx, tx = pair(x)
    check(lx.expand(2, 3, 4), tx.expand(2, 3, 4), [(lx, tx)])
    lx, tx = pair(x)
    check(lx.expand(-1, 5), tx.expand(-1, 5), [(lx, tx)])
    lx, tx = pair(x)
    check(loom.broadcast_to(lx, (2, 3, 2)), torch.broadcast_to(tx, (2, 3, 2)), [(lx, tx)])
    with pytest.raises(ValueError, match="cannot expand"):
        lx.expand(2, 2)


def test_bf16_math_is_the_f32_result_rounded():
    x = loom.tensor(rng.uniform(0.5, 2.0, (3, 4)).astype(np.float32)).to(loom.bfloat16)
    for name in UNARY:
        got = getattr(x, name)()
        assert got.dtype is loom.bfloat16
        want = getattr(x.to(loom.float32), name)().to(loom.bfloat16)
        np.testing.assert_array_equal(got.to(loom.float32).numpy(), want.to(loom.float32).numpy())


@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min_argmax_match_torch(name):
    x = rng.standard_normal((3, 5, 4))
    x[1, 2, :] = x[1, 0, :]  # ties: the first index wins in both
    for dim in (0, 1, -1):
        for keepdim in (False, True):
            lx, tx = pair(x)
            lr = getattr(lx, name)(dim, keepdim=keepdim)
            tr = getattr(tx, name)(dim, keepdim=keepdim)
            np.testing.assert_array_equal(lr.indices.numpy(), tr.indices.numpy())
            lv, li = lr  # unpacks as torch's named tuple
            assert li.dtype is loom.int64
            check(lv, tr.values, [(lx, tx)], rtol=0, grad_rtol=0)
            arg = "argmax" if name == "max" else "argmin"
            np.testing.assert_array_equal(getattr(loom, arg)(lx, dim, keepdim).numpy(),
                                          getattr(torch, arg)(tx, dim, keepdim).numpy())
    lx, tx = pair(x)
    check(getattr(loom, name)(lx), getattr(torch, name)(tx), [(lx, tx)], rtol=0, grad_rtol=0)
    assert int(getattr(lx, "argmax" if name == "max" else "argmin")()) == int(
        getattr(tx, "argmax" if name == "max" else "argmin")())


def test_max_propagates_nan_and_refuses_empty():
    x = np.array([[1.0, np.nan, 3.0], [4.0, 5.0, 6.0]], dtype=np.float32)
    r = loom.tensor(x).max(1)
    t = torch.tensor(x).max(1)
    assert np.isnan(r.values.numpy()[0]) and r.values.numpy()[1] == 6.0
    np.testing.assert_array_equal(r.indices.numpy(), t.indices.numpy())
    with pytest.raises(ValueError, match="empty"):
        loom.zeros(2, 0).max(1)
    with pytest.raises(TypeError, match="elementwise form"):
        loom.max(loom.zeros(2), loom.zeros(2))


def test_logits_argmax_accuracy_as_a_script_writes_it():
    logits = rng.standard_normal((8, 10))
    targets = rng.integers(0, 10, 8)
    lt = loom.tensor(logits.astype(np.float32))
    acc = float((lt.argmax(-1) == loom.tensor(targets)).to(loom.float32).mean())
    assert acc == pytest.approx(float((logits.argmax(-1) == targets).mean()))


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_matches_torch_with_gradients(dim, largest):
    x = rng.standard_normal((5, 8, 3))  # distinct values: torch's order of ties is unspecified
    for via in ("function", "method"):
        lx, tx = pair(x)
        lo = loom.topk(lx, 3, dim, largest) if via == "function" else lx.topk(3, dim=dim,
                                                                             largest=largest)
        to = torch.topk(tx, 3, dim, largest)
        np.testing.assert_array_equal(lo.indices.numpy(), to.indices.numpy())
        check(lo.values, to.values, [(lx, tx)])


def test_topk_ties_go_to_the_lower_index_and_errors_are_clear():
    values, indices = loom.topk(loom.tensor([1.0, 5.0, 3.0, 5.0]), 2)
    assert values.tolist() == [5.0, 5.0] and indices.tolist() == [1, 3]
    with pytest.raises(ValueError, match="k = 5 is out of range"):
        loom.topk(loom.zeros(4), 5)
    with pytest.raises(ValueError, match="sorted=True"):
        loom.zeros(4).topk(2, sorted=False)


@pytest.mark.parametrize("name", ["var", "std"])
def test_var_std_forms_match_torch(name):
    x = rng.standard_normal((4, 6, 5))
    forms = [((), {}), ((1,), {}), (((0, 2),), {"keepdim": True}), ((-1,), {"correction": 0}),
             ((1, False), {}), ((False,), {}), ((), {"dim": 2, "correction": 2, "keepdim": True})]
    for args, kwargs in forms:
        lx, tx = pair(x)
        check(getattr(lx, name)(*args, **kwargs), getattr(tx, name)(*args, **kwargs), [(lx, tx)])
    lx, tx = pair(x)
    check(getattr(loom, name)(lx, 0), getattr(torch, name)(tx, 0), [(lx, tx)])
    one = getattr(loom, name)(loom.tensor([2.0]))  # N - correction = 0: NaN, as PyTorch
    assert np.isnan(one.item())
    with pytest.raises(TypeError, match="not both"):
        getattr(loom, name)(loom.zeros(3), 0, True, correction=1)
