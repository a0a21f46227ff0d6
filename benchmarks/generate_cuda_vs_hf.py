#!/usr/bin/env python3
"""Greedy text generation with GPT-2 124M on one GPU: loom (loom-gpt --generate, a KV cache,
core/nn/generate.h) against Hugging Face transformers' GPT2LMHeadModel.generate (its KV cache,
SDPA attention), in the same run, from the same weights and the same 16-token prompt, batch 1.

Both generate --new-tokens tokens greedily (loom --temperature 0; HF do_sample=False with
min_new_tokens so the end-of-text token cannot stop it early). The weights are GPT-2-style random
(gpt2_reference.random_checkpoint, written as an llm.c file that loom reads with --init-from and
copied into HF's Conv1D layout), so the tokens are no text; the script reports how many leading
tokens the two agree on (in f32 they should agree far; bf16 rounds differently in each). Speed is
tokens/s over the whole call (prefill included): loom's from its `generate:` line, HF's as the
median of --repeat timed calls after a warm-up, with the GPU synchronised.

Usage (on a GPU machine, after scripts/gpu_check.sh built build-gpu):
  python3 benchmarks/generate_cuda_vs_hf.py [--new-tokens 256] [--dtype bf16|f32]
      [--loom-gpt build-gpu/bin/loom-gpt]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
import torch  # noqa: E402

import gpt2_reference as ref  # noqa: E402

CFG = dict(max_seq_len=1024, vocab=50257, padded_vocab=50304, layers=12, heads=12, channels=768)


def hf_model(params, dtype):
    from transformers import GPT2Config, GPT2LMHeadModel
    c = GPT2Config(vocab_size=CFG["vocab"], n_positions=CFG["max_seq_len"], n_embd=CFG["channels"],
                   n_layer=CFG["layers"], n_head=CFG["heads"], layer_norm_epsilon=1e-5,
                   activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                   attn_pdrop=0.0)
    model = GPT2LMHeadModel(c)
    sd = {"transformer.wte.weight": params["wte"][:CFG["vocab"]],
          "transformer.wpe.weight": params["wpe"],
          "transformer.ln_f.weight": params["lnfw"], "transformer.ln_f.bias": params["lnfb"]}
    for l in range(CFG["layers"]):
        h = f"transformer.h.{l}."
        sd.update({h + "ln_1.weight": params["ln1w"][l], h + "ln_1.bias": params["ln1b"][l],
                   h + "attn.c_attn.weight": params["qkvw"][l].t(),
                   h + "attn.c_attn.bias": params["qkvb"][l],
                   h + "attn.c_proj.weight": params["attprojw"][l].t(),
                   h + "attn.c_proj.bias": params["attprojb"][l],
                   h + "ln_2.weight": params["ln2w"][l], h + "ln_2.bias": params["ln2b"][l],
                   h + "mlp.c_fc.weight": params["fcw"][l].t(), h + "mlp.c_fc.bias": params["fcb"][l],
                   h + "mlp.c_proj.weight": params["fcprojw"][l].t(),
                   h + "mlp.c_proj.bias": params["fcprojb"][l]})
    missing, unexpected = model.load_state_dict({k: v.contiguous() for k, v in sd.items()},
                                                strict=False)
    assert not unexpected and all("lm_head" in k or "attn.bias" in k for k in missing), \
        (missing, unexpected)
    return model.to(device="cuda", dtype=dtype).eval()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--loom-gpt", default=os.path.join(HERE, "..", "build-gpu", "bin", "loom-gpt"))
    a = p.parse_args()
    torch.manual_seed(0)
    prompt = torch.randint(0, CFG["vocab"], (16,)).tolist()
    params = ref.random_checkpoint(CFG, seed=1234)
    with tempfile.TemporaryDirectory() as d:
        ckpt, tokens = os.path.join(d, "model.bin"), os.path.join(d, "tokens.bin")
        ref.write_checkpoint(ckpt, CFG, params)
        ref.write_tokens(tokens, prompt * 80)  # loom-gpt wants data even for --steps 0
        cmd = [a.loom_gpt, "--device", "cuda", "--dtype", a.dtype, "--init-from", ckpt,
               "--data", tokens, "--seq", "1024", "--batch", "1", "--steps", "0",
               "--generate", " ".join(map(str, prompt)), "--max-new-tokens", str(a.new_tokens),
               "--temperature", "0"]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"loom-gpt failed:\n{out.stdout}\n{out.stderr}")
        lines = out.stdout.splitlines()
        head = next(i for i, l in enumerate(lines) if l.startswith("generate:"))
        loom_rate = float(re.search(r"([\d.]+) tokens/s", lines[head]).group(1))
        loom_tokens = [int(t) for t in lines[head + 1].split()]
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    model = hf_model(params, dtype)
    ids = torch.tensor([prompt], device="cuda")
    kwargs = dict(max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens, do_sample=False,
                  pad_token_id=0)
    with torch.no_grad():
        model.generate(ids, **kwargs)  # warm-up
        times = []
        for _ in range(a.repeat):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            hf = model.generate(ids, **kwargs)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    hf_rate = a.new_tokens / statistics.median(times)
    hf_tokens = hf[0].tolist()
    agree = next((i for i, (x, y) in enumerate(zip(loom_tokens, hf_tokens)) if x != y),
                 min(len(loom_tokens), len(hf_tokens)))
    import transformers
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}, "
          f"transformers {transformers.__version__}")
    print(f"GPT-2 124M, {a.dtype}, batch 1, prompt 16 tokens, {a.new_tokens} new tokens, greedy")
    print(f"| implementation | tokens/s |\n|---|---:|")
    print(f"| loom-gpt --generate | {loom_rate:.1f} |")
    print(f"| HF GPT2LMHeadModel.generate | {hf_rate:.1f} |")
    print(f"loom / HF: {loom_rate / hf_rate:.3f}x")
    print(f"tokens agree on the first {agree - 16} of {a.new_tokens} new tokens "
          f"(and the {min(agree, 16)}-token prompt)")


if __name__ == "__main__":
    main()
