"""Reference counts and memory stay bounded: a from_numpy tensor lets its array go when it dies
(also when autograd's saved copy is the last user, freed during a GIL-free backward), and many
small steps of ops + backward do not grow Python's or the process's memory."""

import gc
import sys
import tracemalloc

import numpy as np

import loom
import loom.nn.functional as F


def test_from_numpy_releases_the_array():
    a = np.ones((4, 3), dtype=np.float32)
    start = sys.getrefcount(a)
    t = loom.from_numpy(a)
    views = [t.transpose(0, 1), t.narrow(0, 1, 2), t.detach()]
    assert sys.getrefcount(a) == start + 1  # one reference, shared by every view
    del t, views
    gc.collect()
    assert sys.getrefcount(a) == start


def test_array_saved_for_backward_is_released_by_backward():
    a = np.ones((8, 8), dtype=np.float32)
    start = sys.getrefcount(a)
    x = loom.from_numpy(a)
    w = loom.ones(8, 8, requires_grad=True)
    loss = (x * w).sum()  # mul saves x (sharing a's memory) for w's gradient
    del x
    assert sys.getrefcount(a) == start + 1
    loss.backward()  # frees the graph with the GIL released; the owner takes it to let go
    del loss
    gc.collect()
    assert sys.getrefcount(a) == start
    np.testing.assert_array_equal(w.grad.numpy(), a)


def test_numpy_views_of_a_tensor_release_it():
    t = loom.ones(16)
    start = sys.getrefcount(t)
    arrays = [np.asarray(t), t.numpy(), memoryview(t)]
    del arrays
    gc.collect()
    assert sys.getrefcount(t) == start


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_many_small_steps_do_not_grow_memory():
    rng = np.random.default_rng(0)
    data = rng.standard_normal((8, 16)).astype(np.float32)
    w = loom.tensor(rng.standard_normal((16, 16)) * 0.1, requires_grad=True)
    targets = loom.tensor(np.arange(8) % 16)

    def step():
        x = loom.from_numpy(data)
        h = F.gelu(F.layer_norm(x @ w, (16,)))
        loss = F.cross_entropy(h, targets) + (h * 0.5).mean()
        w.grad = None
        loss.backward()
        with loom.no_grad():
            w.sub_(w.grad, alpha=0.01)
        return np.asarray(w.detach()).sum() + loss.item()

    for _ in range(100):  # warm up: allocator pools, lazily created Python objects
        step()
    gc.collect()
    tracemalloc.start()
    base_traced = tracemalloc.get_traced_memory()[0]
    base_rss, base_loom = rss_bytes(), loom.memory_allocated()
    for _ in range(1000):
        step()
    gc.collect()
    grown_traced = tracemalloc.get_traced_memory()[0] - base_traced
    tracemalloc.stop()
    grown_rss = rss_bytes() - base_rss
    # Bounds far below what one leaked tensor or array per step would add (>= 0.5 KiB * 1000).
    assert grown_traced < 64 * 1024, grown_traced
    assert loom.memory_allocated() == base_loom
    assert grown_rss < 4 * 1024 * 1024, grown_rss
