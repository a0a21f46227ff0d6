"""loom.optim: SGD, Adam and AdamW under torch.optim's names, over loom's C++ optimizers
(optimizer/sgd.h, optimizer/adamw.h; step() runs with the GIL released), and
``loom.optim.lr_scheduler`` (LambdaLR, StepLR, CosineAnnealingLR, LinearLR, SequentialLR,
OneCycleLR).

Parameter groups as in torch.optim: ``params`` is an iterable of tensors (one group) or of dicts,
each with "params" and any options that differ from the constructor's::

    opt = loom.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                            {"params": no_decay, "weight_decay": 0.0}], lr=3e-4)
    opt.add_param_group({"params": head, "lr": 1e-3})

A parameter may be in one group only. ``opt.param_groups[i]["lr"] = x`` sets group i's learning
rate (what schedules do); other options can be set too (See Note [One C++ optimizer per group]
for what that costs and what cannot change). ``opt.lr`` reads and sets the learning rate of an
optimizer with one group.

``state_dict()`` has PyTorch's two keys. "param_groups": a list of dicts, each group's options,
lr and extra keys (a scheduler's "initial_lr") and "params", its parameters' indices counted
across all groups in order. "state": loom's flat map of copies, "{i}.exp_avg", "{i}.step", ...
with i that same index (See Note [Optimizer state dict] in optimizer/optimizer.h). Its values
are loom tensors; ``load_state_dict`` also takes nested lists or numbers in their place (in the
dtype of the optimizer's own state), and lists for tuples, so a state dict round-trips through
JSON (it takes lr, momentum and beta1 from the state dict; other options must match)::

    text = json.dumps(opt.state_dict(), default=lambda t: t.tolist())
    opt.load_state_dict(json.loads(text))   # the next steps are bit-identical

``step()`` also advances the dropout step, so the next step draws new dropout masks
(loom/nn/_dropout.py).

``LrSchedule`` is loom-gpt's learning-rate schedule (optimizer/lr_schedule.h): warmup, then
constant or cosine; set ``opt.lr = schedule.lr(step)`` before each step.
"""

# Note [One C++ optimizer per group]
# A C++ optimizer holds one set of options, so a parameter group is one C++ optimizer over its
# parameters, and step() steps each in turn. "lr" writes through to the group's optimizer (it is
# what the C++ optimizers let change). Setting another option (a schedule cycling betas or
# momentum, say) builds the group's C++ optimizer anew with that option and copies the old one's
# state into it: two copies of the group's state, cheap next to a training step but not free.
# SGD's momentum cannot move between 0 and non-zero (its momentum buffers exist only when built
# with momentum), and ZeroRedundancyOptimizer, which wraps one C++ optimizer over its shards
# (a GroupedOptimizer when built with params=[groups]), has groups fixed when it is built, and
# options other than lr fixed too. load_state_dict() takes from the state dict
# what a schedule changes while training (lr, momentum, beta1) and requires the rest to match, so
# a resumed OneCycleLR run goes on with the betas it had and a wrong checkpoint is an error.

import bisect

from loom import _loom
from loom.nn import _dropout
from loom._loom.optim import LrSchedule  # noqa: F401  (bound in python/src/data.cpp)

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "MixedPrecisionOptimizer", "LrSchedule",
           "lr_scheduler"]


def _option(owner, key, value):
    """An option as param_groups holds it: betas a tuple of two floats, nesterov a bool, the
    rest floats."""
    if key == "betas":
        try:
            beta1, beta2 = (float(b) for b in value)
        except (TypeError, ValueError):
            raise TypeError(f"{owner}: 'betas' must be two numbers, got {value!r}") from None
        return (beta1, beta2)
    if key == "nesterov":
        return bool(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{owner}: '{key}' must be a number, got {type(value).__name__}")
    return float(value)


def _same_option(saved, current):
    """Whether a state dict's option equals this optimizer's (JSON turns tuples into lists)."""
    if isinstance(current, tuple) and isinstance(saved, (list, tuple)):
        return tuple(saved) == current
    return saved == current


def _param_key(p):
    """What tells parameters apart: the data pointer (Python wrappers of one parameter differ,
    and Tensor.__eq__ is element-wise)."""
    return p.data_ptr() if p.numel() > 0 else ("empty", id(p))


def _shape(p):
    return "[" + ", ".join(str(d) for d in p.shape) + "]"


def _shift(key, offset):
    """'{j}.{kind}' -> '{j + offset}.{kind}' (a group's index -> the index across groups)."""
    head, dot, rest = key.partition(".")
    if offset == 0 or not dot or not head.isdigit():
        return key
    return f"{int(head) + offset}.{rest}"


class _ParamGroup(dict):
    """param_groups[i]: a dict whose "lr" reads and writes group i's C++ optimizer and whose
    options rebuild it when set (Optimizer._set_option)."""

    def __init__(self, optimizer, index, items):
        super().__init__(items)
        self._optimizer = optimizer
        self._index = index

    def _sync(self):
        dict.__setitem__(self, "lr", self._optimizer._impls[self._index].lr)

    def __getitem__(self, key):
        if key == "lr":
            self._sync()
        return super().__getitem__(key)

    def get(self, key, default=None):
        return self[key] if key in self else default

    def items(self):
        self._sync()
        return super().items()

    def values(self):
        self._sync()
        return super().values()

    def copy(self):
        self._sync()
        return dict(self)

    def __repr__(self):
        self._sync()
        return super().__repr__()

    def __setitem__(self, key, value):
        self._optimizer._set_option(self._index, key, value)

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args, **kwargs):
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __delitem__(self, key):
        if key == "params" or key in self._optimizer.defaults:
            raise ValueError(f"param_groups: '{key}' cannot be removed")
        super().__delitem__(key)

    def pop(self, key, *default):
        if key == "params" or key in self._optimizer.defaults:
            raise ValueError(f"param_groups: '{key}' cannot be removed")
        return super().pop(key, *default)


class Optimizer:
    """Base of loom's optimizers: step(), zero_grad(), param_groups, add_param_group(),
    state_dict(), load_state_dict(), lr. Optimizer(impl, hyper) wraps one C++ optimizer built
    elsewhere (ZeroRedundancyOptimizer's) as one group whose options other than lr are fixed;
    SGD, Adam and AdamW build one C++ optimizer per group (_init_groups)."""

    _build = None  # (params, options) -> a C++ optimizer; None: the options are fixed

    def __init__(self, impl, hyper):
        self.defaults = dict(hyper, lr=impl.lr)
        self._impls = [impl]
        self.param_groups = [_ParamGroup(self, 0, dict(hyper, lr=impl.lr,
                                                        params=list(impl.params)))]

    def _init_groups(self, params, defaults):
        """PyTorch's Optimizer(params, defaults): params an iterable of tensors or of dicts."""
        name = type(self).__name__
        if isinstance(params, (_loom.Tensor, dict)):
            raise TypeError(f"{name}: params must be an iterable of tensors or of dicts (parameter "
                            f"groups), got a {type(params).__name__}")
        self.defaults = {key: _option(name, key, value) for key, value in defaults.items()}
        self._impls = []
        self.param_groups = []
        groups = list(params)
        if not groups or not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    def add_param_group(self, param_group):
        """Adds a group: a dict with "params" and options that differ from the defaults (the
        constructor's arguments). A parameter already in a group is an error."""
        name = type(self).__name__
        if self._build is None:
            raise ValueError(f"{name}: its parameter groups are fixed when it is built (it "
                             "wraps one C++ optimizer; give every group to its constructor)")
        if not isinstance(param_group, dict):
            raise TypeError(f"{name}: a parameter group must be a dict with 'params', got a "
                            f"{type(param_group).__name__}")
        if "params" not in param_group:
            raise ValueError(f"{name}: parameter group {len(self.param_groups)} has no 'params'")
        params = param_group["params"]
        if isinstance(params, _loom.Tensor):
            params = [params]
        elif isinstance(params, (set, frozenset)):
            raise TypeError(f"{name}: a group's params must be an ordered collection (a list), not "
                            "a set: its order numbers the parameters in state_dict()")
        else:
            params = list(params)
        index = len(self.param_groups)
        seen = {}
        for g, group in enumerate(self.param_groups):
            for j, p in enumerate(dict.__getitem__(group, "params")):
                seen[_param_key(p)] = (g, j)
        for j, p in enumerate(params):
            if not isinstance(p, _loom.Tensor):
                raise TypeError(f"{name}: parameter group {index}: expected an iterable of "
                                f"loom.Tensor, got a {type(p).__name__} at position {j}")
            key = _param_key(p)
            if key in seen:
                g, k = seen[key]
                where = f"twice in group {index}" if g == index else f"in groups {g} and {index}"
                raise ValueError(f"{name}: a parameter of shape {_shape(p)} is {where} (position "
                                 f"{k} and {j}); a parameter can be in one group only")
            seen[key] = (index, j)
        group = {key: value for key, value in param_group.items() if key != "params"}
        for key, value in self.defaults.items():
            group[key] = _option(name, key, group.get(key, value))
        impl = self._build(params, group)
        self._impls.append(impl)
        group["params"] = params
        self.param_groups.append(_ParamGroup(self, index, group))

    def _set_option(self, index, key, value):
        """param_groups[index][key] = value. See Note [One C++ optimizer per group]."""
        name = type(self).__name__
        group = self.param_groups[index]
        impl = self._impls[index]
        if key == "lr":
            impl.lr = _option(name, key, value)
            dict.__setitem__(group, key, impl.lr)
            return
        if key == "params":
            raise ValueError(f"{name}: param_groups[{index}]['params'] is fixed once the group is "
                             "added (add_param_group adds parameters in a new group)")
        if key not in self.defaults:  # not an option: a scheduler's "initial_lr", the user's own
            dict.__setitem__(group, key, value)
            return
        value = _option(name, key, value)
        old = dict.__getitem__(group, key)
        if value == old:
            return
        if self._build is None:
            raise ValueError(f"{name}: param_groups: '{key}' is fixed when the optimizer is built "
                             "(only 'lr' can change; a schedule that cycles momentum, such as "
                             "OneCycleLR, needs cycle_momentum=False here)")
        self._check_change(index, key, old, value)
        options = {k: dict.__getitem__(group, k) for k in self.defaults}
        options[key] = value
        options["lr"] = impl.lr
        rebuilt = self._build(dict.__getitem__(group, "params"), options)
        rebuilt.load_state_dict(impl.state_dict())
        self._impls[index] = rebuilt
        dict.__setitem__(group, key, value)

    def _check_change(self, index, key, old, new):
        """Raises where an option cannot change once built (SGD's momentum to or from 0)."""

    @property
    def _impl(self):
        """The C++ optimizer of a one-group optimizer (what loom.distributed.checkpoint saves)."""
        if len(self._impls) != 1:
            raise ValueError(f"{type(self).__name__} has {len(self._impls)} parameter groups, "
                             "one C++ optimizer each; loom.distributed.checkpoint saves an "
                             "optimizer with one group (save state_dict() instead)")
        return self._impls[0]

    def step(self, closure=None):
        """One update of every parameter that has a gradient (those without one are skipped).
        ``closure`` (optional) re-evaluates the model and returns the loss, as in PyTorch."""
        loss = None
        if closure is not None:
            from loom.autograd import enable_grad

            with enable_grad():
                loss = closure()
        for index, impl in enumerate(self._impls):
            self._step_group(index, impl)
        _dropout._advance_step()  # the next step draws new dropout masks (loom/nn/_dropout.py)
        return loss

    def _step_group(self, index, impl):
        impl.step()

    def zero_grad(self, set_to_none=True):
        """Drops every parameter's gradient (PyTorch's default set_to_none=True)."""
        if not set_to_none:
            raise ValueError("zero_grad: loom drops gradients (set_to_none=True) only")
        for impl in self._impls:
            impl.zero_grad()

    def _only_group(self, what):
        if len(self._impls) != 1:
            raise ValueError(f"{type(self).__name__}.{what}: {len(self._impls)} parameter groups; "
                             "use param_groups[i]['lr']")
        return self._impls[0]

    @property
    def lr(self):
        """The learning rate of a one-group optimizer (param_groups[i]["lr"] with several)."""
        return self._only_group("lr").lr

    @lr.setter
    def lr(self, value):
        self._only_group("lr")
        self.param_groups[0]["lr"] = value

    def state_dict(self):
        """{"state": "{i}.{kind}" -> tensor copy, "param_groups": [options, lr, extra keys and
        "params", the indices of the group's parameters]}; i counts across groups."""
        state, offset = {}, 0
        for group, impl in zip(self.param_groups, self._impls):
            for key, value in impl.state_dict().items():
                state[_shift(key, offset)] = value
            offset += len(dict.__getitem__(group, "params"))
        return {"state": state, "param_groups": self._saved_groups()}

    def _saved_groups(self):
        """state_dict()'s "param_groups": each group's options, lr, extra keys and "params"."""
        groups, offset = [], 0
        for group, impl in zip(self.param_groups, self._impls):
            count = len(dict.__getitem__(group, "params"))
            saved = {k: v for k, v in dict.items(group) if k != "params"}
            saved["lr"] = impl.lr
            saved["params"] = list(range(offset, offset + count))
            groups.append(saved)
            offset += count
        return groups

    def _restore_groups(self, saved_groups):
        """Each group's lr and extra keys ("initial_lr") from a state dict's "param_groups"."""
        for group, saved in zip(self.param_groups, saved_groups):
            for key, value in saved.items():
                if key == "lr" or (key not in self.defaults and key != "params"):
                    group[key] = value

    def load_state_dict(self, state_dict):
        """Restores a state_dict() of the same kind of optimizer with the same groups over
        parameters of the same shapes: the state (checked in full before anything changes;
        ValueError naming the key) and each group's lr, extra keys ("initial_lr") and the options
        a schedule changes while training (momentum, and beta1 of betas: OneCycleLR's). The other
        options must match this optimizer's. Tensors may be given as nested lists or numbers,
        tuples as lists (a state dict that went through JSON)."""
        name = type(self).__name__
        if not isinstance(state_dict, dict) or "state" not in state_dict:
            raise ValueError("load_state_dict: expected a dict with 'state' and 'param_groups' "
                             "(what state_dict() returns)")
        saved_groups = state_dict.get("param_groups", [])
        if saved_groups and len(saved_groups) != len(self.param_groups):
            raise ValueError(f"load_state_dict: {len(saved_groups)} parameter groups in the state "
                             f"dict, {len(self.param_groups)} in this {name}")
        offsets, total = [], 0
        for group in self.param_groups:
            offsets.append(total)
            total += len(dict.__getitem__(group, "params"))
        scheduled = []  # (group, key, saved value, current value): momentum / betas to take
        for g, saved in enumerate(saved_groups):
            group = self.param_groups[g]
            where = f"group {g}: " if len(self.param_groups) > 1 else ""
            count = len(dict.__getitem__(group, "params"))
            if "params" in saved and list(saved["params"]) != list(range(offsets[g],
                                                                         offsets[g] + count)):
                raise ValueError(f"load_state_dict: {where}params {list(saved['params'])} in the "
                                 f"state dict, but this {name}'s group {g} has parameters "
                                 f"{offsets[g]}..{offsets[g] + count - 1}")
            for key in self.defaults:
                if key == "lr" or key not in saved:
                    continue
                current = dict.__getitem__(group, key)
                if _same_option(saved[key], current):
                    continue
                if self._build is not None and key in ("momentum", "betas"):
                    value = _option(name, key, saved[key])
                    if key == "momentum" or value[1] == current[1]:
                        self._check_change(g, key, current, value)
                        scheduled.append((g, key, value, current))
                        continue
                raise ValueError(f"load_state_dict: {where}'{key}' is {saved[key]} in the "
                                 f"state dict, {current} in this optimizer")
        parts = [{} for _ in self._impls]
        for key, value in dict(state_dict["state"]).items():
            head, dot, rest = str(key).partition(".")
            if dot and head.isdigit():
                i = int(head)
                if i >= total:
                    raise ValueError(f"load_state_dict: '{key}' is for parameter {i}, but this "
                                     f"{name} has {total}")
                g = bisect.bisect_right(offsets, i) - 1
                parts[g][f"{i - offsets[g]}.{rest}"] = value
            elif len(self._impls) == 1:
                parts[0][key] = value
            else:
                raise ValueError(f"load_state_dict: unexpected key '{key}' in 'state' (keys are "
                                 "'{index}.{kind}')")
        parts = [self._as_tensors(impl, part) for impl, part in zip(self._impls, parts)]
        # Each C++ load checks everything before it copies; a failure puts back what an earlier
        # group loaded or a rebuild changed, so a failed load changes nothing.
        before = [impl.state_dict() for impl in self._impls] if len(self._impls) > 1 else []
        done = []
        try:
            for g, key, value, current in scheduled:
                self.param_groups[g][key] = value
                done.append((g, key, current))
            for g, (impl, part) in enumerate(zip(self._impls, parts)):
                impl.load_state_dict(part)
        except Exception:
            for g, key, current in reversed(done):
                self.param_groups[g][key] = current
            for g, state in enumerate(before):
                self._impls[g].load_state_dict(state)
            raise
        self._restore_groups(saved_groups)

    @staticmethod
    def _as_tensors(impl, state):
        """state with lists and numbers made tensors of the dtype of impl's own state."""
        if all(isinstance(v, _loom.Tensor) for v in state.values()):
            return state
        own = impl.state_dict()
        out = {}
        for key, value in state.items():
            if not isinstance(value, _loom.Tensor):
                value = (_loom.tensor(value, dtype=own[key].dtype) if key in own
                         else _loom.tensor(value))
            out[key] = value
        return out

    def __repr__(self):
        def options(group, impl):
            return ", ".join(f"{k}={dict.__getitem__(group, k) if k != 'lr' else impl.lr}"
                             for k in self.defaults)

        groups = list(zip(self.param_groups, self._impls))
        if len(groups) == 1:
            return f"{type(self).__name__}({options(*groups[0])})"
        body = "; ".join(f"group {g}: {options(*pair)}" for g, pair in enumerate(groups))
        return f"{type(self).__name__}({body})"


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, exactly torch.optim.SGD's update. ``params``:
    tensors, or parameter groups (dicts) with their own lr, momentum, dampening, weight_decay,
    nesterov. momentum cannot change between 0 and non-zero once built.

        >>> opt = loom.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    """

    def __init__(self, params, lr, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False):
        self._init_groups(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                       weight_decay=weight_decay, nesterov=nesterov))

    def _build(self, params, options):
        return _loom.optim.SGD(params, options["lr"], options["momentum"], options["dampening"],
                               options["weight_decay"], options["nesterov"])

    def _check_change(self, index, key, old, new):
        if key == "momentum" and (old == 0.0) != (new == 0.0):
            raise ValueError(f"SGD: param_groups[{index}]: 'momentum' cannot change from {old} to "
                             f"{new}: the momentum buffers exist only when SGD is built with "
                             "momentum != 0; build it with the momentum the group needs")


class AdamW(Optimizer):
    """AdamW (decoupled weight decay), exactly torch.optim.AdamW's update, PyTorch's defaults.
    ``params``: tensors, or parameter groups (dicts) with their own lr, betas, eps,
    weight_decay.

    Example::

        model = loom.nn.GPT(config).init_parameters(seed=1337)
        decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
        no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
        opt = loom.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                {"params": no_decay, "weight_decay": 0.0}], lr=3e-4)
        for idx, targets in batches:
            loss = model.loss(idx, targets)
            loss.backward()
            opt.step()          # GIL released
            opt.zero_grad()
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        self._init_groups(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    def _build(self, params, options):
        beta1, beta2 = options["betas"]
        return _loom.optim.AdamW(params, options["lr"], beta1, beta2, options["eps"],
                                 options["weight_decay"])


class Adam(Optimizer):
    """Adam with L2 weight decay, torch.optim.Adam's update (amsgrad off): the gradient is
    grad + weight_decay * param, then the Adam step. Over loom's AdamW with its decoupled decay
    off; the L2 term is added before each step into a copy of the gradient (``p.grad`` is left as
    it was), with the f32 rounding of torch's ``grad.add(param, alpha=wd)``.

        >>> opt = loom.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-4)
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        self._init_groups(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    def _build(self, params, options):
        if options["weight_decay"] < 0.0:
            raise ValueError(f"Adam: weight decay must be >= 0, got {options['weight_decay']}")
        beta1, beta2 = options["betas"]
        return _loom.optim.AdamW(params, options["lr"], beta1, beta2, options["eps"], 0.0)

    def _step_group(self, index, impl):
        group = self.param_groups[index]
        weight_decay = dict.__getitem__(group, "weight_decay")
        if weight_decay == 0.0:
            impl.step()
            return
        from loom.autograd import no_grad

        grads = []
        try:
            with no_grad():
                for p in dict.__getitem__(group, "params"):
                    grad = p.grad
                    if grad is None:
                        continue
                    grads.append((p, grad))
                    decayed = grad.detach().clone()
                    decayed.add_(p.detach(), alpha=weight_decay)  # grad + wd * p, fused as torch's
                    p.grad = decayed
            impl.step()
        finally:
            for p, grad in grads:
                p.grad = grad


class MixedPrecisionOptimizer(Optimizer):
    """Trains a bf16 or f16 model with f32 master weights (optimizer/mixed_precision.h), without
    ZeRO: ``optimizer_class`` (AdamW or SGD, with its keyword arguments) steps the masters, and
    each step rounds them into the model's parameters. One parameter group.

    ``loss_scale``: None (bf16: no scaling needed), "dynamic" (f16: torch.cuda.amp.GradScaler's
    rule and defaults: start at 65536, halve and skip the step on an inf or NaN gradient, double
    after 2000 good steps in a row), or a number (a fixed scale)::

        model = loom.nn.GPT(config).to(loom.float16)
        opt = loom.optim.MixedPrecisionOptimizer(model.parameters(), loom.optim.AdamW,
                                                 loss_scale="dynamic", lr=3e-4)
        opt.scale_loss(model.loss(idx, targets)).backward()
        opt.clip_grad_norm_(1.0)     # optional: on the unscaled f32 gradients
        opt.step()                   # skipped (nothing changes) on a non-finite gradient
        opt.zero_grad()

    Where loom differs from PyTorch's autocast + GradScaler: the model itself holds bf16/f16
    parameters (``model.to(dtype)``) rather than casting per op, and the scaler lives in the
    optimizer (``scale_loss`` is GradScaler.scale, ``step`` is GradScaler.step + update).
    """

    def __init__(self, params, optimizer_class=None, *, loss_scale=None, growth_factor=2.0,
                 backoff_factor=0.5, growth_interval=2000, **optimizer_kwargs):
        optimizer_class = AdamW if optimizer_class is None else optimizer_class
        if optimizer_class is AdamW:
            o = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)
            inner = "adamw"
        elif optimizer_class is SGD:
            o = dict(momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False)
            inner = "sgd"
        else:
            raise TypeError("MixedPrecisionOptimizer: optimizer_class must be loom.optim.AdamW or "
                            f"loom.optim.SGD, got {getattr(optimizer_class, '__name__', optimizer_class)}")
        unknown = set(optimizer_kwargs) - set(o) - {"lr"}
        if unknown:
            raise TypeError(f"MixedPrecisionOptimizer: {optimizer_class.__name__} takes no "
                            f"{sorted(unknown)}")
        o.update(optimizer_kwargs)
        if "lr" not in o:
            raise TypeError("MixedPrecisionOptimizer: SGD needs lr")
        options = {key: o[key] for key in o if key != "betas"}
        if inner == "adamw":
            options["beta1"], options["beta2"] = o["betas"]
        if loss_scale is None:
            scaling, init_scale, dynamic = False, 1.0, False
        elif loss_scale == "dynamic":
            scaling, init_scale, dynamic = True, 65536.0, True
        elif isinstance(loss_scale, (int, float)) and not isinstance(loss_scale, bool):
            scaling, init_scale, dynamic = True, float(loss_scale), False
        else:
            raise ValueError("MixedPrecisionOptimizer: loss_scale must be None, 'dynamic' or a "
                             f"number, got {loss_scale!r}")
        impl = _loom.optim.MixedPrecision(list(params), inner, options, scaling, init_scale,
                                          float(growth_factor), float(backoff_factor),
                                          int(growth_interval), dynamic)
        hyper = {key: value for key, value in o.items() if key != "lr"}
        super().__init__(impl, dict(hyper, loss_scale=loss_scale))

    def scale_loss(self, loss):
        """loss times the current scale (differentiable); call backward() on it."""
        return self._impls[0].scale_loss(loss)

    def unscale_gradients(self):
        """Moves the gradients into the f32 masters, unscaled; False when one is inf or NaN (the
        step will be skipped). step() calls it when you have not."""
        return self._impls[0].unscale_gradients()

    def clip_grad_norm_(self, max_norm):
        """Clips the unscaled f32 gradients to a global norm; returns the norm before clipping
        (inf or NaN when the step will be skipped)."""
        return self._impls[0].clip_grad_norm(float(max_norm))

    @property
    def scale(self):
        """The current loss scale (1 without scaling)."""
        return self._impls[0].scale

    @property
    def last_step_skipped(self):
        """Whether the last step() was skipped for an inf or NaN gradient."""
        return self._impls[0].last_step_skipped


from loom.optim import lr_scheduler  # noqa: E402  (last: it imports Optimizer from here)
