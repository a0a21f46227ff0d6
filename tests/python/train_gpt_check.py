"""examples/train_gpt.py against loom-gpt: the same flags give the same per-step losses.

usage: train_gpt_check.py LOOM_GPT [MPIEXEC MPIRUN_FLAGS...]

Without a launcher: one process, plain and with --grad-accum 2 and dropout. With one: every
parallel layout loom-gpt has (dp 2, tp 2 with sequence parallelism, pp 2 under each schedule,
ZeRO 1-3, and dp 2 x tp 2 x pp 2 with 1F1B on 8 ranks), each run under mpirun for both
programs. Both write loom-gpt's metrics file; the losses must agree within 1e-6 relative (the
same ops in the same order: in practice they are identical). Exits non-zero naming the first
difference.

Then checkpoints (--checkpoint-dir, --save-every, --resume, --resume-from; with dropout), one
process and under the launcher with dp 2 and ZeRO-1: train_gpt.py saving at step 3 and resumed
from there (--resume in a directory holding that checkpoint, its metrics file continued) gives
the uninterrupted run's losses bit for bit and a bit-identical step-6 checkpoint; a loom-gpt
checkpoint resumed by train_gpt.py continues with loom-gpt's losses bit for bit, and the other
way round. Under the launcher also across layouts: a loom-gpt dp 2 ZeRO-1 checkpoint loaded by
train_gpt.py on tp 2 and saved again at once is tensor for tensor the same (numpy's reading,
tests/mpi/checkpoint_tensors.py) and trains on with the uninterrupted losses within 1e-5, and a
train_gpt.py tp 2 checkpoint continues in loom-gpt on dp 2 with ZeRO-3 likewise; a loom-gpt
pp 2 checkpoint resumes in train_gpt.py pp 2 bit for bit and continues on dp 2 ZeRO-1.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN_GPT = os.path.join(HERE, "..", "..", "examples", "train_gpt.py")
CHECKPOINT_TENSORS = os.path.join(HERE, "..", "mpi", "checkpoint_tensors.py")
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


# Checkpoints: 6 steps, saved at step 3, with dropout so the masks must follow the step.
CKPT = ["--steps", "6", "--batch", "16", "--layers", "2", "--dim", "32", "--heads", "2",
        "--lr", "3e-3", "--warmup-steps", "1", "--eval-every", "1000", "--dropout", "0.1",
        "--seq", "26"]


def step_losses(path):
    with open(path) as f:
        return {j["step"]: j["loss"] for j in map(json.loads, f) if "loss" in j}


def compare(name, want_file, got_file, first, rtol):
    """The losses of steps >= first in both files agree (rtol 0: bit for bit). 0 or 1 failure."""
    want, got = step_losses(want_file), step_losses(got_file)
    steps = [s for s in sorted(want) if s >= first]
    bad = [(s, got.get(s), want[s]) for s in steps
           if s not in got or abs(got[s] - want[s]) > rtol * abs(want[s])]
    extra = sorted(set(got) - set(want))
    if not steps or bad or extra:
        print(f"{name}: MISMATCH (step, got, want): {bad[:2]}; extra steps {extra}", flush=True)
        return 1
    how = "bit for bit" if rtol == 0 else f"within {rtol:g}"
    print(f"{name}: losses of steps {steps[0]}-{steps[-1]} match {how}", flush=True)
    return 0


def same_tensors(name, a, b, except_layout=False):
    """Two step directories hold bit-identical tensors (and state), read by numpy."""
    cmd = [PYTHON, CHECKPOINT_TENSORS, "same", a, b] + (["--except-layout"] if except_layout
                                                         else [])
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if out.returncode != 0:
        print(f"{name}: checkpoints differ: {out.stdout.strip()[-1500:]}", flush=True)
        return 1
    print(f"{name}: {out.stdout.strip()}", flush=True)
    return 0


def checkpoint_checks(loom_gpt, launcher, tmp):
    """Returns the number of failed checks."""
    def cmd(np_, program, flags):
        prefix = launcher[:1] + ["-np", str(np_)] + launcher[1:] if launcher else []
        exe = [loom_gpt] if program == "loom-gpt" else [PYTHON, TRAIN_GPT]
        return prefix + exe + CKPT + flags

    def train(name, np_, program, flags):
        d = os.path.join(tmp, name)
        run(cmd(np_, program, flags + ["--metrics-file", d + ".jsonl"]), d + ".log")
        return d

    np_, layout = (2, ["--dp", "2", "--zero", "1"]) if launcher else (1, [])
    tag = " ".join(layout) or "one process"
    failures = 0
    # train_gpt.py: saved at step 3 and resumed equals the uninterrupted run.
    full = train("py_full", np_, "python", layout + ["--checkpoint-dir", os.path.join(
        tmp, "py_full"), "--save-every", "3"])
    resumed = os.path.join(tmp, "py_resumed")
    os.makedirs(resumed)
    shutil.copytree(os.path.join(full, "step-00000003"),
                    os.path.join(resumed, "step-00000003"))
    shutil.copy(full + ".jsonl", resumed + ".jsonl")  # rows after step 3 are dropped on resume
    run(cmd(np_, "python", layout + ["--checkpoint-dir", resumed, "--resume",
                                      "--metrics-file", resumed + ".jsonl"]), resumed + ".log")
    if "resumed from" not in open(resumed + ".log").read():
        failures += 1
        print(f"train_gpt.py {tag} --resume: did not resume:\n{open(resumed + '.log').read()}")
    failures += compare(f"train_gpt.py {tag}, resumed at step 3", full + ".jsonl",
                        resumed + ".jsonl", 1, 0)
    failures += same_tensors(f"train_gpt.py {tag}, step-6 checkpoints",
                             os.path.join(full, "step-00000006"),
                             os.path.join(resumed, "step-00000006"))
    # loom-gpt's checkpoint resumed by train_gpt.py, and train_gpt.py's by loom-gpt.
    c_full = train("c_full", np_, "loom-gpt", layout + ["--checkpoint-dir", os.path.join(
        tmp, "c_full"), "--save-every", "3"])
    failures += compare(f"{tag}: train_gpt.py's uninterrupted run against loom-gpt's",
                        c_full + ".jsonl", full + ".jsonl", 1, 0)
    failures += same_tensors(f"{tag}: step-6 checkpoints of train_gpt.py and loom-gpt",
                             os.path.join(full, "step-00000006"),
                             os.path.join(c_full, "step-00000006"))
    c_to_py = train("c_to_py", np_, "python", layout + [
        "--resume-from", os.path.join(c_full, "step-00000003")])
    failures += compare(f"loom-gpt {tag} checkpoint resumed by train_gpt.py", c_full + ".jsonl",
                        c_to_py + ".jsonl", 4, 0)
    py_to_c = train("py_to_c", np_, "loom-gpt", layout + [
        "--resume-from", os.path.join(full, "step-00000003")])
    failures += compare(f"train_gpt.py {tag} checkpoint resumed by loom-gpt", full + ".jsonl",
                        py_to_c + ".jsonl", 4, 0)
    if not launcher:
        return failures
    # Pipelines: loom-gpt's pp 2 checkpoint resumed by train_gpt.py pp 2 (and the step-6
    # checkpoints compared), and continued by train_gpt.py on dp 2 ZeRO-1.
    pp = ["--pp", "2", "--schedule", "1f1b"]
    c_pp = train("c_pp", 2, "loom-gpt", pp + ["--checkpoint-dir", os.path.join(tmp, "c_pp"),
                                              "--save-every", "3"])
    pp_to_py = train("c_pp_to_py", 2, "python", pp + [
        "--resume-from", os.path.join(c_pp, "step-00000003"),
        "--checkpoint-dir", os.path.join(tmp, "c_pp_to_py")])
    failures += compare("loom-gpt pp 2 checkpoint resumed by train_gpt.py pp 2", c_pp + ".jsonl",
                        pp_to_py + ".jsonl", 4, 0)
    failures += same_tensors("pp 2: step-6 checkpoints of loom-gpt and of train_gpt.py resumed",
                             os.path.join(c_pp, "step-00000006"),
                             os.path.join(pp_to_py, "step-00000006"))
    pp_to_dp = train("c_pp_to_py_dp", 2, "python", layout + [
        "--resume-from", os.path.join(c_pp, "step-00000003")])
    failures += compare("pp 2 checkpoint continued by train_gpt.py dp 2 ZeRO-1", c_pp + ".jsonl",
                        pp_to_dp + ".jsonl", 4, 1e-5)
    # Across layouts (the uninterrupted references: the runs above, dp 2 ZeRO-1).
    resaved = train("c_to_py_tp2_resaved", 2, "python", [
        "--tp", "2", "--resume-from", os.path.join(c_full, "step-00000003"), "--steps", "3",
        "--checkpoint-dir", os.path.join(tmp, "c_to_py_tp2_resaved")])
    failures += same_tensors("loom-gpt dp 2 ZeRO-1 checkpoint loaded by train_gpt.py tp 2, "
                             "saved again", os.path.join(c_full, "step-00000003"),
                             os.path.join(resaved, "step-00000003"), except_layout=True)
    c_to_tp = train("c_to_py_tp2", 2, "python", [
        "--tp", "2", "--resume-from", os.path.join(c_full, "step-00000003"),
        "--checkpoint-dir", os.path.join(tmp, "c_to_py_tp2")])
    failures += compare("loom-gpt dp 2 ZeRO-1 checkpoint continued by train_gpt.py tp 2",
                        c_full + ".jsonl", c_to_tp + ".jsonl", 4, 1e-5)
    py_to_zero3 = train("py_tp2_to_c_zero3", 2, "loom-gpt", [
        "--dp", "2", "--zero", "3", "--resume-from", os.path.join(c_to_tp, "step-00000006"),
        "--steps", "8"])
    tp_more = train("py_tp2_8", 2, "python", [
        "--tp", "2", "--resume-from", os.path.join(c_to_tp, "step-00000006"), "--steps", "8"])
    failures += compare("train_gpt.py tp 2 checkpoint continued by loom-gpt dp 2 ZeRO-3",
                        tp_more + ".jsonl", py_to_zero3 + ".jsonl", 7, 1e-5)
    return failures


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
        ckpt_failures = checkpoint_checks(loom_gpt, launcher, tmp)
    if failures or ckpt_failures:
        sys.exit(f"{failures} layout(s) differ from loom-gpt; {ckpt_failures} checkpoint "
                 "check(s) failed")


if __name__ == "__main__":
    main()
