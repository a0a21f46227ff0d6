#!/bin/bash
# An mpiexec for the multi-rank test scripts (tests/mpi/*.sh take MPIEXEC [flags...] and call
# `MPIEXEC -np N [flags...] PROGRAM ARGS`) that runs the job on the emulated cluster
# (scripts/cluster.sh, which must be up): N ranks spread one per node while N <= the node count
# (so every group crosses nodes), filled node by node (tp innermost, inside a node) beyond that.
# Single-host flags (--oversubscribe, --mca ... on shared memory and loopback) are dropped: the
# cluster sets its own.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cluster=$here/../../scripts/cluster.sh
[ "${1:-}" = -np ] || { echo "cluster mpiexec: expected -np N first, got '$*'" >&2; exit 2; }
np=$2
shift 2
while [ $# -gt 0 ]; do
  case "$1" in
    --oversubscribe) shift ;;
    --bind-to) shift 2 ;;
    --mca) shift 3 ;;
    *) break ;;
  esac
done
exec "$cluster" run --np "$np" -- "$@"
