"""loom.distributed under mpirun (ctest python_binding_mpi, `mpirun -np N`): every collective on
rank-derived inputs against its closed form. Each rank counts its wrong elements, the counts are
summed over ranks, and every rank exits 1 when the total is not zero (so no rank passes while
another fails). Exits 77 (skip) without numpy or the module, or when not launched by mpirun.
"""

import sys

try:
    import numpy as np

    import loom
    import loom.distributed as dist
except ImportError as e:  # the module is not built, or numpy is missing
    print(f"skipped: {e}")
    sys.exit(77)

if not dist.launched_by_mpi():
    print("skipped: not launched by mpirun")
    sys.exit(77)

N = 5  # elements per rank


def count_wrong(name, got, want):
    got, want = np.asarray(got), np.asarray(want)
    wrong = int(np.sum(~np.isclose(got, want, rtol=1e-6, atol=0)))
    if wrong:
        print(f"rank {comm.rank}: {name}: {wrong} wrong of {want.size}: got {got}, want {want}",
              file=sys.stderr)
    return wrong


comm = dist.init_process_group()
r, p = comm.rank, comm.size
wrong = 0
if comm.backend not in ("mpi", "mpi+nccl") or p < 2:
    print(f"rank {r}: expected an MPI world of >= 2 ranks, got {comm}", file=sys.stderr)
    wrong += 1

i = np.arange(N, dtype=np.float32)
ranks = np.arange(p, dtype=np.float32)


def x(rank):  # rank's input: rank * 100 + i
    return rank * 100.0 + i


# allreduce: sum, avg, max, min, in place and into out=.
for op, want in (("sum", (ranks[:, None] * 100 + i).sum(0)),
                 ("avg", (ranks[:, None] * 100 + i).mean(0)),
                 ("max", x(p - 1)), ("min", x(0))):
    t = loom.tensor(x(r))
    comm.allreduce(t, op=op)
    wrong += count_wrong(f"allreduce {op}", t, want)
out = loom.zeros(N)
src = loom.tensor(x(r))
comm.allreduce(src, op=dist.ReduceOp.MAX, out=out)
wrong += count_wrong("allreduce out=", out, x(p - 1))
wrong += count_wrong("allreduce out= leaves input", src, x(r))

# broadcast from every root, async.
for root in range(p):
    t = loom.tensor(x(r))
    comm.broadcast(t, src=root, async_op=True).wait()
    wrong += count_wrong(f"broadcast src={root}", t, x(root))

# allgather: chunk k from rank k; through the torch-style function too.
g = loom.zeros(p * N)
comm.allgather(loom.tensor(x(r)), g)
wrong += count_wrong("allgather", g, np.concatenate([x(k) for k in range(p)]))
g = loom.zeros(p * N)
dist.all_gather_into_tensor(g, loom.tensor(x(r)))
wrong += count_wrong("all_gather_into_tensor", g, np.concatenate([x(k) for k in range(p)]))

# reduce_scatter: input element j on rank k is k*100 + j; rank r gets chunk r of the sum.
j = np.arange(p * N, dtype=np.float32)
o = loom.zeros(N)
comm.reduce_scatter(loom.tensor(r * 100.0 + j), o)
wrong += count_wrong("reduce_scatter", o, (ranks.sum() * 100 + p * j)[r * N:(r + 1) * N])

# split: even and odd ranks; a sum over the sub-group.
sub = comm.split(r % 2, r, "parity")
t = loom.tensor(x(r))
sub.allreduce(t)
members = ranks[ranks % 2 == r % 2]
wrong += count_wrong("split allreduce", t, (members[:, None] * 100 + i).sum(0))
if sub.size != len(members) or sub.name != "parity":
    print(f"rank {r}: split: {sub}", file=sys.stderr)
    wrong += 1

# Signature checks (comm.debug, on unless LOOM_COMM_DEBUG=0): two same-sized allreduces made in swapped
# order raise a CommError on every rank naming both lines of this script; the group stays usable.
if p > 1:
    comm.debug = True
    a, b = loom.ones(4), loom.ones(4)
    try:
        if r == 0:
            comm.allreduce(a)  # line A
            comm.allreduce(b)  # line B
        else:
            comm.allreduce(b)  # line B
            comm.allreduce(a)  # line A
        print(f"rank {r}: swapped allreduces raised nothing", file=sys.stderr)
        wrong += 1
    except RuntimeError as e:
        lines = [n for n, text in enumerate(open(__file__).read().splitlines(), 1)
                 if "comm.allreduce(a)  # line A" in text or "comm.allreduce(b)  # line B" in text]
        # The first calls: rank 0's line A and the others' line B.
        want = ["disagree on collective"] + [f"mpi_binding_check.py:{n}" for n in (lines[0], lines[2])]
        if any(w not in str(e) for w in want):
            print(f"rank {r}: the error lacks {want}: {e}", file=sys.stderr)
            wrong += 1
    comm.debug = False

# Two-level collectives (Communicator.set_algorithm): consecutive pairs of ranks as nodes when
# there are 4 ranks or more (the levels apply), else one node (stays flat); sums as the closed
# form either way.
levels = comm.split(0, r, "levels")
pairs = p >= 4 and p % 2 == 0
levels.set_algorithm("hier", [k // 2 for k in range(p)] if pairs else [0] * p)
expected = "hier over" if pairs else "one node"
if expected not in levels.algorithm:
    print(f"rank {r}: algorithm {levels.algorithm!r} lacks {expected!r}", file=sys.stderr)
    wrong += 1
t = loom.tensor(x(r))
levels.allreduce(t)
wrong += count_wrong("allreduce over two levels", t, (ranks[:, None] * 100 + i).sum(0))
try:
    levels.set_algorithm("ring")
    print(f"rank {r}: set_algorithm('ring') raised nothing", file=sys.stderr)
    wrong += 1
except (RuntimeError, ValueError) as e:
    if "expected 'flat', 'hier' or 'auto'" not in str(e):
        print(f"rank {r}: unexpected error {e}", file=sys.stderr)
        wrong += 1

comm.barrier()

total = loom.tensor([float(wrong)])
comm.allreduce(total)
if total.item() != 0:
    print(f"rank {r}: {int(total.item())} wrong elements over all ranks", file=sys.stderr)
    sys.exit(1)
print(f"rank {r} of {p}: every collective matches its closed form")
