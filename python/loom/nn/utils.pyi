from typing import Iterable, Optional, Union

from loom import Tensor
from loom.distributed import Communicator

def clip_grad_norm_(parameters: Union[Tensor, Iterable[Tensor]], max_norm: float,
                    norm_type: float = 2.0, *, pp_group: Optional[Communicator] = None) -> Tensor: ...
def grad_sum_of_squares(parameters: Union[Tensor, Iterable[Tensor]]) -> float: ...
def clip_grads_to_norm_(parameters: Union[Tensor, Iterable[Tensor]], norm: float,
                        max_norm: float) -> None: ...
