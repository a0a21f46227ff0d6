"""loom.nn's PyTorch-shaped surface against PyTorch (Debian's python3-torch): activation modules
(values and gradients), RMSNorm, scaled_dot_product_attention (causal / not, float and uint8
masks, the fused path against the composed one), containers (Sequential, ModuleDict,
ParameterList, ParameterDict), buffers in state dicts, apply, requires_grad_, copy.deepcopy of
Python and built-in modules, nn.Parameter assigned to a built-in module's weight, and a
Sequential MLP trained with SGD for a few steps from torch's weights giving torch's losses and
parameters.

Tolerances: float32 on both sides with different summation orders and math libraries: rtol 1e-5
/ atol 1e-6 for values and gradients unless a test says otherwise.
"""

import collections
import copy

import numpy as np
import pytest

import loom
import loom.nn as nn
import loom.nn.functional as F

torch = pytest.importorskip("torch")
TF = torch.nn.functional
rng = np.random.default_rng(1914)

import torch_twins  # noqa: E402  (imports torch: after the skip)
from torch_twins import pair  # noqa: E402

RTOL, ATOL = 1e-5, 1e-6


def check(loom_out, torch_out, leaves, rtol=RTOL, atol=ATOL):
    torch_twins.check(loom_out, torch_out, leaves, rng, rtol, atol)


def values(module):
    return {k: v.detach().numpy().copy() for k, v in module.state_dict().items()}


# ---------------------------------------------------------------- activations

ACTIVATIONS = {
    "ReLU": (lambda: nn.ReLU(), lambda: torch.nn.ReLU()),
    "GELU_tanh": (lambda: nn.GELU(approximate="tanh"), lambda: torch.nn.GELU(approximate="tanh")),
    "SiLU": (lambda: nn.SiLU(), lambda: torch.nn.SiLU()),
    "Tanh": (lambda: nn.Tanh(), lambda: torch.nn.Tanh()),
    "Sigmoid": (lambda: nn.Sigmoid(), lambda: torch.nn.Sigmoid()),
    "Softmax_dim1": (lambda: nn.Softmax(dim=1), lambda: torch.nn.Softmax(dim=1)),
    "Softmax_dim0": (lambda: nn.Softmax(dim=0), lambda: torch.nn.Softmax(dim=0)),
    "LogSoftmax_dim1": (lambda: nn.LogSoftmax(dim=1), lambda: torch.nn.LogSoftmax(dim=1)),
    "LogSoftmax_last": (lambda: nn.LogSoftmax(dim=-1), lambda: torch.nn.LogSoftmax(dim=-1)),
    "Identity": (lambda: nn.Identity(3, unused=True), lambda: torch.nn.Identity(3, unused=True)),
    "Flatten": (lambda: nn.Flatten(), lambda: torch.nn.Flatten()),
}


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activation_modules_match_torch(name):
    make_ours, make_theirs = ACTIVATIONS[name]
    x = rng.standard_normal((3, 4, 5)) * 2
    if name == "ReLU":
        x = x + np.sign(x) * 0.1  # away from the kink
    lx, tx = pair(x)
    check(make_ours()(lx), make_theirs()(tx), [(lx, tx)])


def test_exact_gelu_matches_torch():
    if not hasattr(loom._loom, "erf"):
        pytest.skip("loom.erf not built yet")
    lx, tx = pair(rng.standard_normal((4, 7)) * 3)
    check(nn.GELU()(lx), torch.nn.GELU()(tx), [(lx, tx)])
    lx, tx = pair(rng.standard_normal((4, 7)) * 3)
    check(F.gelu(lx, approximate="none"), TF.gelu(tx, approximate="none"), [(lx, tx)])


def test_gelu_defaults_and_errors():
    # nn.GELU() is PyTorch's exact GELU; F.gelu keeps loom's tanh default (GPT-2's).
    assert nn.GELU().approximate == "none"
    x = loom.tensor(np.linspace(-3, 3, 13).astype(np.float32))
    tanh_form = TF.gelu(torch.tensor(x.numpy()), approximate="tanh").numpy()
    np.testing.assert_allclose(F.gelu(x).numpy(), tanh_form, rtol=RTOL, atol=ATOL)
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        nn.GELU(approximate="erf")
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        F.gelu(x, approximate="fast")


def test_sequential_of_activations_reads_as_pytorch():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    assert [n for n, _ in model.named_parameters()] == ["0.weight", "0.bias", "2.weight",
                                                         "2.bias"]
    assert isinstance(model[1], nn.ReLU) and len(model) == 3
    head = model[1:]
    assert isinstance(head, nn.Sequential) and [type(m) for m in head] == [nn.ReLU, nn.Linear]
    assert head[1] is model[2]
    assert "(1): ReLU()" in repr(model)
    named = nn.Sequential(collections.OrderedDict([("fc", nn.Linear(4, 3)), ("act", nn.Tanh())]))
    assert [n for n, _ in named.named_parameters()] == ["fc.weight", "fc.bias"]
    assert named(loom.ones(2, 4)).shape == (2, 3)


# ---------------------------------------------------------------- RMSNorm

def torch_rms_norm(x, shape, weight, eps):
    dims = tuple(range(-len(shape), 0))
    y = x * torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + eps)
    return y if weight is None else y * weight


@pytest.mark.parametrize("shape", [(6,), (3, 6)])
@pytest.mark.parametrize("eps", [None, 1e-3])
def test_rms_norm_matches_torch(shape, eps):
    norm = nn.RMSNorm(shape if len(shape) > 1 else shape[0], eps=eps)
    assert [n for n, _ in norm.named_parameters()] == ["weight"]
    np.testing.assert_array_equal(norm.weight.detach().numpy(), 1.0)
    w = rng.standard_normal(shape).astype(np.float32)
    with loom.no_grad():
        norm.weight.copy_(loom.tensor(w))
    tw = torch.tensor(w, requires_grad=True)
    lx, tx = pair(rng.standard_normal((2, 3) + shape))
    want = torch_rms_norm(tx, shape, tw, torch.finfo(torch.float32).eps if eps is None else eps)
    check(norm(lx), want, [(lx, tx), (norm.weight, tw)])


def test_rms_norm_without_affine_and_errors():
    norm = nn.RMSNorm([4], elementwise_affine=False)
    assert list(norm.parameters()) == [] and norm.weight is None
    lx, tx = pair(rng.standard_normal((5, 4)) * 10)
    check(norm(lx), torch_rms_norm(tx, (4,), None, torch.finfo(torch.float32).eps), [(lx, tx)])
    with pytest.raises(ValueError, match=r"normalized_shape \[3\] must be the trailing dims"):
        F.rms_norm(loom.ones(2, 4), 3)


# ---------------------------------------------------------------- attention

def torch_attention(q, k, v, mask=None, causal=False, scale=None):
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale
    if causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    return torch.softmax(scores, -1) @ v


def qkv(q_shape, k_shape, v_shape):
    return [pair(rng.standard_normal(s)) for s in (q_shape, k_shape, v_shape)]


@pytest.mark.parametrize("causal", [False, True])
def test_fused_attention_matches_torch(causal):
    (lq, tq), (lk, tk), (lv, tv) = qkv((2, 3, 5, 4), (2, 3, 5, 4), (2, 3, 5, 4))
    check(F.scaled_dot_product_attention(lq, lk, lv, is_causal=causal),
          torch_attention(tq, tk, tv, causal=causal), [(lq, tq), (lk, tk), (lv, tv)])


@pytest.mark.parametrize("kind", ["float", "uint8"])
@pytest.mark.parametrize("causal", [False, True])
def test_masked_attention_matches_torch(kind, causal):
    # q 4 positions, k/v 6 (L != S), value width 3 != 4: all on the composed path; the mask
    # broadcasts over heads.
    (lq, tq), (lk, tk), (lv, tv) = qkv((2, 2, 4, 5), (2, 2, 6, 5), (2, 2, 6, 3))
    if kind == "float":
        m = rng.standard_normal((2, 1, 4, 6)).astype(np.float32)
        lm, tm = loom.tensor(m), torch.tensor(m)
    else:
        m = rng.random((2, 1, 4, 6)) < 0.7
        m[..., 0] = True  # every query keeps a key (a fully masked row is NaN in both)
        lm, tm = loom.tensor(m.astype(np.uint8)), torch.tensor(m)
    check(F.scaled_dot_product_attention(lq, lk, lv, attn_mask=lm, is_causal=causal),
          torch_attention(tq, tk, tv, mask=tm, causal=causal), [(lq, tq), (lk, tk), (lv, tv)])


def test_attention_scale_and_3d_inputs_match_torch():
    (lq, tq), (lk, tk), (lv, tv) = qkv((3, 4, 8), (3, 7, 8), (3, 7, 2))
    check(F.scaled_dot_product_attention(lq, lk, lv, is_causal=False, scale=0.3),
          torch_attention(tq, tk, tv, scale=0.3), [(lq, tq), (lk, tk), (lv, tv)])


def test_fused_and_composed_attention_agree():
    # A zero float mask takes the composed path with the same numbers as the fused kernel.
    q, k, v = (loom.tensor(rng.standard_normal((1, 2, 6, 4)).astype(np.float32)) for _ in "qkv")
    zero = loom.zeros(6, 6)
    for causal in (False, True):
        fused = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        composed = F.scaled_dot_product_attention(q, k, v, attn_mask=zero, is_causal=causal)
        np.testing.assert_allclose(fused.numpy(), composed.numpy(), rtol=RTOL, atol=ATOL)


def test_attention_is_causal_default():
    # loom's default (documented): causal without a mask (as loom always was), not causal with a
    # mask (as PyTorch's is_causal=False).
    q, k, v = (loom.tensor(rng.standard_normal((1, 1, 5, 4)).astype(np.float32)) for _ in "qkv")
    np.testing.assert_array_equal(F.scaled_dot_product_attention(q, k, v).numpy(),
                                  F.scaled_dot_product_attention(q, k, v, is_causal=True).numpy())
    assert not np.allclose(F.scaled_dot_product_attention(q, k, v).numpy(),
                           F.scaled_dot_product_attention(q, k, v, is_causal=False).numpy())
    ones = loom.ones(5, 5, dtype=loom.uint8)
    np.testing.assert_allclose(
        F.scaled_dot_product_attention(q, k, v, attn_mask=ones).numpy(),
        F.scaled_dot_product_attention(q, k, v, is_causal=False).numpy(), rtol=RTOL, atol=ATOL)


def test_attention_dropout_and_errors():
    q, k, v = (loom.tensor(rng.standard_normal((1, 2, 8, 4)).astype(np.float32),
                           requires_grad=True) for _ in "qkv")
    plain = F.scaled_dot_product_attention(q, k, v, is_causal=False)
    dropped = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5, is_causal=False)
    assert not np.allclose(plain.detach().numpy(), dropped.detach().numpy())
    dropped.sum().backward()
    assert all(t.grad is not None for t in (q, k, v))
    with pytest.raises(ValueError, match="same leading dims"):
        F.scaled_dot_product_attention(loom.ones(1, 2, 3, 4), loom.ones(1, 2, 3, 5),
                                       loom.ones(1, 2, 3, 4))
    with pytest.raises(TypeError, match="attn_mask must be bool"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=loom.ones(8, 8, dtype=loom.int64))
    masked = F.scaled_dot_product_attention(q, k, v, attn_mask=loom.zeros(8, 8, dtype=loom.uint8))
    assert np.isnan(masked.detach().numpy()).all()  # as PyTorch's math backend


# ---------------------------------------------------------------- buffers, apply, requires_grad_

class WithBuffers(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.scale = nn.Parameter(loom.ones(3))
        self.register_buffer("running", loom.zeros(3))
        self.register_buffer("steps", loom.zeros(1, dtype=loom.int64))
        self.register_buffer("scratch", loom.ones(2), persistent=False)
        self.register_buffer("absent", None)

    def forward(self, x):
        return self.fc(x) * self.scale + self.running


class TorchWithBuffers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)
        self.scale = torch.nn.Parameter(torch.ones(3))
        self.register_buffer("running", torch.zeros(3))
        self.register_buffer("steps", torch.zeros(1, dtype=torch.int64))
        self.register_buffer("scratch", torch.ones(2), persistent=False)
        self.register_buffer("absent", None)


def test_buffers_in_state_dicts_as_pytorch():
    m, t = WithBuffers(), TorchWithBuffers()
    assert list(m.state_dict()) == list(t.state_dict()) == ["scale", "running", "steps",
                                                             "fc.weight", "fc.bias"]
    assert [n for n, _ in m.named_buffers()] == [n for n, _ in t.named_buffers()]
    assert [n for n, _ in m.named_parameters()] == ["scale", "fc.weight", "fc.bias"]
    assert m.absent is None and len(list(m.buffers())) == 3
    # Assigning to a buffer keeps it a buffer; load_state_dict copies into it in place.
    m.running = loom.full((3,), 2.0)
    assert "running" in dict(m.named_buffers())
    state = {k: v.numpy().copy() for k, v in m.state_dict().items()}
    state["running"][:] = [1, 2, 3]
    state["steps"][:] = 7
    held = m.running
    m.load_state_dict(state)
    np.testing.assert_array_equal(held.numpy(), [1, 2, 3])
    assert int(m.steps) == 7
    with pytest.raises(ValueError, match=r"missing keys \['running'\]"):
        m.load_state_dict({k: v for k, v in state.items() if k != "running"})
    out = m(loom.ones(2, 3))
    w, b = m.fc.weight.detach().numpy(), m.fc.bias.detach().numpy()
    np.testing.assert_allclose(out.detach().numpy(), np.ones((2, 3)) @ w.T + b + [1, 2, 3],
                               rtol=RTOL)
    # to(dtype) converts floating buffers only, as PyTorch.
    m.to(loom.bfloat16)
    assert m.running.dtype == loom.bfloat16 and m.steps.dtype == loom.int64
    assert m.scratch.dtype == loom.bfloat16
    with pytest.raises(KeyError, match="already exists"):
        m.register_buffer("scale", loom.ones(1))
    with pytest.raises(TypeError, match="must be a loom.Tensor or None"):
        m.register_buffer("bad", [1, 2])


def test_apply_visits_children_first_and_requires_grad_freezes():
    model = nn.Sequential(nn.Linear(2, 3), nn.Sequential(nn.ReLU(), nn.Linear(3, 1)))
    ref = torch.nn.Sequential(torch.nn.Linear(2, 3),
                              torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(3, 1)))
    seen, ref_seen = [], []
    assert model.apply(lambda m: seen.append(type(m).__name__)) is model
    ref.apply(lambda m: ref_seen.append(type(m).__name__))
    assert seen == ref_seen == ["Linear", "ReLU", "Linear", "Sequential", "Sequential"]

    def zero_linear(m):
        if isinstance(m, nn.Linear):
            with loom.no_grad():
                m.weight.zero_()
    model.apply(zero_linear)
    assert all(not p.detach().numpy().any() for n, p in model.named_parameters() if "weight" in n)

    model.requires_grad_(False)
    assert not any(p.requires_grad for p in model.parameters())
    model[1].requires_grad_(True)
    x = loom.ones(4, 2, requires_grad=True)
    model(x).sum().backward()
    assert model[0].weight.grad is None and model[0].bias.grad is None
    assert model[1][1].weight.grad is not None
    assert x.grad is not None


# ---------------------------------------------------------------- containers

def test_module_dict_and_parameter_containers_name_as_pytorch():
    ours = nn.Module()
    ours.heads = nn.ModuleDict({"cls": nn.Linear(4, 3), "reg": nn.Linear(4, 1)})
    ours.scales = nn.ParameterList([nn.Parameter(loom.ones(2)), loom.zeros(3)])
    ours.table = nn.ParameterDict({"a": loom.ones(1)})
    theirs = torch.nn.Module()
    theirs.heads = torch.nn.ModuleDict({"cls": torch.nn.Linear(4, 3), "reg": torch.nn.Linear(4, 1)})
    theirs.scales = torch.nn.ParameterList([torch.nn.Parameter(torch.ones(2)), torch.zeros(3)])
    theirs.table = torch.nn.ParameterDict({"a": torch.ones(1)})
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert all(p.requires_grad for p in ours.parameters())
    assert isinstance(ours.scales[1], nn.Parameter) and ours.scales[-1].shape == (3,)
    assert "cls" in ours.heads and ours.heads.keys() == ["cls", "reg"]
    assert ours.heads["reg"](loom.ones(5, 4)).shape == (5, 1)
    ours.heads["extra"] = nn.Tanh()
    assert [k for k in ours.heads] == ["cls", "reg", "extra"]
    assert isinstance(ours.heads.pop("extra"), nn.Tanh) and len(ours.heads) == 2
    ours.scales.append(loom.ones(4))
    ours.table["b"] = nn.Parameter(loom.zeros(2))
    assert [n for n, _ in ours.named_parameters()][-3:] == ["scales.2", "table.a", "table.b"]
    with pytest.raises(IndexError, match="out of range"):
        ours.scales[3]
    with pytest.raises(TypeError, match="expected a loom.Tensor"):
        ours.scales.append(3.0)


# ---------------------------------------------------------------- copy.deepcopy

class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.shared = nn.Parameter(loom.tensor(rng.standard_normal(4).astype(np.float32)))
        self.inner = nn.Module()
        self.inner.shared = self.shared
        self.heads = nn.ModuleDict({"a": nn.Linear(4, 2)})
        self.register_buffer("offset", loom.full((4,), 0.5))
        self.note = {"kind": "tied", "sizes": [4, 2]}

    def forward(self, x):
        return self.heads["a"](self.fc(x) * self.shared + self.offset)


def test_deepcopy_of_a_python_model_is_independent_and_equal():
    model = Tied()
    model.fc.eval()
    model(loom.ones(3, 4)).sum().backward()
    clone = copy.deepcopy(model)
    before = values(model)
    assert values(clone).keys() == before.keys()
    for k, v in values(clone).items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)
    originals = dict(model.state_dict(keep_vars=True))
    for k, v in clone.state_dict(keep_vars=True).items():
        assert v.data_ptr() != originals[k].data_ptr(), f"{k} shares memory"
    assert clone.inner.shared is clone.shared and isinstance(clone.shared, nn.Parameter)
    assert clone.shared.grad is None  # gradients are not copied (as PyTorch's Parameter)
    assert clone.note == model.note and clone.note is not model.note
    assert clone.fc.training is False and clone.training is True
    x = loom.tensor(rng.standard_normal((3, 4)).astype(np.float32))
    np.testing.assert_array_equal(clone(x).detach().numpy(), model(x).detach().numpy())
    with loom.no_grad():
        for p in clone.parameters():
            p.fill_(0.0)
        clone.offset.fill_(9.0)
    for k, v in values(model).items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)


def test_deepcopy_of_built_in_models():
    config = nn.GPTConfig(max_seq_len=8, vocab=32, layers=2, heads=2, channels=16)
    gpt = nn.GPT(config).init_parameters(seed=5)
    gpt.to(loom.bfloat16)
    gpt.eval()
    clone = copy.deepcopy(gpt)
    assert isinstance(clone, nn.GPT) and clone.config.layers == 2
    assert not clone.training
    assert all(p.dtype == loom.bfloat16 for p in clone.parameters())
    idx = loom.tensor([[1, 2, 3, 4]], dtype=loom.int64)
    np.testing.assert_array_equal(clone(idx).float().detach().numpy(),
                                  gpt(idx).float().detach().numpy())
    w = gpt.wte.weight
    with loom.no_grad():
        clone.wte.weight.fill_(0.0)
    assert w.float().detach().numpy().any()
    with pytest.raises(TypeError, match="child of a built-in module"):
        copy.deepcopy(gpt.blocks[0])
    lin = nn.Linear(3, 2, bias=False)
    lin.weight.requires_grad_(False)
    lin_clone = copy.deepcopy(lin)
    assert lin_clone.bias is None and not lin_clone.weight.requires_grad
    np.testing.assert_array_equal(lin_clone.weight.detach().numpy(), lin.weight.detach().numpy())


def test_deepcopy_refuses_containers_of_tensors_clearly():
    m = nn.Module()
    m.cache = [loom.ones(2)]
    with pytest.raises(TypeError, match="attribute 'cache'.*register_buffer"):
        copy.deepcopy(m)


# ---------------------------------------------------------------- Parameter on built-in modules

def test_parameter_assigned_to_a_built_in_weight_sets_its_values():
    lin = nn.Linear(3, 2)
    w = rng.standard_normal((2, 3)).astype(np.float32)
    lin.weight = nn.Parameter(loom.tensor(w))
    np.testing.assert_array_equal(lin.weight.detach().numpy(), w)
    np.testing.assert_allclose(lin(loom.ones(1, 3)).detach().numpy(),
                               w.sum(1)[None] + lin.bias.detach().numpy(), rtol=RTOL)
    lin.bias = nn.Parameter(loom.zeros(2), requires_grad=False)
    assert not lin.bias.requires_grad
    assert [n for n, _ in lin.named_parameters()] == ["weight", "bias"]
    with pytest.raises(ValueError, match=r"shape \[3, 3\] to Linear.weight of shape \[2, 3\]"):
        lin.weight = nn.Parameter(loom.zeros(3, 3))
    with pytest.raises(TypeError, match="takes another parameter .* or a loom.nn.Parameter"):
        lin.weight = loom.ones(2, 3)  # a plain tensor that is no parameter


def test_weight_tying_between_built_in_modules():
    # nanoGPT's `self.transformer.wte.weight = self.lm_head.weight`: one tensor in both modules,
    # listed once, updated once, its gradient the sum of both uses (against PyTorch's tying).
    class Tied(nn.Module):
        def __init__(self, lib_nn):
            super().__init__()
            self.wte = lib_nn.Embedding(7, 4)
            self.ln = lib_nn.LayerNorm(4)
            self.lm_head = lib_nn.Linear(4, 7, bias=False)
            self.wte.weight = self.lm_head.weight

        def forward(self, idx):
            return self.lm_head(self.ln(self.wte(idx)))

    model = Tied(nn)
    assert model.wte.weight._identity() == model.lm_head.weight._identity()
    assert [n for n, _ in model.named_parameters()] == ["wte.weight", "ln.weight", "ln.bias"]
    assert len(list(model.named_parameters(remove_duplicate=False))) == 4
    assert list(model.state_dict()) == ["wte.weight", "ln.weight", "ln.bias", "lm_head.weight"]
    twin = copy.deepcopy(model)  # the copy is tied too, to a tensor of its own
    assert twin.wte.weight._identity() == twin.lm_head.weight._identity()
    assert twin.wte.weight._identity() != model.wte.weight._identity()
    assert len(list(twin.parameters())) == 3

    class TorchTied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = torch.nn.Embedding(7, 4)
            self.ln = torch.nn.LayerNorm(4)
            self.lm_head = torch.nn.Linear(4, 7, bias=False)
            self.wte.weight = self.lm_head.weight

        def forward(self, idx):
            return self.lm_head(self.ln(self.wte(idx)))

    ref = TorchTied()
    model.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()})
    idx = rng.integers(0, 7, (3, 5))
    opt = loom.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(3):
        out = model(loom.tensor(idx))
        ref_out = ref(torch.tensor(idx))
        np.testing.assert_allclose(out.detach().numpy(), ref_out.detach().numpy(), rtol=1e-5,
                                   atol=1e-6)
        (out ** 2).mean().backward()
        (ref_out ** 2).mean().backward()
        # atol 1e-6 (was 1e-7, which failed about 1 run in 10 at 1.9e-7): a gradient element
        # near zero sums both uses' terms of order 1e-2..1, so it carries their f32 rounding
        # (an ulp of 0.5 is 6e-8) in absolute terms, not relative to itself.
        np.testing.assert_allclose(model.lm_head.weight.grad.numpy(),
                                   ref.lm_head.weight.grad.numpy(), rtol=1e-5, atol=1e-6)
        opt.step(), ref_opt.step()
        opt.zero_grad(), ref_opt.zero_grad()
    np.testing.assert_allclose(model.wte.weight.detach().numpy(),
                               ref.wte.weight.detach().numpy(), rtol=1e-5, atol=1e-6)
    # What cannot be tied says so.
    with pytest.raises(ValueError, match=r"is \[7, 4\] f32 on cpu; it cannot be tied to a \[4\]"):
        model.lm_head.weight = model.ln.weight
    shard = nn.ColumnParallelLinear(4, 8, loom.distributed.world())
    with pytest.raises(ValueError, match="is a tensor-parallel shard; it cannot be tied"):
        shard.weight = nn.Linear(4, 8).weight


# ---------------------------------------------------------------- training equals PyTorch's

def test_sequential_mlp_sgd_training_matches_torch():
    model = nn.Sequential(nn.Linear(4, 16), nn.GELU(approximate="tanh"), nn.Linear(16, 16),
                          nn.SiLU(), nn.Linear(16, 3))
    ref = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.GELU(approximate="tanh"),
                              torch.nn.Linear(16, 16), torch.nn.SiLU(), torch.nn.Linear(16, 3))
    ref.load_state_dict({k: torch.tensor(v) for k, v in values(model).items()})
    opt = loom.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.2, momentum=0.9)
    criterion, ref_criterion = nn.CrossEntropyLoss(), torch.nn.CrossEntropyLoss()
    for step in range(6):
        x = rng.standard_normal((8, 4)).astype(np.float32)
        y = rng.integers(0, 3, size=8)
        loss = criterion(model(loom.tensor(x)), loom.tensor(y))
        ref_loss = ref_criterion(ref(torch.tensor(x)), torch.tensor(y))
        np.testing.assert_allclose(loss.item(), ref_loss.item(), rtol=1e-5, err_msg=f"step {step}")
        opt.zero_grad()
        loss.backward()
        opt.step()
        ref_opt.zero_grad()
        ref_loss.backward()
        ref_opt.step()
    # Six steps of float32 updates with different summation orders: 1e-5 relative.
    for k, v in values(model).items():
        np.testing.assert_allclose(v, ref.state_dict()[k].numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=k)
