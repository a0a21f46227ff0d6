"""Functional ops under PyTorch's names (``import loom.nn.functional as F``).

Differences from PyTorch, each raising ValueError when asked for what loom does not do:
``gelu`` is the tanh approximation (``approximate='tanh'``, GPT-2's); ``layer_norm`` normalizes
over the last dim only; ``cross_entropy`` and ``binary_cross_entropy_with_logits`` compute the
mean only; ``scaled_dot_product_attention`` is causal by default and takes no mask or dropout;
``dropout`` draws loom's counter-based mask from a key (seed, stream, offset).
"""

from loom._loom.functional import (  # noqa: F401
    binary_cross_entropy_with_logits,
    cross_entropy,
    dot_interaction,
    dropout,
    embedding,
    gelu,
    layer_norm,
    linear,
    relu,
    scaled_dot_product_attention,
    sigmoid,
    softmax,
)

__all__ = [
    "binary_cross_entropy_with_logits", "cross_entropy", "dot_interaction", "dropout", "embedding",
    "gelu", "layer_norm", "linear", "relu", "scaled_dot_product_attention", "sigmoid", "softmax",
]
