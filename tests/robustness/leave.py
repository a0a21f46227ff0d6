"""A Python script for tests/robustness/leave.sh: every rank runs allreduces in a loop; after a
few, rank 1 leaves the way MODE names while the others keep calling.

    raise    rank 1 raises RuntimeError (uncaught)
    exit3    rank 1 calls sys.exit(3)
    exit0    rank 1 calls sys.exit(0): a clean exit while the others still expect it
    signal   rank 1 writes its pid to PIDFILE and keeps going; the test signals it
    clean    nobody leaves early: every rank runs 20 allreduces and exits 0

Usage: leave.py MODE TAG [PIDFILE] (TAG is ignored: it lets a test find its own processes)
"""

import os
import sys
import time

import loom
import loom.distributed as dist

mode = sys.argv[1]
comm = dist.world()
t = loom.zeros(4)
if mode == "signal" and comm.rank == 1:
    with open(sys.argv[3] + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(sys.argv[3] + ".tmp", sys.argv[3])
for i in range(20 if mode == "clean" else 1_000_000):
    comm.allreduce(t)
    if i == 5 and comm.rank == 1 and mode in ("raise", "exit3", "exit0"):
        print(f"rank 1 leaves: {mode}", flush=True)  # the test's clock starts here
        if mode == "raise":
            raise RuntimeError("rank 1 fails on purpose")
        if mode == "exit3":
            sys.exit(3)
        if mode == "exit0":
            sys.exit(0)
    time.sleep(0.01)
print(f"rank {comm.rank}: done", flush=True)
