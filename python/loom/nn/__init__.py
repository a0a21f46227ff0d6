"""loom.nn: modules (``loom.nn.Module`` to subclass, and the built-in C++ ones), Parameter,
``loom.nn.functional`` and ``loom.nn.utils``.

Differences from torch.nn worth knowing: built-in modules are initialised at construction with
seed 0 under their own names; ``model.init_parameters(seed)`` on the root re-keys them by full
name (loom's deterministic init). ``named_parameters()`` lists own parameters, then children's.
"""

from loom import _loom
from loom.nn import functional, utils  # noqa: F401
from loom.nn.module import Module, ModuleList, Parameter, Sequential  # noqa: F401
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
    "functional", "utils", "Module", "ModuleList", "Sequential", "Parameter", "Linear", "LayerNorm", "Embedding", "Dropout",
    "MLP", "CausalSelfAttention", "Block", "GPT", "GPTConfig", "EmbeddingBagCollection",
    "ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding", "TensorParallelGPT",
    "vocab_parallel_cross_entropy", "set_dropout_seed", "set_dropout_step", "dropout_step",
    "set_dropout_batch_part",
]
