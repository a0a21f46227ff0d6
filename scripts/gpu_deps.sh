#!/usr/bin/env bash
# Fetches the Debian 12 packages loom needs to configure and build its tests on the GPU machine
# (which has nvcc, CMake, ninja and PyTorch but no Debian -dev packages and no network), and
# unpacks them into .gpu-deps/root/ so that a device call can carry them (`carry: [".gpu-deps"]`)
# and scripts/gpu_check.sh can point CMAKE_PREFIX_PATH and CPATH there.
#
# Run it HERE (Debian 12, apt works): `bash scripts/gpu_deps.sh`. It downloads .debs with
# `apt-get download` (nothing is installed, no root needed beyond apt's cache) and unpacks them
# with `dpkg -x`, then drops docs, man pages and the .debs themselves: the carried tree must stay
# well under the device tool's 64 MiB working-tree limit (it is a few MiB).
#
# What is fetched and why:
#   libeigen3-dev          Eigen3Config.cmake + headers (the CPU kernels' GEMM; required)
#   libgtest-dev           GTestConfig.cmake, libgtest.a, libgtest_main.a (every test binary)
#   libgmock-dev           GMock targets, which GTestConfig.cmake includes when present
#   googletest             the sources libgtest-dev's headers come from (Depends of libgtest-dev)
#   nlohmann-json3-dev     <nlohmann/json.hpp> (included directly, not via find_package: CPATH)
#   libbenchmark-dev       optional: loom-bench (CPU microbenchmarks); benchmarkConfig.cmake
#   libbenchmark1debian    its shared library (runtime of loom-bench; LD_LIBRARY_PATH there)
# MPI and NCCL are not fetched: the lent machine's image (Ubuntu 24.04, seen 2026-11-26) has Open
# MPI (/usr/bin/mpirun, headers included) and NCCL 2.28, which CMake finds, so nccl_test runs
# there. (Were they missing, LOOM_WITH_MPI=AUTO would turn the MPI backend off; Open MPI unpacked
# under a foreign prefix would need OPAL_PREFIX and a dozen libraries: libfabric, ucx, pmix, ...)
set -euo pipefail

cd "$(dirname "$0")/.."
DEST=.gpu-deps
ROOT="$DEST/root"
packages=(libeigen3-dev libgtest-dev libgmock-dev googletest nlohmann-json3-dev
          libbenchmark-dev libbenchmark1debian)

say() { echo "gpu_deps: $*"; }

grep -qxF '/.gpu-deps/' .gitignore 2>/dev/null ||
  say "warning: /.gpu-deps/ is not in .gitignore; it would travel as untracked files"

rm -rf "$DEST"
mkdir -p "$DEST/debs" "$ROOT"
# apt-get download writes into the current directory; as root it warns that the download is
# unsandboxed (the _apt user cannot write here), which is harmless.
if ! (cd "$DEST/debs" && apt-get download "${packages[@]}"); then
  say "apt-get download failed; running apt-get update once and retrying"
  apt-get update -qq
  (cd "$DEST/debs" && apt-get download "${packages[@]}")
fi

for deb in "$DEST"/debs/*.deb; do
  dpkg -x "$deb" "$ROOT"
  say "unpacked $(basename "$deb")"
done
rm -rf "$DEST/debs"
# Documentation, man pages, lintian overrides and googletest's copy of its sources (only the
# headers and the prebuilt static libraries are used) are dead weight in the carried tree.
rm -rf "$ROOT/usr/share/doc" "$ROOT/usr/share/man" "$ROOT/usr/share/lintian" \
       "$ROOT/usr/src"

# The CMake package configs find_package needs, each with where it landed.
status=0
for config in Eigen3Config.cmake GTestConfig.cmake nlohmann_jsonConfig.cmake \
              benchmarkConfig.cmake; do
  where="$(find "$ROOT" -name "$config" -print -quit)"
  if [[ -n "$where" ]]; then
    say "found $config at $where"
  elif [[ "$config" == benchmarkConfig.cmake ]]; then
    say "optional $config not found (loom-bench will not be built there)"
  else
    say "ERROR: $config not found under $ROOT"
    status=1
  fi
done
for f in usr/include/nlohmann/json.hpp usr/lib/x86_64-linux-gnu/libgtest.a \
         usr/lib/x86_64-linux-gnu/libgtest_main.a; do
  [[ -e "$ROOT/$f" ]] || { say "ERROR: $ROOT/$f missing"; status=1; }
done

bytes="$(du -sb "$DEST" | cut -f1)"
say "$DEST holds $(du -sh "$DEST" | cut -f1) ($bytes bytes; the device tool carries at most 64 MiB" \
    "together with the working tree)"
if ((bytes > 32 * 1024 * 1024)); then
  say "ERROR: $DEST is larger than 32 MiB; something unexpected was unpacked"
  status=1
fi
exit $status
