"""Writes the files tests/robustness/replay.py feeds loom: a few valid ones (written by loom
itself) and, from them, the broken ones a user or an attacker might hand it.

usage: make_files.py OUT_DIR   (PYTHONPATH must hold the build's python/)
"""

import json
import os
import random
import struct
import sys

import loom


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def safetensors(header, body=b""):
    """A safetensors file: 8-byte little-endian header length, the JSON header, the data."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + body


def f32(shape, lo, hi):
    """A safetensors header entry."""
    return {"dtype": "F32", "shape": shape, "data_offsets": [lo, hi]}


def llmc_header(magic, version, *rest):
    ints = [magic, version, *rest] + [0] * (256 - 2 - len(rest))
    return struct.pack("<256i", *ints)


def main(out):
    os.makedirs(out, exist_ok=True)

    def p(name):
        return os.path.join(out, name)

    # Valid: a tiny GPT as both weight formats (max_seq_len 16 covers the addition task's 13),
    # and a small general safetensors file.
    config = loom.nn.GPTConfig(max_seq_len=16, vocab=14, layers=1, heads=2, channels=16)
    model = loom.nn.GPT(config)
    model.init_parameters(0)
    loom.save_gpt(p("model.safetensors"), config, model.state_dict())
    loom.save_gpt(p("model.bin"), config, model.state_dict())
    loom.save({"a": loom.ones(2, 3)}, p("small.safetensors"))
    good = open(p("model.safetensors"), "rb").read()
    good_bin = open(p("model.bin"), "rb").read()

    # The crash: __metadata__ nesting 50,000 levels deep (a stack overflow once).
    deep = b'{"__metadata__":' + b'{"a":' * 50000 + b'"x"' + b"}" * 50000 + b"}"
    write(p("deep_metadata.safetensors"), safetensors(deep))
    deep_list = (b'{"a":{"dtype":"F32","shape":' + b"[" * 50000 + b"]" * 50000
                 + b',"data_offsets":[0,0]}}')
    write(p("deep_shape.safetensors"), safetensors(deep_list))
    # Cut, empty, garbage, foreign.
    write(p("truncated.safetensors"), good[: len(good) // 2])
    write(p("truncated_header.safetensors"), good[:20])
    write(p("empty.safetensors"), b"")
    write(p("seven_bytes.safetensors"), b"\x10\0\0\0\0\0\0")
    write(p("garbage.safetensors"), random.Random(18).randbytes(4096))
    write(p("elf.safetensors"), b"\x7fELF\x02\x01\x01" + b"\0" * 4000)
    write(p("elf.bin"), b"\x7fELF\x02\x01\x01" + b"\0" * 4000)
    # The header length says more than the file holds: a little more, and 2^63 - 1, 2^64 - 1.
    write(p("header_past_end.safetensors"), struct.pack("<Q", 1 << 20) + b'{"a":1}')
    write(p("header_2e63.safetensors"), struct.pack("<Q", (1 << 63) - 1) + b"{}")
    write(p("header_2e64.safetensors"), struct.pack("<Q", (1 << 64) - 1) + b"{}")
    # Well-formed JSON that lies: data past the end, a shape that does not fit its bytes, a shape
    # whose product overflows int64, a negative dim, an unknown dtype, not JSON at all.
    write(p("offsets_past_end.safetensors"), safetensors({"a": f32([2, 3], 0, 10**12)}, b"\0" * 24))
    write(p("shape_vs_bytes.safetensors"), safetensors({"a": f32([2, 3], 0, 8)}, b"\0" * 24))
    write(p("shape_overflow.safetensors"), safetensors({"a": f32([2**62, 4], 0, 16)}, b"\0" * 16))
    write(p("negative_dim.safetensors"), safetensors({"a": f32([-2, 3], 0, 24)}, b"\0" * 24))
    write(p("offsets_reversed.safetensors"), safetensors({"a": f32([2], 8, 0)}, b"\0" * 8))
    write(p("unknown_dtype.safetensors"),
          safetensors({"a": {"dtype": "F7", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8))
    write(p("not_json.safetensors"), safetensors(b"{this is not json" + b" " * 8, b"\0" * 8))
    # An llm.c token file handed over as weights; a text file as weights.
    tokens = list(b"12+34=46\n" * 8)
    write(p("tokens.bin"), llmc_header(20240520, 1, len(tokens))
          + struct.pack(f"<{len(tokens)}H", *tokens))
    write(p("text.txt"), b"hello loom\n" * 100)
    write(p("tokens_truncated.bin"),
          llmc_header(20240520, 1, 1000) + struct.pack("<10H", *range(10)))
    # A pipeline schedule whose first line is 100,000 characters: an error quotes an excerpt.
    write(p("long_line_schedule.txt"), b"x" * 100000 + b"\n")
    # llm.c models: truncated, a header claiming 2^31-1 layers, NaN and infinite weights.
    write(p("truncated_model.bin"), good_bin[: 1024 + (len(good_bin) - 1024) // 2])
    huge = bytearray(good_bin)
    huge[4 * 4: 4 * 5] = struct.pack("<i", 2**31 - 1)  # header[4]: layers
    write(p("huge_layers.bin"), bytes(huge))
    nan = bytearray(good_bin)
    nan[1024 + 40: 1024 + 44] = struct.pack("<f", float("nan"))
    write(p("nan_model.bin"), bytes(nan))
    inf = bytearray(good_bin)
    inf[len(inf) - 4:] = struct.pack("<f", float("inf"))
    write(p("inf_model.bin"), bytes(inf))
    # The safetensors model with one NaN weight (the first tensor's first element).
    header_len = struct.unpack("<Q", good[:8])[0]
    header = json.loads(good[8: 8 + header_len])
    first = min((v["data_offsets"][0], k) for k, v in header.items() if k != "__metadata__")
    assert header[first[1]]["dtype"] == "F32"
    nan_st = bytearray(good)
    at = 8 + header_len + first[0]
    nan_st[at: at + 4] = struct.pack("<f", float("nan"))
    write(p("nan_model.safetensors"), bytes(nan_st))


if __name__ == "__main__":
    main(sys.argv[1])
