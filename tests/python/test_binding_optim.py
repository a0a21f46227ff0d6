"""loom.optim against numpy references of torch.optim's updates (rtol 1e-6 over a few steps),
state_dict round trips, the lr / param_groups write-through, clip_grad_norm_, and errors."""

import numpy as np
import pytest

import loom
import loom.nn as nn

STEPS = 5


def _params_and_grads(seed=0, shapes=((3, 4), (5,))):
    rng = np.random.default_rng(seed)
    values = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(STEPS)]
    params = [loom.tensor(v, requires_grad=True) for v in values]
    return params, values, grads


def _set_grads(params, grads):
    for p, g in zip(params, grads):
        p.grad = loom.tensor(g)


def _sgd_reference(p, grads, lr, momentum, dampening, wd, nesterov):
    p = p.astype(np.float64)
    buf = None
    for g in grads:
        g = g.astype(np.float64) + wd * p
        if momentum:
            buf = g.copy() if buf is None else momentum * buf + (1 - dampening) * g
            g = g + momentum * buf if nesterov else buf
        p = p - lr * g
    return p


def _adamw_reference(p, grads, lr, b1, b2, eps, wd):
    p = p.astype(np.float64)
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        g = g.astype(np.float64)
        p = p * (1 - lr * wd)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        p = p - lr / (1 - b1**t) * m / (np.sqrt(v) / np.sqrt(1 - b2**t) + eps)
    return p


@pytest.mark.parametrize("momentum,dampening,wd,nesterov", [
    (0.0, 0.0, 0.0, False), (0.9, 0.0, 0.01, False), (0.9, 0.1, 0.0, False),
    (0.8, 0.0, 0.05, True)])
def test_sgd_matches_numpy(momentum, dampening, wd, nesterov):
    params, values, grads = _params_and_grads()
    opt = loom.optim.SGD(params, lr=0.1, momentum=momentum, dampening=dampening,
                         weight_decay=wd, nesterov=nesterov)
    for step in range(STEPS):
        _set_grads(params, grads[step])
        opt.step()
        opt.zero_grad()
        assert all(p.grad is None for p in params)
    for i, p in enumerate(params):
        want = _sgd_reference(values[i], [g[i] for g in grads], 0.1, momentum, dampening, wd,
                              nesterov)
        np.testing.assert_allclose(p.detach().numpy(), want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_adamw_matches_numpy(wd):
    params, values, grads = _params_and_grads(seed=1)
    opt = loom.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=wd)
    for step in range(STEPS):
        _set_grads(params, grads[step])
        opt.step()
        opt.zero_grad()
    for i, p in enumerate(params):
        want = _adamw_reference(values[i], [g[i] for g in grads], 1e-2, 0.9, 0.95, 1e-8, wd)
        np.testing.assert_allclose(p.detach().numpy(), want, rtol=1e-6, atol=1e-7)


def test_parameters_without_grad_are_skipped():
    params, values, grads = _params_and_grads()
    opt = loom.optim.AdamW(params)
    params[0].grad = loom.tensor(grads[0][0])
    opt.step()
    np.testing.assert_array_equal(params[1].detach().numpy(), values[1])
    assert not np.array_equal(params[0].detach().numpy(), values[0])


@pytest.mark.parametrize("make", [
    lambda ps: loom.optim.SGD(ps, lr=0.1, momentum=0.9),
    lambda ps: loom.optim.AdamW(ps, lr=1e-2)])
def test_state_dict_round_trip(make):
    params_a, values, grads = _params_and_grads(seed=2)
    params_b = [loom.tensor(v, requires_grad=True) for v in values]
    a, b = make(params_a), make(params_b)
    for step in range(2):
        _set_grads(params_a, grads[step])
        a.step()
    saved = a.state_dict()
    assert set(saved) == {"state", "param_groups"}
    # b resumes from a's parameters and state: the next steps are bit-identical.
    with loom.no_grad():
        for pa, pb in zip(params_a, params_b):
            pb.copy_(pa)
    b.load_state_dict(saved)
    for step in range(2, STEPS):
        _set_grads(params_a, grads[step])
        _set_grads(params_b, grads[step])
        a.step()
        b.step()
    for pa, pb in zip(params_a, params_b):
        np.testing.assert_array_equal(pa.detach().numpy(), pb.detach().numpy())
    # The saved state is a copy: later steps did not change it.
    again = make([loom.tensor(v, requires_grad=True) for v in values])
    again.load_state_dict(saved)


def test_load_state_dict_errors_name_the_key():
    params, _, grads = _params_and_grads()
    opt = loom.optim.AdamW(params)
    _set_grads(params, grads[0])
    opt.step()
    other = loom.optim.AdamW([loom.zeros(2, 2, requires_grad=True),
                              loom.zeros(5, requires_grad=True)])
    with pytest.raises(ValueError, match="0.exp_avg"):
        other.load_state_dict(opt.state_dict())
    with pytest.raises(ValueError, match="weight_decay"):
        loom.optim.AdamW(params, weight_decay=0.5).load_state_dict(opt.state_dict())
    with pytest.raises(ValueError):
        opt.load_state_dict({"0.exp_avg": loom.zeros(3, 4)})


def test_lr_and_param_groups():
    params, _, _ = _params_and_grads()
    opt = loom.optim.SGD(params, lr=0.1)
    assert opt.lr == pytest.approx(0.1)
    for group in opt.param_groups:
        group["lr"] = 0.05
    assert opt.lr == pytest.approx(0.05)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)
    opt.lr = 0.01
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01)
    assert len(opt.param_groups[0]["params"]) == 2
    with pytest.raises(ValueError, match="momentum"):
        opt.param_groups[0]["momentum"] = 0.5


def test_optimizer_accepts_a_generator_and_rejects_non_tensors():
    model = nn.Linear(3, 2)
    opt = loom.optim.AdamW(model.parameters(), lr=1e-3)
    assert len(opt.param_groups[0]["params"]) == 2
    with pytest.raises(TypeError, match="loom.Tensor"):
        loom.optim.SGD([1.0], lr=0.1)
    with pytest.raises(ValueError, match="momentum"):
        loom.optim.SGD(model.parameters(), lr=0.1, momentum=-1.0)


def test_clip_grad_norm_matches_numpy():
    params, _, grads = _params_and_grads(seed=3)
    _set_grads(params, [g * 10 for g in grads[0]])
    want = np.sqrt(sum(np.sum((g.astype(np.float64) * 10) ** 2) for g in grads[0]))
    norm = nn.utils.clip_grad_norm_(params, 1.0)
    assert norm.item() == pytest.approx(want, rel=1e-6)
    clipped = np.sqrt(sum(np.sum(p.grad.numpy().astype(np.float64) ** 2) for p in params))
    assert clipped == pytest.approx(1.0, rel=1e-5)
    with pytest.raises(ValueError, match="norm_type"):
        nn.utils.clip_grad_norm_(params, 1.0, norm_type=1)
