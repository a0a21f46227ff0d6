"""Activation modules (torch.nn's names): ReLU, GELU, SiLU, Tanh, Sigmoid, Softmax, LogSoftmax,
Identity, Flatten. Each is a parameter-free Python module over loom.nn.functional, so
``nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))`` reads as in PyTorch.

``inplace=True`` is accepted where PyTorch has it and computes out of place: loom's autograd does
not record in-place updates, and the result is the same.
"""

from loom.nn import functional as F
from loom.nn.module import Module


class Identity(Module):
    """Returns its input; any constructor arguments are ignored (as torch.nn.Identity)."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, input):
        return input


class ReLU(Module):
    """max(x, 0), elementwise."""

    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return F.relu(input)

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


class GELU(Module):
    """GELU. ``approximate='none'`` (the default, as PyTorch's): x·Φ(x) = 0.5·x·(1 + erf(x/√2));
    ``'tanh'``: GPT-2's tanh approximation, a fused kernel. Note that the functional form
    ``F.gelu`` defaults to ``'tanh'`` in loom (see its docstring)."""

    def __init__(self, approximate="none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got '{approximate}'")
        self.approximate = approximate

    def forward(self, input):
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self):
        return f"approximate='{self.approximate}'"


class SiLU(Module):
    """x·sigmoid(x) (Swish)."""

    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return F.silu(input)


class Tanh(Module):
    """tanh(x), elementwise."""

    def forward(self, input):
        return F.tanh(input)


class Sigmoid(Module):
    """1 / (1 + exp(-x)), elementwise."""

    def forward(self, input):
        return F.sigmoid(input)


class Softmax(Module):
    """softmax along ``dim`` (None: the last dim; see F.softmax)."""

    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        return F.softmax(input, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class LogSoftmax(Module):
    """log(softmax) along ``dim`` (None: the last dim; see F.log_softmax)."""

    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        return F.log_softmax(input, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class Flatten(Module):
    """Merges dims ``start_dim``..``end_dim`` into one (default: all but the batch dim)."""

    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, input):
        return input.flatten(self.start_dim, self.end_dim)

    def extra_repr(self):
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"
