"""loom.nn.Module and loom.nn.Parameter: models defined in Python, the PyTorch way.

A pure-Python base class: attributes that are Parameters (or leaf tensors requiring grad) and
child Modules are registered by ``__setattr__``; ``forward`` is Python, and autograd records
through the ops it calls. Built-in modules (loom.nn.Linear, GPT, ...) are subclasses whose state
lives in C++ (see modules.py), so both kinds nest either way round.

Order: ``named_parameters()`` lists a module's own parameters in assignment order, then each
child's, depth first (PyTorch's order). ``state_dict()`` holds, module by module, the parameters
then the persistent buffers (tensors registered with ``register_buffer``: state that is not
trained, such as running statistics or a fixed mask).

``copy.deepcopy(model)`` gives an independent model with equal values: parameters and buffers are
cloned (a parameter shared by two modules stays shared in the copy), gradients are not copied
(as PyTorch's Parameter), and a built-in (C++) module is rebuilt from its constructor's arguments
and loaded with the original's values (modules.py). A module wrapped by ZeRO-3 holds only its
shard and cannot be copied: copy it before wrapping.
"""

import collections
import copy

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

    def __deepcopy__(self, memo):
        return _copy_tensor(self, memo)


def _is_parameter(value):
    return isinstance(value, Parameter) or (
        isinstance(value, Tensor) and value.requires_grad and value.is_leaf)


def _copy_tensor(t, memo):
    """An independent copy of ``t`` for copy.deepcopy: new memory with t's values, dtype and
    device; a Parameter (or a leaf requiring grad) stays one; the gradient is not copied. The
    memo keeps shared tensors shared."""
    if id(t) in memo:
        return memo[id(t)]
    data = t.detach().clone()
    if isinstance(t, Parameter):
        new = Parameter(data, t.requires_grad)
    elif t.requires_grad and t.is_leaf:
        new = Tensor(data, True)
    else:
        new = data
    memo[id(t)] = new
    return new


def _tie_as_in(original, copy_):
    """Ties the copy's parameters as the original's are tied (wte.weight = lm_head.weight): a
    built-in module is rebuilt by deepcopy with tensors of its own, so the tie is made again."""
    first = {}
    for name, p in original.named_parameters(remove_duplicate=False):
        if p._identity() not in first:
            first[p._identity()] = name
            continue
        owner = copy_
        *path, leaf = name.split(".")
        for part in path:
            owner = getattr(owner, part)
        shared = copy_
        for part in first[p._identity()].split("."):
            shared = getattr(shared, part)
        if getattr(owner, leaf)._identity() != shared._identity():
            setattr(owner, leaf, shared)


def _check_name(kind, name):
    if not isinstance(name, str):
        raise TypeError(f"{kind} name must be a str, got {type(name).__name__}")
    if not name or "." in name:
        raise KeyError(f"{kind} name must be non-empty and contain no '.', got '{name}'")


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
        object.__setattr__(self, "_buffers", collections.OrderedDict())
        object.__setattr__(self, "_non_persistent_buffers", set())
        object.__setattr__(self, "_modules", collections.OrderedDict())
        object.__setattr__(self, "_training", True)

    # ---------------------------------------------------------------- attributes

    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise AttributeError(
                f"cannot assign '{name}' before Module.__init__() (call super().__init__() first)")
        params, modules = self._parameters, self._modules
        buffers = self.__dict__.get("_buffers", {})
        if name in buffers and not isinstance(value, (Module, Parameter)):
            # A buffer stays a buffer (even a tensor requiring grad, as in PyTorch).
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign a {type(value).__name__} to buffer '{name}' "
                                f"(a loom.Tensor or None)")
            buffers[name] = value
            return
        if name in params or name in modules or isinstance(value, Module) or _is_parameter(value):
            self._check_not_wrapped(name)
        if isinstance(value, Module):
            params.pop(name, None)
            self._drop_buffer(name)
            self.__dict__.pop(name, None)
            self._adopt_child(name, value)
        elif _is_parameter(value) or (value is None and name in params):
            modules.pop(name, None)
            self._drop_buffer(name)
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
        for registry in ("_parameters", "_buffers", "_modules"):
            if registry in d and name in d[registry]:
                return d[registry][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name):
        if name in self._parameters:
            del self._parameters[name]
        elif name in self.__dict__.get("_buffers", {}):
            self._drop_buffer(name)
        elif name in self._modules:
            del self._modules[name]
        else:
            object.__delattr__(self, name)

    def _drop_buffer(self, name):
        self.__dict__.get("_buffers", {}).pop(name, None)
        self.__dict__.get("_non_persistent_buffers", set()).discard(name)

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
        self._adopt_child(name, module)

    register_module = add_module

    def _adopt_child(self, name, module):
        """Makes ``module`` child ``name`` and names its subtree from this module's root, as a
        wrapper's C++ tree will (See _cpp_module): a built-in Dropout keys its masks by its full
        name (Note [Dropout keys]), so the masks must not depend on whether a wrapper has built
        the C++ tree yet (before this, every Dropout of an unwrapped model was named "", and DDP
        drew other masks than one process)."""
        self._modules[name] = module
        prefix = self.__dict__.get("_full_name", "")
        module._set_full_name(f"{prefix}.{name}" if prefix else name)

    def _set_full_name(self, full_name):
        self.__dict__["_full_name"] = full_name
        cpp = self.__dict__.get("_cpp")
        # A built-in module: C++ renames its own subtree. A view of another C++ model's child
        # (gpt.blocks[0]) keeps that model's names: it is that model's, wherever it is assigned.
        if cpp is not None and not self.__dict__.get("_is_view", False):
            cpp.full_name = full_name
        for name, child in self._modules.items():
            child._set_full_name(f"{full_name}.{name}" if full_name else name)

    def register_buffer(self, name, tensor, persistent=True):
        """Registers ``tensor`` (or None) as buffer ``name``: module state that is not a parameter
        (not trained, not in ``parameters()``), reachable as ``self.<name>``, listed by
        ``buffers()``, moved and converted by ``to()`` (only floating buffers change dtype), copied
        by deepcopy and, when ``persistent``, saved in ``state_dict()``::

            self.register_buffer("mask", loom.tril(loom.ones(T, T)).bool())
        """
        _check_name("buffer", name)
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"register_buffer: '{name}' must be a loom.Tensor or None, got "
                            f"{type(tensor).__name__}")
        if name in self._parameters or name in self._modules or (
                name in self.__dict__ and name not in self.__dict__.get("_buffers", {})):
            raise KeyError(f"register_buffer: attribute '{name}' already exists")
        self.__dict__["_buffers"][name] = tensor
        if persistent:
            self.__dict__["_non_persistent_buffers"].discard(name)
        else:
            self.__dict__["_non_persistent_buffers"].add(name)

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

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True, _seen=None):
        """(dotted name, parameter): own parameters, then (recurse) each child's, depth first. A
        tensor shared by several modules (tied weights) comes once, under its first name, unless
        ``remove_duplicate=False`` (as PyTorch's)."""
        seen = set() if _seen is None else _seen
        for name, p in self._own_parameters():
            if remove_duplicate:
                if p._identity() in seen:
                    continue
                seen.add(p._identity())
            yield (prefix + "." + name if prefix else name), p
        if recurse:
            for name, child in self.named_children():
                yield from child.named_parameters(prefix + "." + name if prefix else name, True,
                                                  remove_duplicate, seen)

    def parameters(self, recurse=True):
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def _own_buffers(self, persistent_only=False):
        """(local name, tensor) of this module's own buffers that are not None."""
        skip = self.__dict__.get("_non_persistent_buffers", ()) if persistent_only else ()
        return [(n, b) for n, b in self.__dict__.get("_buffers", {}).items()
                if b is not None and n not in skip]

    def named_buffers(self, prefix="", recurse=True, _persistent_only=False):
        """(dotted name, buffer): own buffers, then (recurse) each child's, depth first."""
        for name, b in self._own_buffers(_persistent_only):
            yield (prefix + "." + name if prefix else name), b
        if recurse:
            for name, child in self.named_children():
                yield from child.named_buffers(prefix + "." + name if prefix else name, True,
                                               _persistent_only)

    def buffers(self, recurse=True):
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def num_parameters(self):
        """Elements of all parameters."""
        return sum(p.numel() for p in self.parameters())

    # ---------------------------------------------------------------- state

    def state_dict(self, destination=None, prefix="", keep_vars=False):
        """name -> tensor: module by module (depth first) the parameters, then the persistent
        buffers; detached but sharing memory with them (as PyTorch; ``keep_vars`` keeps the
        tensors themselves)."""
        out = collections.OrderedDict() if destination is None else destination
        self._save_to_state_dict(out, prefix, keep_vars)
        for name, child in self.named_children():
            child.state_dict(out, prefix + name + ".", keep_vars)
        return out

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        """This module's own entries (parameters, then persistent buffers) into destination."""
        for name, t in self._own_parameters() + self._own_buffers(persistent_only=True):
            destination[prefix + name] = t if keep_vars else t.detach()

    def _state_tensors(self):
        """name -> tensor of every state_dict entry (the tensors themselves)."""
        return self.state_dict(keep_vars=True)

    def load_state_dict(self, state_dict, strict=True):
        """Copies values into the existing parameters and persistent buffers (their memory and
        identity stay).

        Raises ValueError naming the key for a shape, or a non-floating dtype, that differs from
        the module's (floating dtypes are converted), and, when ``strict``, listing missing and
        unexpected keys. Nothing is copied when an error is raised. numpy arrays are accepted as
        values. Returns (missing_keys, unexpected_keys).
        """
        import numpy as np

        own = self._state_tensors()
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

    def apply(self, fn):
        """Calls ``fn(module)`` on every descendant (children first, depth first) and then on this
        module, as PyTorch's ``apply``; returns self. The usual use is initialisation::

            def init(m):
                if isinstance(m, loom.nn.Linear):
                    with loom.no_grad():
                        m.weight.normal_(0.0, 0.02)
            model.apply(init)
        """
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    def requires_grad_(self, requires_grad=True):
        """Sets ``requires_grad`` on every parameter (False freezes the module); returns self."""
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def to(self, *args, dtype=None, device=None):
        """to(loom.bfloat16) / to("cuda:0") / to(dtype=..., device=...): converts every parameter
        in place (the same tensors, so optimizers built later see them; gradients are dropped).
        Buffers are replaced by converted copies (only floating ones change dtype, as PyTorch).
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
        self._buffers_to(dtype, device)
        for child in self.children():
            child._to(dtype, device)

    def _buffers_to(self, dtype, device):
        buffers = self.__dict__.get("_buffers", {})
        for name, b in list(buffers.items()):
            if b is None:
                continue
            floating = dtype is not None and b.dtype.is_floating_point
            buffers[name] = b.to(dtype=dtype if floating else None, device=device)

    # ---------------------------------------------------------------- copying

    def __deepcopy__(self, memo):
        node = self.__dict__.get("_node")
        if node is not None and node.has_forward_hooks:
            raise RuntimeError(
                f"copy.deepcopy: {type(self).__name__} is wrapped by ZeroRedundancyOptimizer "
                f"stage 3, so it holds only this rank's shard; deepcopy the model before "
                f"wrapping it (or gather_parameters() and copy its state_dict())")
        cls = type(self)
        new = cls.__new__(cls)
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            if key == "_node":  # the copy is not wrapped: it gets its own node on demand
                continue
            if key in ("_parameters", "_buffers"):
                new.__dict__[key] = collections.OrderedDict(
                    (n, None if t is None else _copy_tensor(t, memo)) for n, t in value.items())
            elif isinstance(value, Tensor):
                new.__dict__[key] = _copy_tensor(value, memo)
            else:
                try:
                    new.__dict__[key] = copy.deepcopy(value, memo)
                except TypeError as e:
                    raise TypeError(
                        f"copy.deepcopy: attribute '{key}' of {cls.__name__} cannot be copied "
                        f"({e}); a container of loom tensors is not copyable yet: register "
                        f"tensors as parameters or buffers (register_buffer)") from e
        _tie_as_in(self, new)
        return new

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
    """Modules applied in order (torch.nn.Sequential)::

        mlp = loom.nn.Sequential(loom.nn.Linear(4, 8), loom.nn.ReLU(), loom.nn.Linear(8, 2))
        named = loom.nn.Sequential(collections.OrderedDict([("fc", loom.nn.Linear(4, 2))]))
    """

    def __init__(self, *modules):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], collections.OrderedDict):
            for name, m in modules[0].items():
                self.add_module(name, m)
        else:
            for i, m in enumerate(modules):
                self.add_module(str(i), m)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Sequential(collections.OrderedDict(list(self._modules.items())[i]))
        return list(self._modules.values())[i]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(list(self._modules.values()))

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x

    def append(self, module):
        """Adds ``module`` at the end; returns self."""
        self.add_module(str(len(self._modules)), module)
        return self


class ModuleDict(Module):
    """Modules by name, registered as children under their keys, in insertion order
    (torch.nn.ModuleDict)::

        self.heads = loom.nn.ModuleDict({"cls": loom.nn.Linear(8, 3), "reg": loom.nn.Linear(8, 1)})
        y = self.heads["cls"](x)
    """

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key):
        return self._modules[key]

    def __setitem__(self, key, module):
        _check_name("ModuleDict key", key)
        self.add_module(key, module)

    def __delitem__(self, key):
        self._check_not_wrapped(key)
        del self._modules[key]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(list(self._modules))

    def __contains__(self, key):
        return key in self._modules

    def keys(self):
        return list(self._modules.keys())

    def values(self):
        return list(self._modules.values())

    def items(self):
        return list(self._modules.items())

    def update(self, modules):
        """Adds or replaces entries from a mapping or an iterable of (key, module) pairs."""
        pairs = modules.items() if hasattr(modules, "items") else modules
        for key, module in pairs:
            self[key] = module

    def pop(self, key):
        module = self[key]
        del self[key]
        return module

    def clear(self):
        for key in self.keys():
            del self[key]

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ModuleDict has no forward(); call its modules by key")


def _as_parameter(value):
    """value as a module parameter: a Parameter (or a leaf requiring grad) as it is, any other
    tensor wrapped in a Parameter sharing its memory (as torch.nn.ParameterList does)."""
    if not isinstance(value, Tensor):
        raise TypeError(f"expected a loom.Tensor (or loom.nn.Parameter), got "
                        f"{type(value).__name__}")
    return value if _is_parameter(value) else Parameter(value)


class ParameterList(Module):
    """A list of parameters registered as "0", "1", ... (torch.nn.ParameterList); tensors that
    are not parameters are wrapped in loom.nn.Parameter::

        self.scales = loom.nn.ParameterList([loom.nn.Parameter(loom.ones(8)) for _ in range(3)])
    """

    def __init__(self, values=None):
        super().__init__()
        if values is not None:
            self.extend(values)

    def _index(self, i):
        n = len(self._parameters)
        if not -n <= i < n:
            raise IndexError(f"ParameterList index {i} out of range for {n} parameters")
        return str(i % n)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return list(self._parameters.values())[i]
        return self._parameters[self._index(i)]

    def __setitem__(self, i, value):
        key = self._index(i)
        self._check_not_wrapped(key)
        self._parameters[key] = _as_parameter(value)

    def __len__(self):
        return len(self._parameters)

    def __iter__(self):
        return iter(list(self._parameters.values()))

    def append(self, value):
        self.register_parameter(str(len(self._parameters)), _as_parameter(value))
        return self

    def extend(self, values):
        for v in values:
            self.append(v)
        return self

    def extra_repr(self):
        return "\n".join(f"({i}): Parameter of shape {list(p.shape)} ({p.dtype})"
                         for i, p in enumerate(self))

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ParameterList has no forward(); index its parameters")


class ParameterDict(Module):
    """Parameters by name, in insertion order (torch.nn.ParameterDict); tensors that are not
    parameters are wrapped in loom.nn.Parameter."""

    def __init__(self, parameters=None):
        super().__init__()
        if parameters is not None:
            self.update(parameters)

    def __getitem__(self, key):
        return self._parameters[key]

    def __setitem__(self, key, value):
        _check_name("ParameterDict key", key)
        self.register_parameter(key, _as_parameter(value))

    def __delitem__(self, key):
        self._check_not_wrapped(key)
        del self._parameters[key]

    def __len__(self):
        return len(self._parameters)

    def __iter__(self):
        return iter(list(self._parameters))

    def __contains__(self, key):
        return key in self._parameters

    def keys(self):
        return list(self._parameters.keys())

    def values(self):
        return list(self._parameters.values())

    def items(self):
        return list(self._parameters.items())

    def update(self, parameters):
        pairs = parameters.items() if hasattr(parameters, "items") else parameters
        for key, value in pairs:
            self[key] = value

    def pop(self, key):
        value = self[key]
        del self[key]
        return value

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ParameterDict has no forward(); index its parameters")
