"""Two ranks make collectives that do not match; every rank must raise, naming the disagreement
(collective signatures, checked by default; replay.py leaves LOOM_COMM_DEBUG unset). Run under
`mpirun -np 2`. Each rank writes `raised: <message>` or `no error: <result>` to OUT.rank<R> (a
file each: mpirun may interleave the ranks' long lines) and exits 0; tests/robustness/replay.py
reads them. After the error both ranks meet in a barrier (the group stays usable).

usage: mismatch.py CASE OUT  (count, kind, dtype, op, root, order; late: rank 1 arrives 6 s late,
run with LOOM_COMM_TIMEOUT=2: rank 0's timeout must name rank 1)

`order` makes its calls on different lines, as swapped code does: a signature's call site tells
them apart (one line called with swapped tensors is one call, and no check can see it).
"""

import sys
import time

import loom
import loom.distributed as dist

case, out = sys.argv[1], sys.argv[2]
comm = dist.init_process_group()
r = comm.rank
result = None
try:
    if case == "count":  # 10 elements against 11
        t = loom.ones(10 + r)
        comm.allreduce(t)
        result = t.numpy().tolist()
    elif case == "kind":  # allreduce against allgather of the same input size
        t = loom.ones(4)
        if r == 0:
            comm.allreduce(t)
            result = t.numpy().tolist()
        else:
            gathered = loom.zeros(8)
            comm.allgather(t, gathered)
            result = gathered.numpy().tolist()
    elif case == "dtype":  # f32 against i32
        t = loom.ones(4, dtype="f32" if r == 0 else "i32")
        comm.allreduce(t)
        result = t.numpy().tolist()
    elif case == "op":  # sum against max
        t = loom.full((4,), float(r + 1))
        comm.allreduce(t, op="sum" if r == 0 else "max")
        result = t.numpy().tolist()
    elif case == "root":  # broadcast from root 0 against root 1
        t = loom.full((4,), float(r))
        comm.broadcast(t, src=r)
        result = t.numpy().tolist()
    elif case == "order":  # two same-size allreduces in swapped order
        a, b = loom.full((4,), 1.0), loom.full((4,), 10.0 + r)
        if r == 0:
            comm.allreduce(a)
            comm.allreduce(b)
        else:
            comm.allreduce(b)
            comm.allreduce(a)
        result = (a.numpy().tolist(), b.numpy().tolist())
    elif case == "late":  # rank 1 arrives after rank 0's deadline
        if r == 1:
            time.sleep(6)
        t = loom.ones(4)
        comm.allreduce(t)
        result = t.numpy().tolist()
    else:
        raise SystemExit(f"unknown case {case}")
    outcome = f"no error: {result}"
except RuntimeError as e:
    outcome = f"raised: {type(e).__name__}: {e}"
with open(f"{out}.rank{r}", "w") as f:
    f.write(outcome + "\n")
print(f"rank {r}: {outcome}", flush=True)
if case != "late":  # there the ranks are seconds apart: a barrier would time out too
    comm.barrier()
