"""GPT weights between loom-gpt and Python: a file loom-gpt --save writes loads into loom.nn.GPT
through loom.load_gpt (llm.c .bin and Hugging Face .safetensors), and one loom.save_gpt writes
loads into loom-gpt --init-from; either way both sides compute the same loss on the same batch."""
import os
import re
import subprocess

import numpy as np
import pytest

import loom
import loom.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOOM_GPT = os.environ.get("LOOM_GPT", os.path.join(ROOT, "build", "bin", "loom-gpt"))
B, T = 4, 16


def run_loom(*args):
    if not os.path.exists(LOOM_GPT):
        pytest.fail(f"{LOOM_GPT} not built")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([LOOM_GPT, *map(str, args)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, f"loom-gpt failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def loom_gpt_loss(weights, text):
    out = run_loom("--init-from", weights, "--data", text, "--seq", T, "--batch", B,
                   "--eval-only", "--eval-batches", 1)
    return float(re.search(r"^val_loss (\S+)$", out, re.M).group(1))


def python_loss(model, text):
    """Batch 0 as loom-gpt reads it: rows of T consecutive bytes, targets shifted by one."""
    tokens = np.frombuffer(text.read_bytes(), dtype=np.uint8).astype(np.int32)
    x = loom.from_numpy(tokens[:B * T].reshape(B, T).copy())
    y = loom.from_numpy(tokens[1:B * T + 1].reshape(B, T).copy())
    model.eval()
    with loom.no_grad():
        logits = model(x)  # [B, T, padded vocab]
        vocab = model.config.vocab
        logits = logits.narrow(2, 0, vocab).contiguous().reshape(B * T, vocab)
        return F.cross_entropy(logits, y.reshape(B * T)).item()


@pytest.fixture()
def text(tmp_path):
    path = tmp_path / "text.txt"
    path.write_bytes(bytes(np.random.default_rng(3).integers(32, 127, size=2000, dtype=np.uint8)))
    return path


@pytest.mark.parametrize("ext", [".safetensors", ".bin"])
def test_loom_gpt_weights_load_in_python(tmp_path, text, ext):
    weights = tmp_path / f"model{ext}"
    run_loom("--data", text, "--layers", 2, "--dim", 32, "--heads", 4, "--seq", T, "--batch", B,
             "--steps", 3, "--save", weights)
    config, state = loom.load_gpt(str(weights))
    assert (config.layers, config.heads, config.channels) == (2, 4, 32)
    model = loom.nn.GPT(config)
    model.load_state_dict(state)
    want = loom_gpt_loss(weights, text)
    got = python_loss(model, text)
    assert abs(got - want) <= 1e-5 * abs(want), (got, want)


@pytest.mark.parametrize("ext", [".safetensors", ".bin"])
def test_python_weights_load_in_loom_gpt(tmp_path, text, ext):
    config = loom.nn.GPTConfig(layers=2, heads=4, channels=32, vocab=256, padded_vocab=256,
                               max_seq_len=T)
    model = loom.nn.GPT(config)
    model.init_parameters(7)
    weights = tmp_path / f"model{ext}"
    loom.save_gpt(str(weights), model.config, model.state_dict())
    want = python_loss(model, text)
    got = loom_gpt_loss(weights, text)
    assert abs(got - want) <= 1e-5 * abs(want), (got, want)


def test_load_gpt_errors_name_the_file(tmp_path):
    with pytest.raises(ValueError, match="nothing.bin"):
        loom.load_gpt(str(tmp_path / "nothing.bin"))
    with pytest.raises(ValueError, match="extension"):
        loom.save_gpt(str(tmp_path / "w.pt"), loom.nn.GPTConfig(), {})
