# Type stubs for loom.data (hand-written). See python/loom/data.py and python/src/data.cpp.
from typing import Callable, Iterator, List, Optional, Sequence, Union

from loom import Tensor

_Tokens = Union[Tensor, Sequence[int]]  # i32 / i64 tensor or a list of ints

BYTE_VOCAB: int

class AdditionOptions:
    digits: int
    seed: int
    heldout_percent: int
    def __init__(self, digits: int = 3, seed: int = 1337, heldout_percent: int = 10) -> None: ...

class AdditionEvalSet:
    tokens: Tensor  # i32 [rows, examples_per_row * example_len]
    examples_per_row: int
    answer_digits: int
    answer_positions: List[int]
    rows: int
    num_examples: int
    input_len: int

class ExactMatch:
    correct: int
    total: int
    accuracy: float

class AdditionExample:
    a: int
    b: int
    sum: int

class AdditionTask:
    PLUS: int
    EQUALS: int
    END: int
    PAD: int
    VOCAB: int
    PADDED_VOCAB: int
    IGNORE_TARGET: int
    options: AdditionOptions
    digits: int
    example_len: int
    answer_digits: int
    def __init__(self, options: Optional[AdditionOptions] = None, *, digits: Optional[int] = None,
                 seed: Optional[int] = None, heldout_percent: Optional[int] = None) -> None: ...
    def is_heldout(self, a: int, b: int) -> bool: ...
    def encode_example(self, a: int, b: int) -> List[int]: ...
    def parse_example(self, tokens: _Tokens) -> AdditionExample: ...
    def train_stream(self, num_examples: int) -> Tensor: ...
    def mask_non_answer_targets(self, targets: Tensor) -> Tensor: ...
    def heldout_set(self, num_examples: int, examples_per_row: int = 1) -> AdditionEvalSet: ...
    @staticmethod
    def decode(tokens: Sequence[int]) -> str: ...
    @staticmethod
    def encode(text: str) -> List[int]: ...

def score_exact_match(set: AdditionEvalSet, logits: Tensor, first_row: int = 0) -> ExactMatch: ...
def evaluate_exact_match(set: AdditionEvalSet, logits_of: Callable[[Tensor], Tensor],
                         rows_per_call: int) -> ExactMatch: ...

class Batch:
    inputs: Tensor   # i32 [B, T]
    targets: Tensor  # i32 [B, T]
    def __iter__(self) -> Iterator[Tensor]: ...

class BatchLoader:
    index: int
    batches_per_pass: int
    batch: int
    seq: int
    num_tokens: int
    def __init__(self, tokens: _Tokens, batch: int, seq: int, name: str = "") -> None: ...
    def next_batch(self) -> Batch: ...
    def batch_at(self, k: int) -> Batch: ...
    def reset(self) -> None: ...
    def seek(self, k: int) -> None: ...
    def tokens(self) -> Tensor: ...

def check_token_range(tokens: _Tokens, vocab: int, name: str = "") -> None: ...
def read_token_file(path: str) -> Tensor: ...
def write_token_file(path: str, tokens: _Tokens) -> None: ...
def read_text_file(path: str) -> Tensor: ...
def text_to_tokens(text: str) -> Tensor: ...
def tokens_to_text(tokens: _Tokens) -> bytes: ...

class ClickDataConfig:
    seed: int
    num_dense: int
    table_rows: List[int]
    batch_size: int
    max_bag_size: int
    bias: float
    dense_variance: float
    categorical_variance: float
    interaction_variance: float
    latent_dim: int
    def __init__(self, *, seed: int = 1234, num_dense: int = 13,
                 table_rows: Sequence[int] = ..., batch_size: int = 128, max_bag_size: int = 3,
                 bias: float = 0.0, dense_variance: float = 2.0,
                 categorical_variance: float = 3.0, interaction_variance: float = 1.0,
                 latent_dim: int = 4) -> None: ...

class ClickBatch:
    dense: Tensor          # f32 [B, num_dense]
    indices: Tensor        # i64 [N]
    offsets: Tensor        # i64 [T*B + 1], feature-major CSR
    labels: Tensor         # f32 [B]
    probabilities: Tensor  # f32 [B], the hidden p
    batch_size: int

class ClickCeiling:
    accuracy: float
    auc: float
    positive_rate: float
    num_examples: int

class ClickDataset:
    config: ClickDataConfig
    num_tables: int
    def __init__(self, config: Optional[ClickDataConfig] = None) -> None: ...
    def batch(self, split: str, index: int) -> ClickBatch: ...  # split: "train" or "eval"
    def examples(self, split: str, first: int, count: int) -> ClickBatch: ...
    def ceiling(self, num_examples: int = 262144) -> ClickCeiling: ...

def auc(scores: Union[Tensor, Sequence[float]],
        labels: Union[Tensor, Sequence[float]]) -> float: ...
def bayes_accuracy(p: Sequence[float]) -> float: ...
def bayes_auc(p: Sequence[float]) -> float: ...
