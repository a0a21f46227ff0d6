"""loom.optim.MixedPrecisionOptimizer (optimizer/mixed_precision.h from Python): a bf16 or f16
model with f32 masters. Its steps equal plain f32 AdamW / SGD on f32 copies fed the same
gradients, rounded into the model; f16's dynamic loss scale skips a step with an inf gradient
and halves, as torch.cuda.amp.GradScaler."""

import numpy as np
import pytest

import loom
import loom.nn as nn


def values(t):
    return t.detach().float().numpy().copy()


@pytest.mark.parametrize("optimizer_class,kwargs", [
    (loom.optim.AdamW, dict(lr=0.05, betas=(0.8, 0.95), weight_decay=0.1)),
    (loom.optim.SGD, dict(lr=0.2, momentum=0.9)),
])
def test_steps_equal_f32_optimizer_on_the_masters(optimizer_class, kwargs):
    loom.manual_seed(5)
    model = nn.Linear(6, 4).to(loom.bfloat16)
    params = list(model.parameters())
    shadow = [loom.tensor(values(p), requires_grad=True) for p in params]  # exact: bf16 fits f32
    opt = loom.optim.MixedPrecisionOptimizer(params, optimizer_class, **kwargs)
    reference = optimizer_class(shadow, **kwargs)
    for step in range(4):
        x = loom.randn(8, 6).to(loom.bfloat16)
        loss = model(x).float().square().mean()
        opt.scale_loss(loss).backward()
        for p, s in zip(params, shadow):
            s.grad = p.grad.float()
        reference.step()
        opt.step()
        opt.zero_grad()
        reference.zero_grad()
        state = opt.state_dict()["state"]
        for i, (p, s) in enumerate(zip(params, shadow)):
            np.testing.assert_array_equal(state[f"{i}.master"].numpy(), values(s))
            np.testing.assert_array_equal(values(p), values(s.detach().to(loom.bfloat16)))
    assert opt.scale == 1.0 and not opt.last_step_skipped


def test_f16_dynamic_scale_skips_a_non_finite_step_and_backs_off():
    model = nn.Linear(3, 2).to(loom.float16)
    params = list(model.parameters())
    opt = loom.optim.MixedPrecisionOptimizer(params, loom.optim.SGD, lr=0.1,
                                             loss_scale="dynamic")
    assert opt.scale == 65536.0
    x = loom.ones(2, 3).to(loom.float16)
    before = [values(p) for p in params]
    opt.scale_loss(model(x).float().mean()).backward()
    bad = params[0].grad.float().numpy()
    bad[0, 0] = np.inf
    params[0].grad = loom.tensor(bad).to(loom.float16)
    opt.step()
    assert opt.last_step_skipped and opt.scale == 32768.0
    for p, b in zip(params, before):
        np.testing.assert_array_equal(values(p), b)
    opt.zero_grad()
    loss = model(x).float().mean()
    opt.scale_loss(loss).backward()
    norm = opt.clip_grad_norm_(1e9)  # the unscaled norm: the scale must not show in it
    expected = np.sqrt(2 * (3 * 0.5 ** 2) + 2 * 0.5 ** 2)  # d mean / d W = x / 2, d / d b = 1 / 2
    assert abs(norm - expected) < 1e-3 * expected
    opt.step()
    assert not opt.last_step_skipped and opt.scale == 32768.0


def test_errors_name_what_exists():
    params = list(nn.Linear(2, 2).to(loom.bfloat16).parameters())
    with pytest.raises(TypeError, match="AdamW or loom.optim.SGD"):
        loom.optim.MixedPrecisionOptimizer(params, loom.optim.Adam)
    with pytest.raises(ValueError, match="loss_scale"):
        loom.optim.MixedPrecisionOptimizer(params, loss_scale="auto")
    with pytest.raises(TypeError, match="takes no"):
        loom.optim.MixedPrecisionOptimizer(params, loom.optim.AdamW, momentum=0.9)
