"""examples/train_dlrm.py (DLRM defined in Python) against build/bin/loom-dlrm (C++): with the
same flags, every step's loss and the final evaluation agree within 1e-5 (they share the data,
the parameter names hence the initial values, the ops and AdamW).

loom-dlrm is found through $LOOM_DLRM or build/bin/loom-dlrm, the Python package through
$PYTHONPATH or build/python; without either the test is skipped, saying which is missing.
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "examples", "train_dlrm.py")


def _loom_dlrm():
    path = os.environ.get("LOOM_DLRM") or os.path.join(ROOT, "build", "bin", "loom-dlrm")
    if not os.path.isfile(path):
        pytest.skip(f"no loom-dlrm binary at {path} (build it, or set LOOM_DLRM)")
    return path


def _python_env():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if not env.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.path.join(ROOT, "build", "python")
    probe = subprocess.run([sys.executable, "-c", "import loom.data"], env=env,
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"the loom Python module is not importable from PYTHONPATH="
                    f"{env['PYTHONPATH']}: {probe.stderr.strip().splitlines()[-1:]}")
    return env


def _metrics(cmd, env, path):
    if os.path.exists(path):
        os.remove(path)
    run = subprocess.run(cmd + ["--metrics-file", path], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, f"{cmd[0]} failed:\n{run.stdout}\n{run.stderr}"
    with open(path) as f:
        records = [json.loads(line) for line in f]
    steps = [r["loss"] for r in records if "event" not in r]
    evals = [r for r in records if r.get("event") == "eval"]
    return steps, evals, run.stdout


@pytest.mark.parametrize("flags", [
    ["--steps", "20", "--eval-every", "10", "--eval-batches", "2"],
    ["--steps", "20", "--batch", "64", "--lr", "1e-2", "--seed", "7", "--dim", "8",
     "--max-bag", "1", "--eval-every", "0", "--eval-batches", "1"],
])
def test_train_dlrm_matches_loom_dlrm(flags, tmp_path):
    binary = _loom_dlrm()
    env = _python_env()
    cpp_steps, cpp_evals, cpp_out = _metrics([binary] + flags, env, str(tmp_path / "cpp.jsonl"))
    py_steps, py_evals, py_out = _metrics([sys.executable, SCRIPT] + flags, env,
                                          str(tmp_path / "py.jsonl"))
    assert len(cpp_steps) == len(py_steps) == 20
    for step, (c, p) in enumerate(zip(cpp_steps, py_steps), 1):
        assert abs(c - p) <= 1e-5, f"step {step}: loom-dlrm loss {c}, train_dlrm.py {p}"
    assert len(cpp_evals) == len(py_evals) >= 1
    for c, p in zip(cpp_evals, py_evals):
        assert c["step"] == p["step"]
        for key in ("val_loss", "accuracy", "auc", "ceiling_accuracy", "ceiling_auc"):
            assert abs(c[key] - p[key]) <= 1e-5, f"eval at step {c['step']}: {key}"
    # The same banner (the data and its ceiling) and the final figures.
    assert cpp_out.splitlines()[0] == py_out.splitlines()[0]
    assert "final: accuracy" in py_out


@pytest.mark.parametrize("sharding", ["table", "row", "column", "data", "auto"])
def test_train_dlrm_under_mpirun_matches_loom_dlrm(sharding, tmp_path):
    """Both programs under `mpirun -np 2` ($LOOM_MPIRUN: the launcher and its flags; skipped
    without it): tables sharded by --sharding, the MLPs in DistributedDataParallel."""
    launcher = os.environ.get("LOOM_MPIRUN", "").split()
    if not launcher:
        pytest.skip("LOOM_MPIRUN is not set (the ctest entry python_train_dlrm_mpi sets it)")
    binary = _loom_dlrm()
    env = _python_env()
    flags = ["--steps", "6", "--batch", "64", "--eval-every", "0", "--eval-batches", "2",
             "--sharding", sharding]
    prefix = launcher[:1] + ["-np", "2"] + launcher[1:]
    cpp_steps, cpp_evals, _ = _metrics(prefix + [binary] + flags, env,
                                       str(tmp_path / "cpp.jsonl"))
    py_steps, py_evals, _ = _metrics(prefix + [sys.executable, SCRIPT] + flags, env,
                                     str(tmp_path / "py.jsonl"))
    assert len(cpp_steps) == len(py_steps) == 6
    for step, (c, p) in enumerate(zip(cpp_steps, py_steps), 1):
        assert abs(c - p) <= 1e-5, f"{sharding}: step {step}: loom-dlrm {c}, train_dlrm.py {p}"
    assert len(cpp_evals) == len(py_evals) == 1
    assert abs(cpp_evals[0]["auc"] - py_evals[0]["auc"]) <= 1e-5
