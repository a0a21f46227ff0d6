#!/usr/bin/env bash
# Installs the Debian 12 packages loom needs to configure, build, test and benchmark, and
# reports whether the CUDA kernels will be built. Run by `make`, `make test` and `make demo`
# before every configure, so it must be fast and silent-ish when nothing is missing: it asks
# dpkg (no network, no apt-get update) and only goes to apt when a package is absent.
#
# As root it apt-gets what is missing; as anyone else it prints the exact sudo line and exits 1
# (we never call sudo ourselves: a build that asks for a password half-way is worse than one
# that stops and says what to run). CUDA is reported, not installed: the toolkit does not come
# from Debian, and loom builds and tests without it.
#
# LOOM_SKIP_DEPS=1 skips the package check (machines that are not Debian, images prepared
# another way).
set -euo pipefail

# Build tools, the libraries loom links (Eigen, GoogleTest/GoogleMock, Google Benchmark,
# nlohmann-json, Open MPI for the multi-rank runtime and its mpirun tests), and Debian's Python
# with numpy, PyTorch and pytest: the numerics tests and the
# PyTorch comparison benchmark run under /usr/bin/python3. pybind11 and Python's headers build
# the Python module (python/). OpenMP comes with g++ (libgomp). procps for the fault tests.
packages=(
  cmake ninja-build g++ make pkg-config
  libeigen3-dev libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev
  openmpi-bin libopenmpi-dev
  python3 python3-numpy python3-torch python3-pytest python3-dev pybind11-dev
  clang-format
  procps  # pgrep: tests/mpi/checkpoint_faults.sh finds the ranks it kills
  iproute2  # ip and tc: scripts/cluster.sh's emulated nodes (the ctest cluster_* entries)
  # PyTorch's (and numpy's) BLAS: Debian's torch calls libblas.so.3, which without OpenBLAS is
  # the reference BLAS (~2.5 GFLOP/s), and the loom-vs-PyTorch benchmarks would compare against
  # a crippled peer (benchmarks/peer_blas.py refuses to report a ratio then).
  libopenblas0-pthread
)

say() { echo "install-deps: $*"; }

report_cuda() {
  local nvcc=""
  # The Makefile passes its LOOM_CMAKE_ARGS and build directory along, so an explicit
  # LOOM_WITH_CUDA=OFF (now or in an existing configuration) is reported as such.
  local cache="${LOOM_BUILD_DIR:-build}/CMakeCache.txt"
  if [[ "${LOOM_CMAKE_ARGS:-}" =~ -DLOOM_WITH_CUDA(:[A-Z]+)?=(OFF|off|0|FALSE|false|NO|no) ]] ||
     { [[ ! "${LOOM_CMAKE_ARGS:-}" =~ -DLOOM_WITH_CUDA ]] && [[ -f "$cache" ]] &&
       grep -qx 'LOOM_WITH_CUDA:STRING=OFF' "$cache"; }; then
    say "CUDA: LOOM_WITH_CUDA=OFF -> CUDA kernels will not be built"
    return
  fi
  # The same places CMake looks (CMakeLists.txt: nvcc on PATH, CUDA_HOME, CUDA_PATH,
  # /usr/local/cuda), so this line agrees with the configure summary.
  for candidate in "$(command -v nvcc 2>/dev/null || true)" \
                   "${CUDA_HOME:+$CUDA_HOME/bin/nvcc}" "${CUDA_PATH:+$CUDA_PATH/bin/nvcc}" \
                   /usr/local/cuda/bin/nvcc; do
    if [[ -n "$candidate" && -x "$candidate" ]]; then
      nvcc="$candidate"
      break
    fi
  done
  if [[ -n "$nvcc" ]]; then
    local version
    version="$("$nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p' | head -n1)"
    say "CUDA: nvcc ${version:+$version }at $nvcc -> CUDA kernels will be built (LOOM_WITH_CUDA=OFF to skip)"
  else
    say "CUDA: nvcc not found (PATH, CUDA_HOME, /usr/local/cuda) -> CUDA kernels will not be built (CPU only)"
  fi
}

if [[ "${LOOM_SKIP_DEPS:-0}" == "1" ]]; then
  say "LOOM_SKIP_DEPS=1: not checking system packages"
  report_cuda
  exit 0
fi

if ! command -v dpkg-query >/dev/null 2>&1; then
  # Not a Debian system: we cannot check, so say so and let CMake report what it cannot find.
  say "dpkg-query not found (not Debian?): not checking system packages; CMake will report what is missing"
  report_cuda
  exit 0
fi

# One dpkg-query for all packages. Packages dpkg has never heard of are absent from its output
# (and it exits 1, hence `|| true`); known ones are installed only when their status is "ii".
declare -A installed=()
while read -r name status; do
  [[ "$status" == ii* ]] && installed["$name"]=1
done < <(dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n' "${packages[@]}" 2>/dev/null || true)

missing=()
for p in "${packages[@]}"; do
  [[ -n "${installed[$p]:-}" ]] || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  say "all ${#packages[@]} required packages are installed"
  report_cuda
  exit 0
fi

say "missing packages: ${missing[*]}"
if [[ "$(id -u)" != "0" ]]; then
  say "not root, so not installing. Run this, then the make command again:"
  echo "  sudo apt-get update && sudo apt-get install -y --no-install-recommends ${missing[*]}"
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
say "apt-get update"
apt-get update
say "apt-get install ${missing[*]}"
apt-get install -y --no-install-recommends "${missing[@]}"
say "installed: ${missing[*]}"
report_cuda
