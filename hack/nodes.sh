# Real nodes of the local cluster: the host network they share, and per node a
# containerd, a kubelet and a CNI bridge; one kube-proxy (iptables) and one
# CoreDNS serve them all. Sourced by local-cluster.sh, which sets STATE, BIN
# and the helpers start/live_pid/stop_component/wait_for/kubectl_.
# shellcheck shell=bash

# The host side. A bridge without ports serves as a dummy interface (this
# kernel has no dummy driver): it holds the addresses of the control plane and
# of the nodes, and whatever is routed to it is dropped on this machine.
HOST_BRIDGE=cairn0
HOST_CIDR=198.18.0.0/24 # from the range set aside for benchmarks (RFC 2544)
API_IP=198.18.0.1       # kube-apiserver and the fake cloud
DNS_IP=198.18.0.10      # CoreDNS
POD_CIDR=10.244.0.0/16  # real nodes: 10.244.N.0/24; kwok: KWOK_POD_CIDR
KWOK_POD_CIDR=10.244.128.0/17
KWOK_NODE_IP=198.18.0.200
# The machine-wide record of which state folder owns the network objects.
NETWORK_OWNER=/run/cairn-local-cluster.owner
CGROUP_ROOT=/sys/fs/cgroup
CNI_BIN=/usr/lib/cni
FILTER_CHAIN=CAIRN-EGRESS

node_name() { echo "cairn-node-$1"; }
node_ip() { echo "198.18.0.$((10 + $1))"; }
node_dir() { echo "$STATE/nodes/$(node_name "$1")"; }
node_bridge() { echo "cairn-br$1"; }
node_pod_cidr() { echo "10.244.$1.0/24"; }
# The v1 hierarchies kubelet makes cgroups in (every one but the cgroup2 mount).
cgroup_controllers() {
  local dir
  for dir in "$CGROUP_ROOT"/*/; do
    dir=${dir%/}
    [[ ${dir##*/} == unified ]] && continue
    [[ -f $dir/cgroup.procs ]] && echo "$dir"
  done
}

# ---- host network -----------------------------------------------------------

# Nothing the cluster addresses may reach the default route: the Service range
# goes to the host bridge (kube-proxy's DNAT happens after that route is chosen,
# so a host process still reaches a ClusterIP), every pod address without a
# node bridge is a blackhole, and forwarded pod traffic bound anywhere but
# another pod is rejected.
network_up() {
  if [[ -f $NETWORK_OWNER ]]; then
    local owner
    owner=$(cat "$NETWORK_OWNER")
    if [[ $owner != "$STATE" && -d $owner ]]; then
      has_live_process "$owner" &&
        die "the real nodes' network is in use by the local cluster in $owner (one cluster at a time on a machine: hack/local-cluster.sh down $owner)"
      # A run killed before its `down` (a cancelled CI job, say) leaves the
      # network, the nodes' mounts and cgroups behind: remove them as `down` would.
      log "removing the local cluster in $owner: none of its processes runs, yet its network is still up"
      "$CAIRN_ROOT/hack/local-cluster.sh" down "$owner"
    fi
    [[ -f $NETWORK_OWNER ]] && STATE=$owner network_down
  fi
  echo "$STATE" >"$NETWORK_OWNER"
  cat /proc/sys/net/ipv4/ip_forward >"$STATE/ip_forward.before"
  ip link add "$HOST_BRIDGE" type bridge
  ip addr add "$API_IP/24" dev "$HOST_BRIDGE"
  ip addr add "$DNS_IP/32" dev "$HOST_BRIDGE"
  local i
  for ((i = 1; i <= REAL_NODES; i++)); do ip addr add "$(node_ip "$i")/32" dev "$HOST_BRIDGE"; done
  ip link set "$HOST_BRIDGE" up
  ip route add "$SERVICE_CIDR" dev "$HOST_BRIDGE"
  ip route add blackhole "$POD_CIDR"
  iptables -N "$FILTER_CHAIN"
  iptables -A "$FILTER_CHAIN" -s "$POD_CIDR" -d "$POD_CIDR" -j RETURN
  iptables -A "$FILTER_CHAIN" -s "$POD_CIDR" -j REJECT
  iptables -I FORWARD -j "$FILTER_CHAIN"
  # Pods on one bridge reach each other through a Service only if bridged
  # traffic passes iptables (kube-proxy's DNAT).
  [[ -w /proc/sys/net/bridge/bridge-nf-call-iptables ]] && echo 1 >/proc/sys/net/bridge/bridge-nf-call-iptables
  echo 1 >/proc/sys/net/ipv4/ip_forward
}

# has_live_process STATE: whether any component of that cluster still runs.
has_live_process() {
  local STATE=$1 file
  for file in "$STATE"/pids/*.pid; do
    [[ -e $file ]] && alive "$(basename "$file" .pid)" && return 0
  done
  return 1
}

# Removes every network object `network_up` and the nodes created; safe to run
# on a half-made network.
network_down() {
  [[ -f $NETWORK_OWNER && $(cat "$NETWORK_OWNER") == "$STATE" ]] || return 0
  iptables -D FORWARD -j "$FILTER_CHAIN" 2>/dev/null || true
  iptables -F "$FILTER_CHAIN" 2>/dev/null || true
  iptables -X "$FILTER_CHAIN" 2>/dev/null || true
  [[ -x "$(bin_dir)/kube-proxy" ]] && "$(bin_dir)/kube-proxy" --cleanup >/dev/null 2>&1 || true
  remove_kubernetes_chains
  ip route del blackhole "$POD_CIDR" 2>/dev/null || true
  ip route del "$SERVICE_CIDR" dev "$HOST_BRIDGE" 2>/dev/null || true
  local link
  for link in $(ip -o link show type bridge | awk -F': ' '{print $2}' | cut -d@ -f1); do
    [[ $link == cairn-br* || $link == "$HOST_BRIDGE" ]] && ip link del "$link"
  done
  [[ -f $STATE/ip_forward.before ]] && cat "$STATE/ip_forward.before" >/proc/sys/net/ipv4/ip_forward
  rm -f "$NETWORK_OWNER"
}

# The chains kubelet and kube-proxy make (KUBE-*; CNI-* from the plugins) in
# every table, and the rules that jump to them, whichever iptables backend
# made them (kubelet probes both).
remove_kubernetes_chains() {
  local iptables table rule chain
  for iptables in iptables iptables-legacy; do
    command -v "$iptables" >/dev/null || continue
    for table in filter nat mangle; do
      "$iptables" -t "$table" -S 2>/dev/null | { grep -E -- '^-A .* -j (KUBE-|CNI-)' || true; } | sed 's/^-A /-D /' |
        while read -r rule; do eval "$iptables -t $table $rule" 2>/dev/null || true; done
      for chain in $("$iptables" -t "$table" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^(KUBE-|CNI-)/ {print $2}'); do
        "$iptables" -t "$table" -F "$chain" 2>/dev/null || true
      done
      for chain in $("$iptables" -t "$table" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^(KUBE-|CNI-)/ {print $2}'); do
        "$iptables" -t "$table" -X "$chain" 2>/dev/null || true
      done
    done
  done
}

# ---- per node ---------------------------------------------------------------

node_pki() { # i
  local name ip
  name=$(node_name "$1") ip=$(node_ip "$1")
  issue "$name" "/O=system:nodes/CN=system:node:$name" \
    "subjectAltName=IP:$ip,DNS:$name\nextendedKeyUsage=serverAuth,clientAuth"
}

node_kubeconfig() { # i
  local name pki=$STATE/pki b64="base64 -w0"
  name=$(node_name "$1")
  cat >"$(node_dir "$1")/kubeconfig" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: cairn-local
  cluster:
    server: $APISERVER_URL
    certificate-authority-data: $($b64 "$pki/ca.crt")
users:
- name: $name
  user:
    client-certificate-data: $($b64 "$pki/$name.crt")
    client-key-data: $($b64 "$pki/$name.key")
contexts:
- name: cairn-local
  context: {cluster: cairn-local, user: $name}
current-context: cairn-local
KUBECONFIG
}

containerd_config() { # i
  local dir
  dir=$(node_dir "$1")
  mkdir -p "$dir/cni" "$dir/registry/_default"
  # No image is ever pulled: every registry resolves to a port nothing listens
  # on, so a missing image fails at once instead of leaving the machine.
  cat >"$dir/registry/_default/hosts.toml" <<'HOSTS'
server = "http://127.0.0.1:9"
[host."http://127.0.0.1:9"]
  capabilities = ["pull", "resolve"]
HOSTS
  cat >"$dir/containerd.toml" <<TOML
version = 2
root = "$dir/containerd"
state = "$dir/containerd-state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$dir/containerd.sock"
[ttrpc]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$dir/containerd-opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # No CAP_SYS_RESOURCE on these machines: lowering a sandbox's OOM score fails.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN"
    conf_dir = "$dir/cni"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$dir/registry"
TOML
  # The node's pods: a bridge of its own, addresses kept per node, no masquerade
  # (pods keep their source address; nothing leaves the machine anyway).
  cat >"$dir/cni/10-bridge.conflist" <<CNI
{
  "cniVersion": "0.4.0",
  "name": "$(node_name "$1")",
  "plugins": [{
    "type": "bridge", "bridge": "$(node_bridge "$1")", "isGateway": true, "ipMasq": false, "hairpinMode": true,
    "ipam": {"type": "host-local", "dataDir": "$dir/cni-ipam",
             "ranges": [[{"subnet": "$(node_pod_cidr "$1")"}]], "routes": [{"dst": "0.0.0.0/0"}]}
  }]
}
CNI
}

kubelet_config() { # i zone
  local dir name ip
  dir=$(node_dir "$1") name=$(node_name "$1") ip=$(node_ip "$1")
  cat >"$dir/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $ip
port: 10250
readOnlyPort: 0
healthzBindAddress: $ip
healthzPort: 10248
tlsCertFile: $STATE/pki/$name.crt
tlsPrivateKeyFile: $STATE/pki/$name.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $STATE/pki/ca.crt}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://$dir/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: /$name
# cgroup v1 hosts (these machines): kubelet 1.35+ runs on them only when told to.
failCgroupV1: false
podLogsDir: $dir/pod-logs
clusterDNS: [$DNS_IP]
clusterDomain: cluster.local
# No search domains or resolvers of this machine inside pods.
resolvConf: ""
maxPods: 110
podPidsLimit: 4096
serializeImagePulls: false
# A busy development machine must not evict the tests' pods.
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
nodeStatusReportFrequency: 10s
# How often each pod is synced, and so how soon a changed Secret or
# ConfigMap reaches its volumes (a rotated server certificate, a refreshed
# credential): 1 minute by default, plus jitter; 10 s for the tests here.
syncFrequency: 10s
shutdownGracePeriod: 0s
YAML
}

start_node() { # i zone image-archive...
  local i=$1 zone=$2 dir name controller
  shift 2
  dir=$(node_dir "$i") name=$(node_name "$i")
  mkdir -p "$dir/kubelet" "$dir/pod-logs"
  for controller in $(cgroup_controllers); do mkdir -p "$controller/$name"; done
  node_pki "$i"
  node_kubeconfig "$i"
  containerd_config "$i"
  kubelet_config "$i" "$zone"
  start "containerd-$i" containerd --config "$dir/containerd.toml"
  wait_for "containerd-$i" "containerd of $name" ctr --address "$dir/containerd.sock" version
  import_images "$i" "$@"
  start "kubelet-$i" "$BIN/kubelet" --config="$dir/kubelet.yaml" --kubeconfig="$dir/kubeconfig" \
    --root-dir="$dir/kubelet" --hostname-override="$name" --node-ip="$(node_ip "$i")" \
    --node-labels="topology.kubernetes.io/zone=$zone,topology.kubernetes.io/region=local,type=real"
}

# import_images NODE ARCHIVE...: OCI archives (hack/images.sh) into the node's
# containerd, in the namespace the kubelet uses; each archive's .name file
# holds the repository, its tag is the archive's reference annotation.
import_images() {
  local i=$1 tar; shift
  for tar in "$@"; do
    ctr --address "$(node_dir "$i")/containerd.sock" -n k8s.io images import \
      --base-name "$(cat "${tar%.tar}.name")" "$tar" >/dev/null
  done
}

# ---- faults -----------------------------------------------------------------

# A node that stops answering, as a power loss or a partition looks from the
# API server: kubelet, containerd, its shims and every container frozen.
node_processes() { # i
  local pid
  for pid in $(live_pid "kubelet-$1") $(live_pid "containerd-$1") $(pgrep -f -- "-address $(node_dir "$1")/containerd.sock"); do
    echo "$pid"
  done
}
freeze_node() { # i
  [[ -d $(node_dir "$1") ]] || die "no real node $1"
  kill -STOP $(node_processes "$1")
  echo FROZEN >"$CGROUP_ROOT/freezer/$(node_name "$1")/freezer.state"
}
thaw_node() { # i
  [[ -d $(node_dir "$1") ]] || die "no real node $1"
  echo THAWED >"$CGROUP_ROOT/freezer/$(node_name "$1")/freezer.state"
  kill -CONT $(node_processes "$1")
}

# cut_from_apiserver ACTION POD_IP: drops (ACTION -I) or lets through again
# (-D) the pod's packets to the API server only, as a partition that leaves
# the database network up would. First in INPUT: established connections too.
cut_from_apiserver() {
  local port=${APISERVER_URL##*:}
  port=${port%%/*}
  iptables "$1" INPUT -s "$2" -d "$API_IP" -p tcp --dport "$port" -j DROP
}

# cut_between ACTION IP IP: drops (ACTION -I) or lets through again (-D)
# every packet between two pods, both ways, as a partition of the database
# network between them would. First in FORWARD: established flows too.
cut_between() {
  iptables "$1" FORWARD -s "$2" -d "$3" -j DROP
  iptables "$1" FORWARD -s "$3" -d "$2" -j DROP
}

# container_task NAMESPACE POD CONTAINER: the containerd task of the pod's
# container on its real node, as "SOCKET ID".
container_task() {
  local namespace=$1 pod=$2 container=${3:-} node id
  node=$(kubectl_ -n "$namespace" get pod "$pod" -o jsonpath='{.spec.nodeName}')
  [[ $node == cairn-node-* ]] || die "pod $namespace/$pod is not on a real node (node: ${node:-none})"
  if [[ -n $container ]]; then
    id=$(kubectl_ -n "$namespace" get pod "$pod" -o jsonpath="{.status.containerStatuses[?(@.name==\"$container\")].containerID}")
  else
    id=$(kubectl_ -n "$namespace" get pod "$pod" -o jsonpath='{.status.containerStatuses[0].containerID}')
  fi
  [[ $id == containerd://* ]] || die "pod $namespace/$pod has no running container ${container}"
  echo "$(node_dir "${node##*-}")/containerd.sock ${id#containerd://}"
}

# kill_container NAMESPACE POD [CONTAINER [SIGNAL]]: SIGKILL (or SIGNAL) to
# the container's processes through its node's containerd, as an OOM kill or
# a crash (SIGTERM: as a graceful stop would).
kill_container() {
  local task
  task=$(container_task "$1" "$2" "${3:-}")
  ctr --address "${task% *}" -n k8s.io tasks kill --all --signal "${4:-SIGKILL}" "${task#* }"
}

# freeze_container NAMESPACE POD CONTAINER: freezes the container's
# processes, as a stalled process would be: its connections stay open, it
# answers nothing. Prints its task ("SOCKET ID") for thaw_task, which needs
# no API server (it may be down when the thaw is due).
freeze_container() {
  local task
  task=$(container_task "$1" "$2" "$3")
  ctr --address "${task% *}" -n k8s.io tasks pause "${task#* }"
  echo "$task"
}

# thaw_task SOCKET ID: lets a frozen task run again. A task gone since (its
# container killed, its pod deleted) has nothing left frozen.
thaw_task() {
  local status
  ctr --address "$1" -n k8s.io tasks resume "$2" >/dev/null 2>&1 || true
  status=$(ctr --address "$1" -n k8s.io tasks ls | awk -v id="$2" '$1 == id { print $3 }')
  [[ $status != PAUSED && $status != PAUSING ]] || die "task $2 is still $status"
}

start_kube_proxy() { # healthz-port metrics-port
  cat >"$STATE/kube-proxy.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $STATE/kubeconfig}
mode: iptables
clusterCIDR: $POD_CIDR
hostnameOverride: $(node_name 1)
healthzBindAddress: 127.0.0.1:$1
metricsBindAddress: 127.0.0.1:$2
# NodePorts on the cluster's own addresses only, never on this machine's network.
nodePortAddresses: [$HOST_CIDR]
# Leave the machine's conntrack settings alone.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
YAML
  start kube-proxy "$BIN/kube-proxy" --config="$STATE/kube-proxy.yaml"
}

start_coredns() {
  cat >"$STATE/Corefile" <<COREFILE
.:53 {
    bind $DNS_IP
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $STATE/kubeconfig cairn-local
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 30
    # No forward: names outside the cluster do not resolve (nothing leaves).
}
COREFILE
  start coredns "$BIN/coredns" -conf "$STATE/Corefile"
}

# The provisioner kind runs: host folders made by a helper pod on the node,
# mode 0777, so a non-root pod can write its volume. As a process here, with
# its helper pods on the real nodes.
local_path_provisioner_objects() {
  local volumes=$STATE/volumes
  mkdir -p "$volumes"
  cat <<YAML
apiVersion: v1
kind: Namespace
metadata: {name: local-path-storage}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: local-path-provisioner, namespace: local-path-storage}
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: local-path}
provisioner: rancher.io/local-path
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
---
apiVersion: v1
kind: ConfigMap
metadata: {name: local-path-config, namespace: local-path-storage}
data:
  config.json: '{"nodePathMap": [{"node": "DEFAULT_PATH_FOR_NON_LISTED_NODES", "paths": ["$volumes"]}]}'
  setup: |-
    #!/bin/sh
    set -eu
    mkdir -m 0777 -p "\$VOL_DIR"
  teardown: |-
    #!/bin/sh
    set -eu
    rm -rf "\$VOL_DIR"
  helperPod.yaml: |-
    apiVersion: v1
    kind: Pod
    metadata: {name: helper-pod}
    spec:
      priorityClassName: system-node-critical
      tolerations: [{key: node.kubernetes.io/disk-pressure, operator: Exists, effect: NoSchedule}]
      containers:
      - name: helper-pod
        image: $HELPER_IMAGE
        imagePullPolicy: Never
YAML
}

start_local_path_provisioner() {
  local_path_provisioner_objects | kubectl_ apply -f - >/dev/null
  start local-path-provisioner "$BIN/local-path-provisioner" start \
    --kubeconfig "$STATE/kubeconfig" --namespace local-path-storage \
    --service-account-name local-path-provisioner --helper-image "$HELPER_IMAGE"
}

real_nodes_ready() {
  local ready
  ready=$(kubectl_ get nodes -l type=real -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c True)
  ((ready == REAL_NODES))
}

# ---- stopping ---------------------------------------------------------------

# Everything a node made outside its processes: containerd and its shims stop,
# every process left in the node's cgroups is killed (the containers; their
# network namespaces and veths go with them), then mounts and cgroups go.
clean_node() { # i
  local dir name sock pid mount controller
  dir=$(node_dir "$1") name=$(node_name "$1") sock=$dir/containerd.sock
  # A frozen node (a test's power loss) must thaw before its processes can stop.
  [[ -d $CGROUP_ROOT/freezer/$name ]] && echo THAWED >"$CGROUP_ROOT/freezer/$name/freezer.state" 2>/dev/null
  stop_component "containerd-$1"
  # Shims of this containerd, and any process still in the node's cgroups.
  for pid in $(pgrep -f -- "-address $sock" || true); do kill -KILL "$pid" 2>/dev/null || true; done
  for controller in $(cgroup_controllers); do
    [[ -d $controller/$name ]] || continue
    find "$controller/$name" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
  done
  for mount in $(awk -v d="$dir/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r); do
    umount -l "$mount" 2>/dev/null || true
  done
  for controller in $(cgroup_controllers); do
    [[ -d $controller/$name ]] && find "$controller/$name" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  return 0
}

# Stops every node process and removes what the nodes made, in dependency order.
nodes_down() {
  local file name i
  for file in "$STATE"/pids/kubelet-*.pid; do
    [[ -e $file ]] && stop_component "$(basename "$file" .pid)"
  done
  for name in local-path-provisioner coredns kube-proxy; do stop_component "$name"; done
  for file in "$STATE"/nodes/cairn-node-*; do
    [[ -d $file ]] || continue
    i=${file##*-}
    clean_node "$i"
  done
  network_down
}
