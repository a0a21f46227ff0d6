#!/usr/bin/env python3
"""Trains GPT-2 124M on one GPU with loom (loom-gpt --device cuda --dtype bf16) and with PyTorch
(eager and torch.compile, bf16 autocast), in the same run, and prints tokens/s, MFU and ratios.

Shape: 12 layers, 12 heads, dim 768, seq 1024, vocab 50257 padded to 50304, batch 8, AdamW
(lr 1e-4 constant, no weight decay), gradient clipping at 1.0. All three start from the same
weights (an llm.c checkpoint loom loads with --init-from) and see the same random tokens (an
llm.c token file), so their first-step losses must agree to bf16 precision, or the comparison
is void.

PyTorch's model is written the way a PyTorch user would (nanoGPT): f32 parameters, bf16
autocast, F.scaled_dot_product_attention (flash attention), fused AdamW, the logits GEMM over the
padded vocabulary with the padded columns masked out of the softmax (llm.c's semantics, which
loom follows). loom keeps bf16 parameters and activations with f32 master weights.

MFU = FLOPs per token x tokens/s / peak, FLOPs per token = 6 N + 12 L C T (PaLM's count, the one
loom-gpt prints), N = the parameters loom counts (padded wte, wpe, blocks, final LayerNorm). The
peak is the H100 SXM's dense bf16 tensor-core datasheet figure, 989.4 TFLOP/s (--peak-tflops;
the H200 has the same). Step time is the median over the steps after --warmup.

Usage (on a GPU machine, after scripts/gpu_check.sh built build-gpu):
  python3 benchmarks/gpt2_cuda_vs_pytorch.py [--steps 30] [--warmup 10] [--batch 8]
      [--loom-gpt build-gpu/bin/loom-gpt] [--no-compile] [--no-loom]
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gpt2_reference as ref  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H100_SXM_BF16_TFLOPS = 989.4  # NVIDIA H100 SXM datasheet, dense bf16 tensor cores


def default_loom_gpt():
    for build in ("build-gpu", "build"):
        path = os.path.join(ROOT, build, "bin", "loom-gpt")
        if os.path.exists(path):
            return path
    return os.path.join(ROOT, "build-gpu", "bin", "loom-gpt")


def num_parameters(cfg):
    """What loom's GptConfig::num_parameters counts (core/nn/gpt_config.cpp)."""
    C, L = cfg["channels"], cfg["layers"]
    return cfg["padded_vocab"] * C + cfg["max_seq_len"] * C + L * (12 * C * C + 13 * C) + 2 * C


def flops_per_token(cfg, seq):
    return 6.0 * num_parameters(cfg) + 12.0 * cfg["layers"] * cfg["channels"] * seq


# ------------------------------------------------------------------------------ loom


def loom_run(args, ckpt_path, tokens_path, workdir):
    """Returns (step times in ms after warm-up, losses, None) or (None, None, error text)."""
    if not os.path.exists(args.loom_gpt):
        return None, None, f"{args.loom_gpt} not found (bash scripts/gpu_check.sh build)"
    metrics = os.path.join(workdir, "loom_metrics.jsonl")
    cmd = [args.loom_gpt, "--device", "cuda", "--dtype", args.loom_dtype,
           "--init-from", ckpt_path, "--data", tokens_path,
           "--steps", str(args.steps), "--batch", str(args.batch), "--seq", str(args.seq),
           "--optimizer", "adamw", "--lr", str(args.lr), "--lr-schedule", "constant",
           "--warmup-steps", "0", "--weight-decay", "0", "--grad-clip", "1.0",
           "--metrics-file", metrics]
    print("loom:", " ".join(cmd), flush=True)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.loom_timeout)
    except subprocess.TimeoutExpired as e:
        return None, None, f"timed out after {args.loom_timeout}s\n{e.stdout or ''}\n{e.stderr or ''}"
    # Its banner (device, MFU basis, memory) is worth keeping in the log either way.
    for line in proc.stdout.splitlines():
        if not line.startswith("step "):
            print("  loom-gpt:", line)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + "\n" + proc.stderr).strip().splitlines()[-20:])
        return None, None, f"exit status {proc.returncode}:\n{tail}"
    try:
        records = [json.loads(l) for l in open(metrics) if l.strip()]
    except OSError as e:
        return None, None, f"no metrics file: {e}"
    steps = [r for r in records if "step_ms" in r]
    if len(steps) <= args.warmup:
        return None, None, f"only {len(steps)} steps recorded (warm-up {args.warmup})"
    return [r["step_ms"] for r in steps[args.warmup:]], [r["loss"] for r in steps], None


# ------------------------------------------------------------------------------ PyTorch


class Gpt2(torch.nn.Module):
    """GPT-2 over llm.c's parameter layout (per-layer tensors stacked along dim 0)."""

    def __init__(self, cfg, params):
        super().__init__()
        self.cfg = cfg
        self.p = torch.nn.ParameterDict(
            {k: torch.nn.Parameter(v.detach().clone()) for k, v in params.items()})
        # 0 for the real classes, -inf for the padded columns of the logits.
        mask = torch.zeros(cfg["padded_vocab"])
        mask[cfg["vocab"]:] = float("-inf")
        self.register_buffer("vocab_mask", mask, persistent=False)

    def forward(self, idx, targets):
        p, cfg = self.p, self.cfg
        B, T = idx.shape
        C, H, L = cfg["channels"], cfg["heads"], cfg["layers"]
        x = F.embedding(idx, p["wte"]) + p["wpe"][:T]
        for l in range(L):
            h = F.layer_norm(x, (C,), p["ln1w"][l], p["ln1b"][l], 1e-5)
            qkv = F.linear(h, p["qkvw"][l], p["qkvb"][l])
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in qkv.split(C, dim=2))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            y = y.transpose(1, 2).contiguous().view(B, T, C)
            x = x + F.linear(y, p["attprojw"][l], p["attprojb"][l])
            h = F.layer_norm(x, (C,), p["ln2w"][l], p["ln2b"][l], 1e-5)
            h = F.gelu(F.linear(h, p["fcw"][l], p["fcb"][l]), approximate="tanh")
            x = x + F.linear(h, p["fcprojw"][l], p["fcprojb"][l])
        x = F.layer_norm(x, (C,), p["lnfw"], p["lnfb"], 1e-5)
        logits = F.linear(x, p["wte"]).float() + self.vocab_mask  # tied head, padded GEMM
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def torch_run(args, cfg, params, tokens, compiled):
    """Returns (step times in ms after warm-up, losses, compile+first-step seconds)."""
    torch.manual_seed(0)
    model = Gpt2(cfg, params).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, fused=True)
    step_fn = torch.compile(model) if compiled else model
    n_batches = (len(tokens) - 1) // (args.batch * args.seq)
    times, losses = [], []
    first_s = None
    for step in range(args.steps):
        x, y = ref.batch(tokens, step % n_batches, args.batch, args.seq)
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())  # synchronizes, as loom's per-step loss does
        dt = time.perf_counter() - t0
        if first_s is None:
            first_s = dt
        times.append(dt * 1e3)
    peak_gb = torch.cuda.max_memory_allocated() / 1e9
    del model, opt, step_fn
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return times[args.warmup:], losses, first_s, peak_gb


# ------------------------------------------------------------------------------ report


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--padded-vocab", type=int, default=50304)
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10,
                   help="untimed steps (torch.compile compiles in the first)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--loom-gpt", default=default_loom_gpt())
    p.add_argument("--loom-dtype", default="bf16", choices=["bf16", "f32"])
    p.add_argument("--loom-timeout", type=int, default=300, help="seconds for the loom-gpt run")
    p.add_argument("--no-loom", action="store_true")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile run")
    p.add_argument("--peak-tflops", type=float, default=H100_SXM_BF16_TFLOPS)
    args = p.parse_args()
    if args.steps <= args.warmup:
        sys.exit(f"--steps {args.steps} must exceed --warmup {args.warmup}")
    if not torch.cuda.is_available():
        sys.exit("no CUDA device visible to PyTorch: this benchmark needs a GPU")

    cfg = dict(max_seq_len=args.seq, vocab=args.vocab, padded_vocab=args.padded_vocab,
               layers=args.layers, heads=args.heads, channels=args.dim)
    fpt = flops_per_token(cfg, args.seq)
    gpu = torch.cuda.get_device_name(0)
    print(f"device: {gpu}; torch {torch.__version__}, CUDA {torch.version.cuda}", flush=True)
    print(f"config: layers {args.layers} heads {args.heads} dim {args.dim} seq {args.seq} "
          f"vocab {args.vocab} (padded {args.padded_vocab}) batch {args.batch}, "
          f"{num_parameters(cfg) / 1e6:.2f}M parameters, {fpt / 1e9:.3f} GFLOP/token "
          f"(6N + 12LCT); AdamW lr {args.lr}, clip 1.0; median of {args.steps - args.warmup} "
          f"steps after {args.warmup} warm-up", flush=True)
    print(f"MFU against {args.peak_tflops} TFLOP/s (H100 SXM dense bf16 datasheet; "
          f"this GPU: {gpu})", flush=True)

    results = []  # (name, step ms list, first loss, note)
    with tempfile.TemporaryDirectory() as d:
        ckpt = os.path.join(d, "init.bin")
        tokens_path = os.path.join(d, "tokens.bin")
        params = ref.random_checkpoint(cfg, seed=0)
        ref.write_checkpoint(ckpt, cfg, params)
        # One batch per step: nobody wraps around the data.
        tokens = np.random.default_rng(0).integers(
            0, args.vocab, size=(args.steps + 1) * args.batch * args.seq + 1)
        ref.write_tokens(tokens_path, tokens)

        if not args.no_loom:
            ms, losses, err = loom_run(args, ckpt, tokens_path, d)
            if err:
                print(f"loom-gpt FAILED: {err}", flush=True)
                results.append((f"loom {args.loom_dtype}", None, None, "failed (see above)"))
            else:
                results.append((f"loom {args.loom_dtype}", ms, losses[0], ""))
                print(f"loom: median step {statistics.median(ms):.2f} ms", flush=True)

        for compiled in ([False] if args.no_compile else [False, True]):
            name = "PyTorch compile" if compiled else "PyTorch eager"
            try:
                ms, losses, first_s, peak_gb = torch_run(args, cfg, params, tokens, compiled)
            except Exception as e:  # noqa: BLE001 (a failed compile must not hide the rest)
                print(f"{name} FAILED: {type(e).__name__}: {str(e)[:2000]}", flush=True)
                results.append((name, None, None, "failed (see above)"))
                continue
            note = f"first step {first_s:.1f} s, peak {peak_gb:.1f} GB"
            results.append((f"{name} bf16", ms, losses[0], note))
            print(f"{name}: median step {statistics.median(ms):.2f} ms ({note})", flush=True)

    tokens_per_step = args.batch * args.seq
    rate = {}
    print()
    print("| implementation | step ms | tokens/s | MFU | first-step loss | note |")
    print("|---|---:|---:|---:|---:|---|")
    for name, ms, loss0, note in results:
        if ms is None:
            print(f"| {name} | - | - | - | - | {note} |")
            continue
        m = statistics.median(ms)
        tps = tokens_per_step / m * 1e3
        rate[name] = tps
        mfu = fpt * tps / (args.peak_tflops * 1e12)
        print(f"| {name} | {m:.2f} | {tps:.0f} | {mfu * 100:.1f}% | {loss0:.6f} | {note} |")
    loom_name = f"loom {args.loom_dtype}"
    for peer in ("PyTorch eager bf16", "PyTorch compile bf16"):
        if loom_name in rate and peer in rate:
            print(f"tokens/s {loom_name} / {peer}: {rate[loom_name] / rate[peer]:.3f}x")
    # Same weights, same tokens: the first losses agree to bf16 precision or the run is void.
    firsts = [(n, l) for n, ms, l, _ in results if l is not None]
    if len(firsts) > 1:
        spread = max(l for _, l in firsts) - min(l for _, l in firsts)
        verdict = "agree" if spread < 0.05 else "DISAGREE: comparison void"
        print(f"first-step losses {verdict} (spread {spread:.4f}; ln(vocab) = "
              f"{math.log(args.vocab):.4f})")
    if any(ms is None for _, ms, _, _ in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
