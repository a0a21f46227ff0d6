"""Which BLAS PyTorch's GEMMs run on, for the loom-vs-PyTorch benchmarks: a peer compared at its
best (DESIGN.md), never on the reference BLAS.

Debian's python3-torch is built with BLAS_INFO=generic: it calls whatever libblas.so.3 the
alternatives system points to. With only Debian's reference BLAS installed that is a textbook
triple loop (about 2.5 GFLOP/s on the development VM), and a GPT step is 6-7x slower than on
OpenBLAS, so a ratio against it would flatter loom. scripts/install-deps.sh installs
libopenblas0-pthread, which takes over libblas.so.3. Each benchmark prints blas_line() and
reports a ratio only when optimized() is true.

OpenBLAS picks its kernels by the CPU it recognises, unless OPENBLAS_CORETYPE names them: the
development VM's environment sets OPENBLAS_CORETYPE=Haswell (AVX2 kernels), and on its Zen 5 CPU
(AVX-512) a 1-thread 1024^3 torch.mm ran at 75-102 GFLOP/s under it, against 144-192 with
OpenBLAS's own choice (Cooperlake) or SkylakeX. best_openblas_coretype() times the candidates; `make bench` runs
every PyTorch peer with the fastest (benchmarks/report.py), and blas_line() names the kernels a
run used.
"""

import ctypes
import json
import os
import subprocess
import sys

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


def _cpu_flags():
    """The first CPU's flags from /proc/cpuinfo (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].split() for line in f
                         if line.startswith("flags")), [])
    except OSError:
        return []


def loom_gemm():
    """Which CPU GEMM loom runs here, assuming it was built for this machine (-march=native, the
    default LOOM_NATIVE=ON): its own packed kernel with AVX2 and FMA (zmm-wide with AVX-512),
    Eigen elsewhere (kernels/cpu/gemm_packed.h)."""
    flags = _cpu_flags()
    if "avx2" in flags and "fma" in flags:
        return "loom's packed kernel, " + ("AVX-512" if "avx512f" in flags else "AVX2")
    return "Eigen"


def _openblas():
    """The loaded OpenBLAS library (ctypes), or None."""
    for path in _loaded_blas():
        if "openblas" in path.lower():
            try:
                return ctypes.CDLL(path)
            except OSError:
                return None
    return None


def openblas_core():
    """The name of the kernels OpenBLAS chose in this process ("Haswell", "SkylakeX", ...), or
    None without OpenBLAS."""
    lib = _openblas()
    try:
        if lib is not None:
            lib.openblas_get_corename.restype = ctypes.c_char_p
            return lib.openblas_get_corename().decode()
    except AttributeError:
        pass
    return None


_CORE_PROBE = r"""
import json, sys, time
import torch
sys.path.insert(0, sys.argv[1])
import peer_blas
torch.set_num_threads(1)
a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
for _ in range(3):
    torch.mm(a, b)
best = None
for _ in range(5):
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.1:
        torch.mm(a, b)
        reps += 1
    rate = 2.0 * 1024 ** 3 * reps / (time.perf_counter() - t0) / 1e9
    best = rate if best is None else max(best, rate)
print(json.dumps({"core": peer_blas.openblas_core(), "gflops": best}))
"""


def best_openblas_coretype(python=sys.executable):
    """The OPENBLAS_CORETYPE under which PyTorch's GEMMs run fastest here, among: the one this
    process inherited (if any), none (OpenBLAS's own choice) and, on an AVX-512 CPU, SkylakeX;
    each timed on a 1-thread 1024^3 torch.mm (best of 5) in a fresh process, since OpenBLAS reads
    the variable when it loads. Returns (the value, None meaning unset; a line saying what was
    measured and chosen)."""
    inherited = os.environ.get("OPENBLAS_CORETYPE") or None
    candidates = [inherited, None] if inherited else [None]
    if "avx512f" in _cpu_flags() and "SkylakeX" not in candidates:
        candidates.append("SkylakeX")
    here = os.path.dirname(os.path.abspath(__file__))
    measured = []
    for coretype in candidates:
        env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
        env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        if coretype:
            env["OPENBLAS_CORETYPE"] = coretype
        try:
            out = subprocess.run([python, "-c", _CORE_PROBE, here], capture_output=True,
                                 text=True, env=env, timeout=120, check=True).stdout
            result = json.loads(out.strip().splitlines()[-1])
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            return inherited, "OpenBLAS core: not chosen (the core probe failed)"
        if result["core"] is None:
            return inherited, "OpenBLAS core: none (PyTorch is not on OpenBLAS here)"
        measured.append((coretype, result))
    best = max(measured, key=lambda m: m[1]["gflops"])
    said = ", ".join(f"{'OPENBLAS_CORETYPE=' + c if c else 'unset'} -> {r['core']} "
                     f"{r['gflops']:.0f} GFLOP/s" for c, r in measured)
    return best[0], (f"OpenBLAS core {best[1]['core']} (1-thread 1024^3 torch.mm: {said}; "
                     "PyTorch runs with the fastest)")


def openblas_threads():
    """The threads OpenBLAS's GEMMs run on in this process (its own pool, which
    torch.set_num_threads does not size: OPENBLAS_NUM_THREADS, read when the library loads), or
    None without OpenBLAS."""
    lib = _openblas()
    try:
        return None if lib is None else int(lib.openblas_get_num_threads())
    except AttributeError:
        return None


def blas_line(threads):
    """One line naming PyTorch's BLAS and its thread counts, and loom's GEMM."""
    kind, detail = describe()
    blas_threads, core = openblas_threads(), openblas_core()
    own = "" if blas_threads is None else f", OpenBLAS threads = {blas_threads}, core {core}"
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
