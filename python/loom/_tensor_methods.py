"""The everyday Tensor methods and functions a PyTorch script touches that compose from loom's
ops: dtype shorthands, any/all and the logical ops, isnan/isinf/isfinite, sign, square,
reciprocal, minimum/maximum, logsumexp, sort/argsort, chunk/split/unbind, flip, gather, scatter,
scatter_add, index_add, new_* and the random *_like. Each is differentiable where PyTorch's is,
through the ops it is made of.

Comparisons and these logical functions return loom.bool tensors, as PyTorch's. Where loom
differs: ``~``, ``&``, ``|`` and ``^`` act on bool tensors only and refuse integer ones rather
than acting bitwise (convert a uint8 mask with ``t.bool()``); loom has no float64
(``t.double()`` raises). ``sort`` is stable in both directions (ties keep their order), as
PyTorch's with ``stable=True``. ``minimum``/``maximum`` give a tie's gradient to the second
operand (PyTorch splits it).
"""

import collections

from loom import _loom
from loom.autograd import no_grad

Tensor = _loom.Tensor
_SortResult = collections.namedtuple("return_types", ["values", "indices"])


def _mask(t):
    """t as a truth mask (bool, nonzero = true)."""
    return t if t.dtype == _loom.bool else (t != 0)


def _reduce_mask(mask, dim, keepdim):
    counts = mask.to(_loom.float32)
    return counts.sum() if dim is None and not keepdim else counts.sum(dim=dim, keepdim=keepdim)


def any_(input, dim=None, keepdim=False):
    """Whether any element (along dim) is nonzero, as torch.any (bool)."""
    return _reduce_mask(_mask(input), dim, keepdim) > 0


def all_(input, dim=None, keepdim=False):
    """Whether every element (along dim) is nonzero, as torch.all (bool)."""
    return _reduce_mask(_mask(input) == 0, dim, keepdim) == 0


def logical_not(input):
    return _mask(input) == 0


def logical_and(input, other):
    return (_mask(input).to(_loom.float32) * _mask(other).to(_loom.float32)) != 0


def logical_or(input, other):
    return (_mask(input).to(_loom.float32) + _mask(other).to(_loom.float32)) != 0


def logical_xor(input, other):
    return _mask(input) != _mask(other)


def _logical_operator(name, fn):
    def op(self, other):
        if not isinstance(other, Tensor):
            other = _loom.tensor(other)
        if self.dtype != _loom.bool or other.dtype != _loom.bool:
            raise TypeError(f"{name}: loom's {name} is logical, on bool tensors; got {self.dtype} "
                            f"and {other.dtype} (bitwise ops on integers are not supported; a "
                            "uint8 mask converts with t.bool())")
        return fn(self, other)
    return op


def _invert(self):
    if self.dtype != _loom.bool:
        raise TypeError(f"~: loom's ~ is logical not, on bool tensors; got {self.dtype} (bitwise "
                        "not on integers is not supported; a uint8 mask converts with t.bool())")
    return logical_not(self)


def isnan(input):
    return input != input


def isinf(input):
    if not input.dtype.is_floating_point:
        return input != input  # all false
    return input.abs() == float("inf")


def isfinite(input):
    if not input.dtype.is_floating_point:
        return input == input  # all true
    return (input - input) == 0  # inf - inf and NaN - NaN are NaN


def sign(input):
    """-1, 0 or 1 (0 for NaN, as PyTorch's), with a zero gradient, as torch.sign."""
    x = input.detach()
    return (x > 0).to(x.dtype) - (x < 0).to(x.dtype)


def square(input):
    return input * input


def reciprocal(input):
    return 1.0 / input


def maximum(input, other):
    """Elementwise max with broadcasting, NaN propagating, as torch.maximum."""
    return _loom.where((input > other) | isnan(input), input, other)


def minimum(input, other):
    """Elementwise min with broadcasting, NaN propagating, as torch.minimum."""
    return _loom.where((input < other) | isnan(input), input, other)


def logsumexp(input, dim, keepdim=False):
    """log(sum(exp(x))) along dim (an int), computed stably, as torch.logsumexp."""
    top = input.detach().max(dim, keepdim=True).values
    top = _loom.where(isfinite(top), top, 0.0)  # all -inf (or inf) rows: no shift
    out = (input - top).exp().sum(dim=dim, keepdim=True).log() + top
    return out if keepdim else out.squeeze(dim)


def sort(input, dim=-1, descending=False, stable=False):
    """(values, indices) sorted along dim, as torch.sort; always stable. Values are
    differentiable."""
    if input.dim() == 0:
        return _SortResult(input, _loom.zeros([], dtype=_loom.int64))
    values, indices = _loom.topk(input, input.shape[dim], dim, descending)
    return _SortResult(values, indices)


def argsort(input, dim=-1, descending=False, stable=False):
    return sort(input, dim, descending).indices


def _along(t, dim, start, stop):
    dim = dim + t.dim() if dim < 0 else dim
    return t[(slice(None),) * dim + (slice(start, stop),)]


def split(tensor, split_size_or_sections, dim=0):
    """Views along dim of split_size each (the last may be smaller) or of the given sizes, as
    torch.split."""
    n = tensor.shape[dim]
    if isinstance(split_size_or_sections, int):
        if split_size_or_sections <= 0:
            raise ValueError(f"split: split_size must be positive, got {split_size_or_sections}")
        sizes = [min(split_size_or_sections, n - s) for s in range(0, n, split_size_or_sections)]
    else:
        sizes = list(split_size_or_sections)
        if sum(sizes) != n:
            raise ValueError(f"split: the sizes {sizes} sum to {sum(sizes)}, dim {dim} has {n}")
    out, at = [], 0
    for size in sizes:
        out.append(_along(tensor, dim, at, at + size))
        at += size
    return tuple(out)


def chunk(input, chunks, dim=0):
    """At most ``chunks`` pieces along dim, each ceil(n / chunks) long, as torch.chunk."""
    if chunks <= 0:
        raise ValueError(f"chunk: chunks must be positive, got {chunks}")
    n = input.shape[dim]
    return split(input, max(1, -(-n // chunks)), dim)


def unbind(input, dim=0):
    return tuple(_along(input, dim, i, i + 1).squeeze(dim) for i in range(input.shape[dim]))


def flip(input, dims):
    """input reversed along dims, as torch.flip (a copy; differentiable)."""
    if isinstance(dims, int):
        dims = [dims]
    out = input
    for d in dims:
        d = d + input.dim() if d < 0 else d
        out = out[(slice(None),) * d + (list(range(input.shape[d] - 1, -1, -1)),)]
    return out


def _check_index_against(op, input, dim, index):
    """dim normalised, after torch's rules for gather/scatter: index has input's number of dims,
    is int32/int64, and off ``dim`` is at most input's size."""
    n = input.dim()
    if not -n <= dim < n:
        raise IndexError(f"{op}: dim {dim} is out of range for a {n}-dim tensor")
    dim = dim + n if dim < 0 else dim
    if index.dim() != n:
        raise ValueError(f"{op}: index has {index.dim()} dims, input {n} (they must match)")
    if index.dtype not in (_loom.int64, _loom.int32):
        raise TypeError(f"{op}: index must be int64 or int32, got {index.dtype}")
    for d in range(n):
        if d != dim and index.shape[d] > input.shape[d]:
            raise ValueError(f"{op}: index size {index.shape[d]} exceeds input size "
                             f"{input.shape[d]} in dim {d}")
    return dim


def _flat_positions(op, input, dim, index):
    """For every element of index, its place in input.reshape(-1): index's value along dim and
    the element's own coordinates elsewhere (int64, index's shape). Values outside
    [0, input.size(dim)) are a ValueError."""
    n, size = input.dim(), input.shape[dim]
    index = index.to(_loom.int64)
    bad = ((index < 0) | (index >= size)).sum().item() if index.numel() else 0
    if bad:
        raise ValueError(f"{op}: {bad} index value(s) outside [0, {size}) along dim {dim}")
    strides, step = [0] * n, 1
    for d in range(n - 1, -1, -1):
        strides[d], step = step, step * input.shape[d]
    flat = index * strides[dim]
    for d in range(n):
        if d != dim:
            place = [1] * n
            place[d] = index.shape[d]
            along = _loom.arange(index.shape[d]).to(index.device).view(*place)
            flat = flat + along * strides[d]
    return flat


def gather(input, dim, index):
    """torch.gather: out[i][j][k] = input[i][index[i][j][k]][k] for dim 1 (and so on), out of
    index's shape; index has input's number of dims and, off ``dim``, sizes at most input's.
    Differentiable in input (an index used twice adds its gradients). Composed from integer
    arithmetic and an index-tensor lookup of the flattened input, so it runs wherever those run
    (CPU and CUDA). An index outside [0, input.size(dim)) is a ValueError."""
    dim = _check_index_against("gather", input, dim, index)
    return input.contiguous().reshape(-1)[_flat_positions("gather", input, dim, index)]


def _scatter_source(op, src, index, input):
    """src's leading index.shape block (torch reads only that much of src), contiguous; a number
    becomes a tensor of index's shape in input's dtype and device."""
    if not isinstance(src, Tensor):
        return _loom.full(list(index.shape), float(src)).to(input.dtype).to(input.device)
    if src.dim() != index.dim():
        raise ValueError(f"{op}: src has {src.dim()} dims, index {index.dim()} (they must match)")
    for d in range(index.dim()):
        if index.shape[d] > src.shape[d]:
            raise ValueError(f"{op}: index size {index.shape[d]} exceeds src size "
                             f"{src.shape[d]} in dim {d}")
    if list(src.shape) != list(index.shape):
        src = src[tuple(slice(0, k) for k in index.shape)]
    return src.contiguous()


def scatter_add(input, dim, index, src):
    """torch.scatter_add: a copy of input with, for dim 1 (and so on),
    out[i][index[i][j][k]][k] += src[i][j][k] for every element of index (src read over index's
    shape). Differentiable in input and src. Repeated indices add: their sources are summed in
    index order first and the sum added to input once (PyTorch adds one by one; the results may
    differ in the last bit). Deterministic on CPU and CUDA (no atomics)."""
    dim = _check_index_against("scatter_add", input, dim, index)
    flat = _flat_positions("scatter_add", input, dim, index)
    src = _scatter_source("scatter_add", src, index, input)
    out = _loom.index_add_rows(input.contiguous().reshape(-1, 1), flat.reshape(-1),
                               src.reshape(-1, 1))
    return out.reshape(list(input.shape))


def scatter(input, dim, index, src=None, *, value=None):
    """torch.scatter: a copy of input with out[i][index[i][j][k]][k] = src[i][j][k] for dim 1
    (and so on); src may be a number (or value=). Differentiable in input (where not written)
    and src. loom differs where PyTorch is undefined: two elements of index naming the same place
    (which write wins is unspecified in PyTorch) are a ValueError; use scatter_add to sum them."""
    if (src is None) == (value is None):
        raise TypeError("scatter: give src (a tensor or a number) or value=, not both or neither")
    dim = _check_index_against("scatter", input, dim, index)
    flat = _flat_positions("scatter", input, dim, index).reshape(-1)
    src = _scatter_source("scatter", value if src is None else src, index, input)
    numel = input.numel()
    with no_grad():
        ones = _loom.ones([flat.numel(), 1])
        count = _loom.index_add_rows(_loom.zeros([numel, 1]), flat, ones)
        twice = (count > 1).sum().item() if numel else 0
    if twice:
        raise ValueError(f"scatter: {twice} place(s) of the output are named by more than one "
                         "element of index; PyTorch leaves which write wins undefined, loom "
                         "refuses it (make the index unique, or use scatter_add to sum them)")
    written = (count > 0).reshape(list(input.shape)).to(input.device)
    zeros = _loom.zeros([numel, 1]).to(input.dtype).to(input.device)
    placed = _loom.index_add_rows(zeros, flat, src.reshape(-1, 1)).reshape(list(input.shape))
    return _loom.where(written, placed, input)


def index_add(input, dim, index, source, *, alpha=1):
    """torch.index_add: a copy of input with source's slices along dim added at the positions
    index names (1-D, one per slice of source): out.select(dim, index[i]) += alpha *
    source.select(dim, i). Differentiable in input and source; repeated indices add (summed in
    index order first, then added to input, deterministic on CPU and CUDA)."""
    n = input.dim()
    if not -n <= dim < n:
        raise IndexError(f"index_add: dim {dim} is out of range for a {n}-dim tensor")
    dim = dim + n if dim < 0 else dim
    if index.dim() != 1:
        raise ValueError(f"index_add: index must be 1-D, got {index.dim()} dims")
    if index.dtype not in (_loom.int64, _loom.int32):
        raise TypeError(f"index_add: index must be int64 or int32, got {index.dtype}")
    want = list(input.shape)
    want[dim] = index.shape[0]
    if source.dim() != n or list(source.shape) != want:
        raise ValueError(f"index_add: source is {list(source.shape)}; input {list(input.shape)} "
                         f"and an index of {index.shape[0]} need {want}")
    size = input.shape[dim]
    bad = ((index < 0) | (index >= size)).sum().item() if index.numel() else 0
    if bad:
        raise ValueError(f"index_add: {bad} index value(s) outside [0, {size}) along dim {dim}")
    order = [dim] + [d for d in range(n) if d != dim]
    inverse = [order.index(d) for d in range(n)]
    moved = input.permute(*order).contiguous()
    src = source.permute(*order).contiguous()
    if alpha != 1:
        src = src * alpha
    rows = _loom.index_add_rows(moved.reshape(size, -1), index, src.reshape(index.shape[0], -1))
    return rows.reshape(list(moved.shape)).permute(*inverse).contiguous()


def _recorded(self, *operands):
    """Whether autograd records an in-place write of self with these operands (grad on, self
    floating, self or a tensor operand requiring grad)."""
    if not _loom.is_grad_enabled() or not self.dtype.is_floating_point:
        return False
    return self.requires_grad or any(isinstance(o, Tensor) and o.requires_grad for o in operands)


def _in_place(fn, name=None):
    """The in-place form of fn: self.copy_ of its result, recorded by autograd as PyTorch's
    in-place ops are when self or an operand requires grad. fn then reads a clone of self, so
    that what fn keeps for its backward is not the memory the write changes."""
    def method(self, *args, **kwargs):
        operands = list(args) + list(kwargs.values())
        source = self.clone() if _recorded(self, *operands) else self
        self.copy_(fn(source, *args, **kwargs))
        return self
    method.__doc__ = (f"In place: self.copy_({name or fn.__name__}(self, ...)), recorded by "
                      f"autograd as PyTorch's in-place ops are.")
    return method


def numel(input):
    return input.numel()


def is_tensor(obj):
    return isinstance(obj, Tensor)


def as_tensor(data, dtype=None, device=None):
    """data itself when it is a loom tensor of that dtype and device, else loom.tensor(data)."""
    if isinstance(data, Tensor):
        out = data if dtype is None else data.to(dtype)
        return out if device is None else out.to(device)
    kwargs = {} if dtype is None else {"dtype": dtype}
    out = _loom.tensor(data, **kwargs)
    return out if device is None else out.to(device)


def _random_like(make, input, dtype, device):
    dtype = input.dtype if dtype is None else dtype
    device = input.device if device is None else device
    return make(dtype).to(device)


def rand_like(input, *, dtype=None, device=None):
    return _random_like(lambda dt: _loom.rand(list(input.shape)).to(dt), input, dtype, device)


def randn_like(input, *, dtype=None, device=None):
    return _random_like(lambda dt: _loom.randn(list(input.shape)).to(dt), input, dtype, device)


def randint_like(input, low, high=None, *, dtype=None, device=None):
    if high is None:
        low, high = 0, low
    return _random_like(lambda dt: _loom.randint(low, high, list(input.shape)).to(dt), input,
                        dtype, device)


def randperm(n, *, dtype=None):
    """A random permutation of 0 .. n-1 from loom's global generator (int64), as torch.randperm;
    not PyTorch's sequence (the generators differ)."""
    out = argsort(_loom.rand([n])) if n > 0 else _loom.zeros([0], dtype=_loom.int64)
    return out if dtype is None else out.to(dtype)


def _itruediv(self, other):
    """t /= other in place (true division, broadcast to t's shape), recorded by autograd as
    PyTorch's in-place ops are."""
    source = self.clone() if _recorded(self, other) else self
    self.copy_(source / other)
    return self


def _t(self):
    """self.T for a tensor of at most 2 dims, as torch.Tensor.t()."""
    if self.dim() > 2:
        raise ValueError(f"t() expects a tensor with <= 2 dims, got {self.dim()}; use "
                         f"transpose(dim0, dim1) or mT")
    return self.T if self.dim() == 2 else self


def _double(self):
    raise ValueError("double(): loom has no float64; float32 (t.float()) is its widest float")


def _new(make):
    def method(self, *args, dtype=None, device=None, requires_grad=False):
        out = make(self, *args).to(self.dtype if dtype is None else dtype)
        out = out.to(self.device if device is None else device)
        if requires_grad:
            out.requires_grad_(True)
        return out
    return method


def _size_list(args):
    return list(args[0]) if len(args) == 1 and not isinstance(args[0], int) else list(args)


def install():
    """Adds the methods to loom.Tensor (called once by loom/__init__.py)."""
    methods = {
        "long": lambda self: self.to(_loom.int64),
        "int": lambda self: self.to(_loom.int32),
        "bool": lambda self: _mask(self),
        "half": lambda self: self.to(_loom.float16),
        "bfloat16": lambda self: self.to(_loom.bfloat16),
        "double": _double,
        "t": _t,
        "__itruediv__": _itruediv,
        "any": any_, "all": all_, "logical_not": logical_not, "logical_and": logical_and,
        "logical_or": logical_or, "logical_xor": logical_xor, "__invert__": _invert,
        "__and__": _logical_operator("&", logical_and),
        "__or__": _logical_operator("|", logical_or),
        "__xor__": _logical_operator("^", logical_xor),
        "isnan": isnan, "isinf": isinf, "isfinite": isfinite, "sign": sign, "square": square,
        "reciprocal": reciprocal, "maximum": maximum, "minimum": minimum,
        "logsumexp": logsumexp, "sort": sort, "argsort": argsort, "split": split,
        "chunk": chunk, "unbind": unbind, "flip": flip, "nelement": lambda self: self.numel(),
        "gather": gather, "scatter": scatter, "scatter_add": scatter_add,
        "index_add": index_add, "scatter_": _in_place(scatter),
        "scatter_add_": _in_place(scatter_add), "index_add_": _in_place(index_add),
        "type_as": lambda self, other: self.to(other.dtype),
        "new_zeros": _new(lambda self, *size: _loom.zeros(_size_list(size))),
        "new_ones": _new(lambda self, *size: _loom.ones(_size_list(size))),
        "new_full": _new(lambda self, size, value: _loom.full(list(size), value)),
        "new_tensor": _new(lambda self, data: _loom.tensor(data)),
    }
    for name, fn in methods.items():
        setattr(Tensor, name, fn)
    # PyTorch's in-place forms of the element-wise methods: self.copy_ of the method's result
    # (See _in_place), so recorded by autograd like every in-place write.
    for name in _IN_PLACE_FORMS:
        if hasattr(Tensor, name) and not hasattr(Tensor, name + "_"):
            method = getattr(Tensor, name)
            setattr(Tensor, name + "_",
                    _in_place(lambda self, *a, _m=method, **k: _m(self, *a, **k), name))


_IN_PLACE_FORMS = (
    "div", "masked_fill", "clamp", "clamp_min", "clamp_max", "clip", "neg", "abs", "exp", "log",
    "sqrt", "rsqrt", "pow", "relu", "sigmoid", "tanh", "sign", "square", "reciprocal", "floor",
    "ceil", "round", "trunc", "sin", "cos", "lerp", "tril", "triu")
