# Type stubs for loom.optim.lr_scheduler (hand-written). See python/loom/optim/lr_scheduler.py.
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from loom.optim import Optimizer

class LRScheduler:
    optimizer: Optimizer
    base_lrs: List[float]
    last_epoch: int
    verbose: bool
    def __init__(self, optimizer: Optimizer, last_epoch: int = -1,
                 verbose: bool = False) -> None: ...
    def get_lr(self) -> List[float]: ...
    def get_last_lr(self) -> List[float]: ...
    def step(self, epoch: Optional[int] = None) -> None: ...
    # Plain data (numbers, lists, strings, dicts): round-trips through JSON.
    def state_dict(self) -> Dict[str, Any]: ...
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None: ...

_LRScheduler = LRScheduler

class LambdaLR(LRScheduler):
    lr_lambdas: List[Callable[[int], float]]
    def __init__(self, optimizer: Optimizer,
                 lr_lambda: Union[Callable[[int], float], Sequence[Callable[[int], float]]],
                 last_epoch: int = -1, verbose: bool = False) -> None: ...

class StepLR(LRScheduler):
    step_size: int
    gamma: float
    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1,
                 last_epoch: int = -1, verbose: bool = False) -> None: ...

class LinearLR(LRScheduler):
    start_factor: float
    end_factor: float
    total_iters: int
    def __init__(self, optimizer: Optimizer, start_factor: float = ..., end_factor: float = 1.0,
                 total_iters: int = 5, last_epoch: int = -1, verbose: bool = False) -> None: ...

class CosineAnnealingLR(LRScheduler):
    T_max: int
    eta_min: float
    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0,
                 last_epoch: int = -1, verbose: bool = False) -> None: ...

class SequentialLR(LRScheduler):
    def __init__(self, optimizer: Optimizer, schedulers: Sequence[LRScheduler],
                 milestones: Sequence[int], last_epoch: int = -1,
                 verbose: bool = False) -> None: ...
    def step(self) -> None: ...  # type: ignore[override]

class OneCycleLR(LRScheduler):
    total_steps: int
    anneal_strategy: str
    cycle_momentum: bool
    use_beta1: bool
    def __init__(self, optimizer: Optimizer, max_lr: Union[float, Sequence[float]],
                 total_steps: Optional[int] = None, epochs: Optional[int] = None,
                 steps_per_epoch: Optional[int] = None, pct_start: float = 0.3,
                 anneal_strategy: str = "cos", cycle_momentum: bool = True,
                 base_momentum: Union[float, Sequence[float]] = 0.85,
                 max_momentum: Union[float, Sequence[float]] = 0.95, div_factor: float = 25.0,
                 final_div_factor: float = 1e4, three_phase: bool = False,
                 last_epoch: int = -1, verbose: bool = False) -> None: ...
