# Type stubs for loom.utils (hand-written). See python/loom/utils/__init__.py.
from loom.utils import data as data
