"""Seed corpora for the fuzz targets (tests/fuzz/run.sh): small valid inputs written by loom
itself, so the fuzzer starts from the formats' real structure.

usage: seeds.py OUT_DIR   (PYTHONPATH must hold the build's python/, LOOM_GPT names loom-gpt)
"""

import os
import struct
import subprocess
import sys
import tempfile

import loom
from loom.distributed import checkpoint


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def main(out):
    config = loom.nn.GPTConfig(max_seq_len=8, vocab=11, layers=1, heads=2, channels=4)
    model = loom.nn.GPT(config)
    model.init_parameters(0)
    state = model.state_dict()
    with tempfile.TemporaryDirectory() as tmp:
        # Weights: llm.c and Hugging Face GPT-2 files (both also safetensors seeds).
        for ext in ("bin", "safetensors"):
            path = os.path.join(tmp, "model." + ext)
            loom.save_gpt(path, config, state)
            with open(path, "rb") as f:
                data = f.read()
            write(os.path.join(out, "gpt_weights", "model." + ext), data)
            if ext == "safetensors":
                write(os.path.join(out, "safetensors", "model.safetensors"), data)
        small = os.path.join(tmp, "small.safetensors")
        loom.save({"a": loom.ones(2, 3), "b": loom.zeros(1, dtype="bf16"),
                   "i": loom.tensor([1, 2, 3], dtype="i64")}, small, {"format": "pt"})
        with open(small, "rb") as f:
            write(os.path.join(out, "safetensors", "small.safetensors"), f.read())
        # A checkpoint manifest of a model and its AdamW state.
        opt = loom.optim.AdamW(model.parameters(), lr=1e-3)
        step_dir = checkpoint.save(os.path.join(tmp, "ckpt"), step=3, model=model, optimizer=opt)
        with open(os.path.join(step_dir, "manifest.json"), "rb") as f:
            write(os.path.join(out, "manifest", "manifest.json"), f.read())
    # llm.c token files: 256 int32 of header (magic, version, count), then uint16 tokens.
    for n in (0, 5, 300):
        header = struct.pack("<3i", 20240520, 1, n) + bytes(4 * 253)
        write(os.path.join(out, "token_file", f"tokens{n}.bin"),
              header + struct.pack(f"<{n}H", *[(7 * i) % 65536 for i in range(n)]))
    # Schedules in their text form, as loom-gpt prints them.
    gpt = os.environ.get("LOOM_GPT", "loom-gpt")
    for name, extra in (("gpipe", []), ("1f1b", []), ("interleaved", ["--virtual-stages", "2"]),
                        ("chimera", [])):
        text = subprocess.run([gpt, "--pp", "2", "--layers", "4", "--schedule", name,
                               "--print-schedule", *extra], check=True, capture_output=True).stdout
        write(os.path.join(out, "schedule", name + ".txt"), text)


if __name__ == "__main__":
    main(sys.argv[1])
