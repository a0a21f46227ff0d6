"""loom.optim parameter groups, Adam and state_dict() through JSON: two-group SGD / Adam / AdamW
against torch.optim (Debian's python3-torch) on the same weights and gradients, options set
mid-run (which rebuild a group's C++ optimizer), add_param_group, the state dict's layout, JSON
round trips that resume bit-identically, and the errors (a parameter in two groups, mismatched
state dicts, ZeroRedundancyOptimizer's single group, checkpointing several groups)."""

import json

import numpy as np
import pytest

import loom
import loom.distributed as dist

STEPS = 6
SHAPES = ((7, 5), (5,), (3, 4), (9,))


def _values_and_grads(seed=0):
    rng = np.random.default_rng(seed)
    values = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in SHAPES] for _ in range(STEPS)]
    return values, grads


def _params(values):
    return [loom.tensor(v.copy(), requires_grad=True) for v in values]


def _set_grads(params, grads, make=loom.tensor):
    for p, g in zip(params, grads):
        p.grad = make(g)


def _arrays(params):
    return [p.detach().numpy().copy() for p in params]


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


# Two groups with options of their own; what a group leaves out comes from the constructor.
GROUPS = {
    "SGD": ([{"params": slice(0, 2), "lr": 0.1, "momentum": 0.9, "weight_decay": 0.01},
             {"params": slice(2, 4), "nesterov": True, "momentum": 0.8}],
            dict(lr=0.05, momentum=0.5)),
    "AdamW": ([{"params": slice(0, 2), "weight_decay": 0.1, "betas": (0.8, 0.99)},
               {"params": slice(2, 4), "weight_decay": 0.0, "lr": 3e-3, "eps": 1e-6}],
              dict(lr=1e-2, betas=(0.9, 0.95))),
    "Adam": ([{"params": slice(0, 2), "weight_decay": 0.1},
              {"params": slice(2, 4), "lr": 3e-3, "betas": (0.85, 0.9)}],
             dict(lr=1e-2)),
}


def _build(lib, kind, params):
    groups, kwargs = GROUPS[kind]
    groups = [dict(g, params=params[g["params"]]) for g in groups]
    return getattr(lib.optim, kind)(groups, **kwargs)


def _assert_close_to_torch(loom_params, torch_params, what):
    """rtol 1e-6 and atol 1e-7 * the tensor's largest value: loom's kernels round as the
    fused updates do, torch 1.13's per-op loops a few ulps differently (even AdamW with wd 0)."""
    for i, (a, b) in enumerate(zip(loom_params, torch_params)):
        b = b.detach().numpy()
        np.testing.assert_allclose(a.detach().numpy(), b, rtol=1e-6,
                                   atol=1e-7 * np.max(np.abs(b)), err_msg=f"{what}: param {i}")


@pytest.mark.parametrize("kind", sorted(GROUPS))
def test_two_groups_match_torch(torch, kind):
    values, grads = _values_and_grads()
    loom_params = _params(values)
    torch_params = [torch.tensor(v.copy(), requires_grad=True) for v in values]
    loom_opt, torch_opt = _build(loom, kind, loom_params), _build(torch, kind, torch_params)
    for lg, tg in zip(loom_opt.param_groups, torch_opt.param_groups):
        for key in loom_opt.defaults:
            assert lg[key] == pytest.approx(tg[key], rel=1e-15), key
    for step in range(STEPS):
        _set_grads(loom_params, grads[step])
        _set_grads(torch_params, grads[step], torch.tensor)
        loom_opt.step()
        torch_opt.step()
        loom_opt.zero_grad()
        assert all(p.grad is None for p in loom_params)
    _assert_close_to_torch(loom_params, torch_params, kind)
    # The groups' options mattered: one optimizer over both groups with group 0's options
    # ends elsewhere.
    one = _params(values)
    single = getattr(loom.optim, kind)(one, **dict(GROUPS[kind][1], **{
        k: v for k, v in GROUPS[kind][0][0].items() if k != "params"}))
    for step in range(STEPS):
        _set_grads(one, grads[step])
        single.step()
    assert not np.allclose(_arrays(one)[3], _arrays(loom_params)[3], rtol=1e-4)


def test_adam_weight_decay_is_torchs_l2_step(torch):
    """Adam adds wd * p to a copy of the gradient with torch's f32 rounding (bitwise: both fuse
    the multiply-add), then takes AdamW's step with decoupled decay off: bit for bit what
    loom's AdamW(weight_decay=0) does with torch's decayed gradient. p.grad is left as it was."""
    values, grads = _values_and_grads(seed=1)
    wd = 0.013
    adam_params, ref_params = _params(values), _params(values)
    adam = loom.optim.Adam(adam_params, lr=1e-2, betas=(0.9, 0.95), weight_decay=wd)
    ref = loom.optim.AdamW(ref_params, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.0)
    for step in range(STEPS):
        _set_grads(adam_params, grads[step])
        decayed = [torch.tensor(g).add(torch.tensor(p.detach().numpy()), alpha=wd).numpy()
                   for g, p in zip(grads[step], ref_params)]
        _set_grads(ref_params, decayed)
        adam.step()
        ref.step()
        for p, g in zip(adam_params, grads[step]):
            np.testing.assert_array_equal(p.grad.numpy(), g)
    for a, b in zip(adam_params, ref_params):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())
    # And the decayed gradient itself is torch's bit for bit, with a length that takes the
    # vector path.
    rng = np.random.default_rng(5)
    g, p = (rng.standard_normal(1001).astype(np.float32) for _ in range(2))
    ours = loom.tensor(g).clone()
    ours.add_(loom.tensor(p), alpha=wd)
    np.testing.assert_array_equal(ours.numpy(), torch.tensor(g).add(torch.tensor(p),
                                                                    alpha=wd).numpy())


@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_adam_matches_torch(torch, wd):
    """Not bitwise against torch 1.13 (its Adam rounds its steps differently, with or without
    weight decay): within rtol 1e-6 and 1e-7 of the tensor's scale over the steps."""
    values, grads = _values_and_grads(seed=2)
    loom_params = _params(values)
    torch_params = [torch.tensor(v.copy(), requires_grad=True) for v in values]
    loom_opt = loom.optim.Adam(loom_params, lr=1e-2, betas=(0.9, 0.95), weight_decay=wd)
    torch_opt = torch.optim.Adam(torch_params, lr=1e-2, betas=(0.9, 0.95), weight_decay=wd)
    for step in range(STEPS):
        _set_grads(loom_params, grads[step])
        _set_grads(torch_params, grads[step], torch.tensor)
        loom_opt.step()
        torch_opt.step()
    _assert_close_to_torch(loom_params, torch_params, f"Adam wd={wd}")
    if wd:  # L2 decay is not AdamW's decoupled decay: the two end apart
        other = _params(values)
        adamw = loom.optim.AdamW(other, lr=1e-2, betas=(0.9, 0.95), weight_decay=wd)
        for step in range(STEPS):
            _set_grads(other, grads[step])
            adamw.step()
        assert not np.allclose(_arrays(other)[0], _arrays(loom_params)[0], rtol=1e-5)


def test_lr_writes_through_per_group():
    values, grads = _values_and_grads()
    params = _params(values)
    opt = loom.optim.SGD([{"params": params[:2]}, {"params": params[2:], "lr": 0.2}], lr=0.1)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.2]
    opt.param_groups[1]["lr"] = 0.5
    assert opt.param_groups[1]["lr"] == 0.5 and opt.param_groups[0]["lr"] == 0.1
    assert opt.param_groups[1].get("lr") == 0.5 and dict(opt.param_groups[1].items())["lr"] == 0.5
    _set_grads(params, grads[0])
    opt.step()
    for i, lr in ((0, 0.1), (1, 0.1), (2, 0.5), (3, 0.5)):
        want = values[i] - np.float32(lr) * grads[0][i]
        np.testing.assert_allclose(params[i].detach().numpy(), want, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="2 parameter groups; use param_groups"):
        opt.lr
    with pytest.raises(ValueError, match="2 parameter groups"):
        opt.lr = 0.1


def test_options_set_mid_run_match_torch(torch):
    """Setting betas, weight decay, eps or momentum in a group mid-run rebuilds its C++
    optimizer with the state carried over: the steps go on as torch's."""
    values, grads = _values_and_grads(seed=3)
    for kind, changes in (("AdamW", [(0, "betas", (0.7, 0.98)), (1, "weight_decay", 0.05),
                                     (1, "eps", 1e-4)]),
                          ("SGD", [(0, "momentum", 0.3), (1, "nesterov", False),
                                   (0, "dampening", 0.1), (1, "weight_decay", 0.02)])):
        loom_params = _params(values)
        torch_params = [torch.tensor(v.copy(), requires_grad=True) for v in values]
        loom_opt, torch_opt = _build(loom, kind, loom_params), _build(torch, kind, torch_params)
        for step in range(STEPS):
            if step == 3:
                for group, key, value in changes:
                    loom_opt.param_groups[group][key] = value
                    torch_opt.param_groups[group][key] = value
                    assert loom_opt.param_groups[group][key] == value
            _set_grads(loom_params, grads[step])
            _set_grads(torch_params, grads[step], torch.tensor)
            loom_opt.step()
            torch_opt.step()
        _assert_close_to_torch(loom_params, torch_params, f"{kind} with options changed")


def test_option_changes_that_are_refused():
    values, _ = _values_and_grads()
    params = _params(values)
    opt = loom.optim.SGD([{"params": params[:2]}, {"params": params[2:], "momentum": 0.9}],
                         lr=0.1)
    with pytest.raises(ValueError, match="'momentum' cannot change from 0.0 to 0.5"):
        opt.param_groups[0]["momentum"] = 0.5
    with pytest.raises(ValueError, match="'momentum' cannot change from 0.9 to 0.0"):
        opt.param_groups[1]["momentum"] = 0.0
    with pytest.raises(ValueError, match="nesterov"):  # the C++ check, and nothing changed
        opt.param_groups[1]["dampening"] = 0.5
        opt.param_groups[1]["nesterov"] = True
    assert opt.param_groups[1]["nesterov"] is False
    with pytest.raises(ValueError, match=r"\['params'\] is fixed"):
        opt.param_groups[0]["params"] = params
    with pytest.raises(TypeError, match="'momentum' must be a number"):
        opt.param_groups[1]["momentum"] = "high"
    adamw = loom.optim.AdamW(params)
    with pytest.raises(ValueError, match="beta1 must be in"):
        adamw.param_groups[0]["betas"] = (1.5, 0.9)
    assert adamw.param_groups[0]["betas"] == (0.9, 0.999)
    with pytest.raises(ValueError, match="weight decay must be >= 0"):
        loom.optim.Adam(params, weight_decay=-0.1)
    # Keys that are not options are the user's (a scheduler's initial_lr).
    adamw.param_groups[0]["initial_lr"] = 0.25
    assert adamw.param_groups[0]["initial_lr"] == 0.25
    assert adamw.param_groups[0].setdefault("initial_lr", 9.0) == 0.25


def test_add_param_group_matches_torch(torch):
    values, grads = _values_and_grads(seed=4)
    loom_params = _params(values)
    torch_params = [torch.tensor(v.copy(), requires_grad=True) for v in values]
    opts = []
    for lib, ps in ((loom, loom_params), (torch, torch_params)):
        opt = lib.optim.AdamW(ps[:3], lr=1e-2, weight_decay=0.05)
        opt.add_param_group({"params": ps[3], "lr": 1e-3, "weight_decay": 0.0})
        opts.append(opt)
    group = opts[0].param_groups[1]
    assert (group["lr"], group["weight_decay"], group["betas"], group["eps"]) == \
        (1e-3, 0.0, (0.9, 0.999), 1e-8)
    for step in range(STEPS):
        _set_grads(loom_params, grads[step])
        _set_grads(torch_params, grads[step], torch.tensor)
        for opt in opts:
            opt.step()
    _assert_close_to_torch(loom_params, torch_params, "add_param_group")


def test_a_parameter_in_two_groups_is_an_error():
    values, _ = _values_and_grads()
    params = _params(values)
    with pytest.raises(ValueError, match=r"a parameter of shape \[3, 4\] is in groups 0 and 1 "
                                         r"\(position 2 and 0\)"):
        loom.optim.SGD([{"params": params[:3]}, {"params": params[2:]}], lr=0.1)
    opt = loom.optim.AdamW([{"params": params[:2]}])
    # Another Python object for the same parameter is still the same parameter.
    with pytest.raises(ValueError, match=r"shape \[5\] is in groups 0 and 1"):
        opt.add_param_group({"params": [params[2], params[1].detach()]})
    assert len(opt.param_groups) == 1
    with pytest.raises(ValueError, match=r"\[9\] is twice in group 0"):
        loom.optim.Adam([params[3], params[0], params[3]])
    with pytest.raises(TypeError, match="ordered collection"):
        loom.optim.SGD([{"params": set(params)}], lr=0.1)
    with pytest.raises(TypeError, match="must be a dict"):
        opt.add_param_group(params[2:])
    with pytest.raises(ValueError, match="no 'params'"):
        opt.add_param_group({"lr": 0.1})
    with pytest.raises(TypeError, match="iterable of tensors or of dicts"):
        loom.optim.SGD(params[0], lr=0.1)
    with pytest.raises(TypeError, match="loom.Tensor, got a float at position 1"):
        loom.optim.SGD([{"params": [params[0], 1.0]}], lr=0.1)
    with pytest.raises(ValueError, match="empty parameter list"):
        loom.optim.SGD([], lr=0.1)


def _json(state_dict):
    """A state dict through JSON, its tensors as nested lists."""
    return json.loads(json.dumps(state_dict, default=lambda t: t.tolist()))


def test_state_dict_layout():
    values, grads = _values_and_grads()
    params = _params(values)
    opt = _build(loom, "AdamW", params)
    opt.param_groups[1]["initial_lr"] = 0.5
    _set_grads(params, grads[0])
    opt.step()
    sd = opt.state_dict()
    assert [g["params"] for g in sd["param_groups"]] == [[0, 1], [2, 3]]
    assert sd["param_groups"][0] == {"lr": 1e-2, "betas": (0.8, 0.99), "eps": 1e-8,
                                     "weight_decay": 0.1, "params": [0, 1]}
    assert sd["param_groups"][1]["initial_lr"] == 0.5 and sd["param_groups"][1]["lr"] == 3e-3
    assert set(sd["state"]) == {f"{i}.{k}" for i in range(4)
                                for k in ("exp_avg", "exp_avg_sq", "step")}
    assert sd["state"]["3.exp_avg"].shape == (9,) and sd["state"]["2.step"].tolist() == [1]
    # Parameter 2 is the first of group 1: its moment is 0.1 of its first gradient (beta1 0.9).
    np.testing.assert_allclose(sd["state"]["2.exp_avg"].numpy(), 0.1 * grads[0][2], rtol=1e-6)


@pytest.mark.parametrize("kind", sorted(GROUPS))
def test_state_dict_round_trips_through_json(kind):
    values, grads = _values_and_grads(seed=5)
    params = _params(values)
    opt = _build(loom, kind, params)
    for step in range(3):
        _set_grads(params, grads[step])
        opt.step()
    opt.param_groups[0]["lr"] = 0.0123
    opt.param_groups[1]["initial_lr"] = 0.5
    saved = _json(opt.state_dict())
    assert isinstance(saved["state"]["0.step"], list)
    if "betas" in saved["param_groups"][0]:
        assert isinstance(saved["param_groups"][0]["betas"], list)

    resumed_params = _params(_arrays(params))
    resumed = _build(loom, kind, resumed_params)
    resumed.load_state_dict(saved)
    assert resumed.param_groups[0]["lr"] == 0.0123
    assert resumed.param_groups[1]["initial_lr"] == 0.5
    for step in range(3, STEPS):
        for ps, o in ((params, opt), (resumed_params, resumed)):
            _set_grads(ps, grads[step])
            o.step()
    for a, b in zip(resumed_params, params):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())
    for key, value in opt.state_dict()["state"].items():
        np.testing.assert_array_equal(resumed.state_dict()["state"][key].numpy(), value.numpy(),
                                      err_msg=key)


def test_load_state_dict_errors_change_nothing():
    values, grads = _values_and_grads()
    params = _params(values)
    opt = _build(loom, "AdamW", params)
    _set_grads(params, grads[0])
    opt.step()
    good = opt.state_dict()
    fresh = _build(loom, "AdamW", _params(values))
    before = {k: v.numpy().copy() for k, v in fresh.state_dict()["state"].items()}

    def unchanged():
        for k, v in fresh.state_dict()["state"].items():
            np.testing.assert_array_equal(v.numpy(), before[k], err_msg=k)

    with pytest.raises(ValueError, match="1 parameter groups in the state dict, 2 in this AdamW"):
        fresh.load_state_dict(dict(good, param_groups=good["param_groups"][:1]))
    other = _json(good)
    other["param_groups"][1]["eps"] = 1e-3
    with pytest.raises(ValueError, match="group 1: 'eps' is 0.001 in the state dict, 1e-06"):
        fresh.load_state_dict(other)
    other = _json(good)
    other["param_groups"][1]["params"] = [2, 3, 4]
    with pytest.raises(ValueError, match=r"group 1: params \[2, 3, 4\]"):
        fresh.load_state_dict(other)
    other = _json(good)
    other["state"]["4.exp_avg"] = [0.0]
    with pytest.raises(ValueError, match="'4.exp_avg' is for parameter 4, but this AdamW has 4"):
        fresh.load_state_dict(other)
    # Group 0 would load, group 1's tensor has the wrong shape: group 0 is put back.
    other = _json(good)
    other["state"]["3.exp_avg_sq"] = [1.0, 2.0]
    with pytest.raises(ValueError, match="exp_avg_sq"):
        fresh.load_state_dict(other)
    unchanged()
    # A changed beta1 is taken (OneCycleLR cycles it), but a load that then fails puts it back.
    other["param_groups"][0]["betas"] = [0.5, 0.99]
    with pytest.raises(ValueError, match="exp_avg_sq"):
        fresh.load_state_dict(other)
    assert fresh.param_groups[0]["betas"] == (0.8, 0.99)
    unchanged()
    other = _json(good)
    other["param_groups"][0]["betas"] = [0.5, 0.99]
    fresh.load_state_dict(other)
    assert fresh.param_groups[0]["betas"] == (0.5, 0.99)


def test_zero_redundancy_optimizer_has_one_group(tmp_path):
    if dist.launched_by_mpi():
        pytest.skip("expects a world of one (run without mpirun)")
    dist.init_process_group()
    model = loom.nn.Linear(4, 3)
    zero = dist.ZeroRedundancyOptimizer(model, lr=0.1)
    assert len(zero.param_groups) == 1 and zero.defaults["lr"] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="ZeroRedundancyOptimizer: its parameter groups are fixed"):
        zero.add_param_group({"params": [loom.zeros(2, requires_grad=True)]})
    with pytest.raises(ValueError, match="'betas' is fixed"):
        zero.param_groups[0]["betas"] = (0.5, 0.9)
    zero.param_groups[0]["lr"] = 0.05
    assert zero.lr == pytest.approx(0.05)
    # loom.distributed.checkpoint saves one C++ optimizer: several groups are refused by name.
    from loom.distributed import checkpoint

    ps = list(model.parameters())
    grouped = loom.optim.AdamW([{"params": ps[:1]}, {"params": ps[1:], "weight_decay": 0.0}])
    with pytest.raises(ValueError, match="2 parameter groups.*one group"):
        checkpoint.save(str(tmp_path / "ckpt"), model=model, optimizer=grouped, step=1)
    one = loom.optim.AdamW(model.parameters())
    checkpoint.save(str(tmp_path / "ckpt"), model=model, optimizer=one, step=1)


def test_zero_redundancy_optimizer_with_parameter_groups():
    """ZeRO's groups on a world of one step as loom.optim.AdamW's same groups (bit for bit: one
    rank holds every piece); each group's lr is its own; bad groups are errors naming why."""
    if dist.launched_by_mpi():
        pytest.skip("expects a world of one (run without mpirun)")
    dist.init_process_group()

    def model_and_groups():
        loom.manual_seed(3)
        model = loom.nn.Sequential(loom.nn.Linear(4, 8), loom.nn.GELU(), loom.nn.Linear(8, 2))
        ps = list(model.parameters())
        return model, [{"params": [ps[0], ps[2]]},
                       {"params": [ps[1], ps[3]], "weight_decay": 0.0, "lr": 0.05}]

    loom.manual_seed(4)
    x, y = loom.randn(16, 4), loom.randn(16, 2)
    results = []
    for zero in (False, True):
        model, groups = model_and_groups()
        opt = (dist.ZeroRedundancyOptimizer(model, params=groups, lr=0.01, weight_decay=0.1)
               if zero else loom.optim.AdamW(groups, lr=0.01, weight_decay=0.1))
        assert [g["lr"] for g in opt.param_groups] == [0.01, 0.05]
        assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
        for step in range(3):
            loss = loom.nn.functional.mse_loss(model(x), y)
            (opt.backward(loss) if zero else loss.backward())
            opt.param_groups[1]["lr"] = 0.05 / (step + 1)
            opt.step()
            opt.zero_grad()
        results.append([p.detach().numpy().copy() for p in model.parameters()])
        if zero:
            saved = opt.state_dict()
            assert [g["lr"] for g in saved["param_groups"]] == [0.01, pytest.approx(0.05 / 3)]
            opt.param_groups[1]["lr"] = 1.0
            opt.load_state_dict(saved)
            assert opt.param_groups[1]["lr"] == pytest.approx(0.05 / 3)
            with pytest.raises(ValueError, match="parameter groups"):
                opt.lr
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)

    model, groups = model_and_groups()
    with pytest.raises(ValueError, match=r"parameters \['2.bias'\] are in no group"):
        dist.ZeroRedundancyOptimizer(model, params=[{"params": groups[0]["params"]},
                                                    {"params": groups[1]["params"][:1]}])
    with pytest.raises(ValueError, match="parameter '0.weight' is in groups 0 and 1"):
        dist.ZeroRedundancyOptimizer(model, params=[groups[0], {"params": groups[0]["params"][:1]},
                                                    groups[1]])
    with pytest.raises(ValueError, match="is not a parameter of the module"):
        dist.ZeroRedundancyOptimizer(model, params=[groups[0], groups[1],
                                                    {"params": [loom.zeros(3)]}])
    with pytest.raises(TypeError, match="params must be a list of dicts"):
        dist.ZeroRedundancyOptimizer(model, params=list(model.parameters()))
