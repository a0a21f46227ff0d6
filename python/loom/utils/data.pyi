# Type stubs for loom.utils.data (hand-written). See python/loom/utils/data.py.
from typing import (Any, Callable, Generic, Iterable, Iterator, List, Optional, Sequence, Tuple,
                    TypeVar, Union)

from loom import Tensor

T_co = TypeVar("T_co", covariant=True)
_Tokens = Union[Tensor, Sequence[int], Any]  # i32 / i64 1-D tensor, a list or numpy array of ints

class Dataset(Generic[T_co]):
    def __getitem__(self, index: Any) -> T_co: ...
    def __add__(self, other: Dataset[T_co]) -> ConcatDataset[T_co]: ...

class IterableDataset(Dataset[T_co]):
    def __iter__(self) -> Iterator[T_co]: ...
    def __add__(self, other: Dataset[T_co]) -> ChainDataset: ...  # type: ignore[override]

class TensorDataset(Dataset[Tuple[Tensor, ...]]):
    tensors: Tuple[Tensor, ...]
    def __init__(self, *tensors: Tensor) -> None: ...
    def __getitem__(self, index: Any) -> Tuple[Tensor, ...]: ...
    def __len__(self) -> int: ...

class ConcatDataset(Dataset[T_co]):
    datasets: List[Dataset[T_co]]
    cumulative_sizes: List[int]
    def __init__(self, datasets: Iterable[Dataset[T_co]]) -> None: ...
    def __len__(self) -> int: ...

class ChainDataset(IterableDataset[Any]):
    datasets: Iterable[IterableDataset[Any]]
    def __init__(self, datasets: Iterable[IterableDataset[Any]]) -> None: ...
    def __len__(self) -> int: ...

class Subset(Dataset[T_co]):
    dataset: Dataset[T_co]
    indices: Sequence[int]
    def __init__(self, dataset: Dataset[T_co], indices: Sequence[int]) -> None: ...
    def __len__(self) -> int: ...

def random_split(dataset: Dataset[T_co], lengths: Sequence[Union[int, float]],
                 generator: None = None, *, seed: Optional[int] = None) -> List[Subset[T_co]]: ...

class TokenDataset(Dataset[Tuple[Tensor, Tensor]]):
    tokens: Tensor  # 1-D i32 / i64
    seq: int
    stride: int
    def __init__(self, tokens: _Tokens, seq: int, stride: Optional[int] = None) -> None: ...
    def __getitem__(self, index: int) -> Tuple[Tensor, Tensor]: ...  # x, y: [seq] each
    def __len__(self) -> int: ...

def split_tokens(tokens: _Tokens, heldout_fraction: float = 0.1) -> Tuple[Tensor, Tensor]: ...

class Sampler(Generic[T_co]):
    def __init__(self, data_source: Optional[Any] = None) -> None: ...
    def __iter__(self) -> Iterator[T_co]: ...

class SequentialSampler(Sampler[int]):
    data_source: Any
    def __init__(self, data_source: Any) -> None: ...
    def __len__(self) -> int: ...

class RandomSampler(Sampler[int]):
    data_source: Any
    replacement: bool
    seed: Optional[int]
    epoch: int
    generator: None
    def __init__(self, data_source: Any, replacement: bool = False,
                 num_samples: Optional[int] = None, generator: None = None, *,
                 seed: Optional[int] = None) -> None: ...
    @property
    def num_samples(self) -> int: ...
    def set_epoch(self, epoch: int) -> None: ...
    def __len__(self) -> int: ...

class SubsetRandomSampler(Sampler[int]):
    indices: Sequence[int]
    seed: Optional[int]
    epoch: int
    def __init__(self, indices: Sequence[int], generator: None = None, *,
                 seed: Optional[int] = None) -> None: ...
    def set_epoch(self, epoch: int) -> None: ...
    def __len__(self) -> int: ...

class BatchSampler(Sampler[List[int]]):
    sampler: Union[Sampler[int], Iterable[int]]
    batch_size: int
    drop_last: bool
    def __init__(self, sampler: Union[Sampler[int], Iterable[int]], batch_size: int,
                 drop_last: bool) -> None: ...
    def __len__(self) -> int: ...

class DistributedSampler(Sampler[int]):
    dataset: Any
    num_replicas: int
    rank: int
    shuffle: bool
    seed: int
    epoch: int
    drop_last: bool
    batch_size: Optional[int]  # rows per rank per step; None: the DataLoader's
    def __init__(self, dataset: Any, num_replicas: Optional[int] = None,
                 rank: Optional[int] = None, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, *, batch_size: Optional[int] = None) -> None: ...
    @property
    def num_samples(self) -> int: ...
    @property
    def total_size(self) -> int: ...
    def set_epoch(self, epoch: int) -> None: ...
    def __len__(self) -> int: ...

def default_collate(batch: Sequence[Any]) -> Any: ...
def default_convert(data: Any) -> Any: ...
def get_worker_info() -> None: ...

class DataLoader(Generic[T_co]):
    dataset: Any
    batch_size: Optional[int]
    drop_last: bool
    sampler: Any
    batch_sampler: Any
    num_workers: int
    collate_fn: Callable[[Any], Any]
    seed: Optional[int]
    generator: None
    pin_memory: bool
    timeout: float
    def __init__(self, dataset: Any, batch_size: Optional[int] = 1,
                 shuffle: Optional[bool] = None, sampler: Optional[Any] = None,
                 batch_sampler: Optional[Any] = None, num_workers: int = 0,
                 collate_fn: Optional[Callable[[Any], Any]] = None, pin_memory: bool = False,
                 drop_last: bool = False, timeout: float = 0,
                 worker_init_fn: None = None, multiprocessing_context: Any = None,
                 generator: None = None, *, prefetch_factor: Optional[int] = None,
                 persistent_workers: bool = False, pin_memory_device: str = "",
                 seed: Optional[int] = None) -> None: ...
    def __iter__(self) -> Iterator[Any]: ...
    def __len__(self) -> int: ...
