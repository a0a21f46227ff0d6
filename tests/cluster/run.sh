#!/bin/bash
# The multi-node tests (ctest label cluster): brings up an emulated cluster of NODES nodes with
# RANKS slots each (scripts/cluster.sh), runs on it the collectives', signature checks' and
# mesh's (which ranks share a node) tests on every slot, and loom-gpt (every ZeRO stage, tp, every pipeline schedule, dp x tp x pp) and
# loom-dlrm (every sharding) against one process with the same scripts as on one host
# (tests/mpi/gpt_parallel.sh, dlrm_parallel.sh, through tests/cluster/mpiexec.sh), then takes
# the cluster down, also on failure. Exits 77 (ctest: skipped) with the reason when this machine
# cannot make network namespaces (not root, no iproute2, a container without the privilege).
# usage: run.sh NODES RANKS BUILD_DIR
set -euo pipefail
nodes=$1; ranks=$2; build=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cluster=$here/../../scripts/cluster.sh
source "$here/preflight.sh" mpirun

# A cluster left by an interrupted run is taken down first; this one always is.
bash "$cluster" down
trap 'bash "$cluster" down' EXIT
bash "$cluster" up "$nodes" --ranks-per-node "$ranks"
np=$((nodes * ranks))
# Test outputs go under the build directory, as on a real cluster's shared file system.
export TMPDIR=$build/cluster-tmp/$nodes-x-$ranks
rm -rf "$TMPDIR" && mkdir -p "$TMPDIR"
for test in collectives_test debug_test mesh_test hierarchical_test expert_parallel_test; do
  echo "== $test on $nodes nodes x $ranks ranks"
  bash "$cluster" run --np "$np" -- "$build/bin/$test" --gtest_brief=1
done
echo "== loom-gpt against one process (tests/mpi/gpt_parallel.sh)"
LOOM_TEST_NODES=$nodes bash "$here/../mpi/gpt_parallel.sh" "$build/bin/loom-gpt" "$here/mpiexec.sh"
echo "== loom-dlrm against one process (tests/mpi/dlrm_parallel.sh)"
LOOM_TEST_NODES=$nodes bash "$here/../mpi/dlrm_parallel.sh" "$build/bin/loom-dlrm" "$here/mpiexec.sh"
rm -rf "$TMPDIR"
echo "cluster $nodes x $ranks: every test gave the single-host results"
