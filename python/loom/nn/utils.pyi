from typing import Iterable, Union

from loom import Tensor

def clip_grad_norm_(parameters: Union[Tensor, Iterable[Tensor]], max_norm: float,
                    norm_type: float = 2.0) -> Tensor: ...
