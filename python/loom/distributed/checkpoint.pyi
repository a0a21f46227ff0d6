# Type stubs for loom.distributed.checkpoint (hand-written). See checkpoint.py.
import os
from typing import Any, Dict, Optional, Union

from loom.distributed import Communicator, DistributedDataParallel
from loom.nn import Module
from loom.optim import Optimizer

_Path = Union[str, "os.PathLike[str]"]

def save(path: _Path, *, model: Union[Module, DistributedDataParallel],
         optimizer: Optional[Optimizer] = ..., step: int, group: Optional[Communicator] = ...,
         keep_last: int = ..., state: Optional[Dict[str, Any]] = ..., **extra: Any) -> str: ...
def load(path: _Path, *, model: Union[Module, DistributedDataParallel],
         optimizer: Optional[Optimizer] = ...,
         group: Optional[Communicator] = ...) -> Dict[str, Any]: ...
def latest(path: _Path) -> Optional[str]: ...
def has_checkpoint(path: _Path, step: int) -> bool: ...
def verify(path: _Path) -> str: ...
def read_manifest(path: _Path) -> Dict[str, Any]: ...
