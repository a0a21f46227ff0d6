"""benchmarks/peer_blas.py names the BLAS PyTorch's GEMMs run on, as the dynamic linker resolves
libblas.so.3 (Debian's alternatives), and the loom-vs-PyTorch benchmarks refuse a ratio exactly
when it is the reference one."""

import os
import sys

import pytest

pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "benchmarks"))
import peer_blas  # noqa: E402

LIBBLAS = "/usr/lib/x86_64-linux-gnu/libblas.so.3"


@pytest.mark.skipif(not os.path.exists(LIBBLAS), reason=f"{LIBBLAS} not present (not Debian x86-64)")
def test_the_blas_named_is_the_one_libblas_so_3_resolves_to():
    kind, detail = peer_blas.describe()
    if kind == "mkl":
        pytest.skip("this torch has MKL built in")
    target = os.path.realpath(LIBBLAS)
    assert target in detail
    assert kind == ("openblas" if "openblas" in target else "reference")
    assert (peer_blas.refusal() is None) == peer_blas.optimized()
    if kind == "reference":
        assert "install libopenblas0-pthread" in peer_blas.refusal()
    assert "torch.get_num_threads() = 3" in peer_blas.blas_line(3)
