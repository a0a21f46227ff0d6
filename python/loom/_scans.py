"""cumsum, cumprod, prod, norm / linalg.vector_norm and einsum as torch's, composed from loom's
ops, so each is differentiable through the ops it is made of and runs wherever they run (CPU and
CUDA).

The scans take ceil(log2 n) steps of whole-tensor adds (or multiplies) of shifted copies
(Hillis and Steele's scan), and prod multiplies halves together the same number of times: so
integer results are exact (wrapping as PyTorch's do) and floating ones are sums in another order
than PyTorch's left-to-right loop, equal to it within rounding. Integer cumsum and prod give i64
(PyTorch's rule for integer inputs); cumprod keeps the dtype as PyTorch does.
"""

import math

from loom import _loom

Tensor = _loom.Tensor
_INTEGER = (_loom.int32, _loom.int64, _loom.uint8, _loom.bool)


def _dim(input, dim, what):
    n = input.dim()
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"{what}: dim must be an int, got {type(dim).__name__}")
    if not (-max(n, 1) <= dim < max(n, 1)):
        raise IndexError(f"{what}: dim {dim} is out of range for a {n}-dim tensor")
    return dim + n if dim < 0 else dim


def _shifted(x, dim, k, fill):
    """x moved k places along dim toward its end, the first k places `fill` (k < size)."""
    head = list(x.shape)
    head[dim] = k
    pad = _loom.full(head, fill, dtype=x.dtype).to(x.device)
    body = x[(slice(None),) * dim + (slice(0, x.shape[dim] - k),)]
    return _loom.cat([pad, body], dim)


def _scan(input, dim, what, combine, identity, dtype):
    if dtype is not None:
        input = input.to(dtype)
    if input.dim() == 0:
        return input.clone()
    d = _dim(input, dim, what)
    out, k = input, 1
    while k < input.shape[d]:
        out = combine(out, _shifted(out, d, k, identity))
        k *= 2
    return out


def cumsum(input, dim, *, dtype=None):
    """Running sums along dim, as torch.cumsum (integers: i64)."""
    if dtype is None and input.dtype in _INTEGER:
        dtype = _loom.int64
    return _scan(input, dim, "cumsum", lambda a, b: a + b, 0, dtype)


def cumprod(input, dim, *, dtype=None):
    """Running products along dim, as torch.cumprod."""
    return _scan(input, dim, "cumprod", lambda a, b: a * b, 1, dtype)


def prod(input, dim=None, keepdim=False, *, dtype=None):
    """The product of every element, or along dim, as torch.prod (integers: i64)."""
    if dtype is None and input.dtype in _INTEGER:
        dtype = _loom.int64
    if dtype is not None:
        input = input.to(dtype)
    if dim is None:
        if keepdim:
            raise TypeError("prod: keepdim needs a dim")
        return prod(input.reshape(-1), 0) if input.dim() else input.clone()
    if input.dim() == 0:
        return input.clone()
    d = _dim(input, dim, "prod")
    out = input
    while out.shape[d] > 1:
        n = out.shape[d]
        if n % 2:  # an odd length: a 1 at the end pairs with the last element
            ones = list(out.shape)
            ones[d] = 1
            out = _loom.cat([out, _loom.ones(ones, dtype=out.dtype).to(out.device)], d)
            n += 1
        lead = (slice(None),) * d
        out = out[lead + (slice(0, n // 2),)] * out[lead + (slice(n // 2, n),)]
    if out.shape[d] == 0:  # the empty product, 1, still part of the graph (its gradient: none)
        out = out.sum(dim=d, keepdim=True) * 0 + 1
    return out if keepdim else out.squeeze(d)


def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """The ord-norm of x's elements (every element, or along dim: an int or a tuple), as
    torch.linalg.vector_norm: ord 2 (default), 1, inf, -inf, 0 (the count of nonzeros) or any
    other positive number. Floating inputs only. At x = 0 the 2-norm's gradient is 0, as
    PyTorch's."""
    if dtype is not None:
        x = x.to(dtype)
    if x.dtype in _INTEGER:
        raise TypeError(f"vector_norm: expected a floating tensor, got {x.dtype}")
    if dim is None:
        dims = range(x.dim())
    else:
        dims = {_dim(x, d, "vector_norm") for d in ((dim,) if isinstance(dim, int) else dim)}

    def reduce(t, how):
        for d in sorted(dims, reverse=True):  # the last first: the others keep their places
            t = how(t, d, keepdim)
        return t

    summed = lambda t, d, k: t.sum(dim=d, keepdim=k)  # noqa: E731
    a = x.abs()
    if ord == 2:
        s = reduce(x * x, summed)
        positive = s > 0
        # sqrt's gradient at 0 is infinite: take it only where s > 0 (where() passes no
        # gradient to the other branch, but 0 * inf would still be nan).
        return _loom.where(positive, _loom.where(positive, s, 1.0).sqrt(), 0.0)
    if ord == 1:
        return reduce(a, summed)
    if ord == math.inf:
        return reduce(a, lambda t, d, k: t.max(d, keepdim=k).values)
    if ord == -math.inf:
        return reduce(a, lambda t, d, k: t.min(d, keepdim=k).values)
    if ord == 0:
        return reduce((x != 0).to(x.dtype), summed)
    if isinstance(ord, (int, float)) and ord > 0:
        return reduce(a ** ord, summed) ** (1.0 / ord)
    raise ValueError(f"vector_norm: ord must be 2, 1, inf, -inf, 0 or a positive number, got {ord}")


def norm(input, p="fro", dim=None, keepdim=False, dtype=None):
    """torch.norm for vectors (and "fro", the 2-norm of every element): vector_norm with ord p."""
    if p == "fro" or p is None:
        p = 2
    if isinstance(p, str):
        raise ValueError(f"norm: p {p!r} is not supported (loom has vector norms: 'fro', a number, "
                         "inf or -inf)")
    return vector_norm(input, p, dim, keepdim, dtype=dtype)


def install():
    """The methods on loom.Tensor (called once by loom/__init__.py)."""
    for name, fn in {"cumsum": cumsum, "cumprod": cumprod, "prod": prod, "norm": norm}.items():
        setattr(Tensor, name, fn)


def _diagonal(spec, t):
    """t with every letter that spec repeats reduced to its diagonal ("ii" -> "i"), and the
    spec without repeats (first places kept). An index lookup of the flattened t, so it is
    differentiable and runs wherever indexing does."""
    letters = "".join(dict.fromkeys(spec))
    if letters == spec:
        return spec, t
    strides, step = [0] * t.dim(), 1
    for d in range(t.dim() - 1, -1, -1):
        strides[d], step = step, step * t.shape[d]
    flat = None
    for k, c in enumerate(letters):
        place = [1] * len(letters)
        size = t.shape[spec.index(c)]
        place[k] = size
        along = _loom.arange(size).to(t.device).view(*place) * sum(
            strides[d] for d, x in enumerate(spec) if x == c)
        flat = along if flat is None else flat + along
    return letters, t.contiguous().reshape(-1)[flat]


def _summed_first(s, t, keep):
    """t with the letters of s not in `keep` summed out, and what remains of s."""
    for i in range(len(s) - 1, -1, -1):
        if s[i] not in keep:
            t = t.sum(dim=i)
            s = s[:i] + s[i + 1:]
    return s, t


def _contract(sa, a, sb, b, keep, sizes):
    """a and b multiplied over their shared letters, those not in `keep` summed out, as one
    batched matmul: (letters of the result, result)."""
    sa, a = _summed_first(sa, a, keep + sb)
    sb, b = _summed_first(sb, b, keep + sa)
    batch = [c for c in sa if c in sb and c in keep]
    left = [c for c in sa if c not in sb]
    right = [c for c in sb if c not in sa]
    contracted = [c for c in sa if c in sb and c not in keep]
    prod_of = lambda cs: math.prod(sizes[c] for c in cs)  # noqa: E731
    a = a.permute(*[sa.index(c) for c in batch + left + contracted]).reshape(
        prod_of(batch), prod_of(left), prod_of(contracted))
    b = b.permute(*[sb.index(c) for c in batch + contracted + right]).reshape(
        prod_of(batch), prod_of(contracted), prod_of(right))
    order = batch + left + right
    return "".join(order), (a @ b).reshape(*[sizes[c] for c in order])


def einsum(equation, *operands):
    """torch.einsum: "bhqd,bhkd->bhqk", "ij,jk", "i,j->ij", "ij->ji", "...ij,...jk->...ik",
    "ii->i" (diagonals), "ii" (trace), "ij,jk,kl->il" (any number of operands). Operands are
    contracted left to right, each pair one batched matmul after permuting and reshaping them
    (so it is differentiable, and runs wherever matmul does); a letter no later operand or the
    output needs is summed out as soon as it can be. Unlike torch, the order is not optimised
    (opt_einsum): write the cheap pairs first. Letters must have one size everywhere (no
    broadcasting of size 1)."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not operands:
        raise ValueError("einsum: no operands given")
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    inputs = lhs.split(",")
    if len(inputs) != len(operands):
        raise ValueError(f"einsum: the equation {equation!r} has {len(inputs)} operands, "
                         f"{len(operands)} given")
    # "..." becomes capital letters, the same for every operand (aligned at the right).
    ell = max((t.dim() - len(s.replace("...", "")) for s, t in zip(inputs, operands)
               if "..." in s), default=0)
    spare = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in eq][:ell]
    def expand(spec, t=None):
        if "..." not in spec:
            return spec
        n = ell if t is None else t.dim() - len(spec.replace("...", ""))
        return spec.replace("...", "".join(spare[ell - n:]))
    inputs = [expand(s, t) for s, t in zip(inputs, operands)]
    if not arrow:  # implicit output: the letters that appear once, in order, after the batch
        counts = {}
        for s in inputs:
            for c in s:
                counts[c] = counts.get(c, 0) + 1
        out = "".join(spare) + "".join(sorted(c for c, k in counts.items()
                                              if k == 1 and c not in spare))
    else:
        out = expand(out)
    sizes = {}
    for s, t in zip(inputs, operands):
        if not all(c.isalpha() for c in s):
            raise ValueError(f"einsum: bad subscripts {s!r} in {equation!r}")
        if len(s) != t.dim():
            raise ValueError(f"einsum: subscripts {s!r} name {len(s)} dims, the operand has "
                             f"{t.dim()} (shape {list(t.shape)})")
        for c, n in zip(s, t.shape):
            if sizes.setdefault(c, n) != n:
                raise ValueError(f"einsum: '{c}' has size {sizes[c]} and {n}")
    for c in out:
        if c not in sizes or out.count(c) > 1:
            raise ValueError(f"einsum: output subscript '{c}' is not in an input, or repeated")

    specs, tensors = zip(*[_diagonal(s, t) for s, t in zip(inputs, operands)])
    s, t = _summed_first(specs[0], tensors[0], out + "".join(specs[1:]))
    for k in range(1, len(specs)):
        s, t = _contract(s, t, specs[k], tensors[k], out + "".join(specs[k + 1:]), sizes)
    s, t = _summed_first(s, t, out)
    return t.permute(*[s.index(c) for c in out]) if s else t
