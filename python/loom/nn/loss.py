"""Loss modules (torch.nn's names) over loom.nn.functional: CrossEntropyLoss, NLLLoss, MSELoss,
L1Loss, SmoothL1Loss, BCEWithLogitsLoss. ``reduction`` is 'mean' (default), 'sum' or 'none';
class weights and ``pos_weight`` are buffers (in state_dict, moved by ``to()``), as in PyTorch.
What differs from PyTorch is said in the functions' docstrings (a mean over no targets is 0).
"""

from loom.nn import functional as F
from loom.nn.module import Module


class _Loss(Module):
    def __init__(self, size_average=None, reduce=None, reduction="mean"):
        super().__init__()
        self.reduction = F._reduction(type(self).__name__, size_average, reduce, reduction)

    def extra_repr(self):
        return f"reduction='{self.reduction}'" if self.reduction != "mean" else ""


class _WeightedLoss(_Loss):
    def __init__(self, weight=None, size_average=None, reduce=None, reduction="mean"):
        super().__init__(size_average, reduce, reduction)
        self.register_buffer("weight", weight)


class CrossEntropyLoss(_WeightedLoss):
    """F.cross_entropy as a module: logits (N, C) / (N, C, d1, ...) / (C,) against class
    indices or class probabilities, with ``weight``, ``ignore_index``, ``reduction`` and
    ``label_smoothing``::

        criterion = loom.nn.CrossEntropyLoss(ignore_index=0, label_smoothing=0.1)
        loss = criterion(logits, targets)
    """

    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None,
                 reduction="mean", label_smoothing=0.0):
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing

    def forward(self, input, target):
        return F.cross_entropy(input, target, weight=self.weight, ignore_index=self.ignore_index,
                               reduction=self.reduction, label_smoothing=self.label_smoothing)


class NLLLoss(_WeightedLoss):
    """F.nll_loss as a module (input: log-probabilities, e.g. from nn.LogSoftmax)."""

    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None,
                 reduction="mean"):
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index = ignore_index

    def forward(self, input, target):
        return F.nll_loss(input, target, weight=self.weight, ignore_index=self.ignore_index,
                          reduction=self.reduction)


class MSELoss(_Loss):
    """F.mse_loss as a module: (input - target)², reduced."""

    def forward(self, input, target):
        return F.mse_loss(input, target, reduction=self.reduction)


class L1Loss(_Loss):
    """F.l1_loss as a module: |input - target|, reduced."""

    def forward(self, input, target):
        return F.l1_loss(input, target, reduction=self.reduction)


class SmoothL1Loss(_Loss):
    """F.smooth_l1_loss as a module (quadratic below ``beta``, linear above)."""

    def __init__(self, size_average=None, reduce=None, reduction="mean", beta=1.0):
        super().__init__(size_average, reduce, reduction)
        self.beta = beta

    def forward(self, input, target):
        return F.smooth_l1_loss(input, target, reduction=self.reduction, beta=self.beta)


class BCEWithLogitsLoss(_Loss):
    """F.binary_cross_entropy_with_logits as a module, with ``weight`` (broadcast to the input)
    and ``pos_weight`` (per class, along the last dim) as buffers."""

    def __init__(self, weight=None, size_average=None, reduce=None, reduction="mean",
                 pos_weight=None):
        super().__init__(size_average, reduce, reduction)
        self.register_buffer("weight", weight)
        self.register_buffer("pos_weight", pos_weight)

    def forward(self, input, target):
        return F.binary_cross_entropy_with_logits(input, target, weight=self.weight,
                                                  reduction=self.reduction,
                                                  pos_weight=self.pos_weight)
