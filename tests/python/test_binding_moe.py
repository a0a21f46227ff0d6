"""loom.nn.MoE against a PyTorch reference of the layer written here (Debian's python3-torch):
router, softmax, top-k with ties to the lower index, renormalised (k > 1) or raw (k = 1) gates,
capacity drops in token order, the gated sum in expert order, the load-balancing loss and the
router z-loss. The same weights and inputs go to both; the output, both losses, the load, the
drops and the gradients of the input and of every parameter must agree.

Tolerances: both compute in float32 with different summation orders: rtol 1e-5, atol 1e-6
(values of order 1).
"""

import math

import numpy as np
import pytest

import loom
import loom.nn as nn

torch = pytest.importorskip("torch")
TF = torch.nn.functional

RTOL, ATOL = 1e-5, 1e-6


def torch_moe(x, weights, experts, top_k, capacity_factor, alpha, beta):
    """The layer in PyTorch: (out, balance loss, z-loss, load, dropped)."""
    n, c = x.shape
    logits = x @ weights["router.weight"].T
    p = torch.softmax(logits, dim=-1)
    values, chosen = torch.topk(p, top_k, dim=-1, sorted=True)
    gates = values / values.sum(-1, keepdim=True) if top_k > 1 else values
    capacity = math.ceil(top_k * n * capacity_factor / experts) if capacity_factor > 0 else n * top_k
    out = torch.zeros_like(x)
    load, dropped = [0] * experts, 0
    for e in range(experts):
        rows, slots = [], []
        for t in range(n):
            for j in range(top_k):
                if int(chosen[t, j]) == e:
                    rows.append(t)
                    slots.append(j)
        dropped += max(0, len(rows) - capacity)
        rows, slots = rows[:capacity], slots[:capacity]
        load[e] = len(rows)
        if not rows:
            continue
        h = TF.gelu(x[rows] @ weights[f"experts.{e}.fc.weight"].T + weights[f"experts.{e}.fc.bias"],
                    approximate="tanh")
        y = h @ weights[f"experts.{e}.proj.weight"].T + weights[f"experts.{e}.proj.bias"]
        out = out.index_add(0, torch.tensor(rows), y * gates[rows, slots].unsqueeze(1))
    routed = torch.bincount(chosen.flatten(), minlength=experts).float() / (n * top_k)
    balance = alpha * experts * (routed * p.mean(0)).sum()
    z = beta * (torch.logsumexp(logits, -1) ** 2).mean()
    return out, balance, z, load, dropped


def numpy_of(t):
    return np.array(t.detach().tolist(), dtype=np.float32)


@pytest.mark.parametrize("top_k,capacity_factor,hidden",
                         [(1, 0.0, 0), (2, 0.0, 0), (2, 1.0, 0), (1, 0.5, 0), (3, 0.75, 0),
                          (2, 0.0, 12)])
def test_moe_matches_pytorch(top_k, capacity_factor, hidden):
    experts, c, n = 4, 6, 14
    moe = nn.MoE(c, experts, top_k, capacity_factor=capacity_factor, aux_loss_coef=0.1,
                 z_loss_coef=0.01, expert_hidden=hidden)
    assert list(moe.experts[0].fc.weight.shape) == [hidden or 4 * c, c]
    moe.init_parameters(seed=5 + top_k)
    rng = np.random.default_rng(17 + top_k)
    # Router weights of order 1, so the routing is decided and some experts get more tokens.
    router = rng.uniform(-1, 1, size=(experts, c)).astype(np.float32)
    with loom.no_grad():
        moe.router.weight.copy_(loom.tensor(router))
    weights = {name: torch.tensor(numpy_of(p), requires_grad=True)
               for name, p in moe.named_parameters()}
    x_np = rng.uniform(-1, 1, size=(n, c)).astype(np.float32)
    x = loom.tensor(x_np).requires_grad_()
    xt = torch.tensor(x_np, requires_grad=True)

    out = moe(x)
    out_t, balance_t, z_t, load_t, dropped_t = torch_moe(xt, weights, experts, top_k,
                                                          capacity_factor, 0.1, 0.01)
    np.testing.assert_allclose(numpy_of(out), numpy_of(out_t), rtol=RTOL, atol=ATOL)
    assert moe.load == load_t
    assert moe.dropped == dropped_t
    np.testing.assert_allclose(moe.aux_loss.item(), float(balance_t + z_t), rtol=RTOL, atol=ATOL)

    # The same scalar from both: a fixed projection of the output plus the auxiliary losses.
    proj = rng.uniform(-1, 1, size=(n, c)).astype(np.float32)
    ((out * loom.tensor(proj)).sum() + moe.aux_loss).backward()
    ((out_t * torch.tensor(proj)).sum() + balance_t + z_t).backward()
    np.testing.assert_allclose(numpy_of(x.grad), numpy_of(xt.grad), rtol=RTOL, atol=ATOL)
    for name, p in moe.named_parameters():
        want = weights[name].grad
        got = p.grad
        if want is None:  # an expert that received no token: no gradient anywhere
            assert got is None or not np.any(numpy_of(got)), name
            continue
        np.testing.assert_allclose(numpy_of(got), numpy_of(want), rtol=RTOL, atol=ATOL,
                                   err_msg=name)


@pytest.mark.parametrize("capacity_factor", [0.0, 1.0])
def test_micro_batches_after_a_routing_pass_match_pytorch_on_the_whole_batch(capacity_factor):
    # Gradient accumulation over 3 micro-batches (loom.nn.utils.moe_begin_batch, a routing pass
    # under no_grad, then each micro-batch with its aux_loss share) gives the PyTorch layer's
    # whole-batch loads, drops, losses and gradients: capacity and f_e are the whole batch's.
    experts, c, n, k = 4, 6, 15, 3
    moe = nn.MoE(c, experts, 2, capacity_factor=capacity_factor, aux_loss_coef=0.1,
                 z_loss_coef=0.01).init_parameters(seed=31)
    rng = np.random.default_rng(32)
    with loom.no_grad():
        moe.router.weight.copy_(loom.tensor(rng.uniform(-1, 1, size=(experts, c))
                                            .astype(np.float32)))
    weights = {name: torch.tensor(numpy_of(p), requires_grad=True)
               for name, p in moe.named_parameters()}
    x_np = rng.uniform(-1, 1, size=(n, c)).astype(np.float32)
    proj = rng.uniform(-1, 1, size=(n, c)).astype(np.float32)
    xt = torch.tensor(x_np, requires_grad=True)
    out_t, balance_t, z_t, load_t, dropped_t = torch_moe(xt, weights, experts, 2,
                                                          capacity_factor, 0.1, 0.01)
    ((out_t * torch.tensor(proj)).sum() + balance_t + z_t).backward()
    if capacity_factor > 0:
        assert dropped_t > 0, "the test needs an expert over its capacity"

    x = loom.tensor(x_np).requires_grad_()
    parts = [(x[i * n // k:(i + 1) * n // k], proj[i * n // k:(i + 1) * n // k]) for i in range(k)]
    assert loom.nn.utils.moe_begin_batch(nn.Sequential(moe), k) == 1
    with loom.no_grad():
        for xi, _ in parts:
            moe(xi)
            assert moe.aux_loss.item() == 0.0
    outs, load, dropped, aux = [], [0] * experts, 0, 0.0
    for xi, pi in parts:
        out = moe(xi)
        outs.append(numpy_of(out))
        load = [a + b for a, b in zip(load, moe.load)]
        dropped += moe.dropped
        aux += moe.aux_loss.item()
        ((out * loom.tensor(pi)).sum() + moe.aux_loss).backward()
    assert load == load_t and dropped == dropped_t
    np.testing.assert_allclose(np.concatenate(outs), numpy_of(out_t), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(aux, float(balance_t + z_t), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(numpy_of(x.grad), numpy_of(xt.grad), rtol=RTOL, atol=ATOL)
    for name, p in moe.named_parameters():
        if weights[name].grad is None:
            continue
        np.testing.assert_allclose(numpy_of(p.grad), numpy_of(weights[name].grad), rtol=RTOL,
                                   atol=ATOL, err_msg=name)
    # Without the routing pass, the load-balancing loss cannot be the whole batch's: refused.
    moe.begin_batch(2, record=False)
    with pytest.raises(ValueError, match="begin the batch with a routing pass"):
        moe(x[:4])


def test_moe_bad_options_are_named():
    with pytest.raises(ValueError, match=r"top_k must be in \[1, experts = 2\]"):
        nn.MoE(4, 2, 3)
    with pytest.raises(ValueError, match="capacity_factor must be >= 0"):
        nn.MoE(4, 2, 1, capacity_factor=-1)


def test_dropless_over_its_receive_budget_falls_back_as_declared():
    # Every token prefers expert 0; a budget of 4.5 rows (22 x C x 4 bytes each) keeps the first
    # 4 of them (the PyTorch layer with 4 slots), and says so; a larger budget keeps all.
    experts, c, n = 4, 6, 12
    row_mb = 22 * 4 * c / 2**20
    x = np.random.default_rng(3).uniform(0.1, 1.0, size=(n, c)).astype(np.float32)
    router = np.zeros((experts, c), np.float32)
    router[0] = 5.0
    results = {}
    for budget in (4.5 * row_mb, 12.5 * row_mb):
        moe = nn.MoE(c, experts, 1, receive_budget_mb=budget, aux_loss_coef=0.1,
                     z_loss_coef=0.01).init_parameters(seed=9)
        with loom.no_grad():
            moe.router.weight.copy_(loom.tensor(router))
        xl = loom.tensor(x).requires_grad_()
        out = moe(xl)
        (out * out).sum().backward()
        results[budget] = (moe, out, xl.grad)
    moe, out, x_grad = results[4.5 * row_mb]
    assert moe.budget_capacity == 4 and moe.dropped == n - 4 and moe.load == [4, 0, 0, 0]
    weights = {k: torch.tensor(numpy_of(v)) for k, v in moe.named_parameters()}
    xt = torch.tensor(x, requires_grad=True)
    # Capacity factor 4 x 4 / 12 gives ceil(4) = 4 slots: the fallback's cap.
    ref, _, _, load, dropped = torch_moe(xt, weights, experts, 1, 4 * experts / n / 1.0, 0.1, 0.01)
    (ref * ref).sum().backward()
    assert load == [4, 0, 0, 0] and dropped == n - 4
    np.testing.assert_allclose(numpy_of(out), ref.detach().numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(numpy_of(x_grad), xt.grad.numpy(), rtol=RTOL, atol=ATOL)
    roomy = results[12.5 * row_mb][0]
    assert roomy.budget_capacity == -1 and roomy.dropped == 0 and roomy.load == [n, 0, 0, 0]


def test_expert_parallel_layers_under_the_parallel_wrappers():
    # One process (the world of one rank): DDP takes an expert-parallel MoE model (its experts
    # left out of the averaging) and trains it as the plain layer, so does ZeRO (the experts
    # whole beside its shards); two ep groups are refused.
    import loom.distributed as dist

    world = dist.world()
    c, experts = 6, 4
    x = loom.tensor(np.random.default_rng(1).uniform(-1, 1, size=(5, c)).astype(np.float32))
    plain = nn.MoE(c, experts, 2).init_parameters(seed=3)
    ep = nn.MoE(c, experts, 2, ep_group=world).init_parameters(seed=3)
    ddp = dist.DistributedDataParallel(ep)
    loss_plain = (plain(x) ** 2).mean() + plain.aux_loss
    loss_plain.backward()
    loss_ep = (ddp(x) ** 2).mean() + ep.aux_loss
    ddp.backward(loss_ep)
    ddp.finish()
    assert loss_ep.item() == pytest.approx(loss_plain.item(), rel=1e-6)
    for (name, p), (_, q) in zip(ep.named_parameters(), plain.named_parameters()):
        np.testing.assert_allclose(numpy_of(p.grad), numpy_of(q.grad), rtol=1e-6, atol=1e-7,
                                   err_msg=name)
    # ZeRO (every stage) keeps the experts whole beside its shards: one step is the plain one.
    for stage in (1, 2, 3):
        plain = nn.MoE(c, experts, 2).init_parameters(seed=3)
        ep = nn.MoE(c, experts, 2, ep_group=world).init_parameters(seed=3)
        opt_plain = loom.optim.SGD(plain.parameters(), lr=0.1)
        zero = dist.ZeroRedundancyOptimizer(ep, optimizer_class=loom.optim.SGD, stage=stage,
                                            lr=0.1)
        ((plain(x) ** 2).mean() + plain.aux_loss).backward()
        opt_plain.step()
        zero.backward((ep(x) ** 2).mean() + ep.aux_loss)
        zero.step()
        zero.gather_parameters()
        for (name, p), (_, q) in zip(ep.named_parameters(), plain.named_parameters()):
            np.testing.assert_allclose(numpy_of(p), numpy_of(q), rtol=1e-6, atol=1e-7,
                                       err_msg=f"stage {stage} {name}")
    class Two(loom.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.MoE(c, experts, ep_group=world)
            self.b = nn.MoE(c, experts, ep_group=world.split(color=0, key=0, name="other"))
    with pytest.raises(ValueError, match="different ep groups"):
        dist.DistributedDataParallel(Two())


def test_gpt_with_moe_blocks_saves_loads_and_accumulates_as_the_whole_batch(tmp_path):
    # loom.nn.GPT(moe=MoEConfig(...)) builds loom-gpt's MoE model: its blocks' names, a file
    # loom.save_gpt writes and GPT.from_file reads back (the MoE shape with it); two micro-batches
    # after a routing pass (moe_begin_batch over the GPT) give the whole batch's loss and
    # gradients: each micro-batch's cross-entropy halved, its auxiliary share added whole.
    config = nn.GPTConfig(max_seq_len=8, vocab=11, layers=2, heads=2, channels=16)
    moe = nn.MoEConfig(4, top_k=2, every=2, capacity_factor=1.0, aux_loss_coef=0.05,
                       z_loss_coef=0.01)
    model = nn.GPT(config, moe=moe, seed=3)
    names = dict(model.named_parameters())
    assert "blocks.0.mlp.experts.3.fc.weight" in names and "blocks.0.mlp.router.weight" in names
    assert "blocks.1.mlp.fc.weight" in names  # every=2: block 1 is dense
    assert len(model.moe_layers()) == 1
    rng = np.random.default_rng(5)
    idx = loom.tensor(rng.integers(0, 11, size=(4, 8)), dtype=loom.int64)
    targets = loom.tensor(rng.integers(0, 11, size=(4, 8)), dtype=loom.int64)
    whole = model.loss(idx, targets)
    assert whole.item() > model.last_lm_loss  # the auxiliary losses are added
    whole.backward()
    want = {n: numpy_of(p.grad) for n, p in model.named_parameters() if p.grad is not None}
    assert model.moe_layers()[0].dropped > 0, "the test needs capacity drops"

    path = str(tmp_path / "moe.safetensors")
    loom.save_gpt(path, config, model.state_dict(), moe=model.moe)
    again = nn.GPT.from_file(path)
    got_moe = again.moe
    assert (got_moe.experts, got_moe.top_k, got_moe.every, got_moe.capacity_factor,
            got_moe.aux_loss_coef, got_moe.z_loss_coef) == (4, 2, 2, 1.0, 0.05, 0.01)
    for n, p in model.named_parameters():
        np.testing.assert_array_equal(numpy_of(dict(again.named_parameters())[n]), numpy_of(p))

    assert loom.nn.utils.moe_begin_batch(again, 2) == 1
    halves = [(idx[:2], targets[:2]), (idx[2:], targets[2:])]
    with loom.no_grad():  # the routing pass
        for x, y in halves:
            again.loss(x, y)
    total = 0.0
    for x, y in halves:
        loss = again.loss(x, y)
        aux = sum(m.aux_loss for m in again.moe_layers())
        part = loss * 0.5 + aux * 0.5  # (cross-entropy) / 2 + aux
        total += part.item()
        part.backward()
    np.testing.assert_allclose(total, whole.item(), rtol=RTOL, atol=ATOL)
    for n, p in again.named_parameters():
        if n in want:
            np.testing.assert_allclose(numpy_of(p.grad), want[n], rtol=RTOL, atol=ATOL,
                                       err_msg=n)
