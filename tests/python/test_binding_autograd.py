"""Autograd from Python: backward, grad, requires_grad, no_grad, in-place rules, the GIL."""

import threading
import time

import numpy as np
import pytest

import loom


def test_backward_accumulates_and_grad_can_be_cleared():
    w = loom.tensor([1.0, 2.0, 3.0], requires_grad=True)
    assert w.grad is None and w.is_leaf
    (w * w).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), [2, 4, 6])
    (w * w).sum().backward()  # gradients accumulate, as in PyTorch
    np.testing.assert_allclose(w.grad.numpy(), [4, 8, 12])
    w.grad = None
    assert w.grad is None
    y = w * 2.0
    assert not y.is_leaf and y.requires_grad
    y.backward(loom.tensor([1.0, 0.0, -1.0]))
    np.testing.assert_allclose(w.grad.numpy(), [2, 0, -2])
    with pytest.raises(ValueError, match="implicit gradient needs a single-element"):
        (w * 2.0).backward()


def test_requires_grad_property_and_method():
    t = loom.zeros(2)
    assert not t.requires_grad
    assert t.requires_grad_() is t and t.requires_grad
    t.requires_grad = False
    assert not t.requires_grad
    with pytest.raises(ValueError, match="only leaf tensors"):
        (loom.zeros(2, requires_grad=True) * 2.0).requires_grad = False
    with pytest.raises(ValueError, match="floating types only"):
        loom.tensor([1, 2]).requires_grad_()


def test_no_grad_context_nesting_and_decorator():
    w = loom.tensor([1.0], requires_grad=True)
    assert loom.is_grad_enabled()
    with loom.no_grad():
        assert not loom.is_grad_enabled()
        with loom.no_grad():
            y = w * 2.0
        assert not loom.is_grad_enabled()
        with loom.enable_grad():
            assert (w * 2.0).requires_grad
    assert loom.is_grad_enabled() and not y.requires_grad

    @loom.no_grad()
    def evaluate(x):
        return x * 3.0, loom.is_grad_enabled()

    out, enabled = evaluate(w)
    assert not out.requires_grad and not enabled and loom.is_grad_enabled()
    with pytest.raises(KeyError):  # the guard closes on an exception too
        with loom.no_grad():
            raise KeyError()
    assert loom.is_grad_enabled()


def test_in_place_update_of_a_parameter_needs_no_grad():
    w = loom.tensor([1.0, 2.0], requires_grad=True)
    (w * w).sum().backward()
    with pytest.raises(ValueError, match="inside `with loom.no_grad"):
        w -= 0.1 * w.grad
    before = id(w)
    with loom.no_grad():
        w -= 0.5 * w.grad  # in place: still the same leaf, still requiring grad
        w.add_(w.grad, alpha=0.25)
        w *= 2.0
    assert id(w) == before and w.requires_grad and w.is_leaf
    np.testing.assert_allclose(w.detach().numpy(), [(1 - 1 + 0.5) * 2, (2 - 2 + 1) * 2])


def test_training_a_linear_model_with_sgd_converges():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 3)).astype(np.float32)
    true_w = np.array([[2.0, -1.0, 0.5]], dtype=np.float32)
    y = x @ true_w.T + 0.3
    xs, ys = loom.from_numpy(x), loom.from_numpy(y)
    w = loom.zeros(1, 3, requires_grad=True)
    b = loom.zeros(1, requires_grad=True)
    for _ in range(300):
        err = loom.nn.functional.linear(xs, w, b) - ys
        loss = (err * err).mean()
        w.grad = None
        b.grad = None
        loss.backward()
        with loom.no_grad():
            w -= 0.1 * w.grad
            b -= 0.1 * b.grad
    np.testing.assert_allclose(w.detach().numpy(), true_w, atol=1e-3)
    np.testing.assert_allclose(b.item(), 0.3, atol=1e-3)
    assert loss.item() < 1e-6


def test_the_gil_is_released_during_long_calls():
    a = loom.ones(1024, 1024, requires_grad=True)
    done = threading.Event()
    result = {}

    def work():
        start = time.perf_counter()
        for _ in range(4):
            (a @ a).sum().backward()
        result["seconds"] = time.perf_counter() - start
        done.set()

    thread = threading.Thread(target=work)
    ticks = 0
    thread.start()
    while not done.is_set():
        time.sleep(0.001)
        ticks += 1
    thread.join()
    # Holding the GIL through matmul and backward would leave this thread a handful of ticks
    # (one per Python-level step); released, it runs all along.
    assert ticks > 0.2 * result["seconds"] / 0.002, (ticks, result)
