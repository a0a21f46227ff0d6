"""loom.optim: SGD and AdamW under torch.optim's names, over loom's C++ optimizers
(optimizer/sgd.h, optimizer/adamw.h; step() runs with the GIL released).

One parameter group per optimizer. ``opt.lr`` reads and sets the learning rate, and so does
``opt.param_groups[0]["lr"] = x`` (the habit of PyTorch schedules). ``state_dict()`` has
PyTorch's two keys: "state" (loom's flat map "{i}.exp_avg", "{i}.step", ..., copies; See Note
[Optimizer state dict]) and "param_groups" (the hyper-parameters, lr included).

``step()`` also advances the dropout step, so the next step draws new dropout masks
(loom/nn/_dropout.py).

``LrSchedule`` is loom-gpt's learning-rate schedule (optimizer/lr_schedule.h): warmup, then
constant or cosine; set ``opt.lr = schedule.lr(step)`` before each step.
"""

from loom import _loom
from loom.nn import _dropout
from loom._loom.optim import LrSchedule  # noqa: F401  (bound in python/src/data.cpp)

__all__ = ["Optimizer", "SGD", "AdamW", "LrSchedule"]


class _ParamGroup(dict):
    """param_groups[0]: a dict whose "lr" writes through to the optimizer."""

    def __init__(self, optimizer, items):
        super().__init__(items)
        self._optimizer = optimizer

    def __getitem__(self, key):
        if key == "lr":
            return self._optimizer.lr
        return super().__getitem__(key)

    def __setitem__(self, key, value):
        if key == "lr":
            self._optimizer.lr = value
        elif key in self:
            raise ValueError(f"param_groups: '{key}' is fixed when the optimizer is built "
                             "(only 'lr' can change)")
        super().__setitem__(key, value)


class Optimizer:
    """Base of loom's optimizers: step(), zero_grad(), lr, param_groups, state_dict()."""

    _defaults = ()  # names of the hyper-parameters, in param_groups and state_dict

    def __init__(self, impl, hyper):
        self._impl = impl
        self._hyper = dict(hyper)
        group = dict(self._hyper)
        group["params"] = impl.params
        group["lr"] = impl.lr
        self.param_groups = [_ParamGroup(self, group)]

    def step(self, closure=None):
        """One update of every parameter that has a gradient (those without one are skipped).
        ``closure`` (optional) re-evaluates the model and returns the loss, as in PyTorch."""
        loss = None
        if closure is not None:
            from loom.autograd import enable_grad

            with enable_grad():
                loss = closure()
        self._impl.step()
        _dropout._advance_step()  # the next step draws new dropout masks (loom/nn/_dropout.py)
        return loss

    def zero_grad(self, set_to_none=True):
        """Drops every parameter's gradient (PyTorch's default set_to_none=True)."""
        if not set_to_none:
            raise ValueError("zero_grad: loom drops gradients (set_to_none=True) only")
        self._impl.zero_grad()

    @property
    def lr(self):
        return self._impl.lr

    @lr.setter
    def lr(self, value):
        self._impl.lr = float(value)

    def state_dict(self):
        """{"state": name -> tensor copy, "param_groups": [hyper-parameters with lr]}."""
        group = dict(self._hyper, lr=self.lr, params=list(range(len(self._impl.params))))
        return {"state": self._impl.state_dict(), "param_groups": [group]}

    def load_state_dict(self, state_dict):
        """Restores a state_dict() of the same kind of optimizer over parameters of the same
        shapes: the state (checked in full before anything changes; ValueError naming the key)
        and the learning rate. Hyper-parameters other than lr must match this optimizer's."""
        if not isinstance(state_dict, dict) or "state" not in state_dict:
            raise ValueError("load_state_dict: expected a dict with 'state' and 'param_groups' "
                             "(what state_dict() returns)")
        groups = state_dict.get("param_groups", [])
        if len(groups) > 1:
            raise ValueError(f"load_state_dict: {len(groups)} param groups, loom optimizers have "
                             "one")
        if groups:
            for key, value in self._hyper.items():
                if key in groups[0] and groups[0][key] != value:
                    raise ValueError(f"load_state_dict: '{key}' is {groups[0][key]} in the state "
                                     f"dict, {value} in this optimizer")
        self._impl.load_state_dict(dict(state_dict["state"]))
        if groups and "lr" in groups[0]:
            self.lr = groups[0]["lr"]

    def __repr__(self):
        args = ", ".join(f"{k}={v}" for k, v in dict(self._hyper, lr=self.lr).items())
        return f"{type(self).__name__}({args})"


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, exactly torch.optim.SGD's update.

        >>> opt = loom.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    """

    def __init__(self, params, lr, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False):
        impl = _loom.optim.SGD(list(params), float(lr), float(momentum), float(dampening),
                               float(weight_decay), bool(nesterov))
        super().__init__(impl, dict(momentum=momentum, dampening=dampening,
                                    weight_decay=weight_decay, nesterov=nesterov))


class AdamW(Optimizer):
    """AdamW (decoupled weight decay), exactly torch.optim.AdamW's update, PyTorch's defaults.

    Example::

        model = loom.nn.GPT(config).init_parameters(seed=1337)
        opt = loom.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.0)
        for idx, targets in batches:
            loss = model.loss(idx, targets)
            loss.backward()
            opt.step()          # GIL released
            opt.zero_grad()
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        beta1, beta2 = betas
        impl = _loom.optim.AdamW(list(params), float(lr), float(beta1), float(beta2),
                                 float(eps), float(weight_decay))
        super().__init__(impl, dict(betas=(beta1, beta2), eps=eps, weight_decay=weight_decay))
