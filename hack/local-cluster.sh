#!/usr/bin/env bash
# A real Kubernetes cluster on this machine, for development and tests:
# etcd, kube-apiserver (RBAC, client certificates, audit log),
# kube-controller-manager (garbage collector, workload controllers, host-path
# provisioner), kube-scheduler, real nodes (kubelet + containerd + runc + CNI
# bridge each, one kube-proxy, CoreDNS, the local-path provisioner; see
# hack/nodes.sh), kwok faking three tainted nodes in three zones for scale
# tests, and the moto server as a fake AWS. Real nodes need root.
#
#   hack/local-cluster.sh up   [STATE_DIR]   start (or reuse the one running there)
#   hack/local-cluster.sh down [STATE_DIR]   stop every process, remove STATE_DIR
#   hack/local-cluster.sh env  [STATE_DIR]   print the environment to use it
#   hack/local-cluster.sh stop-apiserver|start-apiserver [STATE_DIR]
#                                            take the API server away and back
#                                            (tests of clients' resilience)
#   hack/local-cluster.sh start-process STATE_DIR NAME COMMAND...
#                                            run a client of the cluster (a
#                                            controller) with the components:
#                                            logs/NAME.log, stopped by `down`
#   hack/local-cluster.sh import-images STATE_DIR TAR...
#                                            OCI archives (hack/images.sh) into
#                                            every real node
#   hack/local-cluster.sh stop-node|start-node STATE_DIR N
#                                            freeze real node N (kubelet,
#                                            containerd and its containers: a
#                                            power loss or partition) and thaw it
#   hack/local-cluster.sh kill-container STATE_DIR NAMESPACE POD [CONTAINER [SIGNAL]]
#                                            SIGKILL (or SIGNAL) one container's processes
#   hack/local-cluster.sh freeze-container STATE_DIR NAMESPACE POD CONTAINER
#                                            stall one container's processes; prints its task
#   hack/local-cluster.sh thaw-task STATE_DIR SOCKET ID
#                                            let that task run again
#   hack/local-cluster.sh cut-from-apiserver|heal-from-apiserver STATE_DIR POD_IP
#                                            drop a pod's packets to the API
#                                            server (nothing else), and undo it
#   hack/local-cluster.sh cut-between|heal-between STATE_DIR POD_IP POD_IP
#                                            drop every packet between two pods,
#                                            both ways, and undo it
#
# CAIRN_REAL_NODES: how many real nodes, one per zone (default 3; 0 for none).
# One cluster with real nodes runs on a machine at a time (they share the
# host's iptables and routes).
# CAIRN_CONTROLLER_MANAGER_QPS: kube-controller-manager's client rate (default
# 20, upstream's); benchmarks raise it as a cluster sized for their load would,
# so the garbage collector and the workload controllers keep up.
# CAIRN_CONTROL_PLANE=large: the settings of a control plane sized for
# thousands of workloads (the database benchmark's): kube-controller-manager
# at 100 requests/s (unless set above) with 20 concurrent StatefulSet, Job
# and ReplicaSet syncs (upstream: 5), kube-scheduler at 200 requests/s
# (upstream: 50).
# CAIRN_APISERVER_PROFILING=true: serve kube-apiserver's /debug/pprof (to
# the admin client certificate), to see where its CPU goes under a benchmark.
#
# STATE_DIR defaults to $CAIRN_CACHE/clusters/dev. It holds certificates, the
# admin kubeconfig, the etcd data, logs and pid files; `env` lists what is where.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

NODE_ZONES=(zone-a zone-b zone-c)
SERVICE_CIDR=10.96.0.0/16
SERVICE_API_IP=10.96.0.1
START_TIMEOUT=${CAIRN_START_TIMEOUT:-90}
REAL_NODES=${CAIRN_REAL_NODES:-3}
case ${CAIRN_CONTROL_PLANE:-default} in
  default) MANAGER_QPS=${CAIRN_CONTROLLER_MANAGER_QPS:-20} WORKLOAD_SYNCS=5 SCHEDULER_QPS=50 ;;
  large) MANAGER_QPS=${CAIRN_CONTROLLER_MANAGER_QPS:-100} WORKLOAD_SYNCS=20 SCHEDULER_QPS=200 ;;
  *) die "CAIRN_CONTROL_PLANE=$CAIRN_CONTROL_PLANE: default or large" ;;
esac
APISERVER_PROFILING=${CAIRN_APISERVER_PROFILING:-false}
[[ $APISERVER_PROFILING == true || $APISERVER_PROFILING == false ]] ||
  die "CAIRN_APISERVER_PROFILING=$APISERVER_PROFILING: true or false"
[[ $MANAGER_QPS =~ ^[0-9]+$ ]] || die "CAIRN_CONTROLLER_MANAGER_QPS=$MANAGER_QPS: a whole number"
[[ $REAL_NODES =~ ^[0-3]$ ]] || die "CAIRN_REAL_NODES=$REAL_NODES: 0 to 3"
# Taint and annotation of the kwok nodes: only pods that tolerate it land there.
KWOK_TAINT=kwok.x-k8s.io/node
source "$(dirname "$0")/nodes.sh"

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

# free_ports N: N distinct free loopback ports. All sockets are held open until
# every port is chosen, so no two of them coincide.
free_ports() {
  python3 -c '
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))' "$1"
}

# start NAME COMMAND... : runs COMMAND in a session of its own (so a Ctrl-C in
# the calling terminal does not reach it and `down` can signal its whole group),
# logging to logs/NAME.log.
# The pid file holds the pid and the process's start time, so a pid reused by
# another process (after a reboot, say) is never mistaken for ours.
start() {
  local name=$1; shift
  setsid "$@" >"$STATE/logs/$name.log" 2>&1 </dev/null 9>&- &
  echo "$! $(start_time $!)" >"$STATE/pids/$name.pid"
}

start_time() { proc_stat "$1" | awk '{print $20}'; }

# start_supervised NAME COMMAND... : `start`, and COMMAND started again a
# second after it exits, as a kubelet restarts a control plane's static pods:
# kube-scheduler exits by design when it finds its cache inconsistent (seen
# after API server outages), and nothing would be scheduled again. The pid
# file names the supervising shell; its process group holds both.
start_supervised() {
  local name=$1; shift
  start "$name" bash -c 'while :; do "$@"; echo "[local-cluster] exited ($?); starting again in 1 s" >&2; sleep 1; done' supervise "$@"
}

# The pid of component NAME if that very process is still running (a zombie,
# exited but not yet reaped by init, is not), else nothing.
live_pid() {
  local pid started stat
  [[ -f "$STATE/pids/$1.pid" ]] || return 1
  read -r pid started <"$STATE/pids/$1.pid"
  stat=$(proc_stat "$pid") || return 1
  [[ $(awk '{print $1}' <<<"$stat") != Z && $(awk '{print $20}' <<<"$stat") == "$started" ]] || return 1
  echo "$pid"
}
alive() { live_pid "$1" >/dev/null; }

# wait_for NAME DESCRIPTION COMMAND... : polls COMMAND until it succeeds; fails
# with the component's log tail if the component exits or time runs out.
wait_for() {
  local name=$1 what=$2; shift 2
  local deadline=$((SECONDS + START_TIMEOUT))
  until "$@" >/dev/null 2>&1; do
    if ! alive "$name"; then
      tail -n 30 "$STATE/logs/$name.log" >&2 || true
      die "$name exited while waiting for $what (log: $STATE/logs/$name.log)"
    fi
    if ((SECONDS > deadline)); then
      tail -n 30 "$STATE/logs/$name.log" >&2 || true
      die "timed out after ${START_TIMEOUT}s waiting for $what (log: $STATE/logs/$name.log)"
    fi
    sleep 0.2
  done
}

apiserver_get() { # path
  curl -sf --max-time 5 --cacert "$STATE/pki/ca.crt" --cert "$STATE/pki/admin.crt" --key "$STATE/pki/admin.key" \
    "$APISERVER_URL$1"
}

state_value() { sed -n "s/^export $1=//p" "$STATE/env" 2>/dev/null; }

running() {
  APISERVER_URL=$(state_value CAIRN_APISERVER)
  [[ -f "$STATE/env" ]] && alive kube-apiserver && [[ "$(apiserver_get /readyz 2>/dev/null)" == ok ]]
}

kubectl_() { "$BIN/kubectl" --kubeconfig "$STATE/kubeconfig" --request-timeout=10s "$@"; }

# ---- certificates -----------------------------------------------------------

new_key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

# issue NAME SUBJECT EXTENSIONS : a certificate signed by the local CA.
issue() {
  local pki=$STATE/pki
  new_key "$pki/$1.key"
  openssl req -new -key "$pki/$1.key" -subj "$2" -out "$pki/$1.csr" 2>/dev/null
  openssl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 3650 -extfile <(printf '%b' "$3") -out "$pki/$1.crt" 2>/dev/null
  rm -f "$pki/$1.csr"
}

make_pki() {
  local pki=$STATE/pki
  mkdir -p "$pki"
  new_key "$pki/ca.key"
  openssl req -x509 -new -key "$pki/ca.key" -subj "/CN=cairn-local-ca" -days 3650 -out "$pki/ca.crt" 2>/dev/null
  issue apiserver "/CN=kube-apiserver" "subjectAltName=IP:127.0.0.1,IP:$API_IP,IP:$SERVICE_API_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\nextendedKeyUsage=serverAuth"
  issue admin "/O=system:masters/CN=cairn-admin" "extendedKeyUsage=clientAuth"
  new_key "$pki/service-account.key"
  openssl pkey -in "$pki/service-account.key" -pubout -out "$pki/service-account.pub" 2>/dev/null
}

write_kubeconfig() { # server
  local b64="base64 -w0"
  cat >"$STATE/kubeconfig" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: cairn-local
  cluster:
    server: $1
    certificate-authority-data: $($b64 "$STATE/pki/ca.crt")
users:
- name: cairn-admin
  user:
    client-certificate-data: $($b64 "$STATE/pki/admin.crt")
    client-key-data: $($b64 "$STATE/pki/admin.key")
contexts:
- name: cairn-local
  context: {cluster: cairn-local, user: cairn-admin}
current-context: cairn-local
KUBECONFIG
  chmod 600 "$STATE/kubeconfig"
}

# ---- components -------------------------------------------------------------

start_etcd() {
  local client_port=$1 peer_port=$2
  start etcd "$BIN/etcd" --name=cairn --data-dir="$STATE/etcd" --unsafe-no-fsync \
    --listen-client-urls="http://127.0.0.1:$client_port" --advertise-client-urls="http://127.0.0.1:$client_port" \
    --listen-peer-urls="http://127.0.0.1:$peer_port" --initial-advertise-peer-urls="http://127.0.0.1:$peer_port" \
    --initial-cluster="cairn=http://127.0.0.1:$peer_port" --log-level=warn
  ETCD_URL="http://127.0.0.1:$client_port"
  wait_for etcd "etcd to serve" curl -sf --max-time 5 "$ETCD_URL/health"
}

start_apiserver() {
  local port=$1 pki=$STATE/pki
  # Metadata of every write, so tests can count a controller's writes by user.
  cat >"$STATE/audit-policy.yaml" <<'POLICY'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: None
  verbs: [get, list, watch]
# The body of each status write of Cairn's kinds too: what a controller
# changed, when a test finds it writing at steady state.
- level: Request
  resources:
  - {group: database.cairn.dev, resources: [databaseclusters/status]}
  - {group: backup.cairn.dev, resources: [backups/status, backupschedules/status]}
  - {group: cloud.cairn.dev, resources: [objectbuckets/status, dnsrecords/status, providerconfigs/status]}
- level: Metadata
POLICY
  start kube-apiserver "$BIN/kube-apiserver" \
    --bind-address="$API_IP" --advertise-address="$API_IP" --secure-port="$port" \
    --etcd-servers="$ETCD_URL" \
    --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
    --client-ca-file="$pki/ca.crt" \
    --authorization-mode=Node,RBAC \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$pki/service-account.pub" \
    --service-account-signing-key-file="$pki/service-account.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --allow-privileged=true \
    --kubelet-client-certificate="$pki/admin.crt" --kubelet-client-key="$pki/admin.key" \
    --kubelet-certificate-authority="$pki/ca.crt" --kubelet-preferred-address-types=InternalIP \
    --enable-admission-plugins=PodNodeSelector,PodTolerationRestriction \
    --audit-policy-file="$STATE/audit-policy.yaml" --audit-log-path="$STATE/logs/audit.log" \
    --audit-log-format=json --audit-log-mode=batch --audit-log-batch-max-wait=1s \
    --profiling="$APISERVER_PROFILING"
  wait_for kube-apiserver "kube-apiserver to be ready" apiserver_get /readyz
}

start_controllers() { # ports: controller-manager scheduler kwok
  local pki=$STATE/pki kubeconfig=$STATE/kubeconfig
  start_supervised kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig="$kubeconfig" --authentication-kubeconfig="$kubeconfig" --authorization-kubeconfig="$kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$1" --leader-elect=false \
    --controllers='*' --use-service-account-credentials=false \
    --service-account-private-key-file="$pki/service-account.key" --root-ca-file="$pki/ca.crt" \
    --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
    --enable-hostpath-provisioner=true \
    --concurrent-gc-syncs=10 --kube-api-qps="$MANAGER_QPS" --kube-api-burst=$((MANAGER_QPS * 3 / 2)) \
    --concurrent-statefulset-syncs="$WORKLOAD_SYNCS" --concurrent-job-syncs="$WORKLOAD_SYNCS" \
    --concurrent-replicaset-syncs="$WORKLOAD_SYNCS"
  cat >"$STATE/scheduler.yaml" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: $kubeconfig
  qps: $SCHEDULER_QPS
  burst: $((SCHEDULER_QPS * 2))
leaderElection:
  leaderElect: false
EOF
  start_supervised kube-scheduler "$BIN/kube-scheduler" --config="$STATE/scheduler.yaml" \
    --authentication-kubeconfig="$kubeconfig" --authorization-kubeconfig="$kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$2"
  # kwok fakes its own nodes only (a real node's pods would otherwise be
  # reported Running without a container), in an address range that is
  # blackholed here.
  start kwok "$BIN/kwok" --kubeconfig="$kubeconfig" --manage-nodes-with-annotation-selector="$KWOK_TAINT=fake" \
    --config="$BIN/kwok-stages.yaml" --node-lease-duration-seconds=40 \
    --cidr="$KWOK_POD_CIDR" --node-ip="$KWOK_NODE_IP" \
    --server-address="127.0.0.1:$3"
}

create_nodes_and_storage() {
  local i zone
  for i in "${!NODE_ZONES[@]}"; do
    zone=${NODE_ZONES[$i]}
    cat <<NODE
---
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-$i
  annotations:
    $KWOK_TAINT: fake
  labels:
    kubernetes.io/hostname: kwok-node-$i
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    topology.kubernetes.io/zone: $zone
    topology.kubernetes.io/region: local
    type: kwok
spec:
  taints: [{key: $KWOK_TAINT, value: fake, effect: NoSchedule}]
status:
  allocatable: {cpu: "32", memory: 128Gi, pods: "1000"}
  capacity: {cpu: "32", memory: 128Gi, pods: "1000"}
NODE
  done | kubectl_ apply -f - >/dev/null
  # Bound when the scheduler has picked a node, as a production class is: with
  # Immediate binding the scheduler fails each new pod of a StatefulSet (its
  # claim is not bound yet) and retries with backoff, a Scheduled-False status
  # patch and an Event each time. `standard` (the default) allows volume
  # expansion, `fixed` does not.
  kubectl_ apply -f - >/dev/null <<'SC'
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
  annotations:
    storageclass.kubernetes.io/is-default-class: "true"
provisioner: kubernetes.io/host-path
reclaimPolicy: Delete
volumeBindingMode: WaitForFirstConsumer
allowVolumeExpansion: true
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: fixed
provisioner: kubernetes.io/host-path
reclaimPolicy: Delete
volumeBindingMode: WaitForFirstConsumer
allowVolumeExpansion: false
SC
}

nodes_ready() {
  [[ $(kubectl_ get nodes -l type=kwok -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c True) -eq ${#NODE_ZONES[@]} ]]
}

default_service_account() { kubectl_ -n default get serviceaccount default; }

start_moto() { # port
  local venv
  venv=$("$CAIRN_ROOT/hack/moto-venv.sh")
  start moto "$venv/bin/moto_server" -H "$API_IP" -p "$1"
  MOTO_URL="http://$API_IP:$1"
}

write_env() {
  cat >"$STATE/env" <<ENV
export KUBECONFIG=$STATE/kubeconfig
export CAIRN_CLUSTER_STATE=$STATE
export CAIRN_APISERVER=$1
export CAIRN_S3_ENDPOINT=$MOTO_URL
export CAIRN_AUDIT_LOG=$STATE/logs/audit.log
export CAIRN_BIN=$BIN
export CAIRN_ETCD=$ETCD_URL
export CAIRN_REAL_NODES=$REAL_NODES
ENV
}

up() {
  if running; then
    log "local cluster already running ($STATE)"
    return 0
  fi
  [[ -d "$STATE" ]] && down_quietly
  local start_time=$SECONDS ports i
  ((EUID == 0)) || die "the local cluster needs root: it makes network interfaces, routes and iptables rules, and its real nodes run containers"
  BIN=$("$CAIRN_ROOT/hack/build-tools.sh" cluster)
  "$CAIRN_ROOT/hack/node-packages.sh"
  local node_images
  node_images=$("$CAIRN_ROOT/hack/images.sh" node)
  mkdir -p "$STATE/logs" "$STATE/pids"
  # A failed start leaves nothing running, and its logs where they can be read.
  trap 'start_failed' EXIT
  log "starting local cluster in $STATE"
  make_pki
  network_up
  # etcd client, etcd peer, apiserver, moto, controller-manager, scheduler, kwok,
  # kube-proxy healthz and metrics
  read -r -a ports <<<"$(free_ports 9)"
  APISERVER_URL="https://$API_IP:${ports[2]}"
  write_kubeconfig "$APISERVER_URL"
  start_moto "${ports[3]}" # starts in parallel; waited for at the end
  start_etcd "${ports[0]}" "${ports[1]}"
  start_apiserver "${ports[2]}"
  create_nodes_and_storage
  start_controllers "${ports[4]}" "${ports[5]}" "${ports[6]}"
  start_coredns
  start_kube_proxy "${ports[7]}" "${ports[8]}"
  for ((i = 1; i <= REAL_NODES; i++)); do start_node "$i" "${NODE_ZONES[$((i - 1))]}" "$node_images"/*.tar; done
  start_local_path_provisioner
  wait_for kwok "three Ready kwok nodes" nodes_ready
  ((REAL_NODES == 0)) || wait_for kubelet-1 "$REAL_NODES Ready real nodes" real_nodes_ready
  wait_for kube-controller-manager "the default ServiceAccount" default_service_account
  wait_for moto "moto to serve" curl -sf --max-time 5 "$MOTO_URL/moto-api/"
  write_env "$APISERVER_URL"
  trap - EXIT
  log "local cluster ready in $((SECONDS - start_time)) s"
}

start_failed() {
  local kept=$STATE.failed-logs
  rm -rf "$kept"
  cp -r "$STATE/logs" "$kept" 2>/dev/null || true
  log "start failed; stopping what was started (component logs kept in $kept)"
  BIN=$(bin_dir)
  down_quietly
}

# Stops every component, removes the volumes the host-path provisioner made
# for this cluster, then the state folder.
down_quietly() {
  if alive kube-apiserver && [[ -f "$STATE/kubeconfig" ]]; then
    local path
    while read -r path; do
      path=$(realpath -m "$path")
      [[ "$path" == /tmp/hostpath_pv/?* ]] && rm -rf "$path"
    done < <("$(bin_dir)/kubectl" --kubeconfig "$STATE/kubeconfig" --request-timeout=5s get pv \
      -o jsonpath='{range .items[*]}{.spec.hostPath.path}{"\n"}{end}' 2>/dev/null || true)
    rmdir --ignore-fail-on-non-empty /tmp/hostpath_pv 2>/dev/null || true
  fi
  # Clients before servers: processes started with start-process first, then
  # the nodes, etcd last, so the API server can shut down cleanly.
  local name file
  for file in "$STATE"/pids/*.pid; do
    [[ -e "$file" ]] || continue
    name=$(basename "$file" .pid)
    case $name in kwok | kube-scheduler | kube-controller-manager | moto | kube-apiserver | etcd | \
      kubelet-* | containerd-* | coredns | kube-proxy | local-path-provisioner) ;;
      *) stop_component "$name" ;;
    esac
  done
  nodes_down
  for name in kwok kube-scheduler kube-controller-manager moto kube-apiserver etcd; do
    stop_component "$name"
  done
  rm -rf "$STATE"
}

# stop_component NAME: SIGTERM to its process group, SIGKILL after 10 s.
stop_component() {
  local pid deadline
  if pid=$(live_pid "$1"); then
    kill -TERM -- "-$pid" 2>/dev/null || true
    deadline=$((SECONDS + 10))
    while alive "$1" && ((SECONDS < deadline)); do sleep 0.1; done
    if alive "$1"; then
      log "$1 did not stop within 10 s of SIGTERM; killing it"
      kill -KILL -- "-$pid" 2>/dev/null || true
      deadline=$((SECONDS + 5))
      while alive "$1" && ((SECONDS < deadline)); do sleep 0.1; done
      alive "$1" && die "$1 (pid $pid) survived SIGKILL"
    fi
  fi
  rm -f "$STATE/pids/$1.pid"
}

down() {
  [[ -d "$STATE" ]] || { log "no local cluster in $STATE"; return 0; }
  down_quietly
  log "local cluster stopped, $STATE removed"
}

restart_apiserver() { # stop|start
  APISERVER_URL=$(state_value CAIRN_APISERVER)
  [[ -n "$APISERVER_URL" ]] || die "no local cluster in $STATE"
  case $1 in
    stop) # abruptly, as a crash or a network partition would
      local pid
      if pid=$(live_pid kube-apiserver); then
        kill -KILL -- "-$pid" 2>/dev/null || true
        while alive kube-apiserver; do sleep 0.1; done
      fi
      rm -f "$STATE/pids/kube-apiserver.pid"
      ;;
    start)
      alive kube-apiserver && return 0
      BIN=$(state_value CAIRN_BIN)
      ETCD_URL=$(state_value CAIRN_ETCD)
      start_apiserver "${APISERVER_URL##*:}"
      ;;
  esac
}

# start-process NAME COMMAND...: replaces a running process of that name.
start_process() {
  running || die "no running local cluster in $STATE"
  local name=$1; shift
  [[ $name =~ ^[a-z0-9-]+$ ]] || die "process name $name: lower-case letters, digits and dashes only"
  stop_component "$name"
  start "$name" "$@"
  sleep 0.5
  alive "$name" || { tail -n 20 "$STATE/logs/$name.log" >&2; die "$name exited at once"; }
}

cmd=${1:-}
STATE=$(realpath -m "${2:-$CAIRN_CACHE/clusters/dev}")
mkdir -p "$(dirname "$STATE")"
# One `up` or `down` at a time per state folder (parallel test binaries may race).
exec 9>"$STATE.lock"
flock -w 600 9 || die "another up or down holds $STATE.lock for 10 minutes"
case "$cmd" in
  up) up ;;
  down) down ;;
  stop-apiserver) restart_apiserver stop ;;
  start-apiserver) restart_apiserver start ;;
  start-process) shift 2; start_process "$@" ;;
  import-images)
    shift 2
    running || die "no running local cluster in $STATE"
    # Every node at once: each has its own containerd.
    importing=()
    for ((node = 1; node <= $(state_value CAIRN_REAL_NODES); node++)); do
      import_images "$node" "$@" &
      importing+=($!)
    done
    for pid in "${importing[@]}"; do wait "$pid" || die "importing the images into a real node failed"; done ;;
  stop-node) freeze_node "${3:?node number}" ;;
  start-node) thaw_node "${3:?node number}" ;;
  kill-container) shift 2; BIN=$(state_value CAIRN_BIN); kill_container "$@" ;;
  freeze-container) shift 2; BIN=$(state_value CAIRN_BIN); freeze_container "$@" ;;
  thaw-task) shift 2; thaw_task "$@" ;;
  cut-from-apiserver) APISERVER_URL=$(state_value CAIRN_APISERVER); cut_from_apiserver -I "${3:?pod IP}" ;;
  heal-from-apiserver) APISERVER_URL=$(state_value CAIRN_APISERVER); cut_from_apiserver -D "${3:?pod IP}" ;;
  cut-between) cut_between -I "${3:?pod IP}" "${4:?pod IP}" ;;
  heal-between) cut_between -D "${3:?pod IP}" "${4:?pod IP}" ;;
  env) running || die "no running local cluster in $STATE (start it: hack/local-cluster.sh up)"; cat "$STATE/env" ;;
  *) usage ;;
esac
