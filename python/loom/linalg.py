"""loom.linalg: what loom has of torch.linalg (vector_norm; matrix norms and decompositions are not
there)."""

from loom._scans import vector_norm  # noqa: F401

__all__ = ["vector_norm"]
