"""loom.distributed's mesh, DDP and ZeRO, and loom.nn's tensor-parallel modules, in a world of one
(no mpirun): each against the single-process computation it must equal (DDP bit-exact; ZeRO's
AdamW steps within 1e-6 of loom.optim.AdamW's; a one-rank TensorParallelGPT against loom.nn.GPT),
and the argument errors. The multi-rank checks are tests/python/mpi_parallel_check.py."""

import numpy as np
import pytest

import loom
import loom.distributed as dist
import loom.nn.functional as F

CONFIG = dict(max_seq_len=8, vocab=60, padded_vocab=64, layers=2, heads=2, channels=32)
B, T = 4, 8


@pytest.fixture(scope="module")
def world():
    if dist.launched_by_mpi():
        pytest.skip("these tests expect a world of one (run them without mpirun)")
    return dist.init_process_group()


def arr(t):
    return np.asarray(t.detach()) if isinstance(t, loom.Tensor) else np.asarray(t)


def config():
    return loom.nn.GPTConfig(**CONFIG)


def batch(seed=0):
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, CONFIG["vocab"], size=(B, T))
    targets = rng.integers(0, CONFIG["vocab"], size=(B, T))
    return (loom.tensor(idx.astype(np.int64), dtype=loom.int64),
            loom.tensor(targets.astype(np.int64), dtype=loom.int64))


def gpt(seed=1337):
    return loom.nn.GPT(config(), seed=seed)


def grads(model):
    return {n: arr(p.grad).copy() for n, p in model.named_parameters()}


def params(model):
    return {n: arr(p).copy() for n, p in model.named_parameters()}


def assert_close(got, want, rtol, atol=0.0, what=""):
    assert got.keys() == want.keys(), what
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=rtol, atol=atol, err_msg=f"{what} {k}")


# ---- DeviceMesh ----

def test_mesh_of_one(world):
    mesh = dist.DeviceMesh()
    assert mesh.shape == (1, 1, 1)
    c = mesh.coords
    assert (c.pp, c.dp, c.tp) == (0, 0, 0)
    assert c == (0, 0, 0) and tuple(c) == (0, 0, 0)
    for g in (mesh.pp_group, mesh.dp_group, mesh.tp_group):
        assert isinstance(g, dist.Communicator)
        assert (g.rank, g.size) == (0, 1)
    assert mesh.world is world
    assert mesh.rank_of(0, 0, 0) == 0
    assert "pp 1 x dp 1 x tp 1" in repr(mesh)
    assert dist.DeviceMesh(pp=1, dp=1, tp=1, group=world).shape == (1, 1, 1)


def test_mesh_bad_sizes(world):
    with pytest.raises(ValueError, match="does not divide the world size 1"):
        dist.DeviceMesh(tp=2)
    with pytest.raises(ValueError, match="pp 1 x dp 2 x tp 1"):
        dist.DeviceMesh(dp=2)
    with pytest.raises(ValueError, match="positive"):
        dist.DeviceMesh(pp=0)
    with pytest.raises(TypeError):
        dist.DeviceMesh(group="world")


# ---- DistributedDataParallel ----

@pytest.mark.parametrize("overlap", [True, False])
def test_ddp_of_one_is_plain_backward_bit_exact(world, overlap):
    idx, targets = batch()
    ref = gpt()
    ref.loss(idx, targets).backward()
    model = gpt()
    ddp = dist.DistributedDataParallel(model, bucket_mb=0.01, overlap=overlap)
    assert ddp.module is model
    loss = ddp.module.loss(idx, targets)
    ddp.backward(loss)
    ddp.finish()
    got, want = grads(model), grads(ref)
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    mem = ddp.memory()
    nbytes = 4 * model.num_parameters()
    assert (mem.parameters, mem.gradients, mem.total) == (nbytes, nbytes, 2 * nbytes)
    assert ddp.exposed_wait_seconds >= 0.0


def test_ddp_call_and_grad_accum(world):
    lin_ref, lin = loom.nn.Linear(6, 3), loom.nn.Linear(6, 3)
    x = [loom.tensor(np.random.default_rng(k).normal(size=(5, 6)).astype(np.float32))
         for k in range(2)]
    for k in range(2):
        (lin_ref(x[k]).sum() * 0.5).backward()
    ddp = dist.DistributedDataParallel(lin, grad_accum=2)
    for k in range(2):
        y = ddp(x[k])  # the module's call
        np.testing.assert_array_equal(arr(y), arr(lin_ref(x[k])))
        ddp.backward(y.sum() * 0.5)
    ddp.finish()
    for n in ("weight", "bias"):
        np.testing.assert_array_equal(arr(getattr(lin, n).grad),
                                      arr(getattr(lin_ref, n).grad))


def test_ddp_errors(world):
    with pytest.raises(TypeError, match="module must be a loom.nn.Module, got int"):
        dist.DistributedDataParallel(3)
    with pytest.raises(TypeError, match="group must be a loom.distributed.Communicator"):
        dist.DistributedDataParallel(loom.nn.Linear(2, 2), group="world")
    with pytest.raises(TypeError, match="grad_accum must be an int"):
        dist.DistributedDataParallel(loom.nn.Linear(2, 2), grad_accum=1.5)


# ---- ZeroRedundancyOptimizer ----

@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_of_one_equals_adamw(world, stage):
    kw = dict(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    ref = gpt()
    ref_opt = loom.optim.AdamW(ref.parameters(), **kw)
    model = gpt()
    opt = dist.ZeroRedundancyOptimizer(model, stage=stage, bucket_mb=0.01, **kw)
    assert opt.stage == stage and opt.lr == pytest.approx(1e-2)
    assert opt.param_groups[0]["betas"] == (0.9, 0.95)
    for step in range(3):
        idx, targets = batch(step)
        ref_loss = ref.loss(idx, targets)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        loss = model.loss(idx, targets)
        opt.backward(loss)
        opt.step()
        opt.zero_grad()
        assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-6)
    opt.gather_parameters()
    assert_close(params(model), params(ref), rtol=1e-6, atol=1e-7, what=f"stage {stage}")
    mem = opt.memory()
    n = model.num_parameters()
    assert mem.optimizer_state == 8 * n  # exp_avg + exp_avg_sq, the whole of it on one rank


def test_zero_sgd_clip_and_state_dict(world):
    ref = gpt()
    ref_opt = loom.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    model = gpt()
    opt = dist.ZeroRedundancyOptimizer(model, optimizer_class=loom.optim.SGD, stage=2, lr=0.1,
                                       momentum=0.9)
    for step in range(2):
        idx, targets = batch(step)
        ref.loss(idx, targets).backward()
        want_norm = loom.nn.utils.clip_grad_norm_(ref.parameters(), 0.5).item()
        ref_opt.step()
        ref_opt.zero_grad()
        opt.backward(model.loss(idx, targets))
        opt.finish_gradients()
        got_norm = opt.clip_grad_norm_(0.5)
        assert got_norm == pytest.approx(want_norm, rel=1e-5)
        opt.step()
        opt.zero_grad()
    assert_close(params(model), params(ref), rtol=1e-6, atol=1e-7, what="sgd")
    state = opt.state_dict()
    assert "zero.stage" in state["state"] and state["param_groups"][0]["momentum"] == 0.9
    opt.lr = 0.05
    opt.load_state_dict(state)
    assert opt.lr == pytest.approx(0.1)


def test_zero_errors(world):
    model = loom.nn.Linear(4, 4)
    with pytest.raises(TypeError, match="optimizer_class must be loom.optim.AdamW or "
                                        "loom.optim.SGD, got dict"):
        dist.ZeroRedundancyOptimizer(model, optimizer_class=dict)
    with pytest.raises(TypeError, match="SGD: missing a required argument: 'lr'"):
        dist.ZeroRedundancyOptimizer(model, optimizer_class=loom.optim.SGD)
    with pytest.raises(TypeError, match="unexpected keyword argument 'momentum'"):
        dist.ZeroRedundancyOptimizer(model, momentum=0.9)
    with pytest.raises(ValueError, match="stage must be 1, 2 or 3, got 4"):
        dist.ZeroRedundancyOptimizer(model, stage=4)
    with pytest.raises(TypeError, match="module must be a loom.nn.Module"):
        dist.ZeroRedundancyOptimizer("model")
    with pytest.raises(TypeError, match="tp must be a loom.distributed.Communicator"):
        dist.ZeroRedundancyOptimizer(model, tp=1)


# ---- tensor parallelism on a group of one ----

@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_tp_gpt_of_one_equals_gpt(world, sequence_parallel):
    idx, targets = batch()
    ref = gpt()
    model = loom.nn.TensorParallelGPT(config(), world, seed=1337,
                                      sequence_parallel=sequence_parallel)
    assert model.group is world and model.wte_rows == 64
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in ref.named_parameters()]
    assert_close(dist.gather_full_state(model, world), params(ref), rtol=0, what="init")
    np.testing.assert_allclose(arr(model.logits(idx)), arr(ref(idx)), rtol=1e-5,
                               atol=1e-6)
    ref_loss, loss = ref.loss(idx, targets), model.loss(idx, targets)
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-6)
    ref_loss.backward()
    loss.backward()
    assert_close(grads(model), grads(ref), rtol=1e-5, atol=1e-7, what="grad")
    want = loom.nn.utils.clip_grad_norm_(ref.parameters(), 0.1).item()
    assert dist.tp_clip_grad_norm_(model, 0.1, world) == pytest.approx(want, rel=1e-5)
    assert_close(grads(model), grads(ref), rtol=1e-5, atol=1e-7, what="clipped grad")


def test_tp_load_full_state(world):
    other = gpt(seed=7)
    model = loom.nn.TensorParallelGPT(config(), world)
    dist.load_full_state(model, other.state_dict())
    assert_close(dist.gather_full_state(model, world), params(other), rtol=0, what="load")
    state = other.state_dict()
    del state["ln_f.bias"]
    with pytest.raises(ValueError, match="ln_f.bias"):
        dist.load_full_state(model, state)
    with pytest.raises(TypeError, match="state_dict must be a dict"):
        dist.load_full_state(model, [1])


def test_tp_layers_of_one(world):
    rng = np.random.default_rng(3)
    x = loom.tensor(rng.normal(size=(2, 4, 6)).astype(np.float32))
    for layer in (loom.nn.ColumnParallelLinear(6, 5, world),
                  loom.nn.ColumnParallelLinear(6, 6, world, gather_output=True, blocks=3),
                  loom.nn.RowParallelLinear(6, 5, world)):
        w, b = arr(layer.weight), arr(layer.bias)
        np.testing.assert_allclose(arr(layer(x)), arr(x) @ w.T + b, rtol=1e-5,
                                   atol=1e-6)
    nobias = loom.nn.RowParallelLinear(6, 5, world, bias=False)
    assert [n for n, _ in nobias.named_parameters()] == ["weight"]
    emb = loom.nn.VocabParallelEmbedding(10, 4, world)
    assert (emb.rows_per_rank, emb.first_row) == (10, 0)
    ids = np.array([[1, 9], [0, 3]])
    np.testing.assert_array_equal(arr(emb(loom.tensor(ids, dtype=loom.int64))),
                                  arr(emb.weight)[ids])


def test_vocab_parallel_cross_entropy_of_one(world):
    rng = np.random.default_rng(5)
    logits = loom.tensor(rng.normal(size=(6, 8)).astype(np.float32), requires_grad=True)
    targets = loom.tensor(np.array([0, 7, 3, -100, 2, 5]), dtype=loom.int64)
    got = loom.nn.vocab_parallel_cross_entropy(logits, targets, world, vocab=8)
    want = F.cross_entropy(logits, targets)
    assert got.item() == pytest.approx(want.item(), rel=1e-6)
    got.backward()
    g = arr(logits.grad).copy()
    logits.grad = None
    want.backward()
    np.testing.assert_allclose(g, arr(logits.grad), rtol=1e-5, atol=1e-7)


def test_tp_errors(world):
    with pytest.raises(TypeError, match="TensorParallelGPT: group must be a "
                                        "loom.distributed.Communicator"):
        loom.nn.TensorParallelGPT(config(), None)
    with pytest.raises(TypeError, match="ColumnParallelLinear: group must be"):
        loom.nn.ColumnParallelLinear(4, 4, "tp")
    with pytest.raises(TypeError, match="tp_clip_grad_norm_: group must be"):
        dist.tp_clip_grad_norm_(loom.nn.Linear(2, 2), 1.0, None)
    with pytest.raises(TypeError, match="gather_full_state: module must be a loom.nn.Module"):
        dist.gather_full_state(object(), world)
