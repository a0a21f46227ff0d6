"""loom.nn.utils: gradient clipping (over loom::optim::clip_grad_norm and its two halves)."""

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


def grad_sum_of_squares(parameters):
    """The sum of the squares of the parameters' gradients (a float): one rank's part of a
    global gradient norm when parameters are spread over ranks (pipeline stages, tensor-parallel
    shards). Add the parts over the ranks, take the root, then ``clip_grads_to_norm_``."""
    if isinstance(parameters, _loom.Tensor):
        parameters = [parameters]
    return _loom.optim.grad_sum_of_squares(list(parameters))


def clip_grads_to_norm_(parameters, norm, max_norm):
    """Scales the gradients in place by max_norm / norm when ``norm`` (the global norm, computed
    over every rank) exceeds ``max_norm``: clip_grad_norm_'s second half."""
    if isinstance(parameters, _loom.Tensor):
        parameters = [parameters]
    _loom.optim.scale_grads_to_norm(list(parameters), float(norm), float(max_norm))
