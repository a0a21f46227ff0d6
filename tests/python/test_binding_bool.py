"""loom.bool against torch.bool: what comparisons return, conversions (not zero, NaN true),
arithmetic and promotion, sums, masks in where / masked_fill / indexing, the logical operators,
numpy and file round trips, and CUDA against CPU when there is a GPU."""

import numpy as np
import pytest
import torch

import loom

rng = np.random.default_rng(5)


def same(lo, to):
    """Same dtype name and values."""
    assert str(lo.dtype).split(".")[1] == str(to.dtype).split(".")[1], (lo.dtype, to.dtype)
    np.testing.assert_array_equal(lo.numpy(), to.numpy())


def test_comparisons_and_conversions_give_bool():
    a = rng.integers(-2, 3, (3, 4)).astype(np.float32)
    a[0, 0] = np.nan
    la, ta = loom.tensor(a), torch.tensor(a)
    same(la > 0, ta > 0)
    same(la == la, ta == ta)  # NaN unequal to itself
    same(la.bool(), ta.bool())  # not zero: NaN is true
    same(la.to(loom.bool), ta.to(torch.bool))
    ints = rng.integers(-2, 3, (3, 4))
    same(loom.tensor(ints).bool(), torch.tensor(ints).bool())
    b = la > 0
    same(b.float(), (ta > 0).float())
    same(b.long(), (ta > 0).long())
    assert loom.tensor([True, False]).dtype is loom.bool
    assert (la > 0)[1, 1].item() is bool((ta > 0)[1, 1].item())
    assert bool(loom.tensor(True)) is True and bool(loom.tensor([False])) is False
    assert loom.bool.itemsize == 1 and not loom.bool.is_floating_point
    assert repr(loom.bool) == "loom.bool"


def test_arithmetic_sums_and_promotion_follow_torch():
    x = rng.integers(0, 2, (4, 5)).astype(bool)
    y = rng.integers(0, 2, (4, 5)).astype(bool)
    lx, ly, tx, ty = loom.tensor(x), loom.tensor(y), torch.tensor(x), torch.tensor(y)
    same(lx + ly, tx + ty)  # or
    same(lx * ly, tx * ty)  # and
    same(lx.sum(), tx.sum())  # an int64 count
    same(lx.sum(1), tx.sum(1))
    same(lx + 2, tx + 2)  # int64
    same(lx * 3, tx * 3)
    same(lx * 0.5, tx * 0.5)  # float32
    n = rng.integers(-5, 5, (4, 5)).astype(np.int32)
    same(lx + loom.tensor(n), tx + torch.tensor(n))  # int32
    f = rng.standard_normal((4, 5)).astype(np.float32)
    same(lx * loom.tensor(f), tx * torch.tensor(f))
    same(loom.where(lx, ly, lx), torch.where(tx, ty, tx))  # bool picks stay bool
    same(lx == 1, tx == 1)
    same(lx == True, tx == True)  # noqa: E712 (a tensor comparison, not a truth test)
    with pytest.raises(ValueError, match="sub of two bool tensors"):
        lx - ly
    with pytest.raises(RuntimeError):  # torch refuses it too
        tx - ty


def test_masks_select_fill_and_index():
    v = rng.standard_normal((3, 4)).astype(np.float32)
    lv, tv = loom.tensor(v), torch.tensor(v)
    lm, tm = lv > 0, tv > 0
    same(lv[lm], tv[tm])
    same(lv.masked_fill(lm, -1.0), tv.masked_fill(tm, -1.0))
    same(loom.where(lm, lv, 0.0), torch.where(tm, tv, torch.tensor(0.0)))
    same(~lm, ~tm)
    same(lm & (lv < 1), tm & (tv < 1))
    same(lm | (lv < -1), tm | (tv < -1))
    same(lm ^ (lv < 1), tm ^ (tv < 1))
    same(lm.any(), tm.any())
    same(lm.all(1), tm.all(1))
    # A uint8 mask still selects (nonzero), and converts to bool with .bool().
    u = (v > 0).astype(np.uint8)
    np.testing.assert_array_equal(lv[loom.tensor(u)].numpy(), tv[tm].numpy())
    same(loom.tensor(u).bool(), torch.tensor(u).bool())


def test_numpy_and_file_round_trips(tmp_path):
    m = rng.integers(0, 2, (2, 3)).astype(bool)
    t = loom.from_numpy(m)
    assert t.dtype is loom.bool
    assert np.asarray(t).dtype == np.bool_ and np.shares_memory(np.asarray(t), m)
    path = str(tmp_path / "mask.safetensors")
    loom.save({"mask": t, "x": loom.ones(2)}, path)
    back = loom.load(path)
    assert back["mask"].dtype is loom.bool
    np.testing.assert_array_equal(back["mask"].numpy(), m)
    # A byte that is not 0 or 1 is no bool: the file is refused, naming the tensor.
    raw = bytearray(open(path, "rb").read())
    n = int.from_bytes(raw[:8], "little")
    import json
    header = json.loads(raw[8:8 + n])
    begin = 8 + n + header["mask"]["data_offsets"][0]
    raw[begin] = 7
    open(path, "wb").write(bytes(raw))
    with pytest.raises(ValueError, match="bool tensor 'mask' holds the byte 7"):
        loom.load(path)


@pytest.mark.skipif(not loom.cuda_is_available(), reason="no CUDA device")
def test_cuda_matches_cpu():
    v = rng.standard_normal(1000).astype(np.float32)
    v[::7] = 0.0
    cpu = loom.tensor(v)
    gpu = cpu.to("cuda")
    np.testing.assert_array_equal((gpu > 0).to("cpu").numpy(), (cpu > 0).numpy())
    np.testing.assert_array_equal(gpu.bool().to("cpu").numpy(), cpu.bool().numpy())
    assert (gpu > 0).sum().item() == (cpu > 0).sum().item()
    np.testing.assert_array_equal(gpu.masked_fill(gpu > 0, 1.0).to("cpu").numpy(),
                                  cpu.masked_fill(cpu > 0, 1.0).numpy())
