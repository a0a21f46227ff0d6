"""loom::Error arrives as ValueError with loom's message; misuse of the Python API raises the
exceptions PyTorch users expect."""

import pytest

import loom
import loom.nn.functional as F


def test_loom_errors_are_value_errors_with_the_message():
    a, b = loom.zeros(2, 3), loom.zeros(4, 5)
    with pytest.raises(ValueError) as info:
        a @ b
    message = str(info.value)
    # The whole C++ message: rank, op, argument, expected vs actual, file:line.
    assert message.startswith("[rank 0] matmul: inner dims differ: a is [2, 3]"), message
    assert message.endswith(")") and "matmul.cpp:" in message
    with pytest.raises(ValueError, match=r"add: shapes \[2, 3\] and \[4, 5\] do not broadcast"):
        a + b
    with pytest.raises(ValueError, match="narrow: range"):
        a.narrow(1, 2, 5)
    with pytest.raises(ValueError, match="reshape"):
        a.reshape(4, 2)
    with pytest.raises(ValueError, match=r"index 7 .* is outside \[0, 4\)"):
        F.embedding(loom.tensor([0, 7]), loom.zeros(4, 3))
    with pytest.raises(ValueError, match="cross_entropy"):
        F.cross_entropy(loom.zeros(2, 3), loom.tensor([0.0, 1.0]))


def test_bad_arguments_from_python():
    with pytest.raises(ValueError, match="unknown dtype 'float64'"):
        loom.zeros(2, dtype="float64")
    with pytest.raises(ValueError, match="cannot parse 'gpu'"):
        loom.zeros(2).to("gpu")
    with pytest.raises(TypeError):
        loom.Tensor()  # made by loom.tensor & co, not constructed directly
    with pytest.raises(TypeError):
        loom.zeros(2) @ "x"


def test_shapes_that_overflow_are_errors_not_small_tensors():
    # 2**62 + 1 rows of 4 elements overflow an int64 element count; the tensor used to be
    # allocated with 16 bytes under that shape, and a narrow view read and wrote out of bounds.
    with pytest.raises(ValueError, match="more elements than an int64 counts"):
        loom.zeros(2**62 + 1, 4)
    # A size past int64 itself, or not an integer, is named (it was pybind11's "Unable to cast").
    with pytest.raises(ValueError, match=r"size 0 of a shape \(9223372036854775808\) does not fit"):
        loom.zeros(2**63)
    with pytest.raises(ValueError, match=r"size 1 of a shape .* does not fit in an int64"):
        loom.ones((2, -2**70))
    with pytest.raises(TypeError, match="size 1 of a shape must be an integer, got 2.5"):
        loom.zeros(3, 2.5)
    np = pytest.importorskip("numpy")
    assert loom.zeros(np.int64(2), np.int32(3)).shape == (2, 3)  # integers of any kind
    with pytest.raises(ValueError, match="more bytes than an int64 counts"):
        loom.zeros(2**61)
    assert loom.zeros(0, 2**62, 2**62).numel() == 0


def test_an_optimizer_without_parameters_is_an_error():
    with pytest.raises(ValueError, match="SGD: got an empty parameter list"):
        loom.optim.SGD([], lr=0.1)
    used = loom.nn.Linear(2, 2).parameters()
    list(used)
    with pytest.raises(ValueError, match="AdamW: got an empty parameter list"):
        loom.optim.AdamW(used, lr=0.1)


def test_cuda_without_a_gpu_is_a_clear_error():
    if loom.cuda_is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ValueError, match="cuda:0"):
        loom.zeros(2).to("cuda:0")
