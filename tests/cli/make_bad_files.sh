#!/usr/bin/env bash
# Makes the files tests/cli/CMakeLists.txt feeds loom-gpt: good ones (a tiny text, its tokens, a
# tiny model) and bad ones (foreign, truncated). Usage: make_bad_files.sh DIR
set -euo pipefail
dir=$1
mkdir -p "$dir"
python3 - "$dir" <<'PY'
import struct, sys, os
d = sys.argv[1]
def header(magic, version, *rest):
    ints = [magic, version, *rest] + [0] * (256 - 2 - len(rest))
    return struct.pack("<256i", *ints)
text = b"hello loom, this is a tiny byte-level text for the command-line tests.\n" * 4
open(os.path.join(d, "text.txt"), "wb").write(text)
open(os.path.join(d, "tiny.txt"), "wb").write(b"too short")
tokens = list(text)
open(os.path.join(d, "text_tokens.bin"), "wb").write(
    header(20240520, 1, len(tokens)) + struct.pack(f"<{len(tokens)}H", *tokens))
open(os.path.join(d, "truncated.bin"), "wb").write(
    header(20240520, 1, 1000) + struct.pack("<10H", *range(10)))
open(os.path.join(d, "foreign.bin"), "wb").write(b"\x7fELF" + b"\0" * 2000)
# A tiny f32 llm.c model: maxT 16, V 256 (padded 256), L 1, H 2, C 8.
T, V, Vp, L, H, C = 16, 256, 256, 1, 2, 8
n = Vp*C + T*C + L*(2*C + 3*C*C + 3*C + C*C + C + 2*C + 4*C*C + 4*C + 4*C*C + C) + 2*C
body = struct.pack(f"<{n}f", *([0.01] * n))
open(os.path.join(d, "model.bin"), "wb").write(header(20240326, 3, T, V, L, H, C, Vp) + body)
open(os.path.join(d, "truncated_model.bin"), "wb").write(
    header(20240326, 3, T, V, L, H, C, Vp) + body[: len(body) // 2])
PY
