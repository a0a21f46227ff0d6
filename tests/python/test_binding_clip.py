"""loom.nn.utils.clip_grad_norm_ as the one clipping call (Note [One clip_grad_norm_] in
loom/nn/utils.py), on one process: what it refuses with a clear error rather than returning a
stage's or a shard's local norm. Its norms across layouts are checked under mpirun
(mpi_parallel_check.py; train_gpt_check.py runs examples/train_gpt.py, which clips with it in
every layout, against loom-gpt)."""
import numpy as np
import pytest

import loom
import loom.distributed as dist
from loom.distributed import pipelining

CONFIG = dict(max_seq_len=8, vocab=32, padded_vocab=32, layers=2, heads=2, channels=16)


def tokens():
    rng = np.random.default_rng(0)
    return (loom.tensor(rng.integers(0, 32, (2, 8)).astype(np.int64)),
            loom.tensor(rng.integers(0, 32, (2, 8)).astype(np.int64)))


def test_a_pipeline_stage_needs_its_pipeline_group():
    stage = pipelining.GPTStage(loom.nn.GPTConfig(**CONFIG), 0, 2).init_parameters(seed=1)
    idx, _ = tokens()
    stage(idx).sum().backward()
    with pytest.raises(ValueError, match=r"a GPTStage of 2 stages\): pass pp_group="):
        loom.nn.utils.clip_grad_norm_(stage.parameters(), 1.0)
    # With the (one-rank) pipeline group it is the stage's own norm: nothing to add.
    want = np.sqrt(sum(float((p.grad.numpy().astype(np.float64) ** 2).sum())
                       for p in stage.parameters()))
    got = loom.nn.utils.clip_grad_norm_(stage.parameters(), 1e9, pp_group=dist.world()).item()
    assert got == pytest.approx(want, rel=1e-6)


def test_the_last_stage_does_not_count_its_copy_of_the_tied_wte():
    config = loom.nn.GPTConfig(**CONFIG)
    last = pipelining.GPTStage(config, 1, 2).init_parameters(seed=1)
    hidden = loom.randn(2, 8, 16)
    idx, targets = tokens()
    last.loss(last(hidden), targets).backward()
    want = np.sqrt(sum(float((p.grad.numpy().astype(np.float64) ** 2).sum())
                       for n, p in last.named_parameters() if n != "wte.weight"))
    got = loom.nn.utils.clip_grad_norm_(last.parameters(), 1e9, pp_group=dist.world()).item()
    assert got == pytest.approx(want, rel=1e-6)
    # The stage-list form takes the places from a schedule instead of the stages' own.
    place = pipelining.schedule("1f1b", ranks=2, microbatches=2).chunks[1][0]
    assert (place.pipeline, place.stage) == (0, 1)
    assert pipelining.clip_grad_norm_([last], [place], 1e9, dist.world()) == pytest.approx(
        want, rel=1e-6)
    # Chimera's second pipeline: a replica, clipped but not counted at all.
    replica = pipelining.GPTStage(config, 1, 2, pipeline=1).init_parameters(seed=1)
    replica.loss(replica(hidden), targets).backward()
    assert loom.nn.utils.clip_grad_norm_(replica.parameters(), 1e9,
                                         pp_group=dist.world()).item() == 0.0


def test_zero_parameters_go_to_the_optimizer_and_do_not_mix():
    model = loom.nn.GPT(loom.nn.GPTConfig(**CONFIG), seed=3)
    opt = dist.ZeroRedundancyOptimizer(model, stage=2, lr=1e-3)
    idx, targets = tokens()
    opt.backward(model.loss(idx, targets))
    opt.finish_gradients()
    # Stage 2 keeps the gradients in its shards: the parameters' .grad are not the gradient.
    got = loom.nn.utils.clip_grad_norm_(model.parameters(), 1e9).item()
    assert got == pytest.approx(opt.clip_grad_norm_(1e9), rel=1e-6) and got > 0
    other = loom.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="mix a ZeroRedundancyOptimizer's with others"):
        loom.nn.utils.clip_grad_norm_(list(model.parameters()) + list(other.parameters()), 1.0)
