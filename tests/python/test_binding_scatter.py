"""scatter, scatter_add and index_add against torch: values, gradients, in-place forms, the
refusals (out-of-range indices, bad shapes, scatter's duplicate places), bf16, and CUDA when
there is one.

Tolerances: where an index repeats, loom sums the sources first and adds the sum to the input
once (deterministic on CPU and CUDA); torch adds them one by one into the input, so the two may
differ in the last bits: those cases compare with rtol 1e-6. Without repeats they are the same
additions and compare exactly."""

import numpy as np
import pytest
import torch

import loom


def pair(shape, seed, grad=True):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    t = torch.tensor(x, requires_grad=grad)
    lt = loom.tensor(x)
    if grad:
        lt.requires_grad_(True)
    return t, lt


def index_pair(values):
    a = np.array(values, dtype=np.int64)
    return torch.tensor(a), loom.tensor(a)


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_scatter_add_matches_torch_with_repeats(dim):
    shape = [4, 5, 3]
    ti, li = pair(shape, 1)
    ishape = [3, 4, 2]  # smaller than input off dim, as torch allows
    idx = np.random.default_rng(2).integers(0, shape[dim], size=ishape)  # repeats, surely
    tix, lix = index_pair(idx)
    ts, ls = pair(ishape, 3)
    want = torch.scatter_add(ti, dim, tix, ts)
    got = loom.scatter_add(li, dim, lix, ls)
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-6, atol=1e-6)
    g = np.random.default_rng(4).standard_normal(want.shape).astype(np.float32)
    want.backward(torch.tensor(g))
    got.backward(loom.tensor(g))
    np.testing.assert_array_equal(li.grad.numpy(), ti.grad.numpy())
    np.testing.assert_array_equal(ls.grad.numpy(), ts.grad.numpy())
    # A src larger than index: only index's block is read (values only: torch 1.13's backward
    # rejects this case).
    big = np.random.default_rng(5).standard_normal([3, 5, 3]).astype(np.float32)
    np.testing.assert_allclose(
        loom.scatter_add(li.detach(), dim, lix, loom.tensor(big)).numpy(),
        torch.scatter_add(ti.detach(), dim, tix, torch.tensor(big)).numpy(), rtol=1e-6, atol=1e-6)


def test_scatter_add_without_repeats_is_exact_and_method_forms_work():
    ti, li = pair([3, 4], 5, grad=False)
    tix, lix = index_pair([[3, 0, 1, 2], [1, 2, 3, 0]])
    ts, ls = pair([2, 4], 6, grad=False)
    np.testing.assert_array_equal(li.scatter_add(1, lix, ls).numpy(),
                                  ti.scatter_add(1, tix, ts).numpy())
    out = li.clone()
    assert out.scatter_add_(1, lix, ls) is out
    np.testing.assert_array_equal(out.numpy(), ti.clone().scatter_add_(1, tix, ts).numpy())


@pytest.mark.parametrize("dim", [0, 1])
def test_scatter_matches_torch_values_and_gradients(dim):
    ti, li = pair([4, 4], 7)
    # Each row (dim 1) or column (dim 0) a permutation prefix: no place written twice.
    perm = np.stack([np.random.default_rng(10 + k).permutation(4)[:3] for k in range(4)])
    idx = perm if dim == 1 else perm.T
    tix, lix = index_pair(idx)
    ts, ls = pair(list(idx.shape), 8)
    want = torch.scatter(ti, dim, tix, ts)
    got = loom.scatter(li, dim, lix, ls)
    np.testing.assert_array_equal(got.detach().numpy(), want.detach().numpy())
    g = np.random.default_rng(9).standard_normal([4, 4]).astype(np.float32)
    want.backward(torch.tensor(g))
    got.backward(loom.tensor(g))
    np.testing.assert_array_equal(li.grad.numpy(), ti.grad.numpy())  # zero where written
    np.testing.assert_array_equal(ls.grad.numpy(), ts.grad.numpy())


def test_scatter_a_number_and_the_in_place_form():
    x = np.zeros([3, 5], np.float32)
    idx = np.array([[0, 4], [2, 1], [3, 0]])
    want = torch.tensor(x).scatter(1, torch.tensor(idx), 7.5)
    np.testing.assert_array_equal(loom.tensor(x).scatter(1, loom.tensor(idx), 7.5).numpy(),
                                  want.numpy())
    np.testing.assert_array_equal(loom.scatter(loom.tensor(x), 1, loom.tensor(idx),
                                               value=7.5).numpy(), want.numpy())
    t = loom.tensor(x)
    ts, ls = pair([3, 2], 11, grad=False)
    t.scatter_(1, loom.tensor(idx), ls)
    np.testing.assert_array_equal(t.numpy(), torch.tensor(x).scatter_(1, torch.tensor(idx),
                                                                      ts).numpy())


def test_scatter_refuses_a_place_written_twice():
    with pytest.raises(ValueError, match=r"scatter: 1 place\(s\).*more than one.*scatter_add"):
        loom.scatter(loom.zeros([2, 3]), 1, loom.tensor(np.array([[0, 0], [1, 2]])),
                     loom.ones([2, 2]))
    with pytest.raises(TypeError, match="src .* or value="):
        loom.scatter(loom.zeros([2, 3]), 1, loom.tensor(np.array([[0]])))


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_index_add_matches_torch(dim):
    ti, li = pair([4, 3, 5], 12)
    n = 6
    idx = np.random.default_rng(13).integers(0, [4, 3, 5][dim], size=n)
    tix, lix = index_pair(idx)
    sshape = [4, 3, 5]
    sshape[dim] = n
    ts, ls = pair(sshape, 14)
    want = torch.index_add(ti, dim, tix, ts, alpha=0.5)
    got = loom.index_add(li, dim, lix, ls, alpha=0.5)
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-6, atol=1e-6)
    g = np.random.default_rng(15).standard_normal([4, 3, 5]).astype(np.float32)
    want.backward(torch.tensor(g))
    got.backward(loom.tensor(g))
    np.testing.assert_array_equal(li.grad.numpy(), ti.grad.numpy())
    np.testing.assert_array_equal(ls.grad.numpy(), ts.grad.numpy())
    out = li.detach().clone()
    out.index_add_(dim, lix, ls.detach())
    np.testing.assert_allclose(out.numpy(), ti.detach().index_add(dim, tix, ts.detach()).numpy(),
                               rtol=1e-6, atol=1e-6)


def test_bad_input_is_a_clear_error():
    x = loom.zeros([3, 4])
    with pytest.raises(ValueError, match=r"scatter_add: 1 index value\(s\) outside \[0, 4\)"):
        loom.scatter_add(x, 1, loom.tensor(np.array([[4]])), loom.ones([1, 1]))
    with pytest.raises(ValueError, match="scatter_add: index size 3 exceeds src size 1 in dim 1"):
        loom.scatter_add(x, 1, loom.tensor(np.array([[0, 1, 2]])), loom.ones([1, 1]))
    with pytest.raises(TypeError, match="index must be int64 or int32"):
        loom.scatter_add(x, 1, loom.zeros([1, 1]), loom.ones([1, 1]))
    with pytest.raises(IndexError, match="dim 2 is out of range"):
        loom.scatter_add(x, 2, loom.tensor(np.array([[0]])), loom.ones([1, 1]))
    with pytest.raises(ValueError, match=r"index_add: source is \[2, 4\].*need \[3, 4\]"):
        loom.index_add(x, 0, loom.tensor(np.array([0, 1, 2])), loom.ones([2, 4]))
    with pytest.raises(ValueError, match=r"index_add: 1 index value\(s\) outside \[0, 3\)"):
        loom.index_add(x, 0, loom.tensor(np.array([3])), loom.ones([1, 4]))
    with pytest.raises(ValueError, match="index_add: index must be 1-D"):
        loom.index_add(x, 0, loom.tensor(np.array([[0]])), loom.ones([1, 4]))


def test_bf16_scatter_add_rounds_once():
    x = np.random.default_rng(16).standard_normal([3, 4]).astype(np.float32)
    src = np.random.default_rng(17).standard_normal([3, 4]).astype(np.float32)
    idx = np.array([[0, 1, 2, 0], [1, 1, 1, 1], [2, 0, 0, 2]])
    got = loom.tensor(x).to(loom.bfloat16).scatter_add(0, loom.tensor(idx),
                                                       loom.tensor(src).to(loom.bfloat16))
    assert got.dtype == loom.bfloat16
    # The f32 computation on the bf16-rounded inputs, rounded to bf16 once (Note [Low-precision
    # compute]).
    xb = torch.tensor(x).bfloat16().float()
    sb = torch.tensor(src).bfloat16().float()
    want = torch.zeros(3, 4).scatter_add(0, torch.tensor(idx), sb)
    want = (xb + want).bfloat16().float()
    np.testing.assert_array_equal(got.float().numpy(), want.numpy())


@pytest.mark.skipif(not loom.cuda_is_available(), reason="no CUDA device")
def test_cuda_matches_cpu():
    x = np.random.default_rng(18).standard_normal([6, 7]).astype(np.float32)
    idx = np.random.default_rng(19).integers(0, 6, size=[9, 7])
    src = np.random.default_rng(20).standard_normal([9, 7]).astype(np.float32)
    cpu = loom.scatter_add(loom.tensor(x), 0, loom.tensor(idx), loom.tensor(src))
    gpu = loom.scatter_add(loom.tensor(x).to("cuda"), 0, loom.tensor(idx).to("cuda"),
                           loom.tensor(src).to("cuda"))
    np.testing.assert_allclose(gpu.to("cpu").numpy(), cpu.numpy(), rtol=1e-6, atol=1e-6)
