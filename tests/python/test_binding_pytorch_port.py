"""A PyTorch training script for a tiny GPT, run once with ``lib = torch`` and once with
``lib = loom``, trains to the same losses from the same weights (issue 19, Proof: the converted
training script).

The script (``_make_model`` + ``_train``) is what a PyTorch user writes: a nanoGPT-style model
(2 blocks, dim 32, 2 heads, vocab 50, seq 16, embedding tied to the output head, dropout 0),
AdamW with two parameter groups (weight decay on matrices only), a LambdaLR warmup + cosine
schedule, ``clip_grad_norm_``, and a TensorDataset + DataLoader (batch 8, shuffle=False) over a
fixed random token array, 50 steps over 5 passes. torch's initial weights are copied into loom's
model through ``state_dict`` / ``load_state_dict`` (numpy in between), so both start equal.
Dropout is 0 because the two libraries draw different masks.

The lines that differ for loom, each marked ``LOOM:`` where it is:
- Attention: ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` on both where the
  library has it; Debian's torch 1.13 does not (it came in torch 2.0), so torch runs the
  nanoGPT fallback (masked softmax). That is torch's gap, not loom's.
  ``test_gpt_script_manual_attention_matches_torch`` runs the fallback on both, which also
  exercises register_buffer / tril / slicing / ``==`` / masked_fill / softmax.
- ``q.view(B, T, nh, hs)`` on a part of ``qkv.split(C, dim=2)`` (non-contiguous): torch allows a view when
  the strides fit, loom's ``view`` requires a contiguous tensor (documented in its error);
  loom uses ``reshape`` (torch's reshape would also not copy there).
- Weight tying: nanoGPT's ``self.wte.weight = self.lm_head.weight`` raises a TypeError in loom
  (built-in modules keep their own tensors). The script ties the other way on both libraries,
  ``F.linear(x, self.wte.weight)`` as the head (gap; ``test_weight_tying_by_assignment`` is an
  expected failure that runs the full comparison once loom accepts the assignment).
- Init: loom has no ``nn.init``; ``_init_weights`` uses ``weight.normal_(mean, std)`` /
  ``bias.zero_()`` under ``lib.no_grad()`` on both instead of ``torch.nn.init.normal_`` /
  ``zeros_`` (gap; loom's draws are overwritten with torch's weights anyway).
- ``torch.long`` does not exist as ``loom.long``; the script avoids it by ``lib.arange(T)``,
  which is int64 in both, so no line differs for it (gap noted, not a difference).
Everything else (modules, ModuleList, apply, parameter groups, LambdaLR, clip_grad_norm_,
DataLoader, ``cross_entropy(logits.view(-1, V), y.view(-1))``, ``.item()``,
``zero_grad(set_to_none=True)``) is the same line in both.

Losses are compared with an absolute tolerance of 1e-4: they are cross-entropies of order 1
(ln 50 = 3.9 at the start), so an absolute bound is the stricter reading of "within 1e-4" and does
not loosen as the loss grows (the observed gap is ~5e-7). Final parameters are compared with atol
1e-5 (observed ~3e-6), except the key third of each ``c_attn.bias``: its exact gradient is zero
(it shifts a whole softmax row), so Adam turns rounding noise into ~lr-sized steps in both
libraries and only the summed learning rate bounds the difference.
"""

import math

import numpy as np
import pytest

import loom
import loom.nn.functional  # noqa: F401  (lib.nn.functional below)
import loom.optim.lr_scheduler  # noqa: F401
import loom.utils.data  # noqa: F401

torch = pytest.importorskip("torch")
import torch.nn.functional  # noqa: E402,F401
import torch.optim.lr_scheduler  # noqa: E402,F401
import torch.utils.data  # noqa: E402,F401

VOCAB, SEQ, DIM, HEADS, LAYERS, BATCH = 50, 16, 32, 2, 2, 8
STEPS, PASSES = 50, 5
ROWS = STEPS * BATCH // PASSES  # 80 sequences: 10 batches a pass
WARMUP, LR, MIN_LR = 5, 3e-3, 3e-4
LOSS_ATOL = 1e-4
PARAM_ATOL = 1e-5


def _tokens():
    """The fixed (ROWS, SEQ + 1) int64 token array both runs read."""
    return np.random.default_rng(1234).integers(0, VOCAB, size=(ROWS, SEQ + 1), dtype=np.int64)


def _make_model(lib, sdpa, tie_by_assignment=False):
    """The GPT class as a PyTorch user writes it, with lib.nn in place of torch.nn."""
    nn = lib.nn
    F = lib.nn.functional
    use_sdpa = sdpa and hasattr(F, "scaled_dot_product_attention")

    class CausalSelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(DIM, 3 * DIM)  # weight (3C, C)
            self.c_proj = nn.Linear(DIM, DIM)
            self.attn_dropout = nn.Dropout(0.0)
            self.resid_dropout = nn.Dropout(0.0)
            if not use_sdpa:
                self.register_buffer("bias", lib.tril(lib.ones(SEQ, SEQ)).view(1, 1, SEQ, SEQ),
                                     persistent=False)

        def forward(self, x):
            B, T, C = x.size()
            qkv = self.c_attn(x)  # (B, T, 3C)
            q, k, v = qkv.split(C, dim=2)
            if lib is loom:
                # LOOM: view refuses a non-contiguous tensor even where the strides fit (torch
                # allows it); reshape is the same tensor here.
                q = q.reshape(B, T, HEADS, C // HEADS).transpose(1, 2)  # (B, nh, T, hs)
                k = k.reshape(B, T, HEADS, C // HEADS).transpose(1, 2)
                v = v.reshape(B, T, HEADS, C // HEADS).transpose(1, 2)
            else:
                q = q.view(B, T, HEADS, C // HEADS).transpose(1, 2)  # (B, nh, T, hs)
                k = k.view(B, T, HEADS, C // HEADS).transpose(1, 2)
                v = v.view(B, T, HEADS, C // HEADS).transpose(1, 2)
            if use_sdpa:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                # nanoGPT's fallback: torch 1.13 has no scaled_dot_product_attention.
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
                att = F.softmax(att, dim=-1)
                att = self.attn_dropout(att)
                y = att @ v  # (B, nh, T, hs)
            y = y.transpose(1, 2).contiguous().view(B, T, C)
            return self.resid_dropout(self.c_proj(y))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(DIM, 4 * DIM)
            self.gelu = nn.GELU(approximate="tanh")
            self.c_proj = nn.Linear(4 * DIM, DIM)
            self.dropout = nn.Dropout(0.0)

        def forward(self, x):
            return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(DIM)
            self.attn = CausalSelfAttention()
            self.ln_2 = nn.LayerNorm(DIM)
            self.mlp = MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(VOCAB, DIM)
            self.wpe = nn.Embedding(SEQ, DIM)
            self.drop = nn.Dropout(0.0)
            self.h = nn.ModuleList([Block() for _ in range(LAYERS)])
            self.ln_f = nn.LayerNorm(DIM)
            if tie_by_assignment:
                # nanoGPT's tying; loom refuses it (test_weight_tying_by_assignment).
                self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
                self.wte.weight = self.lm_head.weight
            self.apply(self._init_weights)

        def _init_weights(self, module):
            # LOOM: loom has no nn.init, so the tensor methods (the same line in both) stand in
            # for nanoGPT's torch.nn.init.normal_ / zeros_. loom's draws are overwritten below
            # by torch's weights anyway.
            with lib.no_grad():
                if isinstance(module, (nn.Linear, nn.Embedding)):
                    module.weight.normal_(mean=0.0, std=0.02)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.zero_()

        def forward(self, idx):
            B, T = idx.size()
            pos = lib.arange(T)  # (T,) int64
            x = self.drop(self.wte(idx) + self.wpe(pos))
            for block in self.h:
                x = block(x)
            x = self.ln_f(x)
            if tie_by_assignment:
                return self.lm_head(x)  # (B, T, V)
            # LOOM: the head reuses the embedding's weight through F.linear (the same line in
            # both) because loom cannot tie two built-in modules' weights by assignment.
            return F.linear(x, self.wte.weight)  # (B, T, V)

    return GPT()


def _train(lib, model):
    """The training loop, the same lines for torch and loom. Returns per-step losses, gradient
    norms and learning rates."""
    F = lib.nn.functional
    data = lib.tensor(_tokens())
    dataset = lib.utils.data.TensorDataset(data[:, :-1], data[:, 1:])
    loader = lib.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=False)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = lib.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=LR, betas=(0.9, 0.95), eps=1e-8)

    def lr_lambda(step):
        if step < WARMUP:
            return (step + 1) / WARMUP
        progress = (step - WARMUP) / (STEPS - WARMUP)
        return (MIN_LR + 0.5 * (LR - MIN_LR) * (1 + math.cos(math.pi * progress))) / LR

    scheduler = lib.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)

    losses, norms, lrs = [], [], []
    model.train()
    for _ in range(PASSES):
        for x, y in loader:
            logits = model(x)
            loss = F.cross_entropy(logits.view(-1, VOCAB), y.view(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            norm = lib.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            lrs.append(scheduler.get_last_lr()[0])
            scheduler.step()
            losses.append(loss.item())
            norms.append(float(norm))
    return np.array(losses), np.array(norms), np.array(lrs)


def _run_both(sdpa, tie_by_assignment=False):
    torch.manual_seed(0)
    torch_model = _make_model(torch, sdpa, tie_by_assignment)
    loom_model = _make_model(loom, sdpa, tie_by_assignment)
    state = {k: v.detach().numpy().copy() for k, v in torch_model.state_dict().items()}
    loom_model.load_state_dict(state)
    for k, v in loom_model.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), state[k], err_msg=f"initial {k}")

    t_losses, t_norms, t_lrs = _train(torch, torch_model)
    l_losses, l_norms, l_lrs = _train(loom, loom_model)

    assert len(t_losses) == len(l_losses) == STEPS
    np.testing.assert_allclose(l_lrs, t_lrs, rtol=1e-12, atol=0)
    np.testing.assert_allclose(l_losses, t_losses, rtol=0, atol=LOSS_ATOL,
                               err_msg="per-step losses")
    np.testing.assert_allclose(l_norms, t_norms, rtol=1e-3, atol=1e-4,
                               err_msg="per-step gradient norms")
    # Random tokens: the model can only start memorising the 80 rows, but the loss must move.
    assert t_losses[-1] < t_losses[0] - 0.1, "the script should learn something"

    t_final = {k: v.detach().numpy() for k, v in torch_model.state_dict().items()}
    l_final = {k: v.numpy() for k, v in loom_model.state_dict().items()}
    assert l_final.keys() == t_final.keys()
    key_bias = slice(DIM, 2 * DIM)  # c_attn.bias is (3C,): q, k, v
    for k in t_final:
        want, got = t_final[k].copy(), l_final[k].copy()
        if k.endswith("attn.c_attn.bias"):
            # The key bias adds q·b_k to every score of a softmax row, so its exact gradient is
            # zero: both libraries update it from float rounding noise, which Adam rescales to
            # steps of up to ~lr. It can only be bounded by the summed learning rates; every
            # other parameter is held to PARAM_ATOL.
            np.testing.assert_allclose(got[key_bias], want[key_bias], rtol=0, atol=t_lrs.sum(),
                                       err_msg=f"final {k} (key part)")
            want[key_bias] = got[key_bias] = 0.0
        np.testing.assert_allclose(got, want, rtol=0, atol=PARAM_ATOL, err_msg=f"final {k}")
    return np.abs(l_losses - t_losses).max()


def test_gpt_script_sdpa_matches_torch():
    """The script with scaled_dot_product_attention where the library has it (loom's fused
    causal kernel against torch 1.13's masked softmax fallback)."""
    _run_both(sdpa=True)


def test_gpt_script_manual_attention_matches_torch():
    """The script with nanoGPT's explicit masked-softmax attention on both libraries."""
    _run_both(sdpa=False)


def test_weight_tying_by_assignment():
    """nanoGPT's ``self.wte.weight = self.lm_head.weight``: loom's built-in modules keep their own
    tensors and refuse the assignment with a TypeError, so this is an expected failure until loom
    can share a Parameter between built-in modules; then it runs the full comparison."""
    try:
        _make_model(loom, sdpa=True, tie_by_assignment=True)
    except TypeError as e:
        pytest.xfail(f"loom cannot tie built-in modules' weights by assignment: {e}")
    _run_both(sdpa=True, tie_by_assignment=True)
