"""Autograd version counters through the binding: changing a tensor saved for backward in place
(an optimizer step, +=, copy_, fill_ under no_grad) before that backward raises, naming the op
and the tensor, instead of giving wrong gradients (See Note [Version counter] in core/tensor.h)."""

import numpy as np
import pytest

import loom


def test_optimizer_step_between_forward_and_backward_raises():
    # The probe: x.grad came out -9 (the stepped weight) instead of 1.
    x = loom.tensor([[1.0]], requires_grad=True)
    w = loom.tensor([[1.0]], requires_grad=True)
    loss = loom.matmul(x, w).sum()
    w.grad = loom.tensor([[10.0]])
    loom.optim.SGD([w], lr=1.0).step()
    np.testing.assert_allclose(w.detach().numpy(), [[-9.0]])
    with pytest.raises(ValueError) as info:
        loss.backward()
    message = str(info.value)
    assert "backward of matmul" in message
    assert "input 1 of matmul (Tensor[1, 1] f32 cpu)" in message
    assert "modified by an in-place operation" in message and "clone()" in message
    assert x.grad is None


@pytest.mark.parametrize("change", ["iadd", "mul_", "copy_", "fill_", "zero_", "view"])
def test_every_in_place_method_is_detected(change):
    x = loom.tensor([[1.0, 2.0]], requires_grad=True)
    w = loom.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    loss = loom.matmul(x, w).sum()
    with loom.no_grad():
        if change == "iadd":
            w += 1.0
        elif change == "mul_":
            w.mul_(2.0)
        elif change == "copy_":
            w.copy_(loom.zeros(2, 2))
        elif change == "fill_":
            w.fill_(3.0)
        elif change == "zero_":
            w.zero_()
        else:  # a write through a view reaches the saved base
            w.detach().reshape(4).fill_(0.0)
    with pytest.raises(ValueError, match="input 1 of matmul"):
        loss.backward()


def test_unmodified_or_unsaved_tensors_give_exact_gradients():
    x = loom.tensor([[1.0, 2.0]], requires_grad=True)
    w = loom.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    b = loom.tensor([[5.0, 6.0]], requires_grad=True)
    loss = (loom.matmul(x, w) + b).sum()
    with loom.no_grad():
        b += 1.0  # add saves nothing: its gradient does not read b
    loss.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[3.0, 7.0]])
    np.testing.assert_array_equal(w.grad.numpy(), [[1.0, 1.0], [2.0, 2.0]])
    np.testing.assert_array_equal(b.grad.numpy(), [[1.0, 1.0]])
    with loom.no_grad():
        w -= w.grad  # after backward, where an update belongs
    np.testing.assert_array_equal(w.detach().numpy(), [[0.0, 1.0], [1.0, 2.0]])
