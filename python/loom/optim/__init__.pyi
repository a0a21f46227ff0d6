# Type stubs for loom.optim (hand-written). See python/loom/optim/__init__.py.
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

from loom import Tensor
from loom.optim import lr_scheduler as lr_scheduler

# params: tensors (one group), or parameter groups: dicts with "params" and options.
Params = Union[Iterable[Tensor], Iterable[Dict[str, Any]]]

class Optimizer:
    defaults: Dict[str, Any]
    # Each a dict: "params", the options, "lr" (writes through), extra keys ("initial_lr").
    param_groups: List[Dict[str, Any]]
    lr: float  # one group only
    def __init__(self, impl: Any, hyper: Dict[str, Any]) -> None: ...
    def add_param_group(self, param_group: Dict[str, Any]) -> None: ...
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any: ...
    def zero_grad(self, set_to_none: bool = True) -> None: ...
    # {"state": {"{i}.{kind}": Tensor}, "param_groups": [{..., "params": [i, ...]}]}
    def state_dict(self) -> Dict[str, Any]: ...
    # Also takes nested lists / numbers for tensors and lists for tuples (JSON).
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None: ...

class SGD(Optimizer):
    def __init__(self, params: Params, lr: float, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = False) -> None: ...

class Adam(Optimizer):
    def __init__(self, params: Params, lr: float = 1e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0) -> None: ...

class AdamW(Optimizer):
    def __init__(self, params: Params, lr: float = 1e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2) -> None: ...

# A bf16 or f16 model with f32 masters, over AdamW or SGD (optimizer/mixed_precision.h).
class MixedPrecisionOptimizer(Optimizer):
    def __init__(self, params: Iterable[Tensor], optimizer_class: Optional[type] = ..., *,
                 loss_scale: Union[None, str, float] = ..., growth_factor: float = ...,
                 backoff_factor: float = ..., growth_interval: int = ...,
                 **optimizer_kwargs: Any) -> None: ...
    def scale_loss(self, loss: Tensor) -> Tensor: ...
    def unscale_gradients(self) -> bool: ...
    def clip_grad_norm_(self, max_norm: float) -> float: ...
    @property
    def scale(self) -> float: ...
    @property
    def last_step_skipped(self) -> bool: ...

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
