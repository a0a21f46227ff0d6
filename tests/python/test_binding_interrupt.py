"""Ctrl-C stops a Python training loop cleanly: examples/train_gpt.py, interrupted with SIGINT
after its first steps, prints where it stopped and exits with status 130 within seconds (the GIL
is released inside loom's calls, so Python's handler runs as soon as the step returns)."""

import os
import signal
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_sigint_stops_train_gpt_cleanly():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, os.path.join(ROOT, "examples", "train_gpt.py"), "--steps", "100000",
           "--batch", "8", "--layers", "1", "--dim", "32", "--heads", "2", "--eval-every",
           "100000"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines = []
    try:
        for line in proc.stdout:  # wait until training runs
            lines.append(line)
            if line.startswith("step 3/"):
                break
        assert lines and lines[-1].startswith("step 3/"), "".join(lines)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        elapsed = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, "".join(lines) + out
    assert "interrupted at step" in out and "Traceback" not in out, out
    assert elapsed < 10, f"took {elapsed:.1f} s to stop"
