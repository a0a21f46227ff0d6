"""Helpers shared by the test_binding_*.py files (the Python module's tests).

check_grad compares a loom function's values and gradients on float32 tensors with a float64
numpy reference: values directly, gradients against central finite differences of the reference
(eps 1e-6 in float64, so the difference quotient itself is accurate to ~1e-8). The inputs are
rounded to float32 first, so both sides see the same numbers; the stated tolerances then measure
loom's float32 arithmetic: values rtol 1e-5 / atol 1e-6 (relative to the values' scale), gradients
rtol 1e-3 / atol 1e-4.
"""

import numpy as np

VALUE_RTOL, VALUE_ATOL = 1e-5, 1e-6
GRAD_RTOL, GRAD_ATOL = 1e-3, 1e-4


def f32(a):
    """a rounded to float32 and back to float64: the values a float32 tensor holds."""
    return np.asarray(a, dtype=np.float32).astype(np.float64)


def numeric_grad(fn, inputs, i, weights, eps=1e-6):
    """d/d inputs[i] of sum(fn(*inputs) * weights), by central differences in float64."""
    x = inputs[i]
    grad = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        idx = it.multi_index
        orig = x[idx]
        x[idx] = orig + eps
        plus = np.sum(fn(*inputs) * weights)
        x[idx] = orig - eps
        minus = np.sum(fn(*inputs) * weights)
        x[idx] = orig
        grad[idx] = (plus - minus) / (2 * eps)
    return grad


def check_grad(loom_fn, np_fn, inputs, seed=0, grad_rtol=GRAD_RTOL, grad_atol=GRAD_ATOL):
    """loom_fn(*tensors) against np_fn(*arrays): values, then every input's gradient."""
    import loom

    rng = np.random.default_rng(seed)
    inputs = [f32(a) for a in inputs]
    tensors = [loom.tensor(a.astype(np.float32), requires_grad=True) for a in inputs]
    out = loom_fn(*tensors)
    expected = np_fn(*inputs)
    assert out.shape == np.shape(expected)
    scale = max(1.0, float(np.max(np.abs(expected))) if np.size(expected) else 1.0)
    np.testing.assert_allclose(out.detach().numpy(), expected, rtol=VALUE_RTOL,
                               atol=VALUE_ATOL * scale)
    weights = f32(rng.standard_normal(np.shape(expected)))
    (out * loom.tensor(weights.astype(np.float32))).sum().backward()
    for i, t in enumerate(tensors):
        want = numeric_grad(np_fn, inputs, i, weights)
        assert t.grad is not None, f"input {i} got no gradient"
        np.testing.assert_allclose(t.grad.numpy(), want, rtol=grad_rtol, atol=grad_atol,
                                   err_msg=f"gradient of input {i}")
