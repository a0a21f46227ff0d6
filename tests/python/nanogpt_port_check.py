"""examples/nanogpt_port.py under mpirun against one process (issue 19, Proof: the converted
script with dropout 0.1, DDP and a DistributedSampler gives the single-process losses).

Runs ``python3 examples/nanogpt_port.py --lib loom --dropout 0.1`` once alone and then under
``mpirun -np 2`` and ``-np 4`` (the global batch of 8 split 4 + 4 and 2 x 4), each as a user runs
it, and compares the per-step losses (averaged over ranks by the script) and gradient norms of
all 50 steps: within 1e-5 relative (the reductions add in another order; the masks are the same
bits, so dropout adds no difference). Usage: nanogpt_port_check.py MPIEXEC [mpirun flags...]
Exits 77 (skip) without numpy or the module.
"""

import json
import os
import subprocess
import sys

try:
    import numpy  # noqa: F401

    import loom  # noqa: F401
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "examples", "nanogpt_port.py")
ARGS = ["--lib", "loom", "--dropout", "0.1"]
RTOL = 1e-5


def run(prefix):
    out = subprocess.run(prefix + [sys.executable, SCRIPT] + ARGS, capture_output=True,
                         text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if out.returncode != 0:
        sys.exit(f"FAIL: {' '.join(prefix + ['nanogpt_port.py'] + ARGS)} exited "
                 f"{out.returncode}:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


mpiexec = sys.argv[1:]
single = run([])
assert len(single) == 50, f"the single process printed {len(single)} steps"
assert single[-1]["loss"] < single[0]["loss"] - 0.05, "the script should learn something"
failures = 0
for np_ in (2, 4):
    got = run(mpiexec + ["-np", str(np_)])
    if len(got) != len(single):
        print(f"FAIL -np {np_}: {len(got)} steps, the single process {len(single)}")
        failures += 1
        continue
    worst = 0.0
    for want, have in zip(single, got):
        for key in ("loss", "grad_norm"):
            err = abs(have[key] - want[key]) / abs(want[key])
            worst = max(worst, err)
            if err > RTOL:
                print(f"FAIL -np {np_} step {want['step']}: {key} {have[key]} vs the single "
                      f"process's {want[key]} (relative {err:.2e})")
                failures += 1
    print(f"-np {np_}: 50 steps with dropout 0.1, losses and gradient norms within {worst:.1e} "
          f"of the single process")
sys.exit(1 if failures else 0)
