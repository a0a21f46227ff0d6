"""examples/train_gpt.py against loom-gpt: the same flags give the same per-step losses.

usage: train_gpt_check.py LOOM_GPT [MPIEXEC MPIRUN_FLAGS...]

Without a launcher: one process, plain and with --grad-accum 2 and dropout. With one: every
parallel layout loom-gpt has (dp 2, tp 2 with sequence parallelism, pp 2 under each schedule,
ZeRO 1-3, and dp 2 x tp 2 x pp 2 with 1F1B on 8 ranks), each run under mpirun for both
programs. Both write loom-gpt's metrics file; the losses must agree within 1e-6 relative (the
same ops in the same order: in practice they are identical). Exits non-zero naming the first
difference.
"""

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN_GPT = os.path.join(HERE, "..", "..", "examples", "train_gpt.py")
PYTHON = sys.executable

# The addition task, small enough for 8 ranks on 2 cores; evaluation off the measured steps.
COMMON = ["--steps", "4", "--batch", "16", "--layers", "2", "--dim", "32", "--heads", "2",
          "--lr", "3e-3", "--warmup-steps", "1", "--eval-every", "1000"]

SINGLE = [
    ("one process", 1, []),
    ("grad-accum 2, dropout", 1, ["--grad-accum", "2", "--dropout", "0.1"]),
]
PARALLEL = [
    ("dp 2", 2, ["--dp", "2"]),
    ("dp 2 ZeRO-3, dropout", 2, ["--dp", "2", "--zero", "3", "--dropout", "0.1"]),
    # Two examples per row; the held-out rows (11 tokens) do not divide over tp: evaluation pads.
    ("tp 2 sequence parallel", 2, ["--tp", "2", "--sequence-parallel", "--seq", "26"]),
    ("pp 2 gpipe", 2, ["--pp", "2", "--schedule", "gpipe", "--microbatches", "4"]),
    ("pp 2 1f1b, dropout", 2, ["--pp", "2", "--schedule", "1f1b", "--dropout", "0.1"]),
    ("pp 2 chimera", 2, ["--pp", "2", "--schedule", "chimera", "--microbatches", "4"]),
    ("pp 2 interleaved", 2, ["--pp", "2", "--schedule", "interleaved", "--virtual-stages", "2",
                             "--microbatches", "4", "--layers", "4"]),
    ("dp 2 x pp 2 ZeRO-1", 4, ["--dp", "2", "--pp", "2", "--zero", "1"]),
    ("dp 2 x tp 2 x pp 2 1f1b", 8, ["--dp", "2", "--tp", "2", "--pp", "2", "--schedule", "1f1b"]),
]


def losses(path):
    with open(path) as f:
        return [json.loads(line)["loss"] for line in f if '"loss"' in line]


def run(cmd, log):
    with open(log, "w") as out:
        rc = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT)
    if rc != 0:
        sys.exit(f"FAILED (exit {rc}): {' '.join(cmd)}\n{open(log).read()[-3000:]}")


def main():
    loom_gpt, launcher = sys.argv[1], sys.argv[2:]
    cases = PARALLEL if launcher else SINGLE
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, np_, flags in cases:
            prefix = launcher[:1] + ["-np", str(np_)] + launcher[1:] if launcher else []
            args = COMMON + flags
            want_file, got_file = os.path.join(tmp, "c.jsonl"), os.path.join(tmp, "py.jsonl")
            run(prefix + [loom_gpt] + args + ["--metrics-file", want_file],
                os.path.join(tmp, "c.log"))
            run(prefix + [PYTHON, TRAIN_GPT] + args + ["--metrics-file", got_file],
                os.path.join(tmp, "py.log"))
            want, got = losses(want_file), losses(got_file)
            bad = [(s + 1, g, w) for s, (g, w) in enumerate(zip(got, want))
                   if abs(g - w) > 1e-6 * abs(w)]
            if len(got) != len(want) or len(want) != 4 or bad:
                failures += 1
                print(f"{name}: MISMATCH: train_gpt.py {got} vs loom-gpt {want}; first bad "
                      f"(step, python, loom-gpt): {bad[:1]}")
            else:
                exact = sum(g == w for g, w in zip(got, want))
                print(f"{name}: {len(got)} losses equal loom-gpt's ({exact} bit-identical): "
                      f"{', '.join(f'{x:.6f}' for x in got)}", flush=True)
    if failures:
        sys.exit(f"{failures} layout(s) differ from loom-gpt")


if __name__ == "__main__":
    main()
