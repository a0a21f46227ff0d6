# Type stubs for loom.optim (hand-written). See python/loom/optim.py.
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from loom import Tensor

class Optimizer:
    param_groups: List[Dict[str, Any]]
    lr: float
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any: ...
    def zero_grad(self, set_to_none: bool = True) -> None: ...
    def state_dict(self) -> Dict[str, Any]: ...
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None: ...

class SGD(Optimizer):
    def __init__(self, params: Iterable[Tensor], lr: float, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = False) -> None: ...

class AdamW(Optimizer):
    def __init__(self, params: Iterable[Tensor], lr: float = 1e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2) -> None: ...

class LrSchedule:
    """Warmup then constant or cosine (optimizer/lr_schedule.h); steps count from 0."""
    class Kind:
        constant: LrSchedule.Kind
        cosine: LrSchedule.Kind
    kind: LrSchedule.Kind
    max_lr: float
    min_lr: float
    warmup_steps: int
    total_steps: int
    @staticmethod
    def constant(lr: float, warmup_steps: int = 0) -> LrSchedule: ...
    @staticmethod
    def cosine(max_lr: float, min_lr: float, warmup_steps: int, total_steps: int) -> LrSchedule: ...
    def lr(self, step: int) -> float: ...
    def __call__(self, step: int) -> float: ...
    def str(self) -> str: ...
