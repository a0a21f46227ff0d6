"""Which BLAS PyTorch's GEMMs run on, for the loom-vs-PyTorch benchmarks: a peer compared at its
best (DESIGN.md), never on the reference BLAS.

Debian's python3-torch is built with BLAS_INFO=generic: it calls whatever libblas.so.3 the
alternatives system points to. With only Debian's reference BLAS installed that is a textbook
triple loop (about 2.5 GFLOP/s on the development VM), and a GPT step is 6-7x slower than on
OpenBLAS, so a ratio against it would flatter loom. scripts/install-deps.sh installs
libopenblas0-pthread, which takes over libblas.so.3. Each benchmark prints blas_line() and
reports a ratio only when optimized() is true.
"""

import ctypes
import os

import torch


def _loaded_blas():
    """The real paths of the BLAS libraries this process has loaded (after one GEMM)."""
    a = torch.ones(4, 4)
    torch.mm(a, a)  # loads the BLAS if it is loaded lazily
    found = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and "blas" in parts[-1].lower():
                found.add(os.path.realpath(parts[-1]))
    return sorted(found)


def describe():
    """(kind, detail): kind is "mkl", "openblas", "reference" or "unknown"."""
    config = torch.__config__.show()
    if "BLAS_INFO=mkl" in config or "USE_MKL=ON" in config:
        return "mkl", "MKL (built into torch)"
    libs = _loaded_blas()
    if any("openblas" in p.lower() for p in libs):
        return "openblas", ", ".join(libs)
    if any("/blas/libblas" in p or p.endswith("/libblas.so.3") for p in libs):
        return "reference", ", ".join(libs)
    return "unknown", ", ".join(libs) or "no BLAS library loaded"


def optimized():
    return describe()[0] in ("mkl", "openblas")


def loom_gemm():
    """Which CPU GEMM loom runs here, assuming it was built for this machine (-march=native, the
    default LOOM_NATIVE=ON): its own packed kernel with AVX2 and FMA (zmm-wide with AVX-512),
    Eigen elsewhere (kernels/cpu/gemm_packed.h)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), [])
    except OSError:
        flags = []
    if "avx2" in flags and "fma" in flags:
        return "loom's packed kernel, " + ("AVX-512" if "avx512f" in flags else "AVX2")
    return "Eigen"


def openblas_threads():
    """The threads OpenBLAS's GEMMs run on in this process (its own pool, which
    torch.set_num_threads does not size: OPENBLAS_NUM_THREADS, read when the library loads), or
    None without OpenBLAS."""
    for path in _loaded_blas():
        if "openblas" in path.lower():
            try:
                return int(ctypes.CDLL(path).openblas_get_num_threads())
            except (OSError, AttributeError):
                return None
    return None


def blas_line(threads):
    """One line naming PyTorch's BLAS and its thread counts, and loom's GEMM."""
    kind, detail = describe()
    blas_threads = openblas_threads()
    own = "" if blas_threads is None else f", OpenBLAS threads = {blas_threads}"
    return (f"PyTorch BLAS: {kind} ({detail}), torch.get_num_threads() = {threads}{own}; loom "
            f"GEMM: {loom_gemm()}, OMP_NUM_THREADS = " + os.environ.get("OMP_NUM_THREADS", "unset"))


def thread_mismatch(threads):
    """Why no ratio is printed when OpenBLAS runs on more threads than the comparison gives each
    side (a script that loads it before setting OPENBLAS_NUM_THREADS); None otherwise."""
    blas_threads = openblas_threads()
    if blas_threads is None or blas_threads <= threads:
        return None
    return (f"no ratio: PyTorch's OpenBLAS runs on {blas_threads} threads where each side was to "
            f"have {threads} (OPENBLAS_NUM_THREADS must be set before numpy or torch loads it)")


def refusal():
    """Why no ratio is printed, when PyTorch is on the reference BLAS; None otherwise."""
    kind, detail = describe()
    if kind in ("mkl", "openblas"):
        return None
    return (f"no ratio: PyTorch runs on the {kind} BLAS ({detail}), not a peer at its best; "
            "install libopenblas0-pthread (scripts/install-deps.sh does) and rerun")
