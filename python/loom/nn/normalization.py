"""RMSNorm (torch.nn.RMSNorm), a Python module over F.rms_norm: composed from loom ops (mean of
squares with keepdim, rsqrt, broadcasting), so autograd comes from them and it runs wherever they
do. LayerNorm is the built-in C++ module (modules.py).
"""

from loom import _loom
from loom.autograd import no_grad
from loom.nn import functional as F
from loom.nn.module import Module, Parameter


class RMSNorm(Module):
    """y = x / sqrt(mean(x²) + eps) · weight, the mean over the trailing ``normalized_shape``
    dims, as torch.nn.RMSNorm. ``eps=None``: the machine epsilon of the input's dtype.
    ``elementwise_affine``: a learned ``weight`` of shape ``normalized_shape``, initialised to
    ones (no bias, as PyTorch's)::

        norm = loom.nn.RMSNorm(64)
        y = norm(loom.randn(8, 16, 64))
    """

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None,
                 dtype=None):
        super().__init__()
        shape = ((normalized_shape,) if isinstance(normalized_shape, int)
                 else tuple(int(s) for s in normalized_shape))
        self.normalized_shape = shape
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = Parameter(_loom.ones(*shape, dtype=dtype, device=device))
        else:
            self.register_parameter("weight", None)

    def reset_parameters(self):
        """The weight back to ones."""
        if self.weight is not None:
            with no_grad():
                self.weight.fill_(1.0)

    def forward(self, input):
        return F.rms_norm(input, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")
