#!/usr/bin/env python3
"""A PyTorch user's GPT training script (nanoGPT's model and loop), written once against
``lib.nn`` / ``lib.optim`` / ``lib.utils.data`` and run with ``lib = torch`` or ``lib = loom``.

The lines where loom differs are marked ``LOOM:``; docs/pytorch_to_loom.md lists every
difference. What the script uses: a nanoGPT-style model (token + position embeddings, pre-LN
blocks with causal self-attention and a GELU MLP, the head tied to the token embedding), AdamW
with two parameter groups (weight decay on matrices only), a LambdaLR warmup + cosine schedule,
``clip_grad_norm_``, and a TensorDataset + DataLoader over a fixed random token array.

    python3 examples/nanogpt_port.py --lib loom --steps 50
    python3 examples/nanogpt_port.py --lib torch --steps 50
    mpirun -np 2 python3 examples/nanogpt_port.py --lib loom --dropout 0.1

Under mpirun (loom only) it is the data-parallel script a PyTorch user writes with DDP and a
DistributedSampler: each rank takes batch / world rows of every global batch, the gradients are
averaged, and the losses (averaged over ranks) are the single process's, dropout included
(tests/python/nanogpt_port_mpi_check.py). Rank 0 prints one JSON object per step: step, loss,
grad_norm, lr, step_ms (the time from the previous step's end: fetching the batch, forward,
backward, clipping, the optimizer and schedule steps, the loss).

tests/python/test_binding_pytorch_port.py imports make_model and train and checks that loom's
run equals torch's from the same weights; benchmarks/python_overhead.py times it against
loom-gpt.
"""

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass

import numpy as np


@dataclass
class Config:
    vocab: int = 50
    seq: int = 16
    dim: int = 32
    heads: int = 2
    layers: int = 2
    batch: int = 8  # the global batch: under DDP each rank takes batch / world rows
    steps: int = 50
    passes: int = 5  # the data holds steps * batch / passes rows, read `passes` times
    dropout: float = 0.0
    warmup: int = 5
    lr: float = 3e-3
    min_lr: float = 3e-4
    data_seed: int = 1234

    @property
    def rows(self):
        return self.steps * self.batch // self.passes


def tokens(cfg):
    """The fixed (rows, seq + 1) int64 token array every run reads."""
    return np.random.default_rng(cfg.data_seed).integers(0, cfg.vocab, size=(cfg.rows, cfg.seq + 1),
                                                         dtype=np.int64)


def make_model(lib, cfg, sdpa=True):
    """The GPT class as a PyTorch user writes it, with lib.nn in place of torch.nn."""
    nn = lib.nn
    F = lib.nn.functional
    use_sdpa = sdpa and hasattr(F, "scaled_dot_product_attention")
    C, H, T = cfg.dim, cfg.heads, cfg.seq

    class CausalSelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(C, 3 * C)  # weight (3C, C)
            self.c_proj = nn.Linear(C, C)
            self.attn_dropout = nn.Dropout(cfg.dropout)
            self.resid_dropout = nn.Dropout(cfg.dropout)
            if not use_sdpa:
                self.register_buffer("bias", lib.tril(lib.ones(T, T)).view(1, 1, T, T),
                                     persistent=False)

        def forward(self, x):
            B, T_, C_ = x.size()
            qkv = self.c_attn(x)  # (B, T, 3C)
            q, k, v = qkv.split(C_, dim=2)
            q = q.view(B, T_, H, C_ // H).transpose(1, 2)  # (B, nh, T, hs)
            k = k.view(B, T_, H, C_ // H).transpose(1, 2)
            v = v.view(B, T_, H, C_ // H).transpose(1, 2)
            if use_sdpa:
                y = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=None, dropout_p=cfg.dropout if self.training else 0,
                    is_causal=True)
            else:
                # nanoGPT's fallback: torch 1.13 has no scaled_dot_product_attention.
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                att = att.masked_fill(self.bias[:, :, :T_, :T_] == 0, float("-inf"))
                att = F.softmax(att, dim=-1)
                att = self.attn_dropout(att)
                y = att @ v  # (B, nh, T, hs)
            y = y.transpose(1, 2).contiguous().view(B, T_, C_)
            return self.resid_dropout(self.c_proj(y))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(C, 4 * C)
            self.gelu = nn.GELU(approximate="tanh")
            self.c_proj = nn.Linear(4 * C, C)
            self.dropout = nn.Dropout(cfg.dropout)

        def forward(self, x):
            return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(C)
            self.attn = CausalSelfAttention()
            self.ln_2 = nn.LayerNorm(C)
            self.mlp = MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(cfg.vocab, C)
            self.wpe = nn.Embedding(T, C)
            self.drop = nn.Dropout(cfg.dropout)
            self.h = nn.ModuleList([Block() for _ in range(cfg.layers)])
            self.ln_f = nn.LayerNorm(C)
            self.lm_head = nn.Linear(C, cfg.vocab, bias=False)
            self.wte.weight = self.lm_head.weight  # weight tying: one tensor in both modules
            self.apply(self._init_weights)

        def _init_weights(self, module):
            # LOOM: loom has no nn.init, so the tensor methods (the same line in both) stand in
            # for nanoGPT's torch.nn.init.normal_ / zeros_.
            with lib.no_grad():
                if isinstance(module, (nn.Linear, nn.Embedding)):
                    module.weight.normal_(mean=0.0, std=0.02)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.zero_()

        def forward(self, idx):
            B, T_ = idx.size()
            pos = lib.arange(T_)  # (T,) int64
            x = self.drop(self.wte(idx) + self.wpe(pos))
            for block in self.h:
                x = block(x)
            x = self.ln_f(x)
            return self.lm_head(x)  # (B, T, V)

    return GPT()


def train(lib, model, cfg, on_step=None):
    """The training loop, the same lines for torch and loom (DDP: loom under mpirun). Returns
    per-step losses, gradient norms and learning rates (numpy arrays); on_step(record) gets each
    step's JSON record."""
    F = lib.nn.functional
    data = lib.tensor(tokens(cfg))
    dataset = lib.utils.data.TensorDataset(data[:, :-1], data[:, 1:])
    ddp, world = None, 1
    if lib.__name__ == "loom":
        import loom.distributed as dist
        if dist.launched_by_mpi():
            dist.init_process_group()
            world = dist.get_world_size()
    if world > 1:
        if cfg.batch % world:
            raise SystemExit(f"--batch {cfg.batch} must divide over {world} ranks")
        sampler = lib.utils.data.DistributedSampler(dataset, shuffle=False)
        loader = lib.utils.data.DataLoader(dataset, batch_size=cfg.batch // world,
                                           sampler=sampler)
        # LOOM: DistributedDataParallel(model) and then ddp.backward(loss); ddp.finish() where
        # torch's DDP hooks loss.backward().
        ddp = dist.DistributedDataParallel(model)
    else:
        loader = lib.utils.data.DataLoader(dataset, batch_size=cfg.batch, shuffle=False)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = lib.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)

    def lr_lambda(step):
        if step < cfg.warmup:
            return (step + 1) / cfg.warmup
        progress = (step - cfg.warmup) / (cfg.steps - cfg.warmup)
        cosine = 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * progress))
        return (cfg.min_lr + cosine) / cfg.lr

    scheduler = lib.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)

    losses, norms, lrs = [], [], []
    model.train()
    start = time.perf_counter()  # a step's time includes fetching its batch
    for _ in range(cfg.passes):
        for x, y in loader:
            logits = model(x)
            loss = F.cross_entropy(logits.view(-1, cfg.vocab), y.view(-1))
            optimizer.zero_grad(set_to_none=True)
            if ddp is not None:
                ddp.backward(loss)
                ddp.finish()
            else:
                loss.backward()
            norm = lib.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            lrs.append(scheduler.get_last_lr()[0])
            scheduler.step()
            value = loss.item()
            if ddp is not None:  # the mean over ranks of equal parts: the global batch's loss
                t = lib.tensor([value])
                dist.all_reduce(t, op="avg")
                value = t.item()
            losses.append(value)
            norms.append(float(norm))
            step_ms = (time.perf_counter() - start) * 1e3
            if on_step is not None:
                on_step(dict(step=len(losses), loss=value, grad_norm=norms[-1], lr=lrs[-1],
                             step_ms=step_ms))
            start = time.perf_counter()
    return np.array(losses), np.array(norms), np.array(lrs)


def main(argv=None):
    p = argparse.ArgumentParser(description="nanoGPT's training script on torch or loom.")
    p.add_argument("--lib", choices=["loom", "torch"], default="loom")
    defaults = Config()
    for field in ("vocab", "seq", "dim", "heads", "layers", "batch", "steps", "passes", "warmup",
                  "data_seed"):
        p.add_argument("--" + field.replace("_", "-"), type=int, default=getattr(defaults, field))
    for field in ("dropout", "lr", "min_lr"):
        p.add_argument("--" + field.replace("_", "-"), type=float, default=getattr(defaults, field))
    p.add_argument("--seed", type=int, default=0, help="the library's manual_seed before the model")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (torch only)")
    a = p.parse_args(argv)
    cfg = Config(**{k: v for k, v in vars(a).items() if k in Config.__dataclass_fields__})
    if a.lib == "torch":
        import torch
        import torch.nn.functional  # noqa: F401
        import torch.optim.lr_scheduler  # noqa: F401
        import torch.utils.data  # noqa: F401
        if a.threads:
            torch.set_num_threads(a.threads)
        lib = torch
    else:
        import loom
        import loom.nn.functional  # noqa: F401
        import loom.optim.lr_scheduler  # noqa: F401
        import loom.utils.data  # noqa: F401
        lib = loom
    lib.manual_seed(a.seed)
    model = make_model(lib, cfg)
    rank0 = True
    if a.lib == "loom":
        import loom.distributed as dist
        rank0 = not dist.launched_by_mpi() or dist.init_process_group().rank == 0

    def emit(record):
        if rank0:
            print(json.dumps(record), flush=True)

    train(lib, model, cfg, on_step=emit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
