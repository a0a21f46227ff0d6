#!/usr/bin/env python3
"""Replays every way a fault-injecting user broke loom (issue 18) and the other cases tried: bad
flags, truncated, garbage and foreign files, crafted headers, a full disk, unwritable paths, damaged
checkpoints, ranks that leave or disagree. Each case is one command with a hard timeout and a
promise: a clear error (non-zero exit, no signal, a message with the given words) or an exact
result. The cases and their promises are the documentation of what loom guarantees.

Each outcome is one of
    ok         the promise held
    crash      a signal, exit 134/139, or a crash's words (Segmentation fault, terminate called,
               double free, a sanitizer report, mpirun's "exited on signal 11")
    hang       no exit (or no promised output line) within the case's limit; the process group
               is killed
    wrong      exit 0 where an error was promised, a wrong result, or output lost (trained first,
               failed after)
    unclear    an error, but its message lacks the words that say what was wrong
    skipped    cannot run here (no mount permission, no mpirun, no loom-ckpt): counted apart,
               never as ok
    unrun      the command could not be started (a binary being relinked): counted apart, and
               the exit status is 1
and the last line is the figures:
    robustness: N cases tried, crashes 0, hangs 0, silent wrong answers 0, unclear errors 0
The exit status is 1 when any case tried is not ok.

usage: replay.py --bin BUILD/bin --python-path BUILD/python [--python PY] [--only REGEX]
                 [--mpirun MPIEXEC [mpirun flags...]]   (--mpirun last: it takes the rest)
"""

import argparse
import concurrent.futures
import json
import os
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple, Union

HERE = os.path.dirname(os.path.abspath(__file__))
CASES_DIR = os.path.join(HERE, "replay_cases")

# A tiny loom-gpt run: the built-in addition task, 1 block of width 16, 4 rows a step, 10 held-out
# examples; about 0.1 s a step on one core.
TINY = ["--layers", "1", "--dim", "16", "--heads", "2", "--batch", "4", "--eval-examples", "10"]
# loom-dlrm with a small ceiling estimate (the default one takes a second).
DLRM_FAST = ["--ceiling-examples", "2000", "--eval-batches", "1"]

# Words that mean a crash whatever the exit status (mpirun may exit 1 when a rank segfaults).
CRASH_WORDS = ("Segmentation fault", "terminate called", "core dumped", "double free",
               "free(): invalid", "malloc(): ", "corrupted size", "stack smashing",
               "AddressSanitizer", "UndefinedBehaviorSanitizer", "Fatal Python error")
CRASH_RE = re.compile(r"exited on signal (4|6|7|8|11)\b|signal 11 \(Segmentation")

Words = Sequence[Union[str, Tuple[str, ...]]]  # every entry must appear; a tuple: any one of it


class Ok(str):
    """What a check returns when the result is the promised one, with a line to show."""


@dataclass
class Result:
    rc: Optional[int]  # None: killed at the time limit
    out: str           # stdout and stderr, interleaved
    seconds: float
    prompt_line: Optional[str] = None  # prompt cases: the line that came in time


@dataclass
class Case:
    name: str
    what: str  # the promise, one line
    cmd: Callable[["Ctx"], List[str]]
    kind: str = "error"  # error | exact | prompt
    words: Words = ()  # error: the message must hold these
    absent: Sequence[str] = ()  # error: output that must not appear (e.g. a step before the error)
    # exact: called with the result; returns None when the result is the promised one, else why.
    # error: an extra check after the words (a file left behind, a row cut in half).
    check: Optional[Callable[["Ctx", Result], Optional[str]]] = None
    status: int = 0  # exact: the exit status promised
    prompt: str = ""  # prompt: a regex of the line that must come within `timeout` seconds
    timeout: float = 60.0
    env: dict = field(default_factory=dict)
    needs: Sequence[str] = ()  # mpi, mount, ckpt
    prepare: Optional[Callable[["Ctx"], Optional[str]]] = None  # returns a reason to skip
    memory_limit_gb: float = 0  # RLIMIT_AS for the command (0: none)
    serial: bool = False  # run alone (it times something or shares state with other cases)
    pending: str = ""  # the fix it waits for when the build predates it


class Ctx:
    """What the cases share: the binaries, the environment, a scratch directory, the files."""

    def __init__(self, args, work):
        self.bin = os.path.abspath(args.bin)
        self.python = args.python
        self.mpirun = args.mpirun
        self.work = work
        self.files = os.path.join(work, "files")
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.path.abspath(args.python_path) + (
            os.pathsep + self.env["PYTHONPATH"] if self.env.get("PYTHONPATH") else "")
        self.env.pop("LOOM_COMM_DEBUG", None)  # the collective checks must be on by default
        self.env.setdefault("OMP_NUM_THREADS", "1")
        for k in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"):
            self.env.setdefault(k, "1")
        self.env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
        self.mounts = {}  # name -> path, or a reason it could not be mounted
        self.reference = {}  # filled by the setup: the uninterrupted run's step lines

    def exe(self, name):
        return os.path.join(self.bin, name)

    def f(self, name):
        return os.path.join(self.files, name)

    def w(self, name):
        return os.path.join(self.work, name)


# ---------------------------------------------------------------------------------------------
# Running and classifying

def end_group(proc):
    """Ends the case's process group (its own session): SIGTERM first, so that mpirun takes its
    ranks down, then SIGKILL for anything left."""
    for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace or None)
        except subprocess.TimeoutExpired:
            pass


def run(ctx, case, cmd):
    env = dict(ctx.env, **case.env)
    if case.memory_limit_gb:  # an address-space limit, set by a shell that then execs the case
        kib = int(case.memory_limit_gb * (1 << 20))
        cmd = ["/bin/sh", "-c", f'ulimit -v {kib} && exec "$@"', "sh", *cmd]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            cwd=ctx.work, start_new_session=True)
    chunks, line_buf, prompt_line = [], b"", None
    pattern = re.compile(case.prompt.encode(), re.M) if case.kind == "prompt" else None
    deadline = start + case.timeout
    exited_at = None
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if not ready:
            # Exited, and whatever it left running has not written for a second: done.
            if exited_at is None and proc.poll() is not None:
                exited_at = time.monotonic()
            if exited_at is not None and time.monotonic() - exited_at > 1.0:
                break
            continue
        data = os.read(proc.stdout.fileno(), 65536)
        if not data:
            break
        chunks.append(data)
        if pattern is not None:
            line_buf += data
            for line in line_buf.split(b"\n")[:-1]:
                if pattern.search(line):
                    prompt_line = line.decode(errors="replace")
                    break
            line_buf = line_buf[line_buf.rfind(b"\n") + 1:]
            if prompt_line is not None:
                break
    rc = None
    if prompt_line is None:
        try:
            rc = proc.wait(timeout=max(0.0, deadline - time.monotonic()) + 0.1)
        except subprocess.TimeoutExpired:
            pass
    seconds = time.monotonic() - start
    end_group(proc)  # past the limit, a prompt case that gave its line, or anything left behind
    proc.stdout.close()
    out = b"".join(chunks).decode(errors="replace")
    return Result(rc, out, seconds, prompt_line)


def crash_sign(res):
    if res.rc is not None and res.rc < 0:
        return f"killed by signal {-res.rc} ({signal.Signals(-res.rc).name})"
    if res.rc in (134, 139):
        return f"exit {res.rc} (SIGABRT/SIGSEGV in a child)"
    for w in CRASH_WORDS:
        if w in res.out:
            return f"'{w}' in the output"
    m = CRASH_RE.search(res.out)
    return f"'{m.group(0)}' in the output" if m else None


def message_line(out):
    """The line that best says what happened: the last error-ish line, else the last line."""
    lines = [ln for ln in out.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.search(r"error|Error|refus|cannot|raised|ok \(|FAIL", ln):
            return ln.strip()
    return lines[-1].strip() if lines else "(no output)"


def has(out, word):
    return any(w in out for w in word) if isinstance(word, tuple) else word in out


def classify(ctx, case, res):
    """(outcome, detail)."""
    crash = crash_sign(res)
    if crash and res.prompt_line is None:
        return "crash", f"{crash}: {message_line(res.out)}"
    if case.kind == "prompt":
        if res.prompt_line is not None:
            why = case.check(ctx, res) if case.check else None
            return ("wrong", why) if why else ("ok", f"in {res.seconds:.1f} s: {res.prompt_line}")
        if res.rc is None:
            shown = message_line(res.out) if res.out.strip() else "no output at all"
            return "hang", f"no line /{case.prompt}/ within {case.timeout:.0f} s ({shown})"
        if res.rc != 0 and case.words and all(has(res.out, w) for w in case.words):
            return "ok", f"exit {res.rc}: {message_line(res.out)}"
        return "wrong", f"exit {res.rc} without the line /{case.prompt}/: {message_line(res.out)}"
    if res.rc is None:
        return "hang", f"no exit within {case.timeout:.0f} s: {message_line(res.out)}"
    if case.kind == "error":
        if res.rc == 0:
            return "wrong", f"exit 0 (accepted silently): {message_line(res.out)}"
        for a in case.absent:
            if a in res.out:
                return "wrong", f"exit {res.rc} but only after '{a}' (too late): " \
                                f"{message_line(res.out)}"
        missing = [w for w in case.words if not has(res.out, w)]
        if missing:
            shown = message_line(res.out)
            if len(shown) > 300:
                shown = shown[:300] + f"... ({len(shown)} characters)"
            return "unclear", f"exit {res.rc}, the message lacks {missing}: {shown}"
        why = case.check(ctx, res) if case.check else None
        if why:
            return "wrong", why
        return "ok", f"exit {res.rc}: {message_line(res.out)}"
    # exact
    if res.rc != case.status:
        return "wrong", f"exit {res.rc}, expected {case.status}: {message_line(res.out)}"
    why = case.check(ctx, res) if case.check else None
    if isinstance(why, Ok):
        return "ok", str(why)
    if why:
        return "wrong", why
    return "ok", f"exit {res.rc} as promised" if case.status else "exact"


# ---------------------------------------------------------------------------------------------
# Case builders

def py(code):
    return lambda ctx: [ctx.python, "-c", "import loom\n" + code]


def gpt(*flags, tiny=True):
    return lambda ctx: [ctx.exe("loom-gpt"), *(TINY if tiny else []),
                        *[a(ctx) if callable(a) else a for a in flags]]


def dlrm(*flags, fast=True):
    return lambda ctx: [ctx.exe("loom-dlrm"), *(DLRM_FAST if fast else []),
                        *[a(ctx) if callable(a) else a for a in flags]]


def ckpt(*args):
    return lambda ctx: [ctx.exe("loom-ckpt"), *[a(ctx) if callable(a) else a for a in args]]


def F(name):  # a file from replay_cases/make_files.py
    return lambda ctx: ctx.f(name)


def W(name):  # a path in the scratch directory
    return lambda ctx: ctx.w(name)


def mpi(*cmd):
    return lambda ctx: [*ctx.mpirun, "-np", "2",
                        *[a(ctx) if callable(a) else a for a in cmd]]


def python_error(name, what, code, *words, pending="", check=None):
    return Case(name, what, py(code), "error", ("ValueError", *words), pending=pending,
                check=check)


def python_exact(name, what, code, want):
    """The script prints one line; it must be exactly `want`."""
    def check(ctx, res):
        got = res.out.strip().splitlines()[-1] if res.out.strip() else ""
        return None if got == want else f"printed {got!r}, expected {want!r}"
    return Case(name, what, py(code), "exact", check=check)


# ---------------------------------------------------------------------------------------------
# Preparation helpers

def copy_checkpoint(ctx, name, damage):
    """A fresh copy of the setup's checkpoint root (steps 2 and 4), damaged by
    `damage(step-2 directory, root)`."""
    root = ctx.w(name)
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(ctx.w("ckpt"), root)
    damage(os.path.join(root, "step-00000002"), root)
    return None


def flip_byte(path, at_from_end):
    with open(path, "r+b") as f:
        f.seek(-at_from_end, os.SEEK_END)
        b = f.read(1)
        f.seek(-at_from_end, os.SEEK_END)
        f.write(bytes([b[0] ^ 0x10]))


def mounted(name):
    def prepare(ctx):
        where = ctx.mounts.get(name)
        if not where or not os.path.isdir(where):
            return f"skipped ({where or 'not mounted'})"
        if name == "full":  # every disk-full case starts from an empty 16 KiB disk
            for entry in os.listdir(where):
                p = os.path.join(where, entry)
                shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
        return None
    return prepare


def try_mount(ctx, name, options):
    path = ctx.w(name)
    os.makedirs(path, exist_ok=True)
    if shutil.which("mount") is None:
        ctx.mounts[name] = "no mount command"
        return
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", path],
                       capture_output=True, text=True)
    if r.returncode != 0:
        ctx.mounts[name] = "cannot mount a tmpfs here: " + (r.stderr.strip() or
                                                           f"mount exit {r.returncode}")
        return
    ctx.mounts[name] = path


def unmount_all(ctx):
    for name, path in ctx.mounts.items():
        if path == ctx.w(name):
            subprocess.run(["umount", "-l", path], capture_output=True)


def whole_rows(path):
    """None when `path` is a sequence of whole JSON lines, else why not."""
    if not os.path.exists(path):
        return f"{path} is missing"
    data = open(path, "rb").read()
    if data and not data.endswith(b"\n"):
        return f"{path} ends in a cut row: ...{data[-40:]!r}"
    for i, line in enumerate(data.splitlines(), 1):
        try:
            json.loads(line)
        except ValueError:
            return f"{path} row {i} is not JSON: {line[:80]!r}"
    return None


def dead_pid():
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def tmp_host():  # as core/io/detail/file.cpp spells this host in temporary names
    return socket.gethostname().replace("/", "_").replace(".", "_") or "host"


def safetensors_header(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n))


# ---------------------------------------------------------------------------------------------
# The cases

def cases():
    c = []
    add = c.append

    # -- 1. Shapes that overflow (Python): errors, never a small allocation under a huge shape.
    ov = "more elements than an int64 counts"
    add(python_error("py_zeros_2e62x4", "zeros(2**62 + 1, 4): the element count overflows int64",
                     "loom.zeros(2**62 + 1, 4)", ov))
    add(python_error("py_zeros_2e61_bytes", "zeros(2**61) f32: the byte count overflows int64",
                     "loom.zeros(2**61)", "more bytes than an int64 counts"))
    add(python_error("py_zeros_2e31_squared", "zeros(2**31, 2**31): 2^64 bytes",
                     "loom.zeros(2**31, 2**31)", "more bytes than an int64 counts"))
    add(python_error("py_full_overflow", "full((2**32, 2**32), 1.0): 2^64 elements",
                     "loom.full((2**32, 2**32), 1.0)", ov))
    add(python_error("py_reshape_overflow", "reshape(2**62, 4) of a 6-element tensor",
                     "loom.zeros(2, 3).reshape(2**62, 4)", ov))
    add(python_error("py_negative_size", "ones(-1, 4): a negative size",
                     "loom.ones(-1, 4)", "negative size"))
    add(python_error("py_huge_allocation", "zeros(2**40) f32 (4 TiB): out of memory, named",
                     "loom.zeros(2**40)", "out of memory", "4398046511104 bytes"))
    add(Case("py_zeros_2e63", "zeros(2**63): a size beyond int64 is a ValueError naming it",
             py("loom.zeros(2**63)"), "error", (("ValueError", "OverflowError"),
                                                ("int64", "too large", "overflow"))))
    add(python_exact("py_empty_huge_shape", "zeros(0, 2**62, 2**62) is a valid empty tensor",
                     "print(loom.zeros(0, 2**62, 2**62).numel())", "0"))
    add(python_error("py_narrow_past_end", "narrow(1, 2**62, 2) of a [2, 3] tensor",
                     "loom.zeros(2, 3).narrow(1, 2**62, 2)", "narrow: range"))
    # start + length overflows int64 in the range check: a view before or far past the data.
    add(python_error("py_narrow_overflow_start",
                     "narrow(0, 2**63 - 1, 2) of a 5-element tensor (start + length overflows)",
                     "print(loom.zeros(5).narrow(0, 2**63 - 1, 2))", "narrow: range"))
    add(python_error("py_narrow_overflow_length",
                     "narrow(0, 2**62, 2**62) of a 5-element tensor (start + length overflows)",
                     "print(loom.zeros(5).narrow(0, 2**62, 2**62).shape)", "narrow: range"))
    add(python_error("py_narrow_overflow_write",
                     "fill_ through narrow(0, 2**63 - 1, 2): refused, never a write out of bounds",
                     "loom.zeros(5).narrow(0, 2**63 - 1, 2).fill_(7.0)", "narrow: range"))

    # -- 2. Crafted, truncated, garbage and foreign files: loom-gpt --init-from and loom.load.
    neither = "is neither an llm.c model file"
    deep = "more than 64 levels deep"
    files = [
        ("deep_metadata.safetensors", "__metadata__ nesting 50,000 levels deep", (deep,)),
        ("deep_shape.safetensors", "a shape nesting 50,000 levels deep", (deep,)),
        ("truncated.safetensors", "a GPT-2 safetensors file cut in half",
         ("truncated", "h.0.mlp.c_fc.weight")),
        ("truncated_header.safetensors", "the first 20 bytes of a safetensors file", (neither,)),
        ("empty.safetensors", "an empty file", (neither,)),
        ("seven_bytes.safetensors", "7 bytes: less than the header length field", (neither,)),
        ("garbage.safetensors", "4 KiB of random bytes", (neither,)),
        ("elf.safetensors", "an ELF binary named .safetensors", (neither,)),
        ("text.txt", "a text file", (neither,)),
        ("header_past_end.safetensors", "header length 1 MiB in a 15-byte file", (neither,)),
        ("header_2e63.safetensors", "header length 2^63 - 1", (neither,)),
        ("header_2e64.safetensors", "header length 2^64 - 1", (neither,)),
        ("offsets_past_end.safetensors", "data_offsets [0, 10^12] in a 24-byte body",
         ("data_offsets", "needs 24")),
        ("shape_vs_bytes.safetensors", "shape [2, 3] F32 over 8 bytes", ("needs 24",)),
        ("shape_overflow.safetensors", "shape [2^62, 4]: the element count overflows",
         ("too large",)),
        ("negative_dim.safetensors", "shape [-2, 3]", ("non-negative integer, got -2",)),
        ("offsets_reversed.safetensors", "data_offsets [8, 0]", ("end before they begin",)),
        ("unknown_dtype.safetensors", "dtype F7", ("dtype F7",)),
        ("not_json.safetensors", "a header that is not JSON", ("not valid JSON",)),
        ("tokens.bin", "an llm.c token file passed as weights",
         ("token file", "not model weights")),
        ("truncated_model.bin", "an llm.c model cut in half", ("truncated", "holds 7584")),
        ("huge_layers.bin", "an llm.c header claiming 2^31 - 1 layers", ("needs", "holds 15168")),
        ("nan_model.bin", "an llm.c model with a NaN weight", ("NaN or infinite", "wte.weight")),
        ("inf_model.bin", "an llm.c model with an infinite weight", ("NaN or infinite", "inf")),
        ("nan_model.safetensors", "a GPT-2 safetensors file with a NaN weight",
         ("NaN or infinite",)),
        ("small.safetensors", "a safetensors file that holds no GPT", ("wte.weight is missing",)),
    ]
    for name, what, words in files:
        stem = name.replace(".", "_")
        add(Case(f"gpt_init_{stem}", f"loom-gpt --init-from {what}: refused, naming the file",
                 gpt("--init-from", F(name), "--eval-only", "--eval-batches", "1"), "error",
                 ("loom-gpt: error:", name, *words)))
    for name in ("deep_metadata.safetensors", "truncated.safetensors", "empty.safetensors",
                 "garbage.safetensors", "header_past_end.safetensors", "tokens.bin",
                 "shape_overflow.safetensors", "nan_model.bin"):
        words = dict((n, w) for n, _, w in files)[name]
        add(Case(f"py_load_{name.replace('.', '_')}", f"loom.load('{name}'): a ValueError",
                 lambda ctx, n=name: [ctx.python, "-c", "import loom, sys; loom.load(sys.argv[1])",
                                      ctx.f(n)], "error", ("ValueError", name, *words)))
    add(python_error("py_load_gpt_nan", "loom.load_gpt of a GPT-2 file with a NaN: refused",
                     "loom.load_gpt('@FILES@/nan_model.safetensors')",
                     "NaN or infinite", "blocks.0.attn.qkv.bias"))
    add(Case("py_load_allow_nonfinite", "loom.load(allow_nonfinite=True) gives the NaN exactly "
             "where the file holds it", lambda ctx: [ctx.python, "-c", (
                 "import loom, math, sys\n"
                 "w = loom.load(sys.argv[1], allow_nonfinite=True)['wte.weight'].numpy().ravel()\n"
                 "print(math.isnan(w[10]), sum(map(math.isnan, w)))"), ctx.f("nan_model.bin")],
             "exact", check=lambda ctx, res: None if res.out.strip() == "True 1" else
             f"printed {res.out.strip()!r}, expected 'True 1'"))
    add(python_error("py_load_missing", "loom.load of a missing file",
                     "loom.load('@WORK@/no-such.safetensors')", "no-such.safetensors",
                     "No such file"))
    add(python_error("py_save_unwritable", "loom.save into /proc: a ValueError naming the path",
                     "loom.save({'a': loom.ones(2)}, '/proc/loom-replay.safetensors')",
                     "cannot write", "/proc/loom-replay.safetensors"))
    # Token files as --data, and a weights file as data.
    add(Case("gpt_data_foreign", "loom-gpt --data an ELF binary", gpt("--data", F("elf.bin"),
             "--steps", "1"), "error", ("not an llm.c token file", "elf.bin")))
    add(Case("gpt_data_model_file", "loom-gpt --data a model file: says to pass it as weights",
             gpt("--data", F("model.bin"), "--steps", "1"), "error", ("pass it as weights",)))
    add(Case("gpt_data_truncated", "loom-gpt --data a token file whose header says 1000 tokens, "
             "10 present", gpt("--data", F("tokens_truncated.bin"), "--steps", "1"), "error",
             ("tokens_truncated.bin", ("truncated", "holds", "token count"))))
    add(Case("gpt_data_missing", "loom-gpt --data a missing file", gpt("--data", W("nothing.bin"),
             "--steps", "1"), "error", ("nothing.bin", "No such file")))
    add(Case("gpt_schedule_garbage", "loom-gpt --schedule-file of random bytes",
             gpt("--pp", "2", "--layers", "2", "--schedule-file", F("garbage.safetensors"),
                 "--validate-schedule", tiny=False), "error", ("garbage.safetensors:1: expected",)))

    def short_message(ctx, res):
        longest = max(len(ln) for ln in res.out.splitlines())
        return None if longest < 2000 else f"the error quotes {longest} characters of the file"
    add(Case("gpt_schedule_long_line", "loom-gpt --schedule-file whose first line is 100,000 "
             "characters: an error quoting an excerpt, not the line",
             gpt("--pp", "2", "--layers", "2", "--schedule-file", F("long_line_schedule.txt"),
                 "--validate-schedule", tiny=False), "error", ("long_line_schedule.txt:1",),
             check=short_message))

    # -- 3. One rank leaving a 2-rank job: ended within 10 s, non-zero (tests/robustness/leave.sh
    # asserts the timing, the status and every message; it covers every way of leaving).
    def leave_ok(ctx, res):
        m = re.search(r"^(ok \(.*)$", res.out, re.M)
        return Ok(m.group(1)) if m else message_line(res.out)
    for how, what in (("py_raise", "rank 1 raises (uncaught Python exception)"),
                      ("py_exit3", "rank 1 calls sys.exit(3)"),
                      ("gpt_metrics", "loom-gpt on 2 ranks with a bad --metrics-file")):
        add(Case(f"leave_{how}", f"{what}: every process gone within 10 s, exit non-zero",
                 lambda ctx, h=how: ["bash", os.path.join(HERE, "leave.sh"), h, ctx.python,
                                     ctx.exe("leave_cpp"), ctx.exe("loom-gpt"),
                                     ctx.exe("loom-dlrm"), *ctx.mpirun],
                 "exact", check=leave_ok, needs=("mpi",), timeout=90))

    # -- 4. Mismatched collectives on 2 ranks, with the checks as they are by default (See Note
    # [Collective signatures]): every rank raises.
    def outcomes(ctx, how, ranks=(0, 1)):
        """Each rank's line from mismatch.py, or why there is none."""
        lines = []
        for r in ranks:
            try:
                lines.append(open(ctx.w(f"mismatch_{how}.rank{r}")).read().strip())
            except OSError:
                return None, f"rank {r} wrote no outcome"
        return lines, None

    def every_rank_raised(how):
        def check(ctx, res):
            lines, why = outcomes(ctx, how)
            for r, line in enumerate(lines or []):
                if line.startswith("no error"):
                    return f"rank {r} returned without an error: {line[:120]}"
                if "disagree on collective" not in line:
                    return f"rank {r} raised without naming the disagreement: {line[:200]}"
            return why or Ok("both ranks " + lines[0])
        return check
    for how, what in (("count", "allreduce of 10 elements against 11"),
                      ("kind", "allreduce against allgather"),
                      ("dtype", "allreduce f32 against i32"),
                      ("op", "allreduce sum against max"),
                      ("root", "broadcast from root 0 against root 1"),
                      ("order", "two same-size allreduces in swapped order")):
        add(Case(f"mismatch_{how}", f"{what}: RuntimeError naming the disagreement on every rank",
                 mpi(lambda ctx: ctx.python, os.path.join(CASES_DIR, "mismatch.py"), how,
                     W(f"mismatch_{how}")),
                 "exact", check=every_rank_raised(how), needs=("mpi",),
                 env={"LOOM_COMM_TIMEOUT": "20"}))

    def late_rank_named(ctx, res):
        lines, why = outcomes(ctx, "late", ranks=(0,))  # rank 1 is ended by rank 0's abort
        if why or not lines[0].startswith("raised"):
            return why or f"rank 0 did not raise: {lines[0][:120]}"
        return Ok("rank 0 " + lines[0]) if "had not arrived: 1" in lines[0] else \
            f"the timeout does not name rank 1: {lines[0][:200]}"
    add(Case("mismatch_late_rank", "a rank 6 s late with LOOM_COMM_TIMEOUT=2: the timeout names it",
             mpi(lambda ctx: ctx.python, os.path.join(CASES_DIR, "mismatch.py"), "late",
                 W("mismatch_late")),
             "exact", status=1, check=late_rank_named, needs=("mpi",),
             env={"LOOM_COMM_TIMEOUT": "2"}))

    # -- 5. An in-place change to a tensor saved for backward: backward raises, naming the op.
    add(python_error("py_inplace_mul", "y = x * w; w.add_ under no_grad; backward",
                     "x = loom.tensor([[1.0]], requires_grad=True)\n"
                     "w = loom.tensor([[1.0]], requires_grad=True)\n"
                     "y = x * w\n"
                     "with loom.no_grad():\n    w.add_(loom.tensor([[10.0]]))\n"
                     "y.sum().backward()\nprint('x.grad', x.grad.numpy().tolist())",
                     "backward of mul", "modified by an in-place operation"))
    add(python_error("py_inplace_optimizer_step",
                     "an SGD step between forward and backward (the issue's x.grad = -9)",
                     "x = loom.tensor([[1.0]], requires_grad=True)\n"
                     "w = loom.tensor([[1.0]], requires_grad=True)\n"
                     "loss = loom.matmul(x, w).sum()\n"
                     "w.grad = loom.tensor([[10.0]])\n"
                     "loom.optim.SGD([w], lr=1.0).step()\n"
                     "loss.backward()\nprint('x.grad', x.grad.numpy().tolist())",
                     "input 1 of matmul", "modified by an in-place operation"))
    add(python_exact("py_unchanged_exact_grad", "no in-place change: x.grad is exactly w",
                     "x = loom.tensor([[1.0, 2.0]], requires_grad=True)\n"
                     "w = loom.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)\n"
                     "loom.matmul(x, w).sum().backward()\nprint(x.grad.numpy().tolist())",
                     "[[3.0, 7.0]]"))
    add(python_error("py_sgd_no_params", "SGD([]): an optimizer with no parameters",
                     "loom.optim.SGD([], lr=0.1)", "SGD: got an empty parameter list"))
    add(python_error("py_adamw_used_generator", "AdamW over a used-up parameters() generator",
                     "p = loom.nn.Linear(2, 2).parameters()\nlist(p)\nloom.optim.AdamW(p)",
                     "AdamW: got an empty parameter list"))

    # -- 6. Lost output: every output path checked before the first step; write errors are errors.
    first_step = ("step 1/",)
    add(Case("gpt_save_missing_dir", "--save into a missing directory: refused before step 1",
             gpt("--steps", "2", "--save", W("no-such-dir/w.safetensors")), "error",
             ("--save", "does not exist"), first_step))
    add(Case("gpt_trace_missing_dir", "--trace into a missing directory: refused before step 1",
             gpt("--steps", "2", "--trace", W("no-such-dir/t.json")), "error",
             ("--trace", "does not exist"), first_step))
    add(Case("gpt_metrics_missing_dir", "--metrics-file into a missing directory: refused before "
             "step 1", gpt("--steps", "2", "--metrics-file", W("no-such-dir/m.jsonl")), "error",
             ("--metrics-file", "does not exist"), first_step))
    add(Case("gpt_save_is_dir", "--save naming a directory: refused before step 1",
             gpt("--steps", "2", "--save", W("files")), "error", ("--save", "is a directory"),
             first_step))
    add(Case("gpt_save_under_file", "--save under a regular file (ENOTDIR): refused before step 1",
             gpt("--steps", "2", "--save", lambda ctx: ctx.f("model.bin") + "/w.safetensors"),
             "error", ("--save", "Not a directory"), first_step))
    add(Case("gpt_save_proc", "--save into /proc (writable by access(2) as root, yet no file can "
             "be made): refused before step 1", gpt("--steps", "2", "--save",
                                                   "/proc/loom-replay.safetensors"),
             "error", ("--save", "/proc/loom-replay.safetensors"), first_step))
    add(Case("gpt_save_readonly", "--save on a read-only filesystem: refused before step 1",
             gpt("--steps", "2", "--save", W("ro/w.safetensors")), "error",
             ("--save", ("not writable", "Read-only")), first_step, needs=("mount",),
             prepare=mounted("ro")))
    add(Case("gpt_metrics_readonly", "--metrics-file on a read-only filesystem: refused before "
             "step 1", gpt("--steps", "2", "--metrics-file", W("ro/m.jsonl")), "error",
             ("--metrics-file", ("not writable", "Read-only")), first_step, needs=("mount",),
             prepare=mounted("ro")))
    add(Case("gpt_ckpt_dir_readonly", "--checkpoint-dir on a read-only filesystem: refused before "
             "step 1", gpt("--steps", "2", "--checkpoint-dir", W("ro/ck")), "error",
             ("checkpoint", "ro/ck"), first_step, needs=("mount",), prepare=mounted("ro")))
    add(Case("gpt_ckpt_dir_is_file", "--checkpoint-dir naming a regular file: refused before "
             "step 1", gpt("--steps", "2", "--checkpoint-dir", F("model.bin")), "error",
             ("checkpoint", "model.bin"), first_step))

    def metrics_whole(name):
        return lambda ctx, res: whole_rows(ctx.w(f"full/{name}"))
    add(Case("gpt_metrics_disk_full", "--metrics-file on a full 16 KiB disk: exit 1 naming the "
             "file and ENOSPC; the file keeps whole rows",
             gpt("--steps", "400", "--eval-every", "1000", "--metrics-file", W("full/m.jsonl")),
             "error", ("--metrics-file", "No space left on device"), check=metrics_whole("m.jsonl"),
             needs=("mount",), prepare=mounted("full")))
    add(Case("dlrm_metrics_disk_full", "loom-dlrm --metrics-file on a full 16 KiB disk: exit 1 "
             "naming ENOSPC; whole rows", dlrm("--batch", "8", "--steps", "400", "--eval-every",
                                               "0", "--metrics-file", W("full/d.jsonl")),
             "error", ("--metrics-file", "No space left on device"),
             check=metrics_whole("d.jsonl"), needs=("mount",), prepare=mounted("full")))

    def nothing_left(sub):
        def check(ctx, res):
            left = [os.path.join(d, f) for d, _, fs in os.walk(ctx.w(sub)) for f in fs]
            return f"left behind: {left}" if left else None
        return check
    add(Case("gpt_save_disk_full", "--save of a model larger than the disk: ENOSPC, no partial "
             "or temporary file left", gpt("--steps", "1", "--dim", "64", "--save",
                                           W("full/w.safetensors")),
             "error", ("w.safetensors", "No space left on device"), check=nothing_left("full"),
             needs=("mount",), prepare=mounted("full")))
    add(Case("gpt_checkpoint_disk_full", "--checkpoint-dir on a full disk: ENOSPC named, no "
             "data file or manifest left", gpt("--steps", "1", "--dim", "64", "--checkpoint-dir",
                                               W("full/ck")),
             "error", ("checkpoint save", "No space left on device"), check=nothing_left("full"),
             needs=("mount",), prepare=mounted("full")))

    def stale_prepare(ctx):
        d = ctx.w("stale")
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        host = tmp_host()
        ctx.stale = {
            "dead": os.path.join(d, f"w.safetensors.tmp.{host}.{dead_pid()}"),
            "alive": os.path.join(d, f"w.safetensors.tmp.{host}.{os.getpid()}"),
            "other_host": os.path.join(d, "w.safetensors.tmp.some-other-host.12345"),
        }
        for p in ctx.stale.values():
            with open(p, "wb") as f:
                f.write(b"\0" * 4096)
        return None

    def stale_check(ctx, res):
        s = ctx.stale
        if os.path.exists(s["dead"]):
            return f"the killed writer's {os.path.basename(s['dead'])} is still there"
        for k in ("alive", "other_host"):
            if not os.path.exists(s[k]):
                return f"{os.path.basename(s[k])} ({k}: not stale) was removed"
        try:
            names = [k for k in safetensors_header(ctx.w("stale/w.safetensors"))
                     if k != "__metadata__"]
        except (OSError, ValueError) as e:
            return f"the saved file is unreadable: {e}"
        return None if "wte.weight" in names else f"the saved file lacks wte.weight: {names[:5]}"
    add(Case("gpt_save_removes_stale_tmp", "--save removes a killed writer's <path>.tmp.<host>."
             "<pid>, keeps a live writer's and another host's, and writes the file",
             gpt("--steps", "1", "--save", W("stale/w.safetensors")), "exact",
             prepare=stale_prepare, check=stale_check, serial=True))

    # -- 7. Sizes too large for the machine: a one-line error or prompt output, never exit 134.
    add(Case("dlrm_batch_1e8_limited", "loom-dlrm --batch 100000000 where it does not fit (4 GiB "
             "address space): a one-line out-of-memory error naming the flags",
             dlrm("--batch", "100000000"), "error", ("out of memory", "--batch"),
             memory_limit_gb=4))
    add(Case("gpt_batch_1e8_limited", "loom-gpt --batch 100000000 where it does not fit (4 GiB): "
             "a one-line out-of-memory error", gpt("--batch", "100000000", "--steps", "1"),
             "error", ("out of memory", "--batch"), memory_limit_gb=4))
    add(Case("dlrm_ceiling_too_large", "loom-dlrm --ceiling-examples 10^11: out of memory, named",
             dlrm("--ceiling-examples", "100000000000", fast=False), "error",
             ("out of memory", "too large")))
    add(Case("dlrm_batch_1e8_first_line", "loom-dlrm --batch 100000000 where it fits: its first "
             "line within 10 s (or a one-line error), not minutes of silence",
             dlrm("--batch", "100000000", "--steps", "1"), "prompt", ("error",),
             prompt=r"^data: ", timeout=10, memory_limit_gb=8))
    add(Case("dlrm_max_bag_1e5", "loom-dlrm --max-bag 100000: its first line within 10 s",
             dlrm("--max-bag", "100000", "--steps", "1", fast=False), "prompt", ("error",),
             prompt=r"^data: ", timeout=10, memory_limit_gb=8))

    def sane_eta(ctx, res):
        m = re.search(r"eta (\S+)", res.prompt_line)
        return f"the first step line shows eta {m.group(1)}" if m and "-" in m.group(1) else None
    add(Case("dlrm_steps_max", "loom-dlrm --steps 2^63 - 1: the first step within 10 s, with a "
             "sane eta", dlrm("--steps", "9223372036854775807", "--eval-every", "0"), "prompt",
             prompt=r"^step 1/", timeout=10, check=sane_eta))
    add(Case("gpt_steps_max", "loom-gpt --steps 2^63 - 1: the first step within 10 s, with a sane "
             "eta", gpt("--steps", "9223372036854775807"), "prompt", prompt=r"^step 1/",
             timeout=10, check=sane_eta))

    # -- 8. Bad flags: one clear line each, never a silent default.
    for name, flags, words in (
            ("steps_negative", ["--steps", "-1"], ["--steps must be >= 0, got -1"]),
            ("steps_overflow", ["--steps", "99999999999999999999"],
             ["--steps expects an integer"]),
            ("steps_fraction", ["--steps", "1.5"], ["--steps expects an integer, got '1.5'"]),
            ("lr_inf", ["--lr", "inf"], ["--lr expects a finite number, got 'inf'"]),
            ("lr_nan", ["--lr", "nan"], ["--lr expects a finite number, got 'nan'"]),
            ("lr_text", ["--lr", "abc"], ["--lr expects a number, got 'abc'"]),
            ("lr_missing_value", ["--lr"], ["--lr needs a value"]),
            ("unknown_flag", ["--frob", "1"], ["unknown flag --frob"]),
            ("batch_zero", ["--batch", "0"], ["--batch 0 must be a positive"]),
            ("dim_not_4", ["--dim", "5"], ["dim 5", "multiples of 4"]),
            ("max_bag_zero", ["--max-bag", "0"], ["max_bag_size must be >= 1, got 0"]),
            ("optimizer_unknown", ["--embedding-optimizer", "lion"], ["must be one of"]),
            ("eval_every_negative", ["--eval-every", "-1"], ["--eval-every"]),
            ("eval_batches_zero", ["--eval-batches", "0", "--steps", "1"], ["--eval-batches"]),
    ):
        add(Case(f"dlrm_{name}", f"loom-dlrm {' '.join(flags)}", dlrm(*flags), "error",
                 ("loom-dlrm: error:", *words), ("step 1/",)))
    for name, flags, words in (
            ("unknown_flag", ["--layer", "2"], ["unknown flag --layer"]),
            ("missing_value", ["--lr"], ["--lr needs a value"]),
            ("steps_text", ["--steps", "ten"], ["--steps expects an integer, got 'ten'"]),
            ("steps_negative", ["--steps", "-1"], ["--steps must be >= 0, got -1"]),
            ("steps_zero", ["--steps", "0"], ["--steps"]),
            ("lr_inf", ["--lr", "inf"], ["--lr expects a finite number"]),
            ("lr_nan", ["--lr", "nan"], ["--lr expects a finite number"]),
            ("dropout_range", ["--dropout", "1.5"], ["--dropout must be in [0, 1)"]),
            ("heads_not_dividing", ["--heads", "3"], ["--heads 3 must divide --dim 16"]),
            ("optimizer_unknown", ["--optimizer", "lion"], ["--optimizer must be one of"]),
            ("dp_without_ranks", ["--dp", "2", "--steps", "1"], ["needs 2 ranks but 1"]),
    ):
        add(Case(f"gpt_{name}", f"loom-gpt {' '.join(flags)}", gpt(*flags), "error",
                 ("loom-gpt: error:", *words), ("step 1/",)))
    add(Case("ckpt_unknown_command", "loom-ckpt frob DIR", ckpt("frob", W("ckpt")), "error",
             ("unknown command 'frob'",), needs=("ckpt",)))
    add(Case("ckpt_missing_dir", "loom-ckpt verify of a missing directory",
             ckpt("verify", W("no-such-checkpoint")), "error",
             ("no-such-checkpoint does not exist",), needs=("ckpt",)))

    # -- Checkpoints: exact resume; damaged files refused naming the file.
    def same_steps(ctx, res):
        got = re.findall(r"^step [34]/4 \| loss (\S+) \| lr (\S+) \| norm (\S+)", res.out, re.M)
        want = ctx.reference.get("steps")
        return Ok(f"steps 3-4 equal: {got}") if got == want and got else \
            f"steps 3-4 {got}, the uninterrupted run {want}"
    add(Case("ckpt_resume_exact", "resume from step 2 of 4: steps 3 and 4 equal the "
             "uninterrupted run's (loss, lr, norm)",
             gpt("--steps", "4", "--resume-from", W("ckpt/step-00000002")), "exact",
             check=same_steps))

    def damaged(name, damage, *words, resume="from", tool=True):
        # Each case damages its own copy (cases run side by side).
        root = f"{name}_gpt"
        args = ["--resume-from", W(f"{root}/step-00000002")] if resume == "from" else \
            ["--checkpoint-dir", W(root), "--resume"]
        add(Case(f"ckpt_{name}", f"loom-gpt --resume{'-from' if resume == 'from' else ''} of a "
                 f"checkpoint with {damage.__doc__}", gpt("--steps", "4", *args), "error",
                 ("loom-gpt: error:", *words), ("step 3/",),
                 prepare=lambda ctx: copy_checkpoint(ctx, root, damage)))
        if tool:
            add(Case(f"ckpt_verify_{name}", f"loom-ckpt verify of a checkpoint with "
                     f"{damage.__doc__}", ckpt("verify", W(f"{name}_tool/step-00000002")),
                     "error", ("loom-ckpt: error:", *words), needs=("ckpt",),
                     prepare=lambda ctx: copy_checkpoint(ctx, f"{name}_tool", damage)))

    def truncated_data(step, root):
        """its data file cut to 30,000 bytes"""
        os.truncate(os.path.join(step, "rank-00000.safetensors"), 30000)

    def flipped(step, root):
        """one flipped bit in its data"""
        flip_byte(os.path.join(step, "rank-00000.safetensors"), 100)

    def no_manifest(step, root):
        """no manifest.json"""
        os.remove(os.path.join(step, "manifest.json"))

    def garbage_manifest(step, root):
        """a manifest that is not JSON"""
        open(os.path.join(step, "manifest.json"), "w").write('{"files": [ garbage')

    def deep_manifest(step, root):
        """a manifest nesting 50,000 levels deep"""
        open(os.path.join(step, "manifest.json"), "w").write(
            '{"format": "loom-checkpoint", "x": ' + "[" * 50000 + "]" * 50000 + "}")

    def escaping_name(step, root):
        """a manifest naming ../../../etc/passwd as a data file"""
        p = os.path.join(step, "manifest.json")
        m = json.load(open(p))
        m["files"][0]["name"] = "../../../etc/passwd"
        json.dump(m, open(p, "w"))

    def missing_data(step, root):
        """its data file deleted"""
        os.remove(os.path.join(step, "rank-00000.safetensors"))

    def latest_without_manifest(step, root):
        """`latest` naming its only step, whose manifest was deleted"""
        shutil.rmtree(os.path.join(root, "step-00000004"))
        open(os.path.join(root, "latest"), "w").write("step-00000002\n")
        os.remove(os.path.join(step, "manifest.json"))

    damaged("truncated_data", truncated_data, "rank-00000.safetensors", "is 30000 bytes",
            "truncated")
    damaged("flipped_bit", flipped, "rank-00000.safetensors", "checksum")
    damaged("no_manifest", no_manifest, "has no manifest.json")
    damaged("garbage_manifest", garbage_manifest, "manifest.json", "not valid JSON")
    damaged("deep_manifest", deep_manifest, "manifest.json", "64 levels deep")
    damaged("escaping_name", escaping_name, "not a plain file name")
    damaged("missing_data", missing_data, "rank-00000.safetensors", "is missing")
    damaged("latest_without_manifest", latest_without_manifest, "step-00000002",
            "manifest.json", resume="latest", tool=False)
    return c


# ---------------------------------------------------------------------------------------------

def setup(ctx):
    """The files and the reference checkpoint the cases use. Raises on failure."""
    os.makedirs(ctx.files)
    subprocess.run([ctx.python, os.path.join(CASES_DIR, "make_files.py"), ctx.files],
                   env=ctx.env, check=True, timeout=120)
    # 4 steps, saving at 2 and 4: the reference for the exact resume, and the root the damaged
    # checkpoints are copied from.
    r = subprocess.run([ctx.exe("loom-gpt"), *TINY, "--steps", "4", "--save-every", "2",
                        "--checkpoint-dir", ctx.w("ckpt")], env=ctx.env, capture_output=True,
                       text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"the reference run failed: {r.stdout}{r.stderr}")
    ctx.reference["steps"] = re.findall(
        r"^step [34]/4 \| loss (\S+) \| lr (\S+) \| norm (\S+)", r.stdout, re.M)
    try_mount(ctx, "full", "size=16k")
    try_mount(ctx, "ro", "ro,size=16k")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True, help="the build's bin/ (loom-gpt, loom-dlrm, ...)")
    ap.add_argument("--python-path", required=True, help="the build's python/ (the loom module)")
    ap.add_argument("--python", default="/usr/bin/python3" if os.path.exists("/usr/bin/python3")
                    else sys.executable, help="the interpreter the module was built for")
    ap.add_argument("--only", default="", help="run only the cases whose name matches this regex")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ap.add_argument("--jobs", type=int, default=2,
                    help="cases run at a time (the timed ones run alone)")
    ap.add_argument("--mpirun", nargs=argparse.REMAINDER, default=[],
                    help="the MPI launcher and its flags (last: it takes the rest)")
    args = ap.parse_args()
    if len(args.mpirun) == 1 and " " in args.mpirun[0]:
        args.mpirun = shlex.split(args.mpirun[0])

    wall = time.monotonic()
    work = tempfile.mkdtemp(prefix="loom-replay-")
    ctx = Ctx(args, work)
    counts = {k: 0 for k in ("ok", "crash", "hang", "wrong", "unclear", "skipped", "unrun")}
    not_ok = []

    def attempt(case):
        """(skip reason, None) or (None, (outcome, detail, result, command))."""
        if "mpi" in case.needs and not ctx.mpirun:
            return "skipped (no --mpirun given)", None
        if "ckpt" in case.needs and not os.path.exists(ctx.exe("loom-ckpt")):
            return "skipped (no loom-ckpt in --bin)", None
        skip = case.prepare(ctx) if case.prepare else None
        if skip:
            return skip, None
        # Scripts name the scratch directory @WORK@ and the files' directory @FILES@.
        cmd = [a.replace("@FILES@", ctx.files).replace("@WORK@", ctx.work) for a in case.cmd(ctx)]
        try:
            res = run(ctx, case, cmd)
        except OSError as e:  # the replay's own trouble (a binary being relinked), not loom's
            return None, ("unrun", f"could not start {cmd[0]}: {e}", Result(None, "", 0.0), cmd)
        return None, (*classify(ctx, case, res), res, cmd)

    def report(case, skip, done):
        if skip:
            counts["skipped"] += 1
            print(f"SKIP    {case.name:34} {case.what}\n        {skip}", flush=True)
            return
        outcome, detail, res, cmd = done
        counts[outcome] += 1
        note = f" [waits for: {case.pending}]" if outcome != "ok" and case.pending else ""
        print(f"{outcome.upper():7} {case.name:34} {case.what} ({res.seconds:.1f} s)\n"
              f"        {detail[:400]}{note}", flush=True)
        if outcome != "ok":
            not_ok.append((case, outcome, res, cmd))

    try:
        setup(ctx)
        chosen = [c for c in cases() if not args.only or re.search(args.only, c.name)]
        # Cases that time something, share a mount or start several processes run alone, after
        # the others (which run args.jobs at a time, reported in order).
        alone = [c for c in chosen
                 if c.serial or c.kind == "prompt" or {"mpi", "mount"} & set(c.needs)]
        together = [c for c in chosen if c not in alone]
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            for case, future in [(c, pool.submit(attempt, c)) for c in together]:
                report(case, *future.result())
        for case in alone:
            report(case, *attempt(case))
    finally:
        unmount_all(ctx)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    tried = sum(v for k, v in counts.items() if k not in ("skipped", "unrun"))
    for case, outcome, res, cmd in not_ok:
        print(f"--- {outcome}: {case.name}: {' '.join(shlex.quote(a) for a in cmd)}")
        print("\n".join("    " + ln[:300] for ln in res.out.strip().splitlines()[-12:]))
    if counts["skipped"]:
        print(f"robustness: {counts['skipped']} case(s) skipped (not counted as tried)")
    if counts["unrun"]:
        print(f"robustness: {counts['unrun']} case(s) could not be started (see UNRUN above)")
    print(f"robustness: wall time {time.monotonic() - wall:.0f} s")
    print(f"robustness: {tried} cases tried, crashes {counts['crash']}, hangs {counts['hang']}, "
          f"silent wrong answers {counts['wrong']}, unclear errors {counts['unclear']}")
    return 0 if counts["ok"] == tried and not counts["unrun"] else 1


if __name__ == "__main__":
    sys.exit(main())
