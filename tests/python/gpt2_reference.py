"""A minimal GPT-2 in PyTorch that reads and writes llm.c's files: the reference loom is
checked against (loss and one SGD step on a checkpoint) and the peer it is benchmarked against.

It follows llm.c's train_gpt2.py: pre-LayerNorm blocks, tanh-GELU, learned positions, output
head tied to the token embedding. The checkpoint's wte has padded_vocab rows; like llm.c, the
model uses only the first `vocab` of them, so padded rows get no probability and no gradient.
"""
import math
import struct

import numpy as np
import torch
import torch.nn.functional as F

MODEL_MAGIC, MODEL_VERSION = 20240326, 3
TOKENS_MAGIC, TOKENS_VERSION = 20240520, 1

# (name, shape as a function of the config): the order of llm.c's model file.
def llmc_layout(cfg):
    L, C, V, T = cfg["layers"], cfg["channels"], cfg["padded_vocab"], cfg["max_seq_len"]
    return [("wte", (V, C)), ("wpe", (T, C)), ("ln1w", (L, C)), ("ln1b", (L, C)),
            ("qkvw", (L, 3 * C, C)), ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)),
            ("attprojb", (L, C)), ("ln2w", (L, C)), ("ln2b", (L, C)), ("fcw", (L, 4 * C, C)),
            ("fcb", (L, 4 * C)), ("fcprojw", (L, C, 4 * C)), ("fcprojb", (L, C)),
            ("lnfw", (C,)), ("lnfb", (C,))]


def read_checkpoint(path):
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(256 * 4), dtype=np.int32)
        assert header[0] == MODEL_MAGIC and header[1] == MODEL_VERSION, "not an f32 llm.c model"
        cfg = dict(max_seq_len=int(header[2]), vocab=int(header[3]), layers=int(header[4]),
                   heads=int(header[5]), channels=int(header[6]), padded_vocab=int(header[7]))
        params = {}
        for name, shape in llmc_layout(cfg):
            n = int(np.prod(shape))
            data = np.frombuffer(f.read(n * 4), dtype=np.float32)
            assert data.size == n, f"truncated checkpoint at {name}"
            params[name] = torch.tensor(data.reshape(shape))
    return cfg, params


def write_checkpoint(path, cfg, params):
    header = np.zeros(256, dtype=np.int32)
    header[:8] = [MODEL_MAGIC, MODEL_VERSION, cfg["max_seq_len"], cfg["vocab"], cfg["layers"],
                  cfg["heads"], cfg["channels"], cfg["padded_vocab"]]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for name, shape in llmc_layout(cfg):
            t = params[name].detach().to(torch.float32).contiguous()
            assert tuple(t.shape) == shape, (name, t.shape, shape)
            f.write(t.numpy().tobytes())


def random_checkpoint(cfg, seed):
    """GPT-2-style random weights (std 0.02, residual projections scaled), padded rows zero."""
    g = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape in llmc_layout(cfg):
        if name in ("ln1w", "ln2w", "lnfw"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif name.endswith("b"):
            t = 0.02 * torch.randn(shape, generator=g)
        else:
            std = 0.02 / math.sqrt(2 * cfg["layers"]) if name in ("attprojw", "fcprojw") else 0.02
            t = std * torch.randn(shape, generator=g)
        params[name] = t
    params["wte"][cfg["vocab"]:] = 0
    return params


def write_tokens(path, tokens):
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [TOKENS_MAGIC, TOKENS_VERSION, len(tokens)]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=np.uint16).tobytes())


def read_tokens(path):
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(256 * 4), dtype=np.int32)
        assert header[0] == TOKENS_MAGIC and header[1] == TOKENS_VERSION
        return np.frombuffer(f.read(int(header[2]) * 2), dtype=np.uint16).astype(np.int64)


def batch(tokens, k, B, T):
    """Batch k as llm.c's loader reads it: B*T+1 consecutive tokens from position k*B*T."""
    start = k * B * T
    chunk = torch.tensor(tokens[start:start + B * T + 1])
    return chunk[:-1].view(B, T), chunk[1:].view(B, T)


def forward_loss(cfg, p, idx, targets):
    logits = forward_logits(cfg, p, idx)
    return F.cross_entropy(logits.view(-1, cfg["vocab"]), targets.reshape(-1))


def forward_logits(cfg, p, idx):
    """Logits [B, T, vocab] (the real vocabulary's columns only)."""
    B, T = idx.shape
    C, H, V = cfg["channels"], cfg["heads"], cfg["vocab"]
    wte = p["wte"][:V]
    x = wte[idx] + p["wpe"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(cfg["layers"]):
        h = F.layer_norm(x, (C,), p["ln1w"][l], p["ln1b"][l], 1e-5)
        qkv = h @ p["qkvw"][l].t() + p["qkvb"][l]
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + y @ p["attprojw"][l].t() + p["attprojb"][l]
        h = F.layer_norm(x, (C,), p["ln2w"][l], p["ln2b"][l], 1e-5)
        h = F.gelu(h @ p["fcw"][l].t() + p["fcb"][l], approximate="tanh")
        x = x + h @ p["fcprojw"][l].t() + p["fcprojb"][l]
    x = F.layer_norm(x, (C,), p["lnfw"], p["lnfb"], 1e-5)
    return x @ wte.t()


def leaf_params(params):
    return {k: v.clone().requires_grad_(True) for k, v in params.items()}
