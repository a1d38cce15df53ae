#!/usr/bin/env bash
# Brings up the local development environment: the Kubernetes cluster with
# real nodes, three kwok nodes and the moto fake AWS (hack/local-cluster.sh),
# reusing it if it already runs; builds the images (hack/images.sh) and gives
# them to the nodes; installs every chart with Helm (the database controller
# runs in pods in namespace cairn-system, watching cairn-samples; the backup
# and cloud charts ship their CRDs); creates a sample of every kind in
# cairn-samples, the DatabaseCluster's PostgreSQL running on the real nodes.
# Prints how to use it.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

STATE=$CAIRN_CACHE/clusters/dev
CONTROLLER_NAMESPACE=cairn-system
SAMPLES=cairn-samples
"$CAIRN_ROOT/hack/local-cluster.sh" up "$STATE"
# shellcheck disable=SC1091
source "$STATE/env"
images=$("$CAIRN_ROOT/hack/images.sh" workspace)
"$CAIRN_ROOT/hack/local-cluster.sh" import-images "$STATE" "$images"/*.tar

kubectl() { "$CAIRN_BIN/kubectl" "$@"; }
helm() { "$CAIRN_BIN/helm" "$@"; }
for namespace in "$SAMPLES" "$CONTROLLER_NAMESPACE"; do
  kubectl create namespace "$namespace" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
done
kubectl label --overwrite namespace "$CONTROLLER_NAMESPACE" \
  pod-security.kubernetes.io/enforce=restricted pod-security.kubernetes.io/enforce-version=latest >/dev/null

# A new image under the same tag must reach the running pods: the release
# records the image's digest, so a rebuilt image rolls the Deployment.
digest=$(sha256sum "$images/ghcr.io_cairn-dev_cairn-database-controller.tar" | cut -c1-12)
log "installing the charts"
helm upgrade --install cairn-database-controller "$CAIRN_ROOT/charts/cairn-database-controller" \
  --namespace "$CONTROLLER_NAMESPACE" --set watchNamespace="$SAMPLES" --set image.pullPolicy=Never \
  --set-string podAnnotations.cairn\\.dev/image-archive="$digest" --wait --timeout 3m >/dev/null
for chart in cairn-backup-controller cairn-cloud-controller; do
  helm upgrade --install "$chart" "$CAIRN_ROOT/charts/$chart" --namespace "$CONTROLLER_NAMESPACE" >/dev/null
done

# The samples as they are, but for the DatabaseCluster's PostgreSQL version
# and storage: here the one database image is Debian 12's PostgreSQL 15, and
# local-path volumes are the ones a non-root pod can write.
for sample in "$CAIRN_ROOT"/config/samples/*.yaml; do
  echo "---"
  case $sample in
    *databasecluster*) sed -e 's/version: "17"/version: "15"/' -e 's/^  storage:$/  storage:\n    storageClassName: local-path/' -e 's/size: 10Gi/size: 1Gi/' "$sample" ;;
    *) cat "$sample" ;;
  esac
done | kubectl -n "$SAMPLES" apply -f - >/dev/null

cat <<USAGE

Cairn local cluster is up: Kubernetes $KUBERNETES_VERSION, $CAIRN_REAL_NODES real nodes and 3 kwok nodes
(tainted: only pods that tolerate kwok.x-k8s.io/node land there), moto at $CAIRN_S3_ENDPOINT.

  export KUBECONFIG=$KUBECONFIG
  export PATH=$CAIRN_BIN:\$PATH      # the pinned kubectl and helm
  kubectl get nodes -L type,topology.kubernetes.io/zone
  kubectl -n $CONTROLLER_NAMESPACE get pods        # cairn-database-controller, installed by its chart
  kubectl -n $SAMPLES get cairn                    # one sample of every Cairn kind
  kubectl -n $SAMPLES get dbc,pods,pvc,services    # the sample cluster's PostgreSQL (Ready in about a minute)

  psql on the sample cluster's primary, through its -rw Service:
    kubectl -n $SAMPLES exec -it orders-0 -- sh -c 'psql "host=orders-rw user=\$(cat /etc/cairn/credentials/username) dbname=\$(cat /etc/cairn/credentials/database) password=\$(cat /etc/cairn/credentials/password)"'

  (the backup and cloud controllers are not built yet; their samples are not reconciled)

  rebuild and roll the controller after a change:  hack/dev-up.sh
  logs of each component:  $STATE/logs/     stop it:  hack/local-cluster.sh down
USAGE
