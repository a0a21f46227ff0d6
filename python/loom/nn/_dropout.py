"""Dropout that is right without a call from the script (See Note [Dropout keys] in
core/nn/dropout.h for the keyed masks underneath).

loom draws dropout masks from a key, not from a generator that moves on by itself: the
process-wide dropout step (the high half of the Philox offset) and the batch part (which equal
part of the step's global batch this call's rows are). A PyTorch script never says either, so:

- every ``loom.optim`` optimizer's ``step()`` (ZeroRedundancyOptimizer's too) advances the dropout
  step by one: the next training step draws new masks;
- ``DistributedDataParallel`` and ``ZeroRedundancyOptimizer`` set the batch part to this rank's
  share of the global batch, micro-batch by micro-batch (rank-major: rank r's micro-batch m is
  part ``r * grad_accum + m`` of ``world * grad_accum``, advanced by each ``backward``), so the
  ranks together draw the masks one process draws on the whole batch.

A script that calls ``loom.nn.set_dropout_batch_part`` itself takes the batch part over: the
wrappers then leave it alone. ``set_dropout_step`` can be called at any time (for example with the
global step when resuming); the optimizers keep advancing from there.
"""

from loom import _loom

_explicit_batch_part = False


def set_dropout_step(step):
    """Sets the process-wide dropout step (masks of step s are drawn at offset s << 32). Every
    loom.optim optimizer's step() advances it by one, so a script needs this only to jump, e.g.
    to the global step when it resumes."""
    _loom.nn.set_dropout_step(step)


def dropout_step():
    """The process-wide dropout step."""
    return _loom.nn.dropout_step()


def set_dropout_batch_part(part=0, parts=1):
    """The next forwards' rows are part ``part`` of ``parts`` equal parts of the step's batch (a
    data-parallel rank's or micro-batch's share), so dropout draws the single-process masks.
    Calling it takes the batch part over from DistributedDataParallel and
    ZeroRedundancyOptimizer, which otherwise set it themselves."""
    global _explicit_batch_part
    _loom.nn.set_dropout_batch_part(part, parts)
    _explicit_batch_part = True


def _advance_step():
    """After an optimizer step: the next step's masks."""
    _loom.nn.set_dropout_step(_loom.nn.dropout_step() + 1)


class _BatchParts:
    """A data-parallel wrapper's automatic batch part: rank ``rank`` of ``world``, micro-batch
    ``micro`` of ``grad_accum`` (rank-major), unless the script set the batch part itself."""

    def __init__(self, rank, world, grad_accum):
        self._rank, self._world, self._accum = rank, world, max(1, grad_accum)
        self._micro = 0
        self._apply()

    def _apply(self):
        if not _explicit_batch_part:
            _loom.nn.set_dropout_batch_part(self._rank * self._accum + self._micro,
                                            self._world * self._accum)

    def after_backward(self):
        self._micro = (self._micro + 1) % self._accum
        self._apply()

    def restart(self):
        self._micro = 0
        self._apply()
