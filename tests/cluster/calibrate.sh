#!/bin/bash
# loom-plan --calibrate across nodes (ctest label cluster): on an emulated cluster of 2 nodes x 2
# ranks whose links are shaped to 1 Gbit/s (scripts/cluster.sh), the profile holds both link
# levels: across nodes each rank's share of its node's link, 62.5 MB/s when both of a node's
# ranks cross together (Note [Calibrating two link levels] in planner/calibrate.cpp; TCP's
# headers take a few percent, and the bound below leaves room for a busy machine), not the
# whole link's 125 MB/s; inside a node shared memory, far faster. Exits 77 (skipped) with the
# reason where namespaces cannot be made.
# usage: calibrate.sh BUILD_DIR
set -euo pipefail
build=$1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cluster=$here/../../scripts/cluster.sh
source "$here/preflight.sh" mpirun python3

dir=$(mktemp -d "$build/cluster-calibrate.XXXXXX")
bash "$cluster" down
trap 'bash "$cluster" down; rm -rf "$dir"' EXIT
bash "$cluster" up 2 --ranks-per-node 2 --inter-bw 1gbit
out=$(bash "$cluster" run --np 4 -- "$build/bin/loom-plan" --calibrate "$dir/profile.json")
echo "$out"
grep -q "all-reduce over 2 node(s): inside a node" <<< "$out" ||
  { echo "FAIL: loom-plan did not report two link levels"; exit 1; }
python3 - "$dir/profile.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
inter, intra = p["inter"]["bandwidth"], p["intra"]["bandwidth"]
share = 1e9 / 8 / 2  # a node's 1 Gbit/s link, two ranks crossing at once
print(f"across nodes {inter / 1e6:.1f} MB/s per rank ({inter / share:.2f} of {share / 1e6:.1f}), "
      f"inside a node {intra / 1e6:.0f} MB/s")
assert 0.6 * share <= inter <= 1.1 * share, "the across-nodes level is not a rank's share of the link"
assert intra > 5 * inter, "inside a node should be far faster than the shaped link"
PY
echo "calibrate across 2 nodes: both link levels as shaped"
