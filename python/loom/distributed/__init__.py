"""loom.distributed: the communicator (collectives/communicator.h) on loom tensors.

Under ``mpirun`` the world is MPI's; without it, a world of one process (every collective is then
the identity, so a script runs unchanged on one process)::

    import loom, loom.distributed as dist

    comm = dist.world()                      # or dist.init_process_group()
    t = loom.full([4], float(comm.rank))
    comm.allreduce(t, op="sum")              # in place, waits; t == 0 + 1 + ... + (size - 1)
    work = comm.broadcast(t, src=0, async_op=True)
    work.wait()                              # GIL released while waiting
    tp = comm.split(color=comm.rank // 2, key=comm.rank, name="tp")

Run a script on N ranks with ``mpirun -np N python3 script.py``. The Communicator's methods keep
c10d ProcessGroup's names and loom's argument order (input, then output); the module-level
functions below are torch.distributed's (all_reduce, all_gather_into_tensor with output first,
...) over the world or a ``group=`` communicator.
"""

from loom._loom.distributed import (  # noqa: F401
    Communicator,
    ReduceOp,
    Work,
    launched_by_mpi,
    world,
)

__all__ = [
    "Communicator", "ReduceOp", "Work", "world", "launched_by_mpi", "init_process_group",
    "is_initialized", "get_rank", "get_world_size", "get_backend", "all_reduce", "broadcast",
    "all_gather_into_tensor", "reduce_scatter_tensor", "reduce", "barrier", "send", "recv",
    "new_group",
]

_initialized = False


def init_process_group(backend="auto"):
    """Creates the world (torch's name); returns it. backend: 'auto', 'self', 'mpi', 'nccl'."""
    global _initialized
    comm = world(backend)
    _initialized = True
    return comm


def is_initialized():
    return _initialized


def _group(group):
    return world() if group is None else group


def get_rank(group=None):
    return _group(group).rank


def get_world_size(group=None):
    return _group(group).size


def get_backend(group=None):
    return _group(group).backend


def all_reduce(tensor, op="sum", group=None, async_op=False):
    return _group(group).allreduce(tensor, op=op, async_op=async_op)


def broadcast(tensor, src=0, group=None, async_op=False):
    return _group(group).broadcast(tensor, src=src, async_op=async_op)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    return _group(group).allgather(input_tensor, output_tensor, async_op=async_op)


def reduce_scatter_tensor(output, input, op="sum", group=None, async_op=False):
    return _group(group).reduce_scatter(input, output, op=op, async_op=async_op)


def reduce(tensor, dst=0, op="sum", group=None, async_op=False):
    """In place on dst (torch's semantics): dst's tensor becomes op over ranks."""
    return _group(group).reduce(tensor, tensor, dst=dst, op=op, async_op=async_op)


def barrier(group=None, async_op=False):
    return _group(group).barrier(async_op=async_op)


def send(tensor, dst, group=None, tag=0):
    return _group(group).send(tensor, dst, tag=tag)


def recv(tensor, src, group=None, tag=0):
    return _group(group).recv(tensor, src, tag=tag)


def new_group(color, key=None, name="group", group=None):
    """A sub-group by color (loom's split; every rank of `group` must call it)."""
    g = _group(group)
    return g.split(color, g.rank if key is None else key, name)
