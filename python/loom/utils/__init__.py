"""loom.utils: PyTorch's torch.utils for loom. So far ``loom.utils.data`` (datasets, samplers,
DataLoader, DistributedSampler; see python/loom/utils/data.py)."""

from loom.utils import data  # noqa: F401

__all__ = ["data"]
