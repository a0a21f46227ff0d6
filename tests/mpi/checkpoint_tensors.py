"""Reads a loom checkpoint with numpy alone, as an independent check of the format and of the C++
reader: every tensor is rebuilt from its pieces (a box of the global tensor plus an element range
of the box, row-major) and each element must be written exactly once.

usage: checkpoint_tensors.py same A B [--except-layout]   tensors and state bit-identical
       (--except-layout: but for the saving run's layout, --steps and lr schedule)
       checkpoint_tensors.py masters-are-parameters LOW F32  F32's parameters are LOW's masters
       checkpoint_tensors.py show A                         names, shapes, pieces
       checkpoint_tensors.py losses NAME A B FIRST TOL      the losses of steps >= FIRST in two
                                                            --metrics-file logs agree within TOL
A and B are step directories (DIR/step-00000006).
"""
import json
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64, "U8": np.uint8,
          "BF16": np.uint16}  # bf16 compared by its bits


def consolidate(step_dir):
    manifest = json.load(open(f"{step_dir}/manifest.json"))
    assert manifest["format"] == "loom-checkpoint", f"{step_dir}: not a loom checkpoint"
    files = {}
    tensors = {}
    for name, t in manifest["tensors"].items():
        dtype = np.dtype(DTYPES[t["dtype"]])
        shape = tuple(t["shape"])
        out = np.zeros(shape, dtype=dtype)
        written = np.zeros(shape, dtype=np.int32)
        for p in t["pieces"]:
            raw = files.setdefault(p["file"], open(f"{step_dir}/{p['file']}", "rb").read())
            # The piece must also be the safetensors tensor its file's header says it is.
            n = struct.unpack("<Q", raw[:8])[0]
            header = json.loads(raw[8:8 + n])
            begin, end = header[p["key"]]["data_offsets"]
            assert 8 + n + begin == p["offset"] and end - begin == p["nbytes"], \
                f"{name}: manifest and safetensors header disagree on {p['key']}"
            place = json.loads(header["__metadata__"][p["key"]])
            assert place["tensor"] == name and place["range"] == p["range"]
            data = np.frombuffer(raw, dtype=dtype, count=p["range"][1] - p["range"][0],
                                 offset=p["offset"])
            index = np.arange(p["range"][0], p["range"][1])
            if len(shape) == 0:
                out[()] = data[0]
                written[()] += 1
                continue
            coords = np.unravel_index(index, tuple(p["box_shape"]))
            coords = tuple(c + o for c, o in zip(coords, p["box_offset"]))
            out[coords] = data
            np.add.at(written, coords, 1)
        assert (written == 1).all(), f"{step_dir}: tensor {name}: elements stored " \
            f"{int((written == 0).sum())} times 0 and {int((written > 1).sum())} times >1"
        tensors[name] = out
    return manifest, tensors


def same(a, b, except_layout):
    ma, ta = consolidate(a)
    mb, tb = consolidate(b)
    assert ta.keys() == tb.keys(), f"tensor names differ: {sorted(ta.keys() ^ tb.keys())}"
    for name in ta:
        assert ta[name].shape == tb[name].shape, f"{name}: shapes differ"
        diff = np.flatnonzero(ta[name].view(np.uint8) != tb[name].view(np.uint8))
        assert diff.size == 0, f"{name}: {diff.size} bytes differ between {a} and {b}"
    sa, sb = dict(ma["state"]), dict(mb["state"])
    if except_layout:  # what the flags of the run that saved say: its layout and length
        for s in (sa, sb):
            s.pop("layout", None)
            s["training"] = {k: v for k, v in s.get("training", {}).items()
                             if k not in ("steps", "lr_schedule")}
    assert sa == sb, f"states differ:\n{json.dumps(sa, sort_keys=True)}\n" \
        f"{json.dumps(sb, sort_keys=True)}"
    assert ma["step"] == mb["step"]
    print(f"same: {len(ta)} tensors and the state of step {ma['step']} are bit-identical "
          f"({a} vs {b})")


def masters_are_parameters(low, f32):
    """The f32 checkpoint's parameters are the low-precision one's f32 masters, bit for bit, and
    its optimizer moments the same."""
    _, lo = consolidate(low)
    _, hi = consolidate(f32)
    params = [n for n in hi if n.startswith("model.")]
    for name in params:
        master = "optim." + name[len("model."):] + ".master"
        assert master in lo, f"{low} has no {master}"
        assert (hi[name].view(np.uint32) == lo[master].view(np.uint32)).all(), \
            f"{name} differs from {master}"
    for name in hi:
        if name.startswith("optim."):
            assert (hi[name].view(np.uint8) == lo[name].view(np.uint8)).all(), f"{name} differs"
    print(f"masters-are-parameters: {len(params)} f32 parameters are the masters of {low}")


def losses(name, a, b, first, tol):
    """The losses of steps >= first in metrics files a and b agree within tol (relative)."""
    def read(p):
        return {j["step"]: j["loss"] for j in map(json.loads, open(p)) if "loss" in j}
    want, got = read(a), read(b)
    steps = [s for s in sorted(want) if s >= first]
    assert steps and all(s in got for s in steps), \
        f"{name}: steps {steps} missing from {sorted(got)}"
    for s in steps:
        assert abs(got[s] - want[s]) <= tol * abs(want[s]), \
            f"{name}: step {s} loss {got[s]!r} vs {want[s]!r}"
    worst = max(abs(got[s] - want[s]) / abs(want[s]) for s in steps)
    print(f"{name}: losses of steps {steps[0]}-{steps[-1]} match"
          + (" bit for bit" if tol == 0 else f" within {tol} (worst {worst:.1e})"))


def main():
    if sys.argv[1] == "same":
        same(sys.argv[2], sys.argv[3], "--except-layout" in sys.argv)
    elif sys.argv[1] == "masters-are-parameters":
        masters_are_parameters(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "losses":
        losses(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), float(sys.argv[6]))
    elif sys.argv[1] == "show":
        m, t = consolidate(sys.argv[2])
        for name, v in sorted(t.items()):
            print(name, v.dtype, v.shape, len(m["tensors"][name]["pieces"]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
