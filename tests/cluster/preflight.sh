# Sourced by the cluster tests (run.sh, calibrate.sh) before they bring up a cluster: exits 77
# (ctest: skipped) with the reason when this machine cannot make one (not root, a tool missing,
# a container without the privilege to make network, UTS or mount namespaces). The tools the test
# needs beyond ip, tc, nsenter and unshare are its arguments: give at least one (mpirun), since a
# file sourced without arguments sees its caller's.
skip() { echo "skipped: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root to make network namespaces (scripts/cluster.sh)"
for tool in ip tc nsenter unshare "$@"; do
  command -v "$tool" > /dev/null || skip "'$tool' not found"
done
probe=loom-probe-$$
ip netns add "$probe" 2> /dev/null || skip "cannot make a network namespace here (ip netns add failed)"
ip netns delete "$probe"
unshare --uts --mount true 2> /dev/null || skip "cannot make UTS and mount namespaces here (unshare failed)"
