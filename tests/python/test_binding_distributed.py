"""loom.distributed in a world of one (no mpirun): the world's identity, every collective's
single-rank result (the identity, or a copy), async Work, split, argument errors; and weight I/O
(loom.save / loom.load round trips, bad files raise ValueError naming the file). The multi-rank
checks are tests/python/mpi_binding_check.py (ctest python_binding_mpi)."""

import numpy as np
import pytest

import loom
import loom.distributed as dist


@pytest.fixture(scope="module")
def comm():
    if dist.launched_by_mpi():
        pytest.skip("these tests expect a world of one (run them without mpirun)")
    return dist.init_process_group()


def test_world_of_one(comm):
    assert (comm.rank, comm.size, comm.name) == (0, 1, "world")
    assert comm.backend in ("self", "mpi")
    assert dist.world() is comm
    assert (dist.get_rank(), dist.get_world_size(), dist.is_initialized()) == (0, 1, True)
    assert "rank 0 of 1" in repr(comm)


@pytest.mark.parametrize("op", ["sum", "avg", "max", "min", dist.ReduceOp.SUM, "MAX"])
def test_allreduce_is_identity(comm, op):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = loom.tensor(x)
    assert comm.allreduce(t, op=op) is None  # async_op=False waits and returns nothing
    np.testing.assert_array_equal(np.asarray(t), x)
    out = loom.zeros(2, 3)
    comm.allreduce(t, op=op, out=out)
    np.testing.assert_array_equal(np.asarray(out), x)


def test_async_work(comm):
    t = loom.tensor([1.0, 2.0])
    work = comm.allreduce(t, async_op=True)
    assert isinstance(work, dist.Work)
    work.wait()
    work.wait()  # idempotent
    assert work.is_completed()
    dist.barrier()
    comm.barrier(async_op=True).wait()


def test_broadcast_allgather_reduce_scatter(comm):
    t = loom.tensor([3.0, 4.0])
    dist.broadcast(t, src=0)
    np.testing.assert_array_equal(np.asarray(t), [3.0, 4.0])
    out = loom.zeros(2)
    dist.all_gather_into_tensor(out, loom.tensor([5.0, 6.0]))
    np.testing.assert_array_equal(np.asarray(out), [5.0, 6.0])
    out = loom.zeros(2)
    dist.reduce_scatter_tensor(out, loom.tensor([7.0, 8.0]))
    np.testing.assert_array_equal(np.asarray(out), [7.0, 8.0])
    i = loom.tensor(np.arange(3, dtype=np.int32))
    comm.allreduce(i, op="max")
    assert np.asarray(i).tolist() == [0, 1, 2]


def test_split(comm):
    sub = comm.split(color=0, key=0, name="tp")
    assert (sub.rank, sub.size, sub.name) == (0, 1, "tp")
    t = loom.tensor([1.0])
    sub.allreduce(t)
    assert t.item() == 1.0
    assert dist.new_group(0, name="g").name == "g"


def test_counters(comm):
    before = comm.op_count("allreduce")
    comm.allreduce(loom.zeros(4))
    assert comm.op_count("allreduce") == before + 1
    assert comm.sequence_number > 0


def test_errors(comm):
    with pytest.raises(ValueError, match="op must be 'sum', 'avg', 'max' or 'min', got 'prod'"):
        comm.allreduce(loom.zeros(2), op="prod")
    with pytest.raises(ValueError, match="broadcast"):
        comm.broadcast(loom.zeros(2), src=3)
    with pytest.raises(ValueError, match="allgather"):
        comm.allgather(loom.zeros(2), loom.zeros(3))
    with pytest.raises(ValueError, match="world: unknown backend 'gloo'"):
        dist.world("gloo")


# Weight I/O.

def test_save_load_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {
        "wte.weight": loom.tensor(rng.standard_normal((4, 3)).astype(np.float32)),
        "h.0.bias": loom.tensor(rng.standard_normal(3).astype(np.float32)),
        "steps": loom.tensor(np.array([1, 2, 3], dtype=np.int64)),
        "half": loom.tensor(np.ones((2, 2), dtype=np.float32)).to(loom.bfloat16),
        "strided": loom.tensor(np.arange(6, dtype=np.float32).reshape(2, 3)).transpose(0, 1),
    }
    path = tmp_path / "w.safetensors"
    loom.save(tensors, str(path), metadata={"note": "test"})
    back = loom.load(str(path))
    assert sorted(back) == sorted(tensors)
    for name, t in tensors.items():
        assert back[name].dtype is t.dtype and tuple(back[name].shape) == tuple(t.shape), name
        np.testing.assert_array_equal(np.asarray(back[name].to(loom.float32)),
                                      np.asarray(t.to(loom.float32)), err_msg=name)


def test_load_llmc_bin(tmp_path):
    # An llm.c model file: header of 256 int32, then f32 arrays (core/io/llmc_checkpoint.h).
    maxT, V, L, H, C, Vp = 4, 5, 1, 1, 2, 8
    header = np.zeros(256, dtype=np.int32)
    header[:8] = [20240326, 3, maxT, V, L, H, C, Vp]
    sizes = [Vp * C, maxT * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C, L * C,
             L * C, L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C]
    body = np.arange(sum(sizes), dtype=np.float32)
    path = tmp_path / "model.bin"
    path.write_bytes(header.tobytes() + body.tobytes())
    params = loom.load(str(path))
    assert tuple(params["wte.weight"].shape) == (Vp, C)
    np.testing.assert_array_equal(np.asarray(params["wte.weight"]).ravel()[:V * C],
                                  body[:V * C])
    assert len(params) == 4 + 12 * L


def test_io_errors(tmp_path):
    missing = tmp_path / "missing.safetensors"
    with pytest.raises(ValueError, match=str(missing)):
        loom.load(str(missing))
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"not a weight file" * 10)
    with pytest.raises(ValueError, match=f"{bad} is neither an llm.c model file"):
        loom.load(str(bad))
    with pytest.raises(ValueError, match="writes .safetensors only"):
        loom.save({"a": loom.zeros(1)}, str(tmp_path / "a.bin"))
