"""loom.nn.utils: clip_grad_norm_ (over loom::optim::clip_grad_norm)."""

from loom import _loom


def clip_grad_norm_(parameters, max_norm, norm_type=2.0):
    """Scales the gradients in place so their global L2 norm is at most ``max_norm``, as
    torch.nn.utils.clip_grad_norm_; returns the norm before clipping (a 0-d float32 tensor).
    Parameters without a gradient count for nothing. Only ``norm_type=2`` is supported.

        >>> loss.backward()
        >>> loom.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    """
    if float(norm_type) != 2.0:
        raise ValueError(f"clip_grad_norm_: only norm_type=2 is supported, got {norm_type}")
    if isinstance(parameters, _loom.Tensor):
        parameters = [parameters]
    norm = _loom.optim.clip_grad_norm(list(parameters), float(max_norm))
    return _loom.tensor(norm)
