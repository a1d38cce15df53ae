#!/usr/bin/env bash
# Regenerates the pinned tools modules under hack/tools/. Run only to change a
# version; the generated go.mod/go.sum files are committed and are the pins.
#
# Each upstream component gets a module of its own so that minimal version
# selection never mixes their dependency graphs (kwok, helm and Kubernetes all
# depend on different k8s.io/* versions).
set -euo pipefail
cd "$(dirname "$0")"

KUBERNETES_VERSION=${KUBERNETES_VERSION:-v1.36.3}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
KWOK_VERSION=${KWOK_VERSION:-v0.8.0}
HELM_VERSION=${HELM_VERSION:-v3.22.0}
ACTIONLINT_VERSION=${ACTIONLINT_VERSION:-v1.7.12}
COREDNS_VERSION=${COREDNS_VERSION:-v1.15.0}
# Prometheus 3.x's Go module is versioned v0.3xx.y (3.xx.y).
PROMETHEUS_VERSION=${PROMETHEUS_VERSION:-v0.316.0}
LOCAL_PATH_PROVISIONER_VERSION=${LOCAL_PATH_PROVISIONER_VERSION:-v0.0.30}
GO_DIRECTIVE=${GO_DIRECTIVE:-1.26.0}

export GOTOOLCHAIN=local GOFLAGS=-mod=mod

# new_module DIR MODULE_PATH TOOL_PACKAGE... : writes go.mod with tool directives.
# A component's build-tags file and main package are kept.
new_module() {
  local dir=$1 path=$2; shift 2
  mkdir -p "$dir" && rm -f "$dir/go.mod" "$dir/go.sum"
  { echo "module $path"; echo; echo "go $GO_DIRECTIVE"; } >"$dir/go.mod"
}

tidy() { (cd "$1" && go mod tidy); }

# Kubernetes: k8s.io/kubernetes replaces its staging modules with local paths,
# so re-point each of them at the published module of the matching version.
new_module kubernetes cairn.dev/hack/tools/kubernetes
staging_version="v0.${KUBERNETES_VERSION#v1.}"
gomod=$(go mod download -json "k8s.io/kubernetes@${KUBERNETES_VERSION}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
{
  echo
  echo "require k8s.io/kubernetes ${KUBERNETES_VERSION}"
  echo
  echo "replace ("
  awk '/=> \.\/staging\/src\// {print "\t" $1 " => " $1 " '"$staging_version"'"}' "$gomod"
  echo ")"
  echo
  echo "tool ("
  for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy; do
    echo "	k8s.io/kubernetes/cmd/$cmd"
  done
  echo ")"
} >>kubernetes/go.mod
tidy kubernetes

# etcd: its server module also replaces siblings with local paths.
new_module etcd cairn.dev/hack/tools/etcd
etcd_gomod=$(go mod download -json "go.etcd.io/etcd/server/v3@${ETCD_VERSION}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
{
  echo
  echo "require go.etcd.io/etcd/server/v3 ${ETCD_VERSION}"
  echo
  echo "replace ("
  awk '/=> \.\.\// && $1 ~ /^go\.etcd\.io\/etcd\// {print "\t" $1 " => " $1 " '"$ETCD_VERSION"'"}' "$etcd_gomod"
  echo ")"
  echo
  echo "tool go.etcd.io/etcd/server/v3"
} >>etcd/go.mod
tidy etcd

new_module kwok cairn.dev/hack/tools/kwok
(cd kwok && go get -tool "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}")
tidy kwok

new_module helm cairn.dev/hack/tools/helm
(cd helm && go get -tool "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}")
tidy helm

# promtool (the alert rules' checks and unit tests) and the prometheus server (the dashboards' test).
new_module prometheus cairn.dev/hack/tools/prometheus
(cd prometheus && go get -tool "github.com/prometheus/prometheus/cmd/promtool@${PROMETHEUS_VERSION}" "github.com/prometheus/prometheus/cmd/prometheus@${PROMETHEUS_VERSION}")
tidy prometheus

new_module actionlint cairn.dev/hack/tools/actionlint
(cd actionlint && go get -tool "github.com/rhysd/actionlint/cmd/actionlint@${ACTIONLINT_VERSION}")
tidy actionlint

# Real nodes: the cluster DNS, and the volume provisioner kind uses. CoreDNS
# is built from coredns/main.go (its plugins the Corefile uses), which tidy
# reads to keep only what those need.
new_module coredns cairn.dev/hack/tools/coredns
(cd coredns && go get "github.com/coredns/coredns@${COREDNS_VERSION}")
tidy coredns

new_module local-path-provisioner cairn.dev/hack/tools/local-path-provisioner
(cd local-path-provisioner && go get -tool "github.com/rancher/local-path-provisioner@${LOCAL_PATH_PROVISIONER_VERSION}")
tidy local-path-provisioner
