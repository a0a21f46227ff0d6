"""loom.optim.lr_scheduler: torch.optim.lr_scheduler's LambdaLR, StepLR, CosineAnnealingLR,
LinearLR, SequentialLR and OneCycleLR, with PyTorch's arguments and semantics, over the
param_groups of any loom optimizer (SGD, Adam, AdamW, ZeroRedundancyOptimizer).

    opt = loom.optim.AdamW(model.parameters(), lr=3e-4)
    warmup = lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=100)
    cosine = lr_scheduler.CosineAnnealingLR(opt, T_max=900, eta_min=3e-5)
    sched = lr_scheduler.SequentialLR(opt, [warmup, cosine], milestones=[100])
    for step in range(1000):
        ...
        opt.step()
        sched.step()        # after opt.step(), as in PyTorch

As in PyTorch, building a scheduler takes its first step: it records each group's "initial_lr"
(unless resuming with last_epoch >= 0) and sets the lr for step 0. step() computes the next lr
from each group's current one (PyTorch's chainable forms, so the values are torch's to the last
bits and two schedulers may act on one optimizer); the deprecated step(epoch) uses the closed
forms. A subclass overrides get_lr(), as with torch's LRScheduler.

Where loom differs: state_dict() holds plain data (numbers, lists, strings, dicts), so it
round-trips through JSON, and load_state_dict() checks that the keys are this scheduler's.
OneCycleLR's cycle_momentum (on by default) sets every group's momentum or betas at each step,
which rebuilds the group's C++ optimizer (See Note [One C++ optimizer per group] in
loom/optim/__init__.py); it needs SGD built with momentum != 0 and cycle_momentum=False with
ZeroRedundancyOptimizer, whose options are fixed. No warning is given when step() runs before
the optimizer's step().
"""

import bisect
import copy
import math
import types
import warnings

from loom.optim import Optimizer

__all__ = ["LRScheduler", "LambdaLR", "StepLR", "LinearLR", "CosineAnnealingLR", "SequentialLR",
           "OneCycleLR"]


def _check_optimizer(optimizer, owner):
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"{owner}: optimizer must be a loom.optim optimizer (SGD, Adam, AdamW, "
                        f"ZeroRedundancyOptimizer), got {type(optimizer).__name__}")
    return optimizer


def _check_int(value, owner, name, minimum):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{owner}: {name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{owner}: {name} must be >= {minimum}, got {value}")
    return value


def _per_group(value, optimizer, owner, name):
    """One value per group: a list or tuple of that length, or one value for all."""
    count = len(optimizer.param_groups)
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise ValueError(f"{owner}: {len(value)} values of {name} for {count} parameter "
                             "groups")
        return list(value)
    return [value] * count


class LRScheduler:
    """Base of the schedulers: sets each parameter group's lr to get_lr() at every step().
    ``last_epoch``: the index of the last step taken (-1: a new run; k >= 0: resuming, with the
    optimizer's groups holding "initial_lr" from the run resumed)."""

    _not_state = ("optimizer",)  # attributes that state_dict() leaves out

    def __init__(self, optimizer, last_epoch=-1, verbose=False):
        owner = type(self).__name__
        self.optimizer = _check_optimizer(optimizer, owner)
        _check_int(last_epoch, owner, "last_epoch", -1)
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(f"{owner}: param_groups[{i}] has no 'initial_lr', which "
                                   f"resuming (last_epoch={last_epoch}) reads: load the "
                                   "optimizer's state_dict() first, or start with last_epoch=-1")
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self.verbose = bool(verbose)
        self._initial_step()

    def _initial_step(self):
        self._step_count = 0
        self.step()

    def get_lr(self):
        """Each group's lr at step self.last_epoch (called by step(); a subclass defines it)."""
        raise NotImplementedError(f"{type(self).__name__} does not define get_lr()")

    def get_last_lr(self):
        """The lr of each group that the last step() set."""
        return list(self._last_lr)

    def step(self, epoch=None):
        """Advances one step and sets each group's lr. ``epoch`` (deprecated in PyTorch too)
        jumps to that step with the closed form where the scheduler has one."""
        if epoch is not None:
            warnings.warn(f"{type(self).__name__}.step(epoch) is deprecated (as in PyTorch): call "
                          "step() once per step", UserWarning, stacklevel=2)
            self._step_at(epoch)
            return
        self._step_count += 1
        self.last_epoch += 1
        self._apply(self.get_lr())

    def _step_at(self, epoch):
        self._step_count += 1
        self.last_epoch = epoch
        closed_form = getattr(self, "_closed_form_lr", None)
        self._apply(closed_form() if closed_form is not None else self.get_lr())

    def _apply(self, values):
        for i, (group, lr) in enumerate(zip(self.optimizer.param_groups, values)):
            group["lr"] = lr
            if self.verbose:
                print(f"{type(self).__name__}: step {self.last_epoch}: lr of group {i} set to "
                      f"{lr:.4e}")
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self):
        """Everything but the optimizer, copied: plain data that round-trips through JSON."""
        return {key: copy.deepcopy(value) for key, value in self.__dict__.items()
                if key not in self._not_state}

    def load_state_dict(self, state_dict):
        """Restores a state_dict() of the same kind of scheduler (lists may stand for tuples)."""
        self._check_keys(state_dict)
        self._restore(state_dict)

    def _restore(self, state_dict):
        for key, value in state_dict.items():
            if key not in self._not_state:
                setattr(self, key, copy.deepcopy(value))

    def _check_keys(self, state_dict):
        owner = f"{type(self).__name__}.load_state_dict"
        if not isinstance(state_dict, dict):
            raise TypeError(f"{owner}: expected a dict (what state_dict() returns), got "
                            f"{type(state_dict).__name__}")
        own = set(self.state_dict())
        missing, unexpected = sorted(own - set(state_dict)), sorted(set(state_dict) - own)
        if missing or unexpected:
            raise ValueError(f"{owner}: the state does not fit this scheduler:"
                             + (f" missing {missing};" if missing else "")
                             + (f" unexpected {unexpected};" if unexpected else "")
                             + " hint: load a state_dict() of the same scheduler")

    def __repr__(self):
        return f"{type(self).__name__}(last_epoch={self.last_epoch}, last_lr={self._last_lr})"


_LRScheduler = LRScheduler  # PyTorch 1.x's name


class LambdaLR(LRScheduler):
    """lr = initial_lr * lr_lambda(step): one function for all groups, or a list of one per
    group. state_dict() keeps the attributes of callable objects (None for functions), as
    PyTorch's does."""

    _not_state = ("optimizer", "lr_lambdas")

    def __init__(self, optimizer, lr_lambda, last_epoch=-1, verbose=False):
        _check_optimizer(optimizer, "LambdaLR")
        self.lr_lambdas = _per_group(lr_lambda, optimizer, "LambdaLR", "lr_lambda")
        for i, fn in enumerate(self.lr_lambdas):
            if not callable(fn):
                raise TypeError(f"LambdaLR: lr_lambda {i} is a {type(fn).__name__}, not a "
                                "function")
        super().__init__(optimizer, last_epoch, verbose)

    def get_lr(self):
        return [base_lr * fn(self.last_epoch) for fn, base_lr in zip(self.lr_lambdas,
                                                                     self.base_lrs)]

    @staticmethod
    def _saved_attributes(fn):
        if isinstance(fn, types.FunctionType) or not hasattr(fn, "__dict__"):
            return None
        return copy.deepcopy(fn.__dict__)

    def state_dict(self):
        state = super().state_dict()
        state["lr_lambdas"] = [self._saved_attributes(fn) for fn in self.lr_lambdas]
        return state

    def load_state_dict(self, state_dict):
        self._check_keys(state_dict)
        saved = state_dict["lr_lambdas"]
        if len(saved) != len(self.lr_lambdas):
            raise ValueError(f"LambdaLR.load_state_dict: {len(saved)} lr_lambdas in the state, "
                             f"{len(self.lr_lambdas)} here")
        self._restore(state_dict)
        for fn, attributes in zip(self.lr_lambdas, saved):
            if attributes is not None:
                fn.__dict__.update(copy.deepcopy(attributes))


class StepLR(LRScheduler):
    """lr = initial_lr * gamma ** (step // step_size): multiplied by gamma every step_size
    steps."""

    def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1, verbose=False):
        self.step_size = _check_int(step_size, "StepLR", "step_size", 1)
        self.gamma = gamma
        super().__init__(optimizer, last_epoch, verbose)

    def get_lr(self):
        groups = self.optimizer.param_groups
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return [group["lr"] for group in groups]
        return [group["lr"] * self.gamma for group in groups]

    def _closed_form_lr(self):
        return [base_lr * self.gamma ** (self.last_epoch // self.step_size)
                for base_lr in self.base_lrs]


class LinearLR(LRScheduler):
    """lr = initial_lr * factor, the factor going linearly from start_factor (step 0) to
    end_factor (step total_iters), then staying there."""

    def __init__(self, optimizer, start_factor=1.0 / 3, end_factor=1.0, total_iters=5,
                 last_epoch=-1, verbose=False):
        if not 0.0 < start_factor <= 1.0:
            raise ValueError(f"LinearLR: start_factor must be in (0, 1], got {start_factor}")
        if not 0.0 <= end_factor <= 1.0:
            raise ValueError(f"LinearLR: end_factor must be in [0, 1], got {end_factor}")
        self.start_factor = start_factor
        self.end_factor = end_factor
        self.total_iters = _check_int(total_iters, "LinearLR", "total_iters", 1)
        super().__init__(optimizer, last_epoch, verbose)

    def get_lr(self):
        groups = self.optimizer.param_groups
        if self.last_epoch == 0:
            return [group["lr"] * self.start_factor for group in groups]
        if self.last_epoch > self.total_iters:
            return [group["lr"] for group in groups]
        # factor(e) / factor(e - 1), with factor(e) = start + (end - start) * e / total_iters
        slope = self.end_factor - self.start_factor
        ratio = 1.0 + slope / (self.total_iters * self.start_factor
                               + (self.last_epoch - 1) * slope)
        return [group["lr"] * ratio for group in groups]

    def _closed_form_lr(self):
        progress = min(self.total_iters, self.last_epoch) / self.total_iters
        return [base_lr * (self.start_factor + (self.end_factor - self.start_factor) * progress)
                for base_lr in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """lr = eta_min + (initial_lr - eta_min) * (1 + cos(pi * step / T_max)) / 2, and past T_max
    back up and down again (PyTorch's periodic continuation; no restarts)."""

    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch=-1, verbose=False):
        self.T_max = _check_int(T_max, "CosineAnnealingLR", "T_max", 1)
        self.eta_min = eta_min
        super().__init__(optimizer, last_epoch, verbose)

    def get_lr(self):
        groups = self.optimizer.param_groups
        epoch, t_max, eta_min = self.last_epoch, self.T_max, self.eta_min
        if epoch == 0:
            return [group["lr"] for group in groups]
        if self._step_count == 1 and epoch > 0:  # the first step of a resumed run
            return self._closed_form_lr()
        if (epoch - 1 - t_max) % (2 * t_max) == 0:  # the bottom of a period: start rising
            rise = (1.0 - math.cos(math.pi / t_max)) / 2
            return [group["lr"] + (base_lr - eta_min) * rise
                    for base_lr, group in zip(self.base_lrs, groups)]
        ratio = (1.0 + math.cos(math.pi * epoch / t_max)) / (
            1.0 + math.cos(math.pi * (epoch - 1) / t_max))
        return [ratio * (group["lr"] - eta_min) + eta_min for group in groups]

    def _closed_form_lr(self):
        return [self.eta_min + (base_lr - self.eta_min)
                * (1.0 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
                for base_lr in self.base_lrs]


class SequentialLR(LRScheduler):
    """schedulers[0] until milestones[0], then schedulers[1] from its step 0, and so on. The
    schedulers must be built over ``optimizer``; building SequentialLR restarts the first one
    and holds the others back until their milestone."""

    _not_state = ("optimizer", "_schedulers")

    def __init__(self, optimizer, schedulers, milestones, last_epoch=-1, verbose=False):
        owner = "SequentialLR"
        _check_optimizer(optimizer, owner)
        schedulers = list(schedulers)
        milestones = list(milestones)
        if not schedulers:
            raise ValueError(f"{owner}: schedulers is empty")
        for i, scheduler in enumerate(schedulers):
            if not isinstance(scheduler, LRScheduler):
                raise TypeError(f"{owner}: schedulers[{i}] is a {type(scheduler).__name__}, not a "
                                "loom.optim.lr_scheduler scheduler")
            if scheduler.optimizer is not optimizer:
                raise ValueError(f"{owner}: schedulers[{i}] was built over another optimizer than "
                                 "the one given")
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(f"{owner}: {len(schedulers)} schedulers need "
                             f"{len(schedulers) - 1} milestones, got {len(milestones)}")
        for m in milestones:
            _check_int(m, owner, "a milestone", 0)
        if milestones != sorted(milestones):
            raise ValueError(f"{owner}: milestones must be increasing, got {milestones}")
        _check_int(last_epoch, owner, "last_epoch", -1)
        self.optimizer = optimizer
        self._schedulers = schedulers
        self._milestones = milestones
        self.last_epoch = last_epoch + 1
        self.verbose = bool(verbose)
        # Each scheduler took its first step when built: put the lrs back, and take that step
        # again for the first scheduler only; the others start at their milestone.
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"]
        for scheduler in schedulers:
            scheduler.last_epoch -= 1
        schedulers[0]._initial_step()
        self._last_lr = schedulers[0].get_last_lr()

    def step(self):
        self.last_epoch += 1
        index = bisect.bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[index]
        if index > 0 and self._milestones[index - 1] == self.last_epoch:
            scheduler._step_at(0)  # the next scheduler starts from its step 0
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()

    def state_dict(self):
        state = super().state_dict()
        state["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return state

    def load_state_dict(self, state_dict):
        self._check_keys(state_dict)
        saved = state_dict["_schedulers"]
        if len(saved) != len(self._schedulers):
            raise ValueError(f"SequentialLR.load_state_dict: {len(saved)} schedulers in the "
                             f"state, {len(self._schedulers)} here")
        self._restore(state_dict)
        for scheduler, state in zip(self._schedulers, saved):
            scheduler.load_state_dict(state)


class OneCycleLR(LRScheduler):
    """The 1cycle policy: lr from max_lr / div_factor up to max_lr over the first pct_start of
    total_steps, then down to initial_lr / final_div_factor (three_phase: down to initial_lr, then
    to the minimum), by cosine or linear annealing; with cycle_momentum, momentum (SGD) or beta1
    (Adam, AdamW) moves the other way between max_momentum and base_momentum. Stepping more than
    total_steps times is an error. See the module docstring for cycle_momentum in loom."""

    def __init__(self, optimizer, max_lr, total_steps=None, epochs=None, steps_per_epoch=None,
                 pct_start=0.3, anneal_strategy="cos", cycle_momentum=True, base_momentum=0.85,
                 max_momentum=0.95, div_factor=25.0, final_div_factor=1e4, three_phase=False,
                 last_epoch=-1, verbose=False):
        owner = "OneCycleLR"
        _check_optimizer(optimizer, owner)
        if total_steps is not None:
            self.total_steps = _check_int(total_steps, owner, "total_steps", 1)
        elif epochs is not None and steps_per_epoch is not None:
            self.total_steps = (_check_int(epochs, owner, "epochs", 1)
                                * _check_int(steps_per_epoch, owner, "steps_per_epoch", 1))
        else:
            raise ValueError(f"{owner}: give total_steps, or epochs and steps_per_epoch")
        if not isinstance(pct_start, float) or not 0.0 <= pct_start <= 1.0:
            raise ValueError(f"{owner}: pct_start must be a float in [0, 1], got {pct_start!r}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"{owner}: anneal_strategy must be 'cos' or 'linear', got "
                             f"{anneal_strategy!r}")
        self.anneal_strategy = anneal_strategy
        warmup_end = float(pct_start * self.total_steps) - 1
        last = self.total_steps - 1

        def phase(end_step, start_lr, end_lr, start_momentum, end_momentum):
            return {"end_step": end_step, "start_lr": start_lr, "end_lr": end_lr,
                    "start_momentum": start_momentum, "end_momentum": end_momentum}

        if three_phase:
            self._schedule_phases = [
                phase(warmup_end, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                phase(float(2 * pct_start * self.total_steps) - 2, "max_lr", "initial_lr",
                      "base_momentum", "max_momentum"),
                phase(last, "initial_lr", "min_lr", "max_momentum", "max_momentum")]
        else:
            self._schedule_phases = [
                phase(warmup_end, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                phase(last, "max_lr", "min_lr", "base_momentum", "max_momentum")]

        groups = optimizer.param_groups
        max_lrs = _per_group(max_lr, optimizer, owner, "max_lr")
        if last_epoch == -1:
            for group, group_max_lr in zip(groups, max_lrs):
                group["initial_lr"] = group_max_lr / div_factor
                group["max_lr"] = group_max_lr
                group["min_lr"] = group["initial_lr"] / final_div_factor

        self.cycle_momentum = bool(cycle_momentum)
        self.use_beta1 = "betas" in optimizer.defaults
        if self.cycle_momentum:
            if "momentum" not in optimizer.defaults and not self.use_beta1:
                raise ValueError(f"{owner}: cycle_momentum needs an optimizer with momentum or "
                                 "betas")
            if not self.use_beta1:
                for i, group in enumerate(groups):
                    if group["momentum"] == 0.0:
                        raise ValueError(
                            f"{owner}: cycle_momentum cycles SGD's momentum, but param_groups[{i}] "
                            "has momentum 0 (loom's SGD keeps momentum buffers only when built "
                            "with momentum != 0): build SGD with momentum, e.g. 0.9, or pass "
                            "cycle_momentum=False")
            max_momenta = _per_group(max_momentum, optimizer, owner, "max_momentum")
            base_momenta = _per_group(base_momentum, optimizer, owner, "base_momentum")
            if last_epoch == -1:
                for group, high, low in zip(groups, max_momenta, base_momenta):
                    self._set_momentum(group, high)
                    group["max_momentum"] = high
                    group["base_momentum"] = low
        super().__init__(optimizer, last_epoch, verbose)

    def _set_momentum(self, group, value):
        if self.use_beta1:
            group["betas"] = (value, *group["betas"][1:])
        else:
            group["momentum"] = value

    def _anneal(self, start, end, pct):
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self):
        step = self.last_epoch
        if step > self.total_steps:
            raise ValueError(f"OneCycleLR: stepped {step + 1} times, but total_steps is "
                             f"{self.total_steps}")
        lrs = []
        for group in self.optimizer.param_groups:
            start_step = 0
            for i, phase in enumerate(self._schedule_phases):
                end_step = phase["end_step"]
                if step <= end_step or i == len(self._schedule_phases) - 1:
                    pct = (step - start_step) / (end_step - start_step)
                    lr = self._anneal(group[phase["start_lr"]], group[phase["end_lr"]], pct)
                    if self.cycle_momentum:
                        momentum = self._anneal(group[phase["start_momentum"]],
                                                group[phase["end_momentum"]], pct)
                    break
                start_step = end_step
            lrs.append(lr)
            if self.cycle_momentum:
                self._set_momentum(group, momentum)
        return lrs
