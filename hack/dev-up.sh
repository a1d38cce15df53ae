#!/usr/bin/env bash
# Brings up the local development environment: the Kubernetes control plane
# with three kwok nodes and the moto fake AWS (hack/local-cluster.sh), reusing
# it if it already runs. Prints how to use it.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

STATE=$CAIRN_CACHE/clusters/dev
"$CAIRN_ROOT/hack/local-cluster.sh" up "$STATE"
# shellcheck disable=SC1091
source "$STATE/env"

cat <<USAGE

Cairn local cluster is up (Kubernetes $KUBERNETES_VERSION, 3 kwok nodes, moto at $CAIRN_S3_ENDPOINT).

  export KUBECONFIG=$KUBECONFIG
  export PATH=$CAIRN_BIN:\$PATH      # the pinned kubectl and helm
  kubectl get nodes -L topology.kubernetes.io/zone

  or load every variable:  source <(hack/local-cluster.sh env)
  logs of each component:  $STATE/logs/
  stop it:                 hack/local-cluster.sh down
USAGE
