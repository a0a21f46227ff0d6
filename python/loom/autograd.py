"""Grad-mode context managers: ``loom.no_grad`` and ``loom.enable_grad``.

Each ``with`` opens one C++ guard (loom::NoGradGuard / EnableGradGuard) and closes it on exit, so
they nest, and grad mode is per thread, as in PyTorch. Both also work as decorators.
"""

import contextlib

from loom import _loom


class _GradMode(contextlib.ContextDecorator):
    _guard_type = None

    def __init__(self):
        self._guards = []  # one per active `with`, so an instance may be re-entered

    def __enter__(self):
        guard = self._guard_type()
        guard.enter()
        self._guards.append(guard)
        return self

    def __exit__(self, *exc):
        self._guards.pop().exit()
        return False


class no_grad(_GradMode):
    """Operations inside record no autograd graph (saves memory; for evaluation and updates).

    Example::

        >>> w = loom.tensor([1.0, 2.0], requires_grad=True)
        >>> with loom.no_grad():
        ...     y = w * 2
        >>> y.requires_grad
        False
        >>> @loom.no_grad()
        ... def evaluate(x): ...
    """

    _guard_type = _loom._NoGradGuard


class enable_grad(_GradMode):
    """Turns recording back on inside a ``no_grad`` region."""

    _guard_type = _loom._EnableGradGuard
