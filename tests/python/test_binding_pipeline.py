"""loom.distributed.pipelining on one process: schedules (generation, the text form, bad names),
the validator against the closed forms (GPipe's and 1F1B's bubble (p-1)/(m+p-1), GPipe's m and
1F1B's p - r peak activations) and a deadlock it must name, the GPT stage partition and names,
and the executor on a world of one running a Python-defined loom.nn.Module as its single stage:
its loss and gradients equal the plain forward/backward of the whole batch, and an exception
raised in the Python forward comes out of run()."""

import gc

import numpy as np
import pytest

import loom
import loom.distributed as dist
import loom.nn as nn
import loom.nn.functional as F
from loom.distributed import pipelining


# ---------------------------------------------------------------- schedules and the validator

@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (3, 5)])
def test_gpipe_bubble_and_activations(p, m):
    s = pipelining.schedule("gpipe", ranks=p, microbatches=m)
    assert (s.name, s.ranks, s.stages, s.pipelines, s.microbatches) == ("gpipe", p, p, 1, m)
    assert [[(c.pipeline, c.stage) for c in r] for r in s.chunks] == [[(0, r)] for r in range(p)]
    sim = pipelining.validate(s)
    assert sim.makespan == pytest.approx(2 * (m + p - 1))
    for r in range(p):
        assert sim.ranks[r].bubble == pytest.approx((p - 1) / (m + p - 1))
        assert sim.ranks[r].busy == pytest.approx(2 * m)
    assert sim.peak_activations == [m] * p  # GPipe keeps every micro-batch's activations
    assert sim.report().splitlines()[0].startswith("rank 0")


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8)])
def test_1f1b_bubble_and_activations(p, m):
    s = pipelining.schedule("1f1b", p, m)
    sim = pipelining.validate(s)
    assert sim.bubbles == pytest.approx([(p - 1) / (m + p - 1)] * p)
    assert sim.peak_activations == [p - r for r in range(p)]  # p - r - 1 warm-up forwards + 1


def test_interleaved_and_chimera_places():
    s = pipelining.schedule("interleaved", ranks=2, microbatches=4, virtual_stages=2)
    assert (s.stages, s.chunks_per_rank) == (4, 2)
    assert [[c.stage for c in r] for r in s.chunks] == [[0, 2], [1, 3]]
    assert s.holder(0, 3) == (1, 1)
    pipelining.validate(s)
    c = pipelining.schedule("chimera", ranks=4, microbatches=4)
    assert c.pipelines == 2
    # rank r: stage r of the down pipeline, stage p-1-r of the up pipeline
    assert [[(x.pipeline, x.stage) for x in r] for r in c.chunks] == \
        [[(0, r), (1, 3 - r)] for r in range(4)]
    assert c.holder(1, 0) == (3, 1)
    assert sorted(set(c.pipeline_of)) == [0, 1]
    pipelining.validate(c)


def test_actions_readable():
    s = pipelining.schedule("gpipe", 2, 1)
    assert [(a.kind, a.microbatch, a.chunk, a.peer) for a in s.actions[0]] == [
        ("F", 0, 0, -1), ("SA", 0, 0, 1), ("RG", 0, 0, 1), ("B", 0, 0, -1), ("SYNC", -1, 0, -1)]
    assert str(s.actions[0][1]) == "SA mb 0 chunk 0 -> rank 1"


@pytest.mark.parametrize("name,v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("chimera", 1)])
def test_text_round_trip(name, v, tmp_path):
    s = pipelining.schedule(name, 4, 8, virtual_stages=v)
    text = str(s)
    assert text == pipelining.format_schedule(s)
    assert f"\nschedule {name} stages " in text
    back = pipelining.parse_schedule(text)
    assert back == s
    assert str(back) == text
    path = tmp_path / "s.txt"
    pipelining.write_schedule(s, str(path))
    assert pipelining.read_schedule(str(path)) == s


def test_deadlock_names_rank_and_action():
    lines = str(pipelining.schedule("gpipe", 2, 1)).splitlines()
    # rank 0 waits for the gradient before sending the activation rank 1 waits for
    sa, rg = lines.index("0 SA 0 0 1"), lines.index("0 RG 0 0 1")
    lines[sa], lines[rg] = lines[rg], lines[sa]
    bad = pipelining.parse_schedule("\n".join(lines))  # well formed: only the order is wrong
    with pytest.raises(ValueError, match="rank 0") as e:
        pipelining.validate(bad)
    assert "RG" in str(e.value) or "recv" in str(e.value).lower()


def test_bad_arguments():
    with pytest.raises(ValueError, match="gpipe"):  # the message lists the choices
        pipelining.schedule("zigzag", 2, 4)
    with pytest.raises(ValueError):
        pipelining.schedule("chimera", 3, 4)  # an odd number of ranks
    with pytest.raises(ValueError):
        pipelining.schedule("interleaved", 2, 3, virtual_stages=2)  # m not a multiple of p
    with pytest.raises(ValueError):
        pipelining.schedule("1f1b", 0, 4)
    with pytest.raises(ValueError, match="line"):
        pipelining.parse_schedule("schedule x stages 1 pipelines 1 ranks 1 microbatches 1\n"
                                  "0 JUMP 0 0\n")
    with pytest.raises(ValueError):
        pipelining.read_schedule("/nonexistent/schedule.txt")
    with pytest.raises(ValueError):
        pipelining.schedule("gpipe", 2, 2).holder(0, 5)
    with pytest.raises(TypeError, match="forward"):
        pipelining.StageChunk(3)


# ---------------------------------------------------------------- GPT stages

CONFIG = dict(max_seq_len=8, vocab=30, padded_vocab=32, layers=4, heads=2, channels=16)


def test_gpt_stage_names_and_init():
    config = nn.GPTConfig(**CONFIG)
    assert [pipelining.stage_layers(4, s, 3) for s in range(3)] == [(0, 2), (2, 1), (3, 1)]
    full = nn.GPT(config).init_parameters(seed=7)
    want = dict(full.named_parameters())
    seen = set()
    for k in range(2):
        stage = pipelining.GPTStage(config, k, 2).init_parameters(seed=7)
        first, count = pipelining.stage_layers(config, k, 2)
        names = [n for n, _ in stage.named_parameters()]
        blocks = sorted({int(n.split(".")[1]) for n in names if n.startswith("blocks.")})
        assert blocks == list(range(first, first + count))
        assert ("wte.weight" in names) and (stage.wte_weight is not None)
        for n, p in stage.named_parameters():
            np.testing.assert_array_equal(p.detach().numpy(), want[n].detach().numpy(),
                                          err_msg=n)
            seen.add(n)
        assert stage.activation_shape(3, 8) == (3, 8, 16)
    assert seen == set(want)
    assert pipelining.GPTStage(config, 1, 3).wte_weight is None  # a middle stage


# ---------------------------------------------------------------- the executor, one process

class TwoLayer(nn.Module):
    """Linear + gelu + Linear written in Python over loom.nn.Parameter."""

    def __init__(self, seed):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.w1 = nn.Parameter(loom.tensor(rng.standard_normal((8, 4), dtype=np.float32) * 0.5))
        self.b1 = nn.Parameter(loom.tensor(rng.standard_normal(8, dtype=np.float32) * 0.1))
        self.w2 = nn.Parameter(loom.tensor(rng.standard_normal((3, 8), dtype=np.float32) * 0.5))
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return F.linear(F.gelu(F.linear(x, self.w1, self.b1)), self.w2)


def mse(out, target):
    d = out - target
    return (d * d).mean()


def batch(rows, seed=1):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, 4), dtype=np.float32),
            rng.standard_normal((rows, 3), dtype=np.float32))


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_python_module_stage_equals_plain_step(name):
    m, rows = 4, 3
    x, y = batch(m * rows)
    ref = TwoLayer(0)
    loss_ref = mse(ref(loom.tensor(x)), loom.tensor(y))
    loss_ref.backward()

    model = TwoLayer(0)
    s = pipelining.schedule(name, ranks=1, microbatches=m)
    ex = pipelining.PipelineExecutor(s, dist.world(), [pipelining.StageChunk(model, loss=mse)],
                                     activation_shape=(rows, 3))
    seen = []
    ex.set_before_forward(seen.append)
    tokens = [loom.tensor(x[k * rows:(k + 1) * rows]) for k in range(m)]
    targets = [loom.tensor(y[k * rows:(k + 1) * rows]) for k in range(m)]
    local = ex.run(tokens, targets)
    assert model.calls == m and seen == list(range(m))
    assert local == pytest.approx(loss_ref.item(), rel=1e-5)  # micro-batch losses weighted 1/m
    assert ex.mean_loss(local) == pytest.approx(local)
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=n)
    kinds = [t.action.kind for t in ex.timeline]
    assert kinds.count("F") == m and kinds.count("B") == m
    assert all(t.end >= t.start for t in ex.timeline)

    # explicit weights: the gradient of sum_k w_k loss_k
    model.zero_grad()
    w = [0.5, 0.0, 0.25, 0.25]
    local = ex.run(tokens, targets, w)
    ref.zero_grad()
    total = None
    for k in range(m):
        term = mse(ref(tokens[k]), targets[k]) * w[k]
        total = term if total is None else total + term
    total.backward()
    assert local == pytest.approx(total.item(), rel=1e-5)
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=n)


@pytest.mark.parametrize("cpp_chunk", [True, False])
def test_gpt_stage_single_rank_equals_gpt(cpp_chunk):
    config = nn.GPTConfig(**CONFIG)
    m, rows, T = 2, 2, 8
    rng = np.random.default_rng(3)
    idx = rng.integers(0, config.vocab, (m * rows, T))
    tgt = rng.integers(0, config.vocab, (m * rows, T))
    full = nn.GPT(config).init_parameters(seed=5)
    loss = full.loss(loom.tensor(idx, dtype=loom.int64), loom.tensor(tgt, dtype=loom.int64))
    loss.backward()
    stage = pipelining.GPTStage(config, 0, 1).init_parameters(seed=5)
    s = pipelining.schedule("1f1b", 1, m)
    # stage_chunk: all C++; else the Python module and its loss as callables
    chunk = (pipelining.stage_chunk(stage) if cpp_chunk
             else pipelining.StageChunk(stage, loss=stage.loss))
    ex = pipelining.PipelineExecutor(s, dist.world(), [chunk], stage.activation_shape(rows, T))
    local = ex.run([loom.tensor(idx[k * rows:(k + 1) * rows], dtype=loom.int64) for k in range(m)],
                   [loom.tensor(tgt[k * rows:(k + 1) * rows], dtype=loom.int64) for k in range(m)])
    pipelining.sync_tied_embedding([stage])
    assert local == pytest.approx(loss.item(), rel=1e-5)
    want = dict(full.named_parameters())
    for n, p in stage.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), want[n].grad.numpy(), rtol=1e-4, atol=1e-6,
                                   err_msg=n)


def test_python_exception_surfaces():
    class Broken(nn.Module):
        def forward(self, x):
            raise ValueError("broken stage")

    s = pipelining.schedule("gpipe", 1, 2)
    ex = pipelining.PipelineExecutor(s, dist.world(), [pipelining.StageChunk(Broken(), mse)],
                                     (1, 3))
    gc.collect()  # the executor alone keeps Broken() alive
    x, y = batch(2)
    with pytest.raises(ValueError, match="broken stage"):
        ex.run([loom.tensor(x[:1]), loom.tensor(x[1:])], [loom.tensor(y[:1]), loom.tensor(y[1:])])

    def bad_loss(out, t):
        return 1.0  # not a tensor

    ex = pipelining.PipelineExecutor(s, dist.world(),
                                     [pipelining.StageChunk(TwoLayer(0), bad_loss)], (1, 3))
    with pytest.raises((TypeError, RuntimeError)):
        ex.run([loom.tensor(x[:1]), loom.tensor(x[1:])], [loom.tensor(y[:1]), loom.tensor(y[1:])])


def test_executor_argument_errors():
    s = pipelining.schedule("gpipe", 1, 2)
    with pytest.raises(ValueError, match="loss"):  # the last stage needs a loss
        pipelining.PipelineExecutor(s, dist.world(), [pipelining.StageChunk(TwoLayer(0))], (1, 3))
    with pytest.raises(ValueError):  # a 2-rank schedule on a group of one
        pipelining.PipelineExecutor(pipelining.schedule("gpipe", 2, 2), dist.world(),
                                    [pipelining.StageChunk(TwoLayer(0), mse)], (1, 3))
    ex = pipelining.PipelineExecutor(s, dist.world(), [pipelining.StageChunk(TwoLayer(0), mse)],
                                     (1, 3))
    with pytest.raises(ValueError, match="micro-batches"):
        ex.run([loom.ones(1, 4)], [loom.ones(1, 3)])


def test_stage_set_names_and_init():
    config = nn.GPTConfig(**CONFIG)
    a, b = (pipelining.GPTStage(config, k, 2) for k in range(2))
    stage_set = pipelining.StageSet([a, b]).init_parameters(seed=7)
    names = [n for n, _ in stage_set.named_parameters()]
    assert names[0] == "chunk0.wte.weight" and "chunk1.wte.weight" in names  # unique names
    want = dict(nn.GPT(config).init_parameters(seed=7).named_parameters())
    for stage in (a, b):  # each stage initialised under its single-process names
        for n, p in stage.named_parameters():
            np.testing.assert_array_equal(p.detach().numpy(), want[n].detach().numpy(),
                                          err_msg=n)
