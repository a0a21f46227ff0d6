"""numpy <-> loom: shapes, dtypes, strides, and which paths share memory (Note [numpy interop] in
python/src/tensor.cpp)."""

import numpy as np
import pytest

import loom

DTYPES = [(np.float32, loom.float32), (np.float16, loom.float16), (np.int32, loom.int32),
          (np.int64, loom.int64), (np.uint8, loom.uint8), (np.bool_, loom.bool)]


@pytest.mark.parametrize("np_dtype,loom_dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (5,), (2, 3), (2, 0, 4), (2, 3, 4)])
def test_round_trips_keep_shape_dtype_and_values(np_dtype, loom_dtype, shape):
    a = (np.arange(int(np.prod(shape))) % 7).astype(np_dtype).reshape(shape)
    for t in (loom.tensor(a), loom.from_numpy(a)):
        assert t.shape == shape and t.ndim == len(shape) and t.numel() == a.size
        assert t.dtype is loom_dtype and t.device == "cpu"
        back = np.asarray(t)
        assert back.dtype == np_dtype and back.shape == shape
        np.testing.assert_array_equal(back, a)
        np.testing.assert_array_equal(t.numpy(), a)


def test_from_numpy_and_asarray_share_memory_both_ways():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = loom.from_numpy(a)
    back = np.asarray(t)
    assert np.shares_memory(back, a)
    a[0, 1] = 100.0  # numpy writes, loom sees
    assert t.tolist()[0][1] == 100.0
    back[1, 2] = -5.0  # a write through the exported buffer reaches the original
    assert a[1, 2] == -5.0
    with loom.no_grad():
        t += 1.0  # loom writes in place, numpy sees
    assert a[0, 0] == 1.0


def test_loom_memory_to_numpy_is_zero_copy_and_keeps_the_tensor_alive():
    t = loom.tensor([[1.0, 2.0], [3.0, 4.0]])
    n = t.numpy()
    assert n.ctypes.data == t.data_ptr()
    assert np.shares_memory(n, np.asarray(t))
    del t  # the array's buffer keeps the tensor's storage alive
    np.testing.assert_array_equal(n, [[1.0, 2.0], [3.0, 4.0]])


def test_tensor_copies():
    a = np.ones(3, dtype=np.float32)
    t = loom.tensor(a)
    assert not np.shares_memory(np.asarray(t), a)
    a[0] = 7
    assert t.tolist() == [1.0, 1.0, 1.0]


def test_transposed_and_sliced_views_keep_strides():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = loom.from_numpy(a.transpose(2, 0, 1))
    assert t.shape == (4, 2, 3) and t.stride() == (1, 12, 4) and not t.is_contiguous()
    np.testing.assert_array_equal(np.asarray(t), a.transpose(2, 0, 1))
    s = loom.from_numpy(a[:, 1:, ::2])
    assert s.stride() == (12, 4, 2)
    np.testing.assert_array_equal(s.contiguous().numpy(), a[:, 1:, ::2])
    # loom views export their strides: a loom transpose is a numpy view of the same memory.
    base = loom.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    view = np.asarray(base.transpose(0, 1))
    assert view.strides == (4, 12)
    assert np.shares_memory(view, np.asarray(base))
    np.testing.assert_array_equal(view, np.arange(6).reshape(2, 3).T)
    narrow = np.asarray(base.narrow(1, 1, 2))
    np.testing.assert_array_equal(narrow, [[1, 2], [4, 5]])
    assert np.shares_memory(narrow, np.asarray(base))


def test_conversions_from_python_data():
    assert loom.tensor([1.5, 2]).dtype is loom.float32  # Python floats: float32 (no float64)
    assert loom.tensor(np.zeros(2)).dtype is loom.float32  # numpy float64 too
    assert loom.tensor([1, 2]).dtype is loom.int64
    assert loom.tensor([True, False]).dtype is loom.bool
    assert loom.tensor(3.0).shape == () and loom.tensor(3.0).item() == 3.0
    assert loom.tensor([[1, 2], [3, 4]], dtype=loom.float32).dtype is loom.float32
    assert loom.tensor(np.arange(5)[::-1]).tolist() == [4, 3, 2, 1, 0]  # reversed: copied
    t = loom.tensor([1.0, 2.0], dtype=loom.bfloat16, requires_grad=True)
    assert t.requires_grad and t.is_leaf and t.dtype is loom.bfloat16
    assert loom.tensor(t).requires_grad is False  # a copy, detached


def test_bfloat16_to_numpy_is_a_clear_error_and_float16_works():
    b = loom.tensor([1.0, 2.5]).to(loom.bfloat16)
    with pytest.raises(TypeError, match=r"numpy has no bfloat16.*t\.to\(loom\.float32\)"):
        np.asarray(b)
    with pytest.raises(TypeError, match="bfloat16"):
        b.numpy()
    np.testing.assert_array_equal(b.to(loom.float32).numpy(), [1.0, 2.5])
    assert b.tolist() == [1.0, 2.5]
    h = np.asarray(loom.tensor([1.0, 2.5]).to(loom.float16))
    assert h.dtype == np.float16 and h.tolist() == [1.0, 2.5]


def test_grad_requiring_tensor_to_numpy_follows_pytorch():
    w = loom.tensor([1.0], requires_grad=True)
    with pytest.raises(RuntimeError, match=r"detach\(\)\.numpy\(\)"):
        w.numpy()
    assert w.detach().numpy().tolist() == [1.0]


def test_from_numpy_rejects_what_it_cannot_share():
    with pytest.raises(ValueError, match="float64 has no loom dtype"):
        loom.from_numpy(np.zeros(3))
    ro = np.zeros(3, dtype=np.float32)
    ro.setflags(write=False)
    with pytest.raises(ValueError, match="read-only"):
        loom.from_numpy(ro)
    with pytest.raises(ValueError, match="negative"):
        loom.from_numpy(np.zeros(3, dtype=np.float32)[::-1])
    with pytest.raises(TypeError, match="numpy.ndarray"):
        loom.from_numpy([1.0, 2.0])


def test_external_memory_is_not_counted_by_loom():
    a = np.zeros(1 << 16, dtype=np.float32)
    before = loom.memory_allocated()
    t = loom.from_numpy(a)
    assert loom.memory_allocated() == before
    c = t.clone()  # loom's own copy is counted
    assert loom.memory_allocated() == before + a.nbytes
    del c, t
    assert loom.memory_allocated() == before


def test_properties_and_repr():
    t = loom.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert len(t) == 2 and t.size() == (2, 3) and t.size(-1) == 3 and t.dim() == 2
    assert repr(t) == "tensor([[0., 1., 2.],\n        [3., 4., 5.]])"
    assert repr(loom.float32) == "loom.float32" and loom.float32.itemsize == 4
    assert loom.tensor([1, 2]).__repr__() == "tensor([1, 2])"
    w = loom.tensor([1.0], requires_grad=True)
    assert repr(w) == "tensor([1.], requires_grad=True)"
    assert "grad_fn=<scale>" in repr(w * 2.0)
    assert repr(loom.zeros(0, 3)) == "tensor([], size=(0, 3))"
    assert "dtype=loom.bfloat16" in repr(loom.ones(2, dtype=loom.bfloat16))
    with pytest.raises(TypeError, match="0-d"):
        len(loom.tensor(1.0))
    assert isinstance(loom.tensor(2).item(), int) and isinstance(loom.tensor(2.0).item(), float)
    assert loom.tensor([[1, 2]]).tolist() == [[1, 2]]
    assert loom.arange(3).tolist() == [0, 1, 2] and loom.arange(3).dtype is loom.int64
    assert loom.full((2,), 3.5).tolist() == [3.5, 3.5]
    assert t.to(loom.float16).dtype is loom.float16 and t.to("cpu") is not None
    assert t.to(device="cpu", dtype=loom.bfloat16).dtype is loom.bfloat16


def test_python_scalar_conversions_follow_pytorch():
    # float/int/bool/index of a one-element tensor, of any shape holding one element.
    assert float(loom.tensor([1.5])) == 1.5 and isinstance(float(loom.tensor(2)), float)
    assert int(loom.tensor([[-2.7]])) == -2 and int(loom.tensor(7)) == 7  # truncates, as int()
    big = 2**53 + 1
    assert int(loom.tensor([big], dtype=loom.int64)) == big  # exact beyond a double's 53 bits
    assert bool(loom.tensor([0.0])) is False and bool(loom.tensor(3)) is True
    assert [10, 20, 30][loom.tensor(1)] == 20 and list(range(loom.tensor([3]))) == [0, 1, 2]
    # Anything else is a clear error naming the shape (before: float() parsed the buffer's bytes).
    for convert in (float, int):
        with pytest.raises(ValueError, match=r"one-element tensor.*shape \[2\] \(2 elements\)"):
            convert(loom.ones(2))
    with pytest.raises(ValueError, match=r"truth value of a tensor of shape \[0\]"):
        bool(loom.ones(0))
    with pytest.raises(ValueError, match="ambiguous"):
        bool(loom.ones(2, 2))
    with pytest.raises(TypeError, match="integer tensor of one element"):
        [1, 2][loom.tensor(1.0)]
