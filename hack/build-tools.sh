#!/usr/bin/env bash
# Builds the pinned upstream components (hack/tools/*) from their Go modules into
# $CAIRN_CACHE/tools/<component>-<version>-<hash>/ and links them into
# $CAIRN_CACHE/bin-<hash of all pins>/. A component already in the cache is never rebuilt.
#
# CAIRN_PREBUILT_BIN_DIR: a folder of ready binaries (for example from
# setup-envtest or a release download on a CI runner that has internet). Any
# binary found there is used as is instead of being built.
#
# With `cnpg`, builds only CloudNativePG's operator (hack/tools/cnpg, for
# `hack/bench.sh cnpg-side-by-side`) and links it as cnpg-manager, its CRDs as
# cnpg-crds.yaml and its ClusterRole as cnpg-role.yaml; nothing else. No
# default run (the test suite's, local-cluster.sh's) ever builds it.
#
# With `cluster`, builds only what the local cluster runs (hack/local-cluster.sh,
# and so hack/dev-up.sh): not promtool, the Prometheus server nor actionlint,
# which only the test command's checks use.
#
# Prints the bin folder on stdout.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=readonly
BIN=$(bin_dir)
mkdir -p "$BIN"
# One build at a time per cache (dev-up and test may start together).
exec 8>"$CAIRN_CACHE/tools.lock"
flock -w 3600 8 || die "another build holds $CAIRN_CACHE/tools.lock"

# build COMPONENT MODULE_PATH LDFLAGS BINARY=PACKAGE...
build() {
  local component=$1 module=$2 ldflags=$3; shift 3
  local dir missing=() spec name
  dir=$(tool_dir "$component" "$module")
  for spec in "$@"; do
    name=${spec%%=*}
    if [[ -n "${CAIRN_PREBUILT_BIN_DIR:-}" && -x "$CAIRN_PREBUILT_BIN_DIR/$name" ]]; then
      ln -sf "$CAIRN_PREBUILT_BIN_DIR/$name" "$BIN/$name"
    elif [[ -x "$dir/$name" ]]; then
      ln -sf "$dir/$name" "$BIN/$name"
    else
      missing+=("$spec")
    fi
  done
  ((${#missing[@]})) || return 0
  local start=$SECONDS tags
  tags=$(tool_build_tags "$component")
  log "building ${component} $(pinned_version "$component" "$module"): ${missing[*]%%=*} (a cold build takes minutes)"
  mkdir -p "$dir.partial"
  # One go build for all the binaries whose names are their packages' (it
  # links them in parallel); one each for the others.
  local together=() alone=()
  for spec in "${missing[@]}"; do
    if [[ ${spec%%=*} == "$(basename "${spec#*=}")" ]]; then together+=("$spec"); else alone+=("$spec"); fi
  done
  ((${#together[@]} > 1)) || { alone+=("${together[@]}"); together=(); }
  local batches=() packages
  if ((${#together[@]})); then
    packages=("${together[@]#*=}")
    batches+=("$component|$dir.partial/|${packages[*]}")
  fi
  for spec in "${alone[@]}"; do batches+=("${spec%%=*}|$dir.partial/${spec%%=*}|${spec#*=}"); done
  local batch label output build_log build_pid polls
  for batch in "${batches[@]}"; do
    IFS='|' read -r label output packages <<<"$batch"
    build_log=$dir.partial/$label.log
    # shellcheck disable=SC2086 # one word per package
    (cd "$CAIRN_ROOT/hack/tools/$component" &&
      exec go build -v -trimpath -tags "$tags" -ldflags "-s -w $ldflags" -o "$output" $packages) >"$build_log" 2>&1 &
    build_pid=$!
    polls=0
    while proc_running "$build_pid"; do
      sleep 1
      ((++polls % 30)) || log "  $label: $(wc -l <"$build_log") packages compiled so far ($((SECONDS - start)) s)"
    done
    if ! wait "$build_pid"; then
      tail -n 40 "$build_log" >&2
      die "build of $label failed (full log: $build_log)"
    fi
  done
  for spec in "${missing[@]}"; do
    [[ -x "$dir.partial/${spec%%=*}" ]] || die "the build of $component made no ${spec%%=*}"
  done
  mkdir -p "$dir"
  for spec in "${missing[@]}"; do
    name=${spec%%=*}
    mv "$dir.partial/$name" "$dir/$name"
    ln -sf "$dir/$name" "$BIN/$name"
  done
  rm -rf "$dir.partial"
  log "built ${component} in $((SECONDS - start)) s"
}

# CloudNativePG's operator and its CRDs (config/crd/bases of the same module
# zip), only when asked: a peer for a benchmark, never part of the suite.
if [[ ${1:-} == cnpg ]]; then
  build cnpg github.com/cloudnative-pg/cloudnative-pg "" cnpg-manager=github.com/cloudnative-pg/cloudnative-pg/cmd/manager
  crds=$(tool_dir cnpg github.com/cloudnative-pg/cloudnative-pg)-crds.yaml
  if [[ ! -s "$crds" ]]; then
    src=$(cd "$CAIRN_ROOT/hack/tools/cnpg" && go mod download -json github.com/cloudnative-pg/cloudnative-pg | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
    for f in "$src"/config/crd/bases/*.yaml; do
      echo "---"
      cat "$f"
    done >"$crds.partial"
    mv "$crds.partial" "$crds"
  fi
  ln -sf "$crds" "$BIN/cnpg-crds.yaml"
  # The operator's ClusterRole, as its release manifest grants it.
  role=$(tool_dir cnpg github.com/cloudnative-pg/cloudnative-pg)-role.yaml
  if [[ ! -s "$role" ]]; then
    src=${src:-$(cd "$CAIRN_ROOT/hack/tools/cnpg" && go mod download -json github.com/cloudnative-pg/cloudnative-pg | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')}
    cp "$src/config/rbac/role.yaml" "$role.partial"
    mv "$role.partial" "$role"
  fi
  ln -sf "$role" "$BIN/cnpg-role.yaml"
  echo "$BIN"
  exit 0
fi
# `cluster`: only what the local cluster runs (hack/local-cluster.sh); the
# checks' tools (promtool, the Prometheus server of the dashboards' test,
# actionlint) are left for the test command, which builds everything.
only_cluster=0
case ${1:-} in
  "") ;;
  cluster) only_cluster=1 ;;
  *) die "unknown argument ${1}: cnpg or cluster" ;;
esac

k8s_version_ldflags() {
  local v=$KUBERNETES_VERSION minor date
  minor=$(echo "$v" | cut -d. -f2)
  date=2000-01-01T00:00:00Z # fixed, so that builds are reproducible
  local flags=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
  done
  echo "$flags"
}

# Two chains side by side: Kubernetes (the longest build) and the rest. A
# build's link steps use one core, and module downloads none.
kubernetes_chain() {
  build kubernetes k8s.io/kubernetes "$(k8s_version_ldflags)" \
    kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver \
    kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager \
    kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler \
    kubectl=k8s.io/kubernetes/cmd/kubectl \
    kubelet=k8s.io/kubernetes/cmd/kubelet \
    kube-proxy=k8s.io/kubernetes/cmd/kube-proxy
}
other_chain() {
  build etcd go.etcd.io/etcd/server/v3 "" etcd=go.etcd.io/etcd/server/v3
  build kwok sigs.k8s.io/kwok "-X sigs.k8s.io/kwok/pkg/consts.Version=$(pinned_version kwok sigs.k8s.io/kwok)" kwok=sigs.k8s.io/kwok/cmd/kwok
  ((only_cluster)) || build prometheus github.com/prometheus/prometheus "" promtool=github.com/prometheus/prometheus/cmd/promtool prometheus=github.com/prometheus/prometheus/cmd/prometheus
  build helm helm.sh/helm/v3 "-X helm.sh/helm/v3/internal/version.version=$(pinned_version helm helm.sh/helm/v3) -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$(echo "$KUBERNETES_VERSION" | cut -d. -f2)" helm=helm.sh/helm/v3/cmd/helm
  ((only_cluster)) || build actionlint github.com/rhysd/actionlint "-X github.com/rhysd/actionlint.version=$(pinned_version actionlint github.com/rhysd/actionlint)" actionlint=github.com/rhysd/actionlint/cmd/actionlint
  # CoreDNS from the main package beside its pins: only the plugins the
  # Corefile uses (hack/tools/coredns/main.go).
  build coredns github.com/coredns/coredns "-X github.com/coredns/coredns/coremain.GitCommit=$(pinned_version coredns github.com/coredns/coredns)" coredns=.
  build local-path-provisioner github.com/rancher/local-path-provisioner "" local-path-provisioner=github.com/rancher/local-path-provisioner
}
kubernetes_chain &
kubernetes_pid=$!
other_chain &
other_pid=$!
chains_failed=0
wait "$kubernetes_pid" || chains_failed=1
wait "$other_pid" || chains_failed=1
((!chains_failed)) || die "a build failed (its log is above)"

# The pause binary of every pod sandbox, from Kubernetes' own source (a static C
# program, so the image holds nothing else).
pause_binary() {
  local out src
  out=$(tool_dir kubernetes k8s.io/kubernetes)/pause
  if [[ ! -x "$out" ]]; then
    src=$(cd "$CAIRN_ROOT/hack/tools/kubernetes" && go mod download -json k8s.io/kubernetes | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
    gcc -Os -static -Wall -Werror -DVERSION="$KUBERNETES_VERSION" -o "$out.partial" "$src/build/pause/linux/pause.c"
    strip "$out.partial"
    mv "$out.partial" "$out"
  fi
  ln -sf "$out" "$BIN/pause"
}
pause_binary

# kwok's behaviour comes from Stage objects, which its module ships as YAML
# (kustomize/stage): the "fast" set, as kwokctl uses it. Taken from the pinned
# module, never copied into this repository.
kwok_stages() {
  local out
  out=$(tool_dir kwok sigs.k8s.io/kwok)-stages.yaml
  if [[ ! -s "$out" ]]; then
    local src
    src=$(cd "$CAIRN_ROOT/hack/tools/kwok" && go mod download -json sigs.k8s.io/kwok | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
    for f in "$src"/kustomize/stage/{node/fast,node/heartbeat-with-lease,pod/fast}/*.yaml; do
      [[ $(basename "$f") == kustomization.yaml ]] && continue
      echo "---"
      cat "$f"
    done >"$out.partial"
    mv "$out.partial" "$out"
  fi
  ln -sf "$out" "$BIN/kwok-stages.yaml"
}
kwok_stages

echo "$BIN"
