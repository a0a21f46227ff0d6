"""loom: tensors with autograd, from C++ (see README.md, "Python").

The compiled core is ``loom._loom``; this package re-exports it under PyTorch's names, so habits
carry over::

    import numpy as np
    import loom
    import loom.nn.functional as F

    x = loom.from_numpy(np.ones((4, 3), dtype=np.float32))   # shares memory with the array
    w = loom.zeros(2, 3, requires_grad=True)
    loss = F.gelu(x @ w.transpose(0, 1)).mean()
    loss.backward()
    with loom.no_grad():
        w -= 0.1 * w.grad

Bound: Tensor, dtypes, numpy interop, operators, indexing and the functional ops, autograd,
loom.nn (Module to subclass, containers, activations, losses, RMSNorm, the built-in modules,
GPT), loom.optim (SGD, Adam, AdamW with parameter groups; loom.optim.lr_scheduler),
loom.utils.data (Dataset, DataLoader, DistributedSampler), loom.distributed (collectives, DDP,
ZeRO, tensor and pipeline parallelism, checkpoints, under mpirun) and weight I/O (loom.load /
loom.save).
"""

from loom._loom import (  # noqa: F401
    Tensor,
    abs,
    arange,
    argmax,
    argmin,
    bfloat16,
    bool,  # noqa: A004 (loom.bool, as torch.bool; the builtin is not used in this module)
    broadcast_to,
    cat,
    clamp,
    clip,
    cos,
    cuda_device_count,
    cuda_is_available,
    dtype,
    empty,
    eq,
    erf,
    exp,
    expm1,
    eye,
    floor,
    ceil,
    round,
    trunc,
    float16,
    float32,
    from_numpy,
    full,
    ge,
    gt,
    index_add_rows,
    initial_seed,
    int32,
    int64,
    is_grad_enabled,
    le,
    linspace,
    load,
    load_gpt,
    log,
    log1p,
    lt,
    manual_seed,
    masked_fill,
    matmul,
    max,
    max_memory_allocated,
    memory_allocated,
    min,
    ne,
    neg,
    negative,
    ones,
    pow,
    rand,
    randint,
    randn,
    rsqrt,
    save,
    save_gpt,
    sin,
    sqrt,
    stack,
    std,
    tanh,
    tensor,
    topk,
    tril,
    triu,
    uint8,
    var,
    where,
    zeros,
)
from loom.autograd import enable_grad, no_grad  # noqa: F401


def _like(make, t, dtype, device, requires_grad, *args):
    return make(tuple(t.shape), *args, dtype=t.dtype if dtype is None else dtype,
                device=t.device if device is None else device, requires_grad=requires_grad)


def zeros_like(input, *, dtype=None, device=None, requires_grad=False):
    """Zeros of input's shape, dtype and device (as torch.zeros_like)."""
    return _like(zeros, input, dtype, device, requires_grad)


def ones_like(input, *, dtype=None, device=None, requires_grad=False):
    """Ones of input's shape, dtype and device (as torch.ones_like)."""
    return _like(ones, input, dtype, device, requires_grad)


def full_like(input, fill_value, *, dtype=None, device=None, requires_grad=False):
    """fill_value everywhere, in input's shape, dtype and device (as torch.full_like)."""
    return _like(full, input, dtype, device, requires_grad, fill_value)


def empty_like(input, *, dtype=None, device=None, requires_grad=False):
    """Uninitialised memory of input's shape, dtype and device (as torch.empty_like)."""
    return _like(empty, input, dtype, device, requires_grad)
from loom import data, distributed, nn, optim  # noqa: F401
from loom import _job_exit, _tensor_methods
from loom._tensor_methods import (  # noqa: F401
    all_ as all,
    any_ as any,
    argsort,
    as_tensor,
    chunk,
    flip,
    gather,
    index_add,
    is_tensor,
    isfinite,
    isinf,
    isnan,
    logical_and,
    logical_not,
    logical_or,
    logical_xor,
    logsumexp,
    maximum,
    minimum,
    numel,
    rand_like,
    randint_like,
    randn_like,
    randperm,
    reciprocal,
    scatter,
    scatter_add,
    sign,
    sort,
    split,
    square,
    unbind,
)

_tensor_methods.install()
from loom import _scans  # noqa: E402
from loom._scans import cumprod, cumsum, einsum, norm, prod  # noqa: E402,F401
from loom import linalg  # noqa: E402,F401
from loom.planner import plan  # noqa: E402,F401

_scans.install()


def __getattr__(name):
    """``loom.utils`` loads on first use: its data loaders need numpy, which ``import loom`` does
    not."""
    if name == "utils":
        import importlib

        return importlib.import_module("loom.utils")
    raise AttributeError(f"module 'loom' has no attribute '{name}'")


_job_exit.install()  # under mpirun, an uncaught exception on one rank ends the job at once

__all__ = [
    "Tensor", "dtype", "float32", "bfloat16", "float16", "int32", "int64", "uint8",
    "tensor", "from_numpy", "zeros", "ones", "full", "empty", "arange", "matmul", "cat",
    "no_grad", "enable_grad", "is_grad_enabled", "memory_allocated", "max_memory_allocated",
    "cuda_is_available", "cuda_device_count", "nn", "optim", "utils", "distributed", "load", "save",
    "load_gpt", "save_gpt", "eq", "ne", "lt", "le", "gt", "ge", "zeros_like", "ones_like",
    "full_like", "empty_like", "exp", "log", "sqrt", "rsqrt", "abs", "neg", "negative", "tanh",
    "sin", "cos", "pow", "clamp", "clip", "where", "masked_fill", "broadcast_to", "max", "min",
    "argmax", "argmin", "manual_seed", "initial_seed", "randn", "rand", "randint", "stack",
    "linspace", "eye", "tril", "triu", "erf", "log1p", "expm1", "topk", "var", "std", "all",
    "any", "argsort", "as_tensor", "chunk", "flip", "is_tensor", "isfinite", "isinf", "isnan",
    "logical_and", "logical_not", "logical_or", "logical_xor", "logsumexp", "maximum", "minimum",
    "numel", "rand_like", "randint_like", "randn_like", "randperm", "reciprocal", "sign", "sort",
    "split", "square", "unbind", "floor", "ceil", "round", "trunc", "cumsum", "cumprod", "prod",
    "norm", "einsum", "linalg", "gather", "scatter", "scatter_add", "index_add", "index_add_rows",
    "plan",
]
