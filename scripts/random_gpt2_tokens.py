"""Writes random GPT-2 tokens in llm.c's token-file format (a header of 256 int32: magic
20240520, version 1, count; then uint16 tokens), for GPU checks that need loom-gpt to train on
something: `python3 scripts/random_gpt2_tokens.py OUT [COUNT]` (default 16 batches of 8 x 1024,
plus the one token a batch's targets reach past its inputs). Standard library only: the GPU
machine's python3 has no numpy."""
import array
import random
import sys

out = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 16 * 8 * 1024 + 1
rng = random.Random(0)
header = array.array("i", [20240520, 1, n] + [0] * 253)
tokens = array.array("H", (rng.randrange(50257) for _ in range(n)))
with open(out, "wb") as f:
    header.tofile(f)
    tokens.tofile(f)
