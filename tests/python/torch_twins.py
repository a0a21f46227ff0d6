"""What the tests that compare loom with PyTorch op by op share: the same values as a loom leaf
and a torch leaf, and the check that outputs and the gradients of sum(out * g) agree. Import it
after ``pytest.importorskip("torch")``."""

import numpy as np
import torch

import loom


def pair(a, requires_grad=True):
    """The same float32 values as a loom leaf and a torch leaf."""
    a = np.array(a, dtype=np.float32, order="C")
    return (loom.tensor(a, requires_grad=requires_grad),
            torch.tensor(a, requires_grad=requires_grad))


def check(loom_out, torch_out, leaves, rng, rtol, atol):
    """Equal values, then equal gradients of sum(out * g) for a random g (drawn from rng), for
    each (loom, torch) leaf pair."""
    assert tuple(loom_out.shape) == tuple(torch_out.shape)
    np.testing.assert_allclose(loom_out.detach().numpy(), torch_out.detach().numpy(), rtol=rtol,
                               atol=atol)
    g = rng.standard_normal(tuple(torch_out.shape)).astype(np.float32)
    loom_out.backward(loom.tensor(g))
    torch_out.backward(torch.tensor(g))
    for i, (a, b) in enumerate(leaves):
        assert a.grad is not None, f"leaf {i} has no loom gradient"
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=rtol, atol=atol,
                                   err_msg=f"gradient of leaf {i}")
