#!/usr/bin/env bash
# Brings up the local development environment: the Kubernetes control plane
# with three kwok nodes and the moto fake AWS (hack/local-cluster.sh), reusing
# it if it already runs; installs Cairn's CRDs and a sample of every kind in
# namespace cairn-samples; builds and (re)starts the controllers as local
# processes that authenticate as their charts' ServiceAccounts, with the
# charts' RBAC. Prints how to use it.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

STATE=$CAIRN_CACHE/clusters/dev
"$CAIRN_ROOT/hack/local-cluster.sh" up "$STATE"
# shellcheck disable=SC1091
source "$STATE/env"

# The CRDs as the charts ship them (rendered by Helm), and one sample of every
# kind. The database controller runs on this machine, not behind its
# Service: the API server reaches its conversion webhook on loopback.
CONTROLLER_NAMESPACE=cairn-system
for chart in cairn-database-controller cairn-backup-controller cairn-cloud-controller; do
  for crd in "$CAIRN_ROOT/charts/$chart/templates/crds/"*.yaml; do
    "$CAIRN_BIN/helm" template "$chart" "$CAIRN_ROOT/charts/$chart" --namespace "$CONTROLLER_NAMESPACE" \
      --show-only "templates/crds/$(basename "$crd")"
  done
done | sed '/^        service:$/,/^          port: 443$/c\        url: https://127.0.0.1:18443/convert' |
  "$CAIRN_BIN/kubectl" apply --server-side --force-conflicts -f - >/dev/null
"$CAIRN_BIN/kubectl" wait --for=condition=Established --timeout=60s crd --all >/dev/null
for namespace in cairn-samples "$CONTROLLER_NAMESPACE"; do
  "$CAIRN_BIN/kubectl" create namespace "$namespace" --dry-run=client -o yaml | "$CAIRN_BIN/kubectl" apply -f - >/dev/null
done
"$CAIRN_BIN/kubectl" -n cairn-samples apply -f "$CAIRN_ROOT/config/samples/" >/dev/null

# The controllers run as local processes (kwok nodes run no containers).
# Each impersonates its chart's ServiceAccount, so what it may do here is
# exactly what the chart's RBAC lets it do in a real cluster. They watch
# cairn-samples only: tests run against this cluster in namespaces of their
# own, with controllers of their own.
cargo build --locked --quiet -p cairn-database-controller

start_controller() { # chart admin-port [VAR=value...]
  local chart=$1 port=$2 account_kubeconfig=$STATE/$1.kubeconfig
  shift 2
  "$CAIRN_BIN/helm" template "$chart" "$CAIRN_ROOT/charts/$chart" --namespace "$CONTROLLER_NAMESPACE" \
    --set watchNamespace=cairn-samples \
    --show-only templates/serviceaccount.yaml --show-only templates/rbac.yaml |
    "$CAIRN_BIN/kubectl" apply --server-side --force-conflicts -f - >/dev/null
  sed "/^  user:\$/a\\    as: system:serviceaccount:$CONTROLLER_NAMESPACE:$chart\n    as-groups: [system:serviceaccounts, system:serviceaccounts:$CONTROLLER_NAMESPACE, system:authenticated]" \
    "$STATE/kubeconfig" >"$account_kubeconfig"
  chmod 600 "$account_kubeconfig"
  "$CAIRN_ROOT/hack/local-cluster.sh" start-process "$STATE" "$chart" env \
    KUBECONFIG="$account_kubeconfig" POD_NAME="$chart-local" CAIRN_LEASE_NAMESPACE="$CONTROLLER_NAMESPACE" \
    CAIRN_NAMESPACES=cairn-samples CAIRN_ADMIN_ADDRESS="127.0.0.1:$port" CAIRN_LOG_FORMAT=text "$@" \
    "$CARGO_TARGET_DIR/debug/$chart"
}
# Its conversion webhook on loopback, with a self-managed certificate for 127.0.0.1.
start_controller cairn-database-controller 18080 CAIRN_WEBHOOK_ADDRESS=127.0.0.1:18443 CAIRN_WEBHOOK_SERVICE=127.0.0.1

cat <<USAGE

Cairn local cluster is up (Kubernetes $KUBERNETES_VERSION, 3 kwok nodes, moto at $CAIRN_S3_ENDPOINT).

  export KUBECONFIG=$KUBECONFIG
  export PATH=$CAIRN_BIN:\$PATH      # the pinned kubectl and helm
  kubectl get nodes -L topology.kubernetes.io/zone
  kubectl get cairn -n cairn-samples   # one sample of every Cairn kind
  kubectl get dbc,statefulsets,services -n cairn-samples   # what cairn-database-controller made of the sample
                                       # (the controllers watch namespace cairn-samples)

  cairn-database-controller: curl -s localhost:18080/metrics | grep ^cairn_
                             log: $STATE/logs/cairn-database-controller.log
  (the backup and cloud controllers are not built yet; their samples are not reconciled)

  or load every variable:  source <(hack/local-cluster.sh env)
  logs of each component:  $STATE/logs/
  stop it:                 hack/local-cluster.sh down
USAGE
