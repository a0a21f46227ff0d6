"""loom.data (python/src/data.cpp): the bound data is what loom-gpt and loom-dlrm read.

The addition task's examples parse back to true sums and avoid the held-out split; BatchLoader's
batches follow Note [Batch order] (closed form over the stream); answer-only masking keeps exactly
the answer digits and end tokens; exact match scores an oracle 100% and a shifted oracle 0%
through a Python callable; loom.optim.LrSchedule against the formulas of lr_schedule.h; the click
data is deterministic, a rank's share equals the slice of the whole batch, and its CSR layout and
Bayes figures are consistent; token and text files round-trip; bad arguments raise ValueError or
TypeError naming the problem; loom.nn.functional.dot_interaction against numpy (values, gradient).
Also loom.distributed.ShardedEmbeddingBagCollection on one process (python/src/sharded.cpp)
against loom.nn.EmbeddingBagCollection: same values and gradients.
"""

import math

import numpy as np
import pytest

import loom
import loom.data as data
import loom.nn as nn
import loom.nn.functional as F
from binding_testing import check_grad
from loom.distributed.embedding import (
    EmbeddingPlacement,
    EmbeddingSharding,
    ShardedEmbeddingBagCollection,
    placements_for,
)

# ---------------------------------------------------------------- addition task


def test_addition_task_format():
    task = data.AdditionTask(digits=3, seed=1337)
    assert task.example_len == 13 and task.answer_digits == 4
    assert data.AdditionTask.decode(task.encode_example(123, 45)) == "123+045=8610\n"
    assert data.AdditionTask.encode("123+045=8610\n") == task.encode_example(123, 45)
    assert (data.AdditionTask.PLUS, data.AdditionTask.EQUALS, data.AdditionTask.END) == (10, 11, 12)
    assert (data.AdditionTask.VOCAB, data.AdditionTask.PADDED_VOCAB) == (14, 16)
    e = task.parse_example(task.encode_example(999, 1))
    assert (e.a, e.b, e.sum) == (999, 1, 1000)
    # The split is symmetric and does not depend on the seed.
    other = data.AdditionTask(data.AdditionOptions(digits=3, seed=7))
    for a, b in [(1, 2), (123, 45), (500, 999), (17, 83)]:
        assert task.is_heldout(a, b) == task.is_heldout(b, a) == other.is_heldout(a, b)


def test_addition_train_stream_examples_are_true_training_sums():
    task = data.AdditionTask(digits=2, seed=5)
    n = 300
    stream = task.train_stream(n)
    assert stream.dtype == loom.int32 and tuple(stream.shape) == (n * task.example_len,)
    toks = stream.tolist()
    L = task.example_len
    for i in range(n):
        e = task.parse_example(toks[i * L:(i + 1) * L])
        assert e.a + e.b == e.sum and not task.is_heldout(e.a, e.b)
    assert task.train_stream(n).tolist() == toks  # deterministic in the seed
    assert data.AdditionTask(digits=2, seed=6).train_stream(n).tolist() != toks


def test_batch_loader_follows_llmc_order():
    tokens = list(range(1, 1001))  # n = 1000
    B, T = 3, 16
    loader = data.BatchLoader(tokens, B, T, "ramp")
    m = (len(tokens) - 1) // (B * T)
    assert loader.batches_per_pass == m and loader.batch == B and loader.seq == T
    tok = np.array(tokens)
    for k in range(2 * m + 3):
        b = loader.next_batch()
        p = (k % m) * B * T
        want = tok[p:p + B * T + 1]
        np.testing.assert_array_equal(b.inputs.numpy(), want[:-1].reshape(B, T))
        np.testing.assert_array_equal(b.targets.numpy(), want[1:].reshape(B, T))
        x, y = loader.batch_at(k)
        np.testing.assert_array_equal(x.numpy(), b.inputs.numpy())
        np.testing.assert_array_equal(y.numpy(), b.targets.numpy())
    assert loader.index == 2 * m + 3
    loader.reset()
    assert loader.index == 0
    # An i32 tensor, an i64 tensor and a list give the same loader.
    t64 = loom.tensor(np.array(tokens, dtype=np.int64))
    assert data.BatchLoader(t64, B, T).batch_at(2).inputs.tolist() == \
        loader.batch_at(2).inputs.tolist()


def test_masking_keeps_answers_and_ends_only():
    D = 3
    task = data.AdditionTask(digits=D, seed=1337)
    L = task.example_len
    loader = data.BatchLoader(task.train_stream(200), 4, 2 * L)
    b = loader.next_batch()
    before = b.targets.numpy().copy()
    out = task.mask_non_answer_targets(b.targets)
    after = b.targets.numpy()
    np.testing.assert_array_equal(out.numpy(), after)  # in place, and returned
    t = np.arange(2 * L)
    keep = ((t + 1) % L) >= 2 * D + 2  # the target is a sum digit or an example's end
    np.testing.assert_array_equal(after[:, keep], before[:, keep])
    assert (after[:, ~keep] == data.AdditionTask.IGNORE_TARGET).all()
    with pytest.raises(ValueError, match="sequence length"):
        task.mask_non_answer_targets(data.BatchLoader(task.train_stream(50), 2, L + 1)
                                     .next_batch().targets)


def _oracle(rows, shift=0, vocab=16):
    """logits_of for evaluate_exact_match over `rows` (the set's tokens, read in call order):
    one-hot of the true next token, digits moved by `shift` (mod 10). Records each call's rows."""
    calls = []

    def logits_of(inputs):
        n, t = inputs.shape
        start = sum(calls)
        calls.append(n)
        np.testing.assert_array_equal(inputs.numpy(), rows[start:start + n, :t])
        nxt = rows[start:start + n, 1:t + 1]
        nxt = np.where(nxt < 10, (nxt + shift) % 10, nxt)
        out = np.zeros((n, t, vocab), dtype=np.float32)
        np.put_along_axis(out, nxt[..., None], 1.0, axis=2)
        return loom.tensor(out)

    return calls, logits_of


def test_evaluate_exact_match_with_a_python_callable():
    task = data.AdditionTask(digits=2, seed=1)
    held = task.heldout_set(40, examples_per_row=2)
    assert held.num_examples == 40 and held.rows == 20 and held.answer_digits == 3
    full = held.tokens.numpy()
    toks = full.reshape(-1).tolist()
    L = task.example_len
    pairs = set()
    for i in range(40):
        e = task.parse_example(toks[i * L:(i + 1) * L])
        assert task.is_heldout(e.a, e.b) and e.a + e.b == e.sum
        pairs.add((e.a, e.b))
    assert len(pairs) == 40  # distinct

    calls, fn = _oracle(full)
    em = data.evaluate_exact_match(held, fn, 6)
    assert (em.correct, em.total) == (40, 40) and em.accuracy == 1.0
    assert calls == [6, 6, 6, 2]  # chunks of at most rows_per_call rows
    _, wrong = _oracle(full, shift=1)
    assert data.evaluate_exact_match(held, wrong, 20).correct == 0
    # score_exact_match on precomputed logits agrees.
    _, fn = _oracle(full)
    logits = fn(loom.tensor(full[:, :held.input_len]))
    assert data.score_exact_match(held, logits).correct == 40

    with pytest.raises(TypeError, match="must return a loom.Tensor"):
        data.evaluate_exact_match(held, lambda x: 3, 4)
    with pytest.raises(ZeroDivisionError):
        data.evaluate_exact_match(held, lambda x: 1 / 0, 4)


def test_addition_errors():
    with pytest.raises(ValueError, match="digits must be 1..9"):
        data.AdditionTask(digits=0)
    with pytest.raises(ValueError, match="a batch of 2 x 8 needs 17"):
        data.BatchLoader([1, 2, 3], 2, 8, "tiny")
    with pytest.raises(ValueError, match="batch size and sequence length"):
        data.BatchLoader(list(range(100)), 0, 8)
    with pytest.raises(TypeError, match="BatchLoader: expected an int32 or int64 tensor"):
        data.BatchLoader(loom.ones(100), 2, 8)
    with pytest.raises(ValueError, match="token 20 at position 3"):
        data.check_token_range([1, 2, 3, 20], 16, "x")


# ---------------------------------------------------------------- files


def test_token_and_text_files(tmp_path):
    path = str(tmp_path / "t.bin")
    data.write_token_file(path, [0, 5, 65535, 7])
    got = data.read_token_file(path)
    assert got.dtype == loom.int32 and got.tolist() == [0, 5, 65535, 7]
    with pytest.raises(ValueError):
        data.write_token_file(str(tmp_path / "bad.bin"), [70000])
    with pytest.raises(ValueError, match="missing.bin"):
        data.read_token_file(str(tmp_path / "missing.bin"))
    text = tmp_path / "a.txt"
    text.write_bytes(b"hi\xff")
    assert data.read_text_file(str(text)).tolist() == [104, 105, 255]
    assert data.tokens_to_text(data.text_to_tokens("abc")) == b"abc"
    assert data.BYTE_VOCAB == 256


# ---------------------------------------------------------------- lr schedules


def test_lr_schedule_formulas():
    s = loom.optim.LrSchedule.cosine(6e-4, 6e-5, warmup_steps=10, total_steps=100)
    for step in [0, 3, 9, 10, 11, 50, 99, 100, 150]:
        if step < 10:
            want = 6e-4 * (step + 1) / 10
        else:
            r = min(1.0, (step - 10) / 90)
            want = 6e-5 + 0.5 * (1 + math.cos(math.pi * r)) * (6e-4 - 6e-5)
        assert s.lr(step) == pytest.approx(want, rel=1e-12, abs=0)
        assert s(step) == s.lr(step)
    c = loom.optim.LrSchedule.constant(1e-3, warmup_steps=4)
    assert [c.lr(i) for i in range(6)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
    assert c.kind == loom.optim.LrSchedule.Kind.constant and s.total_steps == 100
    assert str(c) == c.str() == "constant 0.001 (warmup 4)"
    with pytest.raises(ValueError, match="must exceed warmup steps"):
        loom.optim.LrSchedule.cosine(1.0, 0.1, 10, 10)
    with pytest.raises(ValueError, match="min_lr <= max_lr"):
        loom.optim.LrSchedule.cosine(0.1, 1.0, 0, 10)
    with pytest.raises(ValueError, match="step must be >= 0"):
        c.lr(-1)


# ---------------------------------------------------------------- click data


def _arrays(b):
    return [t.numpy().copy() for t in (b.dense, b.indices, b.offsets, b.labels, b.probabilities)]


def test_click_data_deterministic_and_rank_shares():
    config = data.ClickDataConfig(seed=99, batch_size=8, table_rows=[30, 7, 100])
    d1, d2 = data.ClickDataset(config), data.ClickDataset(config)
    assert d1.num_tables == 3 and d1.config.table_rows == [30, 7, 100]
    for split in ("train", "eval"):
        for x, y in zip(_arrays(d1.batch(split, 2)), _arrays(d2.batch(split, 2))):
            np.testing.assert_array_equal(x, y)
    assert not np.array_equal(d1.batch("train", 0).dense.numpy(),
                              d1.batch("eval", 0).dense.numpy())
    other = data.ClickDataset(data.ClickDataConfig(seed=100, batch_size=8, table_rows=[30, 7, 100]))
    assert not np.array_equal(d1.batch("train", 0).dense.numpy(),
                              other.batch("train", 0).dense.numpy())

    # Batch 1 is examples [8, 16); a rank's half [12, 16) is the same slice of it.
    whole, half = d1.batch("train", 1), d1.examples("train", 12, 4)
    np.testing.assert_array_equal(half.dense.numpy(), whole.dense.numpy()[4:])
    np.testing.assert_array_equal(half.labels.numpy(), whole.labels.numpy()[4:])
    B, T = 8, 3
    wi, wo = whole.indices.numpy(), whole.offsets.numpy()
    hi, ho = half.indices.numpy(), half.offsets.numpy()
    for t in range(T):
        for b in range(4):
            np.testing.assert_array_equal(hi[ho[t * 4 + b]:ho[t * 4 + b + 1]],
                                          wi[wo[t * B + 4 + b]:wo[t * B + 4 + b + 1]])


def test_click_batch_layout_and_ceiling():
    config = data.ClickDataConfig(seed=3, batch_size=64, max_bag_size=3)
    d = data.ClickDataset(config)
    b = d.batch("train", 0)
    B, T = 64, len(config.table_rows)
    assert b.batch_size == B
    assert tuple(b.dense.shape) == (B, 13) and b.dense.dtype == loom.float32
    assert b.indices.dtype == loom.int64 and b.offsets.dtype == loom.int64
    off, idx = b.offsets.numpy(), b.indices.numpy()
    assert off.shape == (T * B + 1,) and off[0] == 0 and off[-1] == idx.shape[0]
    lengths = np.diff(off)
    assert lengths.min() >= 1 and lengths.max() <= 3
    for t, rows in enumerate(config.table_rows):
        bag = idx[off[t * B]:off[(t + 1) * B]]
        assert bag.min() >= 0 and bag.max() < rows
    assert set(np.unique(b.labels.numpy())) <= {0.0, 1.0}
    p = b.probabilities.numpy()
    assert ((p > 0) & (p < 1)).all()

    c = d.ceiling(4096)
    assert c.num_examples == 4096
    ev = d.batch("eval", 0)  # the ceiling is over eval examples [0, 4096): batch 0 included
    p = ev.probabilities.tolist()
    assert data.bayes_accuracy(p) == pytest.approx(np.mean(np.maximum(p, 1 - np.array(p))),
                                                   rel=1e-6)
    assert 0.6 < c.accuracy < 1 and 0.6 < c.auc < 1 and 0.3 < c.positive_rate < 0.7


def test_auc_closed_forms():
    assert data.auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    assert data.auc(loom.tensor([1.0, 2.0, 3.0]), loom.tensor([0.0, 1.0, 1.0])) == 1.0
    assert data.auc([0.5, 0.5], [0, 1]) == 0.5  # a tie counts one half
    assert data.bayes_accuracy([0.9, 0.2]) == pytest.approx(0.85)


def test_click_data_errors():
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        data.ClickDataset(data.ClickDataConfig(batch_size=0))
    with pytest.raises(ValueError, match="table 1 must have at least one"):
        data.ClickDataset(data.ClickDataConfig(table_rows=[5, 0]))
    with pytest.raises(ValueError, match="split must be 'train' or 'eval'"):
        data.ClickDataset().batch("test", 0)
    with pytest.raises(ValueError, match="batch index must be >= 0"):
        data.ClickDataset().batch("train", -1)
    with pytest.raises(TypeError):
        data.ClickDataConfig(12)  # keyword-only


# ---------------------------------------------------------------- DLRM's interaction op


def test_dot_interaction_lower_triangle_and_gradient():
    def reference(x):  # the strictly lower triangle of x x^T, row by row: (1,0), (2,0), (2,1), ...
        gram = np.einsum("bfd,bgd->bfg", x, x)
        f = x.shape[1]
        return np.stack([gram[:, i, j] for i in range(f) for j in range(i)], axis=1)

    x = np.random.default_rng(0).standard_normal((3, 4, 5))
    check_grad(F.dot_interaction, reference, [x])
    assert tuple(F.dot_interaction(loom.ones(2, 9, 4)).shape) == (2, 36)


# ---------------------------------------------------------------- sharded tables on one process


def _bags(rows, B, seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 4, size=len(rows) * B)
    idx = np.concatenate([rng.integers(0, rows[i // B], size=n) for i, n in enumerate(lengths)])
    off = np.concatenate([[0], np.cumsum(lengths)])
    return loom.tensor(idx.astype(np.int64)), loom.tensor(off.astype(np.int64))


@pytest.mark.parametrize("placement", ["table", "row", "column", "data"])
def test_sharded_collection_on_one_process_equals_ebc(placement):
    tables = [("t0", 20, 8), ("t1", 5, 4), ("t2", 33, 8)]
    rows = [r for _, r, _ in tables]
    ebc = nn.EmbeddingBagCollection(tables).init_parameters(seed=7)
    sharded = ShardedEmbeddingBagCollection(tables, [placement] * 3).init_parameters(seed=7)
    assert [n for n, _ in sharded.named_parameters()] == [n for n, _ in ebc.named_parameters()]
    for (_, a), (_, b) in zip(sharded.named_parameters(), ebc.named_parameters()):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())
    assert [p.kind.name for p in sharded.placements] == [placement] * 3

    idx, off = _bags(rows, 6, seed=1)
    w = loom.tensor(np.random.default_rng(2).standard_normal((6, 20)).astype(np.float32))
    ys = sharded(idx, off)
    ye = ebc(idx, off)
    np.testing.assert_allclose(ys.detach().numpy(), ye.detach().numpy(), rtol=0, atol=1e-6)
    (ys * w).sum().backward()
    (ye * w).sum().backward()
    sharded.finish_gradients()
    for (n, a), (_, b) in zip(sharded.named_parameters(), ebc.named_parameters()):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=0, atol=1e-6, err_msg=n)


def test_sharded_collection_in_a_python_module_and_errors():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = ShardedEmbeddingBagCollection([("a", 10, 4)], [("table", 0)])
            self.fc = nn.Linear(4, 1)

        def forward(self, idx, off):
            return self.fc(self.emb(idx, off))

    m = Model().init_parameters(seed=3)
    assert [n for n, _ in m.named_parameters()] == ["emb.a.weight", "fc.weight", "fc.bias"]
    assert m(*_bags([10], 3, seed=0)).shape == (3, 1)
    assert m.emb.placements[0].rank == 0 and m.emb.shards[0].rows == 10

    assert placements_for("auto", [1000, 50]) == ["table", "data"]
    assert placements_for("row", [1, 2]) == ["row", "row"]
    with pytest.raises(ValueError,
                       match="sharding must be 'table', 'row', 'column' or 'data', got 'rows'"):
        placements_for("rows", [1])
    with pytest.raises(ValueError, match="2 placements for 1 tables"):
        ShardedEmbeddingBagCollection([("a", 10, 4)], ["row", "row"])
    with pytest.raises(ValueError, match="got 'diagonal'"):
        ShardedEmbeddingBagCollection([("a", 10, 4)], ["diagonal"])
    with pytest.raises(ValueError, match="ShardedEmbeddingBagCollection: pooling must be 'sum', "
                       "'mean' or 'none', got 'max'"):
        ShardedEmbeddingBagCollection([("a", 10, 4)], ["row"], pooling="max")
    with pytest.raises(ValueError, match="pooling must be sum or mean"):  # C++: none is unsharded
        ShardedEmbeddingBagCollection([("a", 10, 4)], ["row"], pooling="none")
    assert EmbeddingPlacement("data").kind == EmbeddingSharding.data
