"""Files loom-gpt writes, read by independent Python code: safetensors saved by loom load with a
plain reader (json + numpy) under Hugging Face GPT-2 names and Conv1D (in, out) layout, and give
PyTorch's reference the same loss loom reports; the metrics file is JSON Lines with the
documented fields."""
import json
import os
import re
import struct
import subprocess

import numpy as np
import torch

import gpt2_reference as ref
from test_gpt2_equivalence import LOOM_GPT, run_loom

B, T = 4, 16


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    dtypes = {"F32": np.float32}
    tensors = {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]],
                                dtype=dtypes[v["dtype"]]).reshape(v["shape"])
               for k, v in header.items()}
    return tensors, meta


def hf_to_llmc(t, cfg):
    """Hugging Face GPT-2 names and Conv1D (in, out) matrices -> the reference's llm.c layout."""
    L, V, Vp = cfg["layers"], cfg["vocab"], cfg["padded_vocab"]
    wte = np.zeros((Vp, t["wte.weight"].shape[1]), np.float32)
    wte[:V] = t["wte.weight"]

    def stack(fmt, transpose=False):
        mats = [t[fmt.format(i)] for i in range(L)]
        return torch.tensor(np.stack([m.T if transpose else m for m in mats]))

    return {"wte": torch.tensor(wte), "wpe": torch.tensor(t["wpe.weight"]),
            "ln1w": stack("h.{}.ln_1.weight"), "ln1b": stack("h.{}.ln_1.bias"),
            "qkvw": stack("h.{}.attn.c_attn.weight", True), "qkvb": stack("h.{}.attn.c_attn.bias"),
            "attprojw": stack("h.{}.attn.c_proj.weight", True),
            "attprojb": stack("h.{}.attn.c_proj.bias"),
            "ln2w": stack("h.{}.ln_2.weight"), "ln2b": stack("h.{}.ln_2.bias"),
            "fcw": stack("h.{}.mlp.c_fc.weight", True), "fcb": stack("h.{}.mlp.c_fc.bias"),
            "fcprojw": stack("h.{}.mlp.c_proj.weight", True),
            "fcprojb": stack("h.{}.mlp.c_proj.bias"),
            "lnfw": torch.tensor(t["ln_f.weight"]), "lnfb": torch.tensor(t["ln_f.bias"])}


def test_saved_safetensors_are_usable_elsewhere(tmp_path):
    text = tmp_path / "text.txt"
    text.write_bytes(bytes(np.random.default_rng(3).integers(32, 127, size=4000, dtype=np.uint8)))
    model = tmp_path / "model.safetensors"
    run_loom("--data", text, "--layers", 2, "--dim", 32, "--heads", 4, "--seq", T, "--batch", B,
             "--steps", 5, "--save", model)
    out = run_loom("--init-from", model, "--data", text, "--seq", T, "--batch", B,
                   "--eval-only", "--eval-batches", 3)
    loom_loss = float(re.search(r"^val_loss (\S+)$", out, re.M).group(1))

    tensors, meta = read_safetensors(model)
    assert tensors["h.0.attn.c_attn.weight"].shape == (32, 96)  # Conv1D: (in, out)
    cfg = dict(max_seq_len=int(meta["n_positions"]), vocab=int(meta["vocab_size"]),
               padded_vocab=256, layers=int(meta["n_layer"]), heads=int(meta["n_head"]),
               channels=int(meta["n_embd"]))
    params = hf_to_llmc(tensors, cfg)
    tokens = np.frombuffer(text.read_bytes(), dtype=np.uint8).astype(np.int64)
    with torch.no_grad():
        losses = [ref.forward_loss(cfg, params, *ref.batch(tokens, k, B, T)).item()
                  for k in range(3)]
    expected = sum(losses) / 3
    assert abs(loom_loss - expected) <= 1e-5 * expected, (loom_loss, expected)


def test_metrics_file_is_json_lines_with_the_documented_fields(tmp_path):
    metrics = tmp_path / "m.jsonl"
    out = run_loom("--steps", 3, "--eval-every", 2, "--metrics-file", metrics)
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps = [r for r in records if "event" not in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        for field in ("step", "loss", "lr", "tokens_per_s", "elapsed_s"):
            assert field in r, (field, r)
        assert r["loss"] > 0 and r["tokens_per_s"] > 0
    # The printed loss of step 3 is the recorded one.
    printed = float(re.search(r"step 3/3 \| loss (\S+)", out).group(1))
    assert abs(printed - steps[-1]["loss"]) <= 1e-6 * printed
    evals = [r for r in records if r.get("event") == "eval"]
    assert [r["step"] for r in evals] == [2, 3] and all(0 <= r["exact_match"] <= 1 for r in evals)
    assert re.search(r"^target (not )?reached: ", out, re.M)
