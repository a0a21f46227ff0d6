"""Functional ops under PyTorch's names and signatures (``import loom.nn.functional as F``).

The fused C++ ops (``loom._loom.functional``) run whenever a call asks for what they compute;
the general forms are composed here from differentiable loom ops, so every path has autograd:

- ``cross_entropy``: the fused kernel (never stores more than the logits) for class-index targets
  without ``weight`` or ``label_smoothing`` and with ``reduction`` mean or sum, over logits of
  any rank (the class dim is moved last and flattened); otherwise log_softmax and a one-hot
  selection. ``binary_cross_entropy_with_logits``: fused for the mean or sum without ``weight``
  or ``pos_weight``.
- ``scaled_dot_product_attention``: the fused kernel for 4-D q, k, v of one shape with no mask,
  no dropout and the default scale; otherwise softmax(q kᵀ scale + mask) v.

Where loom deliberately differs from PyTorch (each said again in the function's docstring):

- ``gelu``'s default is ``approximate='tanh'`` (GPT-2's, and what loom's GPT computes);
  ``approximate='none'`` is the exact erf form, PyTorch's default. ``nn.GELU()`` defaults to
  PyTorch's ``'none'``.
- ``scaled_dot_product_attention``'s ``is_causal`` defaults to None: causal when no
  ``attn_mask`` is given (loom's GPT use), not causal when one is. PyTorch's default is False.
- Masks are bool, as PyTorch's (uint8 masks are taken too: nonzero means "takes part").
- A mean over no elements (every target ``ignore_index``) is 0 with zero gradients, not NaN, so
  a micro-batch that is all padding does not poison a step; the fused losses return float32
  whatever the logits' dtype.
- ``softmax`` / ``log_softmax`` with ``dim=None`` use the last dim (PyTorch's deprecated implicit
  choice picks dim 0 for 0-, 1- and 3-D inputs and dim 1 otherwise).
- ``dropout`` draws loom's counter-based mask from a key (seed, stream, offset); see its doc.
- ``layer_norm`` normalizes over the last dim only.
"""

import math
import warnings

from loom import _loom

_F = _loom.functional
Tensor = _loom.Tensor

dot_interaction = _F.dot_interaction
dropout = _F.dropout
embedding = _F.embedding
layer_norm = _F.layer_norm
linear = _F.linear
relu = _F.relu
sigmoid = _F.sigmoid
tanh = _loom.tanh

_SQRT1_2 = 1.0 / math.sqrt(2.0)
_FINFO_EPS = {"float32": 2.0 ** -23, "bfloat16": 2.0 ** -7, "float16": 2.0 ** -10}


# ------------------------------------------------------------------------- helpers

def _dim(op, dim, ndim):
    """dim in [0, ndim) from a possibly negative dim, or a ValueError naming op."""
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise ValueError(f"{op}: dim {dim} is out of range for a {ndim}-D tensor")
    return dim % n


def _reduction(op, size_average, reduce, reduction):
    """PyTorch's legacy size_average / reduce flags folded into ``reduction``, then checked."""
    if size_average is not None or reduce is not None:
        warnings.warn(f"{op}: size_average and reduce are deprecated; use reduction='mean', "
                      f"'sum' or 'none'", stacklevel=3)
        size_average = True if size_average is None else size_average
        reduce = True if reduce is None else reduce
        reduction = ("mean" if size_average else "sum") if reduce else "none"
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"{op}: reduction must be 'none', 'mean' or 'sum', got '{reduction}'")
    return reduction


def _reduce(loss, reduction):
    if reduction == "none":
        return loss
    return loss.sum() if reduction == "sum" else loss.mean()


def _class_last(x, class_dim):
    """x with its class dim moved last (a view)."""
    if class_dim == x.dim() - 1:
        return x
    order = [d for d in range(x.dim()) if d != class_dim] + [class_dim]
    return x.permute(*order)


def _safe_divide(total, denominator):
    """total / denominator, 0 where the denominator is 0 (a mean over nothing)."""
    return total / _loom.where(denominator == 0, 1.0, denominator)


def _erf(x):
    erf = getattr(_loom, "erf", None)
    if erf is None:
        raise NotImplementedError("gelu(approximate='none') needs loom.erf, which this build of "
                                  "loom lacks; rebuild loom, or pass approximate='tanh'")
    return erf(x)


# ------------------------------------------------------------------------- activations

def gelu(input, approximate="tanh"):
    """GELU: ``approximate='none'`` is x·Φ(x) = 0.5·x·(1 + erf(x/√2)) (PyTorch's default);
    ``'tanh'`` is 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), GPT-2's, a fused kernel.

    loom's default is ``'tanh'``, unlike PyTorch's ``'none'``: it is what loom's GPT and the
    existing loom scripts compute. Pass ``approximate='none'`` for PyTorch's numbers (``nn.GELU()``
    defaults to it)."""
    if approximate == "tanh":
        return _F.gelu(input, "tanh")
    if approximate == "none":
        return 0.5 * input * (1.0 + _erf(input * _SQRT1_2))
    raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got '{approximate}'")


def silu(input, inplace=False):
    """x·sigmoid(x) (Swish). ``inplace`` is accepted for PyTorch's signature and ignored: loom
    computes out of place."""
    return input * _F.sigmoid(input)


def softmax(input, dim=None, _stacklevel=3, dtype=None):
    """exp(x) / sum(exp(x)) along ``dim`` (None: the last dim, where PyTorch's deprecated implicit
    choice may pick another). ``dtype``: convert the input to it first."""
    if dtype is not None:
        input = input.to(dtype)
    return _F.softmax(input, -1 if dim is None else dim)


def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    """log(softmax(x)) along ``dim`` (None: the last dim), computed as x - max - log(sum(exp(x -
    max))) so that tiny probabilities keep their logarithms. ``dtype``: convert the input first."""
    if dtype is not None:
        input = input.to(dtype)
    d = -1 if dim is None else _dim("log_softmax", dim, input.dim())
    shifted = input - input.detach().max(d, keepdim=True).values
    return shifted - shifted.exp().sum(d, keepdim=True).log()


# ------------------------------------------------------------------------- normalization

def rms_norm(input, normalized_shape, weight=None, eps=None):
    """x / sqrt(mean(x², over the trailing ``normalized_shape`` dims) + eps) · weight, as
    torch.nn.functional.rms_norm. ``eps=None`` is the machine epsilon of the input's dtype."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    k = len(shape)
    if k == 0 or input.dim() < k or tuple(input.shape[input.dim() - k:]) != shape:
        raise ValueError(f"rms_norm: normalized_shape {list(shape)} must be the trailing dims of "
                         f"the input {list(input.shape)}")
    if eps is None:
        eps = _FINFO_EPS.get(str(input.dtype).replace("loom.", ""))
        if eps is None:
            raise ValueError(f"rms_norm: the input must be floating point, got {input.dtype}")
    dims = tuple(range(input.dim() - k, input.dim()))
    out = input * ((input * input).mean(dims, keepdim=True) + eps).rsqrt()
    return out if weight is None else out * weight


# ------------------------------------------------------------------------- losses

def _check_class_targets(op, target, classes, ignore_index):
    """An error naming the first target outside [0, classes) that is not ignore_index (as the
    fused kernel's check; it reads the targets on the host)."""
    if target.dtype not in (_loom.int64, _loom.int32):
        raise ValueError(f"{op}: class-index targets must be int64 or int32, got {target.dtype} "
                         f"(class probabilities take the input's shape)")
    import numpy as np
    t = np.asarray(target.detach().cpu().numpy()).reshape(-1)
    bad = (t != ignore_index) & ((t < 0) | (t >= classes))
    if bad.any():
        raise ValueError(f"{op}: target {int(t[bad][0])} is outside [0, {classes}) and is not "
                         f"ignore_index ({ignore_index})")


def _class_dim(op, input, target, what):
    """The class dim of ``input`` (0 for an unbatched (C,), else 1) after checking that the
    class-index ``target`` has the input's shape without it."""
    if input.dim() == 0:
        raise ValueError(f"{op}: the {what} need at least 1 dim (C,), got a 0-d tensor")
    class_dim = 0 if input.dim() == 1 else 1
    want = [s for d, s in enumerate(input.shape) if d != class_dim]
    if list(target.shape) != want:
        raise ValueError(f"{op}: target has shape {list(target.shape)}, expected {want} for "
                         f"{what} of shape {list(input.shape)} (classes along dim {class_dim})")
    return class_dim


def _nll(op, logp, target, weight, ignore_index, reduction, label_smoothing):
    """The negative log-likelihood of class-index targets from log-probabilities ``logp``
    [..., C] (classes last) and ``target`` [...], with PyTorch's weighting, ignore_index and label
    smoothing; the mean divides by the summed weights of the non-ignored targets."""
    classes = logp.shape[-1]
    _check_class_targets(op, target, classes, ignore_index)
    target = target.to(_loom.int64)
    one_hot = _loom.arange(classes, device=logp.device) == target.unsqueeze(-1)  # [..., C] u8
    ignored = target == ignore_index                                               # [...] u8
    picked = logp.masked_fill(one_hot == 0, 0.0).sum(-1).masked_fill(ignored, 0.0)
    kept = 1.0 - ignored.to(logp.dtype)
    if weight is not None:
        if list(weight.shape) != [classes]:
            raise ValueError(f"{op}: weight has shape {list(weight.shape)}, expected [{classes}] "
                             f"(one per class)")
        target_weight = _loom.where(one_hot, weight.to(logp.dtype), 0.0).sum(-1) * kept
        loss = (-(picked * target_weight)).masked_fill(ignored, 0.0)
    else:
        target_weight = kept
        loss = (-picked).masked_fill(ignored, 0.0)
    if label_smoothing > 0.0:
        spread = logp if weight is None else logp * weight.to(logp.dtype)
        smooth = (-spread.sum(-1)).masked_fill(ignored, 0.0)
        loss = (1.0 - label_smoothing) * loss + (label_smoothing / classes) * smooth
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return _safe_divide(loss.sum(), target_weight.sum())


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                  reduction="mean", label_smoothing=0.0):
    """Cross-entropy of logits against class indices or class probabilities, as
    torch.nn.functional.cross_entropy.

    ``input``: logits (C,), (N, C) or (N, C, d1, ..., dk). ``target``: class indices (int64 or
    int32) of shape (), (N) or (N, d1, ..., dk), or class probabilities of the input's shape.
    ``weight`` (C,) rescales each class; targets equal to ``ignore_index`` add nothing and count
    for nothing; ``label_smoothing`` ε mixes the target with the uniform distribution
    ((1 - ε)·target + ε/C). ``reduction``: 'mean' (over the non-ignored targets, weighted by
    ``weight``; over N·d1·...·dk for probabilities), 'sum' or 'none' (the target's shape).

    Differences from PyTorch: a mean over no targets (all ignored) is 0 with zero gradients, not
    NaN; with class-index targets, no weight and no smoothing, the fused kernel computes the mean
    and sum in float32 whatever the logits' dtype. Example::

        >>> logits = loom.randn(4, 10, requires_grad=True)
        >>> F.cross_entropy(logits, loom.tensor([1, 0, -100, 9]), label_smoothing=0.1)
    """
    op = "cross_entropy"
    reduction = _reduction(op, size_average, reduce, reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be in [0, 1], got {label_smoothing}")
    if not isinstance(input, Tensor) or not isinstance(target, Tensor):
        raise TypeError(f"{op}: input and target must be loom.Tensors")
    if target.dtype.is_floating_point:  # class probabilities
        if list(target.shape) != list(input.shape):
            raise ValueError(f"{op}: a floating-point target holds class probabilities and must "
                             f"have the input's shape {list(input.shape)}, got "
                             f"{list(target.shape)} (class indices are int64 or int32)")
        class_dim = 0 if input.dim() == 1 else 1
        logp = log_softmax(_class_last(input, class_dim), -1)
        probs = _class_last(target, class_dim).to(logp.dtype)
        classes = logp.shape[-1]
        if label_smoothing > 0.0:
            probs = probs * (1.0 - label_smoothing) + label_smoothing / classes
        terms = logp * probs
        if weight is not None:
            terms = terms * weight.to(logp.dtype)
        return _reduce(-terms.sum(-1), reduction)
    class_dim = _class_dim(op, input, target, "logits")
    logits = _class_last(input, class_dim)
    if weight is None and label_smoothing == 0.0 and reduction != "none":
        flat = logits.reshape(-1, logits.shape[-1])
        mean = _F.cross_entropy(flat, target.reshape(-1), ignore_index, "mean")
        if reduction == "mean":
            return mean
        # The sum is the mean times the count of kept targets (0 when all are ignored).
        return mean * (target != ignore_index).to(_loom.float32).sum()
    return _nll(op, log_softmax(logits, -1), target, weight, ignore_index, reduction,
                label_smoothing)


def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
             reduction="mean"):
    """Negative log-likelihood of log-probabilities ``input`` ((C,), (N, C) or (N, C, d1, ...))
    at class indices ``target`` ((), (N) or (N, d1, ...)), as torch.nn.functional.nll_loss:
    ``weight`` per class, ``ignore_index``, ``reduction`` (the mean divides by the summed weights
    of the kept targets; over none it is 0, not NaN)."""
    op = "nll_loss"
    reduction = _reduction(op, size_average, reduce, reduction)
    class_dim = _class_dim(op, input, target, "log-probabilities")
    return _nll(op, _class_last(input, class_dim), target, weight, ignore_index, reduction, 0.0)


def mse_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """(input - target)², reduced ('mean', 'sum' or 'none'), as torch.nn.functional.mse_loss;
    the two broadcast together."""
    reduction = _reduction("mse_loss", size_average, reduce, reduction)
    diff = input - target
    return _reduce(diff * diff, reduction)


def l1_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """|input - target|, reduced, as torch.nn.functional.l1_loss."""
    reduction = _reduction("l1_loss", size_average, reduce, reduction)
    return _reduce((input - target).abs(), reduction)


def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    """Huber-style loss, as torch.nn.functional.smooth_l1_loss: 0.5·d²/beta where |d| < beta,
    else |d| - 0.5·beta (d = input - target; beta 0 is the L1 loss)."""
    reduction = _reduction("smooth_l1_loss", size_average, reduce, reduction)
    if beta < 0:
        raise ValueError(f"smooth_l1_loss: beta must be >= 0, got {beta}")
    d = (input - target).abs()
    if beta == 0.0:
        return _reduce(d, reduction)
    return _reduce(_loom.where(d < beta, (0.5 / beta) * d * d, d - 0.5 * beta), reduction)


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None,
                                     reduction="mean", pos_weight=None):
    """-[pos_weight·y·log σ(x) + (1 - y)·log(1 - σ(x))]·weight elementwise, computed stably, as
    torch.nn.functional.binary_cross_entropy_with_logits. ``target`` has the input's shape
    (probabilities in [0, 1]); ``weight`` broadcasts to it; ``pos_weight`` weighs the positive
    term per class (it broadcasts along the last dim). Without weights, the mean and sum are the
    fused kernel's (a float32 result whatever the logits' dtype)."""
    op = "binary_cross_entropy_with_logits"
    reduction = _reduction(op, size_average, reduce, reduction)
    if list(target.shape) != list(input.shape):
        raise ValueError(f"{op}: target has shape {list(target.shape)}, expected the input's "
                         f"{list(input.shape)}")
    if weight is None and pos_weight is None and reduction != "none":
        mean = _F.binary_cross_entropy_with_logits(input, target, "mean")
        return mean if reduction == "mean" else mean * float(input.numel())
    # softplus(-x) = log(1 + exp(-x)) = max(-x, 0) + log1p(exp(-|x|)), stable for any x.
    softplus_neg = (-input).clamp(min=0.0) + (-input.abs()).exp().log1p()
    target = target.to(input.dtype)
    if pos_weight is None:
        loss = (1.0 - target) * input + softplus_neg
    else:
        loss = (1.0 - target) * input + (1.0 + (pos_weight.to(input.dtype) - 1.0) * target) \
            * softplus_neg
    if weight is not None:
        loss = loss * weight.to(input.dtype)
    return _reduce(loss, reduction)


# ------------------------------------------------------------------------- attention

def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=None, scale=None):
    """softmax(q kᵀ·scale + mask) v, as torch.nn.functional.scaled_dot_product_attention.

    ``query`` (..., L, E), ``key`` (..., S, E), ``value`` (..., S, Ev), with the same leading
    dims. ``scale`` defaults to 1/√E. ``attn_mask`` broadcasts to (..., L, S): a bool mask
    (True takes part, False is masked out; uint8 too, nonzero taking part) or a floating one added
    to the scores.
    ``is_causal=True`` masks out key j > query i (the top-left-aligned lower triangle, as
    PyTorch's), combined with ``attn_mask`` when both are given (PyTorch refuses both).
    ``dropout_p`` drops attention weights with loom's dropout (always, as PyTorch's functional
    form: pass 0.0 outside training).

    Deliberate difference: ``is_causal`` defaults to None, meaning causal when no ``attn_mask`` is
    given (loom's GPT use, and what this function always did) and not causal when a mask is.
    PyTorch's default is False: pass ``is_causal=False`` explicitly for non-causal attention
    without a mask. A row whose keys are all masked out gives NaN, as PyTorch's math backend.

    4-D q, k, v of one shape (B, H, T, D) with no mask, no dropout and the default scale run
    loom's fused kernel (flash-style on CUDA); anything else is composed from matmul, softmax
    and masked_fill (it stores the (..., L, S) scores).
    """
    op = "scaled_dot_product_attention"
    causal = attn_mask is None if is_causal is None else bool(is_causal)
    if query.dim() < 2 or key.dim() != query.dim() or value.dim() != query.dim():
        raise ValueError(f"{op}: query, key and value need the same rank (at least 2), got "
                         f"{list(query.shape)}, {list(key.shape)}, {list(value.shape)}")
    lead = list(query.shape[:-2])
    if (list(key.shape[:-2]) != lead or list(value.shape[:-2]) != lead
            or key.shape[-1] != query.shape[-1] or value.shape[-2] != key.shape[-2]):
        raise ValueError(f"{op}: expected query (..., L, E), key (..., S, E) and value "
                         f"(..., S, Ev) with the same leading dims, got {list(query.shape)}, "
                         f"{list(key.shape)}, {list(value.shape)}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"{op}: dropout_p must be in [0, 1), got {dropout_p}")
    default_scale = 1.0 / math.sqrt(query.shape[-1]) if query.shape[-1] else 1.0
    if (attn_mask is None and dropout_p == 0.0 and (scale is None or scale == default_scale)
            and query.dim() == 4 and list(query.shape) == list(key.shape) == list(value.shape)):
        return _F.scaled_dot_product_attention(query, key, value, None, 0.0, causal)
    scores = (query @ key.mT) * (default_scale if scale is None else float(scale))
    if causal:
        rows = _loom.arange(scores.shape[-2], device=query.device).unsqueeze(-1)
        cols = _loom.arange(scores.shape[-1], device=query.device)
        scores = scores.masked_fill(cols > rows, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype in (_loom.bool, _loom.uint8):
            scores = scores.masked_fill(attn_mask == 0, float("-inf"))
        elif attn_mask.dtype.is_floating_point:
            scores = scores + attn_mask.to(scores.dtype)
        else:
            raise TypeError(f"{op}: attn_mask must be bool (or uint8) or floating point, "
                            f"got {attn_mask.dtype}")
    weights = _F.softmax(scores, -1)
    if dropout_p > 0.0:
        weights = _F.dropout(weights, dropout_p, True)
    return weights @ value


__all__ = [
    "binary_cross_entropy_with_logits", "cross_entropy", "dot_interaction", "dropout",
    "embedding", "gelu", "l1_loss", "layer_norm", "linear", "log_softmax", "mse_loss",
    "nll_loss", "relu", "rms_norm", "scaled_dot_product_attention", "sigmoid", "silu",
    "smooth_l1_loss", "softmax", "tanh",
]
