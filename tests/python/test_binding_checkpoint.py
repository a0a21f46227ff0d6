"""loom.distributed.checkpoint on one process: a Python-defined model with AdamW (and SGD with
momentum) saved and loaded into a fresh one is bit-identical, parameters and optimizer state, and
the next training step then equals the original's bit for bit; model-only checkpoints; a ZeRO-3
checkpoint loads into a plain model and optimizer; latest / keep_last / has_checkpoint; and the
mistakes: a missing directory, an unfinished save, a damaged or truncated file, state that is not
JSON, an optimizer over other tensors; pipeline stages under single-process names. The multi-rank layouts are checked by
tests/python/train_gpt_check.py (train_gpt.py --resume against the uninterrupted run and
loom-gpt)."""

import json
import os

import numpy as np
import pytest

import loom
import loom.distributed as dist
import loom.nn as nn
import loom.nn.functional as F
from loom.distributed import checkpoint


class PyLinear(nn.Module):
    def __init__(self, n_in, n_out, rng):
        super().__init__()
        self.weight = nn.Parameter(loom.tensor(rng.standard_normal((n_out, n_in),
                                                                   dtype=np.float32) * 0.5))
        self.bias = nn.Parameter(loom.tensor(rng.standard_normal(n_out, dtype=np.float32) * 0.1))

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class Model(nn.Module):
    """Python parameters, a Python child and a built-in child."""

    def __init__(self, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.fc = PyLinear(4, 8, rng)
        self.scale = nn.Parameter(loom.tensor(rng.standard_normal(8, dtype=np.float32)))
        self.head = nn.Linear(8, 3)
        self.head.init_parameters(seed=seed)

    def forward(self, x):
        return self.head(F.gelu(self.fc(x)) * self.scale)


def batch(k):
    rng = np.random.default_rng(100 + k)
    return (loom.tensor(rng.standard_normal((6, 4), dtype=np.float32)),
            loom.tensor(rng.standard_normal((6, 3), dtype=np.float32)))


def train_step(model, opt, k):
    x, y = batch(k)
    d = model(x) - y
    loss = (d * d).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


def values(model):
    return {n: np.asarray(p.detach()).copy() for n, p in model.named_parameters()}


def opt_state(opt):
    return {k: np.asarray(v).copy() for k, v in opt.state_dict()["state"].items()}


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k


def adamw(model):
    return loom.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


@pytest.mark.parametrize("make_opt", [
    adamw, lambda m: loom.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)],
    ids=["adamw", "sgd-momentum"])
def test_round_trip_is_bit_exact_and_training_continues(tmp_path, make_opt):
    model = Model(seed=0)
    opt = make_opt(model)
    for k in range(3):
        train_step(model, opt, k)
    path = checkpoint.save(tmp_path, model=model, optimizer=opt, step=3, epoch=1,
                           note="hello", sizes=[1, 2.5, None], nested={"a": {"b": True}})
    assert path == os.path.join(str(tmp_path), "step-00000003")
    assert checkpoint.latest(tmp_path) == path

    fresh = Model(seed=7)  # other values, same structure
    fresh_opt = make_opt(fresh)
    state = checkpoint.load(tmp_path, model=fresh, optimizer=fresh_opt)
    assert state == {"step": 3, "epoch": 1, "note": "hello", "sizes": [1, 2.5, None],
                     "nested": {"a": {"b": True}}}
    assert_same(values(model), values(fresh))
    assert_same(opt_state(opt), opt_state(fresh_opt))

    # The next steps of both are the same, bit for bit.
    for k in (3, 4):
        assert train_step(model, opt, k) == train_step(fresh, fresh_opt, k)
    assert_same(values(model), values(fresh))
    assert_same(opt_state(opt), opt_state(fresh_opt))


def test_model_only(tmp_path):
    model = Model(seed=0)
    opt = adamw(model)
    train_step(model, opt, 0)
    checkpoint.save(tmp_path, model=model, step=1)
    names = sorted(checkpoint.read_manifest(tmp_path)["tensors"])
    assert names == sorted("model." + n for n, _ in model.named_parameters())
    fresh = Model(seed=5)
    assert checkpoint.load(tmp_path, model=fresh) == {"step": 1}
    assert_same(values(model), values(fresh))
    # A model-only checkpoint has no optimizer state to resume.
    other = Model()
    with pytest.raises(ValueError, match="has no tensor optim"):
        checkpoint.load(tmp_path, model=other, optimizer=adamw(other))


def test_a_full_checkpoint_loads_model_only(tmp_path):
    model = Model(seed=0)
    opt = adamw(model)
    train_step(model, opt, 0)
    checkpoint.save(tmp_path, model=model, optimizer=opt, step=1)
    fresh = Model(seed=3)
    checkpoint.load(tmp_path / "step-00000001", model=fresh)
    assert_same(values(model), values(fresh))


def gpt_config():
    return nn.GPTConfig(max_seq_len=8, vocab=16, padded_vocab=16, layers=1, heads=2, channels=8)


def gpt_batch():
    tokens = (np.arange(16, dtype=np.int32).reshape(2, 8) * 5) % 16
    return loom.tensor(tokens), loom.tensor((tokens + 1) % 16)


@pytest.mark.parametrize("stage", [1, 3])
def test_zero_checkpoint_loads_into_a_plain_optimizer(tmp_path, stage):
    """Across layouts: ZeRO (one rank) saves, a plain GPT + AdamW loads and steps the same."""
    model = nn.GPT(gpt_config()).init_parameters(seed=1)
    zero = dist.ZeroRedundancyOptimizer(model, stage=stage, lr=1e-2)
    x, y = gpt_batch()
    for _ in range(2):
        zero.backward(model.loss(x, y))
        zero.step()
        zero.zero_grad()
    checkpoint.save(tmp_path, model=model, optimizer=zero, step=2)
    plain = nn.GPT(gpt_config()).init_parameters(seed=2)
    opt = loom.optim.AdamW(plain.parameters(), lr=1e-2)
    assert checkpoint.load(tmp_path, model=plain, optimizer=opt)["step"] == 2
    zero.gather_parameters()
    assert_same(values(model), values(plain))
    zero.backward(model.loss(x, y))
    zero.step()
    loss = plain.loss(x, y)
    loss.backward()
    opt.step()
    zero.gather_parameters()
    assert_same(values(model), values(plain))


def test_ddp_wrapper_is_accepted(tmp_path):
    model = Model(seed=0)
    ddp = dist.DistributedDataParallel(model)
    opt = adamw(model)
    x, y = batch(0)
    d = ddp(x) - y
    ddp.backward((d * d).mean())
    ddp.finish()
    opt.step()
    checkpoint.save(tmp_path, model=ddp, optimizer=opt, step=1)
    fresh = Model(seed=4)
    fresh_opt = adamw(fresh)
    checkpoint.load(tmp_path, model=dist.DistributedDataParallel(fresh), optimizer=fresh_opt)
    assert_same(values(model), values(fresh))
    assert_same(opt_state(opt), opt_state(fresh_opt))


def test_latest_keep_last_and_has_checkpoint(tmp_path):
    model = Model()
    assert checkpoint.latest(tmp_path) is None
    assert checkpoint.latest(tmp_path / "missing") is None
    for step in (1, 2, 3):
        checkpoint.save(tmp_path, model=model, step=step, keep_last=2, tag=f"s{step}")
    assert sorted(p for p in os.listdir(tmp_path) if p.startswith("step-")) == [
        "step-00000002", "step-00000003"]
    assert checkpoint.latest(tmp_path) == os.path.join(str(tmp_path), "step-00000003")
    assert checkpoint.has_checkpoint(tmp_path, 2) and not checkpoint.has_checkpoint(tmp_path, 1)
    assert checkpoint.load(tmp_path, model=model)["tag"] == "s3"
    assert checkpoint.load(tmp_path / "step-00000002", model=model)["tag"] == "s2"
    assert checkpoint.verify(tmp_path) == os.path.join(str(tmp_path), "step-00000003")


def test_missing_directory_is_named(tmp_path):
    missing = tmp_path / "no-such-dir"
    for call in (lambda: checkpoint.load(missing, model=Model()),
                 lambda: checkpoint.verify(missing),
                 lambda: checkpoint.read_manifest(missing)):
        with pytest.raises(ValueError, match="no-such-dir"):
            call()
    # An empty directory, and a step directory whose save never committed.
    with pytest.raises(ValueError, match=f"no committed checkpoint at {tmp_path}"):
        checkpoint.load(tmp_path, model=Model())
    (tmp_path / "step-00000004").mkdir()
    with pytest.raises(ValueError, match="no committed checkpoint at .*step-00000004"):
        checkpoint.load(tmp_path / "step-00000004", model=Model())


def damage(path, tensor="model.scale"):
    """Flips one byte inside `tensor`'s stored bytes."""
    manifest = checkpoint.read_manifest(path)
    piece = manifest["tensors"][tensor]["pieces"][0]
    data_file = os.path.join(checkpoint.latest(path), piece["file"])
    with open(data_file, "r+b") as f:
        f.seek(piece["offset"] + 1)
        byte = f.read(1)
        f.seek(piece["offset"] + 1)
        f.write(bytes([byte[0] ^ 0x40]))
    return data_file


def test_damaged_file_fails_its_checksum(tmp_path):
    model = Model()
    opt = adamw(model)
    train_step(model, opt, 0)
    checkpoint.save(tmp_path, model=model, optimizer=opt, step=1)
    data_file = damage(tmp_path)
    with pytest.raises(ValueError, match="checksum") as e:
        checkpoint.verify(tmp_path)
    assert os.path.basename(data_file) in str(e.value) and "model.scale" in str(e.value)
    fresh = Model(seed=9)
    with pytest.raises(ValueError, match="checksum.*damaged"):
        checkpoint.load(tmp_path, model=fresh, optimizer=adamw(fresh))
    # A truncated file is named too.
    with open(data_file, "r+b") as f:
        f.truncate(os.path.getsize(data_file) - 10)
    with pytest.raises(ValueError, match="truncated"):
        checkpoint.load(tmp_path, model=Model())


def test_argument_mistakes(tmp_path):
    model = Model()
    opt = adamw(model)
    with pytest.raises(TypeError, match="'when' is not JSON-able"):
        checkpoint.save(tmp_path, model=model, step=1, when=object())
    with pytest.raises(TypeError, match="'loss' is not JSON-able"):
        checkpoint.save(tmp_path, model=model, step=1, loss=float("nan"))
    with pytest.raises(ValueError, match="optimizer_steps"):
        checkpoint.save(tmp_path, model=model, step=1, optimizer_steps={})
    with pytest.raises(ValueError, match="step must be >= 0"):
        checkpoint.save(tmp_path, model=model, step=-1)
    with pytest.raises(TypeError, match="model must be a loom.nn.Module"):
        checkpoint.save(tmp_path, model=opt, step=1)
    with pytest.raises(TypeError, match="optimizer must be"):
        checkpoint.save(tmp_path, model=model, optimizer=model, step=1)
    # An optimizer over other tensors (a subset of the parameters) is refused by name.
    partial = loom.optim.AdamW(list(model.fc.parameters()), lr=1e-3)
    with pytest.raises(ValueError, match="steps 2 tensors but the model has 5 parameters"):
        checkpoint.save(tmp_path, model=model, optimizer=partial, step=1)
    other = Model()
    with pytest.raises(ValueError, match="not the model's parameter scale"):
        checkpoint.save(tmp_path, model=model, optimizer=adamw(other), step=1)
    assert checkpoint.latest(tmp_path) is None  # nothing was written


def test_pipeline_stages_save_under_single_process_names(tmp_path):
    """A StageSet's parameters ("chunk0.wte.weight") are stored as the single-process model's
    ("model.wte.weight"), so a plain GPT loads a pipeline's checkpoint."""
    stage = dist.pipelining.GPTStage(gpt_config(), 0, 1)
    stage.init_parameters(seed=5)
    holder = dist.pipelining.StageSet([stage])
    checkpoint.save(tmp_path, model=holder, step=1)
    names = set(checkpoint.read_manifest(tmp_path)["tensors"])
    assert names == {"model." + n for n, _ in stage.named_parameters()}, sorted(names)
    model = loom.nn.GPT(gpt_config())
    checkpoint.load(tmp_path, model=model)
    saved = dict(stage.named_parameters())
    for name, p in model.named_parameters():
        assert np.array_equal(np.asarray(p.detach()), np.asarray(saved[name].detach())), name


def test_manifest_is_the_documented_json(tmp_path):
    model = Model()
    checkpoint.save(tmp_path, model=model, step=5, run="a")
    m = checkpoint.read_manifest(tmp_path)
    assert m["step"] == 5 and m["state"] == {"run": "a"}
    assert m["tensors"]["model.fc.weight"]["shape"] == [8, 4]
    with open(os.path.join(checkpoint.latest(tmp_path), "manifest.json")) as f:
        assert json.load(f)["tensors"].keys() == m["tensors"].keys()


def test_state_dict_carries_keys_that_are_argument_names(tmp_path):
    """loom-gpt's run state has "model": it goes in state={...}, merged with **extra."""
    model = Model()
    run = {"model": {"layers": 2}, "data": {"batch_index": 7}}
    checkpoint.save(tmp_path, model=model, step=3, state=run, epoch=2)
    assert checkpoint.load(tmp_path, model=Model()) == dict(run, epoch=2, step=3)
    with pytest.raises(ValueError, match="'epoch' is given both in state and as a keyword"):
        checkpoint.save(tmp_path, model=model, step=4, state={"epoch": 1}, epoch=2)
    with pytest.raises(ValueError, match="'step' is loom's own state key"):
        checkpoint.save(tmp_path, model=model, step=4, state={"step": 1})
    with pytest.raises(TypeError, match="state must be a dict"):
        checkpoint.save(tmp_path, model=model, step=4, state=[1])


def test_model_only_with_zero3_needs_gathered_parameters(tmp_path):
    model = nn.GPT(gpt_config()).init_parameters(seed=1)
    zero = dist.ZeroRedundancyOptimizer(model, stage=3, lr=1e-2)
    x, y = gpt_batch()
    zero.backward(model.loss(x, y))
    zero.step()
    with pytest.raises(ValueError, match="not whole on this rank.*gather_parameters"):
        checkpoint.save(tmp_path, model=model, step=1)
    zero.gather_parameters()
    checkpoint.save(tmp_path, model=model, step=1)
    plain = nn.GPT(gpt_config()).init_parameters(seed=2)
    checkpoint.load(tmp_path, model=plain)
    assert_same(values(model), values(plain))
