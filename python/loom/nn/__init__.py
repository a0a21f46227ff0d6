"""loom.nn: modules (``loom.nn.Module`` to subclass, and the built-in C++ ones), Parameter,
containers, activations, RMSNorm, losses, ``loom.nn.functional`` and ``loom.nn.utils``.

Differences from torch.nn worth knowing: built-in modules are initialised at construction with
seed 0 under their own names; ``model.init_parameters(seed)`` on the root re-keys them by full
name (loom's deterministic init). ``named_parameters()`` lists own parameters, then children's.
A built-in (C++) module keeps its own tensors: assigning ``loom.nn.Parameter(t)`` to its weight
copies t's values, and two built-in modules cannot share one tensor (modules.py).
``F.gelu`` defaults to the tanh approximation while ``nn.GELU()`` is exact, as PyTorch's; and
``F.scaled_dot_product_attention`` is causal by default when no mask is given
(loom.nn.functional's docstring lists every difference).
"""

from loom import _loom
from loom.nn import functional, utils  # noqa: F401
from loom.nn.activation import (  # noqa: F401
    GELU,
    Flatten,
    Identity,
    LogSoftmax,
    ReLU,
    Sigmoid,
    SiLU,
    Softmax,
    Tanh,
)
from loom.nn.loss import (  # noqa: F401
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    L1Loss,
    MSELoss,
    NLLLoss,
    SmoothL1Loss,
)
from loom.nn.module import (  # noqa: F401
    Module,
    ModuleDict,
    ModuleList,
    Parameter,
    ParameterDict,
    ParameterList,
    Sequential,
)
from loom.nn.normalization import RMSNorm  # noqa: F401
from loom.nn.modules import (  # noqa: F401
    GPT,
    Block,
    CausalSelfAttention,
    Dropout,
    Embedding,
    EmbeddingBagCollection,
    GPTConfig,
    LayerNorm,
    Linear,
    MLP,
    MoE,
    MoEConfig,
)

from loom.nn.tensor_parallel import (  # noqa: F401
    ColumnParallelLinear,
    RowParallelLinear,
    TensorParallelGPT,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)

set_dropout_seed = _loom.nn.set_dropout_seed
from loom.nn._dropout import dropout_step, set_dropout_batch_part, set_dropout_step  # noqa: E402

__all__ = [
    "functional", "utils", "Module", "ModuleList", "ModuleDict", "Sequential", "Parameter",
    "ParameterList", "ParameterDict", "Linear", "LayerNorm", "Embedding", "Dropout", "RMSNorm",
    "Identity", "ReLU", "GELU", "SiLU", "Tanh", "Sigmoid", "Softmax", "LogSoftmax", "Flatten",
    "CrossEntropyLoss", "NLLLoss", "MSELoss", "L1Loss", "SmoothL1Loss", "BCEWithLogitsLoss",
    "MLP", "MoE", "MoEConfig", "CausalSelfAttention", "Block", "GPT", "GPTConfig", "EmbeddingBagCollection",
    "ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding", "TensorParallelGPT",
    "vocab_parallel_cross_entropy", "set_dropout_seed", "set_dropout_step", "dropout_step",
    "set_dropout_batch_part",
]
