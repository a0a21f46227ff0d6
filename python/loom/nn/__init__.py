"""loom.nn: for now only ``loom.nn.functional``. Modules (Linear, LayerNorm, GPT, ...) come with a
later landing of the Python issue."""

from loom.nn import functional  # noqa: F401

__all__ = ["functional"]
