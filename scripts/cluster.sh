#!/usr/bin/env bash
# An emulated cluster on one Linux host: N "nodes", each its own network namespace (an address on
# a private bridge), hostname (UTS namespace), /dev/shm (mount namespace) and TMPDIR (Open MPI's
# session files), so that Open MPI's shared-memory transport is per node, as on real machines,
# and `mpirun --host
# loom-node1:2,loom-node2:2` starts a real multi-host job: TCP between nodes, shared memory
# inside one.
#
#   scripts/cluster.sh up N [--ranks-per-node R] [--inter-bw RATE]   bring up N nodes (R slots each,
#                                   default 2); RATE (tc syntax: 1gbit, 200mbit) shapes every
#                                   node's link, both directions, with tbf
#   scripts/cluster.sh run [--np P] -- <program and args>   mpirun on the cluster: from node 1,
#                                   P ranks (default N x R): one per node while P <= N, else by
#                                   slot (ranks 0..R-1 on node 1, ...)
#   scripts/cluster.sh hosts        the mpirun host list (loom-node1:R,loom-node2:R,...)
#   scripts/cluster.sh status       what is up
#   scripts/cluster.sh down         remove everything `up` made (idempotent)
#
# Needs root, ip and tc (iproute2), nsenter and unshare (util-linux), and Open MPI's mpirun. It
# touches nothing of the host's network: the bridge lives in a namespace of its own
# (loom-switch), and the addresses (10.77.0.0/24) exist only inside the namespaces it creates.
# State (the node count, the slots, each node's holder process) is kept in LOOM_CLUSTER_DIR
# (default /run/loom-cluster). A failing `up` takes down what it made.
#
# How it works: each node is held by a process (`sleep infinity`) started inside the node's
# network namespace with `unshare --uts --mount`, which sets the hostname, mounts a fresh tmpfs on
# /dev/shm and binds the cluster's hosts file over /etc/hosts; the rest of the file system (the
# repository, wherever it is, /tmp included) is the host's, as a shared file system is on a
# real cluster. Commands run in a node get TMPDIR=LOOM_CLUSTER_DIR/tmp/<node>. Commands enter a
# node with `nsenter --target <holder>` (scripts/cluster.sh's rsh mode, Open MPI's
# plm_rsh_agent: mpirun starts its daemons on the other nodes through it, as it would through
# ssh).
set -euo pipefail

STATE=${LOOM_CLUSTER_DIR:-/run/loom-cluster}
SUBNET=10.77.0
SWITCH=loom-switch
BRIDGE=loom-br0
SELF=$(readlink -f "${BASH_SOURCE[0]}")

die() {
  echo "cluster.sh: $*" >&2
  exit 1
}

need_tools() {
  [ "$(id -u)" = 0 ] || die "needs root (network namespaces, veth pairs and mounts); run it as root"
  local tool
  for tool in ip tc nsenter unshare; do
    command -v "$tool" > /dev/null ||
      die "'$tool' not found: install iproute2 (ip, tc) and util-linux (nsenter, unshare)"
  done
}

node_name() { echo "loom-node$1"; }
holder_pid() { cat "$STATE/$(node_name "$1").pid" 2> /dev/null; }

# Runs a command inside node K (its network, hostname and mounts), in the caller's directory.
in_node() {
  local k=$1
  shift
  local pid
  pid=$(holder_pid "$k") || die "node $k is not up (scripts/cluster.sh up N first)"
  kill -0 "$pid" 2> /dev/null || die "node $k's holder process $pid is gone; run down, then up"
  nsenter --target "$pid" --net --uts --mount --wd="$PWD" -- "$@"
}

cmd_down() {
  need_tools
  local f pid
  for f in "$STATE"/loom-node*.pid; do
    [ -e "$f" ] || continue
    pid=$(cat "$f")
    # Every process left inside the node (ranks of a failed job, daemons) goes with it.
    if kill -0 "$pid" 2> /dev/null; then
      local ns
      ns=$(readlink "/proc/$pid/ns/net" || true)
      for p in /proc/[0-9]*; do
        [ "$(readlink "$p/ns/net" 2> /dev/null)" = "$ns" ] && kill -9 "${p#/proc/}" 2> /dev/null || true
      done
    fi
    rm -f "$f"
  done
  local n
  for n in $(ip netns list 2> /dev/null | awk '{print $1}' | grep -E "^(loom-node[0-9]+|$SWITCH)$" || true); do
    ip netns delete "$n" 2> /dev/null || true
  done
  rm -rf "$STATE"
}

cmd_up() {
  need_tools
  local nodes=${1:-}
  shift || true
  [[ "$nodes" =~ ^[0-9]+$ ]] && [ "$nodes" -ge 1 ] && [ "$nodes" -le 64 ] ||
    die "up: the node count must be 1 to 64, got '${nodes}' (usage: up N [--ranks-per-node R] [--inter-bw RATE])"
  local slots=2 rate=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --ranks-per-node) slots=${2:-}; shift 2 || die "up: --ranks-per-node needs a value" ;;
      --inter-bw) rate=${2:-}; shift 2 || die "up: --inter-bw needs a value (e.g. 1gbit)" ;;
      *) die "up: unknown option '$1' (options: --ranks-per-node R, --inter-bw RATE)" ;;
    esac
  done
  [[ "$slots" =~ ^[0-9]+$ ]] && [ "$slots" -ge 1 ] || die "up: --ranks-per-node must be a positive integer, got '$slots'"
  [ -z "$rate" ] || [[ "$rate" =~ ^[0-9.]+[kmg]?(bit|bps)$ ]] ||
    die "up: --inter-bw '$rate' is not a tc rate (e.g. 1gbit, 500mbit)"
  if [ -d "$STATE" ] || ip netns list 2> /dev/null | grep -qE "^(loom-node[0-9]+|$SWITCH)( |$)"; then
    die "a cluster is already up (scripts/cluster.sh down first)"
  fi
  mkdir -p "$STATE"
  # Any failure from here on (a command's error or a die) takes down what was made.
  trap 'echo "cluster.sh: up failed; taking down what it made" >&2; cmd_down' EXIT
  echo "$nodes" > "$STATE/nodes"
  echo "$slots" > "$STATE/slots"
  echo "$rate" > "$STATE/rate"
  : > "$STATE/hosts"
  printf '127.0.0.1 localhost\n' >> "$STATE/hosts"
  local k
  for k in $(seq 1 "$nodes"); do
    printf '%s.%d %s\n' "$SUBNET" "$k" "$(node_name "$k")" >> "$STATE/hosts"
  done

  ip netns add "$SWITCH"
  ip -n "$SWITCH" link add "$BRIDGE" type bridge
  ip -n "$SWITCH" link set "$BRIDGE" up
  ip -n "$SWITCH" link set lo up
  for k in $(seq 1 "$nodes"); do
    local name
    name=$(node_name "$k")
    ip netns add "$name"
    ip link add "veth$k" netns "$name" type veth peer name "port$k" netns "$SWITCH"
    ip -n "$name" link set "veth$k" name eth0
    ip -n "$name" addr add "$SUBNET.$k/24" dev eth0
    ip -n "$name" link set eth0 up
    ip -n "$name" link set lo up
    ip -n "$SWITCH" link set "port$k" master "$BRIDGE"
    ip -n "$SWITCH" link set "port$k" up
    if [ -n "$rate" ]; then  # the node's link, both ways: its sends and what the switch sends it
      tc -n "$name" qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 50ms
      tc -n "$SWITCH" qdisc add dev "port$k" root tbf rate "$rate" burst 256kb latency 50ms
    fi
    # The holder: its own hostname, /dev/shm and /etc/hosts, alive until down.
    ip netns exec "$name" unshare --uts --mount --propagation private sh -c "
      hostname $name &&
      mount -t tmpfs -o mode=1777 tmpfs /dev/shm &&
      mount --bind '$STATE/hosts' /etc/hosts &&
      exec sleep infinity" < /dev/null > /dev/null 2>&1 &
    echo $! > "$STATE/$name.pid"
    mkdir -p "$STATE/tmp/$name"
  done
  # The holders are ready once each reports its hostname.
  for k in $(seq 1 "$nodes"); do
    local tries=0
    until [ "$(in_node "$k" hostname 2> /dev/null)" = "$(node_name "$k")" ]; do
      tries=$((tries + 1))
      [ $tries -lt 100 ] || die "node $k did not come up"
      sleep 0.05
    done
  done
  if [ "$nodes" -ge 2 ] && command -v ping > /dev/null; then
    in_node 1 ping -c 1 -W 2 "$(node_name 2)" > /dev/null 2>&1 ||
      die "node 1 cannot reach node 2 over the bridge"
  fi
  trap - EXIT
  echo "cluster.sh: $nodes node(s) up, $slots slot(s) each${rate:+, links shaped to $rate}"
  echo "cluster.sh: hosts $(cmd_hosts)"
}

cmd_hosts() {
  [ -f "$STATE/nodes" ] || die "no cluster is up (scripts/cluster.sh up N first)"
  local nodes slots k list=""
  nodes=$(cat "$STATE/nodes")
  slots=$(cat "$STATE/slots")
  for k in $(seq 1 "$nodes"); do list="$list${list:+,}$(node_name "$k"):$slots"; done
  echo "$list"
}

cmd_status() {
  if [ ! -f "$STATE/nodes" ]; then
    echo "cluster.sh: no cluster is up"
    return 0
  fi
  local rate
  rate=$(cat "$STATE/rate")
  echo "cluster.sh: $(cat "$STATE/nodes") node(s), $(cat "$STATE/slots") slot(s) each, links ${rate:-unshaped}"
  echo "cluster.sh: hosts $(cmd_hosts)"
}

# Open MPI's rsh agent: `cluster.sh rsh HOST COMMAND...` runs COMMAND (one shell string, as ssh
# would) inside node HOST.
cmd_rsh() {
  local host=$1
  shift
  [[ "$host" =~ ^loom-node([0-9]+)$ ]] || die "rsh: '$host' is not a node of this cluster"
  local k=${BASH_REMATCH[1]}
  cd /
  in_node "$k" env TMPDIR="$STATE/tmp/loom-node$k" /bin/sh -c "$*"
}

cmd_run() {
  [ -f "$STATE/nodes" ] || die "no cluster is up (scripts/cluster.sh up N first)"
  local np=""
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    case "$1" in
      --np) np=${2:-}; shift 2 || die "run: --np needs a value" ;;
      *) die "run: unknown option '$1' (usage: run [--np P] -- PROGRAM ARGS...)" ;;
    esac
  done
  [ "${1:-}" = "--" ] || die "run: put the program after '--' (usage: run [--np P] -- PROGRAM ARGS...)"
  shift
  [ $# -gt 0 ] || die "run: no program given after '--'"
  local nodes slots
  nodes=$(cat "$STATE/nodes")
  slots=$(cat "$STATE/slots")
  np=${np:-$((nodes * slots))}
  local exports=() var
  for var in PATH LD_LIBRARY_PATH PYTHONPATH $(compgen -e | grep '^LOOM_' || true); do
    [ -z "${!var+x}" ] || exports+=(-x "$var")
  done
  [[ "$np" =~ ^[0-9]+$ ]] && [ "$np" -ge 1 ] || die "run: --np must be a positive integer, got '$np'"
  # Up to one rank per node: one on each (every group crosses nodes). More: by slot, ranks
  # 0..R-1 on node 1, R..2R-1 on node 2, ... (what a real host list gives: tp, innermost, inside
  # a node); past N x R slots the nodes are oversubscribed in the same order.
  local map=slot
  [ "$np" -gt "$nodes" ] || map=node
  # TCP between nodes on the cluster's subnet, shared memory inside a node.
  # Open MPI's session files go to each node's own TMPDIR.
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 in_node 1 env TMPDIR="$STATE/tmp/loom-node1" \
    mpirun --host "$(cmd_hosts)" -np "$np" --map-by "$map" --oversubscribe --bind-to none \
    --mca mpi_yield_when_idle 1 \
    --mca plm_rsh_agent "$SELF rsh" \
    --mca btl self,vader,tcp --mca btl_vader_single_copy_mechanism none \
    --mca btl_tcp_if_include "$SUBNET.0/24" --mca oob_tcp_if_include "$SUBNET.0/24" \
    -x OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" "${exports[@]}" "$@"
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  down) cmd_down ;;
  run) shift; cmd_run "$@" ;;
  hosts) cmd_hosts ;;
  status) cmd_status ;;
  rsh) shift; cmd_rsh "$@" ;;
  *)
    sed -n '2,/^set -euo/p' "$SELF" | sed '$d' | sed 's/^# \{0,1\}//'
    [ -z "${1:-}" ] || [ "$1" = -h ] || [ "$1" = --help ] || exit 1
    ;;
esac
