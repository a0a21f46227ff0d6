"""loom.data: loom's built-in data, the same C++ code loom-gpt and loom-dlrm read.

- ``AdditionTask``: multi-digit addition with the sum reversed, loom-gpt's default task
  (core/io/addition_task.h), its held-out split and exact-match metric.
- ``BatchLoader``: batches from a token stream in llm.c's order (core/io/batch_loader.h).
- ``read_token_file`` / ``write_token_file`` (llm.c ``.bin``), ``read_text_file`` (bytes as tokens).
- ``ClickDataset``: loom-dlrm's synthetic click logs with a known Bayes ceiling
  (core/io/click_data.h), and ``auc`` / ``bayes_accuracy`` / ``bayes_auc``.

loom-gpt's default batches, read in Python::

    import loom.data as data

    task = data.AdditionTask(digits=3, seed=1337)
    loader = data.BatchLoader(task.train_stream(1000), batch=32, seq=task.example_len)
    b = loader.next_batch()
    task.mask_non_answer_targets(b.targets)      # loss on the answers only
    em = data.evaluate_exact_match(task.heldout_set(1000), lambda x: model(x), 32)

Token streams are i32 loom tensors; functions that take one also accept an int64 tensor or a
list of ints.
"""

from loom._loom.data import (  # noqa: F401
    BYTE_VOCAB,
    AdditionEvalSet,
    AdditionExample,
    AdditionOptions,
    AdditionTask,
    Batch,
    BatchLoader,
    ClickBatch,
    ClickCeiling,
    ClickDataConfig,
    ClickDataset,
    ExactMatch,
    auc,
    bayes_accuracy,
    bayes_auc,
    check_token_range,
    evaluate_exact_match,
    read_text_file,
    read_token_file,
    score_exact_match,
    text_to_tokens,
    tokens_to_text,
    write_token_file,
)

__all__ = [
    "AdditionOptions", "AdditionTask", "AdditionEvalSet", "AdditionExample", "ExactMatch",
    "score_exact_match", "evaluate_exact_match", "Batch", "BatchLoader", "check_token_range",
    "read_token_file", "write_token_file", "read_text_file", "text_to_tokens", "tokens_to_text",
    "BYTE_VOCAB", "ClickDataConfig", "ClickBatch", "ClickCeiling", "ClickDataset", "auc",
    "bayes_accuracy", "bayes_auc",
]
