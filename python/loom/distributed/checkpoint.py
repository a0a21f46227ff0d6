"""loom.distributed.checkpoint: save and resume a training run on any parallel layout.

A checkpoint is a directory per saved step, ``PATH/step-00000100/``: every rank writes the pieces
of the model and optimizer it holds (in parallel; a replicated tensor is written once), named by
the single-process tensor they belong to, plus one ``manifest.json`` that lists them with their
checksums and carries the run's other state (``**extra``). It is committed in two phases and
``PATH/latest`` names the newest, so a crash mid-save never leaves a checkpoint that loads. Any
layout loads any checkpoint: one process, DistributedDataParallel, ZeroRedundancyOptimizer
(stages 1-3) and tensor-parallel modules, each rank reading only what it needs; loom-gpt's
checkpoints (``--checkpoint-dir``) are the same format. Pipeline stages: not yet.

Example::

    import loom, loom.distributed as dist
    from loom.distributed import checkpoint

    model = loom.nn.GPT(config).init_parameters(seed=1337)
    opt = loom.optim.AdamW(model.parameters(), lr=3e-4)
    start = 0
    if checkpoint.latest("ckpt"):                       # resume: same or any other layout
        state = checkpoint.load("ckpt", model=model, optimizer=opt)
        start, batch_index = state["step"], state["batch_index"]
    for step in range(start, steps):
        ...                                             # train
        if (step + 1) % 100 == 0:
            checkpoint.save("ckpt", model=model, optimizer=opt, step=step + 1, keep_last=3,
                            batch_index=loader.index)   # **extra: any JSON-able values

Under ``mpirun`` every rank of ``group`` (default: the world) calls save and load; errors (a bad
directory, a full disk, a damaged file) are raised on every rank as ValueError naming the rank,
the file and the tensor. The learning rate is not saved: set it from the step, as schedules do.
"""

import json as _json
import os as _os

from loom import _loom
from loom import optim as _optim
from loom.distributed import (
    Communicator,
    DistributedDataParallel,
    ZeroRedundancyOptimizer,
    _as_cpp,
    _check_int,
)
from loom.nn.module import Module as _Module

__all__ = ["save", "load", "latest", "verify", "read_manifest", "has_checkpoint"]

_cpp = _loom.checkpoint
# Keys of the manifest's state that loom itself writes ("step" is load's answer).
_RESERVED = ("optimizer_steps", "step")


def _model(model, owner):
    """The loom.nn.Module behind model (a module, or DistributedDataParallel's)."""
    if isinstance(model, DistributedDataParallel):
        return model.module
    if isinstance(model, _Module):
        return model
    raise TypeError(f"{owner}: model must be a loom.nn.Module or a DistributedDataParallel, got "
                    f"{type(model).__name__}")


def _optimizer(optimizer, model, owner):
    """The C++ optimizer behind a loom.optim optimizer or ZeroRedundancyOptimizer (or None)."""
    if optimizer is None:
        return None
    if not isinstance(optimizer, _optim.Optimizer):
        raise TypeError(f"{owner}: optimizer must be a loom.optim optimizer, a "
                        f"ZeroRedundancyOptimizer or None, got {type(optimizer).__name__}")
    if isinstance(optimizer, ZeroRedundancyOptimizer) and optimizer.module is not model:
        raise ValueError(f"{owner}: the ZeroRedundancyOptimizer was built over another module "
                         "than model")
    return optimizer._impl


def _group(group, owner):
    if group is not None and not isinstance(group, Communicator):
        raise TypeError(f"{owner}: group must be a loom.distributed.Communicator or None, got "
                        f"{type(group).__name__}")
    return group


def _path(path, owner):
    path = _os.fspath(path)
    if not isinstance(path, str) or not path:
        raise TypeError(f"{owner}: path must be a non-empty str or os.PathLike")
    return path


def save(path, *, model, optimizer=None, step, group=None, keep_last=0, state=None, **extra):
    """Saves the training state as step ``step`` under ``path`` (``path/step-XXXXXXXX/``) and
    returns that directory once it is committed (``path/latest`` then names it).

    ``model``: a loom.nn.Module (built-in, Python-defined or tensor-parallel) or a
    DistributedDataParallel. ``optimizer``: the loom.optim optimizer over
    ``model.parameters()``, or the ZeroRedundancyOptimizer over ``model``; None saves the
    parameters alone (in ZeRO-3 call ``gather_parameters()`` first). ``keep_last=k`` deletes all
    but the newest k checkpoints after the commit (0 keeps all). ``**extra``: JSON-able values
    stored in the manifest and returned by load (the same on every rank); ``state``: more of them
    as a dict, for keys that are save's own argument names (loom-gpt's run state has "model").

    Collective over ``group`` (default: the world)::

        checkpoint.save("ckpt", model=model, optimizer=opt, step=100, epoch=3, batch_index=812)
        checkpoint.save("ckpt", model=model, optimizer=opt, step=100,
                        state={"model": {"layers": 12}}, epoch=3)
    """
    owner = "checkpoint.save"
    path = _path(path, owner)
    module = _model(model, owner)
    opt = _optimizer(optimizer, module, owner)
    step = _check_int(step, owner, "step")
    keep_last = _check_int(keep_last, owner, "keep_last")
    if step < 0:
        raise ValueError(f"{owner}: step must be >= 0, got {step}")
    if keep_last < 0:
        raise ValueError(f"{owner}: keep_last must be >= 0, got {keep_last}")
    if state is not None and not isinstance(state, dict):
        raise TypeError(f"{owner}: state must be a dict or None, got {type(state).__name__}")
    merged = dict(state or {})
    for key, value in extra.items():
        if key in merged:
            raise ValueError(f"{owner}: '{key}' is given both in state and as a keyword")
        merged[key] = value
    for key, value in merged.items():
        if not isinstance(key, str):
            raise TypeError(f"{owner}: state keys must be str, got {key!r}")
        if key in _RESERVED:
            raise ValueError(f"{owner}: '{key}' is loom's own state key; give it another name")
        try:
            _json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise TypeError(f"{owner}: extra state '{key}' is not JSON-able ({e})") from None
    result = _cpp.save(path, step, _as_cpp(module, owner), opt, merged, _group(group, owner),
                       keep_last)
    return result["path"]


def load(path, *, model, optimizer=None, group=None):
    """Loads a checkpoint saved by any layout into ``model`` (and ``optimizer``): ``path`` is a
    step directory, or a directory save wrote into (its latest committed step). Returns the
    state given to save (``**extra`` and ``state``), with ``"step"`` the saved step.

    ``model`` and ``optimizer`` as for save; without an optimizer only the parameters are read.
    A missing directory, an unfinished save, a tensor the model lacks or has with another shape,
    and a damaged file (its checksum) raise ValueError naming them. Collective over ``group``
    (default: the world)::

        state = checkpoint.load("ckpt", model=model, optimizer=opt)
        state["step"], state["epoch"]          # 100, 3
    """
    owner = "checkpoint.load"
    path = _path(path, owner)
    module = _model(model, owner)
    opt = _optimizer(optimizer, module, owner)
    if not _os.path.isdir(path):
        raise ValueError(f"{owner}: '{path}' is not a directory (no checkpoint there)")
    result = _cpp.load(path, _as_cpp(module, owner), opt, _group(group, owner))
    state = {k: v for k, v in result["state"].items() if k not in _RESERVED}
    state["step"] = result["step"]
    return state


def latest(path):
    """The newest committed step directory under ``path`` (what ``path/latest`` names, else the
    highest committed step), or None when there is none (also when ``path`` does not exist)::

        resume_from = checkpoint.latest("ckpt")   # "ckpt/step-00000100" or None
    """
    found = _cpp.latest_checkpoint(_path(path, "checkpoint.latest"))
    return found or None


def has_checkpoint(path, step):
    """Whether ``path`` holds a committed checkpoint of step ``step``."""
    return _cpp.has_checkpoint(_path(path, "checkpoint.has_checkpoint"),
                               _check_int(step, "checkpoint.has_checkpoint", "step"))


def verify(path):
    """Reads every byte of a checkpoint (a step directory, or a root: its latest) and checks the
    checksums and file sizes; raises ValueError naming the first damaged file and tensor.
    Returns the step directory verified. Local (no communication)::

        checkpoint.verify("ckpt")            # "ckpt/step-00000100"
    """
    owner = "checkpoint.verify"
    path = _path(path, owner)
    if not _os.path.isdir(path):
        raise ValueError(f"{owner}: '{path}' is not a directory (no checkpoint there)")
    return _cpp.verify(path)


def read_manifest(path):
    """The manifest of a checkpoint (a step directory, or a root: its latest) as a dict: "step",
    "state" (the run's state, ``**extra`` included), "files" and "tensors" (each tensor's global
    shape, dtype and stored pieces)::

        checkpoint.read_manifest("ckpt")["tensors"]["model.wte.weight"]["shape"]   # [V, C]
    """
    owner = "checkpoint.read_manifest"
    path = _path(path, owner)
    if not _os.path.isdir(path):
        raise ValueError(f"{owner}: '{path}' is not a directory (no checkpoint there)")
    return _cpp.read_manifest(path)
