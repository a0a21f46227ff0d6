"""loom.nn: Python-defined modules (registration, traversal, state dicts, modes, conversion),
gradients of a Python MLP against finite differences, a Python GPT block built from
loom.nn.functional against the built-in C++ Block, the built-in GPT (deterministic init, training
with AdamW), load_state_dict errors, and reference counts over many training steps."""

import gc
import sys
import tracemalloc

import numpy as np
import pytest

import loom
import loom.nn as nn
import loom.nn.functional as F
from binding_testing import f32, numeric_grad


# ---------------------------------------------------------------- a Python-defined MLP

class PyLinear(nn.Module):
    def __init__(self, n_in, n_out, rng):
        super().__init__()
        self.weight = nn.Parameter(loom.tensor(rng.standard_normal((n_out, n_in), dtype=np.float32)
                                               * 0.5))
        self.bias = nn.Parameter(loom.tensor(rng.standard_normal(n_out, dtype=np.float32) * 0.1))

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class MLP(nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.fc = PyLinear(4, 8, rng)
        self.scale = nn.Parameter(loom.ones(8))
        self.head = nn.Linear(8, 3)  # a built-in (C++) child
        self.note = "not a parameter"

    def forward(self, x):
        return self.head(F.gelu(self.fc(x)) * self.scale)


def test_registration_and_traversal():
    m = MLP()
    names = [n for n, _ in m.named_parameters()]
    assert names == ["scale", "fc.weight", "fc.bias", "head.weight", "head.bias"]
    assert [n for n, _ in m.named_children()] == ["fc", "head"]
    assert [type(c).__name__ for c in m.children()] == ["PyLinear", "Linear"]
    assert [n for n, _ in m.named_modules()] == ["", "fc", "head"]
    assert len(list(m.modules())) == 3
    assert isinstance(m.head, nn.Module) and isinstance(m.scale, nn.Parameter)
    assert m.note == "not a parameter"
    assert m.num_parameters() == 8 + 32 + 8 + 24 + 3
    assert m.head.weight._same_as(dict(m.named_parameters())["head.weight"])
    # Reassigning replaces; a plain tensor that is not a leaf requiring grad cannot be a parameter.
    m.scale = nn.Parameter(loom.full([8], 2.0))
    assert [n for n, _ in m.named_parameters()][0] == "scale"
    with pytest.raises(TypeError, match="scale"):
        m.scale = loom.ones(8)
    del m.note
    with pytest.raises(AttributeError):
        m.note


def test_state_dict_shares_memory_and_round_trips():
    a, b = MLP(seed=0), MLP(seed=1)
    sd = a.state_dict()
    assert list(sd) == [n for n, _ in a.named_parameters()]
    assert not sd["fc.weight"].requires_grad
    with loom.no_grad():
        a.fc.weight.fill_(3.0)
    assert np.all(sd["fc.weight"].numpy() == 3.0)  # the same memory
    x = loom.tensor(np.random.default_rng(5).standard_normal((2, 4), dtype=np.float32))
    assert not np.allclose(a(x).detach().numpy(), b(x).detach().numpy())
    result = b.load_state_dict(a.state_dict())
    assert result.missing_keys == [] and result.unexpected_keys == []
    np.testing.assert_array_equal(a(x).detach().numpy(), b(x).detach().numpy())
    assert not b.fc.weight._same_as(a.fc.weight)  # copied into b's own tensors


def test_load_state_dict_errors_name_the_key():
    m = MLP()
    sd = dict(m.state_dict())
    bad = dict(sd, **{"fc.weight": loom.zeros(3, 3)})
    before = m.head.weight.detach().numpy().copy()
    bad["head.weight"] = loom.zeros(3, 8)
    with pytest.raises(ValueError, match=r"'fc.weight'.*\[3, 3\].*\[8, 4\]"):
        m.load_state_dict(bad)
    np.testing.assert_array_equal(m.head.weight.detach().numpy(), before)  # nothing copied
    with pytest.raises(ValueError, match="dtype"):
        m.load_state_dict(dict(sd, scale=loom.zeros(8, dtype=loom.int32)))
    with pytest.raises(ValueError, match=r"missing keys \['scale'\]"):
        m.load_state_dict({k: v for k, v in sd.items() if k != "scale"})
    with pytest.raises(ValueError, match="unexpected keys.*'extra'"):
        m.load_state_dict(dict(sd, extra=loom.zeros(1)))
    r = m.load_state_dict({k: v for k, v in sd.items() if k != "scale"}, strict=False)
    assert r.missing_keys == ["scale"]
    # numpy values, and bf16 -> f32 conversion, are accepted.
    m.load_state_dict(dict(sd, scale=np.full(8, 0.5, dtype=np.float32)))
    assert np.all(m.scale.detach().numpy() == 0.5)
    # The C++ module's own check names the key too.
    lin = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="weight"):
        lin._cpp.load_state_dict({"weight": loom.zeros(3, 2), "bias": loom.zeros(2)})


def test_modes_zero_grad_and_to():
    m = MLP()
    assert m.training and m.head.training
    m.eval()
    assert not m.training and not m.fc.training and not m.head.training
    m.train()
    assert m.head.training
    m(loom.ones(2, 4)).sum().backward()
    assert all(p.grad is not None for p in m.parameters())
    m.zero_grad()
    assert all(p.grad is None for p in m.parameters())
    params = list(m.parameters())
    m.to(loom.bfloat16)
    assert all(p.dtype == loom.bfloat16 for p in m.parameters())
    assert all(p._same_as(q) for p, q in zip(params, m.parameters()))  # the same tensors
    m.to(dtype=loom.float32)
    assert m.fc.weight.dtype == loom.float32 and m.head.weight.dtype == loom.float32


def test_python_mlp_gradients_match_finite_differences():
    m = MLP(seed=3)
    rng = np.random.default_rng(4)
    x = f32(rng.standard_normal((3, 4)))
    weights = f32(rng.standard_normal((3, 3)))
    names = [n for n, _ in m.named_parameters()]
    values = [f32(p.detach().numpy()) for p in m.parameters()]

    def gelu(z):
        return 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z**3)))

    def ref(scale, w1, b1, w2, b2):
        return (gelu(x @ w1.T + b1) * scale) @ w2.T + b2

    out = m(loom.tensor(x.astype(np.float32)))
    np.testing.assert_allclose(out.detach().numpy(), ref(*values), rtol=1e-5, atol=1e-5)
    (out * loom.tensor(weights.astype(np.float32))).sum().backward()
    for i, (name, p) in enumerate(m.named_parameters()):
        want = numeric_grad(ref, values, i, weights)
        np.testing.assert_allclose(p.grad.numpy(), want, rtol=1e-3, atol=1e-4, err_msg=names[i])


def test_python_mlp_trains():
    m = MLP(seed=0)
    m.init_parameters(seed=1)
    rng = np.random.default_rng(0)
    x = loom.tensor(rng.standard_normal((16, 4), dtype=np.float32))
    y = loom.tensor(rng.integers(0, 3, 16).astype(np.int64))
    opt = loom.optim.SGD(m.parameters(), lr=0.5, momentum=0.9)
    losses = []
    for _ in range(30):
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


# ---------------------------------------------------------------- a Python GPT block

class PyLayerNorm(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.weight = nn.Parameter(loom.ones(c))
        self.bias = nn.Parameter(loom.zeros(c))

    def forward(self, x):
        return F.layer_norm(x, x.shape[-1], self.weight, self.bias, 1e-5)


class PyAttention(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        rng = np.random.default_rng(0)
        self.qkv = PyLinear(c, 3 * c, rng)
        self.proj = PyLinear(c, c, rng)

    def forward(self, x):
        b, t, c = x.shape
        h = self.heads
        qkv = self.qkv(x)

        def heads_first(i):  # [B, T, C] part i of qkv -> [B, H, T, D]
            return qkv.narrow(2, i * c, c).reshape(b, t, h, c // h).transpose(1, 2)

        y = F.scaled_dot_product_attention(heads_first(0), heads_first(1), heads_first(2))
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class PyMLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        rng = np.random.default_rng(1)
        self.fc = PyLinear(c, 4 * c, rng)
        self.proj = PyLinear(4 * c, c, rng)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x)))


class PyBlock(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.ln1 = PyLayerNorm(c)
        self.attn = PyAttention(c, heads)
        self.ln2 = PyLayerNorm(c)
        self.mlp = PyMLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def test_python_gpt_block_matches_the_builtin_block():
    # Same weights (the C++ block's, loaded by name), same input: forward and every gradient
    # agree to f32 rounding of differently ordered sums (rtol 1e-5 / atol 1e-5 forward,
    # rtol 1e-4 / atol 1e-5 gradients).
    c, heads = 32, 4
    builtin = nn.Block(c, heads)
    builtin.init_parameters(seed=7)
    with loom.no_grad():  # nonzero biases and LayerNorm params, so every term is exercised
        rng = np.random.default_rng(2)
        for name, p in builtin.named_parameters():
            if name.endswith("bias") or ".ln" in "." + name:
                p.add_(loom.tensor(rng.standard_normal(p.shape, dtype=np.float32) * 0.1))
    py = PyBlock(c, heads)
    assert [n for n, _ in py.named_parameters()] == [n for n, _ in builtin.named_parameters()]
    py.load_state_dict(builtin.state_dict())
    x_np = np.random.default_rng(3).standard_normal((2, 6, c)).astype(np.float32)
    xs = [loom.tensor(x_np, requires_grad=True) for _ in range(2)]
    outs = [builtin(xs[0]), py(xs[1])]
    np.testing.assert_allclose(outs[1].detach().numpy(), outs[0].detach().numpy(), rtol=1e-5,
                               atol=1e-5)
    w = loom.tensor(np.random.default_rng(4).standard_normal(outs[0].shape).astype(np.float32))
    for out in outs:
        (out * w).sum().backward()
    np.testing.assert_allclose(xs[1].grad.numpy(), xs[0].grad.numpy(), rtol=1e-4, atol=1e-5)
    for (name, p), (_, q) in zip(builtin.named_parameters(), py.named_parameters()):
        np.testing.assert_allclose(q.grad.numpy(), p.grad.numpy(), rtol=1e-4, atol=1e-5,
                                   err_msg=name)


# ---------------------------------------------------------------- the built-in GPT

CONFIG = dict(max_seq_len=16, vocab=50, padded_vocab=64, layers=2, heads=2, channels=32)


def _batch(seed=0, b=4, t=8):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, CONFIG["vocab"], (b, t + 1))
    return (loom.tensor(tokens[:, :-1].astype(np.int64)),
            loom.tensor(tokens[:, 1:].astype(np.int64)))


def test_gpt_names_and_deterministic_init():
    config = nn.GPTConfig(**CONFIG)
    a = nn.GPT(config).init_parameters(seed=1337)
    b = nn.GPT(config).init_parameters(seed=1337)
    c = nn.GPT(config).init_parameters(seed=1)
    names = [n for n, _ in a.named_parameters()]
    assert names[:3] == ["wte.weight", "wpe.weight", "blocks.0.ln1.weight"]
    assert names[-2:] == ["ln_f.weight", "ln_f.bias"]
    assert a.num_parameters() == config.num_parameters()
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    for k in sa:
        np.testing.assert_array_equal(sa[k].numpy(), sb[k].numpy(), err_msg=k)
    assert not np.array_equal(sa["wte.weight"].numpy(), sc["wte.weight"].numpy())
    assert np.all(sa["wte.weight"].numpy()[CONFIG["vocab"]:] == 0)  # padding rows
    idx, targets = _batch()
    assert a(idx).shape == (4, 8, 64)
    assert a.loss(idx, targets).item() == b.loss(idx, targets).item()
    # Children are the GPT's own modules: a block's parameters are the GPT's tensors.
    assert a.blocks[1].attn.qkv.weight._same_as(dict(a.named_parameters())[
        "blocks.1.attn.qkv.weight"])
    assert len(a.blocks) == 2 and a.config.layers == 2


def test_python_model_of_builtin_blocks_gets_the_gpt_init():
    # init_parameters keys built-in children by their full names from the Python root, so a
    # Python model holding a Block at "blocks.0" gets exactly GPT's block 0 (Note [Deterministic
    # init]).
    class Tower(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.Module()
            self.blocks.add_module("0", nn.Block(CONFIG["channels"], CONFIG["heads"],
                                                 proj_std=0.02 / np.sqrt(2 * CONFIG["layers"])))

    tower = Tower().init_parameters(seed=5)
    gpt = nn.GPT(nn.GPTConfig(**CONFIG)).init_parameters(seed=5)
    gpt_sd = gpt.state_dict()
    for name, p in tower.state_dict().items():
        np.testing.assert_array_equal(p.numpy(), gpt_sd[name].numpy(), err_msg=name)


def test_gpt_trains_with_adamw():
    model = nn.GPT(nn.GPTConfig(**CONFIG)).init_parameters(seed=1337)
    opt = loom.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    idx, targets = _batch()
    losses = []
    for _ in range(10):
        loss = model.loss(idx, targets)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(np.log(CONFIG["vocab"]), rel=0.05)
    assert losses[-1] < losses[0] - 0.5
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.loss(loom.tensor([[60]], dtype=loom.int64), loom.tensor([[1]], dtype=loom.int64))


def test_embedding_bag_collection():
    ebc = nn.EmbeddingBagCollection([("user", 10, 4), ("item", 20, 8)])
    assert [n for n, _ in ebc.named_parameters()] == ["user.weight", "item.weight"]
    assert ebc.tables == [("user", 10, 4), ("item", 20, 8)]
    # Batch of 2, two tables, feature-major: user bags then item bags.
    indices = loom.tensor(np.array([1, 2, 3, 4, 5, 6], dtype=np.int64))
    offsets = loom.tensor(np.array([0, 2, 3, 5, 6], dtype=np.int64))
    out = ebc(indices, offsets)
    assert out.shape == (2, 12)
    user = ebc.user.weight.detach().numpy()
    np.testing.assert_allclose(out.detach().numpy()[0, :4], user[1] + user[2], rtol=1e-6)
    out.sum().backward()
    assert ebc.item.weight.grad is not None
    with pytest.raises(ValueError, match="pooling"):
        nn.EmbeddingBagCollection([("t", 4, 4)], pooling="max")


def test_builtin_modules_as_plain_modules():
    lin = nn.Linear(4, 3, bias=False)
    assert [n for n, _ in lin.named_parameters()] == ["weight"] and lin.bias is None
    ln, emb = nn.LayerNorm(6), nn.Embedding(10, 6)
    assert np.all(ln.weight.detach().numpy() == 1)
    assert emb(loom.tensor(np.array([[1, 2]], dtype=np.int64))).shape == (1, 2, 6)
    drop = nn.Dropout(0.5).eval()
    x = loom.ones(4, 4)
    np.testing.assert_array_equal(drop(x).numpy(), x.numpy())
    with pytest.raises(ValueError, match="heads"):
        nn.Block(30, 4)


# ---------------------------------------------------------------- reference counts

def test_training_steps_do_not_leak():
    m = MLP()
    opt = loom.optim.AdamW(m.parameters(), lr=1e-3)
    x = loom.ones(8, 4)
    y = loom.tensor(np.zeros(8, dtype=np.int64))

    def steps(n):
        for _ in range(n):
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            m.state_dict()
            opt.state_dict()

    steps(20)
    gc.collect()
    params = list(m.parameters())
    counts = [sys.getrefcount(p) for p in params]
    live = loom.memory_allocated()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    steps(300)
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    growth = sum(s.size_diff for s in after.compare_to(before, "filename"))
    assert growth < 64 * 1024, f"Python memory grew by {growth} bytes over 300 steps"
    assert [sys.getrefcount(p) for p in params] == counts
    assert loom.memory_allocated() == live


class _Unit(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.gain = nn.Parameter(loom.ones(4))

    def forward(self, x):
        return F.gelu(self.fc(x)) * self.gain


class _Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(loom.full([4], 0.5))
        self.units = nn.ModuleList([_Unit(), _Unit()])

    def forward(self, x):
        for unit in self.units:
            x = unit(x)
        return x * self.scale


def test_python_module_becomes_a_cpp_module_with_the_same_tensors():
    model = _Stack().init_parameters(seed=5)
    node = model._cpp_module()
    assert node is model._cpp_module()  # built once
    py_params = list(model.named_parameters())
    cpp_params = node.named_parameters()
    assert [n for n, _ in cpp_params] == [n for n, _ in py_params] == [
        "scale", "units.0.gain", "units.0.fc.weight", "units.0.fc.bias", "units.1.gain",
        "units.1.fc.weight", "units.1.fc.bias"]
    assert all(a._same_as(b) for (_, a), (_, b) in zip(py_params, cpp_params))
    # A ModuleList's C++ module is a C++ ModuleList (ZeRO-3 makes its entries units), and a
    # built-in child is adopted with its full name.
    assert isinstance(node.children()[0][1], loom._loom.nn.ModuleList)
    assert model.units[1].fc._cpp.full_name == "units.1.fc"
    # C++ callers of forward(x) reach the Python forward.
    x = loom.tensor(np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4))
    np.testing.assert_array_equal(np.asarray(node(x).detach()), np.asarray(model(x).detach()))
    # The structure is fixed once wrapped; values are not.
    with pytest.raises(RuntimeError, match="'extra'.*fixed once a wrapper"):
        model.extra = nn.Parameter(loom.ones(1))
    with pytest.raises(RuntimeError, match="'2'.*fixed once a wrapper"):
        model.units.append(_Unit())
    model.load_state_dict({k: v.detach() * 2 for k, v in model.state_dict().items()})


def test_module_list_and_sequential():
    seq = nn.Sequential(nn.Linear(3, 5), nn.Linear(5, 2))
    x = loom.ones(4, 3)
    expected = seq[1](seq[0](x))
    np.testing.assert_array_equal(np.asarray(seq(x).detach()), np.asarray(expected.detach()))
    assert len(seq) == 2 and [n for n, _ in seq.named_parameters()][:2] == ["0.weight", "0.bias"]
    lst = nn.ModuleList([nn.Linear(2, 2)]).extend([nn.Linear(2, 2)])
    assert len(lst) == 2 and lst[-1] is lst[1]
    with pytest.raises(IndexError, match="index 2 out of range for 2 modules"):
        lst[2]
    with pytest.raises(NotImplementedError, match="iterate over its modules"):
        lst(x)


def test_dropout_modules_in_a_python_model_are_keyed_by_their_names():
    # A built-in Dropout keys its mask by its full name. Inside a model written in Python the
    # names are the model's from the moment the modules are assigned, the same a wrapper's C++
    # tree gives them later (before: every Dropout of an unwrapped model was named "", so all of
    # them drew one mask, and DDP, which builds the tree, drew others than one process).
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Dropout(0.5)
            self.blocks = nn.ModuleList([nn.Sequential(nn.Dropout(0.5))])
            self.b = nn.Dropout(0.5)

    net = Net()
    names = [net.a._cpp.full_name, net.blocks[0][0]._cpp.full_name, net.b._cpp.full_name]
    assert names == ["a", "blocks.0.0", "b"]
    x = loom.ones(8, 16)
    masks = [m(x).numpy() for m in (net.a, net.blocks[0][0], net.b)]
    assert not np.array_equal(masks[0], masks[2]), "two Dropout modules drew one mask"
    assert not np.array_equal(masks[0], masks[1])
    net._cpp_module()  # what DistributedDataParallel / ZeRO / pipelines do: the same names
    assert [net.a._cpp.full_name, net.blocks[0][0]._cpp.full_name, net.b._cpp.full_name] == names
    for m, want in zip((net.a, net.blocks[0][0], net.b), masks):
        assert np.array_equal(m(x).numpy(), want), "building the C++ tree changed a mask"
    # A module assigned into a parent later takes the parent's prefix, its subtree too.
    outer = nn.Module()
    outer.net = net
    assert (net.a._cpp.full_name, net.blocks[0][0]._cpp.full_name) == ("net.a", "net.blocks.0.0")


def test_dropout_masks_advance_with_no_call_from_the_script():
    # python/loom/nn/_dropout.py: loom.optim's step() advances the dropout step; F.dropout numbers
    # its calls within a step. Masks are still pure functions of the key: going back to a step
    # draws that step's masks again.
    x = loom.ones(16, 32)
    drop = nn.Dropout(0.5)
    lin = nn.Linear(32, 4)
    opt = loom.optim.SGD(lin.parameters(), lr=0.1)
    nn.set_dropout_step(5)

    def draw():
        first, second = F.dropout(x, 0.5).numpy(), F.dropout(x, 0.5).numpy()
        return drop(x).numpy(), first, second

    module0, f0a, f0b = draw()
    assert not np.array_equal(f0a, f0b), "two F.dropout calls in one step drew one mask"
    assert np.array_equal(drop(x).numpy(), module0), "a module's mask changed within a step"
    lin(x).sum().backward()
    opt.step()
    assert nn.dropout_step() == 6
    module1, f1a, _ = draw()
    assert not np.array_equal(module0, module1), "nn.Dropout drew the same mask after opt.step()"
    assert not np.array_equal(f0a, f1a), "F.dropout drew the same mask after opt.step()"
    nn.set_dropout_step(5)
    again = draw()
    for got, want in zip(again, (module0, f0a, f0b)):
        assert np.array_equal(got, want), "step 5's masks were not drawn again"
    # An explicit stream keys the call site: the same mask every call.
    assert np.array_equal(F.dropout(x, 0.5, stream="site").numpy(),
                          F.dropout(x, 0.5, stream="site").numpy())
    # Every mask drops about half (scale 2 on the kept ones).
    for m in (module0, f0a, f1a):
        kept = float((m != 0).mean())
        assert 0.35 < kept < 0.65 and set(np.unique(m)) <= {0.0, 2.0}
