#!/usr/bin/env bash
# Brings up the local development environment: the Kubernetes control plane
# with three kwok nodes and the moto fake AWS (hack/local-cluster.sh), reusing
# it if it already runs; installs Cairn's CRDs and a sample of every kind in
# namespace cairn-samples. Prints how to use it.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

STATE=$CAIRN_CACHE/clusters/dev
"$CAIRN_ROOT/hack/local-cluster.sh" up "$STATE"
# shellcheck disable=SC1091
source "$STATE/env"

# The CRDs of every chart, and one sample of every kind.
"$CAIRN_BIN/kubectl" apply --server-side --force-conflicts -f "$CAIRN_ROOT"/charts/cairn-database-controller/templates/crds/ \
  -f "$CAIRN_ROOT"/charts/cairn-backup-controller/templates/crds/ -f "$CAIRN_ROOT"/charts/cairn-cloud-controller/templates/crds/ >/dev/null
"$CAIRN_BIN/kubectl" wait --for=condition=Established --timeout=60s crd --all >/dev/null
"$CAIRN_BIN/kubectl" create namespace cairn-samples --dry-run=client -o yaml | "$CAIRN_BIN/kubectl" apply -f - >/dev/null
"$CAIRN_BIN/kubectl" -n cairn-samples apply -f "$CAIRN_ROOT/config/samples/" >/dev/null

cat <<USAGE

Cairn local cluster is up (Kubernetes $KUBERNETES_VERSION, 3 kwok nodes, moto at $CAIRN_S3_ENDPOINT).

  export KUBECONFIG=$KUBECONFIG
  export PATH=$CAIRN_BIN:\$PATH      # the pinned kubectl and helm
  kubectl get nodes -L topology.kubernetes.io/zone
  kubectl get cairn -n cairn-samples   # one sample of every Cairn kind (no controller runs yet)

  or load every variable:  source <(hack/local-cluster.sh env)
  logs of each component:  $STATE/logs/
  stop it:                 hack/local-cluster.sh down
USAGE
