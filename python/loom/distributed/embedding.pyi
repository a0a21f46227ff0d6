# Type stubs for loom.distributed.embedding (hand-written). See embedding.py and
# python/src/sharded.cpp.
import enum
from typing import List, Optional, Sequence, Tuple, Union

from loom import Tensor
from loom.distributed import Communicator
from loom.nn import Module

class EmbeddingSharding(enum.Enum):
    table = ...
    row = ...
    column = ...
    data = ...

class EmbeddingPlacement:
    kind: EmbeddingSharding
    rank: int
    def __init__(self, kind: Union[str, EmbeddingSharding] = "table", rank: int = -1) -> None: ...

class EmbeddingShard:
    table: int
    kind: EmbeddingSharding
    owner: int
    row_start: int
    rows: int
    col_start: int
    cols: int

_Placement = Union[str, EmbeddingSharding, EmbeddingPlacement, Tuple[str, int]]

AUTO_REPLICATE_BELOW: int

def placements_for(sharding: str, rows: Sequence[int]) -> List[str]: ...

class ShardedEmbeddingBagCollection(Module):
    def __init__(self, tables: Sequence[Tuple[str, int, int]], placements: Sequence[_Placement],
                 group: Optional[Communicator] = None, pooling: str = "sum") -> None: ...
    def forward(self, indices: Tensor, offsets: Tensor,
                per_sample_weights: Optional[Tensor] = None) -> Tensor: ...
    def lookup(self, indices: Tensor, offsets: Tensor,
               per_sample_weights: Optional[Tensor] = None) -> Tensor: ...
    def finish_gradients(self) -> None: ...
    @property
    def group(self) -> Communicator: ...
    @property
    def tables(self) -> List[Tuple[str, int, int]]: ...
    @property
    def placements(self) -> List[EmbeddingPlacement]: ...
    @property
    def shards(self) -> List[EmbeddingShard]: ...
