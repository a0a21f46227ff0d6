"""loom.nn.Module and loom.nn.Parameter: models defined in Python, the PyTorch way.

A pure-Python base class: attributes that are Parameters (or leaf tensors requiring grad) and
child Modules are registered by ``__setattr__``; ``forward`` is Python, and autograd records
through the ops it calls. Built-in modules (loom.nn.Linear, GPT, ...) are subclasses whose state
lives in C++ (see modules.py), so both kinds nest either way round.

Order: ``named_parameters()`` lists a module's own parameters in assignment order, then each
child's, depth first (PyTorch's order).
"""

import collections

from loom import _loom
from loom.autograd import no_grad

Tensor = _loom.Tensor

_IncompatibleKeys = collections.namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


class Parameter(Tensor):
    """A tensor that is a module parameter: a leaf requiring grad, sharing ``data``'s memory.

    Assigning one to a Module attribute registers it::

        self.w = loom.nn.Parameter(loom.zeros(3, 4))
    """

    def __init__(self, data=None, requires_grad=True):
        if data is None:
            data = _loom.empty(0)
        super().__init__(data, requires_grad)

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()


def _is_parameter(value):
    return isinstance(value, Parameter) or (
        isinstance(value, Tensor) and value.requires_grad and value.is_leaf)


class Module:
    """Base class of every loom model, as torch.nn.Module.

    Subclass it, assign parameters and child modules in ``__init__``, write ``forward``::

        import loom, loom.nn as nn, loom.nn.functional as F

        class MLP(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 8)                     # a built-in (C++) child
                self.w = nn.Parameter(loom.zeros(2, 8))       # a Python parameter

            def forward(self, x):
                return F.linear(F.gelu(self.fc(x)), self.w)

        model = MLP()
        model.init_parameters(seed=1)                         # the built-in children
        opt = loom.optim.AdamW(model.parameters(), lr=1e-3)
        loss = model(loom.ones(5, 4)).mean()
        loss.backward(); opt.step(); opt.zero_grad()
    """

    def __init__(self):
        object.__setattr__(self, "_parameters", collections.OrderedDict())
        object.__setattr__(self, "_modules", collections.OrderedDict())
        object.__setattr__(self, "_training", True)

    # ---------------------------------------------------------------- attributes

    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise AttributeError(
                f"cannot assign '{name}' before Module.__init__() (call super().__init__() first)")
        params, modules = self._parameters, self._modules
        if name in params or name in modules or isinstance(value, Module) or _is_parameter(value):
            self._check_not_wrapped(name)
        if isinstance(value, Module):
            params.pop(name, None)
            self.__dict__.pop(name, None)
            modules[name] = value
        elif _is_parameter(value) or (value is None and name in params):
            modules.pop(name, None)
            self.__dict__.pop(name, None)
            params[name] = value
        else:
            if name in params and isinstance(value, Tensor):
                raise TypeError(f"cannot assign a tensor that is not a leaf requiring grad to "
                                f"parameter '{name}' (use loom.nn.Parameter(t))")
            params.pop(name, None)
            modules.pop(name, None)
            object.__setattr__(self, name, value)

    def __getattr__(self, name):  # only called when normal lookup fails
        d = self.__dict__
        if "_parameters" in d and name in d["_parameters"]:
            return d["_parameters"][name]
        if "_modules" in d and name in d["_modules"]:
            return d["_modules"][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name):
        if name in self._parameters:
            del self._parameters[name]
        elif name in self._modules:
            del self._modules[name]
        else:
            object.__delattr__(self, name)

    def _check_not_wrapped(self, name):
        if "_node" in self.__dict__:
            raise RuntimeError(
                f"cannot assign '{name}': {type(self).__name__}'s parameters and children are "
                f"fixed once a wrapper (DistributedDataParallel, ZeroRedundancyOptimizer, a "
                f"pipeline) holds it; build the whole model before wrapping it")

    def register_parameter(self, name, param):
        """Registers ``param`` (a tensor, or None) as parameter ``name``."""
        if param is not None and not isinstance(param, Tensor):
            raise TypeError(f"register_parameter: '{name}' must be a loom.Tensor or None")
        self._check_not_wrapped(name)
        self._modules.pop(name, None)
        self._parameters[name] = param

    def add_module(self, name, module):
        """Registers ``module`` as child ``name``."""
        if not isinstance(module, Module):
            raise TypeError(f"add_module: '{name}' must be a loom.nn.Module")
        self._check_not_wrapped(name)
        self._modules[name] = module

    register_module = add_module

    # ---------------------------------------------------------------- calling

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} has no forward()")

    def __call__(self, *args, **kwargs):
        # Once wrapped (See _cpp_module), the C++ module's hooks run around forward: ZeRO-3
        # gathers this module's parameters before it and releases them after.
        node = self.__dict__.get("_node")
        if node is None or not node.has_forward_hooks:
            return self.forward(*args, **kwargs)
        node._run_forward_pre_hooks()
        out = self.forward(*args, **kwargs)
        if not isinstance(out, Tensor):
            raise TypeError(f"{type(self).__name__}.forward returned {type(out).__name__}; a "
                            f"module with forward hooks (a ZeRO-3 unit) must return one loom.Tensor")
        return node._run_forward_hooks(out)

    def _cpp_module(self):
        """The C++ module standing for this one, for the C++ wrappers (DDP, ZeRO, pipelines):
        built on first use from this module's parameters (the same tensors) and its children's
        C++ modules, after which the module's structure is fixed. See Note [Python modules as C++
        modules] in python/src/nn.cpp."""
        node = self.__dict__.get("_node")
        if node is None:
            node = self._new_cpp_node()
            self.__dict__["_node"] = node
        return node

    def _new_cpp_node(self):
        node = _loom.nn.PythonModule(self)
        for name, p in self._own_parameters():
            node._add_parameter(name, p)
        for name, child in self.named_children():
            node._add_child(name, child._cpp_module())
        return node

    # ---------------------------------------------------------------- traversal

    def _own_parameters(self):
        """(local name, tensor) of this module's own parameters."""
        return [(n, p) for n, p in self._parameters.items() if p is not None]

    def named_children(self):
        return iter(list(self._modules.items()))

    def children(self):
        for _, m in self.named_children():
            yield m

    def named_modules(self, prefix=""):
        """(dotted name, module) of this module ("" for itself) and every descendant."""
        yield prefix, self
        for name, child in self.named_children():
            yield from child.named_modules(prefix + "." + name if prefix else name)

    def modules(self):
        for _, m in self.named_modules():
            yield m

    def named_parameters(self, prefix=""):
        """(dotted name, parameter): own parameters, then each child's, depth first."""
        for name, p in self._own_parameters():
            yield (prefix + "." + name if prefix else name), p
        for name, child in self.named_children():
            yield from child.named_parameters(prefix + "." + name if prefix else name)

    def parameters(self):
        for _, p in self.named_parameters():
            yield p

    def num_parameters(self):
        """Elements of all parameters."""
        return sum(p.numel() for p in self.parameters())

    # ---------------------------------------------------------------- state

    def state_dict(self):
        """name -> tensor, detached but sharing memory with the parameters (as PyTorch)."""
        return collections.OrderedDict((n, p.detach()) for n, p in self.named_parameters())

    def load_state_dict(self, state_dict, strict=True):
        """Copies values into the existing parameters (their memory and identity stay).

        Raises ValueError naming the key for a shape, or a non-floating dtype, that differs from
        the module's (floating dtypes are converted), and, when ``strict``, listing missing and
        unexpected keys. Nothing is copied when an error is raised. numpy arrays are accepted as
        values. Returns (missing_keys, unexpected_keys).
        """
        import numpy as np

        own = collections.OrderedDict(self.named_parameters())
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        if strict and (missing or unexpected):
            raise ValueError(f"load_state_dict: missing keys {missing}, unexpected keys "
                             f"{unexpected}")
        copies = []
        for key, p in own.items():
            if key not in state_dict:
                continue
            value = state_dict[key]
            if isinstance(value, np.ndarray):
                value = _loom.tensor(value)
            if not isinstance(value, Tensor):
                raise ValueError(f"load_state_dict: '{key}': expected a loom.Tensor or numpy "
                                 f"array, got {type(value).__name__}")
            if tuple(value.shape) != tuple(p.shape):
                raise ValueError(f"load_state_dict: '{key}': shape {list(value.shape)} in the "
                                 f"state dict, {list(p.shape)} in the module")
            if value.dtype != p.dtype:
                if not (value.dtype.is_floating_point and p.dtype.is_floating_point):
                    raise ValueError(f"load_state_dict: '{key}': dtype {value.dtype} in the "
                                     f"state dict, {p.dtype} in the module")
            copies.append((p, value))
        with no_grad():
            for p, value in copies:
                p.copy_(value.detach().to(dtype=p.dtype))
        return _IncompatibleKeys(missing, unexpected)

    # ---------------------------------------------------------------- modes, grads, conversion

    @property
    def training(self):
        return self.__dict__["_training"]

    @training.setter
    def training(self, mode):
        self.__dict__["_training"] = bool(mode)

    def train(self, mode=True):
        """Training mode (dropout active) for this module and every descendant; returns self."""
        self.training = mode
        for child in self.children():
            child.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def zero_grad(self, set_to_none=True):
        """Drops every parameter's gradient (set_to_none=False zeroes it in place instead)."""
        for p in self.parameters():
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                with no_grad():
                    p.grad.zero_()

    def to(self, *args, dtype=None, device=None):
        """to(loom.bfloat16) / to("cuda:0") / to(dtype=..., device=...): converts every parameter
        in place (the same tensors, so optimizers built later see them; gradients are dropped).
        Returns self."""
        for a in args:
            if isinstance(a, _loom.dtype):
                dtype = a
            elif isinstance(a, str):
                device = a
            else:
                raise TypeError("to: expected a loom.dtype or a device string")
        self._to(dtype, device)
        return self

    def _to(self, dtype, device):
        for _, p in self._own_parameters():
            p._to_(dtype=dtype, device=device)
        for child in self.children():
            child._to(dtype, device)

    def init_parameters(self, seed, _prefix=""):
        """Initialises every built-in (C++) descendant's parameters under ``seed``, keyed by its
        full dotted name from this module (Note [Deterministic init]): a Python model holding a
        loom.nn.Block at "blocks.0" gets the values a loom GPT gives its block 0. Parameters
        created in Python are left as they are. Returns self."""
        for name, child in self.named_children():
            child.init_parameters(seed, _prefix + "." + name if _prefix else name)
        return self

    # ---------------------------------------------------------------- printing

    def extra_repr(self):
        return ""

    def __repr__(self):
        lines = [f"({name}): " + repr(child).replace("\n", "\n  ")
                 for name, child in self.named_children()]
        head = f"{type(self).__name__}({self.extra_repr()}"
        if not lines:
            return head + ")"
        return head + "\n  " + "\n  ".join(lines) + "\n)"


class ModuleList(Module):
    """A list of modules registered as children "0", "1", ... (torch.nn.ModuleList). Under ZeRO-3
    each entry is a unit whose parameters are gathered for its forward and released after::

        self.blocks = loom.nn.ModuleList([Block() for _ in range(layers)])
        for block in self.blocks:
            x = block(x)
    """

    def __init__(self, modules=()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, module):
        self.add_module(str(len(self._modules)), module)
        return self

    def extend(self, modules):
        for m in modules:
            self.append(m)
        return self

    def __getitem__(self, i):
        if isinstance(i, slice):
            return list(self._modules.values())[i]
        n = len(self._modules)
        if not -n <= i < n:
            raise IndexError(f"ModuleList index {i} out of range for {n} modules")
        return self._modules[str(i % n)]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(list(self._modules.values()))

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ModuleList has no forward(); iterate over its modules")

    def _new_cpp_node(self):
        # A C++ ModuleList, so ZeRO-3 makes each entry a unit (See parallel/sharded_parameters.h).
        node = _loom.nn.ModuleList()
        for _, child in self.named_children():
            node._append(child._cpp_module())
        return node


class Sequential(Module):
    """Modules applied in order (torch.nn.Sequential): ``Sequential(Linear(4, 8), ReLU())``."""

    def __init__(self, *modules):
        super().__init__()
        for i, m in enumerate(modules):
            self.add_module(str(i), m)

    def __getitem__(self, i):
        return list(self._modules.values())[i]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(list(self._modules.values()))

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x
