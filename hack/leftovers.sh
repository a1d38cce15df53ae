#!/usr/bin/env bash
# Lists what a stopped local cluster left on this machine — processes naming
# its state folder, the process tests' PostgreSQL servers, mounts under it, the real nodes' network objects (host and
# node bridges, routes, iptables chains, network namespaces) and cgroups — and
# fails if there is anything. hack/test.sh runs it after every `down`.
#   hack/leftovers.sh STATE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
STATE=$(realpath -m "${1:?state folder}")
source "$CAIRN_ROOT/hack/nodes.sh"

found=()
shopt -s lastpipe # `... | add` appends to found in this shell
add() { while read -r line; do [[ -n $line ]] && found+=("$1: $line"); done; return 0; }

pgrep -a -f -- "$STATE" | grep -v -- "leftovers.sh" | add process || true
# The process tests' PostgreSQL servers and instances run in folders
# cairn-instance-<test>-<pid> of the temporary folder: none may outlive the run.
pgrep -a -f -- "${TMPDIR:-/tmp}/cairn-instance-" | grep -v -- "leftovers.sh" | add "process test" || true
awk -v d="$STATE" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | add mount
ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E "^($HOST_BRIDGE|cairn-br[0-9]+)$" | add link || true
ip route show | grep -E "^(blackhole )?(10\.96\.|10\.244\.)" | add route || true
for iptables in iptables iptables-legacy; do
  for table in filter nat mangle; do
    "$iptables" -t "$table" -S 2>/dev/null | grep -E -- "^-N (KUBE-|CNI-|$FILTER_CHAIN)" | sed "s/^/$table /" | add "$iptables" || true
  done
done
ls /var/run/netns 2>/dev/null | grep '^cni-' | add netns || true
for controller in $(cgroup_controllers); do
  ls -d "$controller"/cairn-node-* 2>/dev/null | add cgroup || true
done
[[ -f $NETWORK_OWNER ]] && echo "$NETWORK_OWNER" | add file

if ((${#found[@]})); then
  printf '  %s\n' "${found[@]}" >&2
  die "the local cluster in $STATE left ${#found[@]} objects behind"
fi
log "nothing of the cluster in $STATE is left: no process, mount, link, route, iptables chain, network namespace or cgroup"
