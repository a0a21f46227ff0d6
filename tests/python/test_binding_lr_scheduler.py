"""loom.optim.lr_scheduler against torch.optim.lr_scheduler (Debian's python3-torch) on the same
two-group optimizers, weights and gradients: every scheduler's lr sequence over 30 steps (and
OneCycleLR's momentum / betas) equals torch's to 1e-12 relative (in practice exactly), and the
parameters after those steps are torch's to 1e-6. Also state_dict() through JSON, resuming,
ZeroRedundancyOptimizer, and errors."""

import json
import warnings

import numpy as np
import pytest

import loom
import loom.distributed as dist
from loom.optim import lr_scheduler

torch = pytest.importorskip("torch")
from torch.optim import lr_scheduler as torch_lr_scheduler  # noqa: E402

STEPS = 30
SHAPES = ((6, 5), (5,), (4, 3))


def _values_and_grads(seed=0):
    rng = np.random.default_rng(seed)
    values = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in SHAPES] for _ in range(STEPS)]
    return values, grads


def _groups(params):
    """Two groups with their own lr and weight decay; the second takes the default lr."""
    return [{"params": params[:2], "lr": 0.1, "weight_decay": 0.1},
            {"params": params[2:], "weight_decay": 0.0}]


OPTIMIZERS = {
    "SGD": dict(lr=0.05, momentum=0.9),
    "AdamW": dict(lr=0.05, betas=(0.9, 0.95)),
    "Adam": dict(lr=0.05),
}


def _pair(kind, values):
    """The same two-group optimizer in loom and in torch, over copies of values."""
    loom_params = [loom.tensor(v.copy(), requires_grad=True) for v in values]
    torch_params = [torch.tensor(v.copy(), requires_grad=True) for v in values]
    loom_opt = getattr(loom.optim, kind)(_groups(loom_params), **OPTIMIZERS[kind])
    torch_opt = getattr(torch.optim, kind)(_groups(torch_params), **OPTIMIZERS[kind])
    return loom_params, loom_opt, torch_params, torch_opt


class Warmup:
    """A callable object: LambdaLR's state_dict() keeps its attributes."""

    def __init__(self, steps):
        self.steps = steps

    def __call__(self, epoch):
        return min(1.0, (epoch + 1) / self.steps)


SCHEDULERS = {
    "LambdaLR": lambda m, o: m.LambdaLR(o, [lambda e: 0.9 ** e, lambda e: 1.0 / (1 + e)]),
    "LambdaLR_object": lambda m, o: m.LambdaLR(o, Warmup(7)),
    "StepLR": lambda m, o: m.StepLR(o, step_size=4, gamma=0.5),
    # T_max below the step count: past T_max the lr rises again (PyTorch's periodic branch)
    "CosineAnnealingLR": lambda m, o: m.CosineAnnealingLR(o, T_max=10, eta_min=1e-3),
    "LinearLR": lambda m, o: m.LinearLR(o, start_factor=0.25, end_factor=0.9, total_iters=8),
    "SequentialLR": lambda m, o: m.SequentialLR(
        o, [m.LinearLR(o, start_factor=0.1, total_iters=5), m.CosineAnnealingLR(o, T_max=20)],
        milestones=[5]),
    "SequentialLR_three": lambda m, o: m.SequentialLR(
        o, [m.LinearLR(o, start_factor=0.1, total_iters=5), m.StepLR(o, 3, gamma=0.7),
            m.CosineAnnealingLR(o, T_max=7, eta_min=1e-3)], milestones=[5, 12]),
    "OneCycleLR": lambda m, o: m.OneCycleLR(o, max_lr=[0.5, 0.2], total_steps=STEPS),
    "OneCycleLR_linear_three_phase": lambda m, o: m.OneCycleLR(
        o, max_lr=0.3, epochs=3, steps_per_epoch=10, pct_start=0.25, anneal_strategy="linear",
        three_phase=True, div_factor=10.0),
    "OneCycleLR_no_momentum": lambda m, o: m.OneCycleLR(o, max_lr=0.4, total_steps=STEPS,
                                                        cycle_momentum=False),
}


def _set_grads(params, grads, make):
    for p, g in zip(params, grads):
        p.grad = make(g)


def _assert_lrs_equal(got, want, what):
    np.testing.assert_allclose(np.array(got, dtype=np.float64), np.array(want, dtype=np.float64),
                               rtol=1e-12, atol=0, err_msg=what)


def _assert_momenta_equal(loom_opt, torch_opt, what):
    for key in ("momentum", "betas"):
        if key in torch_opt.param_groups[0]:
            for g, (lg, tg) in enumerate(zip(loom_opt.param_groups, torch_opt.param_groups)):
                _assert_lrs_equal(np.atleast_1d(lg[key]), np.atleast_1d(tg[key]),
                                  f"{what}: group {g} {key}")


def _assert_params_close(loom_params, torch_params, what):
    for i, (a, b) in enumerate(zip(loom_params, torch_params)):
        b = b.detach().numpy()
        np.testing.assert_allclose(a.detach().numpy(), b, rtol=1e-6,
                                   atol=1e-6 * np.max(np.abs(b)), err_msg=f"{what}: param {i}")


def _run(loom_params, loom_opt, loom_sched, torch_params, torch_opt, torch_sched, grads, steps,
         what):
    """steps of opt.step(); sched.step(), checking the lrs before each step; returns the
    lrs seen."""
    seen = []
    for step in range(steps):
        seen.append(tuple(loom_sched.get_last_lr()))
        _assert_lrs_equal(loom_sched.get_last_lr(), torch_sched.get_last_lr(),
                          f"{what}: step {step}")
        _assert_lrs_equal([g["lr"] for g in loom_opt.param_groups],
                          [g["lr"] for g in torch_opt.param_groups], f"{what}: step {step}")
        _assert_momenta_equal(loom_opt, torch_opt, f"{what}: step {step}")
        _set_grads(loom_params, grads[step], loom.tensor)
        _set_grads(torch_params, grads[step], torch.tensor)
        loom_opt.step()
        torch_opt.step()
        loom_sched.step()
        with warnings.catch_warnings():  # torch's SequentialLR calls the deprecated step(0)
            warnings.simplefilter("ignore")
            torch_sched.step()
    return seen


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_scheduler_matches_torch(name, kind):
    values, grads = _values_and_grads()
    loom_params, loom_opt, torch_params, torch_opt = _pair(kind, values)
    make = SCHEDULERS[name]
    loom_sched, torch_sched = make(lr_scheduler, loom_opt), make(torch_lr_scheduler, torch_opt)
    # OneCycleLR may step total_steps times after the step its constructor takes; the last
    # step() is the one past the end, checked in test_one_cycle_errors.
    steps = STEPS - 1 if name.startswith("OneCycleLR") else STEPS
    seen = _run(loom_params, loom_opt, loom_sched, torch_params, torch_opt, torch_sched, grads,
                steps, f"{name} {kind}")
    assert loom_sched.last_epoch == torch_sched.last_epoch == steps
    _assert_lrs_equal(loom_sched.get_last_lr(), torch_sched.get_last_lr(), f"{name} {kind}: end")
    _assert_params_close(loom_params, torch_params, f"{name} {kind}")
    # The lrs changed along the way (a schedule that did nothing would pass the above too).
    assert len(set(seen)) >= 5


@pytest.mark.parametrize("kind", ["SGD", "AdamW"])
def test_two_schedulers_on_one_optimizer_chain_as_torch(kind):
    """Each step() starts from the group's current lr (PyTorch's chainable forms), so two
    schedulers stepped together compose as in torch, not as either closed form."""
    values, grads = _values_and_grads(seed=2)
    loom_params, loom_opt, torch_params, torch_opt = _pair(kind, values)
    scheds = []
    for m, opt in ((lr_scheduler, loom_opt), (torch_lr_scheduler, torch_opt)):
        scheds.append((m.CosineAnnealingLR(opt, T_max=9, eta_min=1e-3),
                       m.StepLR(opt, step_size=4, gamma=0.5),
                       m.LinearLR(opt, start_factor=0.5, total_iters=6)))
    alone = lr_scheduler.CosineAnnealingLR(
        loom.optim.SGD([loom.zeros(1, requires_grad=True)], lr=0.1), T_max=9, eta_min=1e-3)
    for step in range(STEPS):
        _assert_lrs_equal([g["lr"] for g in loom_opt.param_groups],
                          [g["lr"] for g in torch_opt.param_groups], f"chained {kind}: {step}")
        _set_grads(loom_params, grads[step], loom.tensor)
        _set_grads(torch_params, grads[step], torch.tensor)
        loom_opt.step()
        torch_opt.step()
        for sched in scheds[0] + scheds[1]:
            sched.step()
        alone.step()
    _assert_params_close(loom_params, torch_params, f"chained {kind}")
    # Not the cosine alone: the other two scaled the lr it continued from.
    assert loom_opt.param_groups[0]["lr"] != pytest.approx(alone.get_last_lr()[0], rel=1e-3)


def _as_json(state):
    return json.loads(json.dumps(state, default=lambda t: t.tolist()))


@pytest.mark.parametrize("name,kind", [("LambdaLR_object", "SGD"), ("StepLR", "Adam"),
                                       ("SequentialLR_three", "AdamW"),
                                       ("OneCycleLR", "AdamW"), ("OneCycleLR", "SGD"),
                                       ("CosineAnnealingLR", "SGD")])
def test_state_dict_through_json_resumes_exactly(name, kind):
    """Optimizer and scheduler saved at step 12 through JSON and loaded into new ones (built
    as a script that resumes builds them) continue as the run that was not interrupted."""
    values, grads = _values_and_grads(seed=1)
    loom_params, loom_opt, torch_params, torch_opt = _pair(kind, values)
    make = SCHEDULERS[name]
    loom_sched, torch_sched = make(lr_scheduler, loom_opt), make(torch_lr_scheduler, torch_opt)
    _run(loom_params, loom_opt, loom_sched, torch_params, torch_opt, torch_sched, grads, 12,
         f"{name} {kind}")
    saved_opt = _as_json(loom_opt.state_dict())
    saved_sched = _as_json(loom_sched.state_dict())
    assert saved_sched["last_epoch"] == 12

    resumed_params = [loom.tensor(p.detach().numpy().copy(), requires_grad=True)
                      for p in loom_params]
    resumed_opt = getattr(loom.optim, kind)(_groups(resumed_params), **OPTIMIZERS[kind])
    resumed_sched = make(lr_scheduler, resumed_opt)
    resumed_opt.load_state_dict(saved_opt)
    resumed_sched.load_state_dict(saved_sched)
    assert resumed_sched.get_last_lr() == loom_sched.get_last_lr()
    for step in range(12, STEPS - 1):
        for params, opt, sched in ((loom_params, loom_opt, loom_sched),
                                   (resumed_params, resumed_opt, resumed_sched)):
            _set_grads(params, grads[step], loom.tensor)
            opt.step()
            sched.step()
        assert resumed_sched.get_last_lr() == loom_sched.get_last_lr(), step
        assert [g["lr"] for g in resumed_opt.param_groups] == [g["lr"] for g in
                                                               loom_opt.param_groups]
    for a, b in zip(resumed_params, loom_params):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())


def test_lambda_state_keeps_callable_object_attributes():
    values, _ = _values_and_grads()
    _, opt, _, _ = _pair("SGD", values)
    warmup = Warmup(7)
    sched = lr_scheduler.LambdaLR(opt, [warmup, lambda e: 1.0])
    state = _as_json(sched.state_dict())
    assert state["lr_lambdas"] == [{"steps": 7}, None]
    state["lr_lambdas"][0]["steps"] = 3
    sched.load_state_dict(state)
    assert warmup.steps == 3


@pytest.mark.filterwarnings("ignore:Detected call of")  # torch's: no optimizer step here
def test_resuming_with_last_epoch():
    """last_epoch=k resumes from the groups' initial_lr, as in PyTorch (CosineAnnealingLR's
    first step then uses the closed form)."""
    values, _ = _values_and_grads()
    loom_params, loom_opt, torch_params, torch_opt = _pair("SGD", values)
    for opt in (loom_opt, torch_opt):
        for group in opt.param_groups:
            group["initial_lr"] = group["lr"]
    loom_sched = lr_scheduler.CosineAnnealingLR(loom_opt, T_max=10, last_epoch=3)
    torch_sched = torch_lr_scheduler.CosineAnnealingLR(torch_opt, T_max=10, last_epoch=3)
    for _ in range(5):
        _assert_lrs_equal(loom_sched.get_last_lr(), torch_sched.get_last_lr(), "resumed cosine")
        loom_sched.step()
        torch_sched.step()
    fresh = loom.optim.SGD([loom.zeros(2, requires_grad=True)], lr=0.1)
    with pytest.raises(KeyError, match="initial_lr"):
        lr_scheduler.StepLR(fresh, 2, last_epoch=4)


def test_step_with_epoch_uses_the_closed_form():
    values, _ = _values_and_grads()
    _, loom_opt, _, torch_opt = _pair("AdamW", values)
    loom_sched = lr_scheduler.StepLR(loom_opt, step_size=3, gamma=0.5)
    torch_sched = torch_lr_scheduler.StepLR(torch_opt, step_size=3, gamma=0.5)
    with pytest.warns(UserWarning, match="deprecated"):
        loom_sched.step(7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch_sched.step(7)
    _assert_lrs_equal(loom_sched.get_last_lr(), torch_sched.get_last_lr(), "StepLR.step(7)")
    assert loom_sched.get_last_lr() == pytest.approx([0.1 * 0.25, 0.05 * 0.25], rel=1e-15)


def test_schedulers_drive_zero_redundancy_optimizer():
    """ZeRO (a world of one) is a loom.optim.Optimizer: its lr follows the schedule, and it
    trains as AdamW under the same schedule does."""
    if dist.launched_by_mpi():
        pytest.skip("expects a world of one (run without mpirun)")
    dist.init_process_group()
    config = loom.nn.GPTConfig(max_seq_len=8, vocab=32, padded_vocab=32, layers=1, heads=2,
                               channels=16)
    ref = loom.nn.GPT(config, seed=3)
    model = loom.nn.GPT(config, seed=3)
    ref_opt = loom.optim.AdamW(ref.parameters(), lr=1e-2)
    zero = dist.ZeroRedundancyOptimizer(model, stage=1, lr=1e-2)
    ref_sched = lr_scheduler.OneCycleLR(ref_opt, max_lr=0.02, total_steps=6,
                                        cycle_momentum=False)
    zero_sched = lr_scheduler.OneCycleLR(zero, max_lr=0.02, total_steps=6, cycle_momentum=False)
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(5):
        idx = loom.tensor(rng.integers(0, 32, size=(2, 8)).astype(np.int64), dtype=loom.int64)
        tgt = loom.tensor(rng.integers(0, 32, size=(2, 8)).astype(np.int64), dtype=loom.int64)
        assert zero.lr == ref_opt.lr == zero_sched.get_last_lr()[0]
        seen.add(zero.lr)
        ref.loss(idx, tgt).backward()
        ref_opt.step()
        ref_opt.zero_grad()
        zero.backward(model.loss(idx, tgt))
        zero.step()
        zero.zero_grad()
        ref_sched.step()
        zero_sched.step()
    assert len(seen) == 5
    for (name, a), (_, b) in zip(model.named_parameters(), ref.named_parameters()):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-6, atol=1e-7,
                                   err_msg=name)
    # ZeRO's betas are fixed: cycling them is refused with the way out named.
    with pytest.raises(ValueError, match="cycle_momentum=False"):
        lr_scheduler.OneCycleLR(zero, max_lr=0.02, total_steps=6)
    sched = lr_scheduler.StepLR(zero, step_size=1, gamma=0.5)
    before = zero.lr
    sched.step()
    assert zero.lr == before * 0.5 == zero.param_groups[0]["lr"]


def test_scheduler_errors():
    values, _ = _values_and_grads()
    _, opt, _, _ = _pair("SGD", values)
    other = loom.optim.SGD([loom.zeros(3, requires_grad=True)], lr=0.1)
    with pytest.raises(TypeError, match="loom.optim optimizer"):
        lr_scheduler.StepLR(object(), 3)
    with pytest.raises(ValueError, match="3 values of lr_lambda for 2 parameter groups"):
        lr_scheduler.LambdaLR(opt, [lambda e: 1.0] * 3)
    with pytest.raises(TypeError, match="not a function"):
        lr_scheduler.LambdaLR(opt, 0.5)
    with pytest.raises(ValueError, match="step_size must be >= 1"):
        lr_scheduler.StepLR(opt, 0)
    with pytest.raises(ValueError, match="start_factor"):
        lr_scheduler.LinearLR(opt, start_factor=0.0)
    a, b = lr_scheduler.StepLR(opt, 3), lr_scheduler.StepLR(opt, 5)
    with pytest.raises(ValueError, match="2 schedulers need 1 milestones, got 2"):
        lr_scheduler.SequentialLR(opt, [a, b], milestones=[3, 6])
    with pytest.raises(ValueError, match="another optimizer"):
        lr_scheduler.SequentialLR(opt, [a, lr_scheduler.StepLR(other, 2)], milestones=[3])
    with pytest.raises(ValueError, match="missing .*step_size"):
        lr_scheduler.StepLR(opt, 3).load_state_dict(
            lr_scheduler.CosineAnnealingLR(opt, T_max=4).state_dict())


def test_one_cycle_errors():
    values, _ = _values_and_grads()
    _, opt, _, _ = _pair("AdamW", values)
    with pytest.raises(ValueError, match="total_steps, or epochs and steps_per_epoch"):
        lr_scheduler.OneCycleLR(opt, max_lr=0.1)
    with pytest.raises(ValueError, match="pct_start"):
        lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=10, pct_start=1.5)
    with pytest.raises(ValueError, match="anneal_strategy"):
        lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=10, anneal_strategy="exp")
    sched = lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=4)
    for _ in range(4):
        sched.step()
    with pytest.raises(ValueError, match="stepped 6 times, but total_steps is 4"):
        sched.step()
    # SGD without momentum has no momentum to cycle in loom (torch would create the buffers).
    plain = loom.optim.SGD([loom.zeros(3, requires_grad=True)], lr=0.1)
    with pytest.raises(ValueError, match="momentum 0.*cycle_momentum=False"):
        lr_scheduler.OneCycleLR(plain, max_lr=0.1, total_steps=4)
    lr_scheduler.OneCycleLR(plain, max_lr=0.1, total_steps=4, cycle_momentum=False)
